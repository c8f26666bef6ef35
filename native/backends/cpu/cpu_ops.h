/* The CPU backend's kernels. Shapes and layouts are those documented in specla.h; arguments are
 * already validated by the caller (api_ops.c or the forward pass). The scalar versions are the
 * oracle: plain loops in a fixed, documented summation order. SIMD variants live in *_avx2.c files
 * behind the same signatures and are chosen by cpu_exec.kernels. */
#ifndef SPECLA_CPU_OPS_H
#define SPECLA_CPU_OPS_H
#include <math.h>
#include <stdint.h>

#include "backend.h"
#include "specla.h"

/* Scratch memory reserved once (per context, or per single-op call) so that kernels never
 * allocate: activation blocks of a matmul, and a slice per thread for attention scores and the
 * tree kernels' live states. */
typedef struct cpu_workspace {
    void *acts;               /* 64-byte aligned */
    size_t acts_bytes;
    float *thread_floats;     /* [n_threads][floats_per_thread] */
    int64_t floats_per_thread;
    int32_t *thread_ints;     /* [n_threads][ints_per_thread] */
    int64_t ints_per_thread;
} cpu_workspace;

typedef struct cpu_exec {
    int n_threads; /* >= 1 */
    int kernels;   /* SPECLA_CPU_SCALAR, SPECLA_CPU_AVX2 or SPECLA_CPU_AVX512, never AUTO */
    const cpu_workspace *ws;
    int64_t *tree_counts; /* [2] node steps and state copies of value head 0 (backend.h tree_counters);
                             NULL: not counted */
} cpu_exec;

/* Bytes of activation workspace one matmul of n_batch rows of n inputs needs (every kernel set). */
size_t cpu_matmul_workspace_bytes(int n_batch, int64_t n);
/* Reserve a workspace for matmuls of up to max_rows x max_width, floats_per_thread and
 * ints_per_thread per thread; 0 on success, -1 when out of memory. */
int cpu_workspace_init(cpu_workspace *ws, int n_threads, int max_rows, int64_t max_width, int64_t floats_per_thread,
                       int64_t ints_per_thread);
void cpu_workspace_release(cpu_workspace *ws);
static inline float *cpu_thread_floats(const cpu_exec *ex, int thread) {
    return ex->ws->thread_floats + (int64_t)thread * ex->ws->floats_per_thread;
}
static inline int32_t *cpu_thread_ints(const cpu_exec *ex, int thread) {
    return ex->ws->thread_ints + (int64_t)thread * ex->ws->ints_per_thread;
}

/* AVX512 is a superset: every op without an AVX-512 version runs its AVX2 kernel. */
static inline int cpu_uses_avx2(const cpu_exec *ex) { return ex->kernels >= SPECLA_CPU_AVX2; }

/* Resolves AUTO / n_threads <= 0 against this machine; rejects AVX2 on a CPU without it. */
specla_status cpu_exec_resolve(int n_threads, int kernels, cpu_exec *out);
int cpu_has_avx2_fma(void);
int cpu_has_avx512_vnni(void);

/* --- quant: dequantize n elements (a multiple of the block) of one row ------------------------- */
void cpu_dequantize_row_scalar(int32_t type, const void *src, int64_t n, float *dst);
void cpu_dequantize_row_avx2(int32_t type, const void *src, int64_t n, float *dst);

/* --- matmul: y[n_batch][w->ne1] = x[n_batch][w->ne0] . W^T, threads over output rows ----------
 * The arithmetic (float or 8-bit activations, by weight type) is documented in matmul_scalar.c. */
void cpu_matmul_scalar(const cpu_exec *ex, const specla_tensor *w, const float *x, int n_batch, float *y);
void cpu_matmul_avx2(const cpu_exec *ex, const specla_tensor *w, const float *x, int n_batch, float *y);
void cpu_matmul_avx512(const cpu_exec *ex, const specla_tensor *w, const float *x, int n_batch, float *y);
void cpu_matmul(const cpu_exec *ex, const specla_tensor *w, const float *x, int n_batch, float *y);
/* The 8-bit activation blocks (activation_q8.h, kind ACT_Q8_0 / ACT_Q8_K) of n_batch rows of n
 * floats, row after row, into the workspace's activation area; NULL when it is too small. */
void *cpu_quantize_activations(const cpu_exec *ex, int kind, const float *x, int64_t n, int n_batch);
/* What every matmul kernel set shares: batch rows walked per pass over a weight row (their
 * accumulators live on the stack), whether to split the output rows over the team (below 2^15
 * multiply-adds waking it costs more; the result does not depend on it either way), and the answer
 * of a matmul whose workspace was too small for its activation blocks (a caller bug): NaN, rather
 * than a silent wrong y. */
#define CPU_MATMUL_BATCH_GROUP 64
static inline int cpu_matmul_threaded(const cpu_exec *ex, const specla_tensor *w, int n_batch) {
    return w->ne0 * w->ne1 * n_batch >= (1 << 15) && ex->n_threads > 1;
}
static inline void cpu_matmul_out_of_memory(const specla_tensor *w, int n_batch, float *y) {
    for (int64_t i = 0; i < (int64_t)n_batch * w->ne1; i++) y[i] = NAN;
}
/* Row `row` of a weight tensor (any type) as floats: embedding lookup. */
void cpu_get_row(const specla_tensor *w, int64_t row, float *dst);

