/* The CUDA (and HIP) backend's instance and the op entry points each .cu file of this folder
 * provides. The table itself is filled in cuda_backend.cu; every op has the signature of its
 * backend.h slot, runs asynchronously on the instance's stream and reads arguments that are device
 * memory (backend.h says which are host). One .cu file per op family:
 *   cuda_backend.cu   memory, stream, workspace, the table, device discovery
 *   matmul_*.cu       the quantized matmul family and activation quantization (cuda_matmul.h)
 *   elementwise.cu    norms, gates, splits, residual adds, row scatter / moves, get_rows, dequantize
 *   attention.cu      RoPE, causal and tree attention
 *   recurrent.cu      causal conv, gated delta rule, the SpecLA tree ops and folds
 *   logits.cu         argmax and top-k log-softmax over logit rows */
#ifndef SPECLA_CUDA_BACKEND_H
#define SPECLA_CUDA_BACKEND_H
#include "backend.h"
#include "cuda_matmul.h"
#include "vendor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cuda_backend {
    backend base;
    int device;
    int sm_count;
    int shared_per_sm; /* bytes of shared memory per SM (0 where unknown) */
    cudaStream_t stream;
    backend_limits limits;
    void *workspace; /* device scratch reserved at creation for the limits (matmul activation
                        blocks, attention partial sums, tree boundary states) */
    size_t workspace_bytes;
    /* opt-in arithmetic, read when the backend is created (cuda_backend.cu) */
    int attention_tensor_cores; /* SPECLA_CUDA_ATTENTION_TC: attention.cu's 3xTF32 scores and V sums */
    int gdn_deferred_steps;     /* SPECLA_CUDA_GDN_DEFER: recurrent.cu's gdn_step_deferred */
    /* SPECLA_CUDA_ATTENTION_DECODE_GENERAL: a decode step's attention kernel on the general segment
     * code alone (attention.cu; the same operations, half the code) */
    int attention_decode_general;
    /* SPECLA_CUDA_ATTENTION_BLOCKED (on by default): a batch's shared attention segments on
     * attention_blocked.cuh's register-blocked walk where the GPU holds it (the same bits) */
    int attention_blocked;
} cuda_backend;

static inline const cuda_backend *cuda_of(const backend *be) { return (const cuda_backend *)be; }
static inline cudaStream_t cuda_stream(const backend *be) { return cuda_of(be)->stream; }
/* whether p may be read and written as float4 (the vector paths of the row kernels) */
static inline bool cuda_aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Launch-error check after each kernel: records the first error of the instance's stream in the
 * sticky error that sync reports (ops themselves return nothing). */
void cuda_note_launch(const backend *be, const char *op);

/* Device workspace bytes each op family needs for an instance's limits (the families take turns
 * in the one workspace: no op keeps data there between calls). */
size_t cuda_attention_workspace_bytes(const backend_limits *limits);
size_t cuda_logits_workspace_bytes(const backend_limits *limits);
size_t cuda_recurrent_workspace_bytes(const backend_limits *limits);

/* elementwise.cu */
void cuda_get_rows(const backend *be, const specla_tensor *w, const int32_t *ids, int n, float *out);
void cuda_dequantize(const backend *be, int32_t type, const void *src, int64_t n, float *dst);
void cuda_rms_norm(const backend *be, const float *x, const float *weight, int n_rows, int n, float eps, float *y);
void cuda_add_rms_norm(const backend *be, float *x, const float *delta, const float *weight, int n_rows, int n,
                       float eps, float *y);
void cuda_l2_norm(const backend *be, const float *x, int n_rows, int n, float eps, float *y);
void cuda_add(const backend *be, float *dst, const float *src, int64_t n);
void cuda_add_bias_rows(const backend *be, float *x, const float *bias, int rows, int n);
void cuda_silu_mul(const backend *be, float *a, const float *b, int64_t n);
/* add_rms_norm and silu_mul on matmul outputs left as partial sums (cuda_matmul_group_unfinished):
 * the same bits as the ops on the finished outputs, which they also store (delta; b: the second
 * matmul output, rows of `width` floats; a takes silu(a) * b as in silu_mul).
 * The fused quantize: with q.codes non-NULL (cuda_matmul_prequantized_blocks of the output's floats)
 * these two and cuda_sigmoid_mul / cuda_gated_rms_norm below may also write the Q8_K blocks of their
 * output (y; a; x) into q, for the next matmul to read without its quantize kernel
 * (cuda_matmul_group_prequantized); each returns 1 when it did, 0 when its rows took a kernel that
 * does not (then q's contents are not the output's). */
int cuda_add_rms_norm_sums(const backend *be, float *x, float *delta, cuda_matmul_sums dsums, const float *weight,
                           int n_rows, int n, float eps, float *y, cuda_matmul_q8k q);
/* whether add_rms_norm can read delta as partial sums for these rows (asked before the matmul runs
 * unfinished; cuda_add_rms_norm_sums takes only such rows) */
