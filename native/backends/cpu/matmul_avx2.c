/* AVX2/FMA matmul: y[b][o] = sum_i W[o][i] * x[b][i] with float activations (x is never quantized).
 *
 * Work layout. Threads take contiguous ranges of output rows (static schedule). Each row is walked
 * once per group of at most 64 batch rows, one chunk of 256 elements at a time (one K-quant block,
 * eight blocks of a 32-element type (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1; fewer in a row's last chunk
 * when the row is not a multiple of 256), or 256 F32/F16/BF16 values). Each chunk is decoded ONCE into a 256-float stack
 * buffer and then used by every batch row of the group, so one pass over the weights serves up to 64
 * tokens. A group of one row (decode) skips the buffer: its levels go straight from the block into
 * the FMAs, the same operations in the same order (accumulate_chunk_direct).
 *
 * What is decoded, per type:
 *   - Q8_0, Q4_0, Q5_0, Q4_K, Q6_K (the decode-critical types; Q5_0 is most matrices of the
 *     Qwen2.5 0.5B draft) are decoded to their integer levels as floats,
 *     not to weights: the block scales are applied once per scale group to a partial dot product,
 *     (d*sc) * sum(q*x), and the Q4_K mins once per block as dmin*m times precomputed sums of x over
 *     each 32-element sub-block. This is the same sum regrouped; it saves a multiply (and for Q4_K a
 *     subtraction) per weight, which is most of the float work of the decode path.
 *   - F32 / F16 / BF16 / Q5_K / Q4_1 / Q5_1 are dequantized (cpu_dequantize_row_avx2, bit-identical
 *     to the scalar oracle) and FMA'd directly.
 *
 * Summation order of one output element (b, o) — fixed, and independent of n_batch, of the 64-row
 * grouping, of the thread count and of which thread runs the row, so the kernel is batch-invariant
 * (row b of y has the same bits whatever else is in the batch). Four 8-lane accumulators a0..a3 start
 * at +0; "t = q.x" below is an 8-lane partial dot: t = q[0:8]*x[0:8], then t = fma(q[8k:8k+8],
 * x[8k:8k+8], t) for k = 1, 2, ... in order. Blocks and elements are visited in increasing order.
 *   Q8_0, Q4_0, Q5_0  per block k (32 values): t = q.x over its 4 vectors, q the signed level
 *         (the int8 for Q8_0, nibble - 8 for Q4_0, 5-bit level - 16 for Q5_0);
 *         a[k % 2] = fma(d_k, t, a[k % 2]).
 *   Q4_K  per block, per nibble pair p = 0..3 (sub-blocks 2p and 2p+1, 32 bytes of qs):
 *         t_lo = q.x of sub-block 2p, t_hi = (16 q).x of sub-block 2p+1 (the high nibble kept in
 *         place, an exact power-of-two scaling), a0 = fma(d*sc_2p, t_lo, a0),
 *         a1 = fma((d*sc_{2p+1})/16, t_hi, a1); then once per block, lane j = sub-block j:
 *         a2 = fnmadd(dmin*m_j, sx_j, a2), sx_j = the sum of x over sub-block j computed by
 *         subblock_sums() (fixed order, a function of x alone).
 *   Q6_K  per block, per 16-element scale group k = 0..15: t = (q - 32).x over its 2 vectors;
 *         a[k % 4] = fma(d*sc_k, t, a[k % 4]).
 *   other element i: a[(i / 8) % 4] lane i % 8 = fma(W[o][i], x[b][i], ...) in increasing i; a
 *         ragged F32/F16/BF16 tail is padded with 0 * 0 terms.
 *   y[b][o] = hsum((a0 + a1) + (a2 + a3)), the 8 lanes s0..s7 summed as
 *   ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)).
 * The scalar oracle sums sequentially in one float, so the two kernels agree within fp tolerance, not
 * bit for bit. */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ops.h"
#include "tensor_types.h"

