/*
 * specla.h — the one C ABI of libspecla.
 *
 * This is the only header the Python layer (ctypes, ABI mode) or an embedding desktop tool reads.
 * Rules of the house:
 *   - opaque handles (specla_model, specla_context), plain structs, int status codes;
 *   - on failure a call returns a non-zero specla_status and leaves a message in a thread-local
 *     string read by specla_last_error(); it never aborts the process;
 *   - shapes and layouts are documented at each declaration and validated at the boundary,
 *     so kernels behind it receive already-checked plain structs.
 *
 * Layout conventions (also in docs/conventions.md):
 *   - Shapes are written fastest dimension LAST in C array notation: x[T][C] means T rows of C floats.
 *   - A weight tensor is GGUF {n_in, n_out}: n_out rows, each row n_in elements stored as consecutive
 *     quant blocks of its own type. A matmul computes y[b][o] = sum_i W[o][i] * x[b][i].
 *   - Gated DeltaNet state of one layer: state[Hv][S][S] laid out [head][value j][key i], i.e. the
 *     transpose of the math's M[i][j]; row j of a head is contiguous over the key index so that
 *     (M^T k)_j is one contiguous dot product (the same layout llama.cpp uses).
 *   - Conv state of one layer: conv_state[K-1][C], row 0 the oldest raw (pre-conv) input.
 *   - KV cache of one attention layer: k[n_ctx][n_head_kv][head_dim], same for v, F32.
 */
#ifndef SPECLA_H
#define SPECLA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define SPECLA_API __declspec(dllexport)
#else
#define SPECLA_API __attribute__((visibility("default")))
#endif

/* ABI history: 8 added the backend / device fields of specla_context_params and specla_op_options
 * and specla_context_set_logit_rows / specla_draft_context_set_logit_rows (a reduced vocabulary
 * named by row ids, so a GPU never re-uploads head rows). 9 added the recurrent workload
 * (specla_recurrent_workload_*) and specla_context_sync, for benchmarks on a GPU, and
 * specla_model_load_gguf and specla_model_hparams (a model from a GGUF path, for hosts without a
 * GGUF reader). 10 added specla_op_gather_rows (the row gather of an accepted side path). */
#define SPECLA_ABI_VERSION 10

typedef enum specla_status {
    SPECLA_OK = 0,
    SPECLA_ERR_INVALID_ARGUMENT = 1, /* bad shape, type, pointer or value */
    SPECLA_ERR_OUT_OF_MEMORY = 2,
    SPECLA_ERR_UNSUPPORTED = 3,      /* valid request this build cannot do (type, backend) */
    SPECLA_ERR_STATE = 4,            /* context full, wrong positions, ... */
} specla_status;

/* Tensor element types: the GGML type ids, so GGUF values pass through unchanged. */
typedef enum specla_type {
    SPECLA_TYPE_F32 = 0,
    SPECLA_TYPE_F16 = 1,
    SPECLA_TYPE_Q4_0 = 2,
    SPECLA_TYPE_Q4_1 = 3,
    SPECLA_TYPE_Q5_0 = 6,
    SPECLA_TYPE_Q5_1 = 7,
    SPECLA_TYPE_Q8_0 = 8,
    SPECLA_TYPE_Q4_K = 12,
    SPECLA_TYPE_Q5_K = 13,
    SPECLA_TYPE_Q6_K = 14,
    SPECLA_TYPE_BF16 = 30,
} specla_type;

/* Which CPU kernels to use. AUTO picks the fastest the running CPU supports. SCALAR is the oracle. */
typedef enum specla_cpu_kernels {
    SPECLA_CPU_AUTO = 0,
    SPECLA_CPU_SCALAR = 1,
    SPECLA_CPU_AVX2 = 2,
    SPECLA_CPU_AVX512 = 3, /* AVX-512 F/BW/VL + VNNI for the 8-bit matmuls; the AVX2 kernels otherwise.
                              The same results as AVX2, bit for bit. */
} specla_cpu_kernels;

/* Where a context's state lives and its ops run. AUTO picks the first GPU when this build has a
 * working GPU backend and a device is present, else the CPU. */
typedef enum specla_backend_kind {
    SPECLA_BACKEND_AUTO = 0,
    SPECLA_BACKEND_CPU = 1,
    SPECLA_BACKEND_CUDA = 2, /* CUDA, or HIP in a HIP build */
} specla_backend_kind;

SPECLA_API int specla_abi_version(void);
/* Message of the last failed call on this thread ("" if none). Valid until the next call. */
SPECLA_API const char *specla_last_error(void);
/* Kernels AUTO resolves to on this CPU (SPECLA_CPU_SCALAR, SPECLA_CPU_AVX2 or SPECLA_CPU_AVX512). */
SPECLA_API int specla_cpu_best_kernels(void);
/* Number of CUDA devices visible to this build (0 when built without CUDA or when none is present). */
SPECLA_API int specla_cuda_device_count(void);

/* Elements per block and bytes per block of a type; 0 for unknown types. */
SPECLA_API int specla_type_block_elements(int32_t type);
SPECLA_API int specla_type_block_bytes(int32_t type);

/* ---------------------------------------------------------------------------------------------
 * Model: hyper-parameters and weights of one qwen35 trunk. Weight bytes are NOT copied on the CPU:
 * the caller (Python, holding the GGUF mmap) keeps them alive for the model's lifetime.
 * ------------------------------------------------------------------------------------------- */

/* A weight view. ne0 = elements per row (GGUF ne[0], n_in), ne1 = rows (GGUF ne[1], 1 for vectors). */
typedef struct specla_tensor {
    const void *data;
    int32_t type;   /* specla_type */
    int32_t ne0;
    int32_t ne1;
    int32_t _pad;
    int64_t nbytes; /* must equal ne1 * ne0 / block_elements * block_bytes */
} specla_tensor;

