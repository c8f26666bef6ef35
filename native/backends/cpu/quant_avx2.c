/* AVX2 dequantization. Dequantization has no reductions, so this computes exactly the float32
 * operations of quant_scalar.c (and of gguf.quants.dequantize) on eight elements at a time and gives
 * the same bits: integer -> float conversions are exact, then the same multiplies and subtractions
 * in the same order, never an FMA (the file uses explicit mul/sub intrinsics and the library is
 * built with -ffp-contract=off). Block scales are widened with half_to_float, exactly as in the
 * scalar code. Compiled with -mavx2 -mfma -mf16c; called only when cpu_has_avx2_fma(). */
#include <immintrin.h>
#include <string.h>

#include "cpu_ops.h"
#include "element_types.h"
#include "weight_unpack_avx2.h"

/* Eight int32 lanes -> (scale * float(q)) - offset, stored to y[0..8). */
static inline void store_scaled_offset(float *y, __m256i q, __m256 scale, __m256 offset) {
    _mm256_storeu_ps(y, _mm256_sub_ps(_mm256_mul_ps(scale, _mm256_cvtepi32_ps(q)), offset));
}

/* 32 unsigned bytes (values already masked) -> y[0..32) = scale * q - offset. */
static inline void store_32_u8(float *y, __m256i bytes, __m256 scale, __m256 offset) {
    const __m128i lo = _mm256_castsi256_si128(bytes);
    const __m128i hi = _mm256_extracti128_si256(bytes, 1);
    store_scaled_offset(y + 0, _mm256_cvtepu8_epi32(lo), scale, offset);
    store_scaled_offset(y + 8, _mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)), scale, offset);
    store_scaled_offset(y + 16, _mm256_cvtepu8_epi32(hi), scale, offset);
    store_scaled_offset(y + 24, _mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)), scale, offset);
}

/* 8 signed int32 lanes -> y[0..8) = scale * float(q). */
static inline void store_scaled(float *y, __m256i q, __m256 scale) {
    _mm256_storeu_ps(y, _mm256_mul_ps(scale, _mm256_cvtepi32_ps(q)));
}

static void dequantize_q8_0(const block_q8_0 *blocks, int64_t n_blocks, float *dst) {
    for (int64_t b = 0; b < n_blocks; b++) {
        const __m256 d = _mm256_set1_ps(half_to_float(blocks[b].d));
        const __m256i q = _mm256_loadu_si256((const __m256i *)blocks[b].qs);
        const __m128i lo = _mm256_castsi256_si128(q);
        const __m128i hi = _mm256_extracti128_si256(q, 1);
        float *y = dst + b * QK8_0;
        /* gguf computes float(q) * d; the product is commutative, so scale * float(q) is the same. */
        store_scaled(y + 0, _mm256_cvtepi8_epi32(lo), d);
        store_scaled(y + 8, _mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)), d);
        store_scaled(y + 16, _mm256_cvtepi8_epi32(hi), d);
        store_scaled(y + 24, _mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)), d);
    }
}

/* The eight (d * sc) and (dmin * m) products of a Q4_K / Q5_K block, as in the scalar code. */
static inline void k_scales(const uint8_t *s, float d, float dmin, float *scale, float *offset) {
    for (int j = 0; j < 8; j++) {
        int sc, m;
        if (j < 4) {
            sc = s[j] & 63;
            m = s[j + 4] & 63;
        } else {
            sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
            m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        }
        scale[j] = d * (float)sc;
        offset[j] = dmin * (float)m;
    }
}

static void dequantize_q4_k(const block_q4_K *blocks, int64_t n_blocks, float *dst) {
    const __m256i low4 = _mm256_set1_epi8(15);
    for (int64_t b = 0; b < n_blocks; b++) {
        const block_q4_K *blk = &blocks[b];
        float scale[8], offset[8];
        k_scales(blk->scales, half_to_float(blk->d), half_to_float(blk->dmin), scale, offset);
        float *y = dst + b * QK_K;
        for (int p = 0; p < 4; p++) { /* pair p: sub-blocks 2p (low nibbles) and 2p+1 (high nibbles) */
            const __m256i q = _mm256_loadu_si256((const __m256i *)(blk->qs + 32 * p));
            const __m256i q_low = _mm256_and_si256(q, low4);
            const __m256i q_high = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
            store_32_u8(y + 64 * p, q_low, _mm256_set1_ps(scale[2 * p]), _mm256_set1_ps(offset[2 * p]));
            store_32_u8(y + 64 * p + 32, q_high, _mm256_set1_ps(scale[2 * p + 1]),
                        _mm256_set1_ps(offset[2 * p + 1]));
        }
    }
}

