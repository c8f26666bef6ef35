/* AVX2/FMA matmul: y[b][o] = sum_i W[o][i] * x[b][i] with float activations.
 *
 * Work layout: threads take contiguous ranges of output rows. Each row is walked once per group of
 * at most 64 batch rows, chunk by chunk (256 elements: one K-quant block or eight Q8_0 blocks); each
 * chunk is dequantized ONCE (cpu_dequantize_row_avx2, bit-identical to the scalar oracle) into a
 * stack buffer and then FMA'd into the accumulators of every batch row of the group, so one pass
 * over the weights serves up to 64 tokens.
 *
 * Summation order, per output element (b, o) — fixed, and independent of n_batch, of the batch
 * grouping, of the thread count and of which thread runs the row, so the kernel is batch-invariant:
 *   - 32 float lanes acc[k][l] (four 8-lane accumulators k = 0..3), all starting at +0;
 *   - element i goes to accumulator k = (i / 8) % 4, lane l = i % 8, by one fused multiply-add
 *     acc = fma(W[o][i], x[b][i], acc), in increasing i (a ragged tail of a row whose length is not
 *     a multiple of 8 — F32/F16/BF16 only — is padded with 0 * 0 terms);
 *   - at the end s = (acc[0] + acc[1]) + (acc[2] + acc[3]) lane-wise, then the eight lanes of s are
 *     summed as ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)).
 * This differs from the scalar oracle's single sequential accumulator (it is a different rounding of
 * the same sum), so the two kernels agree within fp tolerance, not bit for bit. */
#include <immintrin.h>

#include "cpu_ops.h"
#include "tensor_types.h"

#define MATMUL_CHUNK 256
#define MATMUL_BATCH_GROUP 64
/* Below this many multiply-adds a matmul runs on the calling thread: waking the team costs more. */
#define MATMUL_PARALLEL_MIN_WORK (1 << 15)

static inline float hsum_fixed(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    const __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1)); /* s0+s4 .. s3+s7 */
    const __m128 h = _mm_add_ps(q, _mm_movehl_ps(q, q)); /* (s0+s4)+(s2+s6), (s1+s5)+(s3+s7) */
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

static inline __m256i tail_mask(int lanes) {
    const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes), index);
}

/* acc[b][0..3] += W chunk (len elements at w) * x[b] chunk, for the batch rows of one group. */
static inline void chunk_fma(const float *w, int64_t len, const float *x, int64_t x_stride, int group,
                             __m256 (*acc)[4]) {
    const int64_t full = len / 32 * 32;
    for (int b = 0; b < group; b++) {
        const float *xb = x + b * x_stride;
        __m256 a0 = acc[b][0], a1 = acc[b][1], a2 = acc[b][2], a3 = acc[b][3];
        for (int64_t i = 0; i < full; i += 32) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 0), _mm256_loadu_ps(xb + i + 0), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(xb + i + 8), a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 16), _mm256_loadu_ps(xb + i + 16), a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 24), _mm256_loadu_ps(xb + i + 24), a3);
        }
        if (full < len) { /* ragged tail (F32/F16/BF16 rows only): masked lanes contribute 0 * 0 */
            __m256 tail[4] = {a0, a1, a2, a3};
            for (int64_t i = full; i < len; i += 8) {
                const int lanes = len - i < 8 ? (int)(len - i) : 8;
                const __m256i mask = tail_mask(lanes);
                const int k = (int)((i - full) / 8);
                tail[k] = _mm256_fmadd_ps(_mm256_maskload_ps(w + i, mask), _mm256_maskload_ps(xb + i, mask), tail[k]);
            }
            a0 = tail[0], a1 = tail[1], a2 = tail[2], a3 = tail[3];
        }
        acc[b][0] = a0, acc[b][1] = a1, acc[b][2] = a2, acc[b][3] = a3;
    }
}

static void matmul_row_avx2(const specla_tensor *w, int64_t o, const float *x, int n_batch, float *y) {
    const int64_t n = w->ne0;
    const int64_t row_bytes = type_row_bytes(w->type, n);
    const int64_t block_elements = type_block_elements(w->type);
    const int64_t block_bytes = type_block_bytes(w->type);
    const uint8_t *row = (const uint8_t *)w->data + o * row_bytes;
    _Alignas(32) float chunk[MATMUL_CHUNK];
    __m256 acc[MATMUL_BATCH_GROUP][4];
    for (int b0 = 0; b0 < n_batch; b0 += MATMUL_BATCH_GROUP) {
        const int group = n_batch - b0 < MATMUL_BATCH_GROUP ? n_batch - b0 : MATMUL_BATCH_GROUP;
        const float *xg = x + (int64_t)b0 * n;
        for (int b = 0; b < group; b++) acc[b][0] = acc[b][1] = acc[b][2] = acc[b][3] = _mm256_setzero_ps();
        for (int64_t c = 0; c < n; c += MATMUL_CHUNK) {
            const int64_t len = n - c < MATMUL_CHUNK ? n - c : MATMUL_CHUNK;
            const float *wc;
            if (w->type == SPECLA_TYPE_F32) {
                wc = (const float *)row + c; /* already floats: no copy */
            } else {
                cpu_dequantize_row_avx2(w->type, row + c / block_elements * block_bytes, len, chunk);
                wc = chunk;
            }
            chunk_fma(wc, len, xg + c, n, group, acc);
        }
        for (int b = 0; b < group; b++)
            y[(int64_t)(b0 + b) * w->ne1 + o] = hsum_fixed(acc[b][0], acc[b][1], acc[b][2], acc[b][3]);
    }
}

void cpu_matmul_avx2(const cpu_exec *ex, const specla_tensor *w, const float *x, int n_batch, float *y) {
    const int64_t n_rows = w->ne1;
    const int parallel = (int64_t)w->ne0 * n_rows * n_batch >= MATMUL_PARALLEL_MIN_WORK && ex->n_threads > 1;
#pragma omp parallel for if (parallel) num_threads(ex->n_threads) schedule(static)
    for (int64_t o = 0; o < n_rows; o++) matmul_row_avx2(w, o, x, n_batch, y);
}
