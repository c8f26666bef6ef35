/* AVX-512 (F/BW/VL + VNNI) matmul for Q4_K / Q6_K / Q8_0 / Q4_0 / Q5_0: the same integers, lanes
 * and float operations as matmul_avx2.c (and the scalar oracle, matmul_scalar.c), so the same bits,
 * with fewer instructions:
 *   K-quants: a block is unpacked straight into 512-bit registers holding two 32-element groups
 *     side by side (elements 64q .. 64q + 63, so the activation bytes are one contiguous load),
 *     multiplied with 64 activation bytes at once (vpmaddubsw), then scaled and accumulated in one
 *     instruction (vpdpwssd); the upper 256-bit half is finally added onto the lower one in
 *     integers, which gives exactly the AVX2 kernel's eight lane sums.
 *   Q8_0 / Q4_0 / Q5_0: two blocks per register as unsigned bytes w + offset, one vpdpbusd per two
 *     blocks starting from -offset * (activation lane sums, prepared once per matmul); each block
 *     then takes its own fma into the eight float lanes, in block order.
 * Output rows go ROWS_TOGETHER at a time, each (output row, batch row) with its own accumulator:
 * a decode step (one batch row) gets independent fma chains to overlap.
 *
 * Measured on the 2-core Xeon (Sapphire Rapids class) this was written on, one thread, real
 * weights, AVX2 kernel -> this one, interleaved runs, best of 10 (this VM's timings drift by up to
 * 30 % over minutes, so only side-by-side ratios mean much): 1.5B Q4_K 1536 x 8960 one row
 * 1.10 -> 0.88 ms, five rows 2.55 -> 1.96 ms; Q6_K 8960 x 1536 one row 1.08 -> 0.82 ms, five rows
 * 2.92 -> 1.94 ms; 0.5B Q5_0 896 x 4864 one row 0.66 -> 0.48 ms; its Q8_0 LM head (896 x 151936)
 * 23.3 -> 19.6 ms. Whole decode, 2 threads, median of 4 interleaved runs: 1.5B 9.1 -> 13.1 and
 * 0.5B 19.7 -> 22.1 tokens/s. Float-activation types run the AVX2 kernel. */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "activation_q8.h"
#include "cpu_ops.h"
#include "element_types.h"
#include "weight_unpack_avx2.h"

/* Output rows multiplied together: their accumulators are independent chains a decode step can
 * overlap (one row alone waits on its own fma latency). */
