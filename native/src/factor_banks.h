/* Library-internal access to the factor banks beyond the ABI (specla.h). */
#ifndef SPECLA_FACTOR_BANKS_H
#define SPECLA_FACTOR_BANKS_H
#include "backend.h"
#include "backend_registry.h"
#include "specla.h"

/* The work of the tree ops behind the ABI's validation, for callers inside the library whose
 * schedules and arguments are already known good (the forward pass built the schedule itself):
 * no per-layer re-validation on the hot path. Semantics as specla_op_conv_tree,
 * specla_op_gdn_tree_verify and specla_factor_banks_accept (path already checked). */
/* Banks in the memory of `be` (a context's backend); the caller keeps `be` alive longer. */
specla_status factor_banks_create(const specla_recurrent_shape *shape, const backend *be,
                                  specla_factor_banks **out_banks);
/* args->schedule (and every array of args) is backend memory; host_schedule is the same schedule
 * in host memory, read for counts. */
void factor_banks_conv_tree(specla_factor_banks *banks, const backend *be, const int32_t *host_schedule,
                            const specla_conv_tree_args *args);
void factor_banks_verify_gdn(specla_factor_banks *banks, const backend *be, const int32_t *host_schedule,
                             const specla_gdn_tree_args *args);
specla_status factor_banks_accept(specla_factor_banks *banks, const backend *be, const int32_t *path, int32_t n,
                                  const specla_recurrent_states *states);
/* Fold whatever is pending into the durable states (as specla_finish_speculative_state). */
void factor_banks_finish(specla_factor_banks *banks, const backend *be, const specla_recurrent_states *states);

/* Drop whatever is pending or verified without folding it (the durable state is being reset). */
void factor_banks_discard(specla_factor_banks *banks);

#endif
