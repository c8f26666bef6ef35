/* SpecLA tree verification on the CPU: the recurrent layers of a tree of candidate tokens,
 * verified from the durable state without writing it, plus the baselines SpecLA replaces.
 *
 * Every node goes through the kernel set's GDN step and conv_window_output (recurrent_step.h), the very
 * functions the sequential kernels use, starting from exactly the state its root path would have
 * produced: so each node's output equals sequential decoding of its root path bit for bit. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "cpu_ops.h"
#include "hld_layout.h"
#include "recurrent_step.h"

#define NODE_HEAD(arr, node, heads, h, S) ((arr) + (((int64_t)(node) * (heads) + (h)) * (S)))

/* One node of one value head: the step from `M` (already the parent's state), writing the
 * node's output and delta factor. */
static inline void tree_node_step(const struct gdn_kernels *kern, float *M, int node, int h, int Hk, int Hv, int S,
                                  float scale, const float *q, const float *k, const float *v, const float *g,
                                  const float *beta, float *out, float *delta_out) {
    const int kh = h % Hk;
    kern->step(M, S, NODE_HEAD(q, node, Hk, kh, S), NODE_HEAD(k, node, Hk, kh, S), NODE_HEAD(v, node, Hv, h, S),
                  expf(g[(int64_t)node * Hv + h]), beta[(int64_t)node * Hv + h], scale, NODE_HEAD(out, node, Hv, h, S),
                  NODE_HEAD(delta_out, node, Hv, h, S));
}

/* Head 0's work goes to the counters (one thread runs head 0, so no race). */
static inline void count_tree_work(const cpu_exec *ex, int h, int64_t steps, int64_t copies) {
    if (h == 0 && ex->tree_counts) {
        ex->tree_counts[0] += steps;
        ex->tree_counts[1] += copies;
    }
}

void cpu_gdn_tree_chains(const cpu_exec *ex, const int32_t *schedule, const float *q, const float *k, const float *v,
                         const float *g, const float *beta, int Hk, int Hv, int S, float *state,
                         const gdn_pending *pending, float *out, float *delta_out) {
    const float scale = 1.0f / sqrtf((float)S);
    const struct gdn_kernels kern = cpu_gdn_kernels(ex, S);
    const int n_chains = hld_n_chains(schedule);
    const int n_boundaries = hld_n_boundaries(schedule);
    const int32_t *order = hld_order(schedule);
    const int32_t *chain_offsets = hld_chain_offsets(schedule);
    const int32_t *chain_parent_boundary = hld_chain_parent_boundary(schedule);
    const int32_t *node_boundary = hld_node_boundary(schedule);
    const int64_t head_size = (int64_t)S * S;
    const int n_pending = pending ? *pending->n : 0; /* host memory on this backend */
#pragma omp parallel num_threads(ex->n_threads)
    {
        /* per thread: the live state of the chain being walked ("registers") and the boundary
         * slots, the only states ever materialised */
        float *live = cpu_thread_floats(ex, omp_get_thread_num()); /* room for 1 + max_nodes heads */
        float *boundaries = live + head_size;
#pragma omp for schedule(static)
        for (int h = 0; h < Hv; h++) {
            if (n_pending > 0) {
                /* deferred fused commit: the previous step's accepted path enters this head's
                 * durable state here, written once, while the state is hot for the root chain */
                float *M = state + h * head_size;
                for (int p = 0; p < n_pending; p++)
                    kern.fold(M, S, NODE_HEAD(pending->k, p, Hk, h % Hk, S), NODE_HEAD(pending->delta, p, Hv, h, S),
                              expf(pending->g[(int64_t)p * Hv + h]));
            }
            /* chains come in wave order, so a chain's start state is always ready */
            for (int c = 0; c < n_chains; c++) {
                const int slot = chain_parent_boundary[c];
                const float *start = slot < 0 ? state + h * head_size : boundaries + slot * head_size;
                memcpy(live, start, sizeof(float) * (size_t)head_size); /* loaded once per chain */
                for (int p = chain_offsets[c]; p < chain_offsets[c + 1]; p++) {
                    const int node = order[p];
                    tree_node_step(&kern, live, node, h, Hk, Hv, S, scale, q, k, v, g, beta, out, delta_out);
                    count_tree_work(ex, h, 1, 0);
                    if (node_boundary[node] >= 0) {
                        memcpy(boundaries + node_boundary[node] * head_size, live, sizeof(float) * (size_t)head_size);
                        count_tree_work(ex, h, 0, 1);
                    }
                }
            }
        }
    }
    (void)n_boundaries;
}

