/* The single-op entry points of the C ABI (specla.h, "Single ops"). Each one validates every argument
 * at the boundary — a bad one becomes a status code plus a message naming the op and the values —
 * opens the backend the options name, sized for this call, and runs the backend's op on the checked
 * arguments. Single ops take host pointers, so they run on backends whose memory is host memory. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "activation_blocks.h"
#include "backend_registry.h"
#include "error.h"
#include "tensor_types.h"

#define FAIL_INVALID(...) specla_fail(SPECLA_ERR_INVALID_ARGUMENT, __VA_ARGS__)

/* The backend of a single-op call (NULL options: AUTO, all cores, AUTO kernels), ready for `limits`;
 * the caller destroys it. Messages are prefixed with the op's name. */
static specla_status open_backend(const char *op, const specla_op_options *opt, backend_limits limits, backend **be) {
    specla_status status = backend_open(opt ? opt->backend : SPECLA_BACKEND_AUTO, opt ? opt->device : 0,
                                        opt ? opt->n_threads : 0, opt ? opt->cpu_kernels : SPECLA_CPU_AUTO, &limits,
                                        be);
    if (status == SPECLA_OK && !(*be)->ops->host_memory) {
        (*be)->ops->destroy(*be);
        *be = NULL;
        status = specla_fail(SPECLA_ERR_UNSUPPORTED, "single ops take host pointers; this backend's memory is not");
    }
    if (status != SPECLA_OK) {
        char message[512];
        snprintf(message, sizeof message, "%s", specla_last_error());
        return specla_fail(status, "%s: %s", op, message);
    }
    return SPECLA_OK;
}

static backend_limits rows_limits(int rows, int width, int kv_rows) {
    const backend_limits limits = {rows, width, kv_rows, 0, 0, 0};
    return limits;
}

/* Run one backend op: open, call, close. */
#define RUN_ON_BACKEND(op, opt, limits, call)                                                           \
    do {                                                                                                \
        backend *be_;                                                                                   \
        const specla_status st_ = open_backend(op, opt, limits, &be_);                                  \
        if (st_ != SPECLA_OK) return st_;                                                               \
        be_->ops->call;                                                                                 \
        be_->ops->destroy(be_);                                                                         \
        return SPECLA_OK;                                                                               \
    } while (0)

