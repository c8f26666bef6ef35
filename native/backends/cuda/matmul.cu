/* CUDA/HIP matmul: y[b][o] = sum_i W[o][i] * x[b][i] for the weight types of cuda_matmul.h.
 *
 * Arithmetic (the GPU's fixed order; matmul_blocks.h holds the per-block code, shared with the host
 * model in tools/cuda_matmul_check.cu):
 *
 * 1. Activations. For Q8_0/Q4_0/Q5_0 weights each row x[b] is rounded to Q8_0 activation blocks of
 *    32, for Q4_K/Q5_K/Q6_K to Q8_K blocks of 256, with the CPU's quantizers operation for operation
 *    (activation_q8.c): the GPU's codes, scales and bsums are the CPU's bytes (the CPU's Q5_K matmul
 *    takes the floats instead: matmul_blocks.h, mm_act_kind). F32/F16/BF16 weights
 *    take the float activations.
 * 2. Blocks. A row's ne0 elements are n_blocks blocks (the weight's blocks; 32 elements for the
 *    float types). Per block and token, the 8-bit types form exact integer sums and then:
 *      Q8_0/Q4_0/Q5_0: s = sum_i w_i a_i (levels as the CPU's, bias included)
 *                      acc = fma(d_w * d_a, s, acc)
 *      Q4_K:           s = sum_j sc_j sum_{i in sub-block j} q_i a_i, t = sum_j m_j (bsum_2j + bsum_2j+1)
 *                      acc = fma(d_a * d, s, acc); acc = fma(-(d_a * dmin), t, acc)
 *      Q6_K:           s = sum_g sc_g (sum_{i in group g} q_i a_i - 32 bsum_g) over the 16 groups of 16
 *                      acc = fma(d_a * d, s, acc)
 *    (products d * d rounded once, (float)s rounded to nearest, fma single-rounding), and the float
 *    types run acc = fma(w_i, x_i, acc) for the block's 32 elements in order -- except F16 and BF16
 *    on sm_80+ with the tensor cores on (cuda_matmul_set_tensor_cores), which for EVERY n_batch take
 *    matmul_float_tc.cuh's order: the activations split into f16 (hi, lo; per-token power-of-two
 *    scale) or bf16 (hi, mid, lo) terms, per block f16/bf16 MMAs accumulating in fp32 (its header
 *    states the order and the error model). Its MMA accumulation is the hardware's, so the host
 *    model (tools/cuda_matmul_check.cu) meets the GPU within a tolerance there, in bits elsewhere.
 * 3. Chunks. The plan (mm_plan_for: a function of type, ne0 and ne1 ONLY) cuts every row into
 *    n_chunks chunks of chunk_blocks consecutive blocks (the last one shorter). A chunk's partial sum
 *    starts at +0.0f and takes its blocks in increasing order, as in 2.
 * 4. Rows. y = p_0 when n_chunks = 1, else ((p_0 + p_1) + p_2) + ... + p_{C-1}: chunk order, one
 *    rounded add each.
 * Nothing in 1-4 (nor in the F16/BF16 tensor-core order) depends on n_batch, on how many tokens a
 * warp carries at once, on which warp or block computes a chunk, on the other matrices of a group
 * launch or on the device (the F16/BF16 MMA's accumulation aside, which is the hardware's): every
 * row of y is the same bits for any n_batch, and a group launch gives the bits of separate calls.
 * Against the CPU oracle only the float summation order differs (the CPU sums 8 lanes per block,
 * then the lanes; for F16/BF16 on tensor cores also the activation split); the integers and the
 * activation codes are the same.
 *
 * Work layout: a warp owns one (row group of 32 rows, chunk) unit. The dp4a kernel here (one token,
 * F32, F16/BF16 with their tensor-core path off, every type before sm_80) gives each lane a row;
 * the prepared layout (matmul_blocks.h) makes each of its 16-byte loads one coalesced 512-byte warp
 * access, and the warp loads the next load group of blocks while it computes the current one. Tokens go in tiles
 * of up to 8 per pass over the chunk. For 2..64 tokens (sm_80+) Q4_K, Q5_K, Q6_K and Q8_0 run matmul_tile.cuh's
 * staged int8 tensor-core kernel (a CTA per two row groups and one chunk, the activations staged in
 * shared memory; the same units' sums), the other 8-bit types matmul_mma.cuh's per-warp one
 * (cuda_matmul_set_tensor_cores chooses); F16/BF16, for every n_batch, matmul_float_tc.cuh's per-warp
 * f16/bf16 tensor-core kernel, after mm_split_kernel wrote the activation terms to the workspace.
 * With more than one chunk, partial sums go to the workspace and the last warp to finish a row
 * group (an atomic arrival counter) adds them in chunk order; the counters are zeroed by the
 * quantize (or split) kernel that starts every call.
 *
 * Launch overlap (launch.h; sm_90+, cuda_set_launch_overlap): like every kernel of the backend, the
 * quantize and matmul kernels are launched with programmatic stream serialization. A matmul lets the
 * next kernel launch at its start and waits (griddepcontrol.wait) for the previous kernel of the
 * stream only after its first weight loads, before reading or writing anything but the constant
 * weights, so those loads overlap the kernels before it. Only the weights are read with
 * non-coherent loads, which the compiler may issue before the wait; what the previous kernel wrote
 * takes plain loads (mm_load16_act; tools/check_load_rules.py keeps the rule). The arithmetic is
 * untouched. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_matmul.h"
#include "matmul_launch.h"
#include "matmul_quantize.cuh"

#define MM_WARPS_PER_BLOCK 4
#define MM_THREADS (MM_WARPS_PER_BLOCK * 32)
/* The dp4a kernel's CTAs are single warps (its warps share nothing): 960 units of a one-wave
 * matrix then spread 7-8 warps over every SM, where 240 CTAs of 4 warps put 4 on some SMs and 8
 * on others (the launch timelines' "per SM 4-8"). */
#define MM_DP4A_WARPS_PER_BLOCK 1
#define MM_DP4A_THREADS (MM_DP4A_WARPS_PER_BLOCK * 32)

/* Kernels launched by this thread's matmul calls (cuda_matmul_kernel_launches): a call launches a
 * quantize or split kernel and one kernel per weight type, so the backend counts them from here. */
static thread_local int64_t mm_kernels_launched = 0;
extern "C" int64_t cuda_matmul_kernel_launches(void) { return mm_kernels_launched; }

/* ---- workspace layout ------------------------------------------------------------------------- */
/* Activation blocks of both kinds (the Q8_K ones with the min operands of mm_min_operands), the
 * split-K arrival counters, the partial sums of up to CUDA_MATMUL_GROUP_LAUNCH matrices, and the
 * F16/BF16 tensor-core path's activation terms (MM_FTC_MAX_TERMS x 2 bytes per input) and token
 * scales. */
typedef struct mm_workspace_layout {
    size_t codes_q8_0, scales_q8_0, codes_q8_k, scales_q8_k, bsums_q8_k, minops_q8_k, counters, partials;
    size_t split, inv_scale; /* the F16/BF16 tensor-core path's activation terms and F16 token scales */
    size_t total;
} mm_workspace_layout;

static size_t mm_align(size_t v) { return (v + 255) & ~(size_t)255; }

static mm_workspace_layout mm_workspace_for(int n_batch, int n) {
    mm_workspace_layout l;
    const size_t nb = (size_t)n_batch, nn = (size_t)n;
    size_t off = 0;
    l.codes_q8_0 = off, off = mm_align(off + nb * nn);
    l.scales_q8_0 = off, off = mm_align(off + nb * (nn / 32) * sizeof(float));
    l.codes_q8_k = off, off = mm_align(off + nb * nn);
    l.scales_q8_k = off, off = mm_align(off + nb * (nn / 256) * sizeof(float));
    l.bsums_q8_k = off, off = mm_align(off + nb * (nn / 16) * sizeof(int16_t));
    l.minops_q8_k = off, off = mm_align(off + nb * (nn / 256) * 16);
    l.counters = off, off = mm_align(off + (size_t)CUDA_MATMUL_GROUP_LAUNCH * MM_MAX_COUNTERS * sizeof(unsigned));
    l.partials = off, off = mm_align(off + (size_t)CUDA_MATMUL_GROUP_LAUNCH * nb * MM_MAX_PARTIALS_PER_TOKEN * sizeof(float));
    l.split = off, off = mm_align(off + (size_t)MM_FTC_MAX_TERMS * nb * nn * sizeof(uint16_t));
    l.inv_scale = off, off = mm_align(off + nb * sizeof(float));
    l.total = off;
    return l;
}

extern "C" size_t cuda_matmul_workspace_bytes(int n_batch, int n) {
    if (n_batch < 1 || n < 1) return 0;
    return mm_workspace_for(n_batch, n).total;
}

