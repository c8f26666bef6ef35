/* CUDA/HIP quantized matmul: y[n_batch][ne1] = x[n_batch][ne0] . W^T for one weight or for several
 * weights sharing one input. matmul.cu documents the arithmetic (the float summation order that
 * makes every row of y the same bits whatever n_batch is); docs/cuda-matmul.md the design.
 *
 * Weights live on the device in a PREPARED layout (cuda_matmul_prepare_weight): the GGUF blocks of
 * 32 consecutive rows are interleaved so that one warp (a lane per row) reads them with coalesced
 * 16-byte loads, and the fields that break 16-byte alignment (the fp16 scale of Q8_0/Q4_0/Q5_0/Q6_K,
 * the high bits of Q5_0) sit in separate planes. Repacking only moves bytes: block k of row o holds
 * exactly the GGUF block's bytes, so the CPU oracle's dequantization defines the weight values.
 *
 * Supported weight types: F32, F16, BF16 (ne0 a multiple of 32), Q8_0, Q4_0, Q5_0 (8-bit activation
 * blocks of 32, as the CPU), Q4_K, Q6_K (8-bit activation blocks of 256, as the CPU), Q5_K (blocks
 * of 256 too, where the CPU multiplies floats: docs/cuda-matmul.md). Q4_1 and Q5_1 return
 * cudaErrorNotSupported for now. */
#ifndef SPECLA_CUDA_MATMUL_H
#define SPECLA_CUDA_MATMUL_H
#include <stddef.h>
#include <stdint.h>

#include "specla.h"
#include "vendor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cuda_matmul_workspace {
    void *data;
    size_t bytes;
} cuda_matmul_workspace;

/* Bytes of device workspace one cuda_matmul or cuda_matmul_group call needs for n_batch rows of n
 * inputs (activation blocks, split-K partial sums, arrival counters). The workspace needs no
 * initialisation and holds nothing between calls. */
size_t cuda_matmul_workspace_bytes(int n_batch, int n);

/* Bytes of the prepared (device) copy of a weight of `type` with ne1 rows of ne0 elements: the GGUF
 * bytes with the row count rounded up to a multiple of 32 (the padding rows are zero); 0 when the
 * type or shape is not supported. */
size_t cuda_matmul_prepared_bytes(int32_t type, int32_t ne0, int32_t ne1);

/* Repack host_w (GGUF blocks in host memory) into the prepared layout in host memory dst
 * (cuda_matmul_prepared_bytes of them). Returns 0, or -1 for an unsupported type or shape. */
int cuda_matmul_repack_host(const specla_tensor *host_w, void *dst);

/* Repack host_w and copy it to device_dst (cuda_matmul_prepared_bytes of device memory); synchronous.
 * The specla_tensor the matmul then takes has data = device_dst and the GGUF type, ne0, ne1. */
cudaError_t cuda_matmul_prepare_weight(const specla_tensor *host_w, void *device_dst);

/* Rows ids[0..n) (device memory) of the prepared weight w become rows first .. first+n-1 of the
 * prepared weight at dst (same type and ne0, room for first+n rows: cuda_matmul_prepared_bytes of
 * that row count), bytes unchanged, on `stream`. The prepared slots of a row group do not depend on
 * ne1, so the gathered rows multiply as they did in w (their chunking follows dst's row count, as
 * for any weight of that shape). With the launch overlap on, the next kernel on the stream must not
 * be a matmul reading dst (the LM head is always read after a norm kernel). */
cudaError_t cuda_matmul_gather_rows(cudaStream_t stream, const specla_tensor *w, const int32_t *ids, int n, void *dst,
                                    int first);

/* y[n_batch][w->ne1] = x[n_batch][w->ne0] . W^T on `stream`; w->data (prepared), x (16-byte aligned),
 * y and ws in device memory; one call at a time per workspace (the calls on one stream are). Returns cudaSuccess or the launch error (cudaErrorNotSupported for an unsupported type,
 * cudaErrorInvalidValue for a bad shape or a too small workspace). Each row of y is the same bits
 * whatever n_batch is. */
cudaError_t cuda_matmul(cudaStream_t stream, const specla_tensor *w, const float *x, int n_batch, float *y,
                        cuda_matmul_workspace ws);

/* Several matrices sharing one input x (all with the same ne0): the activations are quantized once
 * and matrices of one type share a launch (up to CUDA_MATMUL_GROUP_LAUNCH of them), so small ones
 * ride along with a large one. Same bits per row as separate cuda_matmul calls. */
cudaError_t cuda_matmul_group(cudaStream_t stream, int n_mats, const specla_tensor *const *w, const float *x,
                              int n_batch, float *const *y, cuda_matmul_workspace ws);

