/* The CPU backend's table (backend.h): host memory, the scalar / AVX2 / AVX-512 kernels chosen at
 * creation (cpu_exec), and a workspace reserved once for the limits the caller named, so that no
 * op allocates. */
#include <stdlib.h>
#include <string.h>

#include "activation_q8.h"
#include "cpu_ops.h"
#include "element_types.h"
#include "error.h"

typedef struct cpu_backend {
    backend base;
    cpu_exec exec;
    cpu_workspace ws;
    int64_t tree_counts[2];
} cpu_backend;

static const cpu_exec *ex_of(const backend *be) { return &((const cpu_backend *)be)->exec; }

static void destroy(backend *be) {
    cpu_backend *cb = (cpu_backend *)be;
    if (!cb) return;
    cpu_workspace_release(&cb->ws);
    free(cb);
}

static void *alloc(const backend *be, size_t bytes) { return calloc(bytes > 0 ? bytes : 1, 1); }
static void release(const backend *be, void *ptr) { free(ptr); }
static void upload(const backend *be, void *dst, const void *src, size_t bytes) {
    if (dst != src && bytes) memcpy(dst, src, bytes);
}
static specla_status download(const backend *be, void *dst, const void *src, size_t bytes) {
    upload(be, dst, src, bytes);
    return SPECLA_OK;
}
static void copy(const backend *be, void *dst, const void *src, size_t bytes) {
    if (dst != src && bytes) memmove(dst, src, bytes);
}
static void fill(const backend *be, float *dst, float value, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = value;
}
static specla_status sync_noop(const backend *be) { return SPECLA_OK; }
/* every op has finished when it returns: nothing to order */
static void wait_noop(const backend *be, const backend *other) {}
/* a weight is its GGUF rows in host memory whatever reads it */
static void gather_weight_rows(const backend *be, const specla_tensor *w, const int32_t *ids, int n, void *dst,
                               int first) {
    const int64_t row_bytes = type_row_bytes(w->type, w->ne0);
    for (int i = 0; i < n; i++)
        memcpy((uint8_t *)dst + (int64_t)(first + i) * row_bytes, (const uint8_t *)w->data + (int64_t)ids[i] * row_bytes,
               (size_t)row_bytes);
}
static void no_launches(const backend *be, int64_t out[3]) { out[0] = out[1] = out[2] = -1; }