void cpu_gdn_tree_root_to_leaf(const cpu_exec *ex, const int32_t *schedule, const float *q, const float *k,
                               const float *v, const float *g, const float *beta, int Hk, int Hv, int S,
                               const float *state, float *out, float *delta_out) {
    const float scale = 1.0f / sqrtf((float)S);
    const struct gdn_kernels kern = cpu_gdn_kernels(ex, S);
    const int N = hld_n_nodes(schedule);
    const int32_t *parents = hld_parents(schedule);
    const int64_t head_size = (int64_t)S * S;
#pragma omp parallel num_threads(ex->n_threads)
    {
        float *live = cpu_thread_floats(ex, omp_get_thread_num());
        int32_t *local_path = cpu_thread_ints(ex, omp_get_thread_num());
        int32_t *is_parent = local_path + N; /* leaves = nodes nobody names as parent */
        for (int t = 0; t < N; t++) is_parent[t] = 0;
        for (int t = 1; t < N; t++) is_parent[parents[t]] = 1;
#pragma omp for schedule(static)
        for (int h = 0; h < Hv; h++) {
            for (int leaf = 0; leaf < N; leaf++) {
                if (is_parent[leaf]) continue;
                int len = 0;
                for (int t = leaf; t >= 0; t = parents[t]) local_path[len++] = t;
                memcpy(live, state + h * head_size, sizeof(float) * (size_t)head_size);
                count_tree_work(ex, h, len, 1);
                for (int i = len - 1; i >= 0; i--)
                    tree_node_step(&kern, live, local_path[i], h, Hk, Hv, S, scale, q, k, v, g, beta, out, delta_out);
            }
        }
    }
}

void cpu_gdn_tree_checkpoints(const cpu_exec *ex, const int32_t *schedule, const float *q, const float *k,
                              const float *v, const float *g, const float *beta, int Hk, int Hv, int S,
                              const float *state, float *out, float *delta_out, float *checkpoints) {
    const float scale = 1.0f / sqrtf((float)S);
    const struct gdn_kernels kern = cpu_gdn_kernels(ex, S);
    const int N = hld_n_nodes(schedule);
    const int32_t *parents = hld_parents(schedule);
    const int64_t head_size = (int64_t)S * S, node_size = (int64_t)Hv * head_size;
#pragma omp parallel for num_threads(ex->n_threads) schedule(static)
    for (int h = 0; h < Hv; h++) {
        for (int t = 0; t < N; t++) { /* topological order: the parent's checkpoint exists */
            float *M = checkpoints + t * node_size + h * head_size;
            const float *from = t == 0 ? state + h * head_size : checkpoints + parents[t] * node_size + h * head_size;
            memcpy(M, from, sizeof(float) * (size_t)head_size);
            tree_node_step(&kern, M, t, h, Hk, Hv, S, scale, q, k, v, g, beta, out, delta_out);
            count_tree_work(ex, h, 1, 1);
        }
    }
}

void cpu_gdn_fold(const cpu_exec *ex, float *state, const float *k, const float *delta, const float *g, int P, int Hk,
                  int Hv, int S) {
    const struct gdn_kernels kern = cpu_gdn_kernels(ex, S);
#pragma omp parallel for num_threads(ex->n_threads) schedule(static)
    for (int h = 0; h < Hv; h++) {
        float *M = state + (int64_t)h * S * S;
        for (int p = 0; p < P; p++)
            kern.fold(M, S, NODE_HEAD(k, p, Hk, h % Hk, S), NODE_HEAD(delta, p, Hv, h, S),
                          expf(g[(int64_t)p * Hv + h]));
    }
}

void cpu_conv_tree(const cpu_exec *ex, const int32_t *schedule, const float *x, const float *weight, int C, int K,
                   const float *conv_state, float *y, float *window_out) {
    const int N = hld_n_nodes(schedule);
    const int32_t *parents = hld_parents(schedule);
    const int hist = K - 1;
#pragma omp parallel for num_threads(ex->n_threads) schedule(static)
    for (int c = 0; c < C; c++) {
        const float *w = weight + (int64_t)c * K;
        float window[64];
        for (int t = 0; t < N; t++) {
            /* fill the window from the newest sample back: the node, its ancestors, then the
             * durable window's rows (newest last) once the root path runs out */
            window[hist] = x[(int64_t)t * C + c];
            int node = parents[t];
            int state_row = hist - 1;
            for (int j = hist - 1; j >= 0; j--) {
                if (node >= 0) {
                    window[j] = x[(int64_t)node * C + c];
                    node = parents[node];
                } else {
                    window[j] = conv_state[(int64_t)(state_row--) * C + c];
                }
            }
            y[(int64_t)t * C + c] = conv_window_output(window, w, K);
            if (window_out)
                for (int j = 0; j < hist; j++) window_out[((int64_t)t * hist + j) * C + c] = window[j + 1];
        }
    }
}

void cpu_conv_fold(float *conv_state, const float *x, int P, int C, int K) {
    const int hist = K - 1;
    if (P >= hist) {
        memcpy(conv_state, x + (int64_t)(P - hist) * C, sizeof(float) * (size_t)hist * (size_t)C);
    } else {
        memmove(conv_state, conv_state + (int64_t)P * C, sizeof(float) * (size_t)(hist - P) * (size_t)C);
        memcpy(conv_state + (int64_t)(hist - P) * C, x, sizeof(float) * (size_t)P * (size_t)C);
    }
}