typedef struct specla_hparams {
    int32_t n_layer;         /* trunk depth = block_count - nextn_predict_layers */
    int32_t n_embd;          /* E */
    int32_t n_ff;            /* F */
    int32_t n_vocab;         /* V (rows of token_embd) */
    int32_t n_head;          /* nh, full-attention query heads */
    int32_t n_head_kv;       /* nkv */
    int32_t head_dim;        /* D (key_length == value_length) */
    int32_t rope_dims;       /* rotated dims (NEOX pairs (i, i + rope_dims/2)) */
    float rope_freq_base;
    float rms_eps;
    int32_t ssm_conv_kernel; /* K */
    int32_t ssm_state_size;  /* S */
    int32_t ssm_group_count; /* Hk, key heads of the linear layers */
    int32_t ssm_time_step_rank; /* Hv, value heads; value head h uses key head h % Hk */
    int32_t n_ctx_train;
    int32_t arch;            /* specla_arch: which block shapes the layers have */
    const uint8_t *layer_is_recurrent; /* [n_layer], 1 = Gated DeltaNet, 0 = full attention */
} specla_hparams;

/* Architectures. qwen35: hybrid GDN + gated attention with q/k norms and partial RoPE. qwen2:
 * attention-only, q/k/v biases, no q/k norms, no output gate, RoPE over the whole head (the ssm
 * fields of specla_hparams are ignored). qwen3: attention-only like qwen2, but per-head q/k
 * RMSNorm before RoPE instead of the biases. */
typedef enum specla_arch {
    SPECLA_ARCH_QWEN35 = 0,
    SPECLA_ARCH_QWEN2 = 1,
    SPECLA_ARCH_QWEN3 = 2,
} specla_arch;

/* Weights of one trunk layer. Tensors a layer type does not use are left zeroed (data = NULL).
 * Norm weights already hold (1 + w) as the converter writes them; ssm_a holds -exp(A_log). */
typedef struct specla_layer_weights {
    specla_tensor attn_norm;           /* {E} */
    specla_tensor post_attention_norm; /* {E}, the pre-FFN norm */
    /* Gated DeltaNet */
    specla_tensor attn_qkv;            /* {E, C}, C = 2*Hk*S + Hv*S */
    specla_tensor attn_gate;           /* {E, Hv*S} (z) */
    specla_tensor ssm_conv1d;          /* {K, C}, F32 */
    specla_tensor ssm_dt_bias;         /* {Hv} */
    specla_tensor ssm_a;               /* {Hv} */
    specla_tensor ssm_beta;            /* {E, Hv} */
    specla_tensor ssm_alpha;           /* {E, Hv} */
    specla_tensor ssm_norm;            /* {S} */
    specla_tensor ssm_out;             /* {Hv*S, E} */
    /* full attention */
    specla_tensor attn_q;              /* qwen35 {E, 2*nh*D}, per head [D query rows | D gate rows];
                                          qwen2 {E, nh*D} */
    specla_tensor attn_k;              /* {E, nkv*D} */
    specla_tensor attn_v;              /* {E, nkv*D} */
    specla_tensor attn_output;         /* {nh*D, E} */
    specla_tensor attn_q_norm;         /* {D} (qwen35 only) */
    specla_tensor attn_k_norm;         /* {D} (qwen35 only) */
    /* SwiGLU */
    specla_tensor ffn_gate;            /* {E, F} */
    specla_tensor ffn_up;              /* {E, F} */
    specla_tensor ffn_down;            /* {F, E} */
    /* qwen2 attention biases (data = NULL for qwen35 and qwen3) */
    specla_tensor attn_q_bias;         /* {nh*D} */
    specla_tensor attn_k_bias;         /* {nkv*D} */
    specla_tensor attn_v_bias;         /* {nkv*D} */
} specla_layer_weights;

typedef struct specla_weights {
    specla_tensor token_embd;          /* {E, V} */
    specla_tensor output_norm;         /* {E} */
    specla_tensor output;              /* {E, V}; data = NULL means tied to token_embd */
    const specla_layer_weights *layers; /* [n_layer] */
} specla_weights;

typedef struct specla_model specla_model;

/* Validates every shape and type against hparams; the structs are copied, weight bytes are not. */
SPECLA_API specla_status specla_model_create(const specla_hparams *hparams, const specla_weights *weights,
                                             specla_model **out_model);
/* A qwen35, qwen2 or qwen3 GGUF (v2/v3, little-endian) by path, for hosts without a GGUF reader of
 * their own: the file is memory-mapped read-only and checked as the Python loader checks it (the
 * same keys, defaults and tensor shapes, no unknown trunk tensor; MTP blocks are ignored), then
 * goes through specla_model_create. The model owns the mapping and unmaps it in specla_model_free.
 * A bad file fails with a message that starts with the path and names the key or tensor. */
SPECLA_API specla_status specla_model_load_gguf(const char *path, specla_model **out_model);
/* The model's hyper-parameters (n_vocab sizes a logits buffer); out->layer_is_recurrent points into
 * the model and is valid until specla_model_free. */
SPECLA_API specla_status specla_model_hparams(const specla_model *model, specla_hparams *out);
SPECLA_API void specla_model_free(specla_model *model);

/* ---------------------------------------------------------------------------------------------
 * Context: all mutable state of one sequence (KV cache, conv windows, GDN states, scratch).
 * ------------------------------------------------------------------------------------------- */