#define ROWS_TOGETHER 4

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* The integer lanes of the AVX2 kernel: lane l of the low half plus lane l of the high half. */
ALWAYS_INLINE __m256i fold_halves(__m512i v) {
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

/* Rows are read ROWS_TOGETHER at a time, so "ahead" is PREFETCH_DISTANCE along a long row, but
 * for short rows (the 0.5B's 896-wide LM head: 952 bytes) the same spot in the next group of rows:
 * PREFETCH_DISTANCE along a short row lands in a row that is already being read. */
ALWAYS_INLINE void prefetch_group_ahead(const uint8_t *p, size_t row_bytes) {
    if (row_bytes >= 2 * PREFETCH_DISTANCE)
        prefetch_ahead(p);
    else
        prefetch_block(p + ROWS_TOGETHER * row_bytes);
}

/* ---- Q4_K / Q6_K ------------------------------------------------------------------------------- */

/* One K-quant block as four 512-bit pairs of 32-element groups: pair q holds elements 64q .. 64q + 63
 * (the low 256 bits elements 64q .. 64q + 31), so its activation bytes are one contiguous load. */
typedef struct k_pairs {
    __m512i levels[4]; /* unsigned levels: Q4_K nibbles 0..15, Q6_K 0..63 (q - 32, the bias removed later) */
    __m512i scale[4];  /* the int16 scale of each level's group, lane for lane */
} k_pairs;

/* int16 lanes 16..31 of a 512-bit register: its upper 256 bits. */
#define UPPER_HALF_WORDS 0xFFFF0000u

/* vpermw indices: Q4_K pair q takes scale 2q in its low half and 2q + 1 in its high half (a
 * sub-block is 32 elements = 16 int16 lanes of maddubs pairs); Q6_K pair q takes scales 4q .. 4q + 3,
 * eight lanes each (a group is 16 elements). */
static const int16_t q4_k_scale_index[4][32] = {
#define I(q) {2 * (q), 2 * (q), 2 * (q), 2 * (q), 2 * (q), 2 * (q), 2 * (q), 2 * (q), \
              2 * (q), 2 * (q), 2 * (q), 2 * (q), 2 * (q), 2 * (q), 2 * (q), 2 * (q), \
              2 * (q) + 1, 2 * (q) + 1, 2 * (q) + 1, 2 * (q) + 1, 2 * (q) + 1, 2 * (q) + 1, 2 * (q) + 1, 2 * (q) + 1, \
              2 * (q) + 1, 2 * (q) + 1, 2 * (q) + 1, 2 * (q) + 1, 2 * (q) + 1, 2 * (q) + 1, 2 * (q) + 1, 2 * (q) + 1}
    I(0), I(1), I(2), I(3)
#undef I
};
static const int16_t q6_k_scale_index[4][32] = {
#define I(q) {4 * (q), 4 * (q), 4 * (q), 4 * (q), 4 * (q), 4 * (q), 4 * (q), 4 * (q), \
              4 * (q) + 1, 4 * (q) + 1, 4 * (q) + 1, 4 * (q) + 1, 4 * (q) + 1, 4 * (q) + 1, 4 * (q) + 1, 4 * (q) + 1, \
              4 * (q) + 2, 4 * (q) + 2, 4 * (q) + 2, 4 * (q) + 2, 4 * (q) + 2, 4 * (q) + 2, 4 * (q) + 2, 4 * (q) + 2, \
              4 * (q) + 3, 4 * (q) + 3, 4 * (q) + 3, 4 * (q) + 3, 4 * (q) + 3, 4 * (q) + 3, 4 * (q) + 3, 4 * (q) + 3}
    I(0), I(1), I(2), I(3)
#undef I
};

typedef struct q4_k_block512 {
    k_pairs p;
    __m256i mins; /* m_0, m_0, m_1, m_1, ..., m_7, m_7 (int16): bsums 2j and 2j+1 belong to m_j */
    float d, dmin;
} q4_k_block512;

/* Q4_K straight into 512-bit pairs: qs[32q .. 32q + 31] holds sub-block 2q in its low nibbles and
 * 2q + 1 in its high nibbles, so the 32 bytes go to both halves and only the upper half shifts. */
ALWAYS_INLINE void unpack_q4_k_512(const block_q4_K *blk, q4_k_block512 *u) {
    const __m128i packed = q4_k_scales_mins(blk); /* sc_0..7 in bytes 0..7, m_0..7 in bytes 8..15 */
    const __m512i scales16 = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(packed)); /* sc_0..7, m_0..7 */
    const __m512i nibble = _mm512_set1_epi8(15);
    for (int q = 0; q < 4; q++) {
        __m512i bytes = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk->qs + 32 * q)));
        bytes = _mm512_mask_srli_epi16(bytes, UPPER_HALF_WORDS, bytes, 4);
        u->p.levels[q] = _mm512_and_si512(bytes, nibble);
        u->p.scale[q] = _mm512_permutexvar_epi16(_mm512_loadu_si512(q4_k_scale_index[q]), scales16);
    }
    const __m128i mins8 = _mm_srli_si128(packed, 8);
    u->mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mins8, mins8));
    u->d = _cvtsh_ss(blk->d);
    u->dmin = _cvtsh_ss(blk->dmin);
}

typedef struct q6_k_block512 {
    k_pairs p;
    __m256i scales; /* the 16 scales as int16, for the bias term */
    float d;
} q6_k_block512;

