/* AVX2/FMA matmul: y[b][o] = sum_i W[o][i] * x[b][i], the same arithmetic as the scalar oracle
 * (matmul_scalar.c documents both schemes and their orders).
 *
 * Work layout. Threads take contiguous ranges of output rows (static schedule). Each weight row is
 * read once per group of at most 64 batch rows, one 256-element chunk at a time (one K-quant block,
 * or eight 32-element blocks, fewer in a row's last chunk): the chunk is unpacked ONCE, then used
 * by every batch row of the group. So verifying k tokens reads the weights once, like decoding one.
 *
 * 8-bit activations (Q8_0, Q4_0, Q5_0, Q4_K, Q6_K). A chunk is unpacked to byte vectors the integer
 * multiply-add takes (_mm256_maddubs_epi16: unsigned bytes x signed bytes, adjacent pairs summed
 * into int16; _mm256_madd_epi16 then sums int16 pairs into int32 lanes, lane l = elements
 * 4l..4l+3):
 *   Q8_0 / Q4_0 / Q5_0: |w| as unsigned bytes and w's signs (the activation takes the sign of w,
 *     so |w| * sign(w) a = w a); madd with ones gives the eight s_l of the oracle, which go through
 *     the same float lanes (fma per block, then the fixed 8-lane sum).
 *   Q4_K: the nibbles (0..15) of each sub-block; madd with the sub-block's scale broadcast; isum and
 *     the mins term (bsums x mins) are exact int32 sums.
 *   Q6_K: the 6-bit levels unbiased (0..63); madd with the two group scales of each 32 elements;
 *     the bias is removed exactly as 32 * sum_k sc_k bsum_k.
 * Bounds: a pair sum is at most 2 * 128 * 127 (Q8_0), 2 * 63 * 127 (Q6_K) or 2 * 15 * 127 (Q4_K),
 * inside int16 (no maddubs saturation); the int32 sums stay below 2^31.
 *
 * Float activations (F32, F16, BF16, Q4_1, Q5_1, Q5_K): the chunk is dequantized (bit-identical to
 * the scalar oracle; F32 rows are read in place) and FMA'd: four 8-lane accumulators a0..a3 from +0,
 * element i into a[(i / 8) % 4] lane i % 8 in increasing i (a ragged tail padded with 0 * 0),
 * then y = the fixed sum of (a0 + a1) + (a2 + a3)'s lanes ((s0 + s4) + (s2 + s6)) + ((s1 + s5) +
 * (s3 + s7)). The scalar oracle sums these in one float sequentially, so for these types the two
 * kernel sets agree within fp tolerance, not bit for bit. */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "activation_q8.h"
#include "cpu_ops.h"
#include "element_types.h"
#include "weight_unpack_avx2.h"

#define MATMUL_CHUNK 256

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* ================================ 8-bit activations ============================================ */


/* ---- Q8_0 / Q4_0 / Q5_0 ------------------------------------------------------------------------ */

/* One chunk into one batch row's eight float lanes (a = the row's activation blocks of the chunk). */
ALWAYS_INLINE __m256 accumulate_legacy_chunk(const legacy_chunk *wc, const act_q8_0 *a, __m256 acc) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int k = 0; k < wc->n_blocks; k++) {
        const __m256i signed_a = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)a[k].qs), wc->sign[k]);
        const __m256i lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(wc->magnitude[k], signed_a), ones);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(wc->d[k] * a[k].d), _mm256_cvtepi32_ps(lanes), acc);
    }
    return acc;
}

static void matmul_row_legacy(int32_t type, const specla_tensor *w, int64_t o, const act_q8_0 *acts, int n_batch,
                              float *y) {
    const int64_t n_blocks = w->ne0 / 32;
    const uint8_t *row = (const uint8_t *)w->data + o * type_row_bytes(type, w->ne0);
    legacy_chunk wc;
    __m256 acc[CPU_MATMUL_BATCH_GROUP];
    for (int b0 = 0; b0 < n_batch; b0 += CPU_MATMUL_BATCH_GROUP) {
        const int group = n_batch - b0 < CPU_MATMUL_BATCH_GROUP ? n_batch - b0 : CPU_MATMUL_BATCH_GROUP;
        for (int b = 0; b < group; b++) acc[b] = _mm256_setzero_ps();
        for (int64_t k0 = 0; k0 < n_blocks; k0 += 8) {
            prefetch_ahead(row + k0 * type_block_bytes(type));
            unpack_legacy_chunk(type, row, k0, n_blocks - k0 < 8 ? (int)(n_blocks - k0) : 8, &wc);
            for (int b = 0; b < group; b++)
                acc[b] = accumulate_legacy_chunk(&wc, acts + (int64_t)(b0 + b) * n_blocks + k0, acc[b]);
        }
        for (int b = 0; b < group; b++) y[(int64_t)(b0 + b) * w->ne1 + o] = hsum8_fixed(acc[b]);
    }
}

