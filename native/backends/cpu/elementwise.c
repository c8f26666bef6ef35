/* The CPU backend's element-wise, row and logit ops (backend.h): the small pieces of a layer between
 * its matmuls. Plain loops in the order the forward pass has always used, so results are the same
 * bits as before these became named ops. */
#include <math.h>
#include <string.h>

#include "cpu_ops.h"

void cpu_add(float *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}

/* Row by row, cpu_add then cpu_rms_norm of that row: each row's bits are those of the two ops
 * applied to the whole block in turn (neither mixes rows), with the row still in cache. */
void cpu_add_rms_norm(float *x, const float *delta, const float *weight, int n_rows, int n, float eps, float *y) {
    for (int r = 0; r < n_rows; r++) {
        float *xr = x + (int64_t)r * n;
        cpu_add(xr, delta + (int64_t)r * n, n);
        cpu_rms_norm(xr, weight, 1, n, eps, y + (int64_t)r * n);
    }
}

void cpu_add_bias_rows(float *x, const float *bias, int rows, int n) {
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < n; i++) x[(int64_t)r * n + i] += bias[i];
}

void cpu_silu_mul(float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) a[i] = cpu_silu(a[i]) * b[i];
}

void cpu_sigmoid_mul(float *x, const float *gate, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] *= cpu_sigmoid(gate[i]);
}

void cpu_gdn_gates(float *beta, float *g, const float *dt_bias, const float *ssm_a, int T, int Hv) {
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < Hv; h++) {
            const int64_t i = (int64_t)t * Hv + h;
            beta[i] = cpu_sigmoid(beta[i]);
            g[i] = cpu_softplus(g[i] + dt_bias[h]) * ssm_a[h]; /* log-decay <= 0 */
        }
    }
}

void cpu_gdn_split_qkv(const float *conv_out, int T, int Hk, int Hv, int S, float eps, float *q, float *k, float *v) {
    const int64_t qk_width = (int64_t)Hk * S, v_width = (int64_t)Hv * S, C = 2 * qk_width + v_width;
    for (int t = 0; t < T; t++) {
        const float *row = conv_out + (int64_t)t * C;
        cpu_l2_norm(row, Hk, S, eps, q + t * qk_width);
        cpu_l2_norm(row + qk_width, Hk, S, eps, k + t * qk_width);
        memcpy(v + t * v_width, row + 2 * qk_width, sizeof(float) * (size_t)v_width);
    }
}

void cpu_gated_rms_norm(float *x, const float *weight, const float *gate, int n_rows, int n, float eps) {
    cpu_rms_norm(x, weight, n_rows, n, eps, x);
    for (int64_t i = 0; i < (int64_t)n_rows * n; i++) x[i] *= cpu_silu(gate[i]);
}

void cpu_split_q_gate(const float *qg, int T, int nh, int D, float *q, float *gate) {
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < nh; h++) {
            const float *src = qg + ((int64_t)t * nh + h) * 2 * D;
            memcpy(q + ((int64_t)t * nh + h) * D, src, sizeof(float) * (size_t)D);
            memcpy(gate + ((int64_t)t * nh + h) * D, src + D, sizeof(float) * (size_t)D);
        }
    }
}

void cpu_scatter_rows(float *dst, int64_t dst_stride, const int32_t *rows, const float *src, int T, int width) {
    for (int t = 0; t < T; t++)
        memcpy(dst + (int64_t)rows[t] * dst_stride, src + (int64_t)t * width, sizeof(float) * (size_t)width);
}

void cpu_move_rows(float *buf, int64_t stride, int width, const int32_t *from, const int32_t *to, int n) {
    for (int i = 0; i < n; i++)
        if (from[i] != to[i])
            memcpy(buf + (int64_t)to[i] * stride, buf + (int64_t)from[i] * stride, sizeof(float) * (size_t)width);
}

