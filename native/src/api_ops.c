/* The single-op entry points of the C ABI (specla.h, "Single ops"). Each one validates every argument
 * at the boundary — a bad one becomes a status code plus a message naming the op and the values —
 * opens the backend the options name, sized for this call, and runs the backend's op on the checked
 * arguments. Single ops take host pointers: on a backend whose memory is host memory they are
 * passed through; on a device backend the inputs are uploaded, the op runs, the outputs come back
 * (a staging area per call: these entry points serve tests and tools, not the generation loop). */
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

/* The backend of a single-op call (NULL options: AUTO, all cores, AUTO kernels), ready for `limits`.
 * Messages are prefixed with the op's name. */
static specla_status open_backend(const char *op, const specla_op_options *opt, backend_limits limits, backend **be) {
    const specla_status status = backend_open(opt ? opt->backend : SPECLA_BACKEND_AUTO, opt ? opt->device : 0,
                                              opt ? opt->n_threads : 0, opt ? opt->cpu_kernels : SPECLA_CPU_AUTO,
                                              &limits, be);
    if (status != SPECLA_OK) {
        char message[512];
        snprintf(message, sizeof message, "%s", specla_last_error());
        return specla_fail(status, "%s: %s", op, message);
    }
    return SPECLA_OK;
}

static backend_limits rows_limits(int rows, int width, int kv_rows) {
    const backend_limits limits = {rows, width, kv_rows, 0, 0, 0, 0, 0, 0, 0};
    return limits;
}

/* One single-op call: its backend and the device copies of its arguments. */
#define OP_CALL_MAX_ARGS 8
typedef struct op_call {
    const char *op;
    backend *be;
    int n;
    void *device[OP_CALL_MAX_ARGS];
    void *host_out[OP_CALL_MAX_ARGS]; /* where an output goes back to, NULL for inputs */
    size_t bytes[OP_CALL_MAX_ARGS];
    int failed;
} op_call;

static specla_status op_begin(op_call *c, const char *op, const specla_op_options *opt, backend_limits limits) {
    memset(c, 0, sizeof *c);
    c->op = op;
    return open_backend(op, opt, limits, &c->be);
}

/* The backend's view of a host argument: the pointer itself on a host-memory backend, else a device
 * copy (uploaded when `in`, downloaded by op_end when `out`). NULL stays NULL. */
static void *op_arg(op_call *c, const void *host, size_t bytes, int in, int out) {
    if (!host || c->be->ops->host_memory || c->failed) return (void *)host;
    void *dev = c->n < OP_CALL_MAX_ARGS ? c->be->ops->alloc(c->be, bytes) : NULL;
    if (!dev) {
        c->failed = 1;
        return NULL;
    }
    if (in) c->be->ops->upload(c->be, dev, host, bytes);
    c->device[c->n] = dev;
    c->host_out[c->n] = out ? (void *)host : NULL;
    c->bytes[c->n] = bytes;
    c->n++;
    return dev;
}
#define OP_IN(c, ptr, bytes) op_arg(c, ptr, bytes, 1, 0)
#define OP_OUT(c, ptr, bytes) op_arg(c, ptr, bytes, 0, 1)
#define OP_INOUT(c, ptr, bytes) op_arg(c, ptr, bytes, 1, 1)

/* A weight as the backend reads it (a device backend takes its own upload, laid out for the matmul);
 * 0 when the backend cannot take its type or shape (the message says so). */
static int op_weight(op_call *c, const specla_tensor *host, specla_tensor *out) {
    *out = *host;
    if (c->be->ops->host_memory) return 1;
    const size_t bytes = c->be->ops->weight_bytes(c->be, host, WEIGHT_MATMUL);
    if (bytes == 0) {
        c->failed = 2;
        specla_fail(SPECLA_ERR_UNSUPPORTED, "%s: backend %s has no matmul for a %s weight of %d x %d", c->op,
                    c->be->ops->name, type_name(host->type), host->ne1, host->ne0);
        return 0;
    }
    void *dev = c->n < OP_CALL_MAX_ARGS ? c->be->ops->alloc(c->be, bytes) : NULL;
    if (!dev || c->be->ops->upload_weight(c->be, host, dev, WEIGHT_MATMUL) != SPECLA_OK) {
        if (dev) c->be->ops->free(c->be, dev);
        c->failed = 1;
        return 0;
    }
    c->device[c->n] = dev;
    c->host_out[c->n] = NULL;
    c->bytes[c->n] = bytes;
    c->n++;
    out->data = dev;
    return 1;
}

/* Whether the arguments are in place (else the call ends here with a message). */
static int op_ready(op_call *c) { return !c->failed; }