/* ---- Q4_K / Q6_K ------------------------------------------------------------------------------- */

/* Lane l: sum over the eight 32-element groups m of scale_m (int16, lane for lane) times elements
 * 32m + 4l .. 32m + 4l + 3 (unsigned levels times activation bytes), in exact int32. */
ALWAYS_INLINE __m256i scaled_lane_sums(const __m256i *levels, const __m256i *scale, const int8_t *qs) {
    __m256i sum = _mm256_setzero_si256();
    for (int m = 0; m < 8; m++) {
        const __m256i pairs = _mm256_maddubs_epi16(levels[m], _mm256_loadu_si256((const __m256i *)(qs + 32 * m)));
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, scale[m]));
    }
    return sum;
}

/* Q4_K. Lane l of sum: sum_j sc_j (elements 4l..4l+3 of sub-block j); lane l of the mins: m_l
 * (bsum_2l + bsum_2l+1). */
ALWAYS_INLINE __m256 accumulate_q4_k(const q4_k_unpacked *u, const act_q8_k *a, __m256 acc) {
    const __m256i sum = scaled_lane_sums(u->nibbles, u->scale, a->qs);
    const __m256i mins = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a->bsums), u->mins);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(a->d * u->d), _mm256_cvtepi32_ps(sum), acc);
    return _mm256_fmadd_ps(_mm256_set1_ps(-(a->d * u->dmin)), _mm256_cvtepi32_ps(mins), acc);
}

/* Q6_K. Lane l of sum: sum_m sc_{2m + (l >= 4)} (elements 32m + 4l .. +3), minus 32 (sc_2l bsum_2l
 * + sc_2l+1 bsum_2l+1): the levels' -32 removed exactly, lane by lane as the oracle does. */
ALWAYS_INLINE __m256 accumulate_q6_k(const q6_k_unpacked *u, const act_q8_k *a, __m256 acc) {
    const __m256i bias = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a->bsums), u->scales);
    const __m256i sum = _mm256_sub_epi32(scaled_lane_sums(u->levels, u->scale, a->qs), _mm256_slli_epi32(bias, 5));
    return _mm256_fmadd_ps(_mm256_set1_ps(a->d * u->d), _mm256_cvtepi32_ps(sum), acc);
}

/* ---- K-quant rows ------------------------------------------------------------------------------- */

ALWAYS_INLINE void matmul_row_k(int32_t type, const specla_tensor *w, int64_t o, const act_q8_k *acts, int n_batch,
                                float *y) {
    const int64_t n_blocks = w->ne0 / QK_K;
    const uint8_t *row = (const uint8_t *)w->data + o * type_row_bytes(type, w->ne0);
    __m256 acc[CPU_MATMUL_BATCH_GROUP];
    q4_k_unpacked u4;
    q6_k_unpacked u6;
    for (int b0 = 0; b0 < n_batch; b0 += CPU_MATMUL_BATCH_GROUP) {
        const int group = n_batch - b0 < CPU_MATMUL_BATCH_GROUP ? n_batch - b0 : CPU_MATMUL_BATCH_GROUP;
        for (int b = 0; b < group; b++) acc[b] = _mm256_setzero_ps();
        for (int64_t k = 0; k < n_blocks; k++) {
            const act_q8_k *a = acts + (int64_t)b0 * n_blocks + k;
            prefetch_ahead(row + k * (type == SPECLA_TYPE_Q4_K ? sizeof(block_q4_K) : sizeof(block_q6_K)));
            if (type == SPECLA_TYPE_Q4_K) {
                unpack_q4_k((const block_q4_K *)row + k, &u4);
                for (int b = 0; b < group; b++) acc[b] = accumulate_q4_k(&u4, a + (int64_t)b * n_blocks, acc[b]);
            } else {
                unpack_q6_k((const block_q6_K *)row + k, &u6);
                for (int b = 0; b < group; b++) acc[b] = accumulate_q6_k(&u6, a + (int64_t)b * n_blocks, acc[b]);
            }
        }
        for (int b = 0; b < group; b++) y[(int64_t)(b0 + b) * w->ne1 + o] = hsum8_fixed(acc[b]);
    }
}

/* ================================ float activations ============================================ */

static inline __m256i tail_mask(int lanes) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* Elements [0, len) of a dequantized chunk into one batch row's four accumulators. */
ALWAYS_INLINE void accumulate_float_chunk(const float *wq, int64_t len, const float *x, __m256 *a) {
    const int64_t full = len / 32 * 32;
    for (int64_t i = 0; i < full; i += 32) {
        a[0] = _mm256_fmadd_ps(_mm256_loadu_ps(wq + i + 0), _mm256_loadu_ps(x + i + 0), a[0]);
        a[1] = _mm256_fmadd_ps(_mm256_loadu_ps(wq + i + 8), _mm256_loadu_ps(x + i + 8), a[1]);
        a[2] = _mm256_fmadd_ps(_mm256_loadu_ps(wq + i + 16), _mm256_loadu_ps(x + i + 16), a[2]);
        a[3] = _mm256_fmadd_ps(_mm256_loadu_ps(wq + i + 24), _mm256_loadu_ps(x + i + 24), a[3]);
    }
    for (int64_t i = full; i < len; i += 8) { /* ragged tail: masked lanes add 0 * 0 */
        const __m256i mask = tail_mask(len - i < 8 ? (int)(len - i) : 8);
        const int k = (int)((i - full) / 8);
        a[k] = _mm256_fmadd_ps(_mm256_maskload_ps(wq + i, mask), _mm256_maskload_ps(x + i, mask), a[k]);
    }
}