typedef struct specla_context_params {
    int32_t n_ctx;       /* KV cache rows (max positions) */
    int32_t max_batch;   /* most tokens one forward call may carry */
    int32_t n_threads;   /* CPU threads; <= 0 means all cores */
    int32_t cpu_kernels; /* specla_cpu_kernels */
    /* Speculative decoding (all zero: plain decoding only) */
    int32_t max_tree_nodes;   /* largest tree (root included) specla_verify_tree takes */
    int32_t verify_method;    /* specla_verify_method; SpecLA = SPECLA_VERIFY_HLD_CHAINS */
    int32_t commit_method;    /* specla_commit_method; SpecLA = SPECLA_COMMIT_DEFERRED_FACTORS */
    int32_t n_capture_layers; /* trunk layers whose output rows a draft model reads (DFlash) */
    const int32_t *capture_layers; /* [n_capture_layers] 0-based trunk layer indices; the feature of
                                      a position is the residual stream after each listed layer */
    int32_t backend;          /* specla_backend_kind */
    int32_t device;           /* GPU index for SPECLA_BACKEND_CUDA (ignored on the CPU) */
    int32_t no_recorded_steps; /* 1: run every op of a step eagerly. 0 (default): a GPU records a
                                  decode step once (a CUDA graph) and replays it, same results */
    int32_t _pad;
} specla_context_params;

typedef struct specla_context specla_context;

SPECLA_API specla_status specla_context_create(const specla_model *model, const specla_context_params *params,
                                               specla_context **out_context);
SPECLA_API void specla_context_free(specla_context *context);

/* Kernel launches and host waits (downloads, stream syncs) of a context's backend since the last
 * call (which resets them); -1 each on a backend that does not count (the CPU). For benchmarks:
 * launches per token, host synchronisations per step. */
SPECLA_API specla_status specla_context_launch_counters(specla_context *context, int64_t *launches,
                                                        int64_t *host_waits);
/* specla_context_launch_counters with the kernels run on the device as well (and the same reset):
 * a step launched op by op runs as many kernels as it launches; a recorded step is one launch that
 * runs every kernel of its recording. -1 each on the CPU. */
SPECLA_API specla_status specla_context_step_counters(specla_context *context, int64_t *launches,
                                                      int64_t *host_waits, int64_t *kernels);

/* Wait until the context's backend has finished every op queued so far (a GPU runs them on a
 * stream; the CPU has nothing to wait for). For benchmarks that time a call whose results are not
 * read back (specla_accept_path); generation never needs it. */
SPECLA_API specla_status specla_context_sync(specla_context *context);

/* The backend a context resolved to (SPECLA_BACKEND_CPU or SPECLA_BACKEND_CUDA). */
SPECLA_API int32_t specla_context_backend(const specla_context *context);
/* Forget every token: n_past = 0, KV rows dropped, conv and GDN states zeroed. */
SPECLA_API specla_status specla_context_reset(specla_context *context);
/* Tokens committed to the durable state so far. */
SPECLA_API int32_t specla_context_n_past(const specla_context *context);
/* Forget the tokens at positions >= n_past (0 <= n_past <= the current n_past): afterwards the
 * context equals one that evaluated only the first n_past tokens, bit for bit, and the next batch
 * starts at position n_past. Exact rollback of attention layers is dropping KV (and captured
 * feature) rows. A recurrent layer's state folds every earlier token together, so a model with
 * Gated DeltaNet layers can only go back to the position of its last specla_context_save_state
 * (restoring the state saved there) or stay where it is; anything else is refused
 * (SPECLA_ERR_UNSUPPORTED; specla_context_reset still works). A verified tree awaiting
 * specla_accept_path is discarded: its rows sat beyond the old n_past. */
SPECLA_API specla_status specla_context_truncate(specla_context *context, int32_t n_past);
/* Remember this context's recurrent state (conv windows and GDN states) at the current n_past,
 * in one slot (a later call replaces it), so specla_context_truncate can come back here: what an
 * autoregressive draft with recurrent layers needs to drop the guesses the target rejected. A
 * pending accepted path is folded in first. Costs one copy of the recurrent state; for an
 * attention-only model it only records the position. */
SPECLA_API specla_status specla_context_save_state(specla_context *context);

/* Score logits over chosen rows instead of the whole LM head, in this context only: head is
 * {n_embd, n} with 1 <= n <= n_vocab, usually rows of the model's own LM head that the caller
 * picked and maps back to token ids (a draft's reduced vocabulary: a small model's LM head is a
 * third of its bytes, and a draft's guesses never decide the output, the target verifies them).
 * Later logits and argmax have n entries per row, in head order (argmax: the lowest row wins
 * ties). The caller keeps head's bytes alive while the context uses them; head = NULL goes back to
 * the model's LM head. */
SPECLA_API specla_status specla_context_set_logit_head(specla_context *context, const specla_tensor *head);
/* The same, with the rows named by id: logits are scored over rows ids[0..n) of the model's own LM
 * head (0 <= id < n_vocab, in the order given), gathered inside the context's backend memory once
 * per call; n = 0 (ids may be NULL) goes back to the whole head. The ids are copied. */
SPECLA_API specla_status specla_context_set_logit_rows(specla_context *context, const int32_t *ids, int32_t n);

/* One forward pass over a batch of tokens: the only call a generation step makes.
 * positions[i] must be n_past + i for now (a plain sequence continuation); tree batches, whose
 * positions repeat, arrive with the SpecLA verify call. The batch is appended to the durable state.
 * logits: if not NULL, receives [n_logit_rows][n_logits] where n_logit_rows = n_tokens when
 * logits_all != 0, else 1 (the last token only); n_logits = n_vocab unless the context scores a
 * chosen head (specla_context_set_logit_head).
 * argmax: if not NULL, receives [n_logit_rows] argmax ids (lowest index wins ties). */