/* Waits for the op, brings the outputs back, frees everything. */
static specla_status op_end(op_call *c) {
    specla_status st = SPECLA_OK;
    if (c->failed == 2) {
        st = SPECLA_ERR_UNSUPPORTED; /* op_weight left the message */
    } else if (c->failed) {
        st = specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "%s: out of %s memory for the arguments", c->op, c->be->ops->name);
    } else {
        st = c->be->ops->sync(c->be);
        for (int i = 0; st == SPECLA_OK && i < c->n; i++)
            if (c->host_out[i]) c->be->ops->download(c->be, c->host_out[i], c->device[i], c->bytes[i]);
        if (st == SPECLA_OK) st = c->be->ops->sync(c->be);
    }
    for (int i = 0; i < c->n; i++) c->be->ops->free(c->be, c->device[i]);
    c->be->ops->destroy(c->be);
    return st;
}

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
                           "%s: type %d is not supported (F32=0, F16=1, Q4_0=2, Q4_1=3, Q5_0=6, Q5_1=7, Q8_0=8, Q4_K=12, Q5_K=13, "
                           "Q6_K=14, BF16=30)",
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
    op_call c;
    if ((status = op_begin(&c, op, opt, rows_limits(1, 1, 1))) != SPECLA_OK) return status;
    const size_t src_bytes = (size_t)(n_elements / block) * (size_t)type_block_bytes(type);
    const void *s = OP_IN(&c, src, src_bytes);
    float *d = (float *)OP_OUT(&c, dst, sizeof(float) * (size_t)n_elements);
    if (op_ready(&c)) c.be->ops->dequantize(c.be, type, s, n_elements, d);
    return op_end(&c);
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
    op_call c;
    if ((status = op_begin(&c, op, opt, rows_limits(n_batch, w->ne0, 1))) != SPECLA_OK) return status;
    specla_tensor wd;
    op_weight(&c, w, &wd);
    const float *xd = (const float *)OP_IN(&c, x, sizeof(float) * (size_t)n_batch * (size_t)w->ne0);
    float *yd = (float *)OP_OUT(&c, y, sizeof(float) * (size_t)n_batch * (size_t)w->ne1);
    if (op_ready(&c)) c.be->ops->matmul(c.be, &wd, xd, n_batch, yd);
    return op_end(&c);
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
    op_call c;
    if ((status = op_begin(&c, op, opt, rows_limits(n_rows, n, 1))) != SPECLA_OK) return status;
    const float *xd = (const float *)OP_IN(&c, x, sizeof(float) * (size_t)n_rows * (size_t)n);
    int8_t *cd = (int8_t *)OP_OUT(&c, codes, (size_t)n_rows * (size_t)n);
    float *sd = (float *)OP_OUT(&c, scales, sizeof(float) * (size_t)n_rows * (size_t)(n / block));
    if (op_ready(&c)) c.be->ops->quantize_activations(c.be, weight_type, xd, n_rows, n, cd, sd);
    return op_end(&c);
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
    op_call c;
    if ((status = op_begin(&c, op, opt, rows_limits(1, 1, 1))) != SPECLA_OK) return status;
    const size_t bytes = sizeof(float) * (size_t)n_rows * (size_t)n;
    const float *xd = (const float *)OP_IN(&c, x, bytes);
    const float *wd = (const float *)OP_IN(&c, weight, sizeof(float) * (size_t)n);
    float *yd = (float *)OP_OUT(&c, y, bytes);
    if (op_ready(&c)) c.be->ops->rms_norm(c.be, xd, wd, n_rows, n, eps, yd);
    return op_end(&c);
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
    op_call c;
    if ((status = op_begin(&c, op, opt, rows_limits(1, 1, 1))) != SPECLA_OK) return status;
    const size_t bytes = sizeof(float) * (size_t)n_rows * (size_t)n;
    const float *xd = (const float *)OP_IN(&c, x, bytes);
    float *yd = (float *)OP_OUT(&c, y, bytes);
    if (op_ready(&c)) c.be->ops->l2_norm(c.be, xd, n_rows, n, eps, yd);
    return op_end(&c);
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
    op_call c;
    specla_status status;
    if ((status = op_begin(&c, op, opt, rows_limits(T, 1, 1))) != SPECLA_OK) return status;
    const size_t rows = sizeof(float) * (size_t)C;
    const float *xd = (const float *)OP_IN(&c, x, rows * (size_t)T);
    const float *wd = (const float *)OP_IN(&c, weight, rows * (size_t)K);
    float *sd = (float *)OP_INOUT(&c, conv_state, rows * (size_t)(K - 1));
    float *yd = (float *)OP_OUT(&c, y, rows * (size_t)T);
    if (op_ready(&c)) c.be->ops->causal_conv(c.be, xd, wd, T, C, K, sd, yd);
    return op_end(&c);
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
    op_call c;
    specla_status status;
    if ((status = op_begin(&c, op, opt, rows_limits(T, 1, 1))) != SPECLA_OK) return status;
    const size_t f = sizeof(float), t = (size_t)T;
    const float *qd = (const float *)OP_IN(&c, q, f * t * (size_t)Hk * (size_t)S);
    const float *kd = (const float *)OP_IN(&c, k, f * t * (size_t)Hk * (size_t)S);
    const float *vd = (const float *)OP_IN(&c, v, f * t * (size_t)Hv * (size_t)S);
    const float *gd = (const float *)OP_IN(&c, g, f * t * (size_t)Hv);
    const float *bd = (const float *)OP_IN(&c, beta, f * t * (size_t)Hv);
    float *sd = (float *)OP_INOUT(&c, state, f * (size_t)Hv * (size_t)S * (size_t)S);
    float *od = (float *)OP_OUT(&c, out, f * t * (size_t)Hv * (size_t)S);
    if (op_ready(&c)) c.be->ops->gated_delta_rule(c.be, qd, kd, vd, gd, bd, T, Hk, Hv, S, sd, od);
    return op_end(&c);
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
    op_call c;
    specla_status status;
    if ((status = op_begin(&c, op, opt, rows_limits(T, 1, 1))) != SPECLA_OK) return status;
    float *xd = (float *)OP_INOUT(&c, x, sizeof(float) * (size_t)T * (size_t)n_heads * (size_t)head_dim);
    const int32_t *pd = (const int32_t *)OP_IN(&c, positions, sizeof(int32_t) * (size_t)T);
    if (op_ready(&c)) c.be->ops->rope_neox(c.be, xd, pd, T, n_heads, head_dim, n_rot, freq_base);
    return op_end(&c);
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
    op_call c;
    specla_status status;
    backend_limits limits = rows_limits(T, 1, n_kv);
    limits.attn_heads = nh;
    limits.attn_head_dim = D;
    if ((status = op_begin(&c, op, opt, limits)) != SPECLA_OK) return status;
    const size_t f = sizeof(float), q_bytes = f * (size_t)T * (size_t)nh * (size_t)D;
    const size_t cache_bytes = f * (size_t)n_kv * (size_t)nkv * (size_t)D;
    const float *qd = (const float *)OP_IN(&c, q, q_bytes);
    const float *kd = (const float *)OP_IN(&c, k_cache, cache_bytes);
    const float *vd = (const float *)OP_IN(&c, v_cache, cache_bytes);
    const int32_t *pd = (const int32_t *)OP_IN(&c, positions, sizeof(int32_t) * (size_t)T);
    float *od = (float *)OP_OUT(&c, out, q_bytes);
    if (op_ready(&c)) c.be->ops->attention(c.be, qd, kd, vd, NULL, pd, T, n_kv, nh, nkv, D, od);
    return op_end(&c);
}

