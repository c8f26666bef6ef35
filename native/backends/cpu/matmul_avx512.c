/* AVX-512 (F/BW/VL + VNNI) matmul for Q4_K / Q6_K: the same integers, lanes and float operations as
 * matmul_avx2.c (and the scalar oracle, matmul_scalar.c), so the same bits, with fewer instructions:
 * a block is unpacked straight into 512-bit registers holding two 32-element groups side by side
 * (elements 64q .. 64q + 63, so the activation bytes are one contiguous load), multiplied with 64
 * activation bytes at once (vpmaddubsw), then scaled and accumulated in one instruction (vpdpwssd:
 * int16 pairs x scales into int32); the upper 256-bit half is finally added onto the lower one in
 * integers, which gives exactly the AVX2 kernel's eight lane sums.
 *
 * Measured on the 2-core Xeon (Sapphire Rapids class) this was written on, real 1.5B weights
 * 1536 x 8960 / 8960 x 1536, one thread, best of 15 (AVX2 kernel -> this one): Q4_K one row
 * 1.00 -> 0.77 ms, five rows 2.26 -> 1.73 ms; Q6_K one row 1.02 -> 0.69 ms, five rows 2.81 -> 2.30 ms.
 * Other weight types run the AVX2 kernel; either way the bits are the same. */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "activation_q8.h"
#include "cpu_ops.h"
#include "tensor_types.h"
#include "weight_unpack_avx2.h"

#define MATMUL_BATCH_GROUP 64
#define MATMUL_PARALLEL_MIN_WORK (1 << 15)

#define ALWAYS_INLINE static inline __attribute__((always_inline))

ALWAYS_INLINE float hsum8_fixed(__m256 s) { /* ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)) */
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    const __m128 h = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

/* The integer lanes of the AVX2 kernel: lane l of the low half plus lane l of the high half. */
ALWAYS_INLINE __m256i fold_halves(__m512i v) {
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
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
    uint32_t w[4]; /* the 12 packed bytes -> sc_0..7 in bytes 0..7, m_0..7 in bytes 8..15 */
    memcpy(w, blk->scales, 12);
    const uint32_t low6 = 0x3f3f3f3fu, low4 = 0x0f0f0f0fu, top2 = 0x03030303u;
    w[3] = ((w[2] >> 4) & low4) | (((w[1] >> 6) & top2) << 4); /* m_4..7 */
    const uint32_t m0123 = w[1] & low6;
    w[1] = (w[2] & low4) | (((w[0] >> 6) & top2) << 4); /* sc_4..7 */
    w[2] = m0123;
    w[0] &= low6; /* sc_0..3 */
    const __m128i packed = _mm_setr_epi32((int)w[0], (int)w[1], (int)w[2], (int)w[3]);
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

ALWAYS_INLINE void matmul_row_k(int32_t type, const specla_tensor *w, int64_t o, const act_q8_k *acts, int n_batch,
                                float *y) {
    const int64_t n_blocks = w->ne0 / QK_K;
    const uint8_t *row = (const uint8_t *)w->data + o * type_row_bytes(type, w->ne0);
    __m256 acc[MATMUL_BATCH_GROUP];
    q4_k_block512 u4;
    q6_k_block512 u6;
    for (int b0 = 0; b0 < n_batch; b0 += MATMUL_BATCH_GROUP) {
        const int group = n_batch - b0 < MATMUL_BATCH_GROUP ? n_batch - b0 : MATMUL_BATCH_GROUP;
        for (int b = 0; b < group; b++) acc[b] = _mm256_setzero_ps();
        for (int64_t k = 0; k < n_blocks; k++) {
            const act_q8_k *a0 = acts + (int64_t)b0 * n_blocks + k;
            prefetch_ahead(row + k * (type == SPECLA_TYPE_Q4_K ? sizeof(block_q4_K) : sizeof(block_q6_K)));
            if (type == SPECLA_TYPE_Q4_K) {
                unpack_q4_k_512((const block_q4_K *)row + k, &u4);
                for (int b = 0; b < group; b++) {
                    const act_q8_k *a = a0 + (int64_t)b * n_blocks;
                    const __m256i sum = scaled_lane_sums(&u4.p, a->qs);
                    const __m256i mins = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a->bsums), u4.mins);
                    acc[b] = _mm256_fmadd_ps(_mm256_set1_ps(a->d * u4.d), _mm256_cvtepi32_ps(sum), acc[b]);
                    acc[b] = _mm256_fmadd_ps(_mm256_set1_ps(-(a->d * u4.dmin)), _mm256_cvtepi32_ps(mins), acc[b]);
                }
            } else {
                unpack_q6_k_512((const block_q6_K *)row + k, &u6);
                for (int b = 0; b < group; b++) {
                    const act_q8_k *a = a0 + (int64_t)b * n_blocks;
                    const __m256i bias = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a->bsums), u6.scales);
                    const __m256i sum = _mm256_sub_epi32(scaled_lane_sums(&u6.p, a->qs), _mm256_slli_epi32(bias, 5));
                    acc[b] = _mm256_fmadd_ps(_mm256_set1_ps(a->d * u6.d), _mm256_cvtepi32_ps(sum), acc[b]);
                }
            }
        }
        for (int b = 0; b < group; b++) y[(int64_t)(b0 + b) * w->ne1 + o] = hsum8_fixed(acc[b]);
    }
}

static void matmul_rows_q4_k(const specla_tensor *w, int64_t o, const void *acts, int n_batch, float *y) {
    matmul_row_k(SPECLA_TYPE_Q4_K, w, o, acts, n_batch, y);
}
static void matmul_rows_q6_k(const specla_tensor *w, int64_t o, const void *acts, int n_batch, float *y) {
    matmul_row_k(SPECLA_TYPE_Q6_K, w, o, acts, n_batch, y);
}

void cpu_matmul_avx512(const cpu_exec *ex, const specla_tensor *w, const float *x, int n_batch, float *y) {
    void (*row_fn)(const specla_tensor *, int64_t, const void *, int, float *);
    switch (w->type) {
    case SPECLA_TYPE_Q4_K: row_fn = matmul_rows_q4_k; break;
    case SPECLA_TYPE_Q6_K: row_fn = matmul_rows_q6_k; break;
    default: row_fn = NULL;
    }
    if (row_fn == NULL) {
        cpu_matmul_avx2(ex, w, x, n_batch, y);
        return;
    }
    const int64_t n = w->ne0, n_rows = w->ne1;
    void *acts = cpu_quantize_activations(act_kind_for_weight(w->type), x, n, n_batch);
    if (!acts) { /* out of memory: the output says so rather than lying */
        for (int64_t i = 0; i < (int64_t)n_batch * n_rows; i++) y[i] = NAN;
        return;
    }
    const int parallel = n * n_rows * n_batch >= MATMUL_PARALLEL_MIN_WORK && ex->n_threads > 1;
#pragma omp parallel for if (parallel) num_threads(ex->n_threads) schedule(static)
    for (int64_t o = 0; o < n_rows; o++) row_fn(w, o, acts, n_batch, y);
    free(acts);
}
