/* Scalar CPU kernels for everything but quantized matmul: norms, activations, the causal conv,
 * the gated delta rule, NEOX RoPE and causal attention. They are the oracle of the GPU kernels to
 * come, so each loop is written in the plainest order; threads split independent heads/rows only,
 * never a reduction, so results do not depend on the thread count. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "cpu_ops.h"
#include "recurrent_avx2.h"
#include "recurrent_step.h"

static void gdn_step_scalar(float *M, int S, const float *q, const float *k, const float *v, float decay, float beta,
                            float scale, float *out, float *delta_out) {
    gdn_head_step(M, S, q, k, v, decay, beta, scale, out, delta_out);
}
static void gdn_fold_scalar(float *M, int S, const float *k, const float *delta, float decay) {
    gdn_head_fold(M, S, k, delta, decay);
}

struct gdn_kernels cpu_gdn_kernels(const cpu_exec *ex, int S) {
    struct gdn_kernels kernels = {gdn_step_scalar, gdn_fold_scalar};
    if (cpu_uses_avx2(ex) && S % 8 == 0) {
        kernels.step = gdn_head_step_avx2;
        kernels.fold = gdn_head_fold_avx2;
    }
    return kernels;
}

float cpu_silu(float x) { return silu_f32(x); }
float cpu_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
float cpu_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

void cpu_rms_norm(const float *x, const float *weight, int n_rows, int n, float eps, float *y) {
    for (int r = 0; r < n_rows; r++) {
        const float *xr = x + (int64_t)r * n;
        float *yr = y + (int64_t)r * n;
        float sum = 0.0f;
        for (int i = 0; i < n; i++) sum += xr[i] * xr[i];
        const float scale = 1.0f / sqrtf(sum / (float)n + eps);
        for (int i = 0; i < n; i++) yr[i] = weight ? xr[i] * scale * weight[i] : xr[i] * scale;
    }
}

void cpu_l2_norm(const float *x, int n_rows, int n, float eps, float *y) {
    for (int r = 0; r < n_rows; r++) {
        const float *xr = x + (int64_t)r * n;
        float *yr = y + (int64_t)r * n;
        float sum = 0.0f;
        for (int i = 0; i < n; i++) sum += xr[i] * xr[i];
        const float scale = 1.0f / sqrtf(sum + eps);
        for (int i = 0; i < n; i++) yr[i] = xr[i] * scale;
    }
}

void cpu_causal_conv(const cpu_exec *ex, const float *x, const float *weight, int T, int C, int K,
                     float *conv_state, float *y) {
    /* window of token t = rows t .. t+K-1 of [conv_state (K-1 rows) ; x (T rows)], oldest first */
    const int hist = K - 1;
#pragma omp parallel for num_threads(ex->n_threads) schedule(static)
    for (int c = 0; c < C; c++) {
        const float *w = weight + (int64_t)c * K;
        float window[64]; /* K <= 64 is checked at the boundary */
        for (int t = 0; t < T; t++) {
            for (int j = 0; j < K; j++) {
                const int row = t + j; /* index into the concatenated [state ; x] sequence */
                window[j] = row < hist ? conv_state[(int64_t)row * C + c] : x[(int64_t)(row - hist) * C + c];
            }
            y[(int64_t)t * C + c] = conv_window_output(window, w, K);
        }
        /* the new state is the last K-1 raw inputs of the concatenated sequence */
        for (int j = 0; j < hist; j++) {
            const int row = T + j;
            window[j] = row < hist ? conv_state[(int64_t)row * C + c] : x[(int64_t)(row - hist) * C + c];
        }
        for (int j = 0; j < hist; j++) conv_state[(int64_t)j * C + c] = window[j];
    }
}

void cpu_gated_delta_rule(const cpu_exec *ex, const float *q, const float *k, const float *v, const float *g,
                          const float *beta, int T, int Hk, int Hv, int S, float *state, float *out) {
    const float scale = 1.0f / sqrtf((float)S);
    const struct gdn_kernels kern = cpu_gdn_kernels(ex, S);
    /* value heads are independent; each walks the tokens in order */
#pragma omp parallel for num_threads(ex->n_threads) schedule(static)
    for (int h = 0; h < Hv; h++) {
        const int kh = h % Hk; /* tiled V-head mapping of the qwen35 converter */
        float *M = state + (int64_t)h * S * S;
        for (int t = 0; t < T; t++) {
            kern.step(M, S, q + ((int64_t)t * Hk + kh) * S, k + ((int64_t)t * Hk + kh) * S,
                          v + ((int64_t)t * Hv + h) * S, expf(g[(int64_t)t * Hv + h]), beta[(int64_t)t * Hv + h],
                          scale, out + ((int64_t)t * Hv + h) * S, NULL);
        }
    }
}