#define MATMUL_CHUNK 256
#define MATMUL_BATCH_GROUP 64
/* Below this many multiply-adds a matmul runs on the calling thread: waking the team costs more. */
#define MATMUL_PARALLEL_MIN_WORK (1 << 15)

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* Everything one chunk decodes to, shared by all batch rows of a group. */
typedef struct chunk_decoded {
    _Alignas(32) float q[MATMUL_CHUNK]; /* levels (Q8_0/Q4_0/Q5_0/Q4_K/Q6_K) or weights (others) */
    _Alignas(32) float scale[16];       /* per scale group (Q8_0/Q4_0/Q5_0: 8 blocks, Q4_K: 8, Q6_K: 16) */
    _Alignas(32) float min[8];          /* Q4_K: dmin * m per sub-block */
    const float *weights;               /* other types: the weights (q, or the F32 row itself) */
    int64_t len;                        /* elements in this chunk (256 except a row's last chunk) */
} chunk_decoded;

ALWAYS_INLINE float hsum_fixed(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    const __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1)); /* s0+s4 .. s3+s7 */
    const __m128 h = _mm_add_ps(q, _mm_movehl_ps(q, q)); /* (s0+s4)+(s2+s6), (s1+s5)+(s3+s7) */
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

/* sums[j] = x[32j] + ... + x[32j+31] for j < count, in a fixed order: lane-wise
 * (v0 + v1) + (v2 + v3) over the four 8-lane vectors, then the fixed 8-lane reduction. */
static void subblock_sums(const float *x, int64_t count, float *sums) {
    const __m256 zero = _mm256_setzero_ps();
    for (int64_t j = 0; j < count; j++) {
        const float *xj = x + 32 * j;
        const __m256 v = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(xj), _mm256_loadu_ps(xj + 8)),
                                       _mm256_add_ps(_mm256_loadu_ps(xj + 16), _mm256_loadu_ps(xj + 24)));
        sums[j] = hsum_fixed(v, zero, zero, zero);
    }
}

/* ---- block levels and scales (shared by the buffered and the direct path) ------------------------ */

/* Q8_0: levels q[8g .. 8g+8) of a block as floats. */
ALWAYS_INLINE __m256 q8_0_levels(const block_q8_0 *blk, int g) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk->qs + 8 * g))));
}

/* Q4_0 / Q5_0: the 32 signed levels of a block in element order (element l < 16 in the low nibble
 * of qs[l], l + 16 in its high nibble; Q5_0's fifth bit is bit l of the little-endian 32-bit qh).
 * The same unpacking as quant_avx2.c's nibbles_32 / fifth_bits_32 (kept here so these inline). */
ALWAYS_INLINE __m256i legacy_nibbles(const uint8_t *qs) {
    const __m128i q = _mm_loadu_si128((const __m128i *)qs);
    const __m128i low4 = _mm_set1_epi8(15);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), low4), _mm_and_si128(q, low4));
}

ALWAYS_INLINE __m256i q4_0_levels_i8(const block_q4_0 *blk) {
    return _mm256_sub_epi8(legacy_nibbles(blk->qs), _mm256_set1_epi8(8));
}

ALWAYS_INLINE __m256i q5_0_levels_i8(const block_q5_0 *blk) {
    uint32_t bits;
    memcpy(&bits, blk->qh, 4);
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)bits), _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                                                       2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i fifth = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(16));
    return _mm256_sub_epi8(_mm256_or_si256(legacy_nibbles(blk->qs), fifth), _mm256_set1_epi8(16));
}

/* Levels [8g, 8g+8) of 32 signed bytes as floats. */
ALWAYS_INLINE __m256 i8x32_levels(__m256i levels, int g) {
    const __m128i half = g < 2 ? _mm256_castsi256_si128(levels) : _mm256_extracti128_si256(levels, 1);
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32((g & 1) ? _mm_srli_si128(half, 8) : half));
}

/* The 32 signed levels and the scale of block k of a Q4_0 / Q5_0 run of blocks. */
ALWAYS_INLINE __m256i legacy_block(int32_t type, const uint8_t *blocks, int64_t k, float *d) {
    if (type == SPECLA_TYPE_Q4_0) {
        const block_q4_0 *blk = (const block_q4_0 *)blocks + k;
        *d = _cvtsh_ss(blk->d);
        return q4_0_levels_i8(blk);
    }
    const block_q5_0 *blk = (const block_q5_0 *)blocks + k;
    *d = _cvtsh_ss(blk->d);
    return q5_0_levels_i8(blk);
}

