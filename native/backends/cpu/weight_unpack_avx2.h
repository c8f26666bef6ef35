/* What the AVX2 and AVX-512 matmuls (and the AVX2 dequantizer) share, each including this under
 * its own target flags: the weight stream's prefetch, the fixed 8-lane float sum that ends every
 * 8-bit-activation dot product, and the 256-bit weight unpackers (the byte vectors the integer
 * multiply-adds take; one unpacking per block and batch group, every batch row then reuses it;
 * matmul_avx2.c explains the vectors' use, matmul_avx512.c has its own 512-bit unpackers). */
#ifndef SPECLA_WEIGHT_UNPACK_AVX2_H
#define SPECLA_WEIGHT_UNPACK_AVX2_H
#include <immintrin.h>
#include <string.h>

#include "element_types.h"

#define UNPACK_INLINE static inline __attribute__((always_inline))

/* Decode streams the weights from memory once per token; each thread walks its rows in order, so
 * asking for the bytes PREFETCH_DISTANCE ahead (three cache lines: the size of a K-quant block)
 * keeps more loads in flight than the hardware prefetcher does on its own. */
#define PREFETCH_DISTANCE 1024 /* bytes; 1024..2048 measured best on the 2-core Xeon */
UNPACK_INLINE void prefetch_block(const uint8_t *p) { /* the three cache lines from p on */
    _mm_prefetch((const char *)p, _MM_HINT_T0);
    _mm_prefetch((const char *)(p + 64), _MM_HINT_T0);
    _mm_prefetch((const char *)(p + 128), _MM_HINT_T0);
}
UNPACK_INLINE void prefetch_ahead(const uint8_t *p) { prefetch_block(p + PREFETCH_DISTANCE); }

/* ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)) of one 8-lane vector: matmul_scalar.c's order. */
UNPACK_INLINE float hsum8_fixed(__m256 s) {
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1)); /* s0+s4 .. s3+s7 */
    const __m128 h = _mm_add_ps(q, _mm_movehl_ps(q, q)); /* (s0+s4)+(s2+s6), (s1+s5)+(s3+s7) */
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

/* ---- Q8_0 / Q4_0 / Q5_0: up to 8 blocks of 32 ----------------------------------------------- */

typedef struct legacy_chunk {
    __m256i magnitude[8]; /* |w| per block, as unsigned bytes */
    __m256i sign[8];      /* w itself: _mm256_sign_epi8 takes the sign from it */
    float d[8];
    int n_blocks;
} legacy_chunk;

/* The 32 signed levels of a Q4_0 / Q5_0 block in element order (element l < 16 in the low nibble
 * of qs[l], l + 16 in its high nibble; Q5_0's fifth bit is bit l of the little-endian 32-bit qh). */
UNPACK_INLINE __m256i legacy_nibbles(const uint8_t *qs) {
    const __m128i q = _mm_loadu_si128((const __m128i *)qs);
    const __m128i low4 = _mm_set1_epi8(15);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), low4), _mm_and_si128(q, low4));
}

UNPACK_INLINE __m256i q5_0_fifth_bits(const uint8_t *qh) {
    uint32_t bits;
    memcpy(&bits, qh, 4);
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)bits), _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                                                       2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(16));
}

