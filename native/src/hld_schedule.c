/* The heavy-light (HLD) schedule of a draft tree (specla.h, "The heavy-light (HLD) schedule of a
 * tree"; docs/hld-layout.md). The tree arrives as a parent array in topological order; the result
 * is one int32 array, padded to a fixed capacity, that kernels read as data:
 *   - chains: paths that follow heavy children, each verified by one state-resident pass;
 *   - waves: a chain can start once the chain holding its parent node is done;
 *   - boundary slots: the only intermediate states ever materialised (after each distinct parent
 *     node of a non-root chain).
 * The Python oracle pyspecla/reference/hld.py builds the same array independently; the tests
 * compare the two int for int. hld_check, at the end, validates in full a schedule handed back in
 * through the ABI before a kernel trusts it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "hld_schedule.h"

/* Offsets of the ten arrays, in the order of the header (specla.h). */
enum {
    HLD_PARENTS,
    HLD_ORDER,
    HLD_CHAIN_OFFSETS,
    HLD_CHAIN_PARENT_BOUNDARY,
    HLD_CHAIN_WAVE,
    HLD_NODE_BOUNDARY,
    HLD_NODE_DEPTH,
    HLD_CHAIN_PARENT_NODE,
    HLD_NODE_CHAIN,
    HLD_NODE_POSITION,
    HLD_N_ARRAYS
};

/* Largest capacity whose schedule size still fits an int32. */
#define HLD_MAX_CAPACITY ((INT32_MAX - SPECLA_HLD_HEADER_INTS - 1) / HLD_N_ARRAYS)

SPECLA_API int32_t specla_hld_size(int32_t capacity) {
    if (capacity < 1 || capacity > HLD_MAX_CAPACITY) return -1;
    return SPECLA_HLD_HEADER_INTS + HLD_N_ARRAYS * capacity + 1; /* chain_offsets has capacity + 1 */
}

static void hld_offsets(int32_t capacity, int32_t offsets[HLD_N_ARRAYS]) {
    int32_t at = SPECLA_HLD_HEADER_INTS;
    for (int a = 0; a < HLD_N_ARRAYS; a++) {
        offsets[a] = at;
        at += capacity + (a == HLD_CHAIN_OFFSETS ? 1 : 0);
    }
}

static specla_status check_parents(const int32_t *parents, int32_t n_nodes) {
    static const char op[] = "specla_hld_build";
    if (parents[0] != -1)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: parents[0] = %d must be -1 (node 0 is the root)", op,
                           (int)parents[0]);
    for (int32_t t = 1; t < n_nodes; t++)
        if (parents[t] < 0 || parents[t] >= t)
            return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                               "%s: parents[%d] = %d is not in [0, %d) (parents must be in topological order)", op,
                               (int)t, (int)parents[t], (int)t);
    return SPECLA_OK;
}

SPECLA_API specla_status specla_hld_build(const int32_t *parents, int32_t n_nodes, int32_t capacity,
                                          int32_t *schedule, int32_t schedule_ints) {
    /* a bad count or capacity is reported by hld_build_into before it touches the scratch */
    if (n_nodes < 1 || n_nodes > capacity || specla_hld_size(capacity) < 0)
        return hld_build_into(parents, n_nodes, capacity, schedule, schedule_ints, NULL);
    int32_t *scratch = malloc(sizeof(int32_t) * HLD_SCRATCH_INTS_PER_NODE * (size_t)n_nodes);
    if (scratch == NULL)
        return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "specla_hld_build: cannot allocate scratch for %d nodes",
                           (int)n_nodes);
    const specla_status st = hld_build_into(parents, n_nodes, capacity, schedule, schedule_ints, scratch);
    free(scratch);
    return st;
}

