/* The one op vocabulary of libspecla: every model forward, the factor banks and the context reach
 * memory and kernels through a backend's table, never by a kernel's own name. A backend (CPU,
 * CUDA, HIP) fills one `backend_ops` table; the core (native/src) is written once against it.
 *
 * Memory: every float / int32 pointer an op takes is BACKEND memory (host memory on the CPU,
 * device memory on a GPU) unless its comment says "host". Weights are specla_tensor views whose
 * data is backend memory (the mmap on the CPU, an upload on a GPU). The context allocates all of
 * its buffers at creation through `alloc`, so a generation step allocates nothing; small per-step
 * index arrays (positions, rows, parents, schedules, token ids) are uploaded into buffers it owns.
 *
 * Ops run in order on one stream; `download` and `sync` are the only points where the host waits.
 * Two instances on one device (a target context and a DFlash draft context reading its feature
 * rows) have a stream each: `wait_for` orders one after the other without the host waiting.
 * Shapes and layouts are those of specla.h; arguments arrive validated (the core checks at the ABI),
 * so ops never fail except for the memory calls, which report through their return values.
 *
 * Numerics: each backend computes every output row in one order whatever the batch size (matmuls,
 * attention, norms), so prefill == decode and a verified tree node == decoding its path, bit for bit,
 * on that backend. The CPU backend is the oracle the others are tested against. */
#ifndef SPECLA_BACKEND_H
#define SPECLA_BACKEND_H
#include <stddef.h>
#include <stdint.h>

#include "specla.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct backend backend;

/* Keys of recorded steps: the decode step of each depth class (key STEP_DECODE + class: shallow
 * steps see at most DECODE_SHALLOW_ROWS rows and are recorded with that bound, deeper ones with the
 * context's capacity), verify steps of up to STEP_SLOTS node counts (key STEP_VERIFY + slot), causal
 * batches of up to STEP_SLOTS token counts (key STEP_BATCH + slot; the context says which count and
 * LM head a slot was recorded for), and a DFlash draft context's proposal (its own backend instance;
 * the draft context says for which depths, top-k and LM head). */
enum {
    STEP_DECODE = 0,
    DECODE_CLASSES = 2,
    DECODE_SHALLOW_ROWS = 1024,
    STEP_SLOTS = 4,
    STEP_VERIFY = STEP_DECODE + DECODE_CLASSES,
    STEP_BATCH = STEP_VERIFY + STEP_SLOTS,
    STEP_PROPOSE = STEP_BATCH + STEP_SLOTS,
    STEP_KINDS = STEP_PROPOSE + 1
};

/* Sizes a backend instance must be ready for, so it can reserve its workspace once. */
typedef struct backend_limits {
    int32_t max_rows;      /* most rows any op sees at once (batch, tree nodes, draft block) */
    int32_t max_width;     /* widest row a matmul reads (n_in) */
    int32_t max_kv_rows;   /* most cache rows one attention query reads */
    int32_t max_nodes;     /* largest tree (0: no tree ops) */
    int32_t gdn_head_size; /* S * S of one recurrent head (0: no recurrent layers) */
    int32_t conv_window;   /* (K - 1) * C of one recurrent layer */
    int32_t gdn_heads;     /* Hv, value heads of a recurrent layer (0: none) */
    int32_t attn_heads;    /* query heads of an attention op (0: none) */
    int32_t attn_head_dim; /* their head dim */
    int32_t n_vocab;       /* logit row length of argmax / top-k (0: none) */
} backend_limits;

/* A pending accepted path's factors (SpecLA deferred commit): k [n][Hk][S], delta [n][Hv][S], g [n][Hv];
 * its length n is backend memory (one int, 0: nothing to fold), read by the
 * op when it runs, so a recorded verify folds whatever path the step before accepted. */
typedef struct gdn_pending {
    const float *k, *delta, *g;
    const int32_t *n;
} gdn_pending;

/* One field of a row gather (gather_rows): rows of `width` floats that start `src_offset` floats into
 * each source block and `dst_offset` floats into each destination block. */
typedef struct row_field {
    int64_t dst_offset, src_offset;
    int32_t width;
} row_field;
enum { GATHER_MAX_FIELDS = 8 };