/* A matmul output left as its split-K partial sums (cuda_matmul_group_unfinished): element (b, r) of
 * y is partials[(b * n_chunks + 0) * rows_padded + r] + ... + [(b * n_chunks + n_chunks - 1) *
 * rows_padded + r], added in chunk order from the first, which is the finish the kernels run
 * themselves otherwise (mm_finish_rows), so a reader that adds them this way gets y's bits.
 * partials NULL: the matrix is one chunk and its kernel wrote y itself. */
typedef struct cuda_matmul_sums {
    const float *partials;
    int n_chunks;
    int64_t rows_padded;
} cuda_matmul_sums;

/* cuda_matmul_group without the split-K finish: each matrix of more than one chunk leaves its
 * partial sums in the workspace (sums[i]) and y[i] unwritten, for the next kernel on the stream to
 * add (elementwise.cu's *_sums ops), which saves every split launch its arrival atomics, fences
 * and finish round trips. The sums live until the next call that uses the workspace. At most
 * CUDA_MATMUL_GROUP_LAUNCH matrices (cudaErrorInvalidValue beyond). */
cudaError_t cuda_matmul_group_unfinished(cudaStream_t stream, int n_mats, const specla_tensor *const *w,
                                         const float *x, int n_batch, float *const *y, cuda_matmul_workspace ws,
                                         cuda_matmul_sums *sums);

/* Activations prequantized by the op that produced x (the fused quantize): the Q8_K blocks of an
 * input of n_batch x n floats as the matmul's quantize kernel makes them (codes[n_batch][n], scales,
 * bsums and min operands per 256-block, block index b * (n / 256) + k: the input's floats read as
 * flat blocks of 256, whatever its shape), in a buffer the backend owns apart
 * from the workspace, so they live from the producing op to the matmul calls that read them. The
 * buffer also holds the split-K arrival counters of those calls: zero at rest (the buffer is zeroed
 * once and every finish re-arms its counter), so no kernel has to zero them first. */
typedef struct cuda_matmul_q8k {
    int8_t *codes;
    float *scales;
    int16_t *bsums;
    uint8_t *minops;
} cuda_matmul_q8k;
/* Bytes of a prequantized-activation buffer for inputs of up to max_elements floats (rounded down
 * to whole blocks; 0 below one block), and the blocks of an input of `elements` floats in it (codes
 * NULL when elements is not a multiple of 256 or the blocks do not fit the buffer of `bytes`). */
size_t cuda_matmul_prequantized_bytes(int64_t max_elements);
cuda_matmul_q8k cuda_matmul_prequantized_blocks(void *buffer, size_t bytes, int64_t elements);
/* cuda_matmul_group (sums NULL) or cuda_matmul_group_unfinished whose Q8_K activations (the
 * Q4_K/Q5_K/Q6_K weights' input) are already in `buffer` (cuda_matmul_prequantized_blocks of n_batch times
 * the weights' ne0, written by the kernel just before on the stream): no quantize kernel for them,
 * the buffer's counters for the split-K finishes. The same bits as the call without the buffer. */
cudaError_t cuda_matmul_group_prequantized(cudaStream_t stream, int n_mats, const specla_tensor *const *w,
                                           const float *x, int n_batch, float *const *y, cuda_matmul_workspace ws,
                                           cuda_matmul_sums *sums, void *buffer, size_t bytes);

/* The activation blocks a matmul with weight_type uses, as the matmul makes them (the same bytes as
 * specla_op_quantize_activations): codes[n_batch][n], scales[n_batch][n / block] and, for
 * Q4_K/Q5_K/Q6_K (blocks of 256), bsums[n_batch][n / 16] (sums of 16 consecutive codes; may be NULL otherwise).
 * Device pointers; cudaErrorNotSupported for a weight type that keeps float activations. */
cudaError_t cuda_matmul_quantize_activations(cudaStream_t stream, int32_t weight_type, const float *x, int n_batch,
                                             int n, int8_t *codes, float *scales, int16_t *bsums);

/* Which kernel 2..64-token calls on the 8-bit types run (sm_80 and later; the bits are the same
 * either way): CUDA_MATMUL_TC_STAGED (the default; any value but the two others) the int8 tensor-core
 * kernel that stages the activations in shared memory (matmul_tile.cuh) for Q4_K, Q5_K, Q6_K and
 * Q8_0, the per-warp one for Q4_0/Q5_0; CUDA_MATMUL_TC_PER_WARP the per-warp tensor-core kernel
 * (matmul_mma.cuh) for every 8-bit type but Q5_K (which has no step there and takes the dp4a kernel),
 * kept for comparison; CUDA_MATMUL_TC_OFF the dp4a kernel. One-token calls run the dp4a kernel but
 * for the types cuda_matmul_staged_decode names (Q8_0), which take the staged kernel in the default
 * mode and the dp4a kernel in the two others.
 * F16/BF16 weights (CUDA, sm_80+): any mode but CUDA_MATMUL_TC_OFF runs them on the f16/bf16
 * tensor-core kernel (matmul_float_tc.cuh) for every n_batch; CUDA_MATMUL_TC_OFF on the fma path.
 * For these two types the choice CHANGES the bits (two summation orders): set it before a run, never
 * between calls whose results must agree. */