/* Q6_K straight into 512-bit pairs: ql[64h .. 64h + 63] holds elements 128h .. 128h + 63 in its low
 * nibbles and 128h + 64 .. 128h + 127 in its high nibbles; qh[32h + l] carries the two top bits of
 * element 128h + l + 32s in bits 2s, 2s + 1 (s = 0..3). */
ALWAYS_INLINE void unpack_q6_k_512(const block_q6_K *blk, q6_k_block512 *u) {
    const __m512i low4 = _mm512_set1_epi8(15), low2 = _mm512_set1_epi8(3);
    for (int h = 0; h < 2; h++) {
        const __m512i ql = _mm512_loadu_si512((const void *)(blk->ql + 64 * h));
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk->qh + 32 * h)));
        const __m512i bits01 = _mm512_mask_srli_epi16(qh, UPPER_HALF_WORDS, qh, 2); /* s = 0 | s = 1 */
        const __m512i bits23 = _mm512_srli_epi16(bits01, 4);                       /* s = 2 | s = 3 */
        const __m512i high01 = _mm512_slli_epi16(_mm512_and_si512(bits01, low2), 4);
        const __m512i high23 = _mm512_slli_epi16(_mm512_and_si512(bits23, low2), 4);
        u->p.levels[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, low4), high01);
        u->p.levels[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4), high23);
    }
    u->scales = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)blk->scales));
    const __m512i scales16 = _mm512_castsi256_si512(u->scales);
    for (int q = 0; q < 4; q++)
        u->p.scale[q] = _mm512_permutexvar_epi16(_mm512_loadu_si512(q6_k_scale_index[q]), scales16);
    u->d = _cvtsh_ss(blk->d);
}

/* The AVX2 kernel's integer lane sums of sum_m madd(maddubs(levels_m, a_m), scale_m). */
ALWAYS_INLINE __m256i scaled_lane_sums(const k_pairs *p, const int8_t *qs) {
    __m512i sum = _mm512_setzero_si512();
    for (int q = 0; q < 4; q++) {
        const __m512i pairs = _mm512_maddubs_epi16(p->levels[q], _mm512_loadu_si512((const void *)(qs + 64 * q)));
        sum = _mm512_dpwssd_epi32(sum, pairs, p->scale[q]);
    }
    return fold_halves(sum);
}

ALWAYS_INLINE __m256 accumulate_q4_k_512(const q4_k_block512 *u, const act_q8_k *a, __m256 acc) {
    const __m256i sum = scaled_lane_sums(&u->p, a->qs);
    const __m256i mins = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a->bsums), u->mins);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(a->d * u->d), _mm256_cvtepi32_ps(sum), acc);
    return _mm256_fmadd_ps(_mm256_set1_ps(-(a->d * u->dmin)), _mm256_cvtepi32_ps(mins), acc);
}

ALWAYS_INLINE __m256 accumulate_q6_k_512(const q6_k_block512 *u, const act_q8_k *a, __m256 acc) {
    const __m256i bias = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a->bsums), u->scales);
    const __m256i sum = _mm256_sub_epi32(scaled_lane_sums(&u->p, a->qs), _mm256_slli_epi32(bias, 5));
    return _mm256_fmadd_ps(_mm256_set1_ps(a->d * u->d), _mm256_cvtepi32_ps(sum), acc);
}

/* Output rows o0 .. o0 + n_out - 1 (n_out <= ROWS_TOGETHER) for every batch row. Each (output row,
 * batch row) pair keeps its own accumulator and sees its blocks in order, so the bits do not depend
 * on how rows are grouped; the grouping gives a decode step independent chains to overlap. */