typedef struct specla_batch {
    const int32_t *tokens;    /* [n_tokens] */
    const int32_t *positions; /* [n_tokens] */
    int32_t n_tokens;
    int32_t logits_all;
    float *logits;
    int32_t *argmax;
} specla_batch;

SPECLA_API specla_status specla_forward(specla_context *context, const specla_batch *batch);

/* Tree verify: one forward over a tree of candidate tokens [root, nodes...]; node i sits at
 * position n_past + depth(i). Attention rows see the committed prefix, their ancestors and
 * themselves; recurrent layers go through the SpecLA ops (the previous step's pending path is
 * folded in first). Nothing durable changes except that fold: specla_accept_path commits.
 * Each node's logits equal those of decoding its root path token by token, bit for bit. */
typedef struct specla_tree_batch {
    const int32_t *tokens;  /* [n_nodes], node 0 = the root (the last committed token) */
    const int32_t *parents; /* [n_nodes], topological: parents[0] = -1, parents[i] < i */
    int32_t n_nodes;
    int32_t _pad;
    float *logits;          /* optional [n_nodes][n_vocab] */
    int32_t *argmax;        /* optional [n_nodes] */
} specla_tree_batch;
SPECLA_API specla_status specla_verify_tree(specla_context *context, const specla_tree_batch *tree);
/* Commit the accepted path of the last verified tree (node ids from the root, path[0] = 0):
 * n_past += n, KV rows and captured features moved to their positions, factor banks accept. */
SPECLA_API specla_status specla_accept_path(specla_context *context, const int32_t *path, int32_t n);
/* Fold the pending accepted path into the durable state (exactly once; a no-op when nothing is
 * pending). specla_forward calls it itself before a plain batch. */
SPECLA_API specla_status specla_context_finish_speculative_state(specla_context *context);
/* Accepted tokens not yet folded into the durable state. */
SPECLA_API int32_t specla_context_pending(const specla_context *context);
/* Copy captured feature rows of committed positions [first, first + n) into out
 * [n][n_capture_layers][n_embd]. */
SPECLA_API specla_status specla_context_read_features(const specla_context *context, int32_t first, int32_t n,
                                                      float *out);

/* ---------------------------------------------------------------------------------------------
 * Single ops, for tests against the numpy oracles and for tools. The forward pass calls the same
 * kernels internally. Every op takes the options struct so the kernel choice is explicit.
 * ------------------------------------------------------------------------------------------- */

typedef struct specla_op_options {
    int32_t n_threads;   /* <= 0: all cores */
    int32_t cpu_kernels; /* specla_cpu_kernels */
    int32_t backend;     /* specla_backend_kind (AUTO = the CPU for single ops); arguments stay host
                            pointers: a GPU backend uploads them, runs, and downloads the outputs */
    int32_t device;
} specla_op_options;

/* The 8-bit activation blocks a matmul with weight_type uses (Q8_0/Q4_0/Q5_0: blocks of 32;
 * Q4_K/Q6_K: blocks of 256): codes[n_rows][n] and scales[n_rows][n / block]. A code times its block's
 * scale is the activation value the integer dot products see. Other weight types are an error
 * (their matmuls keep float activations). */
SPECLA_API specla_status specla_op_quantize_activations(const specla_op_options *opt, int32_t weight_type,
                                                        const float *x, int32_t n_rows, int32_t n, int8_t *codes,
                                                        float *scales);
/* dst[n_elements] = dequantized src; n_elements a multiple of the type's block. */
SPECLA_API specla_status specla_op_dequantize(const specla_op_options *opt, int32_t type, const void *src,
                                              int64_t n_elements, float *dst);
/* y[n_batch][w.ne1] = x[n_batch][w.ne0] . W^T. Each row of y is computed in the same order whatever
 * n_batch is (batch-invariant), so a verify row equals the decode row bit for bit. For Q8_0, Q4_0,
 * Q5_0, Q4_K and Q6_K weights the activations are first rounded to 8-bit blocks (llama.cpp's Q8_0 /
 * Q8_K) and dotted in integers; see specla_op_quantize_activations. */
SPECLA_API specla_status specla_op_matmul(const specla_op_options *opt, const specla_tensor *w, const float *x,
                                          int32_t n_batch, float *y);
/* y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight (weight may be NULL: no scale). rows of n. */
SPECLA_API specla_status specla_op_rms_norm(const specla_op_options *opt, const float *x, const float *weight,
                                            int32_t n_rows, int32_t n, float eps, float *y);
/* y[r] = x[r] / sqrt(sum(x[r]^2) + eps). */
SPECLA_API specla_status specla_op_l2_norm(const specla_op_options *opt, const float *x, int32_t n_rows, int32_t n,
                                           float eps, float *y);
/* Causal depthwise conv + SiLU over T tokens. x[T][C] raw inputs, weight[C][K] (k = 0 oldest),
 * conv_state[K-1][C] in/out (updated to the last K-1 raw inputs), y[T][C]. */
SPECLA_API specla_status specla_op_causal_conv(const specla_op_options *opt, const float *x, const float *weight,
                                               int32_t T, int32_t C, int32_t K, float *conv_state, float *y);
/* Gated delta rule over T tokens for Hv value heads (value head h uses key head h % Hk).
 * q[T][Hk][S], k[T][Hk][S] (already L2-normalised), v[T][Hv][S], g[T][Hv] (log-decay <= 0),
 * beta[T][Hv]; state[Hv][S][S] in/out ([head][value j][key i]); out[T][Hv][S] = M^T q / sqrt(S). */