UNPACK_INLINE void unpack_legacy_chunk(int32_t type, const uint8_t *row, int64_t first_block, int n_blocks,
                                       legacy_chunk *wc) {
    wc->n_blocks = n_blocks;
    for (int k = 0; k < n_blocks; k++) {
        __m256i levels;
        if (type == SPECLA_TYPE_Q8_0) {
            const block_q8_0 *blk = (const block_q8_0 *)row + first_block + k;
            levels = _mm256_loadu_si256((const __m256i *)blk->qs);
            wc->d[k] = _cvtsh_ss(blk->d);
        } else if (type == SPECLA_TYPE_Q4_0) {
            const block_q4_0 *blk = (const block_q4_0 *)row + first_block + k;
            levels = _mm256_sub_epi8(legacy_nibbles(blk->qs), _mm256_set1_epi8(8));
            wc->d[k] = _cvtsh_ss(blk->d);
        } else {
            const block_q5_0 *blk = (const block_q5_0 *)row + first_block + k;
            levels = _mm256_sub_epi8(_mm256_or_si256(legacy_nibbles(blk->qs), q5_0_fifth_bits(blk->qh)),
                                     _mm256_set1_epi8(16));
            wc->d[k] = _cvtsh_ss(blk->d);
        }
        wc->magnitude[k] = _mm256_abs_epi8(levels);
        wc->sign[k] = levels;
    }
}

/* ---- Q4_K ---------------------------------------------------------------------------------- */

typedef struct q4_k_unpacked {
    __m256i nibbles[8]; /* sub-block j's 32 levels (0..15) as unsigned bytes */
    __m256i scale[8];   /* sc_j in every int16 lane */
    __m256i mins;       /* m_0, m_0, m_1, m_1, ..., m_7, m_7 (int16): bsums 2j and 2j+1 belong to j */
    float d, dmin;
} q4_k_unpacked;

/* _mm256_shuffle_epi8 masks: int16 lane `lane` of a 128-bit half, in all eight int16 lanes. For Q4_K
 * (mask j: scale j in both halves) and Q6_K (mask m: scale 2m in the low half, 2m + 1 in the high). */
static const uint8_t broadcast_scale_q4_k[8][32] = {
#define B(j) {2 * (j), 2 * (j) + 1, 2 * (j), 2 * (j) + 1, 2 * (j), 2 * (j) + 1, 2 * (j), 2 * (j) + 1, \
              2 * (j), 2 * (j) + 1, 2 * (j), 2 * (j) + 1, 2 * (j), 2 * (j) + 1, 2 * (j), 2 * (j) + 1, \
              2 * (j), 2 * (j) + 1, 2 * (j), 2 * (j) + 1, 2 * (j), 2 * (j) + 1, 2 * (j), 2 * (j) + 1, \
              2 * (j), 2 * (j) + 1, 2 * (j), 2 * (j) + 1, 2 * (j), 2 * (j) + 1, 2 * (j), 2 * (j) + 1}
    B(0), B(1), B(2), B(3), B(4), B(5), B(6), B(7)
#undef B
};
static const uint8_t broadcast_scale_pair_q6_k[4][32] = {
#define B(m) {4 * (m), 4 * (m) + 1, 4 * (m), 4 * (m) + 1, 4 * (m), 4 * (m) + 1, 4 * (m), 4 * (m) + 1, \
              4 * (m), 4 * (m) + 1, 4 * (m), 4 * (m) + 1, 4 * (m), 4 * (m) + 1, 4 * (m), 4 * (m) + 1, \
              4 * (m) + 2, 4 * (m) + 3, 4 * (m) + 2, 4 * (m) + 3, 4 * (m) + 2, 4 * (m) + 3, 4 * (m) + 2, 4 * (m) + 3, \
              4 * (m) + 2, 4 * (m) + 3, 4 * (m) + 2, 4 * (m) + 3, 4 * (m) + 2, 4 * (m) + 3, 4 * (m) + 2, 4 * (m) + 3}
    B(0), B(1), B(2), B(3)
#undef B
};

/* A Q4_K block's 12 packed bytes -> sc_0..7 in bytes 0..7 and m_0..7 in bytes 8..15 (k_scale_min
 * for all eight sub-blocks at once, on 32-bit words). Shared with the AVX-512 matmul. */