/* Quantizes x[n_batch][n] to one kind of activation blocks (kind MM_ACT_FLOAT: none; Q8_K blocks with
 * their min operands when minops is not NULL) and zeroes the split-K arrival counters of the launches
 * that follow. */
__global__ void __launch_bounds__(MM_THREADS) mm_quantize_kernel(const float *__restrict__ x, int64_t n, int n_batch,
                                                                  int kind, int8_t *codes, float *scales,
                                                                  int16_t *bsums, uint8_t *minops, unsigned *counters,
                                                                  int n_counters) {
    const int64_t tid = (int64_t)blockIdx.x * MM_THREADS + threadIdx.x;
    grid_begin(); /* x is the previous kernel's output, the counters its matmul's; the matmul after this
                   * may launch now and load weights (it waits for this grid's end) */
    if (tid < n_counters) counters[tid] = 0;
    if (kind == MM_ACT_FLOAT) return;
    const int unit = kind == MM_ACT_Q8_K ? 256 : 32;
    const int64_t per_row = n / unit, n_blocks = per_row * n_batch;
    const int64_t blk = tid / 32;
    const int lane = threadIdx.x & 31;
    if (blk >= n_blocks) return; /* whole warps leave together */
    const int64_t b = blk / per_row, k = blk % per_row;
    const float *xb = x + b * n + k * unit;
    int8_t *cb = codes + b * n + k * unit;
    if (kind == MM_ACT_Q8_K)
        mm_warp_quantize_q8_k(xb, cb, scales + blk, bsums + blk * 16, minops ? minops + blk * 16 : nullptr, lane);
    else
        mm_warp_quantize_q8_0(xb, cb, scales + blk, lane);
}

/* ---- prequantized activations (cuda_matmul_prequantized_blocks) ---------------------------------- */
/* The buffer: the arrival counters of CUDA_MATMUL_GROUP_LAUNCH matrices first (at offset 0, whatever
 * the input), then the blocks of an input of `elements` floats: codes, then per 256-block the scale,
 * 16 bsums and 16 min operands. Block k of token b of an n_batch x n input is flat block
 * b * (n / 256) + k, so the layout depends on the element count only. */
typedef struct mm_prequantized_layout {
    size_t codes, scales, bsums, minops, total;
} mm_prequantized_layout;

static mm_prequantized_layout mm_prequantized_for(int64_t elements) {
    mm_prequantized_layout l;
    const size_t blocks = (size_t)elements / 256;
    size_t off = mm_align((size_t)CUDA_MATMUL_GROUP_LAUNCH * MM_MAX_COUNTERS * sizeof(unsigned)); /* the counters */
    l.codes = off, off = mm_align(off + (size_t)elements);
    l.scales = off, off = mm_align(off + blocks * sizeof(float));
    l.bsums = off, off = mm_align(off + blocks * 16 * sizeof(int16_t));
    l.minops = off, off = mm_align(off + blocks * 16);
    l.total = off;
    return l;
}

extern "C" size_t cuda_matmul_prequantized_bytes(int64_t max_elements) {
    if (max_elements < 256) return 0;
    return mm_prequantized_for(max_elements / 256 * 256).total;
}

extern "C" cuda_matmul_q8k cuda_matmul_prequantized_blocks(void *buffer, size_t bytes, int64_t elements) {
    cuda_matmul_q8k q = {nullptr, nullptr, nullptr, nullptr};
    if (!buffer || elements < 256 || elements % 256 != 0) return q;
    const mm_prequantized_layout l = mm_prequantized_for(elements);
    if (l.total > bytes) return q;
    uint8_t *base = (uint8_t *)buffer;
    q.codes = (int8_t *)(base + l.codes), q.scales = (float *)(base + l.scales);
    q.bsums = (int16_t *)(base + l.bsums), q.minops = base + l.minops;
    return q;
}

/* ---- the dp4a kernel ---------------------------------------------------------------------------- */
/* A load group of blocks of one lane's row, in registers. */
template <int TYPE> struct mm_frag {
    uint32_t w[mm_traits<TYPE>::load_group][4 * mm_traits<TYPE>::pieces];
    mm_side side[mm_traits<TYPE>::load_group];
};

template <int TYPE>
__device__ __forceinline__ void mm_load(mm_frag<TYPE> &f, const uint8_t *group_base, int k, int k_end, int lane) {
    constexpr int G = mm_traits<TYPE>::load_group, P = mm_traits<TYPE>::pieces;
    constexpr int64_t slot_bytes = (int64_t)MM_GROUP_ROWS * mm_traits<TYPE>::unit_bytes;
#pragma unroll
    for (int g = 0; g < G; g++) {
        if (k + g < k_end) {
            const uint8_t *slot = group_base + (int64_t)(k + g) * slot_bytes;
#pragma unroll
            for (int p = 0; p < P; p++) mm_load16((const uint4 *)(slot + p * 16 * MM_GROUP_ROWS) + lane, &f.w[g][4 * p]);
            const uint8_t *side = slot + P * 16 * MM_GROUP_ROWS;
            if (mm_traits<TYPE>::has_d) f.side[g].d = mm_ld_u16((const unsigned short *)side + lane);
            if (TYPE == SPECLA_TYPE_Q5_0) f.side[g].qh = mm_ld_u32((const unsigned *)(side + 2 * MM_GROUP_ROWS) + lane);
        }
    }
}

/* After a warp stored its unit's partial sums: the last chunk of a split row group to arrive adds
 * the partial sums in chunk order (mm_finish_rows: lane % 8 takes 4 rows, lane / 8 every fourth
 * token) and re-arms the counter. */
__device__ __forceinline__ void mm_finish_unit(const mm_mat_args &M, int rg, int lane, int n_batch) {
    if (M.n_chunks == 1 || M.unfinished) return;
    __threadfence();
    __syncwarp();
    unsigned arrived = 0;
    if (lane == 0) arrived = atomicAdd(M.counters + rg, 1u);
    arrived = __shfl_sync(MM_FULL_MASK, arrived, 0);
    if (arrived != (unsigned)M.n_chunks - 1) return;
    __threadfence();
    mm_finish_rows<16>(M, rg * MM_GROUP_ROWS, MM_GROUP_ROWS, n_batch, lane, 32);
    if (lane == 0) M.counters[rg] = 0; /* ready for the next launch that uses this slot */
}

/* The body of the per-warp tensor-core kernels (mm_mma_kernel, mm_ftc_kernel): warp w of the launch
 * runs unit u = w (CHUNK_MAJOR: u = mm_unit_chunk_major(w), the F16/BF16 kernel's order) as
 * unit(u, lane), which stores the unit's partial sums, then the split-K finish of its row group.
 * The next kernel may launch at once (launch.h; it waits for this grid's end). mm_kernel writes the
 * same steps inline: as a unit function it took up to 10 more registers (and spilled
 * Q5_0's one-token form), and it is the decode step's hot kernel. */
template <bool CHUNK_MAJOR = false, class Unit>
__device__ __forceinline__ void mm_run_warp_unit(const mm_launch_args &args, Unit unit) {
    const int lane = threadIdx.x & 31;
    int u = blockIdx.x * MM_WARPS_PER_BLOCK + (threadIdx.x >> 5);
    mm_allow_dependents();
    if (u >= args.n_units) return; /* whole warps */
    if constexpr (CHUNK_MAJOR) u = mm_unit_chunk_major(args, u);
    if (lane == 0) mm_trace(u, MM_TRACE_START);
    unit(u, lane);
    if (lane == 0) mm_trace(u, MM_TRACE_LOOP_DONE);
    const mm_mat_args M = mm_select_mat(args, u);
    mm_finish_unit(M, (u - M.unit_begin) / M.n_chunks, lane, args.n_batch);
    if (lane == 0) mm_trace(u, MM_TRACE_END);
}

