/* Scalar matmul: the oracle, and the dispatcher. y[b][o] = sum_i W[o][i] * x[b][i].
 *
 * Two arithmetic schemes, chosen by the weight type (activation_q8.h says which and why):
 *
 * Float activations (F32, F16, BF16, Q4_1, Q5_1, Q5_K): W[o][i] is the dequantized weight
 * (bit-identical to cpu_dequantize_row_scalar). ONE float accumulator starting at +0.0f adds
 * W[o][i] * x[b][i] (a rounded product, then a rounded add: no FMA) for i = 0, 1, ..., n-1 in order.
 *
 * 8-bit activations: x[b] is first quantized to activation blocks (a[] below, with scale da); all
 * sums marked "integer" are exact int32 arithmetic, so their order does not matter; fma() is the
 * single-rounding fused multiply-add. Blocks are visited in increasing order.
 *   Q8_0 / Q4_0 / Q5_0, blocks of 32 with weight scale dw and signed levels w (the int8 for Q8_0,
 *     nibble - 8 for Q4_0, 5-bit level - 16 for Q5_0): eight float lanes acc[0..7] start at +0;
 *     per block: s_l = sum_{i<4} w[4l+i] a[4l+i] (integer) and acc[l] = fma(dw * da, s_l, acc[l]) for
 *     l = 0..7; finally y = ((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7)).
 *   Q4_K and Q6_K, blocks of 256: eight float lanes as above; per block two (Q4_K) or one (Q6_K)
 *     integer per lane, each going in with one fma, in the order given:
 *     Q4_K (d, dmin; sub-block j = elements 32j..32j+31 with 6-bit scale sc_j and min m_j, levels q
 *       in 0..15): s_l = sum_j sc_j sum_{i=4l..4l+3} q_{32j+i} a_{32j+i}, t_l = m_l (bsum_2l +
 *       bsum_2l+1); acc[l] = fma(da * d, s_l, acc[l]); acc[l] = fma(-(da * dmin), t_l, acc[l]).
 *     Q6_K (d; 16-element group k with int8 scale sc_k, levels q in 0..63 meaning q - 32):
 *       s_l = sum_{m<8} sc_{2m+(l>=4)} sum_{i=4l..4l+3} q_{32m+i} a_{32m+i}
 *             - 32 (sc_2l bsum_2l + sc_2l+1 bsum_2l+1);  acc[l] = fma(da * d, s_l, acc[l]).
 *     (Lane l sums whatever the AVX2 integer multiply-adds put in lane l; over the lanes these are
 *     exactly the block's dot product, and the split is fixed.) Then y = the same 8-lane sum.
 * The AVX2 kernels compute the same integers with SIMD and then these very float operations, so
 * for these types the two kernel sets agree bit for bit.
 *
 * Nothing in either order depends on n_batch, on the thread count or on which thread runs the row:
 * every row of y is batch-invariant and reproducible bit for bit.
 *
 * Work layout: threads split the output rows (static schedule, contiguous ranges); the float scheme
 * walks a row chunk by chunk (256 elements, fewer at the end), each chunk dequantized once for every
 * batch row of a group of at most 64. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "activation_q8.h"
#include "cpu_ops.h"
#include "element_types.h"

#define MATMUL_CHUNK 256

/* ---- float activations ------------------------------------------------------------------------ */