SPECLA_API specla_status specla_op_gated_delta_rule(const specla_op_options *opt, const float *q, const float *k,
                                                    const float *v, const float *g, const float *beta, int32_t T,
                                                    int32_t Hk, int32_t Hv, int32_t S, float *state, float *out);
/* In-place NEOX RoPE on the first n_rot dims of each head: pairs (i, i + n_rot/2), theta_i =
 * pos * base^(-2i/n_rot). x[T][n_heads][head_dim], positions[T]. */
SPECLA_API specla_status specla_op_rope_neox(const specla_op_options *opt, float *x, const int32_t *positions,
                                             int32_t T, int32_t n_heads, int32_t head_dim, int32_t n_rot,
                                             float freq_base);
/* Causal softmax attention with GQA (query head h uses kv head h / (nh / nkv)), scale 1/sqrt(D).
 * q[T][nh][D]; k_cache, v_cache [n_kv][nkv][D]; query t sees cache rows 0..positions[t].
 * out[T][nh][D]. */
SPECLA_API specla_status specla_op_attention(const specla_op_options *opt, const float *q, const float *k_cache,
                                             const float *v_cache, const int32_t *positions, int32_t T,
                                             int32_t n_kv, int32_t nh, int32_t nkv, int32_t D, float *out);
/* Row gather in one call (how an accepted path that is not the tree's first rows leaves the factor
 * banks): for every block b < n_blocks, field f < n_fields (at most 8) and i < n, the widths[f]
 * floats at src[b * src_block + src_offsets[f] + rows[i] * widths[f]] are copied, bits unchanged, to
 * dst[b * dst_block + dst_offsets[f] + i * widths[f]]. dst[dst_floats] keeps every other float.
 * Every segment lies inside its array, destination segments do not overlap one another, dst and src
 * do not overlap; rows[n] >= 0 (may repeat). */
SPECLA_API specla_status specla_op_gather_rows(const specla_op_options *opt, float *dst, int64_t dst_floats,
                                               int64_t dst_block, const float *src, int64_t src_floats,
                                               int64_t src_block, int32_t n_blocks, const int64_t *dst_offsets,
                                               const int64_t *src_offsets, const int32_t *widths, int32_t n_fields,
                                               const int32_t *rows, int32_t n);

/* ---------------------------------------------------------------------------------------------
 * SpecLA: verifying a tree of candidate tokens through the recurrent layers without snapshots.
 * Terms as in docs/specla.md. A verify step is: for every recurrent layer, the tree conv and the
 * GDN tree verify (which first fold the previous step's pending accepted path into the durable
 * state, once), then specla_factor_banks_accept() with the accepted path. At the end of decoding
 * (or before plain decoding resumes) specla_finish_speculative_state() folds what is pending.
 * ------------------------------------------------------------------------------------------- */

/* The DDTree of one draft block (docs/ddtree-dflash.md §2): from the block's per-depth top-K,
 * top_tokens / top_logprobs [n_depths][k] (row d - 1 for depth d, columns by descending log-prob,
 * log-probs finite and <= 0), the root and at most `budget` more nodes of the K-ary tree of rank
 * paths, chosen best-first by path score (the sum of the path's log-probs, in float64, parent's
 * score + own), ties to the lower depth, then the smaller rank path; a node scoring below
 * floor_score (-INFINITY: none) ends the tree. With chain_seed the rank-0 chain goes first, as far
 * as the budget, the depths and the floor allow. Writes the tree in insertion order (topological:
 * node 0 the root with parent -1, depth 0, score 0, rank -1) into the five arrays of `capacity`
 * (>= budget + 1) entries and its node count into *n_nodes. pyspecla's build_ddtree calls this;
 * pyspecla/reference/ddtree.py is the same enumeration in Python, the tests' oracle. */
SPECLA_API specla_status specla_ddtree_build(int32_t root_token, const int32_t *top_tokens,
                                             const double *top_logprobs, int32_t n_depths, int32_t k, int32_t budget,
                                             double floor_score, int32_t chain_seed, int32_t *tokens,
                                             int32_t *parents, int32_t *depths, double *scores, int32_t *ranks,
                                             int32_t capacity, int32_t *n_nodes);

/* The heavy-light (HLD) schedule of a tree, packed in one int32 array that kernels read as data.
 * Built by specla_hld_build from a parent array in topological order (parents[0] = -1,
 * 0 <= parents[t] < t). Every array is padded to `capacity` entries (-1 beyond the used ones), so
 * the layout of a schedule depends on the capacity only, never on the tree: a GPU graph captured
 * once can replay every step with the topology passed as data.
 *
 * header (SPECLA_HLD_HEADER_INTS int32):
 *   [0] SPECLA_HLD_MAGIC   [1] SPECLA_HLD_VERSION   [2] n_nodes   [3] n_chains   [4] n_waves
 *   [5] n_boundaries       [6] max_chains_per_wave  [7] max_depth (root = 0)      [8] capacity
 *   [9] total ints (= specla_hld_size(capacity))
 *   [10..19] offsets (in ints from the start) of the arrays below, in this order:
 *   parents[cap]              the input parent array
 *   order[cap]                nodes chain after chain (chains in schedule order), root to leaf
 *   chain_offsets[cap + 1]    chain c is order[chain_offsets[c] .. chain_offsets[c + 1])
 *   chain_parent_boundary[cap] boundary slot the chain starts from; -1 = the durable state (root chain)
 *   chain_wave[cap]           0 for the root chain, wave(parent's chain) + 1 otherwise
 *   node_boundary[cap]        slot that receives the state after this node, -1 = none
 *   node_depth[cap]           edges from the root
 *   chain_parent_node[cap]    tree parent of the chain's first node, -1 for the root chain
 *                             (node-level readiness: a chain may start once this node is done)
 *   node_chain[cap]           chain index of each node
 *   node_position[cap]        index of each node within `order`
 * Heavy child = the child with the largest subtree, ties to the lowest index. Chains start at the
 * root and at every node that is not its parent's heavy child, and follow heavy children to a leaf.
 * Chains are numbered by their first node, then stable-sorted by wave. Boundary slots are given to
 * the distinct parent nodes of non-root chains in increasing node order. */