/* CTA `cta` of a dp4a launch (mm_kernel, or its type's share of mm_pair_kernel). */
template <int TYPE, int NT> __device__ __forceinline__ void mm_dp4a_cta(const mm_launch_args &args, int cta) {
    constexpr int G = mm_traits<TYPE>::load_group;
    const int lane = threadIdx.x & 31;
    const int u = cta * MM_DP4A_WARPS_PER_BLOCK + (threadIdx.x >> 5);
    mm_allow_dependents(); /* launch.h: the next kernel may launch; it waits for this grid's end */
    if (u >= args.n_units) return; /* whole warps */
    if (lane == 0) mm_trace(u, MM_TRACE_START);
    const mm_unit_place P = mm_unit_of<TYPE>(args, u);
    const mm_mat_args &M = P.M;
    const int rg = P.rg, c = P.c, k_begin = P.k_begin, k_end = P.k_end;
    const int row = rg * MM_GROUP_ROWS + lane;
    const uint8_t *group_base = P.group_base;

    for (int t0 = 0; t0 < args.n_batch; t0 += NT) {
        float acc[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) acc[t] = 0.0f;
        mm_frag<TYPE> cur, nxt;
        mm_load(cur, group_base, k_begin, k_end, lane);
        mm_wait_prior_grid(); /* the weights are constant; the activations are the previous kernel's */
        if (t0 == 0 && lane == 0) mm_trace(u, MM_TRACE_WAITED);
        for (int k = k_begin; k < k_end; k += G) {
            if (k + G < k_end) mm_load(nxt, group_base, k + G, k_end, lane);
#pragma unroll
            for (int g = 0; g < G; g++) {
                if (k + g < k_end) {
#if defined(MM_LOAD_ONLY)
                    /* diagnostic build (cuda_matmul_check, -DMM_LOAD_ONLY): the same loads, no
                     * arithmetic, to time the weight stream alone; the results are meaningless */
                    uint32_t fold = 0;
#pragma unroll
                    for (int i = 0; i < 4 * mm_traits<TYPE>::pieces; i++) fold ^= cur.w[g][i];
                    acc[0] += __uint_as_float(fold & 0x3f7fffffu);
#else
#pragma unroll
                    for (int t = 0; t < NT; t++)
                        if (t0 + t < args.n_batch)
                            acc[t] = mm_block_step<TYPE>(cur.w[g], cur.side[g], args.act, args.n, t0 + t, k + g, acc[t]);
#endif
                }
            }
            cur = nxt;
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const int b = t0 + t;
            if (b >= args.n_batch) break;
            mm_store(M, c, row, b, acc[t]);
        }
    }
    if (lane == 0) mm_trace(u, MM_TRACE_LOOP_DONE);
    mm_finish_unit(M, rg, lane, args.n_batch);
    if (lane == 0) mm_trace(u, MM_TRACE_END);
}

template <int TYPE, int NT>
__global__ void __launch_bounds__(MM_DP4A_THREADS,
                                  mm_traits<TYPE>::min_blocks(NT) * (MM_WARPS_PER_BLOCK / MM_DP4A_WARPS_PER_BLOCK))
    mm_kernel(const mm_launch_args args) { /* min_blocks counts CTAs of MM_WARPS_PER_BLOCK warps */
    mm_dp4a_cta<TYPE, NT>(args, blockIdx.x);
}

/* One launch for two weight types that read the same activation blocks (a group of Q4_K and Q6_K
 * matrices: docs/cuda-matmul.md, "One launch for a group of two weight types"): the first
 * a_ctas CTAs run launch `a` of type TA as mm_kernel<TA, NT> would, the rest launch `b` of type TB,
 * each unit the same operations in the same order, so the same bits. The registers are the larger
 * body's (the smaller min_blocks), so TA's CTAs run at TB's occupancy when TB needs more. */
template <int TA, int TB, int NT>
__global__ void __launch_bounds__(MM_DP4A_THREADS,
                                  (mm_traits<TA>::min_blocks(NT) < mm_traits<TB>::min_blocks(NT) ? mm_traits<TA>::min_blocks(NT)
                                                                                                  : mm_traits<TB>::min_blocks(NT)) *
                                      (MM_WARPS_PER_BLOCK / MM_DP4A_WARPS_PER_BLOCK))
    mm_pair_kernel(const mm_launch_args a, const mm_launch_args b, int a_ctas) {
    if ((int)blockIdx.x < a_ctas) mm_dp4a_cta<TA, NT>(a, blockIdx.x);
    else mm_dp4a_cta<TB, NT>(b, blockIdx.x - a_ctas);
}

#define MM_KERNELS
#include "matmul_ring.cuh"
#include "matmul_mma.cuh"
#include "matmul_tile.cuh"
#include "matmul_float_tc.cuh"

/* ---- host side ----------------------------------------------------------------------------------- */
#if defined(MM_TRACE)
/* Where the next launches record their timelines (NULL: nowhere); device memory of capacity records. */
extern "C" cudaError_t cuda_matmul_set_trace(mm_trace_record *records, int capacity) {
    cudaError_t err = cudaMemcpyToSymbol(mm_trace_records, &records, sizeof records);
    if (err == cudaSuccess) err = cudaMemcpyToSymbol(mm_trace_capacity, &capacity, sizeof capacity);
    return err;
}
#endif

static int mm_supported(int32_t type) { return mm_unit_elements(type) != 0; }

extern "C" size_t cuda_matmul_prepared_bytes(int32_t type, int32_t ne0, int32_t ne1) {
    if (!mm_supported(type) || ne0 <= 0 || ne1 <= 0 || ne0 % mm_unit_elements(type) != 0) return 0;
    const mm_plan p = mm_plan_for(type, ne0, ne1);
    return (size_t)p.row_groups * MM_GROUP_ROWS * p.n_blocks * mm_unit_bytes(type);
}

/* Where a block's 16-byte-aligned part and its side fields sit in the GGUF block (see the layout in
 * matmul_blocks.h). */
static void mm_block_fields(int32_t type, int *aligned_at, int *d_at, int *qh_at) {
    *aligned_at = 0, *d_at = -1, *qh_at = -1;
    switch (type) {
    case SPECLA_TYPE_Q6_K: *d_at = 208; break;
    case SPECLA_TYPE_Q8_0:
    case SPECLA_TYPE_Q4_0: *aligned_at = 2, *d_at = 0; break;
    case SPECLA_TYPE_Q5_0: *aligned_at = 6, *d_at = 0, *qh_at = 2; break;
    default: break;
    }
}

extern "C" int cuda_matmul_repack_host(const specla_tensor *w, void *dst) {
    const size_t bytes = cuda_matmul_prepared_bytes(w->type, w->ne0, w->ne1);
    if (bytes == 0 || !w->data) return -1;
    const mm_plan p = mm_plan_for(w->type, w->ne0, w->ne1);
    const int ub = mm_unit_bytes(w->type), pieces = mm_pieces(w->type);
    int aligned_at, d_at, qh_at;
    mm_block_fields(w->type, &aligned_at, &d_at, &qh_at);
    const size_t row_bytes = (size_t)p.n_blocks * ub;
    uint8_t *out = (uint8_t *)dst;
    memset(out, 0, bytes);
    for (int64_t g = 0; g < p.row_groups; g++) {
        for (int k = 0; k < p.n_blocks; k++) {
            uint8_t *slot = out + mm_slot_offset(w->type, p.n_blocks, g, k);
            uint8_t *side = slot + (size_t)pieces * 16 * MM_GROUP_ROWS;
            for (int r = 0; r < MM_GROUP_ROWS; r++) {
                const int64_t o = g * MM_GROUP_ROWS + r;
                if (o >= w->ne1) break; /* padding rows stay zero */
                const uint8_t *blk = (const uint8_t *)w->data + (size_t)o * row_bytes + (size_t)k * ub;
                for (int q = 0; q < pieces; q++) memcpy(slot + ((size_t)q * MM_GROUP_ROWS + r) * 16, blk + aligned_at + 16 * q, 16);
                if (d_at >= 0) memcpy(side + 2 * r, blk + d_at, 2);
                if (qh_at >= 0) memcpy(side + 2 * MM_GROUP_ROWS + 4 * r, blk + qh_at, 4);
            }
        }
    }
    return 0;
}

extern "C" cudaError_t cuda_matmul_prepare_weight(const specla_tensor *host_w, void *device_dst) {
    const size_t bytes = cuda_matmul_prepared_bytes(host_w->type, host_w->ne0, host_w->ne1);
    if (bytes == 0) return cudaErrorNotSupported;
    void *staging = malloc(bytes);
    if (!staging) return cudaErrorMemoryAllocation;
    if (cuda_matmul_repack_host(host_w, staging) != 0) {
        free(staging);
        return cudaErrorInvalidValue;
    }
    const cudaError_t err = cudaMemcpy(device_dst, staging, bytes, cudaMemcpyHostToDevice);
    free(staging);
    return err;
}

/* Rows of a prepared weight gathered into another prepared weight (a reduced LM head). A row's
 * blocks sit at the same lane of every slot of its row group, and the slots of a row group depend
 * on n_blocks only (not on ne1), so row o of src is copied lane to lane: dst row first + i <- src
 * row ids[i], every 16-byte piece and side field of each block, bytes unchanged. Thread mapping:
 * blockIdx.y = i, threads over (block k, piece q) with q = pieces meaning the side fields. */