void cpu_gather_rows(float *dst, int64_t dst_block, const float *src, int64_t src_block, int n_blocks,
                     const row_field *fields, int n_fields, const int32_t *rows, int n) {
    for (int b = 0; b < n_blocks; b++)
        for (int f = 0; f < n_fields; f++) {
            const int64_t width = fields[f].width;
            float *to = dst + b * dst_block + fields[f].dst_offset;
            const float *from = src + b * src_block + fields[f].src_offset;
            for (int i = 0; i < n; i++) memcpy(to + i * width, from + rows[i] * width, sizeof(float) * (size_t)width);
        }
}

void cpu_argmax_rows(const float *logits, int n_rows, int V, int n, int32_t *out) {
    for (int r = 0; r < n_rows; r++) {
        const float *row = logits + (int64_t)r * V;
        int32_t best = 0;
        for (int i = 1; i < n; i++)
            if (row[i] > row[best]) best = i; /* strict: the lowest index wins ties */
        out[r] = best;
    }
}

/* Is (va, ia) ranked before (vb, ib)? Higher value first, then the lower id. */
static int ranks_before(float va, int32_t ia, float vb, int32_t ib) { return va > vb || (va == vb && ia < ib); }

/* Restore the heap below slot `at`: a heap of n (value, id) pairs whose root is the worst kept. */
static void sift_down(float *val, int32_t *id, int n, int at) {
    for (;;) {
        int worst = at;
        const int l = 2 * at + 1, r = l + 1;
        if (l < n && ranks_before(val[worst], id[worst], val[l], id[l])) worst = l;
        if (r < n && ranks_before(val[worst], id[worst], val[r], id[r])) worst = r;
        if (worst == at) return;
        const float tv = val[at];
        const int32_t ti = id[at];
        val[at] = val[worst], id[at] = id[worst];
        val[worst] = tv, id[worst] = ti;
        at = worst;
    }
}

/* Top-k of one row of V logits, best first (ties to the lower id), as log-softmax values over the
 * whole row. A heap of the k best so far, worst at the root: O(V log k). NaN logits never rank;
 * slots beyond the finite logits get id -1 and -inf. */
static void topk_row(const float *row, int V, int k, int32_t *tokens, float *logprobs) {
    double max = -INFINITY;
    for (int i = 0; i < V; i++)
        if (row[i] > max) max = row[i];
    double sum = 0.0;
    for (int i = 0; i < V; i++)
        if (row[i] == row[i]) sum += exp((double)row[i] - max);
    const double lse = max + log(sum);

    int n = 0;
    for (int i = 0; i < V; i++) {
        const float v = row[i];
        if (v != v) continue;
        if (n < k) { /* push, sift up */
            int at = n++;
            while (at > 0) {
                const int parent = (at - 1) / 2;
                if (!ranks_before(logprobs[parent], tokens[parent], v, i)) break;
                logprobs[at] = logprobs[parent], tokens[at] = tokens[parent];
                at = parent;
            }
            logprobs[at] = v, tokens[at] = i;
        } else if (ranks_before(v, i, logprobs[0], tokens[0])) {
            logprobs[0] = v, tokens[0] = i;
            sift_down(logprobs, tokens, n, 0);
        }
    }
    for (int j = n; j < k; j++) tokens[j] = -1, logprobs[j] = -INFINITY;
    /* pop the worst to the back: the array ends sorted best first */
    for (int last = n - 1; last > 0; last--) {
        const float tv = logprobs[0];
        const int32_t ti = tokens[0];
        logprobs[0] = logprobs[last], tokens[0] = tokens[last];
        logprobs[last] = tv, tokens[last] = ti;
        sift_down(logprobs, tokens, last, 0);
    }
    for (int j = 0; j < n; j++) logprobs[j] = (float)((double)logprobs[j] - lse);
}

void cpu_topk_log_softmax(const cpu_exec *ex, const float *logits, int n_rows, int64_t row_stride, int V, int k,
                          int32_t *tokens, float *logprobs) {
#pragma omp parallel for num_threads(ex->n_threads) schedule(static) if (n_rows > 1)
    for (int r = 0; r < n_rows; r++)
        topk_row(logits + (int64_t)r * row_stride, V, k, tokens + (int64_t)r * k, logprobs + (int64_t)r * k);
}