specla_status hld_build_into(const int32_t *parents, int32_t n_nodes, int32_t capacity, int32_t *schedule,
                             int32_t schedule_ints, int32_t *scratch) {
    static const char op[] = "specla_hld_build";
    if (parents == NULL) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: parents is NULL", op);
    if (schedule == NULL) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: schedule is NULL", op);
    const int32_t size = specla_hld_size(capacity);
    if (size < 0)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: capacity = %d is not in [1, %d]", op, (int)capacity,
                           (int)HLD_MAX_CAPACITY);
    if (n_nodes < 1 || n_nodes > capacity)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: n_nodes = %d is not in [1, capacity = %d]", op,
                           (int)n_nodes, (int)capacity);
    if (schedule_ints < size)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                           "%s: schedule_ints = %d is too small: capacity %d needs specla_hld_size = %d ints", op,
                           (int)schedule_ints, (int)capacity, (int)size);
    specla_status status = check_parents(parents, n_nodes);
    if (status != SPECLA_OK) return status;

    const int32_t n = n_nodes;
    /* Scratch, 8 arrays of n. `parent` is a copy so that the input may alias the output buffer. */
    int32_t *parent = scratch;             /* [n] copy of the input */
    int32_t *subtree = parent + n;         /* [n] nodes in the subtree of each node */
    int32_t *heavy = subtree + n;          /* [n] heavy child, -1 for a leaf */
    int32_t *node_head_chain = heavy + n;  /* [n] chain of each node, numbered by first node */
    int32_t *head = node_head_chain + n;   /* [chain numbered by first node] its first node */
    int32_t *wave = head + n;              /* [chain numbered by first node] its wave */
    int32_t *rank = wave + n;              /* [chain numbered by first node] index in schedule order */
    int32_t *wave_start = rank + n;        /* [wave] next schedule index of the wave (counting sort) */
    memcpy(parent, parents, sizeof(int32_t) * (size_t)n);

    /* Subtree sizes: children come after their parents, so one reverse sweep suffices. */
    for (int32_t t = 0; t < n; t++) subtree[t] = 1;
    for (int32_t t = n - 1; t >= 1; t--) subtree[parent[t]] += subtree[t];
    /* Heavy child: children are visited in increasing index, a strictly larger subtree wins, so ties
     * go to the lowest index. */
    for (int32_t t = 0; t < n; t++) heavy[t] = -1;
    for (int32_t t = 1; t < n; t++) {
        const int32_t p = parent[t];
        if (heavy[p] < 0 || subtree[t] > subtree[heavy[p]]) heavy[p] = t;
    }

    /* Chains by increasing first node. A head's parent has a lower index, so its chain (which
     * starts even earlier) has already been walked and its wave is known. */
    int32_t n_chains = 0, n_waves = 0;
    for (int32_t h = 0; h < n; h++) {
        if (h != 0 && heavy[parent[h]] == h) continue;
        const int32_t c = n_chains++;
        head[c] = h;
        wave[c] = h == 0 ? 0 : wave[node_head_chain[parent[h]]] + 1;
        if (wave[c] + 1 > n_waves) n_waves = wave[c] + 1;
        for (int32_t v = h; v >= 0; v = heavy[v]) node_head_chain[v] = c;
    }

    /* Stable sort of the chains by wave (counting sort). */
    for (int32_t w = 0; w < n_waves; w++) wave_start[w] = 0;
    for (int32_t c = 0; c < n_chains; c++) wave_start[wave[c]]++;
    int32_t max_chains_per_wave = 0, running = 0;
    for (int32_t w = 0; w < n_waves; w++) {
        const int32_t count = wave_start[w];
        if (count > max_chains_per_wave) max_chains_per_wave = count;
        wave_start[w] = running;
        running += count;
    }
    for (int32_t c = 0; c < n_chains; c++) rank[c] = wave_start[wave[c]]++;

    /* Everything not written below stays -1 (the padding). */
    const int32_t total = size;
    for (int32_t i = 0; i < total; i++) schedule[i] = -1;
    int32_t offsets[HLD_N_ARRAYS];
    hld_offsets(capacity, offsets);
    int32_t *out_parents = schedule + offsets[HLD_PARENTS];
    int32_t *order = schedule + offsets[HLD_ORDER];
    int32_t *chain_offsets = schedule + offsets[HLD_CHAIN_OFFSETS];
    int32_t *chain_parent_boundary = schedule + offsets[HLD_CHAIN_PARENT_BOUNDARY];
    int32_t *chain_wave = schedule + offsets[HLD_CHAIN_WAVE];
    int32_t *node_boundary = schedule + offsets[HLD_NODE_BOUNDARY];
    int32_t *node_depth = schedule + offsets[HLD_NODE_DEPTH];
    int32_t *chain_parent_node = schedule + offsets[HLD_CHAIN_PARENT_NODE];
    int32_t *node_chain = schedule + offsets[HLD_NODE_CHAIN];
    int32_t *node_position = schedule + offsets[HLD_NODE_POSITION];

    int32_t max_depth = 0;
    for (int32_t t = 0; t < n; t++) {
        out_parents[t] = parent[t];
        node_depth[t] = t == 0 ? 0 : node_depth[parent[t]] + 1;
        if (node_depth[t] > max_depth) max_depth = node_depth[t];
    }

    /* Boundary slots: the distinct parent nodes of non-root chains, in increasing node order. */
    enum { NEEDS_SLOT = -2 };
    for (int32_t c = 0; c < n_chains; c++)
        if (head[c] != 0) node_boundary[parent[head[c]]] = NEEDS_SLOT;
    int32_t n_boundaries = 0;
    for (int32_t t = 0; t < n; t++)
        if (node_boundary[t] == NEEDS_SLOT) node_boundary[t] = n_boundaries++;

    /* Per chain in schedule order: its nodes root to leaf, and where its state comes from. The
     * counting sort's scratch is reused for the first node of each chain in schedule order. */
    int32_t *sorted_head = wave_start;
    for (int32_t c = 0; c < n_chains; c++) {
        sorted_head[rank[c]] = head[c];
        chain_wave[rank[c]] = wave[c];
    }
    int32_t position = 0;
    for (int32_t s = 0; s < n_chains; s++) {
        const int32_t h = sorted_head[s];
        chain_offsets[s] = position;
        chain_parent_node[s] = h == 0 ? -1 : parent[h];
        chain_parent_boundary[s] = h == 0 ? -1 : node_boundary[parent[h]];
        for (int32_t v = h; v >= 0; v = heavy[v]) {
            order[position] = v;
            node_position[v] = position++;
            node_chain[v] = s;
        }
    }
    chain_offsets[n_chains] = position;

    schedule[HLD_MAGIC_AT] = SPECLA_HLD_MAGIC;
    schedule[HLD_VERSION_AT] = SPECLA_HLD_VERSION;
    schedule[HLD_N_NODES_AT] = n;
    schedule[HLD_N_CHAINS_AT] = n_chains;
    schedule[HLD_N_WAVES_AT] = n_waves;
    schedule[HLD_N_BOUNDARIES_AT] = n_boundaries;
    schedule[HLD_MAX_CHAINS_PER_WAVE_AT] = max_chains_per_wave;
    schedule[HLD_MAX_DEPTH_AT] = max_depth;
    schedule[HLD_CAPACITY_AT] = capacity;
    schedule[HLD_TOTAL_AT] = total;
    for (int a = 0; a < HLD_N_ARRAYS; a++) schedule[HLD_OFF_PARENTS + a] = offsets[a];
    return SPECLA_OK;
}