static void matmul_row_float(const specla_tensor *w, int64_t o, const float *x, int n_batch, float *y) {
    const int32_t type = w->type;
    const int64_t n = w->ne0;
    const uint8_t *row = (const uint8_t *)w->data + o * type_row_bytes(type, n);
    const int64_t block_elements = type_block_elements(type), block_bytes = type_block_bytes(type);
    _Alignas(32) float chunk[MATMUL_CHUNK];
    __m256 acc[CPU_MATMUL_BATCH_GROUP][4];
    for (int b0 = 0; b0 < n_batch; b0 += CPU_MATMUL_BATCH_GROUP) {
        const int group = n_batch - b0 < CPU_MATMUL_BATCH_GROUP ? n_batch - b0 : CPU_MATMUL_BATCH_GROUP;
        for (int b = 0; b < group; b++) acc[b][0] = acc[b][1] = acc[b][2] = acc[b][3] = _mm256_setzero_ps();
        for (int64_t start = 0; start < n; start += MATMUL_CHUNK) {
            const int64_t len = n - start < MATMUL_CHUNK ? n - start : MATMUL_CHUNK;
            const float *wq = chunk;
            if (type == SPECLA_TYPE_F32)
                wq = (const float *)row + start; /* no copy */
            else
                cpu_dequantize_row_avx2(type, row + start / block_elements * block_bytes, len, chunk);
            for (int b = 0; b < group; b++)
                accumulate_float_chunk(wq, len, x + (int64_t)(b0 + b) * n + start, acc[b]);
        }
        for (int b = 0; b < group; b++) {
            const __m256 s = _mm256_add_ps(_mm256_add_ps(acc[b][0], acc[b][1]), _mm256_add_ps(acc[b][2], acc[b][3]));
            y[(int64_t)(b0 + b) * w->ne1 + o] = hsum8_fixed(s);
        }
    }
}

/* ================================ dispatch ===================================================== */

/* One specialised copy of the K-quant row loop per type (the type tests fold away). */
static void matmul_rows_q4_k(const specla_tensor *w, int64_t o, const void *acts, int n_batch, float *y) {
    matmul_row_k(SPECLA_TYPE_Q4_K, w, o, acts, n_batch, y);
}
static void matmul_rows_q6_k(const specla_tensor *w, int64_t o, const void *acts, int n_batch, float *y) {
    matmul_row_k(SPECLA_TYPE_Q6_K, w, o, acts, n_batch, y);
}
static void matmul_rows_legacy(const specla_tensor *w, int64_t o, const void *acts, int n_batch, float *y) {
    matmul_row_legacy(w->type, w, o, acts, n_batch, y);
}
static void matmul_rows_float(const specla_tensor *w, int64_t o, const void *x, int n_batch, float *y) {
    matmul_row_float(w, o, x, n_batch, y);
}

void cpu_matmul_avx2(const cpu_exec *ex, const specla_tensor *w, const float *x, int n_batch, float *y) {
    const int64_t n = w->ne0, n_rows = w->ne1;
    const int kind = act_kind_for_weight(w->type);
    const void *input = x;
    void *acts = NULL;
    if (kind != ACT_FLOAT) {
        acts = cpu_quantize_activations(ex, kind, x, n, n_batch);
        if (!acts) { /* out of memory: the output says so rather than lying */
            cpu_matmul_out_of_memory(w, n_batch, y);
            return;
        }
        input = acts;
    }
    void (*row_fn)(const specla_tensor *, int64_t, const void *, int, float *);
    switch (w->type) {
    case SPECLA_TYPE_Q4_K: row_fn = matmul_rows_q4_k; break;
    case SPECLA_TYPE_Q6_K: row_fn = matmul_rows_q6_k; break;
    case SPECLA_TYPE_Q8_0:
    case SPECLA_TYPE_Q4_0:
    case SPECLA_TYPE_Q5_0: row_fn = matmul_rows_legacy; break;
    default: row_fn = matmul_rows_float; break;
    }
    const int parallel = cpu_matmul_threaded(ex, w, n_batch);
#pragma omp parallel for if (parallel) num_threads(ex->n_threads) schedule(static)
    for (int64_t o = 0; o < n_rows; o++) row_fn(w, o, input, n_batch, y);
}
