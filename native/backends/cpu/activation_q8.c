/* The activation quantizers (activation_q8.h). Plain C on purpose: every kernel set calls these
 * same functions, so scalar and AVX2 matmuls see bit-identical codes. */
#include "activation_q8.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ops.h"
#include "element_types.h"

int act_kind_for_weight(int32_t weight_type) {
    switch (weight_type) {
    case SPECLA_TYPE_Q8_0:
    case SPECLA_TYPE_Q4_0:
    case SPECLA_TYPE_Q5_0: return ACT_Q8_0;
    case SPECLA_TYPE_Q4_K:
    case SPECLA_TYPE_Q6_K: return ACT_Q8_K;
    default: return ACT_FLOAT;
    }
}

void act_quantize_q8_0(const float *x, int64_t n, act_q8_0 *out) {
    for (int64_t k = 0; k < n / 32; k++, x += 32) {
        float amax = 0.0f;
        int finite = 1;
        for (int i = 0; i < 32; i++) {
            finite &= isfinite(x[i]) != 0;
            const float a = fabsf(x[i]);
            if (a > amax) amax = a;
        }
        if (!finite) {
            out[k].d = NAN;
            memset(out[k].qs, 0, 32);
            continue;
        }
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        if (!isfinite(id)) { /* amax below ~1e-36: the block is zero at any scale fp16 can hold */
            out[k].d = 0.0f;
            memset(out[k].qs, 0, 32);
            continue;
        }
        out[k].d = half_to_float(float_to_half(amax / 127.0f));
        for (int i = 0; i < 32; i++) out[k].qs[i] = (int8_t)lrintf(x[i] * id); /* |x * id| <= 127.5 */
    }
}

void act_quantize_q8_k(const float *x, int64_t n, act_q8_k *out) {
    for (int64_t k = 0; k < n / 256; k++, x += 256) {
        float amax = 0.0f, max = 0.0f;
        int finite = 1;
        for (int i = 0; i < 256; i++) {
            finite &= isfinite(x[i]) != 0;
            const float a = fabsf(x[i]);
            if (a > amax) amax = a, max = x[i]; /* the first element of largest magnitude */
        }
        act_q8_k *blk = &out[k];
        const float iscale = amax != 0.0f ? -127.0f / max : 0.0f;
        if (!finite || !isfinite(iscale) || amax == 0.0f) { /* (iscale overflows for amax < ~1e-36) */
            blk->d = finite ? 0.0f : NAN;
            memset(blk->qs, 0, sizeof blk->qs);
            memset(blk->bsums, 0, sizeof blk->bsums);
            continue;
        }
        for (int i = 0; i < 256; i++) {
            const long v = lrintf(iscale * x[i]);
            blk->qs[i] = (int8_t)(v < 127 ? v : 127);
        }
        for (int g = 0; g < 16; g++) {
            int sum = 0;
            for (int i = 0; i < 16; i++) sum += blk->qs[16 * g + i];
            blk->bsums[g] = (int16_t)sum;
        }
        blk->d = 1.0f / iscale;
    }
}

void *cpu_quantize_activations(int kind, const float *x, int64_t n, int n_batch) {
    const size_t block = kind == ACT_Q8_K ? sizeof(act_q8_k) : sizeof(act_q8_0);
    const int64_t per_row = n / (kind == ACT_Q8_K ? 256 : 32);
    void *acts = malloc(block * (size_t)per_row * (size_t)n_batch);
    if (!acts) return NULL;
    for (int b = 0; b < n_batch; b++) {
        if (kind == ACT_Q8_K)
            act_quantize_q8_k(x + (int64_t)b * n, n, (act_q8_k *)acts + b * per_row);
        else
            act_quantize_q8_0(x + (int64_t)b * n, n, (act_q8_0 *)acts + b * per_row);
    }
    return acts;
}