#define SPECLA_HLD_MAGIC 0x534c4844 /* "DHLS" in memory: SpecLA HLD */
#define SPECLA_HLD_VERSION 1
#define SPECLA_HLD_HEADER_INTS 20
SPECLA_API int32_t specla_hld_size(int32_t capacity); /* ints of a schedule padded to capacity */
SPECLA_API specla_status specla_hld_build(const int32_t *parents, int32_t n_nodes, int32_t capacity,
                                          int32_t *schedule, int32_t schedule_ints);

/* How a step verifies the tree and how the accepted path reaches the durable state. SpecLA is
 * HLD_CHAINS + DEFERRED_FACTORS; the others are the baselines it is measured against. */
typedef enum specla_verify_method {
    SPECLA_VERIFY_HLD_CHAINS = 0,        /* state-resident chains, states only at boundary slots */
    SPECLA_VERIFY_ROOT_TO_LEAF = 1,      /* replay every root-to-leaf path from the durable state */
    SPECLA_VERIFY_DENSE_CHECKPOINTS = 2, /* the full state after every node, kept for restore */
} specla_verify_method;

typedef enum specla_commit_method {
    SPECLA_COMMIT_DEFERRED_FACTORS = 0,   /* fold the path's factors inside the next verify */
    SPECLA_COMMIT_FACTORS_NOW = 1,        /* fold the path's factors at accept time */
    SPECLA_COMMIT_REPLAY = 2,             /* keep a snapshot (the untouched durable state) and
                                             replay the accepted tokens sequentially at accept */
    SPECLA_COMMIT_CHECKPOINT_RESTORE = 3, /* copy the accepted leaf's checkpoint (needs
                                             SPECLA_VERIFY_DENSE_CHECKPOINTS) */
} specla_commit_method;

typedef struct specla_recurrent_shape {
    int32_t n_layers;  /* recurrent layers */
    int32_t Hk, Hv, S; /* key heads, value heads (value head h uses key head h % Hk), state size */
    int32_t C, K;      /* conv channels and kernel */
    int32_t max_nodes; /* largest tree (root included) a step may verify */
    int32_t verify_method;
    int32_t commit_method;
} specla_recurrent_shape;

/* Two FP32 factor banks per model: per node and recurrent layer k [Hk][S], delta [Hv][S], g [Hv]
 * and the raw conv input x [C] (plus, for the baselines, what they need: the node inputs v, beta
 * for replay, or dense per-node states for checkpoints). One bank receives the factors of the
 * verify running now, the other holds the pending accepted path of the previous step. */
typedef struct specla_factor_banks specla_factor_banks;
SPECLA_API specla_status specla_factor_banks_create(const specla_recurrent_shape *shape,
                                                    specla_factor_banks **out_banks);
SPECLA_API void specla_factor_banks_free(specla_factor_banks *banks);
/* Accepted tokens whose factors wait to be folded (0 when nothing is pending). */
SPECLA_API int32_t specla_factor_banks_pending(const specla_factor_banks *banks);
/* Copy n nodes of one recorded factor out of a bank, for tests and tools: bank 0 = the pending
 * path (path order), 1 = the bank verify writes (node order; read it before accept); field 0 = k [n][Hk][S], 1 = delta
 * [n][Hv][S], 2 = g [n][Hv], 3 = raw conv input x [n][C]. */
SPECLA_API specla_status specla_factor_banks_read(const specla_factor_banks *banks, int32_t bank, int32_t layer,
                                                  int32_t field, int32_t n, float *out);
/* What the last verify did in the recurrent layers, summed over them, for value head 0 (the other
 * heads do the same): SpecLA's state-resident chains step every node exactly once and copy the
 * state only into boundary slots; root-to-leaf replay steps shared prefixes again and reloads per
 * leaf; dense checkpoints copy a state per node. -1 where the backend does not count. */
typedef struct specla_tree_stats {
    int32_t n_nodes;      /* nodes of the last verified tree */
    int32_t n_layers;     /* recurrent layers verified */
    int64_t node_steps;   /* recurrent token updates, all layers */
    int64_t state_copies; /* whole-state copies, all layers */
} specla_tree_stats;
SPECLA_API specla_status specla_factor_banks_stats(const specla_factor_banks *banks, specla_tree_stats *out);
SPECLA_API specla_status specla_context_tree_stats(const specla_context *context, specla_tree_stats *out);

/* Bytes the banks hold, and bytes of state kept per verified node by the chosen methods. */
SPECLA_API int64_t specla_factor_banks_bytes(const specla_factor_banks *banks);

/* Per-layer durable state the commit paths may need to write (arrays of n_layers pointers). */
typedef struct specla_recurrent_states {
    float *const *gdn;  /* [n_layers] -> [Hv][S][S] */
    float *const *conv; /* [n_layers] -> [K-1][C] */
} specla_recurrent_states;

/* Tree-aware causal conv + SiLU of one layer. x[N][C] raw inputs of the nodes (node order),
 * weight[C][K], conv_state[K-1][C] durable window (the pending raw inputs are shifted in first,
 * once), y[N][C]. Each node's window comes from its tree parent's history. Records x per node. */