void cpu_rope_neox(float *x, const int32_t *positions, int T, int n_heads, int head_dim, int n_rot,
                   float freq_base) {
    const int half = n_rot / 2;
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            /* angles in double: the oracle should not add error of its own */
            const double theta = (double)positions[t] * pow((double)freq_base, -2.0 * i / n_rot);
            const float c = (float)cos(theta), s = (float)sin(theta);
            for (int h = 0; h < n_heads; h++) {
                float *xh = x + ((int64_t)t * n_heads + h) * head_dim;
                const float a = xh[i], b = xh[i + half];
                xh[i] = a * c - b * s;
                xh[i + half] = a * s + b * c;
            }
        }
    }
}

/* Softmax attention of one query head over the rows 0 .. n_prefix-1 followed by extra_rows[0 ..
 * n_extra-1] (ascending positions), in that order. Causal decoding and tree verification both come
 * here, so a tree node sees its rows in the same order, with the same arithmetic, as the token
 * decoded alone: scores, max, exp and sums in row order. */
static void attend_rows(const float *qh, const float *k_cache, const float *v_cache, int nkv, int kvh, int D,
                        int n_prefix, const int32_t *extra_rows, int n_extra, float scale, float *scores, float *oh) {
    const int n_rows = n_prefix + n_extra;
    float max_score = -INFINITY;
    for (int i = 0; i < n_rows; i++) {
        const int r = i < n_prefix ? i : extra_rows[i - n_prefix];
        const float *kr = k_cache + ((int64_t)r * nkv + kvh) * D;
        float s = 0.0f;
        for (int d = 0; d < D; d++) s += qh[d] * kr[d];
        s *= scale;
        scores[i] = s;
        if (s > max_score) max_score = s;
    }
    float sum = 0.0f;
    for (int i = 0; i < n_rows; i++) {
        scores[i] = expf(scores[i] - max_score);
        sum += scores[i];
    }
    for (int d = 0; d < D; d++) oh[d] = 0.0f;
    for (int i = 0; i < n_rows; i++) {
        const int r = i < n_prefix ? i : extra_rows[i - n_prefix];
        const float p = scores[i] / sum;
        const float *vr = v_cache + ((int64_t)r * nkv + kvh) * D;
        for (int d = 0; d < D; d++) oh[d] += p * vr[d];
    }
}

void cpu_attention(const cpu_exec *ex, const float *q, const float *k_cache, const float *v_cache,
                   const int32_t *positions, int T, int n_kv, int nh, int nkv, int D, float *out) {
    const float scale = 1.0f / sqrtf((float)D);
    const int group = nh / nkv;
    int max_rows = 0;
    for (int t = 0; t < T; t++)
        if (positions[t] + 1 > max_rows) max_rows = positions[t] + 1;
    (void)max_rows; /* the workspace holds max_kv_rows scores per thread (cpu_backend.c) */
#pragma omp parallel num_threads(ex->n_threads)
    {
        float *scores = cpu_thread_floats(ex, omp_get_thread_num());
#pragma omp for schedule(static) collapse(2)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < nh; h++)
                attend_rows(q + ((int64_t)t * nh + h) * D, k_cache, v_cache, nkv, h / group, D, positions[t] + 1, NULL,
                            0, scale, scores, out + ((int64_t)t * nh + h) * D);
    }
}

void cpu_attention_tree(const cpu_exec *ex, const float *q, const float *k_cache, const float *v_cache, int n_prefix,
                        const int32_t *parents, int T, int nh, int nkv, int D, float *out) {
    const float scale = 1.0f / sqrtf((float)D);
    const int group = nh / nkv;
#pragma omp parallel num_threads(ex->n_threads)
    {
        float *scores = cpu_thread_floats(ex, omp_get_thread_num());
        int32_t *rows = cpu_thread_ints(ex, omp_get_thread_num());
#pragma omp for schedule(static)
        for (int t = 0; t < T; t++) {
            /* the node's ancestors and itself, root first: their K/V rows sit at n_prefix + index */
            int n = 0;
            for (int a = t; a >= 0; a = parents[a]) n++;
            int i = n;
            for (int a = t; a >= 0; a = parents[a]) rows[--i] = n_prefix + a;
            for (int h = 0; h < nh; h++)
                attend_rows(q + ((int64_t)t * nh + h) * D, k_cache, v_cache, nkv, h / group, D, n_prefix, rows, n,
                            scale, scores, out + ((int64_t)t * nh + h) * D);
        }
    }
}
