/* Scalar dequantization: the oracle. Plain loops that follow the block layouts of tensor_types.h
 * (contract section 4) element by element.
 *
 * Every value is computed with the same float32 operations, in the same order, as
 * gguf.quants.dequantize (numpy, float32), so the two agree bit for bit:
 *   Q4_0  x = d * float(q - 8)
 *   Q4_1  x = (d * float(q)) + m                                  one product, then one addition
 *   Q5_0  x = d * float(q - 16)
 *   Q5_1  x = (d * float(q)) + m
 *   Q8_0  x = float(q) * d
 *   Q4_K  x = (d * float(sc)) * float(q) - (dmin * float(m))      two products, then one subtraction
 *   Q5_K  same as Q4_K with the 5-bit q
 *   Q6_K  x = (d * float(sc)) * float(q - 32)
 *   F16 / BF16 exact widening; F32 a copy.
 * The library is compiled with -ffp-contract=off, so none of these becomes an FMA. */
#include <string.h>

#include "cpu_ops.h"
#include "element_types.h"

/* Q4_0 / Q4_1 level of element l (0..31): low nibble of qs[l] for l < 16, high nibble of qs[l - 16]. */
static inline int nibble_level(const uint8_t *qs, int l) { return l < 16 ? qs[l] & 15 : qs[l - 16] >> 4; }

/* Q5_0 / Q5_1 level of element l: the nibble plus bit l of the little-endian 32-bit qh as bit 4. */
static inline int five_bit_level(const uint8_t *qs, const uint8_t *qh, int l) {
    return nibble_level(qs, l) | (((qh[l / 8] >> (l % 8)) & 1) << 4);
}

static void dequantize_q4_0(const block_q4_0 *blocks, int64_t n_blocks, float *dst) {
    for (int64_t b = 0; b < n_blocks; b++) {
        const float d = half_to_float(blocks[b].d);
        for (int l = 0; l < QK4_0; l++) dst[b * QK4_0 + l] = d * (float)(nibble_level(blocks[b].qs, l) - 8);
    }
}

static void dequantize_q4_1(const block_q4_1 *blocks, int64_t n_blocks, float *dst) {
    for (int64_t b = 0; b < n_blocks; b++) {
        const float d = half_to_float(blocks[b].d);
        const float m = half_to_float(blocks[b].m);
        for (int l = 0; l < QK4_1; l++) dst[b * QK4_1 + l] = d * (float)nibble_level(blocks[b].qs, l) + m;
    }
}

static void dequantize_q5_0(const block_q5_0 *blocks, int64_t n_blocks, float *dst) {
    for (int64_t b = 0; b < n_blocks; b++) {
        const float d = half_to_float(blocks[b].d);
        for (int l = 0; l < QK5_0; l++)
            dst[b * QK5_0 + l] = d * (float)(five_bit_level(blocks[b].qs, blocks[b].qh, l) - 16);
    }
}

static void dequantize_q5_1(const block_q5_1 *blocks, int64_t n_blocks, float *dst) {
    for (int64_t b = 0; b < n_blocks; b++) {
        const float d = half_to_float(blocks[b].d);
        const float m = half_to_float(blocks[b].m);
        for (int l = 0; l < QK5_1; l++)
            dst[b * QK5_1 + l] = d * (float)five_bit_level(blocks[b].qs, blocks[b].qh, l) + m;
    }
}

static void dequantize_q8_0(const block_q8_0 *blocks, int64_t n_blocks, float *dst) {
    for (int64_t b = 0; b < n_blocks; b++) {
        const float d = half_to_float(blocks[b].d);
        for (int l = 0; l < QK8_0; l++) dst[b * QK8_0 + l] = (float)blocks[b].qs[l] * d;
    }
}

static void dequantize_q4_k(const block_q4_K *blocks, int64_t n_blocks, float *dst) {
    for (int64_t b = 0; b < n_blocks; b++) {
        const block_q4_K *blk = &blocks[b];
        const float d = half_to_float(blk->d);
        const float dmin = half_to_float(blk->dmin);
        float *y = dst + b * QK_K;
        for (int j = 0; j < 8; j++) { /* sub-block j: nibbles of bytes [32*(j/2), +32), low for even j */
            int sc, m;
            k_scale_min(blk->scales, j, &sc, &m);
            const float scale = d * (float)sc;
            const float offset = dmin * (float)m;
            const uint8_t *q = blk->qs + 32 * (j / 2);
            const int shift = 4 * (j & 1);
            for (int l = 0; l < 32; l++) y[32 * j + l] = scale * (float)((q[l] >> shift) & 15) - offset;
        }
    }
}

static void dequantize_q5_k(const block_q5_K *blocks, int64_t n_blocks, float *dst) {
    for (int64_t b = 0; b < n_blocks; b++) {
        const block_q5_K *blk = &blocks[b];
        const float d = half_to_float(blk->d);
        const float dmin = half_to_float(blk->dmin);
        float *y = dst + b * QK_K;
        for (int j = 0; j < 8; j++) { /* as Q4_K; bit j of qh[l] is the fifth bit of element l */
            int sc, m;
            k_scale_min(blk->scales, j, &sc, &m);
            const float scale = d * (float)sc;
            const float offset = dmin * (float)m;
            const uint8_t *q = blk->qs + 32 * (j / 2);
            const int shift = 4 * (j & 1);
            for (int l = 0; l < 32; l++) {
                const int low = (q[l] >> shift) & 15;
                const int high = (blk->qh[l] >> j) & 1;
                y[32 * j + l] = scale * (float)(low | (high << 4)) - offset;
            }
        }
    }
}

static void dequantize_q6_k(const block_q6_K *blocks, int64_t n_blocks, float *dst) {
    for (int64_t b = 0; b < n_blocks; b++) {
        const block_q6_K *blk = &blocks[b];
        const float d = half_to_float(blk->d);
        for (int half = 0; half < 2; half++) { /* two halves of 128 elements */
            const uint8_t *ql = blk->ql + 64 * half;
            const uint8_t *qh = blk->qh + 32 * half;
            const int8_t *sc = blk->scales + 8 * half;
            float *y = dst + b * QK_K + 128 * half;
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q0 = ((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q1 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = (d * (float)sc[is + 0]) * (float)q0;
                y[l + 32] = (d * (float)sc[is + 2]) * (float)q1;
                y[l + 64] = (d * (float)sc[is + 4]) * (float)q2;
                y[l + 96] = (d * (float)sc[is + 6]) * (float)q3;
            }
        }
    }
}

void cpu_dequantize_row_scalar(int32_t type, const void *src, int64_t n, float *dst) {
    switch (type) {
    case SPECLA_TYPE_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
    case SPECLA_TYPE_F16: {
        const specla_half *h = src;
        for (int64_t i = 0; i < n; i++) dst[i] = half_to_float(h[i]);
        break;
    }
    case SPECLA_TYPE_BF16: {
        const specla_bf16 *h = src;
        for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_float(h[i]);
        break;
    }
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

void cpu_get_row(const specla_tensor *w, int64_t row, float *dst) {
    const uint8_t *src = (const uint8_t *)w->data + row * type_row_bytes(w->type, w->ne0);
    /* Both dequantizers give identical bits, so the faster one is always safe to use here. */
    if (cpu_has_avx2_fma())
        cpu_dequantize_row_avx2(w->type, src, w->ne0, dst);
    else
        cpu_dequantize_row_scalar(w->type, src, w->ne0, dst);
}