typedef struct specla_conv_tree_args {
    const int32_t *schedule;
    int32_t layer;
    const float *x;
    const float *weight;
    float *conv_state;
    float *y;
} specla_conv_tree_args;
SPECLA_API specla_status specla_op_conv_tree(const specla_op_options *opt, specla_factor_banks *banks,
                                             const specla_conv_tree_args *args);

/* Gated-delta-rule tree verify of one layer (all value heads). q,k [N][Hk][S] (L2-normalised),
 * v [N][Hv][S], g, beta [N][Hv]; state [Hv][S][S] durable ([head][value][key]); out [N][Hv][S].
 * With DEFERRED_FACTORS and something pending, the pending path is folded into `state` first
 * (written once); otherwise `state` is only read. Factors of every node go to the write bank. */
typedef struct specla_gdn_tree_args {
    const int32_t *schedule;
    int32_t layer;
    const float *q, *k, *v, *g, *beta;
    float *state;
    float *out;
} specla_gdn_tree_args;
SPECLA_API specla_status specla_op_gdn_tree_verify(const specla_op_options *opt, specla_factor_banks *banks,
                                                   const specla_gdn_tree_args *args);

/* The accepted path: node indices from the root (path[0] = 0), each the child of the previous.
 * Path = 0..n-1 swaps the banks' roles (no copy); any other path gathers its factors into path
 * order. FACTORS_NOW, REPLAY and CHECKPOINT_RESTORE write the durable states here (states may be
 * NULL for DEFERRED_FACTORS). */
SPECLA_API specla_status specla_factor_banks_accept(const specla_op_options *opt, specla_factor_banks *banks,
                                                    const int32_t *schedule, const int32_t *path, int32_t n,
                                                    const specla_recurrent_states *states);
/* Fold whatever is pending into the durable states exactly once; a no-op when nothing is. */
SPECLA_API specla_status specla_finish_speculative_state(const specla_op_options *opt, specla_factor_banks *banks,
                                                         const specla_recurrent_states *states);

/* ---------------------------------------------------------------------------------------------
 * Recurrent workload: the recurrent layers' tree work resident in one backend's memory, for
 * benchmarks (tools/bench_specla.py). The single tree ops above take host arrays, which a GPU
 * backend would have to copy in and out on every call, so timing them would time the copies. A
 * workload uploads the inputs of every recurrent layer once (at create) and keeps its durable
 * states, outputs and factor banks in the backend's memory; each call queues one step's work over
 * all layers, exactly as a context runs it (the same factor-bank code and backend ops, so the same
 * bits). Calls may return before a GPU has finished: specla_recurrent_workload_sync waits, so a
 * caller times [sync, calls, sync] with the host clock.
 * ------------------------------------------------------------------------------------------- */
typedef struct specla_recurrent_inputs {
    /* host arrays; per layer and node, [n_layers][max_nodes][...] (a tree of n nodes reads the
     * first n rows of each layer) */
    const float *q, *k;          /* [Hk][S], L2-normalised */
    const float *v;              /* [Hv][S] */
    const float *g, *beta;       /* [Hv]: log-decay <= 0, beta in (0, 1) */
    const float *x;              /* [C]: raw conv inputs */
    const float *conv_weight;    /* [n_layers][C][K] */
    const float *gdn_state;      /* [n_layers][Hv][S][S]: the durable states at the start */
    const float *conv_state;     /* [n_layers][K-1][C] */
} specla_recurrent_inputs;

typedef enum specla_workload_read {
    SPECLA_WORKLOAD_GDN_OUT = 0,    /* the last verify's GDN outputs of a layer, [n][Hv][S] */
    SPECLA_WORKLOAD_CONV_OUT = 1,   /* its conv outputs, [n][C] */
    SPECLA_WORKLOAD_GDN_STATE = 2,  /* a layer's durable GDN state [Hv][S][S] */
    SPECLA_WORKLOAD_CONV_STATE = 3, /* a layer's durable conv window [K-1][C] */
} specla_workload_read;

typedef struct specla_recurrent_workload specla_recurrent_workload;
/* The backend of `opt` (NULL: the CPU), the methods of `shape`, the inputs uploaded. */
SPECLA_API specla_status specla_recurrent_workload_create(const specla_op_options *opt,
                                                          const specla_recurrent_shape *shape,
                                                          const specla_recurrent_inputs *inputs,
                                                          specla_recurrent_workload **out_workload);
SPECLA_API void specla_recurrent_workload_free(specla_recurrent_workload *workload);
/* The tree the next verifies take (parents in topological order, 1 <= n <= max_nodes): its HLD
 * schedule is built and uploaded here, outside what a caller times. Refused while a verify awaits
 * accept or finish. */
SPECLA_API specla_status specla_recurrent_workload_set_tree(specla_recurrent_workload *workload,
                                                            const int32_t *parents, int32_t n);
/* For every recurrent layer: the tree conv, then the GDN tree verify (specla_op_conv_tree,
 * specla_op_gdn_tree_verify) of the tree's nodes, folding a pending path first where the commit
 * method defers it. */
SPECLA_API specla_status specla_recurrent_workload_verify(specla_recurrent_workload *workload);
/* specla_factor_banks_accept of the last verify (the durable states are the workload's). */
SPECLA_API specla_status specla_recurrent_workload_accept(specla_recurrent_workload *workload, const int32_t *path,
                                                          int32_t n);