/* Q4_K: scale[j] = d * sc_j (divided by 16 for odd j, whose levels are decoded as 16 q: exact),
 * min[j] = dmin * m_j. */
ALWAYS_INLINE void q4_k_scales(const block_q4_K *blk, float *scale, float *min) {
    const float d = _cvtsh_ss(blk->d), dmin = _cvtsh_ss(blk->dmin);
    const uint8_t *s = blk->scales;
    for (int j = 0; j < 8; j++) {
        int sc, m;
        if (j < 4) {
            sc = s[j] & 63;
            m = s[j + 4] & 63;
        } else {
            sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
            m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        }
        scale[j] = (j & 1) ? d * (float)sc * 0.0625f : d * (float)sc;
        min[j] = dmin * (float)m;
    }
}

/* Q4_K: elements [8g, 8g+8) of sub-block 2p (q, low nibbles) and of sub-block 2p+1 (16 q, the high
 * nibbles masked in place), from bytes qs[32p + 8g .. +8). */
ALWAYS_INLINE void q4_k_levels(const block_q4_K *blk, int p, int g, __m256 *low_levels, __m256 *high_levels) {
    const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk->qs + 32 * p + 8 * g)));
    *low_levels = _mm256_cvtepi32_ps(_mm256_and_si256(bytes, _mm256_set1_epi32(0x0f)));
    *high_levels = _mm256_cvtepi32_ps(_mm256_and_si256(bytes, _mm256_set1_epi32(0xf0)));
}

/* Q6_K: scale[k] = d * sc_k for the 16 groups of 16; levels[i] = q_i - 32 in element order. */
ALWAYS_INLINE void q6_k_decode_int(const block_q6_K *blk, float *scale, int8_t *levels) {
    const float d = _cvtsh_ss(blk->d);
    for (int k = 0; k < 16; k++) scale[k] = d * (float)blk->scales[k];
    const __m256i low4 = _mm256_set1_epi8(15), low2 = _mm256_set1_epi8(3), bias = _mm256_set1_epi8(32);
    for (int half = 0; half < 2; half++) {
        const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(blk->ql + 64 * half));
        const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(blk->ql + 64 * half + 32));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk->qh + 32 * half));
        const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(qh, low2), 4);
        const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), low2), 4);
        const __m256i h2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), low2), 4);
        const __m256i h3 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), low2), 4);
        int8_t *out = levels + 128 * half;
        _mm256_store_si256((__m256i *)(out + 0),
                           _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(ql0, low4), h0), bias));
        _mm256_store_si256((__m256i *)(out + 32),
                           _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(ql1, low4), h1), bias));
        _mm256_store_si256(
            (__m256i *)(out + 64),
            _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), h2), bias));
        _mm256_store_si256(
            (__m256i *)(out + 96),
            _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4), h3), bias));
    }
}

ALWAYS_INLINE __m256 i8_levels(const int8_t *levels) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)levels)));
}

/* ---- decoding one chunk into the shared buffer -------------------------------------------------- */

ALWAYS_INLINE void decode_q8_0(const block_q8_0 *blocks, int64_t len, chunk_decoded *dc) {
    for (int64_t k = 0; k < len / QK8_0; k++) {
        dc->scale[k] = _cvtsh_ss(blocks[k].d);
        for (int g = 0; g < 4; g++) _mm256_store_ps(dc->q + 32 * k + 8 * g, q8_0_levels(&blocks[k], g));
    }
}

/* Q4_0 / Q5_0: blocks points at the chunk's first block. */
ALWAYS_INLINE void decode_legacy(int32_t type, const uint8_t *blocks, int64_t len, chunk_decoded *dc) {
    for (int64_t k = 0; k < len / 32; k++) {
        const __m256i levels = legacy_block(type, blocks, k, &dc->scale[k]);
        for (int g = 0; g < 4; g++) _mm256_store_ps(dc->q + 32 * k + 8 * g, i8x32_levels(levels, g));
    }
}