__global__ void mm_gather_rows_kernel(int32_t type, int n_blocks, const uint8_t *src, const int32_t *ids,
                                      uint8_t *dst, int first) {
    grid_begin();
    const int i = blockIdx.y;
    const int64_t o = ids[i], d = (int64_t)first + i;
    const int pieces = mm_pieces(type);
    const int has_d = type == SPECLA_TYPE_Q8_0 || type == SPECLA_TYPE_Q4_0 || type == SPECLA_TYPE_Q5_0 ||
                      type == SPECLA_TYPE_Q6_K;
    const int so = (int)(o % MM_GROUP_ROWS), sd = (int)(d % MM_GROUP_ROWS);
    const int64_t work = (int64_t)n_blocks * (pieces + 1);
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < work; t += (int64_t)gridDim.x * blockDim.x) {
        const int k = (int)(t / (pieces + 1)), q = (int)(t % (pieces + 1));
        const uint8_t *from = src + mm_slot_offset(type, n_blocks, o / MM_GROUP_ROWS, k);
        uint8_t *to = dst + mm_slot_offset(type, n_blocks, d / MM_GROUP_ROWS, k);
        if (q < pieces) {
            *(uint4 *)(to + ((size_t)q * MM_GROUP_ROWS + sd) * 16) =
                *(const uint4 *)(from + ((size_t)q * MM_GROUP_ROWS + so) * 16);
        } else {
            const uint8_t *side_from = from + (size_t)pieces * 16 * MM_GROUP_ROWS;
            uint8_t *side_to = to + (size_t)pieces * 16 * MM_GROUP_ROWS;
            if (has_d) *(uint16_t *)(side_to + 2 * sd) = *(const uint16_t *)(side_from + 2 * so);
            if (type == SPECLA_TYPE_Q5_0)
                *(uint32_t *)(side_to + 2 * MM_GROUP_ROWS + 4 * sd) = *(const uint32_t *)(side_from + 2 * MM_GROUP_ROWS + 4 * so);
        }
    }
}

extern "C" cudaError_t cuda_matmul_gather_rows(cudaStream_t stream, const specla_tensor *w, const int32_t *ids, int n,
                                               void *dst, int first) {
    if (!mm_supported(w->type) || w->ne0 % mm_unit_elements(w->type) != 0 || n < 0 || first < 0)
        return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    const int n_blocks = w->ne0 / mm_unit_elements(w->type);
    const int64_t work = (int64_t)n_blocks * (mm_pieces(w->type) + 1);
    const unsigned bx = (unsigned)((work + 255) / 256 < 64 ? (work + 255) / 256 : 64);
    cuda_launch(mm_gather_rows_kernel, dim3(bx, (unsigned)n), dim3(256), 0, stream,
                w->type, n_blocks, (const uint8_t *)w->data, ids, (uint8_t *)dst, first);
    mm_kernels_launched++;
    return cudaGetLastError();
}


static int g_tensor_core_mode = CUDA_MATMUL_TC_STAGED;

extern "C" void cuda_matmul_set_tensor_cores(int mode) {
    g_tensor_core_mode = mode == CUDA_MATMUL_TC_OFF || mode == CUDA_MATMUL_TC_PER_WARP ? mode : CUDA_MATMUL_TC_STAGED;
}

/* int8 mma.sync needs sm_80 */
static int mm_device_has_int8_mma(void) { return cuda_device_major() >= 8; }

/* Whether F16/BF16 weights take the tensor-core kernel (matmul_float_tc.cuh) for every n_batch: its
 * f16/bf16 mma.sync needs sm_80, HIP keeps the fma path, CUDA_MATMUL_TC_OFF selects the fma path for
 * an A/B. Unlike the 8-bit types' choice this one changes the bits of F16/BF16 rows (another
 * summation order), so a run must not change the mode between the calls it compares. */
static int mm_float_tensor_cores(void) {
#if defined(SPECLA_USE_HIP)
    return 0;
#else
    return g_tensor_core_mode != CUDA_MATMUL_TC_OFF && cuda_device_major() >= 8;
#endif
}

/* An A/B switch read from the environment: its value is on unless it is "0"; unset, `fallback`. */
static int mm_env_flag(const char *name, int fallback) {
    const char *v = getenv(name);
    return v ? strcmp(v, "0") != 0 : fallback;
}

/* A launch of `threads`-thread CTAs with `smem` bytes of dynamic shared memory each on `stream`
 * (launch.h), counted: every kernel launch of this file and matmul_chain.cuh goes through it. */
template <typename... KArgs>
static cudaError_t mm_start_smem(void (*kernel)(KArgs...), unsigned grid, unsigned threads, size_t smem,
                                 cudaStream_t stream, typename launch_param<KArgs>::type... args) {
    cuda_launch(kernel, dim3(grid), dim3(threads), smem, stream, args...);
    mm_kernels_launched++;
    return cudaGetLastError();
}
/* The same without dynamic shared memory. */
template <typename... KArgs>
static cudaError_t mm_start_threads(void (*kernel)(KArgs...), unsigned grid, unsigned threads, cudaStream_t stream,
                                    typename launch_param<KArgs>::type... args) {
    return mm_start_smem(kernel, grid, threads, 0, stream, args...);
}
/* A launch of MM_THREADS-thread CTAs. */
template <typename... KArgs>
static cudaError_t mm_start(void (*kernel)(KArgs...), unsigned grid, cudaStream_t stream,
                            typename launch_param<KArgs>::type... args) {
    return mm_start_threads(kernel, grid, MM_THREADS, stream, args...);
}
/* The CTAs of a dp4a launch: its n_units warp units, MM_DP4A_WARPS_PER_BLOCK per CTA. */
static int mm_dp4a_ctas(const mm_launch_args &args) {
    return (args.n_units + MM_DP4A_WARPS_PER_BLOCK - 1) / MM_DP4A_WARPS_PER_BLOCK;
}
/* The dp4a kernel over the launch's units. */
static cudaError_t mm_start_dp4a(void (*kernel)(mm_launch_args), cudaStream_t stream, const mm_launch_args &args) {
    const unsigned grid = (unsigned)mm_dp4a_ctas(args);
    return mm_start_threads(kernel, grid, MM_DP4A_THREADS, stream, args);
}

/* The one-token ring kernels' setting (matmul_ring.cuh: Q4_K, Q6_K and their pair launch),
 * SPECLA_CUDA_DP4A_RING: unset, Q4_K and pair launches take the deepest of 4, 3 or 2 stages with
 * which their units take no more waves than those of the dp4a kernel they replace (mm_kernel,
 * mm_pair_kernel; on an H100 the Q4_K form took 0.9-1.3 % off a recorded decode step and the pair
 * form 0.3-2 % more, docs/perf.md, thirty-seventh and thirty-eighth passes; on a card with 100 KB of
 * shared memory an SM, such as sm_86 or sm_120, the Q4_K stages hold 4 units an SM where mm_kernel
 * holds 12), and a Q6_K launch of its own keeps mm_kernel (mm_try_ring says why); 2, 3 or 4: that
 * depth for every such launch (an A/B); 0 or anything else: the dp4a kernels. CUDA sm_80+ only. The
 * same bits either way. */
typedef struct mm_ring_setting {
    int depth;  /* 0: the dp4a kernels; unforced, the deepest depth tried */
    int forced; /* the variable named the depth */
} mm_ring_setting;
static mm_ring_setting mm_ring_setting_now(void) {
#if defined(SPECLA_USE_HIP)
    return mm_ring_setting{0, 0};
#else
    static const mm_ring_setting setting = [] {
        const char *v = getenv("SPECLA_CUDA_DP4A_RING");
        if (!v) return mm_ring_setting{4, 0};
        const int d = atoi(v);
        return mm_ring_setting{d >= 2 && d <= 4 ? d : 0, 1};
    }();
    return cuda_device_major() >= 8 ? setting : mm_ring_setting{0, 0};
#endif
}
#if !defined(SPECLA_USE_HIP)
/* the longest chunk of a launch's matrices, in blocks */
static int mm_launch_chunk(const mm_launch_args &args) {
    int chunk = 0;
    for (int m = 0; m < args.n_mats; m++) chunk = args.mat[m].chunk_blocks > chunk ? args.mat[m].chunk_blocks : chunk;
    return chunk;
}
/* Resident CTAs an SM of `kernel` at one warp a CTA and `smem` bytes each, as the runtime's
 * occupancy calculator counts them (registers, shared memory with its per-CTA reserve, the CTA cap);
 * 0 when it cannot tell. */
static int mm_ctas_per_sm(const void *kernel, size_t smem) {
    int n = 0;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, MM_DP4A_THREADS, smem) == cudaSuccess ? n : 0;
}
enum { MM_RING_KIND_Q4_K, MM_RING_KIND_Q6_K, MM_RING_KIND_PAIR, MM_RING_KINDS };
/* Whether `ctas` one-warp CTAs of the ring kernel `ring` (of kind and depth, `smem` bytes each for
 * chunks of up to `chunk` blocks) take no more waves than those of the dp4a kernel `base` it
 * replaces: per device, kind, depth and chunk, read once. */
