/* The activation quantizers of the CUDA matmul, a warp per block: matmul.cu's quantize kernel runs
 * them on a call's input, and the ops whose output a matmul reads next (elementwise.cu's wide
 * add_rms_norm and silu_mul readers of partial sums) run the same functions on the values they have
 * just computed, so the matmul can skip its quantize kernel (cuda_matmul_group_prequantized). One
 * definition: whichever kernel quantizes, the codes, scales, bsums and min operands are the same
 * bytes, those of mm_quantize_q8_0_block / mm_quantize_q8_k_block (matmul_blocks.h). */
#ifndef SPECLA_CUDA_MATMUL_QUANTIZE_CUH
#define SPECLA_CUDA_MATMUL_QUANTIZE_CUH

#include "matmul_launch.h"

__device__ __forceinline__ float mm_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(MM_FULL_MASK, v, o));
    return v;
}
__device__ __forceinline__ int mm_warp_min_int(int v) {
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(MM_FULL_MASK, v, o));
    return v;
}

/* Q8_0: lane i holds element i (mm_quantize_q8_0_block spread over the warp). */
__device__ __forceinline__ void mm_warp_quantize_q8_0(const float *x, int8_t *codes, float *scale, int lane) {
    const float v = x[lane];
    const int finite = __all_sync(MM_FULL_MASK, mm_isfinite(v));
    const float amax = mm_warp_max(fabsf(v)); /* exact: a max of non-negative finite values */
    if (!finite) {
        codes[lane] = 0;
        if (lane == 0) *scale = mm_nan();
        return;
    }
    const float id = amax != 0.0f ? mm_div(127.0f, amax) : 0.0f;
    if (!mm_isfinite(id)) {
        codes[lane] = 0;
        if (lane == 0) *scale = 0.0f;
        return;
    }
    codes[lane] = (int8_t)mm_rint(mm_mul(v, id));
    if (lane == 0) *scale = mm_round_to_half(mm_div(amax, 127.0f));
}

/* Q8_K: lane l holds elements 8l..8l+7 of the block in v (mm_quantize_q8_k_block spread over the
 * warp); with minops, also the block's mm_min_operands. Every lane of the warp takes part. */
__device__ __forceinline__ void mm_warp_quantize_q8_k_values(const float (&v)[8], int8_t *codes, float *scale,
                                                             int16_t *bsums, uint8_t *minops, int lane) {
    int finite = 1;
    float amax = 0.0f;
    int first = 1 << 30; /* index of this lane's first element of largest magnitude */
    float first_value = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        finite &= mm_isfinite(v[j]);
        const float a = fabsf(v[j]);
        if (a > amax) amax = a, first = 8 * lane + j, first_value = v[j];
    }
    finite = __all_sync(MM_FULL_MASK, finite);
    const float block_amax = mm_warp_max(amax);
    /* the CPU keeps the first element (lowest index) whose magnitude is the block's largest */
    const int candidate = (amax == block_amax && block_amax != 0.0f) ? first : (1 << 30);
    const int winner = mm_warp_min_int(candidate);
    const float max = __shfl_sync(MM_FULL_MASK, first_value, (winner >> 3) & 31);
    const float iscale = block_amax != 0.0f ? mm_div(-127.0f, max) : 0.0f;
    int2 packed = make_int2(0, 0);
    int32_t sum = 0;
    const int zero = !finite || !mm_isfinite(iscale) || block_amax == 0.0f;
    if (!zero) {
        uint32_t lo = 0, hi = 0;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int32_t q = mm_rint(mm_mul(iscale, v[j]));
            q = q < 127 ? q : 127;
            sum += q;
            if (j < 4)
                lo |= (uint32_t)(uint8_t)(int8_t)q << (8 * j);
            else
                hi |= (uint32_t)(uint8_t)(int8_t)q << (8 * (j - 4));
        }
        packed = make_int2((int)lo, (int)hi);
    }
    *(int2 *)(codes + 8 * lane) = packed;
    sum += __shfl_xor_sync(MM_FULL_MASK, sum, 1); /* a group of 16 = lanes 2g, 2g + 1 */
    if ((lane & 1) == 0) bsums[lane / 2] = (int16_t)sum;
    /* pair j = bsum 2j + bsum 2j+1 = the sum of lanes 4j..4j+3, split as mm_min_operands does */
    const int32_t pair = sum + __shfl_xor_sync(MM_FULL_MASK, sum, 2);
    if (minops && (lane & 3) == 0) {
        minops[lane / 4] = (uint8_t)(pair & 127);
        minops[8 + lane / 4] = (uint8_t)(int8_t)(pair >> 7);
    }
    if (lane == 0) *scale = zero ? (finite ? 0.0f : mm_nan()) : mm_div(1.0f, iscale);
}

/* a lane's 8 elements as two quads, lo the first 4 */
__device__ __forceinline__ void mm_eight_of(float4 lo, float4 hi, float (&v)[8]) {
    v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
}

/* the same, the block read from x (16-byte aligned; global or shared memory) */
__device__ __forceinline__ void mm_warp_quantize_q8_k(const float *x, int8_t *codes, float *scale, int16_t *bsums,
                                                      uint8_t *minops, int lane) {
    float v[8];
    mm_eight_of(*(const float4 *)(x + 8 * lane), *(const float4 *)(x + 8 * lane + 4), v);
    mm_warp_quantize_q8_k_values(v, codes, scale, bsums, minops, lane);
}

/* Block blk of a prequantized input (cuda_matmul_q8k): elements 256 blk .. 256 blk + 255 of the
 * input read as one flat array, which is block k of token b for blk = b * (n / 256) + k (the quantize
 * kernel's indexing; every n is a multiple of 256 here) */
__device__ __forceinline__ void mm_warp_quantize_q8k_block(const cuda_matmul_q8k &q, const float (&v)[8], int64_t blk,
                                                           int lane) {
    mm_warp_quantize_q8_k_values(v, q.codes + blk * 256, q.scales + blk, q.bsums + blk * 16, q.minops + blk * 16,
                                 lane);
}
/* the same, the lane's elements as two quads (lo: 8 lane .. 8 lane + 3) */
__device__ __forceinline__ void mm_warp_quantize_q8k_block(const cuda_matmul_q8k &q, float4 lo, float4 hi, int64_t blk,
                                                           int lane) {
    float v[8];
    mm_eight_of(lo, hi, v);
    mm_warp_quantize_q8k_block(q, v, blk, lane);
}

#endif