#define CHECK_NOT_NULL(op, ptr)                                                                         \
    do {                                                                                                \
        if ((ptr) == NULL) return FAIL_INVALID("%s: %s is NULL", op, #ptr);                            \
    } while (0)

#define CHECK_POSITIVE(op, value)                                                                       \
    do {                                                                                                \
        if ((value) <= 0) return FAIL_INVALID("%s: %s = %lld must be > 0", op, #value, (long long)(value)); \
    } while (0)

static specla_status check_type(const char *op, int32_t type) {
    if (type_block_elements(type) == 0)
        return specla_fail(SPECLA_ERR_UNSUPPORTED,
                           "%s: type %d is not supported (F32=0, F16=1, Q8_0=8, Q4_K=12, Q5_K=13, Q6_K=14, BF16=30)",
                           op, (int)type);
    return SPECLA_OK;
}

static specla_status check_eps(const char *op, float eps) {
    if (!(eps >= 0.0f) || isinf(eps)) return FAIL_INVALID("%s: eps = %g must be finite and >= 0", op, (double)eps);
    return SPECLA_OK;
}

SPECLA_API specla_status specla_op_dequantize(const specla_op_options *opt, int32_t type, const void *src,
                                              int64_t n_elements, float *dst) {
    static const char op[] = "specla_op_dequantize";
    specla_status status = check_type(op, type);
    if (status != SPECLA_OK) return status;
    CHECK_NOT_NULL(op, src);
    CHECK_NOT_NULL(op, dst);
    CHECK_POSITIVE(op, n_elements);
    const int block = type_block_elements(type);
    if (n_elements % block != 0)
        return FAIL_INVALID("%s: n_elements = %lld is not a multiple of the %s block (%d)", op,
                            (long long)n_elements, type_name(type), block);
    RUN_ON_BACKEND(op, opt, rows_limits(1, 1, 1), dequantize(be_, type, src, n_elements, dst));
}

SPECLA_API specla_status specla_op_matmul(const specla_op_options *opt, const specla_tensor *w, const float *x,
                                          int32_t n_batch, float *y) {
    static const char op[] = "specla_op_matmul";
    CHECK_NOT_NULL(op, w);
    CHECK_NOT_NULL(op, w->data);
    CHECK_NOT_NULL(op, x);
    CHECK_NOT_NULL(op, y);
    specla_status status = check_type(op, w->type);
    if (status != SPECLA_OK) return status;
    CHECK_POSITIVE(op, w->ne0);
    CHECK_POSITIVE(op, w->ne1);
    CHECK_POSITIVE(op, n_batch);
    const int block = type_block_elements(w->type);
    if (w->ne0 % block != 0)
        return FAIL_INVALID("%s: w->ne0 = %d is not a multiple of the %s block (%d)", op, w->ne0,
                            type_name(w->type), block);
    const int64_t expected = (int64_t)w->ne1 * type_row_bytes(w->type, w->ne0);
    if (w->nbytes != expected)
        return FAIL_INVALID("%s: w->nbytes = %lld but a %s tensor of %d x %d needs %lld bytes", op,
                            (long long)w->nbytes, type_name(w->type), w->ne1, w->ne0, (long long)expected);
    RUN_ON_BACKEND(op, opt, rows_limits(n_batch, w->ne0, 1), matmul(be_, w, x, n_batch, y));
}

SPECLA_API specla_status specla_op_quantize_activations(const specla_op_options *opt, int32_t weight_type,
                                                        const float *x, int32_t n_rows, int32_t n, int8_t *codes,
                                                        float *scales) {
    static const char op[] = "specla_op_quantize_activations";
    specla_status status = check_type(op, weight_type);
    if (status != SPECLA_OK) return status;
    const int kind = act_kind_for_weight(weight_type);
    if (kind == ACT_FLOAT)
        return FAIL_INVALID("%s: %s weights take float activations (no 8-bit blocks)", op, type_name(weight_type));
    CHECK_NOT_NULL(op, x);
    CHECK_NOT_NULL(op, codes);
    CHECK_NOT_NULL(op, scales);
    CHECK_POSITIVE(op, n_rows);
    CHECK_POSITIVE(op, n);
    const int block = kind == ACT_Q8_K ? 256 : 32;
    if (n % block != 0) return FAIL_INVALID("%s: n = %d is not a multiple of %d", op, n, block);
    RUN_ON_BACKEND(op, opt, rows_limits(n_rows, n, 1), quantize_activations(be_, weight_type, x, n_rows, n, codes, scales));
}

SPECLA_API specla_status specla_op_rms_norm(const specla_op_options *opt, const float *x, const float *weight,
                                            int32_t n_rows, int32_t n, float eps, float *y) {
    static const char op[] = "specla_op_rms_norm";
    CHECK_NOT_NULL(op, x);
    CHECK_NOT_NULL(op, y);
    CHECK_POSITIVE(op, n_rows);
    CHECK_POSITIVE(op, n);
    specla_status status = check_eps(op, eps);
    if (status != SPECLA_OK) return status;
    RUN_ON_BACKEND(op, opt, rows_limits(1, 1, 1), rms_norm(be_, x, weight, n_rows, n, eps, y));
}

SPECLA_API specla_status specla_op_l2_norm(const specla_op_options *opt, const float *x, int32_t n_rows, int32_t n,
                                           float eps, float *y) {
    static const char op[] = "specla_op_l2_norm";
    CHECK_NOT_NULL(op, x);
    CHECK_NOT_NULL(op, y);
    CHECK_POSITIVE(op, n_rows);
    CHECK_POSITIVE(op, n);
    specla_status status = check_eps(op, eps);
    if (status != SPECLA_OK) return status;
    RUN_ON_BACKEND(op, opt, rows_limits(1, 1, 1), l2_norm(be_, x, n_rows, n, eps, y));
}

SPECLA_API specla_status specla_op_causal_conv(const specla_op_options *opt, const float *x, const float *weight,
                                               int32_t T, int32_t C, int32_t K, float *conv_state, float *y) {
    static const char op[] = "specla_op_causal_conv";
    CHECK_NOT_NULL(op, x);
    CHECK_NOT_NULL(op, weight);
    CHECK_NOT_NULL(op, y);
    CHECK_POSITIVE(op, T);
    CHECK_POSITIVE(op, C);
    CHECK_POSITIVE(op, K);
    if (K > 1 && conv_state == NULL) return FAIL_INVALID("%s: conv_state is NULL but K = %d needs %d rows", op, K, K - 1);
    if (K > 64) return specla_fail(SPECLA_ERR_UNSUPPORTED, "%s: conv kernel K = %d > 64", op, K);
    RUN_ON_BACKEND(op, opt, rows_limits(T, 1, 1), causal_conv(be_, x, weight, T, C, K, conv_state, y));
}

SPECLA_API specla_status specla_op_gated_delta_rule(const specla_op_options *opt, const float *q, const float *k,
                                                    const float *v, const float *g, const float *beta, int32_t T,
                                                    int32_t Hk, int32_t Hv, int32_t S, float *state, float *out) {
    static const char op[] = "specla_op_gated_delta_rule";
    CHECK_NOT_NULL(op, q);
    CHECK_NOT_NULL(op, k);
    CHECK_NOT_NULL(op, v);
    CHECK_NOT_NULL(op, g);
    CHECK_NOT_NULL(op, beta);
    CHECK_NOT_NULL(op, state);
    CHECK_NOT_NULL(op, out);
    CHECK_POSITIVE(op, T);
    CHECK_POSITIVE(op, Hk);
    CHECK_POSITIVE(op, Hv);
    CHECK_POSITIVE(op, S);
    if (Hv % Hk != 0) return FAIL_INVALID("%s: Hv = %d is not a multiple of Hk = %d", op, Hv, Hk);
    RUN_ON_BACKEND(op, opt, rows_limits(T, 1, 1), gated_delta_rule(be_, q, k, v, g, beta, T, Hk, Hv, S, state, out));
}

SPECLA_API specla_status specla_op_rope_neox(const specla_op_options *opt, float *x, const int32_t *positions,
                                             int32_t T, int32_t n_heads, int32_t head_dim, int32_t n_rot,
                                             float freq_base) {
    static const char op[] = "specla_op_rope_neox";
    CHECK_NOT_NULL(op, x);
    CHECK_NOT_NULL(op, positions);
    CHECK_POSITIVE(op, T);
    CHECK_POSITIVE(op, n_heads);
    CHECK_POSITIVE(op, head_dim);
    CHECK_POSITIVE(op, n_rot);
    if (n_rot % 2 != 0 || n_rot > head_dim)
        return FAIL_INVALID("%s: n_rot = %d must be even and <= head_dim = %d", op, n_rot, head_dim);
    if (!(freq_base > 0.0f) || isinf(freq_base))
        return FAIL_INVALID("%s: freq_base = %g must be finite and > 0", op, (double)freq_base);
    for (int32_t t = 0; t < T; t++)
        if (positions[t] < 0) return FAIL_INVALID("%s: positions[%d] = %d is negative", op, t, positions[t]);
    RUN_ON_BACKEND(op, opt, rows_limits(T, 1, 1), rope_neox(be_, x, positions, T, n_heads, head_dim, n_rot, freq_base));
}

SPECLA_API specla_status specla_op_attention(const specla_op_options *opt, const float *q, const float *k_cache,
                                             const float *v_cache, const int32_t *positions, int32_t T,
                                             int32_t n_kv, int32_t nh, int32_t nkv, int32_t D, float *out) {
    static const char op[] = "specla_op_attention";
    CHECK_NOT_NULL(op, q);
    CHECK_NOT_NULL(op, k_cache);
    CHECK_NOT_NULL(op, v_cache);
    CHECK_NOT_NULL(op, positions);
    CHECK_NOT_NULL(op, out);
    CHECK_POSITIVE(op, T);
    CHECK_POSITIVE(op, n_kv);
    CHECK_POSITIVE(op, nh);
    CHECK_POSITIVE(op, nkv);
    CHECK_POSITIVE(op, D);
    if (nh % nkv != 0) return FAIL_INVALID("%s: nh = %d is not a multiple of nkv = %d", op, nh, nkv);
    for (int32_t t = 0; t < T; t++)
        if (positions[t] < 0 || positions[t] >= n_kv)
            return FAIL_INVALID("%s: positions[%d] = %d is outside the cache rows [0, %d)", op, t, positions[t], n_kv);
    RUN_ON_BACKEND(op, opt, rows_limits(T, 1, n_kv), attention(be_, q, k_cache, v_cache, positions, T, n_kv, nh, nkv, D, out));
}
