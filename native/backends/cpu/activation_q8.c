/* The activation quantizers (activation_q8.h). Plain C on purpose: every kernel set calls these
 * same functions, so scalar and AVX2 matmuls see bit-identical codes. */
#include "activation_q8.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ops.h"
#include "element_types.h"

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

size_t cpu_matmul_workspace_bytes(int n_batch, int64_t n) {
    const size_t q8_k = sizeof(act_q8_k) * (size_t)(n / 256) * (size_t)n_batch;
    const size_t q8_0 = sizeof(act_q8_0) * (size_t)(n / 32) * (size_t)n_batch;
    /* the AVX-512 legacy kernels prepare two 64-byte vectors per block pair and a scale per block
     * after the blocks (matmul_avx512.c, build_legacy_acts) */
    const size_t legacy_lanes = 64 + 2 * 64 * (size_t)((n / 32 + 1) / 2) * (size_t)n_batch +
                                ((sizeof(float) * (size_t)(n / 32) * (size_t)n_batch + 63) / 64 * 64);
    const size_t q8_0_total = (q8_0 + 63) / 64 * 64 + legacy_lanes;
    return q8_k > q8_0_total ? q8_k : q8_0_total;
}

void *cpu_quantize_activations(const cpu_exec *ex, int kind, const float *x, int64_t n, int n_batch) {
    const size_t block = kind == ACT_Q8_K ? sizeof(act_q8_k) : sizeof(act_q8_0);
    const int64_t per_row = n / (kind == ACT_Q8_K ? 256 : 32);
    if (!ex->ws || block * (size_t)per_row * (size_t)n_batch > ex->ws->acts_bytes) return NULL;
    void *acts = ex->ws->acts;
    for (int b = 0; b < n_batch; b++) {
        if (kind == ACT_Q8_K)
            act_quantize_q8_k(x + (int64_t)b * n, n, (act_q8_k *)acts + b * per_row);
        else
            act_quantize_q8_0(x + (int64_t)b * n, n, (act_q8_0 *)acts + b * per_row);
    }
    return acts;
}

int cpu_workspace_init(cpu_workspace *ws, int n_threads, int max_rows, int64_t max_width, int64_t floats_per_thread,
                       int64_t ints_per_thread) {
    memset(ws, 0, sizeof *ws);
    ws->acts_bytes = (cpu_matmul_workspace_bytes(max_rows, max_width) + 63) / 64 * 64;
    ws->acts = aligned_alloc(64, ws->acts_bytes > 0 ? ws->acts_bytes : 64);
    ws->floats_per_thread = floats_per_thread > 0 ? floats_per_thread : 1;
    ws->ints_per_thread = ints_per_thread > 0 ? ints_per_thread : 1;
    ws->thread_floats = (float *)malloc(sizeof(float) * (size_t)(n_threads * ws->floats_per_thread));
    ws->thread_ints = (int32_t *)malloc(sizeof(int32_t) * (size_t)(n_threads * ws->ints_per_thread));
    if (!ws->acts || !ws->thread_floats || !ws->thread_ints) {
        cpu_workspace_release(ws);
        return -1;
    }
    return 0;
}

void cpu_workspace_release(cpu_workspace *ws) {
    free(ws->acts);
    free(ws->thread_floats);
    free(ws->thread_ints);
    memset(ws, 0, sizeof *ws);
}