ALWAYS_INLINE void decode_q4_k(const block_q4_K *blk, chunk_decoded *dc) {
    q4_k_scales(blk, dc->scale, dc->min);
    for (int p = 0; p < 4; p++) {
        for (int g = 0; g < 4; g++) {
            __m256 low_levels, high_levels;
            q4_k_levels(blk, p, g, &low_levels, &high_levels);
            _mm256_store_ps(dc->q + 64 * p + 8 * g, low_levels);
            _mm256_store_ps(dc->q + 64 * p + 32 + 8 * g, high_levels);
        }
    }
}

ALWAYS_INLINE void decode_q6_k(const block_q6_K *blk, chunk_decoded *dc) {
    _Alignas(32) int8_t levels[QK_K];
    q6_k_decode_int(blk, dc->scale, levels);
    for (int i = 0; i < QK_K; i += 8) _mm256_store_ps(dc->q + i, i8_levels(levels + i));
}

/* Decodes chunk c (elements [256c, 256c + len)) of a row. */
ALWAYS_INLINE void decode_chunk(int32_t type, const uint8_t *row, int64_t c, int64_t len, chunk_decoded *dc) {
    dc->len = len;
    switch (type) {
    case SPECLA_TYPE_Q8_0: decode_q8_0((const block_q8_0 *)row + 8 * c, len, dc); break;
    case SPECLA_TYPE_Q4_0: decode_legacy(type, (const uint8_t *)((const block_q4_0 *)row + 8 * c), len, dc); break;
    case SPECLA_TYPE_Q5_0: decode_legacy(type, (const uint8_t *)((const block_q5_0 *)row + 8 * c), len, dc); break;
    case SPECLA_TYPE_Q4_K: decode_q4_k((const block_q4_K *)row + c, dc); break;
    case SPECLA_TYPE_Q6_K: decode_q6_k((const block_q6_K *)row + c, dc); break;
    case SPECLA_TYPE_F32: dc->weights = (const float *)row + MATMUL_CHUNK * c; break; /* no copy */
    default: {
        const int64_t block_elements = type_block_elements(type), block_bytes = type_block_bytes(type);
        cpu_dequantize_row_avx2(type, row + MATMUL_CHUNK * c / block_elements * block_bytes, len, dc->q);
        dc->weights = dc->q;
    }
    }
}

/* ---- one chunk into one batch row's accumulators ------------------------------------------------ */

ALWAYS_INLINE __m256 partial_dot(const float *q, const float *x, int n_vectors) {
    __m256 t = _mm256_mul_ps(_mm256_load_ps(q), _mm256_loadu_ps(x));
    for (int k = 1; k < n_vectors; k++) t = _mm256_fmadd_ps(_mm256_load_ps(q + 8 * k), _mm256_loadu_ps(x + 8 * k), t);
    return t;
}