ALWAYS_INLINE void matmul_rows_k(int32_t type, const specla_tensor *w, int64_t o0, int n_out, const act_q8_k *acts,
                                 int n_batch, float *y) {
    const int64_t n_blocks = w->ne0 / QK_K;
    const size_t row_bytes = type_row_bytes(type, w->ne0);
    const size_t block_bytes = type == SPECLA_TYPE_Q4_K ? sizeof(block_q4_K) : sizeof(block_q6_K);
    const uint8_t *rows = (const uint8_t *)w->data + o0 * row_bytes;
    __m256 acc[ROWS_TOGETHER][CPU_MATMUL_BATCH_GROUP];
    q4_k_block512 u4[ROWS_TOGETHER];
    q6_k_block512 u6[ROWS_TOGETHER];
    for (int b0 = 0; b0 < n_batch; b0 += CPU_MATMUL_BATCH_GROUP) {
        const int group = n_batch - b0 < CPU_MATMUL_BATCH_GROUP ? n_batch - b0 : CPU_MATMUL_BATCH_GROUP;
        for (int r = 0; r < n_out; r++)
            for (int b = 0; b < group; b++) acc[r][b] = _mm256_setzero_ps();
        for (int64_t k = 0; k < n_blocks; k++) {
            for (int r = 0; r < n_out; r++) {
                const uint8_t *blk = rows + r * row_bytes + k * block_bytes;
                prefetch_group_ahead(blk, row_bytes);
                if (type == SPECLA_TYPE_Q4_K)
                    unpack_q4_k_512((const block_q4_K *)blk, &u4[r]);
                else
                    unpack_q6_k_512((const block_q6_K *)blk, &u6[r]);
            }
            for (int b = 0; b < group; b++) {
                const act_q8_k *a = acts + (int64_t)(b0 + b) * n_blocks + k;
                for (int r = 0; r < n_out; r++)
                    acc[r][b] = type == SPECLA_TYPE_Q4_K ? accumulate_q4_k_512(&u4[r], a, acc[r][b])
                                                         : accumulate_q6_k_512(&u6[r], a, acc[r][b]);
            }
        }
        for (int r = 0; r < n_out; r++)
            for (int b = 0; b < group; b++) y[(int64_t)(b0 + b) * w->ne1 + o0 + r] = hsum8_fixed(acc[r][b]);
    }
}

/* ---- Q8_0 / Q4_0 / Q5_0 -------------------------------------------------------------------------- */

/* Two 32-element blocks side by side per 512-bit register, as unsigned bytes u = w + offset (Q8_0
 * 128, Q4_0 8, Q5_0 16): vpdpbusd multiplies unsigned by signed bytes, and the offset comes back off
 * exactly as offset * (the same lanes of the activation bytes alone). Lane l of each half is then
 * the oracle's s_l = sum of w a over elements 4l .. 4l + 3 of its block, and each block still goes
 * through the eight float lanes on its own, in block order (two fma per register). */
typedef struct legacy_pairs {
    __m512i levels[4]; /* blocks 2p, 2p + 1 of the chunk; a missing last block is zero */
    float d[8];
    int n_blocks;
} legacy_pairs;

ALWAYS_INLINE int legacy_offset(int32_t type) {
    return type == SPECLA_TYPE_Q8_0 ? 128 : type == SPECLA_TYPE_Q4_0 ? 8 : 16;
}

/* Nibbles of one Q4_0 / Q5_0 block in element order (low nibbles = elements 0..15, high = 16..31)
 * for blocks `lo` and `hi`: 128-bit lanes [lo, lo, hi, hi], the odd lanes shifted down by four. */
ALWAYS_INLINE __m512i legacy_nibbles_512(const uint8_t *lo, const uint8_t *hi) {
    const __m128i hi_bytes = hi ? _mm_loadu_si128((const __m128i *)hi) : _mm_setzero_si128();
    const __m512i both = _mm512_castsi256_si512(_mm256_set_m128i(hi_bytes, _mm_loadu_si128((const __m128i *)lo)));
    __m512i lanes = _mm512_shuffle_i64x2(both, both, _MM_SHUFFLE(1, 1, 0, 0));
    lanes = _mm512_mask_srli_epi16(lanes, 0xFF00FF00u, lanes, 4);
    return _mm512_and_si512(lanes, _mm512_set1_epi8(15));
}

