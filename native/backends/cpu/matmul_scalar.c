/* Scalar matmul: the oracle, and the dispatcher.
 *
 * y[b][o] = sum_i W[o][i] * x[b][i], with W[o][i] the dequantized weight (bit-identical to
 * cpu_dequantize_row_scalar). Summation order, per output element: ONE float accumulator starting at
 * +0.0f, adding W[o][i] * x[b][i] (a rounded product, then a rounded add: no FMA) for i = 0, 1, ...,
 * n-1 in order. Nothing in that order depends on n_batch, on the thread count or on which thread runs
 * the row, so the result is batch-invariant and reproducible bit for bit.
 *
 * Work layout: threads split the output rows (static schedule, contiguous ranges); each row is walked
 * chunk by chunk (256 elements = one K-quant block or eight blocks of 32: Q8_0, Q4_0, Q4_1, Q5_0,
 * Q5_1; fewer in the last chunk of a row that is not a multiple of 256), each chunk dequantized
 * once into a small buffer and used by every batch row of a group of at most 64. */
#include "cpu_ops.h"
#include "tensor_types.h"

#define MATMUL_CHUNK 256
#define MATMUL_BATCH_GROUP 64

static void matmul_row_scalar(const specla_tensor *w, int64_t o, const float *x, int n_batch, float *y) {
    const int64_t n = w->ne0;
    const int64_t row_bytes = type_row_bytes(w->type, n);
    const int64_t block_elements = type_block_elements(w->type);
    const int64_t block_bytes = type_block_bytes(w->type);
    const uint8_t *row = (const uint8_t *)w->data + o * row_bytes;
    float chunk[MATMUL_CHUNK];
    float acc[MATMUL_BATCH_GROUP];
    for (int b0 = 0; b0 < n_batch; b0 += MATMUL_BATCH_GROUP) {
        const int group = n_batch - b0 < MATMUL_BATCH_GROUP ? n_batch - b0 : MATMUL_BATCH_GROUP;
        for (int b = 0; b < group; b++) acc[b] = 0.0f;
        for (int64_t c = 0; c < n; c += MATMUL_CHUNK) {
            const int64_t len = n - c < MATMUL_CHUNK ? n - c : MATMUL_CHUNK;
            cpu_dequantize_row_scalar(w->type, row + c / block_elements * block_bytes, len, chunk);
            for (int b = 0; b < group; b++) {
                const float *xb = x + (int64_t)(b0 + b) * n + c;
                float sum = acc[b];
                for (int64_t i = 0; i < len; i++) sum += chunk[i] * xb[i];
                acc[b] = sum;
            }
        }
        for (int b = 0; b < group; b++) y[(int64_t)(b0 + b) * w->ne1 + o] = acc[b];
    }
}

void cpu_matmul_scalar(const cpu_exec *ex, const specla_tensor *w, const float *x, int n_batch, float *y) {
    const int64_t n_rows = w->ne1;
    /* Small products stay on the calling thread; the result does not depend on it either way. */
    const int parallel = (int64_t)w->ne0 * n_rows * n_batch >= (1 << 15) && ex->n_threads > 1;
#pragma omp parallel for if (parallel) num_threads(ex->n_threads) schedule(static)
    for (int64_t o = 0; o < n_rows; o++) matmul_row_scalar(w, o, x, n_batch, y);
}

void cpu_matmul(const cpu_exec *ex, const specla_tensor *w, const float *x, int n_batch, float *y) {
    if (ex->kernels == SPECLA_CPU_AVX2)
        cpu_matmul_avx2(ex, w, x, n_batch, y);
    else
        cpu_matmul_scalar(ex, w, x, n_batch, y);
}