static bool mm_ring_fits(int kind, int depth, const void *ring, const void *base, int64_t ctas, int chunk, size_t smem) {
    static int ring_of[64][MM_RING_KINDS][3][MM_RING_MAX_CHUNK + 1], base_of[64][MM_RING_KINDS], sms_of[64]; /* 0: not read yet */
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
    if (sms_of[dev] == 0) {
        int sms = 0;
        if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0) return false;
        sms_of[dev] = sms;
    }
    if (base_of[dev][kind] == 0) base_of[dev][kind] = mm_ctas_per_sm(base, 0);
    int &ring_per_sm = ring_of[dev][kind][depth - 2][chunk];
    if (ring_per_sm == 0) ring_per_sm = mm_ctas_per_sm(ring, smem);
    const int64_t ring_wave = (int64_t)sms_of[dev] * ring_per_sm, base_wave = (int64_t)sms_of[dev] * base_of[dev][kind];
    if (ring_wave <= 0 || base_wave <= 0) return false;
    return (ctas + ring_wave - 1) / ring_wave <= (ctas + base_wave - 1) / base_wave;
}
/* Launches the ring kernel of depth D for a one-token launch of type TYPE (b: NULL) or for a pair
 * launch, `args` its Q4_K matrices and `*b` its Q6_K ones (whose stages are the larger), where `forced`
 * or the wave rule takes it; false where it does not. chunk: the longest chunk of the launch. */
template <int TYPE, int D>
static bool mm_start_ring(cudaStream_t stream, const mm_launch_args &args, const mm_launch_args *b, int chunk, bool forced,
                          cudaError_t *err) {
    const int a_ctas = mm_dp4a_ctas(args), b_ctas = b ? mm_dp4a_ctas(*b) : 0;
    const size_t smem = (size_t)mm_ring_smem_bytes(b ? SPECLA_TYPE_Q6_K : TYPE, D, chunk);
    if (b) {
        if (!forced && !mm_ring_fits(MM_RING_KIND_PAIR, D, (const void *)mm_ring_pair_kernel<D>,
                                     (const void *)mm_pair_kernel<SPECLA_TYPE_Q4_K, SPECLA_TYPE_Q6_K, 1>,
                                     (int64_t)a_ctas + b_ctas, chunk, smem))
            return false;
        *err = mm_start_smem(mm_ring_pair_kernel<D>, (unsigned)(a_ctas + b_ctas), MM_DP4A_THREADS, smem, stream, args, *b,
                             a_ctas);
        return true;
    }
    const int kind = TYPE == SPECLA_TYPE_Q4_K ? MM_RING_KIND_Q4_K : MM_RING_KIND_Q6_K;
    if (!forced && !mm_ring_fits(kind, D, (const void *)mm_ring_kernel<TYPE, D>, (const void *)mm_kernel<TYPE, 1>, a_ctas,
                                 chunk, smem))
        return false;
    *err = mm_start_smem(mm_ring_kernel<TYPE, D>, (unsigned)a_ctas, MM_DP4A_THREADS, smem, stream, args);
    return true;
}
#endif
/* Launches a ring kernel for a one-token Q4_K or Q6_K call (b: NULL), or for a pair launch's Q4_K
 * matrices `args` and Q6_K matrices `*b`, where the setting takes it and every matrix's chunk fits
 * the activations it stages (*err: the launch's status); false where the dp4a kernel runs it. */
template <int TYPE>
static bool mm_try_ring(cudaStream_t stream, const mm_launch_args &args, const mm_launch_args *b, cudaError_t *err) {
#if defined(SPECLA_USE_HIP)
    (void)stream, (void)args, (void)b, (void)err;
    return false;
#else
    const mm_ring_setting setting = mm_ring_setting_now();
    if (setting.depth == 0) return false;
    const int chunk_a = mm_launch_chunk(args), chunk_b = b ? mm_launch_chunk(*b) : 0;
    const int chunk = chunk_a > chunk_b ? chunk_a : chunk_b;
    if (chunk > MM_RING_MAX_CHUNK) return false;
    const bool forced = setting.forced != 0;
    /* a Q6_K launch of its own keeps mm_kernel unless the depth is forced: its ring form was 2-3 % a
     * call slower on an H100, for reasons not profiled (docs/cuda-matmul.md). The pair launch takes the
     * ring, which lets its Q4_K share run at its own occupancy instead of Q6_K's. */
    if (TYPE == SPECLA_TYPE_Q6_K && !b && !forced) return false;
    for (int d = setting.depth; d >= (forced ? setting.depth : 2); d--) { /* unforced: the deepest that fits */
        const bool started = d == 4 ? mm_start_ring<TYPE, 4>(stream, args, b, chunk, forced, err)
                           : d == 3 ? mm_start_ring<TYPE, 3>(stream, args, b, chunk, forced, err)
                                    : mm_start_ring<TYPE, 2>(stream, args, b, chunk, forced, err);
        if (started) return true;
    }
    return false;
#endif
}

/* The staged kernel's sm_90 form (matmul_tile.cuh: weights by bulk copy into shared-memory stages),
 * whose dynamic shared memory passes 48 KB for Q6_K: the limit is raised once per instantiation. */