int cuda_add_rms_norm_reads_sums(const float *x, const float *delta, const float *weight, const float *y, int n);
int cuda_silu_mul_sums(const backend *be, float *a, float *b, cuda_matmul_sums sa, cuda_matmul_sums sb, int64_t n,
                       int width, cuda_matmul_q8k q);
int cuda_sigmoid_mul(const backend *be, float *x, const float *gate, int64_t n, cuda_matmul_q8k q);
void cuda_gdn_gates(const backend *be, float *beta, float *g, const float *dt_bias, const float *ssm_a, int T, int Hv);
void cuda_gdn_split_qkv(const backend *be, const float *conv_out, int T, int Hk, int Hv, int S, float eps, float *q,
                        float *k, float *v);
void cuda_gdn_prepare(const backend *be, float *beta, float *g, const float *dt_bias, const float *ssm_a, const float *x,
                      const float *conv_weight, int T, int Hk, int Hv, int S, int K, float eps, float *conv_state,
                      float *conv_out, float *q, float *k, float *v);
int cuda_gated_rms_norm(const backend *be, float *x, const float *weight, const float *gate, int n_rows, int n,
                        float eps, cuda_matmul_q8k q);
void cuda_split_q_gate(const backend *be, const float *qg, int T, int nh, int D, float *q, float *gate);
void cuda_scatter_rows(const backend *be, float *dst, int64_t dst_stride, const int32_t *rows, const float *src, int T,
                       int width);
void cuda_move_rows(const backend *be, float *buf, int64_t stride, int width, const int32_t *from, const int32_t *to,
                    int n);
void cuda_gather_rows(const backend *be, float *dst, int64_t dst_block, const float *src, int64_t src_block,
                      int n_blocks, const row_field *fields, int n_fields, const int32_t *rows, int n);

/* attention.cu */
void cuda_rope_neox(const backend *be, float *x, const int32_t *positions, int T, int n_heads, int head_dim, int n_rot,
                    float freq_base);
/* backend.h's attention_prepare as one kernel; 0 (nothing launched) where the shape is not one it
 * takes (rows of more than 512 floats or not a multiple of 4, unaligned buffers): then the caller
 * runs the ops it stands for */
int cuda_attention_prepare(const backend *be, const float *qg, float *q, float *gate, float *k, const float *v,
                           const float *q_norm, const float *k_norm, float eps, const int32_t *positions, int n_rot,
                           float freq_base, const int32_t *rows, int T, int nh, int nkv, int D, float *k_cache,
                           float *v_cache);
void cuda_attention(const backend *be, const float *q, const float *k_cache, const float *v_cache,
                    const int32_t *first_row, const int32_t *positions, int T, int n_kv, int nh, int nkv, int D,
                    float *out);
void cuda_attention_tree(const backend *be, const float *q, const float *k_cache, const float *v_cache,
                         const int32_t *n_prefix, int max_rows, const int32_t *parents, int T, int nh, int nkv, int D,
                         float *out);

/* recurrent.cu */
void cuda_causal_conv(const backend *be, const float *x, const float *weight, int T, int C, int K, float *conv_state,
                      float *y);
void cuda_gated_delta_rule(const backend *be, const float *q, const float *k, const float *v, const float *g,
                           const float *beta, int T, int Hk, int Hv, int S, float *state, float *out);
void cuda_gdn_tree_chains(const backend *be, const int32_t *schedule, const float *q, const float *k, const float *v,
                          const float *g, const float *beta, int Hk, int Hv, int S, float *state,
                          const gdn_pending *pending, float *out, float *delta_out);
void cuda_gdn_tree_root_to_leaf(const backend *be, const int32_t *schedule, const float *q, const float *k,
                                const float *v, const float *g, const float *beta, int Hk, int Hv, int S,
                                const float *state, float *out, float *delta_out);
void cuda_gdn_tree_checkpoints(const backend *be, const int32_t *schedule, const float *q, const float *k,
                               const float *v, const float *g, const float *beta, int Hk, int Hv, int S,
                               const float *state, float *out, float *delta_out, float *checkpoints);
void cuda_gdn_fold(const backend *be, float *state, const float *k, const float *delta, const float *g, int P, int Hk,
                   int Hv, int S);
void cuda_conv_tree(const backend *be, const int32_t *schedule, const float *x, const float *weight, int C, int K,
                    const float *conv_state, float *y, float *window_out);
void cuda_conv_fold(const backend *be, float *conv_state, const float *x, const int32_t *P, int C, int K);

/* logits.cu */
void cuda_argmax_rows(const backend *be, const float *logits, int n_rows, int V, int32_t *out,
                      const int32_t *n_valid);
void cuda_topk_log_softmax(const backend *be, const float *logits, int n_rows, int V, int k, int32_t *tokens,
                           float *logprobs, const int32_t *n_valid);

#ifdef __cplusplus
}
#endif
#endif