static void dequantize_q5_k(const block_q5_K *blocks, int64_t n_blocks, float *dst) {
    const __m256i low4 = _mm256_set1_epi8(15);
    const __m256i one = _mm256_set1_epi8(1);
    for (int64_t b = 0; b < n_blocks; b++) {
        const block_q5_K *blk = &blocks[b];
        float scale[8], offset[8];
        k_scales(blk->scales, half_to_float(blk->d), half_to_float(blk->dmin), scale, offset);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)blk->qh);
        float *y = dst + b * QK_K;
        for (int p = 0; p < 4; p++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(blk->qs + 32 * p));
            /* bit j of qh[l] -> 16 in byte l; the 16-bit shifts cannot carry across bytes once masked */
            const __m256i bit_low = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * p), one);
            const __m256i bit_high = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * p + 1), one);
            const __m256i q_low = _mm256_or_si256(_mm256_and_si256(q, low4), _mm256_slli_epi16(bit_low, 4));
            const __m256i q_high = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), low4),
                                                   _mm256_slli_epi16(bit_high, 4));
            store_32_u8(y + 64 * p, q_low, _mm256_set1_ps(scale[2 * p]), _mm256_set1_ps(offset[2 * p]));
            store_32_u8(y + 64 * p + 32, q_high, _mm256_set1_ps(scale[2 * p + 1]),
                        _mm256_set1_ps(offset[2 * p + 1]));
        }
    }
}

/* 32 signed bytes (q - 32) -> y[0..32); elements 0..15 use scale_a, 16..31 scale_b. */
static inline void store_32_i8(float *y, __m256i bytes, __m256 scale_a, __m256 scale_b) {
    const __m128i lo = _mm256_castsi256_si128(bytes);
    const __m128i hi = _mm256_extracti128_si256(bytes, 1);
    store_scaled(y + 0, _mm256_cvtepi8_epi32(lo), scale_a);
    store_scaled(y + 8, _mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)), scale_a);
    store_scaled(y + 16, _mm256_cvtepi8_epi32(hi), scale_b);
    store_scaled(y + 24, _mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)), scale_b);
}

static void dequantize_q6_k(const block_q6_K *blocks, int64_t n_blocks, float *dst) {
    const __m256i bias = _mm256_set1_epi8(32);
    for (int64_t b = 0; b < n_blocks; b++) {
        const block_q6_K *blk = &blocks[b];
        const float d = half_to_float(blk->d);
        float scale[16];
        for (int k = 0; k < 16; k++) scale[k] = d * (float)blk->scales[k];
        __m256i levels[8];
        q6_k_levels(blk, levels);
        for (int m = 0; m < 8; m++) /* elements 32m..32m+31: scale groups 2m and 2m + 1 */
            store_32_i8(dst + b * QK_K + 32 * m, _mm256_sub_epi8(levels[m], bias), _mm256_set1_ps(scale[2 * m]),
                        _mm256_set1_ps(scale[2 * m + 1]));
    }
}

/* ---- Q4_0 / Q4_1 / Q5_0 / Q5_1: blocks of 32, element l < 16 in the low nibble of qs[l], element
 * l + 16 in its high nibble, bit 4 (Q5_x) in bit l of the little-endian 32-bit qh ---------------- */

/* legacy_nibbles / q5_0_fifth_bits (weight_unpack_avx2.h): the 32 levels in element order, and
 * 16 in byte l where bit l of the 32-bit qh is set. */

/* 32 unsigned bytes -> y[0..32) = (scale * float(q)) + offset, the Q4_1 / Q5_1 order. */
static inline void store_32_u8_plus(float *y, __m256i bytes, __m256 scale, __m256 offset) {
    const __m128i lo = _mm256_castsi256_si128(bytes);
    const __m128i hi = _mm256_extracti128_si256(bytes, 1);
    const __m256i q[4] = {_mm256_cvtepu8_epi32(lo), _mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)),
                          _mm256_cvtepu8_epi32(hi), _mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))};
    for (int g = 0; g < 4; g++)
        _mm256_storeu_ps(y + 8 * g, _mm256_add_ps(_mm256_mul_ps(scale, _mm256_cvtepi32_ps(q[g])), offset));
}