ALWAYS_INLINE void unpack_legacy_pairs(int32_t type, const uint8_t *row, int64_t first_block, int n_blocks,
                                       legacy_pairs *wc) {
    wc->n_blocks = n_blocks;
    for (int k = 0; k < n_blocks; k += 2) {
        const int has_hi = k + 1 < n_blocks;
        __m512i levels;
        if (type == SPECLA_TYPE_Q8_0) {
            const block_q8_0 *blk = (const block_q8_0 *)row + first_block + k;
            const __m256i hi = has_hi ? _mm256_loadu_si256((const __m256i *)blk[1].qs) : _mm256_set1_epi8(-128);
            levels = _mm512_xor_si512(
                _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)blk[0].qs)), hi, 1),
                _mm512_set1_epi8(-128)); /* w + 128 (a missing block: -128 + 128 = 0) */
            wc->d[k] = _cvtsh_ss(blk[0].d);
            if (has_hi) wc->d[k + 1] = _cvtsh_ss(blk[1].d);
        } else if (type == SPECLA_TYPE_Q4_0) {
            const block_q4_0 *blk = (const block_q4_0 *)row + first_block + k;
            levels = legacy_nibbles_512(blk[0].qs, has_hi ? blk[1].qs : NULL);
            wc->d[k] = _cvtsh_ss(blk[0].d);
            if (has_hi) wc->d[k + 1] = _cvtsh_ss(blk[1].d);
        } else {
            const block_q5_0 *blk = (const block_q5_0 *)row + first_block + k;
            uint32_t qh_lo, qh_hi = 0; /* bit l: the fifth bit of element l */
            memcpy(&qh_lo, blk[0].qh, 4);
            if (has_hi) memcpy(&qh_hi, blk[1].qh, 4);
            const __mmask64 fifth = (__mmask64)qh_lo | (__mmask64)qh_hi << 32;
            levels = _mm512_or_si512(legacy_nibbles_512(blk[0].qs, has_hi ? blk[1].qs : NULL),
                                     _mm512_maskz_mov_epi8(fifth, _mm512_set1_epi8(16)));
            wc->d[k] = _cvtsh_ss(blk[0].d);
            if (has_hi) wc->d[k + 1] = _cvtsh_ss(blk[1].d);
        }
        wc->levels[k / 2] = levels;
    }
}

/* The activation side of the legacy kernel, laid out once per matmul (every output row reuses it):
 * per batch row and block pair p, the 64 code bytes of blocks 2p, 2p + 1 in one register, and
 * -offset * (their four-byte lane sums), the term vpdpbusd starts from so that it ends on s_l. */
typedef struct legacy_acts {
    __m512i *codes;      /* [row * n_pairs + p] */
    __m512i *minus_bias; /* [row * n_pairs + p] */
    float *d;            /* [row * n_blocks + k]: the blocks' scales */
    int64_t n_pairs, n_blocks;
} legacy_acts;

/* Laid out in the workspace right after the activation blocks (cpu_matmul_workspace_bytes counts
 * both); 0 when the workspace is too small. */