static void matmul(const backend *be, const specla_tensor *w, const float *x, int n_batch, float *y) {
    cpu_matmul(ex_of(be), w, x, n_batch, y);
}
static void matmul_group(const backend *be, int n_mats, const specla_tensor *const *w, const float *x, int n_batch,
                         float *const *y) {
    for (int i = 0; i < n_mats; i++) cpu_matmul(ex_of(be), w[i], x, n_batch, y[i]);
}
static void get_rows(const backend *be, const specla_tensor *w, const int32_t *ids, int n, float *out) {
    for (int i = 0; i < n; i++) cpu_get_row(w, ids[i], out + (int64_t)i * w->ne0);
}
static void dequantize(const backend *be, int32_t type, const void *src, int64_t n, float *dst) {
    if (cpu_uses_avx2(ex_of(be)))
        cpu_dequantize_row_avx2(type, src, n, dst);
    else
        cpu_dequantize_row_scalar(type, src, n, dst);
}
static void quantize_activations(const backend *be, int32_t weight_type, const float *x, int n_rows, int n,
                                 int8_t *codes, float *scales) {
    const int kind = act_kind_for_weight(weight_type);
    const int block = kind == ACT_Q8_K ? 256 : 32;
    const void *acts = cpu_quantize_activations(ex_of(be), kind, x, n, n_rows);
    for (int64_t k = 0; k < (int64_t)n_rows * (n / block); k++) {
        const int8_t *qs = kind == ACT_Q8_K ? ((const act_q8_k *)acts)[k].qs : ((const act_q8_0 *)acts)[k].qs;
        scales[k] = kind == ACT_Q8_K ? ((const act_q8_k *)acts)[k].d : ((const act_q8_0 *)acts)[k].d;
        memcpy(codes + k * block, qs, (size_t)block);
    }
}
static void l2_norm(const backend *be, const float *x, int n_rows, int n, float eps, float *y) {
    cpu_l2_norm(x, n_rows, n, eps, y);
}
static void rms_norm(const backend *be, const float *x, const float *weight, int n_rows, int n, float eps, float *y) {
    cpu_rms_norm(x, weight, n_rows, n, eps, y);
}
static void add(const backend *be, float *dst, const float *src, int64_t n) { cpu_add(dst, src, n); }
static void add_rms_norm(const backend *be, float *x, const float *delta, const float *weight, int n_rows, int n,
                         float eps, float *y) {
    cpu_add_rms_norm(x, delta, weight, n_rows, n, eps, y);
}
static void add_bias_rows(const backend *be, float *x, const float *bias, int rows, int n) {
    cpu_add_bias_rows(x, bias, rows, n);
}
static void silu_mul(const backend *be, float *a, const float *b, int64_t n) { cpu_silu_mul(a, b, n); }
static void sigmoid_mul(const backend *be, float *x, const float *gate, int64_t n) { cpu_sigmoid_mul(x, gate, n); }
static void gdn_gates(const backend *be, float *beta, float *g, const float *dt_bias, const float *ssm_a, int T,
                      int Hv) {
    cpu_gdn_gates(beta, g, dt_bias, ssm_a, T, Hv);
}
static void gdn_split_qkv(const backend *be, const float *conv_out, int T, int Hk, int Hv, int S, float eps, float *q,
                          float *k, float *v) {
    cpu_gdn_split_qkv(conv_out, T, Hk, Hv, S, eps, q, k, v);
}
static void gated_rms_norm(const backend *be, float *x, const float *weight, const float *gate, int n_rows, int n,
                           float eps) {
    cpu_gated_rms_norm(x, weight, gate, n_rows, n, eps);
}
static void split_q_gate(const backend *be, const float *qg, int T, int nh, int D, float *q, float *gate) {
    cpu_split_q_gate(qg, T, nh, D, q, gate);
}
static void rope_neox(const backend *be, float *x, const int32_t *positions, int T, int n_heads, int head_dim,
                      int n_rot, float freq_base) {
    cpu_rope_neox(x, positions, T, n_heads, head_dim, n_rot, freq_base);
}
static void scatter_rows(const backend *be, float *dst, int64_t dst_stride, const int32_t *rows, const float *src,
                         int T, int width) {
    cpu_scatter_rows(dst, dst_stride, rows, src, T, width);
}
static void move_rows(const backend *be, float *buf, int64_t stride, int width, const int32_t *from,
                      const int32_t *to, int n) {
    cpu_move_rows(buf, stride, width, from, to, n);
}
static void gather_rows(const backend *be, float *dst, int64_t dst_block, const float *src, int64_t src_block,
                        int n_blocks, const row_field *fields, int n_fields, const int32_t *rows, int n) {
    cpu_gather_rows(dst, dst_block, src, src_block, n_blocks, fields, n_fields, rows, n);
}
/* first_row is host memory here (the backend's memory): the window starts there */
static void attention(const backend *be, const float *q, const float *k_cache, const float *v_cache,
                      const int32_t *first_row, const int32_t *positions, int T, int n_kv, int nh, int nkv, int D,
                      float *out) {
    const int64_t first = first_row ? (int64_t)*first_row * nkv * D : 0;
    cpu_attention(ex_of(be), q, k_cache + first, v_cache + first, positions, T, n_kv, nh, nkv, D, out);
}
/* n_prefix and P are host memory here (the backend's memory): read as the op runs */
static void attention_tree(const backend *be, const float *q, const float *k_cache, const float *v_cache,
                           const int32_t *n_prefix, int max_rows, const int32_t *parents, int T, int nh, int nkv, int D,
                           float *out) {
    cpu_attention_tree(ex_of(be), q, k_cache, v_cache, *n_prefix, parents, T, nh, nkv, D, out);
}
static void causal_conv(const backend *be, const float *x, const float *weight, int T, int C, int K,
                        float *conv_state, float *y) {
    cpu_causal_conv(ex_of(be), x, weight, T, C, K, conv_state, y);
}
/* the oracle: the three ops it stands for, in their order */
static void gdn_prepare(const backend *be, float *beta, float *g, const float *dt_bias, const float *ssm_a,
                        const float *x, const float *conv_weight, int T, int Hk, int Hv, int S, int K, float eps,
                        float *conv_state, float *conv_out, float *q, float *k, float *v) {
    gdn_gates(be, beta, g, dt_bias, ssm_a, T, Hv);
    causal_conv(be, x, conv_weight, T, 2 * Hk * S + Hv * S, K, conv_state, conv_out);
    gdn_split_qkv(be, conv_out, T, Hk, Hv, S, eps, q, k, v);
}
static void gated_delta_rule(const backend *be, const float *q, const float *k, const float *v, const float *g,
                             const float *beta, int T, int Hk, int Hv, int S, float *state, float *out) {
    cpu_gated_delta_rule(ex_of(be), q, k, v, g, beta, T, Hk, Hv, S, state, out);
}
static void gdn_tree_chains(const backend *be, const int32_t *schedule, const float *q, const float *k,
                            const float *v, const float *g, const float *beta, int Hk, int Hv, int S, float *state,
                            const gdn_pending *pending, float *out, float *delta_out) {
    cpu_gdn_tree_chains(ex_of(be), schedule, q, k, v, g, beta, Hk, Hv, S, state, pending, out, delta_out);
}
static void gdn_tree_root_to_leaf(const backend *be, const int32_t *schedule, const float *q, const float *k,
                                  const float *v, const float *g, const float *beta, int Hk, int Hv, int S,
                                  const float *state, float *out, float *delta_out) {
    cpu_gdn_tree_root_to_leaf(ex_of(be), schedule, q, k, v, g, beta, Hk, Hv, S, state, out, delta_out);
}
static void gdn_tree_checkpoints(const backend *be, const int32_t *schedule, const float *q, const float *k,
                                 const float *v, const float *g, const float *beta, int Hk, int Hv, int S,
                                 const float *state, float *out, float *delta_out, float *checkpoints) {
    cpu_gdn_tree_checkpoints(ex_of(be), schedule, q, k, v, g, beta, Hk, Hv, S, state, out, delta_out, checkpoints);
}
static void gdn_fold(const backend *be, float *state, const float *k, const float *delta, const float *g, int P,
                     int Hk, int Hv, int S) {
    cpu_gdn_fold(ex_of(be), state, k, delta, g, P, Hk, Hv, S);
}
static void conv_tree(const backend *be, const int32_t *schedule, const float *x, const float *weight, int C, int K,
                      const float *conv_state, float *y, float *window_out) {
    cpu_conv_tree(ex_of(be), schedule, x, weight, C, K, conv_state, y, window_out);
}
static void conv_fold(const backend *be, float *conv_state, const float *x, const int32_t *P, int C, int K) {
    if (*P > 0) cpu_conv_fold(conv_state, x, *P, C, K);
}
static void tree_counters(const backend *be, int64_t out[2]) {
    cpu_backend *cb = (cpu_backend *)be;
    out[0] = cb->tree_counts[0], out[1] = cb->tree_counts[1];
    cb->tree_counts[0] = cb->tree_counts[1] = 0;
}
/* how many of a row's V entries rank: *n_valid clamped to [0, V], or V (backend.h) */
static int ranked_entries(const int32_t *n_valid, int V) {
    return n_valid ? (*n_valid < 0 ? 0 : *n_valid < V ? *n_valid : V) : V;
}
static void argmax_rows(const backend *be, const float *logits, int n_rows, int V, int32_t *out,
                        const int32_t *n_valid) {
    cpu_argmax_rows(logits, n_rows, V, ranked_entries(n_valid, V), out);
}
static void topk_log_softmax(const backend *be, const float *logits, int n_rows, int V, int k, int32_t *tokens,
                             float *logprobs, const int32_t *n_valid) {
    cpu_topk_log_softmax(ex_of(be), logits, n_rows, V, ranked_entries(n_valid, V), k, tokens, logprobs);
}