UNPACK_INLINE __m128i q4_k_scales_mins(const block_q4_K *blk) {
    uint32_t w[4];
    memcpy(w, blk->scales, 12);
    const uint32_t low6 = 0x3f3f3f3fu, low4 = 0x0f0f0f0fu, top2 = 0x03030303u;
    w[3] = ((w[2] >> 4) & low4) | (((w[1] >> 6) & top2) << 4); /* m_4..7 */
    const uint32_t m0123 = w[1] & low6;
    w[1] = (w[2] & low4) | (((w[0] >> 6) & top2) << 4); /* sc_4..7 */
    w[2] = m0123;
    w[0] &= low6; /* sc_0..3 */
    return _mm_setr_epi32((int)w[0], (int)w[1], (int)w[2], (int)w[3]);
}

UNPACK_INLINE void unpack_q4_k(const block_q4_K *blk, q4_k_unpacked *u) {
    const __m128i packed = q4_k_scales_mins(blk);
    const __m256i scales16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(packed)); /* sc_0..7 as int16 */
    for (int j = 0; j < 8; j++)
        u->scale[j] = _mm256_shuffle_epi8(scales16, _mm256_loadu_si256((const __m256i *)broadcast_scale_q4_k[j]));
    const __m128i mins8 = _mm_srli_si128(packed, 8);
    u->mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mins8, mins8)); /* m_0, m_0, m_1, m_1, ... */
    const __m256i nibble = _mm256_set1_epi8(15);
    for (int p = 0; p < 4; p++) {
        const __m256i bytes = _mm256_loadu_si256((const __m256i *)(blk->qs + 32 * p));
        u->nibbles[2 * p] = _mm256_and_si256(bytes, nibble);
        u->nibbles[2 * p + 1] = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble);
    }
    u->d = _cvtsh_ss(blk->d);
    u->dmin = _cvtsh_ss(blk->dmin);
}

/* ---- Q6_K ---------------------------------------------------------------------------------- */

typedef struct q6_k_unpacked {
    __m256i levels[8]; /* elements 32m..32m+31 as unsigned 6-bit levels (0..63) */
    __m256i scale[8];  /* int16: sc_2m in lanes 0..7, sc_2m+1 in lanes 8..15 */
    __m256i scales;    /* the 16 scales as int16, for the bias term */
    float d;
} q6_k_unpacked;

/* The 256 six-bit levels (0..63, meaning q - 32) in element order: levels[m] = elements
 * 32m .. 32m + 31. Shared with the AVX2 dequantizer (quant_avx2.c). */
UNPACK_INLINE void q6_k_levels(const block_q6_K *blk, __m256i *levels) {
    const __m256i low4 = _mm256_set1_epi8(15), low2 = _mm256_set1_epi8(3);
    for (int half = 0; half < 2; half++) {
        const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(blk->ql + 64 * half));
        const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(blk->ql + 64 * half + 32));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk->qh + 32 * half));
        const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(qh, low2), 4);
        const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), low2), 4);
        const __m256i h2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), low2), 4);
        const __m256i h3 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), low2), 4);
        __m256i *out = levels + 4 * half;
        out[0] = _mm256_or_si256(_mm256_and_si256(ql0, low4), h0);
        out[1] = _mm256_or_si256(_mm256_and_si256(ql1, low4), h1);
        out[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), h2);
        out[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4), h3);
    }
}

UNPACK_INLINE void unpack_q6_k(const block_q6_K *blk, q6_k_unpacked *u) {
    q6_k_levels(blk, u->levels);
    const __m128i scale_bytes = _mm_loadu_si128((const __m128i *)blk->scales);
    u->scales = _mm256_cvtepi8_epi16(scale_bytes);
    const __m256i first8 = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(scale_bytes));
    const __m256i last8 = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_srli_si128(scale_bytes, 8)));
    for (int m = 0; m < 8; m++)
        u->scale[m] = _mm256_shuffle_epi8(m < 4 ? first8 : last8,
                                          _mm256_loadu_si256((const __m256i *)broadcast_scale_pair_q6_k[m & 3]));
    u->d = _cvtsh_ss(blk->d);
}

#endif