/* specla_finish_speculative_state: fold what is pending; drop an unaccepted verify. */
SPECLA_API specla_status specla_recurrent_workload_finish(specla_recurrent_workload *workload);
/* Wait until the backend has run everything queued. */
SPECLA_API specla_status specla_recurrent_workload_sync(specla_recurrent_workload *workload);
/* Copy one array out to the host (specla_workload_read; n = the current tree's nodes). */
SPECLA_API specla_status specla_recurrent_workload_read(const specla_recurrent_workload *workload, int32_t what,
                                                        int32_t layer, float *out);

/* ---------------------------------------------------------------------------------------------
 * DFlash block-diffusion draft (arch qwen35-dflash-draft). No embedding or LM head of its own:
 * it embeds with the target's token_embd and projects its rows with the target's LM head. It
 * reads the target context's captured feature rows (see specla_context_params.capture_layers).
 * The draft only proposes: its numerics never affect what the target accepts.
 * ------------------------------------------------------------------------------------------- */
typedef struct specla_draft_hparams {
    int32_t n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim;
    float rms_eps, rope_freq_base;
    int32_t block_size;         /* 16: [last committed token, MASK x 15] */
    int32_t mask_token_id;
    int32_t n_target_layers;    /* feature row = n_target_layers x target n_embd */
    int32_t sliding_window;     /* rows of context a sliding-window layer sees (0 = none) */
    const uint8_t *layer_is_swa;/* [n_layer] or NULL: 1 = sliding-window layer (causal in the block) */
    int32_t context_kv_layer_norm; /* 1: rms-norm each target layer's slice with aux_hidden_norm[i] */
    int32_t _pad;
} specla_draft_hparams;

typedef struct specla_draft_layer_weights {
    specla_tensor attn_norm, ffn_norm;
    specla_tensor attn_q;      /* {E, nh*D} */
    specla_tensor attn_k;      /* {E, nkv*D} */
    specla_tensor attn_v;      /* {E, nkv*D} */
    specla_tensor attn_output; /* {nh*D, E} */
    specla_tensor attn_q_norm, attn_k_norm; /* {D} */
    specla_tensor ffn_gate, ffn_up, ffn_down;
} specla_draft_layer_weights;

typedef struct specla_draft_weights {
    specla_tensor fc;          /* {n_target_layers*E_target, E} */
    specla_tensor hidden_norm; /* {E} */
    specla_tensor output_norm; /* {E} */
    const specla_tensor *aux_hidden_norm;      /* [n_target_layers] {E_target} or NULL */
    const specla_draft_layer_weights *layers;  /* [n_layer] */
} specla_draft_weights;

typedef struct specla_draft_model specla_draft_model;
typedef struct specla_draft_context specla_draft_context;

/* The target model supplies the embedding and LM head; n_embd must match it. */
SPECLA_API specla_status specla_draft_model_create(const specla_draft_hparams *hparams,
                                                   const specla_draft_weights *weights, const specla_model *target,
                                                   specla_draft_model **out_model);
SPECLA_API void specla_draft_model_free(specla_draft_model *model);
/* params: n_ctx (most target positions the draft follows), max_batch (feature rows ingested per pass),
 * n_threads, cpu_kernels, backend, device and no_recorded_steps as for a target context (0: a GPU
 * records a proposal after its ingestion once per depths, top-k and LM head, and replays it; same
 * results); the other fields are ignored. */
SPECLA_API specla_status specla_draft_context_create(const specla_draft_model *model,
                                                     const specla_context_params *params,
                                                     specla_draft_context **out_context);
SPECLA_API void specla_draft_context_free(specla_draft_context *context);
SPECLA_API specla_status specla_draft_context_reset(specla_draft_context *context);
/* The backend a draft context resolved to (SPECLA_BACKEND_CPU or SPECLA_BACKEND_CUDA). */
SPECLA_API int32_t specla_draft_context_backend(const specla_draft_context *context);
/* Kernel launches and host waits (downloads, stream syncs) of a draft context's backend since the
 * last call, which resets them; -1 each on the CPU, as specla_context_launch_counters. On a GPU a
 * propose call waits once (its top-k read-back). */
SPECLA_API specla_status specla_draft_context_launch_counters(specla_draft_context *context, int64_t *launches,
                                                              int64_t *host_waits);

/* Score the draft's block rows over chosen rows of the target's LM head instead of all of it, in
 * this draft context only (as specla_context_set_logit_head does for a context: the DFlash draft
 * reads the target's head, the largest matrix it multiplies, and its guesses are verified anyway).
 * head is {n_embd of the target, n}, 1 <= n <= n_vocab, usually rows of the target's head; the
 * caller keeps its bytes alive and maps the returned indices back to token ids. NULL: the
 * target's whole head again. */
SPECLA_API specla_status specla_draft_context_set_logit_head(specla_draft_context *context, const specla_tensor *head);
/* Rows of the target's LM head by id, as specla_context_set_logit_rows. */
SPECLA_API specla_status specla_draft_context_set_logit_rows(specla_draft_context *context, const int32_t *ids,
                                                             int32_t n);

/* One draft block after the target context's committed tokens: takes in the feature rows the
 * target committed since the last call, runs [root_token, MASK x (block_size-1)] and returns, for
 * depths 1..n_depths (block rows 1..n_depths), the top_k tokens and their log-probabilities
 * (log-softmax over the full vocabulary), best first: tokens/logprobs [n_depths][top_k]. With a
 * chosen head (specla_draft_context_set_logit_head) the tokens are indices into its rows, the
 * log-softmax runs over those rows, and top_k may not exceed their number. */
SPECLA_API specla_status specla_draft_propose(specla_draft_context *draft, const specla_context *target,
                                              int32_t root_token, int32_t n_depths, int32_t top_k, int32_t *tokens,
                                              float *logprobs);

#ifdef __cplusplus
}
#endif
#endif /* SPECLA_H */