static const backend_ops cpu_ops_table = {
    .name = "cpu",
    .host_memory = 1,
    .destroy = destroy,
    .alloc = alloc,
    .free = release,
    .upload = upload,
    .download = download,
    .copy = copy,
    .fill = fill,
    .sync = sync_noop,
    .wait_for = wait_noop,
    .gather_weight_rows = gather_weight_rows,
    .launch_counters = no_launches,
    .matmul = matmul,
    .matmul_group = matmul_group,
    .get_rows = get_rows,
    .dequantize = dequantize,
    .quantize_activations = quantize_activations,
    .rms_norm = rms_norm,
    .add_rms_norm = add_rms_norm,
    .l2_norm = l2_norm,
    .add = add,
    .add_bias_rows = add_bias_rows,
    .silu_mul = silu_mul,
    .sigmoid_mul = sigmoid_mul,
    .gdn_gates = gdn_gates,
    .gdn_split_qkv = gdn_split_qkv,
    .gdn_prepare = gdn_prepare,
    .gated_rms_norm = gated_rms_norm,
    .split_q_gate = split_q_gate,
    .rope_neox = rope_neox,
    .attention_prepare = attention_prepare_by_ops, /* the oracle: the ops it stands for */
    .scatter_rows = scatter_rows,
    .move_rows = move_rows,
    .gather_rows = gather_rows,
    .attention = attention,
    .attention_tree = attention_tree,
    .causal_conv = causal_conv,
    .gated_delta_rule = gated_delta_rule,
    .gdn_tree_chains = gdn_tree_chains,
    .gdn_tree_root_to_leaf = gdn_tree_root_to_leaf,
    .gdn_tree_checkpoints = gdn_tree_checkpoints,
    .gdn_fold = gdn_fold,
    .conv_tree = conv_tree,
    .conv_fold = conv_fold,
    .tree_counters = tree_counters,
    .argmax_rows = argmax_rows,
    .topk_log_softmax = topk_log_softmax,
};