template <int TYPE, int NT> static cudaError_t mm_start_tile_bulk(unsigned ctas, cudaStream_t stream, const mm_launch_args &args) {
#if defined(SPECLA_USE_HIP)
    (void)ctas, (void)stream, (void)args;
    return cudaErrorNotSupported; /* mm_tile_bulk() is 0 there */
#else
    constexpr int smem = mm_tile_bulk_smem_bytes<TYPE, NT>();
    static const cudaError_t attr_err = cudaFuncSetAttribute(mm_tile_bulk_kernel<TYPE, NT>,
                                                             cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (attr_err != cudaSuccess) return attr_err;
    return mm_start_smem(mm_tile_bulk_kernel<TYPE, NT>, ctas, MM_THREADS, smem, stream, args);
#endif
}

/* Whether the staged kernel takes its bulk-copy form: CUDA on sm_90+, unless SPECLA_CUDA_TILE_BULK=0
 * (an A/B of the two forms; the bits are the same). */
static int mm_tile_bulk(void) {
#if defined(SPECLA_USE_HIP)
    return 0;
#else
    static const int enabled = mm_env_flag("SPECLA_CUDA_TILE_BULK", 1);
    return enabled && cuda_device_major() >= 9;
#endif
}

extern "C" int cuda_matmul_staged_bulk(void) { return mm_tile_bulk(); }

/* Whether an n_batch-token call over n inputs on Q4_K, Q5_K, Q6_K or Q8_0 may take the staged tensor-core
 * kernel (matmul_tile.cuh; its bulk form where mm_tile_bulk): the mode asks for it, the device has int8
 * MMA, and its activation offsets fit 32 bits. (A one-token call takes it where mm_staged_decode says.) */
static int mm_takes_staged(int n_batch, int64_t n) {
    return g_tensor_core_mode == CUDA_MATMUL_TC_STAGED && mm_device_has_int8_mma() &&
           (int64_t)n_batch * n < ((int64_t)1 << 31);
}

/* Whether one-token calls on `type` take the staged kernel (one token tile, its other 7 columns zeros)
 * instead of the dp4a kernel. Both compute matmul_blocks.h's order, so the bits are the same and
 * speed alone decides: on an H100 a 2-token batch of the 27B Q8_0 file on the staged kernel took 0.94
 * of a decode step on the dp4a kernel (docs/perf.md, forty-sixth pass), so Q8_0 takes it.
 * SPECLA_CUDA_STAGED_DECODE overrides the set for an A/B: a list of q8_0, q4_k, q5_k, q6_k separated
 * by commas or '+' (ab_variants.sh's env: variants take '+'), or "none". The names are the staged
 * kernel's types (mm_tile_traits::supported) only. (A Q4_K / Q6_K call in a pair launch keeps the
 * pair's dp4a kernel.) */
static int mm_staged_decode(int32_t type) {
    static const unsigned types = [] {
        const char *v = getenv("SPECLA_CUDA_STAGED_DECODE");
        if (!v) return 1u << SPECLA_TYPE_Q8_0;
        static const struct {
            const char *name;
            int32_t type;
        } names[] = {{"q8_0", SPECLA_TYPE_Q8_0}, {"q4_k", SPECLA_TYPE_Q4_K}, {"q5_k", SPECLA_TYPE_Q5_K}, {"q6_k", SPECLA_TYPE_Q6_K}};
        unsigned set = 0;
        for (const char *p = v; *p;) { /* each name between separators */
            const size_t len = strcspn(p, ",+");
            for (const auto &entry : names)
                if (len == strlen(entry.name) && strncmp(p, entry.name, len) == 0) set |= 1u << entry.type;
            p += len + (p[len] != '\0');
        }
        return set;
    }();
    return (int)((types >> type) & 1u);
}

extern "C" int cuda_matmul_staged_decode(int32_t type) {
    return mm_staged_decode(type) && mm_takes_staged(1, 0);
}

/* Whether the F16/BF16 tensor-core kernel's warps go chunk by chunk (mm_unit_chunk_major), unless
 * SPECLA_CUDA_FTC_CHUNK_MAJOR=0 (an A/B; the bits are the same). */
static int mm_ftc_chunk_major(void) {
    static const int enabled = mm_env_flag("SPECLA_CUDA_FTC_CHUNK_MAJOR", 1);
    return enabled;
}
/* Whether F16/BF16 calls take mm_ftc_staged_kernel (matmul_float_tc.cuh: a chunk's activation terms
 * staged once per CTA) where their terms fit MM_FTC_STAGE_MAX_BYTES. Unset or 1 (any value but 0, 2):
 * the staged kernel with weight load groups of 4 blocks up to 2 token tiles and of 2 beyond (4 spill
 * there); 2: groups of 2 at every tile count (an A/B of the group); 0: mm_ftc_kernel for every call.
 * Staged is the default because the DFlash draft's 16-token block runs faster so (docs/perf.md,
 * twenty-ninth pass). It relies on chunk-major order. The bits are the same. */
static int mm_ftc_stage(void) {
    static const int mode = [] {
        const char *v = getenv("SPECLA_CUDA_FTC_STAGE");
        return v && !strcmp(v, "0") ? 0 : v && !strcmp(v, "2") ? 2 : 1; /* unset, 4 or any other value: 1 */
    }();
    return mm_ftc_chunk_major() ? mode : 0;
}
#if !defined(SPECLA_USE_HIP)
template <int TYPE, int NT, int G>
static cudaError_t mm_start_ftc_staged(unsigned grid, cudaStream_t stream, const mm_launch_args &args, int64_t smem) {
    static const cudaError_t attr_err = cudaFuncSetAttribute(mm_ftc_staged_kernel<TYPE, NT, G>,
                                                             cudaFuncAttributeMaxDynamicSharedMemorySize, MM_FTC_STAGE_MAX_BYTES);
    if (attr_err != cudaSuccess) return attr_err;
    return mm_start_smem(mm_ftc_staged_kernel<TYPE, NT, G>, grid, MM_THREADS, (size_t)smem, stream, args);
}
#endif
template <int TYPE, int NT> static cudaError_t mm_start_ftc(unsigned grid, cudaStream_t stream, const mm_launch_args &args) {
#if !defined(SPECLA_USE_HIP)
    if (const int mode = mm_ftc_stage()) {
        const int64_t smem = mm_ftc_stage_bytes<TYPE, NT>(args);
        if (smem <= MM_FTC_STAGE_MAX_BYTES) {
            if constexpr (NT <= 2)
                if (mode != 2) return mm_start_ftc_staged<TYPE, NT, 4>(grid, stream, args, smem);
            return mm_start_ftc_staged<TYPE, NT, 2>(grid, stream, args, smem);
        }
    }
#endif
    if (mm_ftc_chunk_major()) return mm_start(mm_ftc_kernel<TYPE, NT, true>, grid, stream, args);
    return mm_start(mm_ftc_kernel<TYPE, NT, false>, grid, stream, args);
}

template <int TYPE>
static cudaError_t mm_launch_type(cudaStream_t stream, const mm_launch_args &args) {
    const unsigned grid = (unsigned)((args.n_units + MM_WARPS_PER_BLOCK - 1) / MM_WARPS_PER_BLOCK);
    if constexpr (mm_ftc_traits<TYPE>::supported) {
        if (mm_float_tensor_cores()) { /* every n_batch: one order for prefill and decode */
            switch (mm_ftc_tiles(args.n_batch)) {
            case 1: return mm_start_ftc<TYPE, 1>(grid, stream, args);
            case 2: return mm_start_ftc<TYPE, 2>(grid, stream, args);
            case 3: return mm_start_ftc<TYPE, 3>(grid, stream, args);
            default: return mm_start_ftc<TYPE, 4>(grid, stream, args);
            }
        }
    }
    if constexpr (mm_traits<TYPE>::int8 && (mm_mma_traits<TYPE>::supported || mm_tile_traits<TYPE>::supported)) {
        const bool staged_decode = args.n_batch == 1 && mm_staged_decode(TYPE);
        if ((args.n_batch >= 2 || staged_decode) && g_tensor_core_mode != CUDA_MATMUL_TC_OFF && mm_device_has_int8_mma()) {
            if constexpr (mm_tile_traits<TYPE>::supported) {
                if (mm_takes_staged(args.n_batch, args.n)) {
                    const unsigned ctas = (unsigned)args.n_ctas;
                    if (mm_tile_bulk()) {
                        switch (mm_tile_tiles<TYPE>(args.n_batch)) {
                        case 1: return mm_start_tile_bulk<TYPE, 1>(ctas, stream, args);
                        case 2: return mm_start_tile_bulk<TYPE, 2>(ctas, stream, args);
                        case 3: return mm_start_tile_bulk<TYPE, mm_tile_traits<TYPE>::max_tiles < 3 ? 1 : 3>(ctas, stream, args);
                        default: return mm_start_tile_bulk<TYPE, mm_tile_traits<TYPE>::max_tiles < 4 ? 1 : 4>(ctas, stream, args);
                        }
                    }
                    switch (mm_tile_tiles<TYPE>(args.n_batch)) {
                    case 1: return mm_start(mm_tile_kernel<TYPE, 1>, ctas, stream, args);
                    case 2: return mm_start(mm_tile_kernel<TYPE, 2>, ctas, stream, args);
                    case 3: return mm_start(mm_tile_kernel<TYPE, mm_tile_traits<TYPE>::max_tiles < 3 ? 1 : 3>, ctas, stream, args);
                    default: return mm_start(mm_tile_kernel<TYPE, mm_tile_traits<TYPE>::max_tiles < 4 ? 1 : 4>, ctas, stream, args);
                    }
                }
            }
            if constexpr (mm_mma_traits<TYPE>::supported) {
                if (args.n_batch >= 2) switch (mm_mma_tiles<TYPE>(args.n_batch)) {
                case 1: return mm_start(mm_mma_kernel<TYPE, 1>, grid, stream, args);
                case 2: return mm_start(mm_mma_kernel<TYPE, 2>, grid, stream, args);
                case 3: return mm_start(mm_mma_kernel<TYPE, mm_mma_traits<TYPE>::max_tiles < 3 ? 1 : 3>, grid, stream, args);
                default: return mm_start(mm_mma_kernel<TYPE, mm_mma_traits<TYPE>::max_tiles < 4 ? 1 : 4>, grid, stream, args);
                }
            }
        }
    }
    if (args.n_batch == 1) {
        if constexpr (TYPE == SPECLA_TYPE_Q4_K || TYPE == SPECLA_TYPE_Q6_K) {
            cudaError_t err = cudaSuccess;
            if (mm_try_ring<TYPE>(stream, args, nullptr, &err)) return err;
        }
        return mm_start_dp4a(mm_kernel<TYPE, 1>, stream, args);
    } else if (args.n_batch == 2)
        return mm_start_dp4a(mm_kernel<TYPE, 2>, stream, args);
    else if (args.n_batch <= 4)
        return mm_start_dp4a(mm_kernel<TYPE, 4>, stream, args);
    else
        return mm_start_dp4a(mm_kernel<TYPE, 8>, stream, args);
}

static cudaError_t mm_launch(cudaStream_t stream, int32_t type, const mm_launch_args &args) {
    switch (type) {
    case SPECLA_TYPE_F32: return mm_launch_type<SPECLA_TYPE_F32>(stream, args);
    case SPECLA_TYPE_F16: return mm_launch_type<SPECLA_TYPE_F16>(stream, args);
    case SPECLA_TYPE_BF16: return mm_launch_type<SPECLA_TYPE_BF16>(stream, args);
    case SPECLA_TYPE_Q8_0: return mm_launch_type<SPECLA_TYPE_Q8_0>(stream, args);
    case SPECLA_TYPE_Q4_0: return mm_launch_type<SPECLA_TYPE_Q4_0>(stream, args);
    case SPECLA_TYPE_Q5_0: return mm_launch_type<SPECLA_TYPE_Q5_0>(stream, args);
    case SPECLA_TYPE_Q4_K: return mm_launch_type<SPECLA_TYPE_Q4_K>(stream, args);
    case SPECLA_TYPE_Q5_K: return mm_launch_type<SPECLA_TYPE_Q5_K>(stream, args);
    case SPECLA_TYPE_Q6_K: return mm_launch_type<SPECLA_TYPE_Q6_K>(stream, args);
    default: return cudaErrorNotSupported;
    }
}

/* One launch for a group's Q4_K and Q6_K matrices (mm_pair_kernel, mm_tile_bulk_pair_kernel):
 * cuda_matmul_set_pair_launch's forms (the CUDA backend sets them from SPECLA_CUDA_PAIR_LAUNCH).
 * Both forms by default: on an H100 the launch boundary removed was worth more than the occupancy
 * the Q4_K share loses (docs/perf.md, thirty-third pass). The bits are the same either way. */
#define MM_PAIR_DECODE CUDA_MATMUL_PAIR_DECODE
#define MM_PAIR_BATCH CUDA_MATMUL_PAIR_BATCH
static int g_pair_launch = MM_PAIR_DECODE | MM_PAIR_BATCH;
extern "C" void cuda_matmul_set_pair_launch(int forms) { g_pair_launch = forms & (MM_PAIR_DECODE | MM_PAIR_BATCH); }
extern "C" int cuda_matmul_pair_launch(void) { return g_pair_launch; }
/* The pair form a call of n_batch tokens over n inputs takes, where its two types' own launches
 * would run the kernels the pair kernels are made of (mm_launch_type): MM_PAIR_DECODE, MM_PAIR_BATCH
 * or 0 (two launches). */
static int mm_pair_form(int n_batch, int64_t n) {
    if (n_batch == 1) return g_pair_launch & MM_PAIR_DECODE;
    if ((g_pair_launch & MM_PAIR_BATCH) && mm_takes_staged(n_batch, n) && mm_tile_bulk()) return MM_PAIR_BATCH;
    return 0;
}
template <int NT> static cudaError_t mm_start_tile_bulk_pair(cudaStream_t stream, const mm_launch_args &a, const mm_launch_args &b) {
#if defined(SPECLA_USE_HIP)
    (void)stream, (void)a, (void)b;
    return cudaErrorNotSupported; /* mm_tile_bulk() is 0 there */
#else
    constexpr int smem = mm_tile_bulk_pair_smem_bytes<SPECLA_TYPE_Q4_K, SPECLA_TYPE_Q6_K, NT>();
    static const cudaError_t attr_err = cudaFuncSetAttribute(
        mm_tile_bulk_pair_kernel<SPECLA_TYPE_Q4_K, SPECLA_TYPE_Q6_K, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (attr_err != cudaSuccess) return attr_err;
    return mm_start_smem(mm_tile_bulk_pair_kernel<SPECLA_TYPE_Q4_K, SPECLA_TYPE_Q6_K, NT>, (unsigned)(a.n_ctas + b.n_ctas),
                         MM_THREADS, smem, stream, a, b);
#endif
}
/* a: the Q4_K matrices, b: the Q6_K ones */
static cudaError_t mm_launch_pair(cudaStream_t stream, int form, const mm_launch_args &a, const mm_launch_args &b) {
    if (form == MM_PAIR_DECODE) {
        cudaError_t err = cudaSuccess;
        if (mm_try_ring<SPECLA_TYPE_Q4_K>(stream, a, &b, &err)) return err;
        const int a_ctas = mm_dp4a_ctas(a), b_ctas = mm_dp4a_ctas(b);
        return mm_start_threads(mm_pair_kernel<SPECLA_TYPE_Q4_K, SPECLA_TYPE_Q6_K, 1>, (unsigned)(a_ctas + b_ctas),
                                MM_DP4A_THREADS, stream, a, b, a_ctas);
    }
    /* both types' tile counts agree: mm_tile_traits::max_tiles is 4 for each */
    switch (mm_tile_tiles<SPECLA_TYPE_Q4_K>(a.n_batch)) {
    case 1: return mm_start_tile_bulk_pair<1>(stream, a, b);
    case 2: return mm_start_tile_bulk_pair<2>(stream, a, b);
    case 3: return mm_start_tile_bulk_pair<3>(stream, a, b);
    default: return mm_start_tile_bulk_pair<4>(stream, a, b);
    }
}

static cudaError_t mm_quantize(cudaStream_t stream, const float *x, int n, int n_batch, int kind, uint8_t *ws,
                               const mm_workspace_layout &l, int zero_counters) {
    /* Q8_K blocks always come with their min operands (the staged tensor-core kernel's Q4_K input) */
    const int unit = kind == MM_ACT_Q8_K ? 256 : 32;
    const int64_t warps = kind == MM_ACT_FLOAT ? 0 : (int64_t)n_batch * (n / unit);
    const int64_t threads_for_blocks = warps * 32;
    const int n_counters = zero_counters ? CUDA_MATMUL_GROUP_LAUNCH * MM_MAX_COUNTERS : 0;
    const int64_t threads = threads_for_blocks > n_counters ? threads_for_blocks : n_counters;
    if (threads == 0) return cudaSuccess;
    const int64_t grid = (threads + MM_THREADS - 1) / MM_THREADS;
    int8_t *codes = (int8_t *)(ws + (kind == MM_ACT_Q8_K ? l.codes_q8_k : l.codes_q8_0));
    float *scales = (float *)(ws + (kind == MM_ACT_Q8_K ? l.scales_q8_k : l.scales_q8_0));
    uint8_t *minops = kind == MM_ACT_Q8_K ? ws + l.minops_q8_k : nullptr;
    return mm_start(mm_quantize_kernel, (unsigned)grid, stream, x, (int64_t)n, n_batch, kind, codes, scales,
                    (int16_t *)(ws + l.bsums_q8_k), minops, (unsigned *)(ws + l.counters), n_counters);
}

/* The F16/BF16 tensor-core path's activation terms of x for weight `type` (a CTA per token), and,
 * when it is the call's first kernel, the zeroing of the arrival counters. */
static cudaError_t mm_split(cudaStream_t stream, int32_t type, const float *x, int n, int n_batch, uint8_t *ws,
                            const mm_workspace_layout &l, int zero_counters) {
    const int n_counters = zero_counters ? CUDA_MATMUL_GROUP_LAUNCH * MM_MAX_COUNTERS : 0;
    uint16_t *split = (uint16_t *)(ws + l.split);
    float *inv_scale = (float *)(ws + l.inv_scale);
    unsigned *counters = (unsigned *)(ws + l.counters);
    if (type == SPECLA_TYPE_F16)
        return mm_start_threads(mm_split_kernel<SPECLA_TYPE_F16>, (unsigned)n_batch, MM_SPLIT_THREADS, stream, x,
                                (int64_t)n, n_batch, split, inv_scale, counters, n_counters);
    return mm_start_threads(mm_split_kernel<SPECLA_TYPE_BF16>, (unsigned)n_batch, MM_SPLIT_THREADS, stream, x,
                            (int64_t)n, n_batch, split, inv_scale, counters, n_counters);
}

extern "C" cudaError_t cuda_matmul_quantize_activations(cudaStream_t stream, int32_t weight_type, const float *x,
                                                        int n_batch, int n, int8_t *codes, float *scales,
                                                        int16_t *bsums) {
    const int kind = mm_act_kind(weight_type);
    if (!mm_supported(weight_type) || kind == MM_ACT_FLOAT) return cudaErrorNotSupported;
    const int unit = kind == MM_ACT_Q8_K ? 256 : 32;
    if (n_batch < 1 || n < unit || n % unit != 0 || !x || !codes || !scales || (kind == MM_ACT_Q8_K && !bsums))
        return cudaErrorInvalidValue;
    const int64_t grid = ((int64_t)n_batch * (n / unit) * 32 + MM_THREADS - 1) / MM_THREADS;
    cuda_launch(mm_quantize_kernel, dim3((unsigned)grid), dim3(MM_THREADS), 0, stream, x, n, n_batch, kind, codes,
                scales, bsums, nullptr, nullptr, 0);
    mm_kernels_launched++;
    return cudaGetLastError();
}

/* cuda_matmul_group, and with sums non-NULL cuda_matmul_group_unfinished: then matrix i's partial sums
 * take workspace slot i (not its slot within its type's launch: a later launch of the call must not
 * overwrite them) and its kernel skips the finish. */
static cudaError_t mm_group(cudaStream_t stream, int n_mats, const specla_tensor *const *w, const float *x,
                            int n_batch, float *const *y, cuda_matmul_workspace ws, cuda_matmul_sums *sums,
                            void *pre_buffer = nullptr, size_t pre_bytes = 0) {
    if (n_mats < 1 || n_batch < 1 || !w || !x || !y || !ws.data) return cudaErrorInvalidValue;
    if (sums && n_mats > CUDA_MATMUL_GROUP_LAUNCH) return cudaErrorInvalidValue;
    const int n = w[0] ? w[0]->ne0 : 0;
    int need_q8_0 = 0, need_q8_k = 0, need_split = 0;
    const int float_tc = mm_float_tensor_cores();
    for (int i = 0; i < n_mats; i++) {
        if (!w[i] || !w[i]->data || !y[i]) return cudaErrorInvalidValue;
        if (!mm_supported(w[i]->type)) return cudaErrorNotSupported;
        if (w[i]->ne0 != n || n <= 0 || w[i]->ne1 < 1 || n % mm_unit_elements(w[i]->type) != 0) return cudaErrorInvalidValue;
        need_q8_0 |= mm_act_kind(w[i]->type) == MM_ACT_Q8_0;
        need_q8_k |= mm_act_kind(w[i]->type) == MM_ACT_Q8_K;
        need_split |= float_tc && (w[i]->type == SPECLA_TYPE_F16 || w[i]->type == SPECLA_TYPE_BF16);
    }
    const mm_workspace_layout l = mm_workspace_for(n_batch, n);
    if (ws.bytes < l.total) return cudaErrorInvalidValue;
    uint8_t *base = (uint8_t *)ws.data;
    /* prequantized: the Q8_K blocks come from the buffer, and so do the counters (zero at rest) */
    const cuda_matmul_q8k pre = cuda_matmul_prequantized_blocks(pre_buffer, pre_bytes, (int64_t)n_batch * n);
    if (pre_buffer && !pre.codes) return cudaErrorInvalidValue;
    unsigned *counters = pre.codes ? (unsigned *)pre_buffer : (unsigned *)(base + l.counters);

    /* the first launch also zeroes the arrival counters: the quantize kernel, or the split kernel of
     * the F16/BF16 tensor-core path when there is nothing to quantize (then the split of the first of
     * those types runs first; a split runs just before its type's launches, the two types sharing
     * the workspace's terms in stream order) */
    cudaError_t err = cudaSuccess;
    int counters_zeroed = 0;
    if (pre.codes) {
        counters_zeroed = 1; /* the buffer's counters are zero at rest */
        if (need_q8_0) err = mm_quantize(stream, x, n, n_batch, MM_ACT_Q8_0, base, l, 0);
    } else {
        if (need_q8_k || need_q8_0 || !need_split) {
            err = mm_quantize(stream, x, n, n_batch, need_q8_k ? MM_ACT_Q8_K : need_q8_0 ? MM_ACT_Q8_0 : MM_ACT_FLOAT,
                              base, l, 1);
            counters_zeroed = 1;
        }
        if (err == cudaSuccess && need_q8_k && need_q8_0) err = mm_quantize(stream, x, n, n_batch, MM_ACT_Q8_0, base, l, 0);
    }
    if (err != cudaSuccess) return err;

    mm_acts act;
    act.x = x;
    act.codes = nullptr, act.scales = nullptr;
    act.bsums = pre.codes ? (const int16_t *)pre.bsums : (const int16_t *)(base + l.bsums_q8_k);
    act.minops = pre.codes ? (const uint8_t *)pre.minops : base + l.minops_q8_k;
    act.split = (const uint16_t *)(base + l.split), act.inv_scale = (const float *)(base + l.inv_scale);
    /* matrix i of the call joins `args` as its next matrix, taking the launch's slot `first_slot +
     * args.n_mats` of the counters and (without sums) of the partial sums */
    auto add_matrix = [&](mm_launch_args &args, int i, int first_slot) {
        const mm_plan p = mm_plan_for(w[i]->type, w[i]->ne0, w[i]->ne1);
        mm_mat_args &m = args.mat[args.n_mats];
        m.w = (const uint8_t *)w[i]->data;
        m.y = y[i];
        const int slot = sums ? i : first_slot + args.n_mats;
        m.partials = (float *)(base + l.partials) + (size_t)slot * n_batch * MM_MAX_PARTIALS_PER_TOKEN;
        if (sums) {
            m.unfinished = 1;
            sums[i].partials = p.n_chunks > 1 ? m.partials : nullptr;
            sums[i].n_chunks = p.n_chunks;
            sums[i].rows_padded = (int64_t)p.row_groups * MM_GROUP_ROWS;
        }
        m.counters = counters + (size_t)(first_slot + args.n_mats) * MM_MAX_COUNTERS;
        m.ne1 = w[i]->ne1, m.n_blocks = p.n_blocks, m.row_groups = p.row_groups;
        m.chunk_blocks = p.chunk_blocks, m.n_chunks = p.n_chunks;
        m.unit_begin = args.n_units;
        args.n_units += p.row_groups * p.n_chunks;
        m.cta_begin = args.n_ctas;
        args.n_ctas += mm_tile_ctas(p.row_groups, p.n_chunks);
        args.n_mats++;
    };
    auto point_act_at = [&](int32_t type) {
        const int kind = mm_act_kind(type);
        act.codes = (const int8_t *)(base + (kind == MM_ACT_Q8_K ? l.codes_q8_k : l.codes_q8_0));
        act.scales = (const float *)(base + (kind == MM_ACT_Q8_K ? l.scales_q8_k : l.scales_q8_0));
        if (kind == MM_ACT_Q8_K && pre.codes) act.codes = pre.codes, act.scales = pre.scales;
    };

    /* A group of Q4_K and Q6_K matrices in one launch where mm_pair_form says so: the Q4_K
     * matrices take slots 0.., the Q6_K ones the slots after them. */
    int paired = 0;
    {
        int n_q4k = 0, n_q6k = 0;
        for (int i = 0; i < n_mats; i++) n_q4k += w[i]->type == SPECLA_TYPE_Q4_K, n_q6k += w[i]->type == SPECLA_TYPE_Q6_K;
        const int form = n_q4k > 0 && n_q6k > 0 && n_q4k + n_q6k <= CUDA_MATMUL_GROUP_LAUNCH ? mm_pair_form(n_batch, n) : 0;
        if (form) {
            mm_launch_args a, b;
            memset(&a, 0, sizeof a), memset(&b, 0, sizeof b);
            for (int i = 0; i < n_mats; i++)
                if (w[i]->type == SPECLA_TYPE_Q4_K) add_matrix(a, i, 0);
            for (int i = 0; i < n_mats; i++)
                if (w[i]->type == SPECLA_TYPE_Q6_K) add_matrix(b, i, n_q4k);
            point_act_at(SPECLA_TYPE_Q4_K); /* Q6_K reads the same Q8_K blocks */
            a.n_batch = b.n_batch = n_batch, a.n = b.n = n, a.act = b.act = act;
            err = mm_launch_pair(stream, form, a, b);
            if (err != cudaSuccess) return err;
            paired = 1;
        }
    }

    static const int32_t type_order[] = {SPECLA_TYPE_Q4_K, SPECLA_TYPE_Q6_K, SPECLA_TYPE_Q5_K, SPECLA_TYPE_Q8_0,
                                         SPECLA_TYPE_Q4_0, SPECLA_TYPE_Q5_0, SPECLA_TYPE_F16, SPECLA_TYPE_BF16,
                                         SPECLA_TYPE_F32};
    for (int32_t type : type_order) {
        if (paired && (type == SPECLA_TYPE_Q4_K || type == SPECLA_TYPE_Q6_K)) continue;
        point_act_at(type);
        mm_launch_args args;
        memset(&args, 0, sizeof args);
        int split_done = 0; /* this type's terms are in the workspace */
        for (int i = 0; i <= n_mats; i++) {
            const int flush = i == n_mats || (args.n_mats == CUDA_MATMUL_GROUP_LAUNCH && w[i]->type == type);
            if (flush && args.n_mats > 0) {
                if (float_tc && (type == SPECLA_TYPE_F16 || type == SPECLA_TYPE_BF16) && !split_done) {
                    err = mm_split(stream, type, x, n, n_batch, base, l, !counters_zeroed);
                    if (err != cudaSuccess) return err;
                    counters_zeroed = 1, split_done = 1;
                }
                args.n_batch = n_batch, args.n = n, args.act = act;
                err = mm_launch(stream, type, args);
                if (err != cudaSuccess) return err;
                memset(&args, 0, sizeof args);
            }
            if (i == n_mats || w[i]->type != type) continue;
            add_matrix(args, i, 0);
        }
    }
    return cudaSuccess;
}

extern "C" cudaError_t cuda_matmul_group(cudaStream_t stream, int n_mats, const specla_tensor *const *w, const float *x,
                                         int n_batch, float *const *y, cuda_matmul_workspace ws) {
    return mm_group(stream, n_mats, w, x, n_batch, y, ws, nullptr);
}

extern "C" cudaError_t cuda_matmul_group_unfinished(cudaStream_t stream, int n_mats, const specla_tensor *const *w,
                                                    const float *x, int n_batch, float *const *y,
                                                    cuda_matmul_workspace ws, cuda_matmul_sums *sums) {
    if (!sums) return cudaErrorInvalidValue;
    return mm_group(stream, n_mats, w, x, n_batch, y, ws, sums);
}

extern "C" cudaError_t cuda_matmul_group_prequantized(cudaStream_t stream, int n_mats, const specla_tensor *const *w,
                                                      const float *x, int n_batch, float *const *y,
                                                      cuda_matmul_workspace ws, cuda_matmul_sums *sums, void *buffer,
                                                      size_t bytes) {
    if (!buffer) return cudaErrorInvalidValue;
    return mm_group(stream, n_mats, w, x, n_batch, y, ws, sums, buffer, bytes);
}

extern "C" cudaError_t cuda_matmul(cudaStream_t stream, const specla_tensor *w, const float *x, int n_batch, float *y,
                                   cuda_matmul_workspace ws) {
    return cuda_matmul_group(stream, 1, &w, x, n_batch, &y, ws);
}

#include "matmul_chain.cuh"