/* --- element-wise, norms and the recurrent / attention ops (ops_scalar.c) ---------------------- */
void cpu_rms_norm(const float *x, const float *weight, int n_rows, int n, float eps, float *y);
void cpu_l2_norm(const float *x, int n_rows, int n, float eps, float *y);
float cpu_silu(float x);
float cpu_sigmoid(float x);
float cpu_softplus(float x);
void cpu_causal_conv(const cpu_exec *ex, const float *x, const float *weight, int T, int C, int K,
                     float *conv_state, float *y);
void cpu_gated_delta_rule(const cpu_exec *ex, const float *q, const float *k, const float *v, const float *g,
                          const float *beta, int T, int Hk, int Hv, int S, float *state, float *out);
void cpu_rope_neox(float *x, const int32_t *positions, int T, int n_heads, int head_dim, int n_rot,
                   float freq_base);
void cpu_attention(const cpu_exec *ex, const float *q, const float *k_cache, const float *v_cache,
                   const int32_t *positions, int T, int n_kv, int nh, int nkv, int D, float *out);
/* Tree attention: query node t sees cache rows 0 .. n_prefix-1, then the rows n_prefix + a of its
 * ancestors a and itself (parents[] topological), in that order. */
void cpu_attention_tree(const cpu_exec *ex, const float *q, const float *k_cache, const float *v_cache, int n_prefix,
                        const int32_t *parents, int T, int nh, int nkv, int D, float *out);

/* --- element-wise, rows and logits (elementwise.c); semantics in backend.h ------------------ */
void cpu_add(float *dst, const float *src, int64_t n);
void cpu_add_rms_norm(float *x, const float *delta, const float *weight, int n_rows, int n, float eps, float *y);
void cpu_add_bias_rows(float *x, const float *bias, int rows, int n);
void cpu_silu_mul(float *a, const float *b, int64_t n);
void cpu_sigmoid_mul(float *x, const float *gate, int64_t n);
void cpu_gdn_gates(float *beta, float *g, const float *dt_bias, const float *ssm_a, int T, int Hv);
void cpu_gdn_split_qkv(const float *conv_out, int T, int Hk, int Hv, int S, float eps, float *q, float *k, float *v);
void cpu_gated_rms_norm(float *x, const float *weight, const float *gate, int n_rows, int n, float eps);
void cpu_split_q_gate(const float *qg, int T, int nh, int D, float *q, float *gate);
void cpu_scatter_rows(float *dst, int64_t dst_stride, const int32_t *rows, const float *src, int T, int width);
void cpu_move_rows(float *buf, int64_t stride, int width, const int32_t *from, const int32_t *to, int n);
void cpu_gather_rows(float *dst, int64_t dst_block, const float *src, int64_t src_block, int n_blocks,
                     const row_field *fields, int n_fields, const int32_t *rows, int n);
void cpu_argmax_rows(const float *logits, int n_rows, int V, int n, int32_t *out); /* rows V apart, first n */
/* rows of V logits, row_stride floats apart */
void cpu_topk_log_softmax(const cpu_exec *ex, const float *logits, int n_rows, int64_t row_stride, int V, int k,
                          int32_t *tokens, float *logprobs);

/* The gated-delta-rule step/fold pair of a kernel set (AVX2 needs S % 8 == 0, else scalar). */
struct gdn_kernels {
    void (*step)(float *M, int S, const float *q, const float *k, const float *v, float decay, float beta,
                 float scale, float *out, float *delta_out);
    void (*fold)(float *M, int S, const float *k, const float *delta, float decay);
};
struct gdn_kernels cpu_gdn_kernels(const cpu_exec *ex, int S);

/* --- SpecLA tree verify (specla_tree_cpu.c); schedule = packed HLD layout (specla.h) ---------- */
/* Tree verify of one GDN layer through state-resident HLD chains. If `pending` holds a path, it
 * is folded into `state` first, per head inside the same kernel (deferred fused commit);
 * otherwise `state` is only read. out [N][Hv][S]; delta_out [N][Hv][S] receives every node's
 * delta factor. */
void cpu_gdn_tree_chains(const cpu_exec *ex, const int32_t *schedule, const float *q, const float *k, const float *v,
                         const float *g, const float *beta, int Hk, int Hv, int S, float *state,
                         const gdn_pending *pending, float *out, float *delta_out);
/* Baseline: replay every root-to-leaf path from `state` (nodes on shared prefixes recomputed). */
void cpu_gdn_tree_root_to_leaf(const cpu_exec *ex, const int32_t *schedule, const float *q, const float *k,
                               const float *v, const float *g, const float *beta, int Hk, int Hv, int S,
                               const float *state, float *out, float *delta_out);
/* Baseline: the full state after every node, kept in checkpoints [N][Hv][S][S]. */
void cpu_gdn_tree_checkpoints(const cpu_exec *ex, const int32_t *schedule, const float *q, const float *k,
                              const float *v, const float *g, const float *beta, int Hk, int Hv, int S,
                              const float *state, float *out, float *delta_out, float *checkpoints);
/* Fold P accepted tokens' factors k [P][Hk][S], delta [P][Hv][S], g [P][Hv] into state. */
void cpu_gdn_fold(const cpu_exec *ex, float *state, const float *k, const float *delta, const float *g, int P, int Hk,
                  int Hv, int S);
/* Tree conv + SiLU: each node's window from its tree parent's history; conv_state read only.
 * window_out (may be NULL) receives each node's last K-1 raw inputs [N][K-1][C] (checkpoints). */
void cpu_conv_tree(const cpu_exec *ex, const int32_t *schedule, const float *x, const float *weight, int C, int K,
                   const float *conv_state, float *y, float *window_out);
/* Shift P raw inputs x [P][C] into the conv window [K-1][C]. */
void cpu_conv_fold(float *conv_state, const float *x, int P, int C, int K);

#endif