static void matmul_row_float(const specla_tensor *w, int64_t o, const float *x, int n_batch, float *y) {
    const int64_t n = w->ne0;
    const int64_t row_bytes = type_row_bytes(w->type, n);
    const int64_t block_elements = type_block_elements(w->type);
    const int64_t block_bytes = type_block_bytes(w->type);
    const uint8_t *row = (const uint8_t *)w->data + o * row_bytes;
    float chunk[MATMUL_CHUNK];
    float acc[CPU_MATMUL_BATCH_GROUP];
    for (int b0 = 0; b0 < n_batch; b0 += CPU_MATMUL_BATCH_GROUP) {
        const int group = n_batch - b0 < CPU_MATMUL_BATCH_GROUP ? n_batch - b0 : CPU_MATMUL_BATCH_GROUP;
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

/* ---- 8-bit activations ------------------------------------------------------------------------ */

/* The fixed 8-lane sum: ((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7)). */
static float hsum8(const float *acc) {
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

/* The 32 signed levels and the scale of block k of a Q8_0 / Q4_0 / Q5_0 row. */
static float legacy_block_levels(int32_t type, const uint8_t *row, int64_t k, int *levels) {
    if (type == SPECLA_TYPE_Q8_0) {
        const block_q8_0 *blk = (const block_q8_0 *)row + k;
        for (int i = 0; i < 32; i++) levels[i] = blk->qs[i];
        return half_to_float(blk->d);
    }
    if (type == SPECLA_TYPE_Q4_0) {
        const block_q4_0 *blk = (const block_q4_0 *)row + k;
        for (int i = 0; i < 16; i++) {
            levels[i] = (blk->qs[i] & 15) - 8;
            levels[i + 16] = (blk->qs[i] >> 4) - 8;
        }
        return half_to_float(blk->d);
    }
    const block_q5_0 *blk = (const block_q5_0 *)row + k;
    const uint32_t qh = (uint32_t)blk->qh[0] | (uint32_t)blk->qh[1] << 8 | (uint32_t)blk->qh[2] << 16 |
                        (uint32_t)blk->qh[3] << 24;
    for (int i = 0; i < 16; i++) {
        levels[i] = ((blk->qs[i] & 15) | (int)((qh >> i) & 1) << 4) - 16;
        levels[i + 16] = ((blk->qs[i] >> 4) | (int)((qh >> (i + 16)) & 1) << 4) - 16;
    }
    return half_to_float(blk->d);
}

static float dot_legacy_q8_0(int32_t type, const uint8_t *row, const act_q8_0 *a, int64_t n_blocks) {
    float acc[8] = {0};
    int levels[32];
    for (int64_t k = 0; k < n_blocks; k++) {
        const float dk = legacy_block_levels(type, row, k, levels) * a[k].d;
        for (int l = 0; l < 8; l++) {
            int s = 0;
            for (int i = 4 * l; i < 4 * l + 4; i++) s += levels[i] * a[k].qs[i];
            acc[l] = fmaf(dk, (float)s, acc[l]);
        }
    }
    return hsum8(acc);
}

static float dot_q4_k_q8_k(const block_q4_K *w, const act_q8_k *a, int64_t n_blocks) {
    float acc[8] = {0};
    for (int64_t k = 0; k < n_blocks; k++) {
        int sc[8], m[8];
        for (int j = 0; j < 8; j++) k_scale_min(w[k].scales, j, &sc[j], &m[j]);
        const float dd = a[k].d * half_to_float(w[k].d), dm = -(a[k].d * half_to_float(w[k].dmin));
        for (int l = 0; l < 8; l++) {
            int32_t s = 0;
            for (int j = 0; j < 8; j++) {
                const uint8_t *qs = w[k].qs + 32 * (j / 2);
                const int shift = 4 * (j % 2); /* sub-block 2p: low nibbles of qs[32p..], 2p+1: high */
                int32_t part = 0;
                for (int i = 4 * l; i < 4 * l + 4; i++) part += ((qs[i] >> shift) & 15) * a[k].qs[32 * j + i];
                s += sc[j] * part;
            }
            const int32_t t = m[l] * (a[k].bsums[2 * l] + a[k].bsums[2 * l + 1]);
            acc[l] = fmaf(dd, (float)s, acc[l]);
            acc[l] = fmaf(dm, (float)t, acc[l]);
        }
    }
    return hsum8(acc);
}

static float dot_q6_k_q8_k(const block_q6_K *w, const act_q8_k *a, int64_t n_blocks) {
    float acc[8] = {0};
    int levels[256];
    for (int64_t k = 0; k < n_blocks; k++) {
        for (int half = 0; half < 2; half++) { /* element order as in dequantization; unbiased 0..63 */
            const uint8_t *ql = w[k].ql + 64 * half, *qh = w[k].qh + 32 * half;
            int *out = levels + 128 * half;
            for (int l = 0; l < 32; l++) {
                out[l] = (ql[l] & 15) | ((qh[l] >> 0) & 3) << 4;
                out[l + 32] = (ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4;
                out[l + 64] = (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4;
                out[l + 96] = (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4;
            }
        }
        const int8_t *sc = w[k].scales;
        const float dd = a[k].d * half_to_float(w[k].d);
        for (int l = 0; l < 8; l++) {
            int32_t s = 0;
            for (int m = 0; m < 8; m++) {
                int32_t part = 0;
                for (int i = 32 * m + 4 * l; i < 32 * m + 4 * l + 4; i++) part += levels[i] * a[k].qs[i];
                s += sc[2 * m + (l >= 4)] * part;
            }
            s -= 32 * (sc[2 * l] * a[k].bsums[2 * l] + sc[2 * l + 1] * a[k].bsums[2 * l + 1]);
            acc[l] = fmaf(dd, (float)s, acc[l]);
        }
    }
    return hsum8(acc);
}

static void matmul_row_q8(const specla_tensor *w, int64_t o, const void *acts, int n_batch, float *y) {
    const int64_t n = w->ne0;
    const uint8_t *row = (const uint8_t *)w->data + o * type_row_bytes(w->type, n);
    for (int b = 0; b < n_batch; b++) {
        float r;
        switch (w->type) {
        case SPECLA_TYPE_Q4_K:
            r = dot_q4_k_q8_k((const block_q4_K *)row, (const act_q8_k *)acts + b * (n / 256), n / 256);
            break;
        case SPECLA_TYPE_Q6_K:
            r = dot_q6_k_q8_k((const block_q6_K *)row, (const act_q8_k *)acts + b * (n / 256), n / 256);
            break;
        default: r = dot_legacy_q8_0(w->type, row, (const act_q8_0 *)acts + b * (n / 32), n / 32);
        }
        y[(int64_t)b * w->ne1 + o] = r;
    }
}

void cpu_matmul_scalar(const cpu_exec *ex, const specla_tensor *w, const float *x, int n_batch, float *y) {
    const int64_t n_rows = w->ne1;
    const int parallel = cpu_matmul_threaded(ex, w, n_batch);
    const int kind = act_kind_for_weight(w->type);
    void *acts = kind == ACT_FLOAT ? NULL : cpu_quantize_activations(ex, kind, x, w->ne0, n_batch);
    if (kind != ACT_FLOAT && !acts) {
        cpu_matmul_out_of_memory(w, n_batch, y);
        return;
    }
#pragma omp parallel for if (parallel) num_threads(ex->n_threads) schedule(static)
    for (int64_t o = 0; o < n_rows; o++) {
        if (acts)
            matmul_row_q8(w, o, acts, n_batch, y);
        else
            matmul_row_float(w, o, x, n_batch, y);
    }
}

void cpu_matmul(const cpu_exec *ex, const specla_tensor *w, const float *x, int n_batch, float *y) {
    if (ex->kernels == SPECLA_CPU_AVX512)
        cpu_matmul_avx512(ex, w, x, n_batch, y);
    else if (ex->kernels == SPECLA_CPU_AVX2)
        cpu_matmul_avx2(ex, w, x, n_batch, y);
    else
        cpu_matmul_scalar(ex, w, x, n_batch, y);
}