static inline __m256i tail_mask(int lanes) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* x: this batch row at the chunk start; sx: its sub-block sums at the chunk start (Q4_K only). */
ALWAYS_INLINE void accumulate_chunk(int32_t type, const chunk_decoded *dc, const float *x, const float *sx,
                                    __m256 *a) {
    switch (type) {
    case SPECLA_TYPE_Q8_0:
    case SPECLA_TYPE_Q4_0:
    case SPECLA_TYPE_Q5_0:
        for (int64_t k = 0; k < dc->len / QK8_0; k++)
            a[k & 1] = _mm256_fmadd_ps(_mm256_set1_ps(dc->scale[k]), partial_dot(dc->q + 32 * k, x + 32 * k, 4),
                                       a[k & 1]);
        break;
    case SPECLA_TYPE_Q4_K:
        for (int p = 0; p < 4; p++) {
            const __m256 t_lo = partial_dot(dc->q + 64 * p, x + 64 * p, 4);
            const __m256 t_hi = partial_dot(dc->q + 64 * p + 32, x + 64 * p + 32, 4);
            a[0] = _mm256_fmadd_ps(_mm256_set1_ps(dc->scale[2 * p]), t_lo, a[0]);
            a[1] = _mm256_fmadd_ps(_mm256_set1_ps(dc->scale[2 * p + 1]), t_hi, a[1]);
        }
        a[2] = _mm256_fnmadd_ps(_mm256_load_ps(dc->min), _mm256_loadu_ps(sx), a[2]);
        break;
    case SPECLA_TYPE_Q6_K:
        for (int k = 0; k < 16; k++)
            a[k & 3] = _mm256_fmadd_ps(_mm256_set1_ps(dc->scale[k]), partial_dot(dc->q + 16 * k, x + 16 * k, 2),
                                       a[k & 3]);
        break;
    default: {
        const float *w = dc->weights;
        const int64_t len = dc->len, full = len / 32 * 32;
        for (int64_t i = 0; i < full; i += 32) {
            a[0] = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 0), _mm256_loadu_ps(x + i + 0), a[0]);
            a[1] = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a[1]);
            a[2] = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 16), _mm256_loadu_ps(x + i + 16), a[2]);
            a[3] = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 24), _mm256_loadu_ps(x + i + 24), a[3]);
        }
        for (int64_t i = full; i < len; i += 8) { /* ragged tail: masked lanes add 0 * 0 */
            const __m256i mask = tail_mask(len - i < 8 ? (int)(len - i) : 8);
            const int k = (int)((i - full) / 8);
            a[k] = _mm256_fmadd_ps(_mm256_maskload_ps(w + i, mask), _mm256_maskload_ps(x + i, mask), a[k]);
        }
    }
    }
}

/* ---- one chunk straight from the blocks into ONE batch row's accumulators ------------------------
 * The decode path for a group of one row: exactly the operations of decode_chunk + accumulate_chunk
 * on the same values in the same order (so the same bits), without the round trip through the float
 * buffer. */
ALWAYS_INLINE void accumulate_chunk_direct(int32_t type, const uint8_t *row, int64_t c, int64_t len,
                                           chunk_decoded *dc, const float *x, const float *sx, __m256 *a) {
    switch (type) {
    case SPECLA_TYPE_Q8_0: {
        const block_q8_0 *blocks = (const block_q8_0 *)row + 8 * c;
        for (int64_t k = 0; k < len / QK8_0; k++) {
            const float *xk = x + 32 * k;
            __m256 t = _mm256_mul_ps(q8_0_levels(&blocks[k], 0), _mm256_loadu_ps(xk));
            for (int g = 1; g < 4; g++) t = _mm256_fmadd_ps(q8_0_levels(&blocks[k], g), _mm256_loadu_ps(xk + 8 * g), t);
            a[k & 1] = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(blocks[k].d)), t, a[k & 1]);
        }
        break;
    }
    case SPECLA_TYPE_Q4_0:
    case SPECLA_TYPE_Q5_0: {
        const uint8_t *blocks = type == SPECLA_TYPE_Q4_0 ? (const uint8_t *)((const block_q4_0 *)row + 8 * c)
                                                         : (const uint8_t *)((const block_q5_0 *)row + 8 * c);
        for (int64_t k = 0; k < len / 32; k++) {
            float d;
            const __m256i levels = legacy_block(type, blocks, k, &d);
            const float *xk = x + 32 * k;
            __m256 t = _mm256_mul_ps(i8x32_levels(levels, 0), _mm256_loadu_ps(xk));
            for (int g = 1; g < 4; g++) t = _mm256_fmadd_ps(i8x32_levels(levels, g), _mm256_loadu_ps(xk + 8 * g), t);
            a[k & 1] = _mm256_fmadd_ps(_mm256_set1_ps(d), t, a[k & 1]);
        }
        break;
    }
    case SPECLA_TYPE_Q4_K: {
        const block_q4_K *blk = (const block_q4_K *)row + c;
        q4_k_scales(blk, dc->scale, dc->min);
        for (int p = 0; p < 4; p++) {
            __m256 t_lo, t_hi, low_levels, high_levels;
            const float *xp = x + 64 * p;
            q4_k_levels(blk, p, 0, &low_levels, &high_levels);
            t_lo = _mm256_mul_ps(low_levels, _mm256_loadu_ps(xp));
            t_hi = _mm256_mul_ps(high_levels, _mm256_loadu_ps(xp + 32));
            for (int g = 1; g < 4; g++) {
                q4_k_levels(blk, p, g, &low_levels, &high_levels);
                t_lo = _mm256_fmadd_ps(low_levels, _mm256_loadu_ps(xp + 8 * g), t_lo);
                t_hi = _mm256_fmadd_ps(high_levels, _mm256_loadu_ps(xp + 32 + 8 * g), t_hi);
            }
            a[0] = _mm256_fmadd_ps(_mm256_set1_ps(dc->scale[2 * p]), t_lo, a[0]);
            a[1] = _mm256_fmadd_ps(_mm256_set1_ps(dc->scale[2 * p + 1]), t_hi, a[1]);
        }
        a[2] = _mm256_fnmadd_ps(_mm256_load_ps(dc->min), _mm256_loadu_ps(sx), a[2]);
        break;
    }
    case SPECLA_TYPE_Q6_K: {
        _Alignas(32) int8_t levels[QK_K];
        q6_k_decode_int((const block_q6_K *)row + c, dc->scale, levels);
        for (int k = 0; k < 16; k++) {
            __m256 t = _mm256_mul_ps(i8_levels(levels + 16 * k), _mm256_loadu_ps(x + 16 * k));
            t = _mm256_fmadd_ps(i8_levels(levels + 16 * k + 8), _mm256_loadu_ps(x + 16 * k + 8), t);
            a[k & 3] = _mm256_fmadd_ps(_mm256_set1_ps(dc->scale[k]), t, a[k & 3]);
        }
        break;
    }
    default:
        decode_chunk(type, row, c, len, dc);
        accumulate_chunk(type, dc, x, sx, a);
    }
}