/* Every value a kernel uses as an index is range-checked, and the structure a kernel relies on
 * (each chain a parent-linked path, a chain's parent node in an earlier wave, boundary slots where
 * the parent states live) is checked against the parent array, so that a corrupted or hand-made
 * schedule becomes an error message, never an out-of-bounds access or a silently wrong verify.
 * O(n), no allocation: `order` is proved a permutation through its inverse `node_position`. */
specla_status hld_check(const int32_t *schedule, int32_t max_nodes, const char *what) {
#define HLD_BAD(...) specla_fail(SPECLA_ERR_INVALID_ARGUMENT, __VA_ARGS__)
    if (schedule == NULL) return HLD_BAD("%s: schedule is NULL", what);
    if (schedule[HLD_MAGIC_AT] != SPECLA_HLD_MAGIC || schedule[HLD_VERSION_AT] != SPECLA_HLD_VERSION)
        return HLD_BAD("%s: schedule has magic 0x%08x version %d, expected 0x%08x version %d (build it with "
                       "specla_hld_build)",
                       what, (unsigned)schedule[HLD_MAGIC_AT], (int)schedule[HLD_VERSION_AT],
                       (unsigned)SPECLA_HLD_MAGIC, SPECLA_HLD_VERSION);
    const int32_t capacity = schedule[HLD_CAPACITY_AT];
    const int32_t size = specla_hld_size(capacity);
    if (size < 0 || schedule[HLD_TOTAL_AT] != size)
        return HLD_BAD("%s: schedule header: capacity %d and total %d do not match (specla_hld_size = %d)", what,
                       (int)capacity, (int)schedule[HLD_TOTAL_AT], (int)size);
    int32_t offsets[HLD_N_ARRAYS];
    hld_offsets(capacity, offsets);
    for (int a = 0; a < HLD_N_ARRAYS; a++)
        if (schedule[HLD_OFF_PARENTS + a] != offsets[a])
            return HLD_BAD("%s: schedule header: offset %d is %d, expected %d", what, a,
                           (int)schedule[HLD_OFF_PARENTS + a], (int)offsets[a]);
    const int32_t n = schedule[HLD_N_NODES_AT];
    const int32_t n_chains = schedule[HLD_N_CHAINS_AT];
    const int32_t n_waves = schedule[HLD_N_WAVES_AT];
    const int32_t n_boundaries = schedule[HLD_N_BOUNDARIES_AT];
    if (n < 1 || n > capacity || n > max_nodes)
        return HLD_BAD("%s: schedule has %d nodes, expected 1 to %d (capacity %d, max_nodes %d)", what, (int)n,
                       (int)(capacity < max_nodes ? capacity : max_nodes), (int)capacity, (int)max_nodes);
    if (n_chains < 1 || n_chains > n || n_waves < 1 || n_waves > n_chains || n_boundaries < 0 ||
        n_boundaries > n - 1 || schedule[HLD_MAX_CHAINS_PER_WAVE_AT] < 1 ||
        schedule[HLD_MAX_CHAINS_PER_WAVE_AT] > n_chains || schedule[HLD_MAX_DEPTH_AT] < 0 ||
        schedule[HLD_MAX_DEPTH_AT] >= n)
        return HLD_BAD("%s: schedule header counts are inconsistent (%d nodes, %d chains, %d waves, %d boundaries)",
                       what, (int)n, (int)n_chains, (int)n_waves, (int)n_boundaries);
    const int32_t *parents = schedule + offsets[HLD_PARENTS];
    const int32_t *order = schedule + offsets[HLD_ORDER];
    const int32_t *chain_offsets = schedule + offsets[HLD_CHAIN_OFFSETS];
    const int32_t *chain_parent_boundary = schedule + offsets[HLD_CHAIN_PARENT_BOUNDARY];
    const int32_t *chain_wave = schedule + offsets[HLD_CHAIN_WAVE];
    const int32_t *node_boundary = schedule + offsets[HLD_NODE_BOUNDARY];
    const int32_t *node_depth = schedule + offsets[HLD_NODE_DEPTH];
    const int32_t *chain_parent_node = schedule + offsets[HLD_CHAIN_PARENT_NODE];
    const int32_t *node_chain = schedule + offsets[HLD_NODE_CHAIN];
    const int32_t *node_position = schedule + offsets[HLD_NODE_POSITION];

    if (parents[0] != -1 || node_depth[0] != 0)
        return HLD_BAD("%s: schedule: node 0 is not the root", what);
    /* Each boundary slot belongs to one node: the builder numbers them 0, 1, ... in node order, so a
     * slot two nodes write (one chain would then start from another node's state) is refused. */
    int32_t next_slot = 0;
    for (int32_t t = 0; t < n; t++) {
        if (node_boundary[t] >= 0) {
            if (node_boundary[t] != next_slot)
                return HLD_BAD("%s: schedule: node %d has boundary slot %d, expected %d (slots are numbered 0, 1, "
                               "... in node order, one per node)",
                               what, (int)t, (int)node_boundary[t], (int)next_slot);
            next_slot++;
        }
    }
    if (next_slot != n_boundaries)
        return HLD_BAD("%s: schedule: %d nodes have a boundary slot, the header says %d", what, (int)next_slot,
                       (int)n_boundaries);
    for (int32_t t = 0; t < n; t++) {
        if (t > 0 && (parents[t] < 0 || parents[t] >= t || node_depth[t] != node_depth[parents[t]] + 1))
            return HLD_BAD("%s: schedule: parent or depth of node %d is invalid", what, (int)t);
        const int32_t at = node_position[t];
        if (at < 0 || at >= n || order[at] != t)
            return HLD_BAD("%s: schedule: order and node_position disagree at node %d", what, (int)t);
        if (node_boundary[t] < -1 || node_boundary[t] >= n_boundaries)
            return HLD_BAD("%s: schedule: node_boundary[%d] = %d is not in [-1, %d)", what, (int)t,
                           (int)node_boundary[t], (int)n_boundaries);
        const int32_t c = node_chain[t];
        if (c < 0 || c >= n_chains)
            return HLD_BAD("%s: schedule: node_chain[%d] = %d is not in [0, %d)", what, (int)t, (int)c, (int)n_chains);
    }
    if (chain_offsets[0] != 0 || chain_offsets[n_chains] != n)
        return HLD_BAD("%s: schedule: chain_offsets do not cover the %d nodes", what, (int)n);
    for (int32_t c = 0; c < n_chains; c++) {
        const int32_t begin = chain_offsets[c], end = chain_offsets[c + 1];
        if (end <= begin || end > n)
            return HLD_BAD("%s: schedule: chain %d is empty or out of range", what, (int)c);
        const int32_t first = order[begin];
        for (int32_t i = begin; i < end; i++)
            if (node_chain[order[i]] != c || (i > begin && parents[order[i]] != order[i - 1]))
                return HLD_BAD("%s: schedule: chain %d is not a path of the tree", what, (int)c);
        const int32_t wave = chain_wave[c];
        if (c == 0) {
            if (first != 0 || wave != 0 || chain_parent_node[0] != -1 || chain_parent_boundary[0] != -1)
                return HLD_BAD("%s: schedule: chain 0 must be the root chain", what);
            continue;
        }
        const int32_t parent = parents[first];
        if (first == 0 || chain_parent_node[c] != parent || node_boundary[parent] < 0 ||
            chain_parent_boundary[c] != node_boundary[parent])
            return HLD_BAD("%s: schedule: chain %d does not start from its parent's boundary slot", what, (int)c);
        if (wave < chain_wave[c - 1] || wave >= n_waves || wave != chain_wave[node_chain[parent]] + 1)
            return HLD_BAD("%s: schedule: wave of chain %d is inconsistent", what, (int)c);
    }
    return SPECLA_OK;
#undef HLD_BAD
}

specla_status hld_check_path(const int32_t *schedule, const int32_t *path, int32_t n, const char *what) {
    const int32_t n_nodes = hld_n_nodes(schedule);
    const int32_t *parents = hld_parents(schedule);
    if (n < 1 || n > n_nodes)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: path length %d not in [1, %d]", what, n, n_nodes);
    if (path[0] != 0)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: path[0] = %d, must be the root 0", what, path[0]);
    for (int i = 1; i < n; i++)
        if (path[i] < 0 || path[i] >= n_nodes || parents[path[i]] != path[i - 1])
            return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: path[%d] = %d is not a child of path[%d] = %d", what, i,
                               path[i], i - 1, path[i - 1]);
    return SPECLA_OK;
}
