/* Per-row arithmetic that more than one kernel file runs, so each result has one definition: the
 * block-wide sum of squares and L2 norm of a row (NORM_THREADS threads; elementwise.cu's l2_norm and
 * gdn_split_qkv, recurrent.cu's gdn_prepare), the RMS norms' squares, scale and outputs
 * (elementwise.cu's norms, attention.cu's attention_prepare), the activation functions, and the GDN gates. Every
 * float operation is an explicit round-to-nearest intrinsic, so the bits are those of the one
 * order written here wherever it is compiled. */
#ifndef SPECLA_CUDA_ROW_MATH_CUH
#define SPECLA_CUDA_ROW_MATH_CUH

#include <math.h>

#include "vendor.h"

#define NORM_THREADS 256
#ifndef SPECLA_WARP
#define SPECLA_WARP 32
#endif

static __device__ __forceinline__ float group_sum(float v) {
    for (int m = SPECLA_WARP / 2; m > 0; m >>= 1) v = __fadd_rn(v, SPECLA_SHFL_XOR(v, m));
    return v;
}

/* Sum of squares of x[0..n) by the block (NORM_THREADS threads), in the order the header states;
 * every thread gets the total. `partials` is NORM_THREADS / 32 floats of shared memory. */
static __device__ float row_sum_squares(const float *x, int n, float *partials) {
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) s = __fadd_rn(s, __fmul_rn(x[i], x[i]));
    s = group_sum(s);
    if (threadIdx.x % SPECLA_WARP == 0) partials[threadIdx.x / SPECLA_WARP] = s;
    __syncthreads();
    float total = 0.0f;
    for (int g = 0; g < NORM_THREADS / SPECLA_WARP; g++) total = __fadd_rn(total, partials[g]);
    __syncthreads(); /* partials may be reused by the caller's next row */
    return total;
}

/* s plus the squares of a quad's 4 floats, in order: a lane's share of an RMS norm's sum */
static __device__ __forceinline__ float add_squares(float s, float4 v) {
    s = __fadd_rn(s, __fmul_rn(v.x, v.x));
    s = __fadd_rn(s, __fmul_rn(v.y, v.y));
    s = __fadd_rn(s, __fmul_rn(v.z, v.z));
    return __fadd_rn(s, __fmul_rn(v.w, v.w));
}
/* the RMS norm's scale 1 / sqrt(sum / n + eps) of a row of n floats whose squares sum to `sum` */
static __device__ __forceinline__ float rms_scale(float sum, int n, float eps) {
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sum, (float)n), eps)));
}

static __device__ __forceinline__ float silu_dev(float x) { return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x))); }
static __device__ __forceinline__ float sigmoid_dev(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }
static __device__ __forceinline__ float softplus_dev(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* an RMS norm's output element: x * scale, then * w (where there is a weight), then * silu(g) (a
 * gated norm), each product rounded (the CPU's order) */
static __device__ __forceinline__ float scaled(float x, float scale, const float *weight, float w, bool gated, float g) {
    float v = __fmul_rn(x, scale);
    if (weight) v = __fmul_rn(v, w);
    if (gated) v = __fmul_rn(v, silu_dev(g));
    return v;
}

static __device__ __forceinline__ float4 scaled_quad(float4 x, float scale, const float *weight, float4 w, bool gated,
                                                     float4 g) {
    return make_float4(scaled(x.x, scale, weight, w.x, gated, g.x), scaled(x.y, scale, weight, w.y, gated, g.y),
                       scaled(x.z, scale, weight, w.z, gated, g.z), scaled(x.w, scale, weight, w.w, gated, g.w));
}

static __device__ void l2_row(const float *x, int n, float eps, float *y, float *partials) {
    const float sum = row_sum_squares(x, n, partials);
    const float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(sum, eps)));
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) y[i] = __fmul_rn(x[i], scale);
}

/* One GDN head's gates (gdn_gates): beta = sigmoid(beta); g = softplus(g + dt_bias) * ssm_a, a
 * log-decay <= 0 */
static __device__ __forceinline__ void gdn_gate_values(float *beta, float *g, float dt_bias, float ssm_a) {
    *beta = sigmoid_dev(*beta);
    *g = __fmul_rn(softplus_dev(__fadd_rn(*g, dt_bias)), ssm_a);
}

#endif