/* ---- rows -------------------------------------------------------------------------------------- */

typedef struct matmul_job {
    const specla_tensor *w;
    const float *x;
    const float *xsums; /* Q4_K: [n_batch][ne0 / 32] sub-block sums of x, or NULL: computed per chunk */
    int n_batch;
    float *y;
} matmul_job;

/* The sub-block sums of batch row b for chunk c: precomputed, or computed now into `scratch` (the same
 * function on the same x, so the same bits). */
ALWAYS_INLINE const float *chunk_sums(int32_t type, const matmul_job *job, int64_t b, int64_t c, float *scratch) {
    if (type != SPECLA_TYPE_Q4_K) return NULL;
    const int64_t n = job->w->ne0;
    if (job->xsums) return job->xsums + b * (n / 32) + 8 * c;
    subblock_sums(job->x + b * n + MATMUL_CHUNK * c, 8, scratch);
    return scratch;
}

ALWAYS_INLINE void matmul_row(int32_t type, const matmul_job *job, int64_t o) {
    const specla_tensor *w = job->w;
    const int64_t n = w->ne0;
    const uint8_t *row = (const uint8_t *)w->data + o * type_row_bytes(type, n);
    const int64_t n_chunks = (n + MATMUL_CHUNK - 1) / MATMUL_CHUNK;
    chunk_decoded dc;
    float sums_scratch[8];
    for (int b0 = 0; b0 < job->n_batch; b0 += MATMUL_BATCH_GROUP) {
        const int group = job->n_batch - b0 < MATMUL_BATCH_GROUP ? job->n_batch - b0 : MATMUL_BATCH_GROUP;
        if (group == 1) { /* decode: the accumulators live in registers */
            const float *xb = job->x + (int64_t)b0 * n;
            __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
            for (int64_t c = 0; c < n_chunks; c++) {
                const int64_t start = MATMUL_CHUNK * c;
                accumulate_chunk_direct(type, row, c, n - start < MATMUL_CHUNK ? n - start : MATMUL_CHUNK, &dc,
                                        xb + start, chunk_sums(type, job, b0, c, sums_scratch), a);
            }
            job->y[(int64_t)b0 * w->ne1 + o] = hsum_fixed(a[0], a[1], a[2], a[3]);
            continue;
        }
        __m256 acc[MATMUL_BATCH_GROUP][4];
        for (int b = 0; b < group; b++) acc[b][0] = acc[b][1] = acc[b][2] = acc[b][3] = _mm256_setzero_ps();
        for (int64_t c = 0; c < n_chunks; c++) {
            const int64_t start = MATMUL_CHUNK * c;
            decode_chunk(type, row, c, n - start < MATMUL_CHUNK ? n - start : MATMUL_CHUNK, &dc);
            for (int b = 0; b < group; b++) {
                __m256 a[4] = {acc[b][0], acc[b][1], acc[b][2], acc[b][3]};
                const float *xb = job->x + (int64_t)(b0 + b) * n;
                accumulate_chunk(type, &dc, xb + start, chunk_sums(type, job, b0 + b, c, sums_scratch), a);
                acc[b][0] = a[0], acc[b][1] = a[1], acc[b][2] = a[2], acc[b][3] = a[3];
            }
        }
        for (int b = 0; b < group; b++)
            job->y[(int64_t)(b0 + b) * w->ne1 + o] = hsum_fixed(acc[b][0], acc[b][1], acc[b][2], acc[b][3]);
    }
}