specla_status cpu_backend_create(int n_threads, int cpu_kernels, const backend_limits *limits, backend **out) {
    *out = NULL;
    cpu_exec exec;
    specla_status st = cpu_exec_resolve(n_threads, cpu_kernels, &exec);
    if (st != SPECLA_OK) return st;
    cpu_backend *cb = (cpu_backend *)calloc(1, sizeof *cb);
    if (!cb) return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "cpu backend: out of memory");
    /* per thread: attention scores over the longest row list, or the tree kernels' live state and
     * boundary slots (1 + max_nodes heads); ints: a node's ancestor rows, a path and a leaf mark */
    const int64_t nodes = limits->max_nodes > 0 ? limits->max_nodes : 1;
    int64_t floats = limits->max_kv_rows + nodes;
    const int64_t tree_floats = (int64_t)limits->gdn_head_size * (1 + nodes);
    if (tree_floats > floats) floats = tree_floats;
    const int64_t ints = 2 * (nodes > limits->max_rows ? nodes : limits->max_rows);
    if (cpu_workspace_init(&cb->ws, exec.n_threads, limits->max_rows, limits->max_width, floats, ints) != 0) {
        free(cb);
        return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "cpu backend: out of memory for a workspace of %d rows x %d",
                           limits->max_rows, limits->max_width);
    }
    exec.ws = &cb->ws;
    exec.tree_counts = cb->tree_counts;
    cb->exec = exec;
    cb->base.ops = &cpu_ops_table;
    cb->base.state = &cb->exec;
    cb->base.kind = SPECLA_BACKEND_CPU;
    cb->base.device = 0;
    cb->base.records_batches = 0; /* it records no step */
    *out = &cb->base;
    return SPECLA_OK;
}