static int build_legacy_acts(const cpu_exec *ex, const act_q8_0 *acts, int n_batch, int64_t n_blocks, int offset,
                             legacy_acts *out) {
    out->n_blocks = n_blocks;
    out->n_pairs = (n_blocks + 1) / 2;
    const size_t n_vectors = (size_t)n_batch * (size_t)out->n_pairs;
    const size_t vector_bytes = n_vectors * sizeof(__m512i);
    const size_t scale_bytes = ((size_t)n_batch * (size_t)n_blocks * sizeof(float) + 63) / 64 * 64;
    const size_t block_bytes = (sizeof(act_q8_0) * (size_t)n_blocks * (size_t)n_batch + 63) / 64 * 64;
    if (block_bytes + 2 * vector_bytes + scale_bytes > ex->ws->acts_bytes) return 0;
    out->codes = (__m512i *)((unsigned char *)ex->ws->acts + block_bytes);
    out->minus_bias = out->codes + n_vectors;
    out->d = (float *)(out->minus_bias + n_vectors);
    const __m512i offset_bytes = _mm512_set1_epi8((char)offset);
    for (int b = 0; b < n_batch; b++) {
        const act_q8_0 *a = acts + (int64_t)b * n_blocks;
        for (int64_t p = 0; p < out->n_pairs; p++) {
            const int64_t k = 2 * p;
            const __m256i low = _mm256_loadu_si256((const __m256i *)a[k].qs);
            const __m256i high = k + 1 < n_blocks ? _mm256_loadu_si256((const __m256i *)a[k + 1].qs)
                                                  : _mm256_setzero_si256();
            const __m512i codes = _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
            const __m512i bias = _mm512_dpbusd_epi32(_mm512_setzero_si512(), offset_bytes, codes);
            out->codes[b * out->n_pairs + p] = codes;
            out->minus_bias[b * out->n_pairs + p] = _mm512_sub_epi32(_mm512_setzero_si512(), bias);
        }
        for (int64_t k = 0; k < n_blocks; k++) out->d[b * n_blocks + k] = a[k].d;
    }
    return 1;
}

/* One chunk (first block k0, even) into batch row b's eight float lanes. */
ALWAYS_INLINE __m256 accumulate_legacy_pairs(const legacy_pairs *wc, const legacy_acts *acts, int64_t b, int64_t k0,
                                             __m256 acc) {
    const __m512i *codes = acts->codes + b * acts->n_pairs + k0 / 2;
    const __m512i *minus_bias = acts->minus_bias + b * acts->n_pairs + k0 / 2;
    const float *d = acts->d + b * acts->n_blocks + k0;
    for (int k = 0; k < wc->n_blocks; k += 2) {
        const __m512i lanes = _mm512_dpbusd_epi32(minus_bias[k / 2], wc->levels[k / 2], codes[k / 2]);
        const __m512 s = _mm512_cvtepi32_ps(lanes);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(wc->d[k] * d[k]), _mm512_castps512_ps256(s), acc);
        if (k + 1 < wc->n_blocks) {
            const __m256 s_high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(wc->d[k + 1] * d[k + 1]), s_high, acc);
        }
    }
    return acc;
}

/* Output rows o0 .. o0 + n_out - 1 for every batch row (see matmul_rows_k). */
ALWAYS_INLINE void matmul_rows_legacy(int32_t type, const specla_tensor *w, int64_t o0, int n_out,
                                      const legacy_acts *acts, int n_batch, float *y) {
    const int64_t n_blocks = w->ne0 / 32;
    const size_t row_bytes = type_row_bytes(type, w->ne0);
    const size_t block_bytes = type == SPECLA_TYPE_Q8_0 ? sizeof(block_q8_0)
                               : type == SPECLA_TYPE_Q4_0 ? sizeof(block_q4_0) : sizeof(block_q5_0);
    const uint8_t *rows = (const uint8_t *)w->data + o0 * row_bytes;
    legacy_pairs wc[ROWS_TOGETHER];
    __m256 acc[ROWS_TOGETHER][CPU_MATMUL_BATCH_GROUP];
    for (int b0 = 0; b0 < n_batch; b0 += CPU_MATMUL_BATCH_GROUP) {
        const int group = n_batch - b0 < CPU_MATMUL_BATCH_GROUP ? n_batch - b0 : CPU_MATMUL_BATCH_GROUP;
        for (int r = 0; r < n_out; r++)
            for (int b = 0; b < group; b++) acc[r][b] = _mm256_setzero_ps();
        for (int64_t k0 = 0; k0 < n_blocks; k0 += 8) {
            const int chunk = n_blocks - k0 < 8 ? (int)(n_blocks - k0) : 8;
            for (int r = 0; r < n_out; r++) {
                prefetch_group_ahead(rows + r * row_bytes + k0 * block_bytes, row_bytes);
                unpack_legacy_pairs(type, rows + r * row_bytes, k0, chunk, &wc[r]);
            }
            for (int b = 0; b < group; b++)
                for (int r = 0; r < n_out; r++)
                    acc[r][b] = accumulate_legacy_pairs(&wc[r], acts, b0 + b, k0, acc[r][b]);
        }
        for (int r = 0; r < n_out; r++)
            for (int b = 0; b < group; b++) y[(int64_t)(b0 + b) * w->ne1 + o0 + r] = hsum8_fixed(acc[r][b]);
    }
}

