/* The DFlash draft forward on the CPU backend (shared/spec/ddtree-dflash.md §1; numpy oracle:
 * pyspecla/reference/dflash.py).
 *
 * A propose call
 *   1. ingests the target's feature rows of the positions committed since the last call:
 *      row = hidden_norm(fc . [aux-normed] concat(slices)), then per draft layer
 *      K = rope(k_norm(wk . row)), V = wv . row at the row's absolute position, into the cache;
 *   2. runs the block [root, MASK x (B-1)] at positions n_past .. n_past+B-1 through every layer:
 *      Q from the block rows only, K/V of the block rows appended after the cached context rows,
 *      full layers non-causal over everything, sliding-window layers over the last `sliding_window`
 *      context rows and causal inside the block;
 *   3. projects rows 1..n_depths with the draft's output_norm and the target's LM head, and returns
 *      each row's top-K log-softmax entries (ties to the lower token id).
 * The cache is laid out so that context row i sits at cache row i and block row j at n_past + j,
 * which lets the target's attention kernel run unchanged on a window [first, last] of rows.
 * The target context is only read. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dflash.h"
#include "error.h"
#include "tensor_types.h"

static int imax(int a, int b) { return a > b ? a : b; }
static float *alloc_floats(int64_t n) { return (float *)calloc((size_t)(n > 0 ? n : 1), sizeof(float)); }

static void free_array(float **arr, int n) {
    if (!arr) return;
    for (int i = 0; i < n; i++) free(arr[i]);
    free(arr);
}

SPECLA_API void specla_draft_context_free(specla_draft_context *dc) {
    if (!dc) return;
    free_array(dc->k_cache, dc->n_layer);
    free_array(dc->v_cache, dc->n_layer);
    float *bufs[] = {dc->last_feature, dc->features, dc->ctx_rows, dc->k_rows, dc->hidden, dc->normed, dc->q,
                     dc->mix, dc->branch, dc->ffn_a, dc->ffn_b, dc->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(dc->positions);
    free(dc->attn_rows);
    free(dc);
}

/* params: n_ctx = most target positions the draft can follow; max_batch = feature rows ingested per
 * pass (<= 0: 64); n_threads, cpu_kernels as for a target context. Other fields are ignored. */
SPECLA_API specla_status specla_draft_context_create(const specla_draft_model *model,
                                                     const specla_context_params *params,
                                                     specla_draft_context **out_context) {
    if (!model || !params || !out_context)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_draft_context_create: NULL argument");
    *out_context = NULL;
    if (params->n_ctx <= 0)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "draft context: n_ctx must be positive, got %d",
                           params->n_ctx);
    const specla_draft_hparams *hp = &model->hp;
    const int B = hp->block_size;
    if ((int64_t)params->n_ctx + B > INT32_MAX)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "draft context: n_ctx %d is too large", params->n_ctx);
    cpu_exec exec;
    specla_status st = cpu_exec_resolve(params->n_threads, params->cpu_kernels, &exec);
    if (st != SPECLA_OK) return st;

    specla_draft_context *dc = (specla_draft_context *)calloc(1, sizeof *dc);
    if (!dc) return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "draft context: out of memory");
    dc->model = model;
    dc->n_layer = hp->n_layer;
    dc->exec = exec;
    dc->n_ctx = params->n_ctx;
    dc->n_rows = params->n_ctx + B;
    dc->chunk = params->max_batch > 0 ? params->max_batch : 64;
    dc->logit_head = model->target->output;
    if (dc->chunk > params->n_ctx) dc->chunk = params->n_ctx;

    const int L = hp->n_layer, E = hp->n_embd, D = hp->head_dim, nh = hp->n_head, nkv = hp->n_head_kv;
    const int64_t W = (int64_t)hp->n_target_layers * model->target_n_embd, kv_row = (int64_t)nkv * D;
    const int V = model->target->hp.n_vocab, rows = imax(dc->chunk, B);
    int ok = 1;
    dc->k_cache = (float **)calloc((size_t)L, sizeof(float *));
    dc->v_cache = (float **)calloc((size_t)L, sizeof(float *));
    ok = dc->k_cache && dc->v_cache;
    for (int il = 0; ok && il < L; il++) {
        dc->k_cache[il] = alloc_floats((int64_t)dc->n_rows * kv_row);
        dc->v_cache[il] = alloc_floats((int64_t)dc->n_rows * kv_row);
        ok = dc->k_cache[il] && dc->v_cache[il];
    }
    if (ok) {
        dc->last_feature = alloc_floats(W);
        dc->features = alloc_floats(dc->chunk * W);
        dc->ctx_rows = alloc_floats((int64_t)dc->chunk * E);
        dc->k_rows = alloc_floats(rows * kv_row);
        dc->hidden = alloc_floats((int64_t)B * E);
        dc->normed = alloc_floats((int64_t)B * E);
        dc->q = alloc_floats((int64_t)B * nh * D);
        dc->mix = alloc_floats((int64_t)B * nh * D);
        dc->branch = alloc_floats((int64_t)B * E);
        dc->ffn_a = alloc_floats((int64_t)B * hp->n_ff);
        dc->ffn_b = alloc_floats((int64_t)B * hp->n_ff);
        dc->logits = alloc_floats((int64_t)(B - 1) * V);
        dc->positions = (int32_t *)calloc((size_t)rows, sizeof(int32_t));
        dc->attn_rows = (int32_t *)calloc((size_t)B, sizeof(int32_t));
        ok = dc->last_feature && dc->features && dc->ctx_rows && dc->k_rows && dc->hidden && dc->normed && dc->q &&
             dc->mix && dc->branch && dc->ffn_a && dc->ffn_b && dc->logits && dc->positions && dc->attn_rows;
    }
    if (!ok) {
        specla_draft_context_free(dc);
        return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "draft context: out of memory for n_ctx %d", params->n_ctx);
    }
    *out_context = dc;
    return SPECLA_OK;
}