#define CUDA_MATMUL_TC_OFF 0
#define CUDA_MATMUL_TC_STAGED 1
#define CUDA_MATMUL_TC_PER_WARP 2
void cuda_matmul_set_tensor_cores(int mode);
/* Which calls run a group's Q4_K and Q6_K matrices (together at most CUDA_MATMUL_GROUP_LAUNCH) in
 * one launch instead of one per type, for the process: CUDA_MATMUL_PAIR_DECODE one-token calls,
 * CUDA_MATMUL_PAIR_BATCH the 2..64-token calls of the staged kernel's bulk-copy form, both (the
 * default), or 0. The bits are the same either way. */
#define CUDA_MATMUL_PAIR_DECODE 1
#define CUDA_MATMUL_PAIR_BATCH 2
void cuda_matmul_set_pair_launch(int forms);
int cuda_matmul_pair_launch(void); /* the forms in force */
/* 1 when the staged kernel (2..64 tokens, Q4_K/Q5_K/Q6_K/Q8_0) runs its bulk-copy form on the current device:
 * CUDA, sm_90+, SPECLA_CUDA_TILE_BULK not 0. The bits are the same either way. */
int cuda_matmul_staged_bulk(void);
/* 1 when one-token calls on weight type `type` run the staged kernel on the current device (Q8_0 by
 * default; SPECLA_CUDA_STAGED_DECODE, matmul.cu), else the dp4a kernel. The bits are the same. */
int cuda_matmul_staged_decode(int32_t type);
/* Kernels the calling thread's matmul functions have launched so far (every cuda_matmul_* call that
 * puts work on a stream): the backend adds the difference around each call to its launch count. */
int64_t cuda_matmul_kernel_launches(void);

/* A chain of one-token matmuls, y_0 = W_0 x and y_l = W_l y_{l-1}, run by ONE persistent kernel
 * (matmul_chain.cuh): stage 1 of docs/persistent-step.md, an experiment measured against the same
 * chain of cuda_matmul calls by tools/cuda_chain_check.cu. Every y_l is the bits cuda_matmul gives on
 * y_{l-1}. All weights one type, Q4_K or Q6_K (prepared), ne0 of link l = ne1 of link l - 1, every
 * ne0 and every ne1 but the last a multiple of 256, at most 64 links; y[l] device buffers of ne1
 * floats. form: CUDA_MATMUL_CHAIN_REGISTERS_8 (a warp holds its next weight block in registers, 8
 * warps per SM), _12 (the same at 12 warps per SM, Q4_K only; it spills there) or
 * CUDA_MATMUL_CHAIN_RING_8 / _12 / _16 (sm_90: a ring of shared-memory stages per warp, filled by
 * bulk copies ahead of the computation and across its waits, at 8, 12 or 16 warps per SM, the
 * stages as many as fit), or CUDA_MATMUL_CHAIN_RING_PAIRS_8 / _12 (the ring form with two row
 * groups per unit, computed side by side); warps: the kernel's warps, 0 (or more than fit)
 * for all that are resident at once. The
 * chain holds its own counters and activation blocks; its runs go one at a time (on one stream).
 * CUDA only: cudaErrorNotSupported on HIP. */
typedef struct cuda_matmul_chain cuda_matmul_chain;
#define CUDA_MATMUL_CHAIN_NO_WAIT 1     /* no unit waits for its input: a timing bound, wrong results */
#define CUDA_MATMUL_CHAIN_L2_PREFETCH 2 /* a unit asks L2 for the rest of its weights before its wait */
#define CUDA_MATMUL_CHAIN_CHUNK_MAJOR 4 /* a link's units go chunk by chunk (the same bits) */
#define CUDA_MATMUL_CHAIN_REGISTERS_8 0
#define CUDA_MATMUL_CHAIN_REGISTERS_12 1
#define CUDA_MATMUL_CHAIN_RING_8 2
#define CUDA_MATMUL_CHAIN_RING_12 3
#define CUDA_MATMUL_CHAIN_RING_16 4
#define CUDA_MATMUL_CHAIN_RING_PAIRS_8 5
#define CUDA_MATMUL_CHAIN_RING_PAIRS_12 6
cudaError_t cuda_matmul_chain_create(int n_links, const specla_tensor *const *w, float *const *y, int form, int warps,
                                     cuda_matmul_chain **out);
cudaError_t cuda_matmul_chain_run(cudaStream_t stream, const cuda_matmul_chain *chain, const float *x, int flags);
int cuda_matmul_chain_warps(const cuda_matmul_chain *chain);
void cuda_matmul_chain_destroy(cuda_matmul_chain *chain);

#define CUDA_MATMUL_GROUP_LAUNCH 4

#ifdef __cplusplus
}
#endif
#endif