/* One specialised copy of the row loop per type (the switches above fold away). */
static void matmul_rows_q8_0(const matmul_job *job, int64_t o) { matmul_row(SPECLA_TYPE_Q8_0, job, o); }
static void matmul_rows_q4_0(const matmul_job *job, int64_t o) { matmul_row(SPECLA_TYPE_Q4_0, job, o); }
static void matmul_rows_q5_0(const matmul_job *job, int64_t o) { matmul_row(SPECLA_TYPE_Q5_0, job, o); }
static void matmul_rows_q4_k(const matmul_job *job, int64_t o) { matmul_row(SPECLA_TYPE_Q4_K, job, o); }
static void matmul_rows_q6_k(const matmul_job *job, int64_t o) { matmul_row(SPECLA_TYPE_Q6_K, job, o); }
static void matmul_rows_f32(const matmul_job *job, int64_t o) { matmul_row(SPECLA_TYPE_F32, job, o); }
static void matmul_rows_dequantized(const matmul_job *job, int64_t o) { matmul_row(job->w->type, job, o); }

void cpu_matmul_avx2(const cpu_exec *ex, const specla_tensor *w, const float *x, int n_batch, float *y) {
    const int64_t n = w->ne0, n_rows = w->ne1;
    matmul_job job = {w, x, NULL, n_batch, y};
    float *xsums = NULL;
    if (w->type == SPECLA_TYPE_Q4_K) {
        /* If this allocation fails the sums are recomputed per chunk: slower, same bits. */
        xsums = malloc(sizeof(float) * (size_t)n_batch * (size_t)(n / 32));
        if (xsums) {
            for (int64_t b = 0; b < n_batch; b++) subblock_sums(x + b * n, n / 32, xsums + b * (n / 32));
            job.xsums = xsums;
        }
    }
    void (*row_fn)(const matmul_job *, int64_t);
    switch (w->type) {
    case SPECLA_TYPE_Q8_0: row_fn = matmul_rows_q8_0; break;
    case SPECLA_TYPE_Q4_0: row_fn = matmul_rows_q4_0; break;
    case SPECLA_TYPE_Q5_0: row_fn = matmul_rows_q5_0; break;
    case SPECLA_TYPE_Q4_K: row_fn = matmul_rows_q4_k; break;
    case SPECLA_TYPE_Q6_K: row_fn = matmul_rows_q6_k; break;
    case SPECLA_TYPE_F32: row_fn = matmul_rows_f32; break;
    default: row_fn = matmul_rows_dequantized; break;
    }
    const int parallel = n * n_rows * n_batch >= MATMUL_PARALLEL_MIN_WORK && ex->n_threads > 1;
#pragma omp parallel for if (parallel) num_threads(ex->n_threads) schedule(static)
    for (int64_t o = 0; o < n_rows; o++) row_fn(&job, o);
    free(xsums);
}