SPECLA_API specla_status specla_draft_context_reset(specla_draft_context *dc) {
    if (!dc) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_draft_context_reset: NULL context");
    dc->ingested = 0; /* cache rows beyond `ingested` are never read */
    dc->source = NULL;
    return SPECLA_OK;
}

SPECLA_API specla_status specla_draft_context_set_logit_head(specla_draft_context *dc, const specla_tensor *head) {
    if (!dc) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_draft_context_set_logit_head: NULL context");
    const specla_model *target = dc->model->target;
    if (!head) {
        dc->logit_head = target->output;
        return SPECLA_OK;
    }
    specla_status st =
        logit_head_check(head, target->hp.n_embd, target->hp.n_vocab, "specla_draft_context_set_logit_head");
    if (st != SPECLA_OK) return st;
    dc->logit_head = *head;
    return SPECLA_OK;
}

/* K (normed, rotated) and V rows of `n` inputs x[n][E] at `positions` for draft layer il, written to
 * cache rows first .. first+n-1. */
static void write_kv_rows(specla_draft_context *dc, int il, const float *x, int n, int first) {
    const specla_draft_model *m = dc->model;
    const specla_draft_hparams *hp = &m->hp;
    const specla_draft_layer_weights *w = &m->layers[il];
    const int D = hp->head_dim, nkv = hp->n_head_kv;
    const int64_t kv_row = (int64_t)nkv * D;
    cpu_matmul(&dc->exec, &w->attn_k, x, n, dc->k_rows);
    cpu_rms_norm(dc->k_rows, (const float *)w->attn_k_norm.data, n * nkv, D, hp->rms_eps, dc->k_rows);
    cpu_rope_neox(dc->k_rows, dc->positions, n, nkv, D, D, hp->rope_freq_base);
    memcpy(dc->k_cache[il] + first * kv_row, dc->k_rows, sizeof(float) * (size_t)(n * kv_row));
    cpu_matmul(&dc->exec, &w->attn_v, x, n, dc->v_cache[il] + first * kv_row);
}

