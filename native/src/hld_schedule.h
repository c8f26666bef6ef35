/* The HLD schedule's builder and validator (hld_schedule.c); the read accessors kernels use are in
 * native/common/hld_layout.h. */
#ifndef SPECLA_HLD_SCHEDULE_H
#define SPECLA_HLD_SCHEDULE_H
#include <stdint.h>

#include "hld_layout.h"
#include "specla.h"

/* specla_hld_build with the caller's scratch of HLD_SCRATCH_INTS_PER_NODE * n_nodes ints, so a
 * context's verify allocates nothing. */
#define HLD_SCRATCH_INTS_PER_NODE 8
specla_status hld_build_into(const int32_t *parents, int32_t n_nodes, int32_t capacity, int32_t *schedule,
                             int32_t schedule_ints, int32_t *scratch);

/* Validates a schedule handed in through the ABI in full (header, every index, the chain / wave /
 * boundary structure against the parent array), so kernels may trust it. O(n), no allocation.
 * `what` names the caller in the message. */
specla_status hld_check(const int32_t *schedule, int32_t max_nodes, const char *what);
/* An accepted path of a checked schedule: 1 <= n <= n_nodes, path[0] = 0 (the root), each node the
 * child of the one before. */
specla_status hld_check_path(const int32_t *schedule, const int32_t *path, int32_t n, const char *what);

#endif
