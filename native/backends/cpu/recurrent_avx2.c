/* AVX2/FMA versions of the per-token recurrent arithmetic (recurrent_step.h), for S a multiple of
 * 8. The sequential kernel and the tree-verify kernels call the same one of these when the AVX2
 * kernel set is chosen, so verification stays bit-identical to sequential decoding within a kernel
 * set. The step and the fold update a state element with the same FMA, fma(k, delta, row * decay),
 * so folding factors reproduces the decoded state exactly here too. */
#include <immintrin.h>

#include "recurrent_avx2.h"

static inline float hsum8(__m256 v) {
    const __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    __m128 s = _mm_add_ps(lo, hi);
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

void gdn_head_step_avx2(float *M, int S, const float *q, const float *k, const float *v, float decay, float beta,
                        float scale, float *out, float *delta_out) {
    const __m256 vdecay = _mm256_set1_ps(decay);
    for (int j = 0; j < S; j++) {
        float *row = M + (long)j * S;
        __m256 acc = _mm256_setzero_ps();
        for (int i = 0; i < S; i += 8) {
            const __m256 r = _mm256_mul_ps(_mm256_loadu_ps(row + i), vdecay);
            _mm256_storeu_ps(row + i, r);
            acc = _mm256_fmadd_ps(r, _mm256_loadu_ps(k + i), acc);
        }
        const float delta = beta * (v[j] - hsum8(acc));
        if (delta_out) delta_out[j] = delta;
        const __m256 vdelta = _mm256_set1_ps(delta);
        __m256 o = _mm256_setzero_ps();
        for (int i = 0; i < S; i += 8) {
            const __m256 r = _mm256_fmadd_ps(_mm256_loadu_ps(k + i), vdelta, _mm256_loadu_ps(row + i));
            _mm256_storeu_ps(row + i, r);
            o = _mm256_fmadd_ps(r, _mm256_loadu_ps(q + i), o);
        }
        out[j] = hsum8(o) * scale;
    }
}

void gdn_head_fold_avx2(float *M, int S, const float *k, const float *delta, float decay) {
    const __m256 vdecay = _mm256_set1_ps(decay);
    for (int j = 0; j < S; j++) {
        float *row = M + (long)j * S;
        const __m256 vdelta = _mm256_set1_ps(delta[j]);
        for (int i = 0; i < S; i += 8) {
            const __m256 r = _mm256_mul_ps(_mm256_loadu_ps(row + i), vdecay);
            _mm256_storeu_ps(row + i, _mm256_fmadd_ps(_mm256_loadu_ps(k + i), vdelta, r));
        }
    }
}