/* [start, end) of one destination segment of a gather, for the overlap check. */
typedef struct float_range {
    int64_t start, end;
} float_range;
static int by_start(const void *a, const void *b) {
    const int64_t x = ((const float_range *)a)->start, y = ((const float_range *)b)->start;
    return (x > y) - (x < y);
}

/* The largest array a gather takes, in floats: every sum of its offsets stays far from overflow. */
#define GATHER_MAX_FLOATS ((int64_t)1 << 40)

/* Whether n_blocks blocks of `block` floats, the last one reaching `reach` floats past its start,
 * fit in `floats`. */
static int blocks_fit(int32_t n_blocks, int64_t block, int64_t reach, int64_t floats) {
    if (reach > floats) return 0;
    return n_blocks == 1 || block == 0 || (int64_t)(n_blocks - 1) <= (floats - reach) / block;
}

SPECLA_API specla_status specla_op_gather_rows(const specla_op_options *opt, float *dst, int64_t dst_floats,
                                               int64_t dst_block, const float *src, int64_t src_floats,
                                               int64_t src_block, int32_t n_blocks, const int64_t *dst_offsets,
                                               const int64_t *src_offsets, const int32_t *widths, int32_t n_fields,
                                               const int32_t *rows, int32_t n) {
    static const char op[] = "specla_op_gather_rows";
    CHECK_NOT_NULL(op, dst);
    CHECK_NOT_NULL(op, src);
    CHECK_NOT_NULL(op, dst_offsets);
    CHECK_NOT_NULL(op, src_offsets);
    CHECK_NOT_NULL(op, widths);
    CHECK_NOT_NULL(op, rows);
    CHECK_POSITIVE(op, dst_floats);
    CHECK_POSITIVE(op, src_floats);
    CHECK_POSITIVE(op, n_blocks);
    CHECK_POSITIVE(op, n_fields);
    CHECK_POSITIVE(op, n);
    if (dst_floats > GATHER_MAX_FLOATS || src_floats > GATHER_MAX_FLOATS)
        return FAIL_INVALID("%s: dst_floats = %lld, src_floats = %lld: at most %lld", op, (long long)dst_floats,
                            (long long)src_floats, (long long)GATHER_MAX_FLOATS);
    if (n_fields > GATHER_MAX_FIELDS)
        return FAIL_INVALID("%s: n_fields = %d > %d", op, n_fields, (int)GATHER_MAX_FIELDS);
    if (dst_block < 0 || dst_block > dst_floats || src_block < 0 || src_block > src_floats)
        return FAIL_INVALID("%s: dst_block = %lld, src_block = %lld must lie in [0, dst_floats = %lld] and "
                            "[0, src_floats = %lld]", op, (long long)dst_block, (long long)src_block,
                            (long long)dst_floats, (long long)src_floats);
    const uintptr_t d0 = (uintptr_t)dst, d1 = d0 + sizeof(float) * (size_t)dst_floats;
    const uintptr_t s0 = (uintptr_t)src, s1 = s0 + sizeof(float) * (size_t)src_floats;
    if (d0 < s1 && s0 < d1) return FAIL_INVALID("%s: dst and src overlap", op);
    int32_t max_row = 0;
    for (int32_t i = 0; i < n; i++) {
        if (rows[i] < 0) return FAIL_INVALID("%s: rows[%d] = %d is negative", op, i, rows[i]);
        if (rows[i] > max_row) max_row = rows[i];
    }
    row_field fields[GATHER_MAX_FIELDS];
    for (int32_t f = 0; f < n_fields; f++) {
        const int64_t w = widths[f], d = dst_offsets[f], s = src_offsets[f];
        if (w <= 0) return FAIL_INVALID("%s: widths[%d] = %lld must be > 0", op, f, (long long)w);
        if (d < 0 || d >= dst_floats || s < 0 || s >= src_floats)
            return FAIL_INVALID("%s: dst_offsets[%d] = %lld, src_offsets[%d] = %lld must lie in [0, %lld) and [0, %lld)",
                                op, f, (long long)d, f, (long long)s, (long long)dst_floats, (long long)src_floats);
        /* widths < 2^31 and rows < 2^31: the products stay below 2^62 */
        if (!blocks_fit(n_blocks, dst_block, d + (int64_t)n * w, dst_floats))
            return FAIL_INVALID("%s: field %d: %d rows of %lld floats at dst_offsets[%d] = %lld in %d blocks of %lld "
                                "pass the end of dst (%lld floats)", op, f, n, (long long)w, f, (long long)d, n_blocks,
                                (long long)dst_block, (long long)dst_floats);
        if (!blocks_fit(n_blocks, src_block, s + ((int64_t)max_row + 1) * w, src_floats))
            return FAIL_INVALID("%s: field %d: row %d of %lld floats at src_offsets[%d] = %lld in %d blocks of %lld "
                                "passes the end of src (%lld floats)", op, f, max_row, (long long)w, f, (long long)s,
                                n_blocks, (long long)src_block, (long long)src_floats);
        fields[f] = (row_field){d, s, (int32_t)w};
    }
    /* destination segments: the n rows of a field in a block are contiguous, so one range each */
    const size_t n_ranges = (size_t)n_blocks * (size_t)n_fields;
    float_range *ranges = (float_range *)malloc(sizeof(float_range) * n_ranges);
    if (!ranges) return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "%s: out of host memory", op);
    for (int32_t b = 0; b < n_blocks; b++)
        for (int32_t f = 0; f < n_fields; f++) {
            const int64_t start = (int64_t)b * dst_block + fields[f].dst_offset;
            ranges[(size_t)b * n_fields + f] = (float_range){start, start + (int64_t)n * fields[f].width};
        }
    qsort(ranges, n_ranges, sizeof *ranges, by_start);
    int64_t overlap_at = -1;
    for (size_t r = 1; r < n_ranges && overlap_at < 0; r++)
        if (ranges[r].start < ranges[r - 1].end) overlap_at = ranges[r].start;
    free(ranges);
    if (overlap_at >= 0)
        return FAIL_INVALID("%s: destination segments overlap at dst[%lld]", op, (long long)overlap_at);
    op_call c;
    specla_status status;
    if ((status = op_begin(&c, op, opt, rows_limits(1, 1, 1))) != SPECLA_OK) return status;
    float *dd = (float *)OP_INOUT(&c, dst, sizeof(float) * (size_t)dst_floats);
    const float *sd = (const float *)OP_IN(&c, src, sizeof(float) * (size_t)src_floats);
    const int32_t *rd = (const int32_t *)OP_IN(&c, rows, sizeof(int32_t) * (size_t)n);
    if (op_ready(&c)) c.be->ops->gather_rows(c.be, dd, dst_block, sd, src_block, n_blocks, fields, n_fields, rd, n);
    return op_end(&c);
}