/* Context rows of target positions [first, first + n), n <= chunk, into every layer's cache. */
static void ingest_chunk(specla_draft_context *dc, const specla_context *target, int first, int n) {
    const specla_draft_model *m = dc->model;
    const specla_draft_hparams *hp = &m->hp;
    const int E = hp->n_embd, Et = m->target_n_embd, N = hp->n_target_layers;
    const int64_t W = (int64_t)N * Et;
    for (int r = 0; r < n; r++) {
        memcpy(dc->features + r * W, qwen35_context_features(target, first + r), sizeof(float) * (size_t)W);
        dc->positions[r] = first + r;
    }
    if (hp->context_kv_layer_norm)
        for (int r = 0; r < n; r++)
            for (int i = 0; i < N; i++) {
                float *slice = dc->features + r * W + (int64_t)i * Et;
                cpu_rms_norm(slice, (const float *)m->aux_hidden_norm[i].data, 1, Et, hp->rms_eps, slice);
            }
    cpu_matmul(&dc->exec, &m->fc, dc->features, n, dc->ctx_rows);
    cpu_rms_norm(dc->ctx_rows, (const float *)m->hidden_norm.data, n, E, hp->rms_eps, dc->ctx_rows);
    for (int il = 0; il < hp->n_layer; il++) write_kv_rows(dc, il, dc->ctx_rows, n, first);
}

static void ingest(specla_draft_context *dc, const specla_context *target) {
    const int64_t W = (int64_t)dc->model->hp.n_target_layers * dc->model->target_n_embd;
    const int n_past = target->n_past;
    /* Restart from 0 when the rows may be stale: another target context, a target rolled back
     * below what was ingested, or one rolled back and re-advanced (its row at ingested - 1 changed). */
    if (dc->source != target || n_past < dc->ingested ||
        (dc->ingested > 0 &&
         memcmp(dc->last_feature, qwen35_context_features(target, dc->ingested - 1), sizeof(float) * (size_t)W) != 0))
        dc->ingested = 0;
    dc->source = target;
    while (dc->ingested < n_past) {
        const int n = n_past - dc->ingested < dc->chunk ? n_past - dc->ingested : dc->chunk;
        ingest_chunk(dc, target, dc->ingested, n);
        dc->ingested += n;
    }
    if (n_past > 0) memcpy(dc->last_feature, qwen35_context_features(target, n_past - 1), sizeof(float) * (size_t)W);
}

static void add_in_place(float *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}

