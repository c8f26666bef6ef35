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
/* Before a verify's per-layer ops (conv_tree, verify_gdn): the counts its folds read, uploaded to
 * backend memory from what is pending and what this step already folded. */
void factor_banks_prepare_verify(specla_factor_banks *banks);
/* 1 when a verify's ops do not depend on what is pending (the same ops every step, so a GPU may
 * record them): the HLD chain verify, or a commit method that leaves nothing pending. */
int factor_banks_verify_recordable(const specla_factor_banks *banks);
/* Where a verify's recorded inputs of GDN layer `layer` go in the bank it writes now: the raw conv
 * inputs x [max_nodes][C], the keys k [max_nodes][Hk][S] and the gates g [max_nodes][Hv]. A forward
 * pass that produces them there (the projections, gates and split write straight into the bank)
 * spares conv_tree and verify_gdn their copies into it: they copy only an input that is elsewhere. */
void factor_banks_layer_inputs(const specla_factor_banks *banks, int layer, float **x, float **k, float **g);
/* The bank a verify writes now (its pointers are part of a recorded verify). */
int factor_banks_write_bank(const specla_factor_banks *banks);
/* The host side of a whole verify of n_nodes nodes whose ops ran as a replayed recording: the
 * fold, verified and statistics marks conv_tree and verify_gdn leave for every layer (statistics
 * not counted). */
void factor_banks_note_replayed_verify(specla_factor_banks *banks, int n_nodes);
specla_status factor_banks_accept(specla_factor_banks *banks, const backend *be, const int32_t *path, int32_t n,
                                  const specla_recurrent_states *states);
/* Fold whatever is pending into the durable states (as specla_finish_speculative_state). */
void factor_banks_finish(specla_factor_banks *banks, const backend *be, const specla_recurrent_states *states);

/* Drop whatever is pending or verified without folding it (the durable state is being reset). */
void factor_banks_discard(specla_factor_banks *banks);

#endif
