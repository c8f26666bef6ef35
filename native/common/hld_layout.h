/* Read access to a packed HLD schedule (layout documented in specla.h and docs/hld-layout.md).
 * Header-only: every backend's tree kernels read schedules through these accessors; the builder
 * and validator are in the core (native/src/hld_schedule.c). */
#ifndef SPECLA_HLD_LAYOUT_H
#define SPECLA_HLD_LAYOUT_H
#include <stdint.h>

enum {
    HLD_MAGIC_AT = 0,
    HLD_VERSION_AT = 1,
    HLD_N_NODES_AT = 2,
    HLD_N_CHAINS_AT = 3,
    HLD_N_WAVES_AT = 4,
    HLD_N_BOUNDARIES_AT = 5,
    HLD_MAX_CHAINS_PER_WAVE_AT = 6,
    HLD_MAX_DEPTH_AT = 7,
    HLD_CAPACITY_AT = 8,
    HLD_TOTAL_AT = 9,
    HLD_OFF_PARENTS = 10,
    HLD_OFF_ORDER = 11,
    HLD_OFF_CHAIN_OFFSETS = 12,
    HLD_OFF_CHAIN_PARENT_BOUNDARY = 13,
    HLD_OFF_CHAIN_WAVE = 14,
    HLD_OFF_NODE_BOUNDARY = 15,
    HLD_OFF_NODE_DEPTH = 16,
    HLD_OFF_CHAIN_PARENT_NODE = 17,
    HLD_OFF_NODE_CHAIN = 18,
    HLD_OFF_NODE_POSITION = 19,
};

static inline int32_t hld_n_nodes(const int32_t *s) { return s[HLD_N_NODES_AT]; }
static inline int32_t hld_n_chains(const int32_t *s) { return s[HLD_N_CHAINS_AT]; }
static inline int32_t hld_n_boundaries(const int32_t *s) { return s[HLD_N_BOUNDARIES_AT]; }
static inline const int32_t *hld_array(const int32_t *s, int which) { return s + s[which]; }
static inline const int32_t *hld_parents(const int32_t *s) { return hld_array(s, HLD_OFF_PARENTS); }
static inline const int32_t *hld_order(const int32_t *s) { return hld_array(s, HLD_OFF_ORDER); }
static inline const int32_t *hld_chain_offsets(const int32_t *s) { return hld_array(s, HLD_OFF_CHAIN_OFFSETS); }
static inline const int32_t *hld_chain_parent_boundary(const int32_t *s) {
    return hld_array(s, HLD_OFF_CHAIN_PARENT_BOUNDARY);
}
static inline const int32_t *hld_node_boundary(const int32_t *s) { return hld_array(s, HLD_OFF_NODE_BOUNDARY); }

#endif