/* The block through every layer; leaves the final residual stream in dc->hidden. */
static void run_block(specla_draft_context *dc, int n_past, int32_t root_token) {
    const specla_draft_model *m = dc->model;
    const specla_draft_hparams *hp = &m->hp;
    const cpu_exec *ex = &dc->exec;
    const int B = hp->block_size, E = hp->n_embd, D = hp->head_dim, nh = hp->n_head, nkv = hp->n_head_kv;
    const int F = hp->n_ff;
    const int64_t kv_row = (int64_t)nkv * D;

    for (int j = 0; j < B; j++) {
        cpu_get_row(&m->target->token_embd, j == 0 ? root_token : hp->mask_token_id, dc->hidden + (int64_t)j * E);
        dc->positions[j] = n_past + j;
    }
    for (int il = 0; il < hp->n_layer; il++) {
        const specla_draft_layer_weights *w = &m->layers[il];
        cpu_rms_norm(dc->hidden, (const float *)w->attn_norm.data, B, E, hp->rms_eps, dc->normed);
        cpu_matmul(ex, &w->attn_q, dc->normed, B, dc->q);
        cpu_rms_norm(dc->q, (const float *)w->attn_q_norm.data, B * nh, D, hp->rms_eps, dc->q);
        cpu_rope_neox(dc->q, dc->positions, B, nh, D, D, hp->rope_freq_base);
        /* KV injection: the block's own K/V go to cache rows n_past .. n_past+B-1, right after the
         * context rows (the next ingestion overwrites them with context rows) */
        write_kv_rows(dc, il, dc->normed, B, n_past);

        int first = 0;
        if (m->layer_is_swa[il]) {
            first = n_past - hp->sliding_window > 0 ? n_past - hp->sliding_window : 0;
            for (int j = 0; j < B; j++) dc->attn_rows[j] = n_past + j - first; /* causal in the block */
        } else {
            for (int j = 0; j < B; j++) dc->attn_rows[j] = n_past + B - 1; /* every row */
        }
        cpu_attention(ex, dc->q, dc->k_cache[il] + first * kv_row, dc->v_cache[il] + first * kv_row, dc->attn_rows,
                      B, n_past + B - first, nh, nkv, D, dc->mix);
        cpu_matmul(ex, &w->attn_output, dc->mix, B, dc->branch);
        add_in_place(dc->hidden, dc->branch, (int64_t)B * E);

        cpu_rms_norm(dc->hidden, (const float *)w->ffn_norm.data, B, E, hp->rms_eps, dc->normed);
        cpu_matmul(ex, &w->ffn_gate, dc->normed, B, dc->ffn_a);
        cpu_matmul(ex, &w->ffn_up, dc->normed, B, dc->ffn_b);
        for (int64_t i = 0; i < (int64_t)B * F; i++) dc->ffn_a[i] = cpu_silu(dc->ffn_a[i]) * dc->ffn_b[i];
        cpu_matmul(ex, &w->ffn_down, dc->ffn_a, B, dc->branch);
        add_in_place(dc->hidden, dc->branch, (int64_t)B * E);
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

SPECLA_API specla_status specla_draft_propose(specla_draft_context *dc, const specla_context *target,
                                              int32_t root_token, int32_t n_depths, int32_t top_k, int32_t *tokens,
                                              float *logprobs) {
    if (!dc || !target || !tokens || !logprobs)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_draft_propose: NULL argument");
    const specla_draft_model *m = dc->model;
    const specla_draft_hparams *hp = &m->hp;
    const int B = hp->block_size, V = m->target->hp.n_vocab, E = hp->n_embd;
    if (target->model != m->target)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                           "specla_draft_propose: the target context belongs to another model than the one the draft "
                           "was created with");
    if (target->n_capture <= 0 || !target->features)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                           "specla_draft_propose: the target context captures no feature rows (create it with "
                           "capture_layers = the draft's %d target layers)",
                           hp->n_target_layers);
    if (target->n_capture != hp->n_target_layers)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                           "specla_draft_propose: the target context captures %d layers, the draft reads %d",
                           target->n_capture, hp->n_target_layers);
    if (root_token < 0 || root_token >= V)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_draft_propose: root_token %d is outside [0, %d)",
                           root_token, V);
    if (n_depths < 1 || n_depths > B - 1)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_draft_propose: n_depths %d not in [1, block_size - 1 = %d]",
                           n_depths, B - 1);
    const int n_scored = (int)dc->logit_head.ne1; /* V, or the rows of a chosen head */
    if (top_k < 1 || top_k > n_scored)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_draft_propose: top_k %d not in [1, %s = %d]", top_k,
                           n_scored == V ? "n_vocab" : "rows of the chosen logit head", n_scored);
    const int n_past = target->n_past;
    if (n_past > dc->n_ctx)
        return specla_fail(SPECLA_ERR_STATE,
                           "specla_draft_propose: the target holds %d positions, the draft context only %d (n_ctx)",
                           n_past, dc->n_ctx);
    for (int pos = 0; pos < n_past; pos++)
        if (!qwen35_context_features(target, pos))
            return specla_fail(SPECLA_ERR_STATE, "specla_draft_propose: the target has no feature row for position %d",
                               pos);

    ingest(dc, target);
    run_block(dc, n_past, root_token);

    /* rows 1..n_depths: the draft's output_norm, then the target's LM head matrix, or the rows of it
     * this context scores (not the target's output_norm: the draft's final norm replaces it) */
    cpu_rms_norm(dc->hidden + E, (const float *)m->output_norm.data, n_depths, E, hp->rms_eps, dc->normed);
    cpu_matmul(&dc->exec, &dc->logit_head, dc->normed, n_depths, dc->logits);
#pragma omp parallel for num_threads(dc->exec.n_threads) schedule(static) if (n_depths > 1)
    for (int r = 0; r < n_depths; r++)
        topk_row(dc->logits + (int64_t)r * n_scored, n_scored, top_k, tokens + (int64_t)r * top_k,
                 logprobs + (int64_t)r * top_k);
    return SPECLA_OK;
}