/* The threaded loop over groups of ROWS_TOGETHER output rows of the caller's w, acts, n_batch, y
 * (threaded when `parallel`): full groups get a constant row count (the loops over rows unroll), the
 * ragged last one the variable count. */
#define FOR_ROW_GROUPS(ROWS_FN, ...)                                                                     \
    do {                                                                                                 \
        const int64_t n_rows = w->ne1, n_groups = (n_rows + ROWS_TOGETHER - 1) / ROWS_TOGETHER;              \
        _Pragma("omp parallel for if (parallel) num_threads(ex->n_threads) schedule(static)")             \
        for (int64_t g = 0; g < n_groups; g++) {                                                         \
            const int64_t o0 = g * ROWS_TOGETHER;                                                        \
            if (n_rows - o0 >= ROWS_TOGETHER)                                                            \
                ROWS_FN(__VA_ARGS__, w, o0, ROWS_TOGETHER, acts, n_batch, y);                            \
            else                                                                                         \
                ROWS_FN(__VA_ARGS__, w, o0, (int)(n_rows - o0), acts, n_batch, y);                       \
        }                                                                                                \
    } while (0)

static void matmul_k_quant(const cpu_exec *ex, const specla_tensor *w, const act_q8_k *acts, int n_batch, float *y) {
    const int parallel = cpu_matmul_threaded(ex, w, n_batch);
    if (w->type == SPECLA_TYPE_Q4_K)
        FOR_ROW_GROUPS(matmul_rows_k, SPECLA_TYPE_Q4_K);
    else
        FOR_ROW_GROUPS(matmul_rows_k, SPECLA_TYPE_Q6_K);
}

static void matmul_legacy(const cpu_exec *ex, const specla_tensor *w, const act_q8_0 *quantized, int n_batch,
                          float *y) {
    legacy_acts prepared;
    if (!build_legacy_acts(ex, quantized, n_batch, w->ne0 / 32, legacy_offset(w->type), &prepared)) {
        cpu_matmul_out_of_memory(w, n_batch, y);
        return;
    }
    const legacy_acts *acts = &prepared;
    const int parallel = cpu_matmul_threaded(ex, w, n_batch);
    if (w->type == SPECLA_TYPE_Q8_0)
        FOR_ROW_GROUPS(matmul_rows_legacy, SPECLA_TYPE_Q8_0);
    else if (w->type == SPECLA_TYPE_Q4_0)
        FOR_ROW_GROUPS(matmul_rows_legacy, SPECLA_TYPE_Q4_0);
    else
        FOR_ROW_GROUPS(matmul_rows_legacy, SPECLA_TYPE_Q5_0);
}

void cpu_matmul_avx512(const cpu_exec *ex, const specla_tensor *w, const float *x, int n_batch, float *y) {
    const int kind = act_kind_for_weight(w->type);
    if (kind == ACT_FLOAT) {
        cpu_matmul_avx2(ex, w, x, n_batch, y);
        return;
    }
    void *acts = cpu_quantize_activations(ex, kind, x, w->ne0, n_batch);
    if (!acts) {
        cpu_matmul_out_of_memory(w, n_batch, y);
        return;
    }
    if (kind == ACT_Q8_K)
        matmul_k_quant(ex, w, acts, n_batch, y);
    else
        matmul_legacy(ex, w, acts, n_batch, y);
}