/* What an uploaded weight is read by: a matmul (a backend may lay it out for its kernels) or
 * anything else (the bytes as stored: vectors, conv weights, embedding rows). */
enum weight_use { WEIGHT_PLAIN = 0, WEIGHT_MATMUL = 1 };

typedef struct backend_ops {
    const char *name;
    int host_memory; /* 1: backend memory is host memory (pointers may be handed to the caller) */
    void (*destroy)(backend *be); /* frees the instance and its workspace */

    /* --- memory ---------------------------------------------------------------------------- */
    void *(*alloc)(const backend *be, size_t bytes); /* zero-filled; NULL when out of memory */
    void (*free)(const backend *be, void *ptr);
    void (*upload)(const backend *be, void *dst, const void *host_src, size_t bytes);
    /* waits for the stream, so it reports the first error of the ops before it, as sync does */
    specla_status (*download)(const backend *be, void *host_dst, const void *src, size_t bytes);
    void (*copy)(const backend *be, void *dst, const void *src, size_t bytes); /* dst == src: nothing */
    void (*fill)(const backend *be, float *dst, float value, int64_t n);
    specla_status (*sync)(const backend *be);
    /* ops issued on `be` from now on start after every op issued on `other` so far (another
     * instance of the same kind on the same device); the host does not wait */
    void (*wait_for)(const backend *be, const backend *other);
    /* Recorded steps (CUDA graphs): a backend that can record the ops of a step once and replay
     * them. The ops between capture_begin and capture_end are recorded, not run; replay runs the
     * recording of `key` (0 when there is none yet: the caller records it first). The caller keeps
     * every pointer and launch parameter of a recorded step the same at each replay (data that
     * changes per step, such as token ids and positions, is read from buffers it uploads before).
     * NULL where the backend has no such thing (the CPU). */
    void (*capture_begin)(const backend *be);
    specla_status (*capture_end)(const backend *be, int key);
    int (*replay)(const backend *be, int key);
    /* Since the last call, which resets them: out[0] launches (kernels launched one by one and
     * recorded steps replayed), out[1] host waits (downloads, syncs), out[2] kernels run on the
     * device (the ones launched one by one outside a recording, plus every kernel of each replayed
     * step). -1 each where the backend does not count (the CPU launches nothing). */
    void (*launch_counters)(const backend *be, int64_t out[3]);

    /* --- weights (backends whose memory is not host memory; a host backend reads the views) ---- */
    /* bytes a host weight takes in backend memory once uploaded for `use` (weight_use); 0 when this
     * backend cannot hold it */
    size_t (*weight_bytes)(const backend *be, const specla_tensor *host, int use);
    /* copy a host weight into dst (weight_bytes of backend memory), laid out for `use` */
    specla_status (*upload_weight)(const backend *be, const specla_tensor *host, void *dst, int use);
    /* A reduced LM head: rows ids[0..n) of matmul weight w (in backend memory as this backend's
     * matmul reads it: the host view on a host backend, the WEIGHT_MATMUL upload on a GPU) become
     * rows first .. first+n-1 of dst, a weight of w's type and row length with room for at least
     * first+n rows (weight_bytes of that shape on a GPU, rows of the type's bytes on the host); ids
     * in backend memory. */
    void (*gather_weight_rows)(const backend *be, const specla_tensor *w, const int32_t *ids, int n, void *dst,
                               int first);

    /* --- the matmul family ------------------------------------------------------------------- */
    /* y[n_batch][w->ne1] = x[n_batch][w->ne0] . W^T (each row batch-invariant) */
    void (*matmul)(const backend *be, const specla_tensor *w, const float *x, int n_batch, float *y);
    /* several matrices sharing the input x: y[i] = x . W[i]^T, the same bits as separate calls */
    void (*matmul_group)(const backend *be, int n_mats, const specla_tensor *const *w, const float *x, int n_batch,
                         float *const *y);
    /* out[i] = row ids[i] of w as floats (embedding lookup); ids in backend memory */
    void (*get_rows)(const backend *be, const specla_tensor *w, const int32_t *ids, int n, float *out);

    /* dst[n] = dequantized src (n a multiple of the type's block) */
    void (*dequantize)(const backend *be, int32_t type, const void *src, int64_t n, float *dst);
    /* the 8-bit activation blocks a matmul with weight_type feeds its integer dot products:
     * codes[n_rows][n], scales[n_rows][n / block] (specla_op_quantize_activations) */
    void (*quantize_activations)(const backend *be, int32_t weight_type, const float *x, int n_rows, int n,
                                 int8_t *codes, float *scales);

    /* --- norms and element-wise ------------------------------------------------------------- */
    void (*rms_norm)(const backend *be, const float *x, const float *weight, int n_rows, int n, float eps, float *y);
    /* residual add fused with the norm that follows it: x += delta, then y = rms_norm(x) * weight;
     * the same bits as `add` then `rms_norm` on this backend (x and y do not overlap) */
    void (*add_rms_norm)(const backend *be, float *x, const float *delta, const float *weight, int n_rows, int n,
                         float eps, float *y);
    void (*l2_norm)(const backend *be, const float *x, int n_rows, int n, float eps, float *y);
    void (*add)(const backend *be, float *dst, const float *src, int64_t n);                /* dst += src */
    void (*add_bias_rows)(const backend *be, float *x, const float *bias, int rows, int n); /* x[r] += bias */
    void (*silu_mul)(const backend *be, float *a, const float *b, int64_t n);              /* a = silu(a) * b */
    void (*sigmoid_mul)(const backend *be, float *x, const float *gate, int64_t n);        /* x *= sigmoid(gate) */
    /* Gated DeltaNet gates in place: beta = sigmoid(beta); g = softplus(g + dt_bias[h]) * ssm_a[h] */
    void (*gdn_gates)(const backend *be, float *beta, float *g, const float *dt_bias, const float *ssm_a, int T,
                      int Hv);
    /* split conv rows [q (Hk*S) | k (Hk*S) | v (Hv*S)] and L2-normalise q and k per head */
    void (*gdn_split_qkv)(const backend *be, const float *conv_out, int T, int Hk, int Hv, int S, float eps, float *q,
                          float *k, float *v);
    /* A plain batch's Gated DeltaNet inputs: the results of gdn_gates(beta, g, dt_bias, ssm_a, T, Hv),
     * causal_conv(x, conv_weight, T, 2 Hk S + Hv S, K, conv_state, conv_out) and
     * gdn_split_qkv(conv_out, T, Hk, Hv, S, eps, q, k, v), bit for bit (a backend may run them as one
     * kernel: a decode step's three dependent launches are one) */
    void (*gdn_prepare)(const backend *be, float *beta, float *g, const float *dt_bias, const float *ssm_a,
                        const float *x, const float *conv_weight, int T, int Hk, int Hv, int S, int K, float eps,
                        float *conv_state, float *conv_out, float *q, float *k, float *v);
    /* gated RMSNorm of head outputs: x[r] = rms(x[r]) * weight * silu(gate[r]) over rows of n */
    void (*gated_rms_norm)(const backend *be, float *x, const float *weight, const float *gate, int n_rows, int n,
                           float eps);
    /* qwen35 attention: per head [D query | D gate] -> q[T][nh][D], gate[T][nh][D] */
    void (*split_q_gate)(const backend *be, const float *qg, int T, int nh, int D, float *q, float *gate);
    void (*rope_neox)(const backend *be, float *x, const int32_t *positions, int T, int n_heads, int head_dim,
                      int n_rot, float freq_base);
    /* A batch's attention inputs, the results of these ops in this order, bit for bit (a backend may
     * run them as one kernel: a layer's seven dependent launches between its projections and its
     * attention become one):
     *   split_q_gate(qg, T, nh, D, q, gate)       when qg is not NULL (qwen35: per head [D query |
     *                                             D gate]); else q holds the query projections;
     *   rms_norm(q, q_norm, T nh, D, eps, q), then rms_norm(k, k_norm, T nkv, D, eps, k)
     *                                             when q_norm is not NULL (k_norm then too);
     *   rope_neox(q, positions, T, nh, D, n_rot, freq_base), then the same on k with nkv heads;
     *   scatter_rows(k_cache, nkv D, rows, k, T, nkv D), then the same from v into v_cache. */
    void (*attention_prepare)(const backend *be, const float *qg, float *q, float *gate, float *k, const float *v,
                              const float *q_norm, const float *k_norm, float eps, const int32_t *positions,
                              int n_rot, float freq_base, const int32_t *rows, int T, int nh, int nkv, int D,
                              float *k_cache, float *v_cache);

    /* --- rows of caches and features --------------------------------------------------------- */
    /* dst + rows[t] * dst_stride receives src row t (width floats); rows in backend memory */
    void (*scatter_rows)(const backend *be, float *dst, int64_t dst_stride, const int32_t *rows, const float *src,
                         int T, int width);
    /* in-place compaction of a row buffer: row from[i] moves to row to[i], i ascending (safe when
     * from[i] >= to[i] and no later source is an earlier destination); from/to in backend memory */
    void (*move_rows)(const backend *be, float *buf, int64_t stride, int width, const int32_t *from, const int32_t *to,
                      int n);

    /* Many rows gathered in one call (the accepted path of a tree out of the factor banks): for
     * every block b < n_blocks, field f < n_fields and i < n, the fields[f].width floats at
     *     src + b * src_block + fields[f].src_offset + rows[i] * fields[f].width
     * are copied, bits unchanged, to
     *     dst + b * dst_block + fields[f].dst_offset + i * fields[f].width.
     * rows in backend memory (n entries, >= 0; a row may repeat), fields in host memory (n_fields
     * <= GATHER_MAX_FIELDS, widths > 0). The caller keeps every segment inside its buffer and every
     * destination segment disjoint from every other destination segment and from every source
     * segment: the copies have no order, so a backend may run them all at once. Floats outside the
     * destination segments are untouched. */
    void (*gather_rows)(const backend *be, float *dst, int64_t dst_block, const float *src, int64_t src_block,
                        int n_blocks, const row_field *fields, int n_fields, const int32_t *rows, int n);

    /* --- attention ------------------------------------------------------------------------------ */
    /* causal: query t sees cache rows first .. first + positions[t] (GQA h -> h / (nh / nkv)), scale
     * 1/sqrt(D), where first is *first_row (one int in backend memory, read when the op runs; NULL: 0),
     * a window's start that a recorded step can move; the rows are reduced by their place in the
     * window (0 .. positions[t]), so a window at `first` gives the bits of a cache that starts there.
     * n_kv (host) bounds positions[t] + 1 (a GPU sizes its grid for it) */
    void (*attention)(const backend *be, const float *q, const float *k_cache, const float *v_cache,
                      const int32_t *first_row, const int32_t *positions, int T, int n_kv, int nh, int nkv, int D,
                      float *out);
    /* tree: node t sees rows 0 .. n_prefix-1, then n_prefix + a for its ancestors a and itself;
     * n_prefix (one int) and parents (topological) in backend memory, read when the op runs; max_rows
     * (host) bounds n_prefix + T (a GPU sizes its grid for it: a recorded verify passes the cache's
     * capacity, so one recording serves every prefix length) */
    void (*attention_tree)(const backend *be, const float *q, const float *k_cache, const float *v_cache,
                           const int32_t *n_prefix, int max_rows, const int32_t *parents, int T, int nh, int nkv, int D,
                           float *out);

    /* --- recurrent layers (layouts in specla.h) ---------------------------------------------------- */
    void (*causal_conv)(const backend *be, const float *x, const float *weight, int T, int C, int K, float *conv_state,
                        float *y);
    void (*gated_delta_rule)(const backend *be, const float *q, const float *k, const float *v, const float *g,
                             const float *beta, int T, int Hk, int Hv, int S, float *state, float *out);

    /* --- SpecLA tree verify; schedule = packed HLD layout in backend memory ----------------------- */
    void (*gdn_tree_chains)(const backend *be, const int32_t *schedule, const float *q, const float *k, const float *v,
                            const float *g, const float *beta, int Hk, int Hv, int S, float *state,
                            const gdn_pending *pending, float *out, float *delta_out);
    void (*gdn_tree_root_to_leaf)(const backend *be, const int32_t *schedule, const float *q, const float *k,
                                  const float *v, const float *g, const float *beta, int Hk, int Hv, int S,
                                  const float *state, float *out, float *delta_out);
    void (*gdn_tree_checkpoints)(const backend *be, const int32_t *schedule, const float *q, const float *k,
                                 const float *v, const float *g, const float *beta, int Hk, int Hv, int S,
                                 const float *state, float *out, float *delta_out, float *checkpoints);
    void (*gdn_fold)(const backend *be, float *state, const float *k, const float *delta, const float *g, int P, int Hk,
                     int Hv, int S);
    void (*conv_tree)(const backend *be, const int32_t *schedule, const float *x, const float *weight, int C, int K,
                      const float *conv_state, float *y, float *window_out);
    /* the window advanced by P raw inputs x [P][C]; P (one int, >= 0, 0: nothing) in backend memory */
    void (*conv_fold)(const backend *be, float *conv_state, const float *x, const int32_t *P, int C, int K);
    /* What the three gdn_tree ops did for value head 0 since the last call (which resets them):
     * out[0] = node steps (recurrent token updates), out[1] = whole-state copies (boundary slots,
     * per-leaf reloads, checkpoints); -1 each where the backend does not count. Lets a test see a
     * verify that silently fell back to replay or checkpoints. */
    void (*tree_counters)(const backend *be, int64_t out[2]);

    /* --- logits ------------------------------------------------------------------------------------ */
    /* out[r] = argmax of row r (lowest index wins ties); out in backend memory. Rows are V floats
     * apart; n_valid (one int in backend memory, read when the op runs; NULL: V) is how many of a
     * row's first entries make the row, as for topk_log_softmax. */
    void (*argmax_rows)(const backend *be, const float *logits, int n_rows, int V, int32_t *out,
                        const int32_t *n_valid);
    /* per row the top k as log-softmax over the row, best first (ties to the lower id; NaN never
     * ranks; missing slots id -1, -inf); tokens/logprobs in backend memory. Rows are V floats apart;
     * n_valid (one int in backend memory, read when the op runs; NULL: V) is how many of a row's
     * first entries make the row, so a recorded step follows a row length set between replays. */
    void (*topk_log_softmax)(const backend *be, const float *logits, int n_rows, int V, int k, int32_t *tokens,
                             float *logprobs, const int32_t *n_valid);
} backend_ops;

