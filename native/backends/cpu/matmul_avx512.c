/* AVX-512 (F/BW/VL + VNNI) matmul for Q4_K / Q6_K batches: the same integers, lanes and float
 * operations as matmul_avx2.c (and the scalar oracle, matmul_scalar.c), so the same bits, with fewer
 * instructions per batch row: two 32-element weight vectors side by side in one 512-bit register
 * are multiplied with 64 activation bytes at once (vpmaddubsw), then scaled and accumulated in one
 * instruction (vpdpwssd: int16 pairs x scales into int32); the upper 256-bit half is finally added
 * onto the lower one in integers, which gives exactly the AVX2 kernel's eight lane sums.
 *
 * Used where it measured faster on the 2-core Xeon (Sapphire Rapids class) this was written on,
 * 1536 x 8960 weights, one thread, best of 25: Q4_K 16 rows 5.23 vs 5.76 ms, Q6_K 5.15 vs 6.76 ms;
 * one row (decode) 1.15 vs 1.00 ms, Q5_0 no gain. So: K-quant batches of at least
 * AVX512_MIN_BATCH rows; everything else runs the AVX2 kernel. Either way the bits are the same. */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>

#include "activation_q8.h"
#include "cpu_ops.h"
#include "tensor_types.h"
#include "weight_unpack_avx2.h"

#define MATMUL_BATCH_GROUP 64
#define MATMUL_PARALLEL_MIN_WORK (1 << 15)
#define AVX512_MIN_BATCH 4

#define ALWAYS_INLINE static inline __attribute__((always_inline))

ALWAYS_INLINE float hsum8_fixed(__m256 s) { /* ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)) */
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    const __m128 h = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

/* Two 256-bit halves side by side. */
ALWAYS_INLINE __m512i pair512(__m256i low, __m256i high) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
}

/* The integer lanes of the AVX2 kernel: lane l of the low half plus lane l of the high half. */
ALWAYS_INLINE __m256i fold_halves(__m512i v) {
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

/* ---- Q4_K / Q6_K ------------------------------------------------------------------------------- */

typedef struct k_pairs {
    __m512i levels[4]; /* elements 64q .. 64q + 63 as unsigned bytes */
    __m512i scale[4];  /* their int16 scales, lane for lane */
} k_pairs;

ALWAYS_INLINE void pair_q4_k(const q4_k_unpacked *u, k_pairs *p) {
    for (int q = 0; q < 4; q++) {
        p->levels[q] = pair512(u->nibbles[2 * q], u->nibbles[2 * q + 1]);
        p->scale[q] = pair512(u->scale[2 * q], u->scale[2 * q + 1]);
    }
}

ALWAYS_INLINE void pair_q6_k(const q6_k_unpacked *u, k_pairs *p) {
    for (int q = 0; q < 4; q++) {
        p->levels[q] = pair512(u->levels[2 * q], u->levels[2 * q + 1]);
        p->scale[q] = pair512(u->scale[2 * q], u->scale[2 * q + 1]);
    }
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
    q4_k_unpacked u4;
    q6_k_unpacked u6;
    k_pairs p;
    for (int b0 = 0; b0 < n_batch; b0 += MATMUL_BATCH_GROUP) {
        const int group = n_batch - b0 < MATMUL_BATCH_GROUP ? n_batch - b0 : MATMUL_BATCH_GROUP;
        for (int b = 0; b < group; b++) acc[b] = _mm256_setzero_ps();
        for (int64_t k = 0; k < n_blocks; k++) {
            const act_q8_k *a0 = acts + (int64_t)b0 * n_blocks + k;
            prefetch_ahead(row + k * (type == SPECLA_TYPE_Q4_K ? sizeof(block_q4_K) : sizeof(block_q6_K)));
            if (type == SPECLA_TYPE_Q4_K) {
                unpack_q4_k((const block_q4_K *)row + k, &u4);
                pair_q4_k(&u4, &p);
                for (int b = 0; b < group; b++) {
                    const act_q8_k *a = a0 + (int64_t)b * n_blocks;
                    const __m256i sum = scaled_lane_sums(&p, a->qs);
                    const __m256i mins = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a->bsums), u4.mins);
                    acc[b] = _mm256_fmadd_ps(_mm256_set1_ps(a->d * u4.d), _mm256_cvtepi32_ps(sum), acc[b]);
                    acc[b] = _mm256_fmadd_ps(_mm256_set1_ps(-(a->d * u4.dmin)), _mm256_cvtepi32_ps(mins), acc[b]);
                }
            } else {
                unpack_q6_k((const block_q6_K *)row + k, &u6);
                pair_q6_k(&u6, &p);
                for (int b = 0; b < group; b++) {
                    const act_q8_k *a = a0 + (int64_t)b * n_blocks;
                    const __m256i bias = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a->bsums), u6.scales);
                    const __m256i sum = _mm256_sub_epi32(scaled_lane_sums(&p, a->qs), _mm256_slli_epi32(bias, 5));
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
    if (row_fn == NULL || n_batch < AVX512_MIN_BATCH) {
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