static void dequantize_q4_0(const block_q4_0 *blocks, int64_t n_blocks, float *dst) {
    for (int64_t b = 0; b < n_blocks; b++) {
        const __m256 d = _mm256_set1_ps(half_to_float(blocks[b].d));
        const __m256i q = _mm256_sub_epi8(legacy_nibbles(blocks[b].qs), _mm256_set1_epi8(8));
        store_32_i8(dst + b * QK4_0, q, d, d); /* d * float(q - 8) */
    }
}

static void dequantize_q4_1(const block_q4_1 *blocks, int64_t n_blocks, float *dst) {
    for (int64_t b = 0; b < n_blocks; b++) {
        store_32_u8_plus(dst + b * QK4_1, legacy_nibbles(blocks[b].qs), _mm256_set1_ps(half_to_float(blocks[b].d)),
                         _mm256_set1_ps(half_to_float(blocks[b].m)));
    }
}

static void dequantize_q5_0(const block_q5_0 *blocks, int64_t n_blocks, float *dst) {
    for (int64_t b = 0; b < n_blocks; b++) {
        const __m256 d = _mm256_set1_ps(half_to_float(blocks[b].d));
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(legacy_nibbles(blocks[b].qs), q5_0_fifth_bits(blocks[b].qh)),
                                          _mm256_set1_epi8(16));
        store_32_i8(dst + b * QK5_0, q, d, d); /* d * float(q - 16) */
    }
}

static void dequantize_q5_1(const block_q5_1 *blocks, int64_t n_blocks, float *dst) {
    for (int64_t b = 0; b < n_blocks; b++) {
        const __m256i q = _mm256_or_si256(legacy_nibbles(blocks[b].qs), q5_0_fifth_bits(blocks[b].qh));
        store_32_u8_plus(dst + b * QK5_1, q, _mm256_set1_ps(half_to_float(blocks[b].d)),
                         _mm256_set1_ps(half_to_float(blocks[b].m)));
    }
}

static void dequantize_f16(const specla_half *src, int64_t n, float *dst) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 f = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i)));
        if (_mm256_movemask_ps(_mm256_cmp_ps(f, f, _CMP_UNORD_Q)) == 0) {
            _mm256_storeu_ps(dst + i, f);
        } else { /* vcvtph2ps quiets signalling NaNs; keep the payload bits exactly as the oracle does */
            for (int l = 0; l < 8; l++) dst[i + l] = half_to_float(src[i + l]);
        }
    }
    for (; i < n; i++) dst[i] = half_to_float(src[i]);
}

static void dequantize_bf16(const specla_bf16 *src, int64_t n, float *dst) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
        _mm256_storeu_si256((__m256i *)(dst + i), _mm256_slli_epi32(h, 16));
    }
    for (; i < n; i++) dst[i] = bf16_to_float(src[i]);
}

void cpu_dequantize_row_avx2(int32_t type, const void *src, int64_t n, float *dst) {
    switch (type) {
    case SPECLA_TYPE_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case SPECLA_TYPE_F16: dequantize_f16(src, n, dst); break;
    case SPECLA_TYPE_BF16: dequantize_bf16(src, n, dst); break;
    case SPECLA_TYPE_Q4_0: dequantize_q4_0(src, n / QK4_0, dst); break;
    case SPECLA_TYPE_Q4_1: dequantize_q4_1(src, n / QK4_1, dst); break;
    case SPECLA_TYPE_Q5_0: dequantize_q5_0(src, n / QK5_0, dst); break;
    case SPECLA_TYPE_Q5_1: dequantize_q5_1(src, n / QK5_1, dst); break;
    case SPECLA_TYPE_Q8_0: dequantize_q8_0(src, n / QK8_0, dst); break;
    case SPECLA_TYPE_Q4_K: dequantize_q4_k(src, n / QK_K, dst); break;
    case SPECLA_TYPE_Q5_K: dequantize_q5_k(src, n / QK_K, dst); break;
    case SPECLA_TYPE_Q6_K: dequantize_q6_k(src, n / QK_K, dst); break;
    default: break; /* unreachable: types are validated at the boundary */
    }
}