/* One backend instance: the table plus the state of its own (CPU: thread count, kernel set,
 * workspace; GPU: device, stream, workspace). Created per context, destroyed with it. */
struct backend {
    const backend_ops *ops;
    void *state;
    int32_t kind;   /* specla_backend_kind */
    int32_t device; /* device index (GPU), 0 on the CPU */
    /* 1: causal batches are recorded steps too (keys STEP_BATCH + slot, forward.c), where the
     * backend records steps at all; 0 (a CPU, and a GPU until the switch is on) runs them eagerly */
    int records_batches;
};

/* attention_prepare as the ops it stands for, in their order, through be's own table: the CPU
 * backend's attention_prepare, and a GPU's for the shapes its one kernel does not take. */
static inline void attention_prepare_by_ops(const backend *be, const float *qg, float *q, float *gate, float *k,
                                            const float *v, const float *q_norm, const float *k_norm, float eps,
                                            const int32_t *positions, int n_rot, float freq_base,
                                            const int32_t *rows, int T, int nh, int nkv, int D, float *k_cache,
                                            float *v_cache) {
    const backend_ops *ops = be->ops;
    if (qg) ops->split_q_gate(be, qg, T, nh, D, q, gate);
    if (q_norm) {
        ops->rms_norm(be, q, q_norm, T * nh, D, eps, q);
        ops->rms_norm(be, k, k_norm, T * nkv, D, eps, k);
    }
    ops->rope_neox(be, q, positions, T, nh, D, n_rot, freq_base);
    ops->rope_neox(be, k, positions, T, nkv, D, n_rot, freq_base);
    ops->scatter_rows(be, k_cache, (int64_t)nkv * D, rows, k, T, nkv * D);
    ops->scatter_rows(be, v_cache, (int64_t)nkv * D, rows, v, T, nkv * D);
}

/* Each backend's one entry point: an instance ready for `limits` (its workspace reserved). */
specla_status cpu_backend_create(int n_threads, int cpu_kernels, const backend_limits *limits, backend **out);
#ifdef SPECLA_WITH_CUDA
specla_status cuda_backend_create(int device, const backend_limits *limits, backend **out);
#endif

#ifdef __cplusplus
}
#endif

#endif
