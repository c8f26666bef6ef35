/* The DFlash draft forward (docs/ddtree-dflash.md; numpy oracle: pyspecla/reference/dflash.py), on
 * the draft context's backend.
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
 * The target context is only read.
 *
 * Where it runs: on the draft context's backend, with the draft's weights as that backend reads
 * them (weights_dflash.c) and the target model's embedding and LM head from the target's own copy
 * on that device (model_weights_for): no host pointer reaches an op. The target's feature rows are
 * copied device to device (both contexts on one device; the draft's stream first waits for the
 * target's, which may still be moving rows of an accepted path). Which rows are still current is
 * known from the target's rewrite log (context_unchanged_rows), never by reading the device. A
 * propose call uploads its small index arrays and reads back one thing: the [n_depths][top_k] ids
 * and log-probs, in one piece (the only host wait of the call on a GPU).
 *
 * Recorded proposals: ingestion runs eagerly (its row count changes per call), the rest of a call
 * (the block, the head, the top-k) is the same sequence of launches at every n_past. The block's
 * K/V go to the cache through its positions (block_ints, uploaded per call, read on the device), the
 * sliding window's start likewise, attention grids are sized for the cache's capacity (blocks
 * past a query's rows leave), and a chosen head is multiplied over its capacity with the count of
 * rows that rank read on the device (logit_rows_scored_head). So a backend that records steps records that
 * part once per (depths, top-k, head memory and capacity) and replays it; recording off
 * (no_recorded_steps) runs the same ops eagerly. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend_registry.h"
#include "dflash.h"
#include "error.h"
#include "tensor_types.h"

/* Most top-k entries per row a propose call may ask of a backend whose memory is not host memory
 * (the answer passes through the draft context's buffers); a host backend writes the caller's. */
#define DRAFT_TOP_CAPACITY 64

static int imax(int a, int b) { return a > b ? a : b; }
static float *alloc_floats(const backend *be, int64_t n) {
    return (float *)be->ops->alloc(be, sizeof(float) * (size_t)(n > 0 ? n : 1));
}
static int32_t *alloc_ints(const backend *be, int64_t n) {
    return (int32_t *)be->ops->alloc(be, sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
}
static void release(const backend *be, void *ptr) {
    if (ptr) be->ops->free(be, ptr);
}

static void free_array(const backend *be, float **arr, int n) {
    if (!arr) return;
    for (int i = 0; i < n; i++) release(be, arr[i]);
    free(arr);
}

SPECLA_API void specla_draft_context_free(specla_draft_context *dc) {
    if (!dc) return;
    backend *be = dc->be;
    if (be) {
        free_array(be, dc->k_cache, dc->n_layer);
        free_array(be, dc->v_cache, dc->n_layer);
        void *bufs[] = {dc->features, dc->ctx_rows, dc->hidden, dc->normed, dc->q, dc->mix, dc->branch, dc->ffn_a,
                        dc->ffn_b, dc->block_k, dc->block_v, dc->logits, dc->positions, dc->block_ints, dc->top};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) release(be, bufs[i]);
        logit_rows_release(&dc->logit_rows, be);
        be->ops->destroy(be);
    }
    free(dc->host_top);
    free(dc->host_ints);
    free(dc->ingest_mats);
    free(dc->ingest_outs);
    free(dc);
}

/* params: n_ctx = most target positions the draft can follow; max_batch = feature rows ingested per
 * pass (<= 0: 64); n_threads, cpu_kernels, backend, device and no_recorded_steps as for a target
 * context. Other fields are ignored. */
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
    int chunk = params->max_batch > 0 ? params->max_batch : 64;
    if (chunk > params->n_ctx) chunk = params->n_ctx;
    const int L = hp->n_layer, E = hp->n_embd, D = hp->head_dim, nh = hp->n_head, nkv = hp->n_head_kv;
    const int64_t W = (int64_t)hp->n_target_layers * model->target_n_embd, kv_row = (int64_t)nkv * D;
    const int V = model->target->hp.n_vocab, rows = imax(chunk, B);
    const backend_limits limits = {rows, (int)(W > imax(E, hp->n_ff) ? W : imax(E, hp->n_ff)), params->n_ctx + B, 0,
                                   0, 0, 0, nh, D, model->target->hp.n_vocab};
    backend *be = NULL;
    specla_status st =
        backend_open(params->backend, params->device, params->n_threads, params->cpu_kernels, &limits, &be);
    if (st != SPECLA_OK) return st;

    specla_draft_context *dc = (specla_draft_context *)calloc(1, sizeof *dc);
    if (!dc) {
        be->ops->destroy(be);
        return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "draft context: out of memory");
    }
    dc->model = model;
    dc->n_layer = hp->n_layer;
    dc->be = be;
    dc->n_ctx = params->n_ctx;
    dc->n_rows = params->n_ctx + B;
    dc->chunk = chunk;
    dc->no_recorded_steps = params->no_recorded_steps != 0;
    /* the draft's weights, and the target's embedding and LM head, where this backend reads them */
    if ((st = draft_weights_for(model, be, &dc->weights)) != SPECLA_OK ||
        (st = model_weights_for(model->target, be, &dc->target_weights)) != SPECLA_OK) {
        specla_draft_context_free(dc);
        return st;
    }
    dc->logit_head = dc->target_weights.output;
    int ok = 1;
    dc->k_cache = (float **)calloc((size_t)L, sizeof(float *));
    dc->v_cache = (float **)calloc((size_t)L, sizeof(float *));
    ok = dc->k_cache && dc->v_cache;
    for (int il = 0; ok && il < L; il++) {
        dc->k_cache[il] = alloc_floats(be, (int64_t)dc->n_rows * kv_row);
        dc->v_cache[il] = alloc_floats(be, (int64_t)dc->n_rows * kv_row);
        ok = dc->k_cache[il] && dc->v_cache[il];
    }
    if (ok) {
        dc->host_ints = (int32_t *)malloc(sizeof(int32_t) * (size_t)imax(rows, BLOCK_INTS(B)));
        dc->ingest_mats = (const specla_tensor **)calloc(2 * (size_t)L, sizeof(const specla_tensor *));
        dc->ingest_outs = (float **)calloc(2 * (size_t)L, sizeof(float *));
        dc->features = alloc_floats(be, dc->chunk * W);
        dc->ctx_rows = alloc_floats(be, (int64_t)dc->chunk * E);
        dc->hidden = alloc_floats(be, (int64_t)B * E);
        dc->normed = alloc_floats(be, (int64_t)B * E);
        dc->q = alloc_floats(be, (int64_t)B * nh * D);
        dc->mix = alloc_floats(be, (int64_t)B * nh * D);
        dc->branch = alloc_floats(be, (int64_t)B * E);
        dc->ffn_a = alloc_floats(be, (int64_t)B * hp->n_ff);
        dc->ffn_b = alloc_floats(be, (int64_t)B * hp->n_ff);
        dc->block_k = alloc_floats(be, (int64_t)B * kv_row);
        dc->block_v = alloc_floats(be, (int64_t)B * kv_row);
        dc->logits = alloc_floats(be, (int64_t)(B - 1) * V);
        dc->positions = alloc_ints(be, rows);
        dc->block_ints = alloc_ints(be, BLOCK_INTS(B));
        dc->top_capacity = DRAFT_TOP_CAPACITY;
        const size_t top_bytes = (sizeof(int32_t) + sizeof(float)) * (size_t)(B - 1) * (size_t)dc->top_capacity;
        dc->top = be->ops->alloc(be, top_bytes);
        dc->host_top = malloc(top_bytes);
        ok = dc->host_ints && dc->ingest_mats && dc->ingest_outs && dc->features && dc->ctx_rows && dc->hidden &&
             dc->normed && dc->q && dc->mix && dc->branch && dc->ffn_a && dc->ffn_b && dc->block_k && dc->block_v &&
             dc->logits && dc->positions && dc->block_ints && dc->top && dc->host_top;
    }
    for (int il = 0; ok && il < L; il++) { /* the ingest's one matmul group: every layer's K, then V */
        dc->ingest_mats[2 * il] = &dc->weights.layers[il].attn_k;
        dc->ingest_mats[2 * il + 1] = &dc->weights.layers[il].attn_v;
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
    dc->source_id = 0;
    return SPECLA_OK;
}

SPECLA_API int32_t specla_draft_context_backend(const specla_draft_context *dc) { return dc ? dc->be->kind : -1; }

SPECLA_API specla_status specla_draft_context_launch_counters(specla_draft_context *dc, int64_t *launches,
                                                              int64_t *host_waits) {
    if (!dc || !launches || !host_waits)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_draft_context_launch_counters: NULL argument");
    int64_t out[3];
    dc->be->ops->launch_counters(dc->be, out);
    *launches = out[0], *host_waits = out[1];
    return SPECLA_OK;
}

SPECLA_API specla_status specla_draft_context_set_logit_head(specla_draft_context *dc, const specla_tensor *head) {
    if (!dc) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_draft_context_set_logit_head: NULL context");
    const specla_model *target = dc->model->target;
    return logit_head_set(dc->be, head, &dc->target_weights.output, target->hp.n_embd, target->hp.n_vocab,
                          &dc->logit_head, "specla_draft_context_set_logit_head",
                          "specla_draft_context_set_logit_rows");
}

SPECLA_API specla_status specla_draft_context_set_logit_rows(specla_draft_context *dc, const int32_t *ids, int32_t n) {
    static const char op[] = "specla_draft_context_set_logit_rows";
    if (!dc) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: NULL context", op);
    const specla_model *target = dc->model->target;
    return logit_rows_select(&dc->logit_rows, dc->be, &dc->target_weights.output, target->hp.n_vocab, ids, n,
                             &dc->logit_head, op);
}

/* The K and V rows of context rows x[n][E] at `positions` (backend memory) for every draft layer,
 * into the cache rows starting at `at`: every layer's two projections in one matmul group (they all
 * read x, so a GPU splits the activations once and launches CUDA_MATMUL_GROUP_LAUNCH matrices at a
 * time, where a call per layer paid a split and a launch of two small matrices per layer; the same
 * bits as one call each), then each layer's K normed and rotated in place. */
static void project_context(specla_draft_context *dc, const float *x, int n, const int32_t *positions, int64_t at) {
    const specla_draft_model *m = dc->model;
    const specla_draft_hparams *hp = &m->hp;
    const int D = hp->head_dim, nkv = hp->n_head_kv, L = hp->n_layer;
    const backend *be = dc->be;
    for (int il = 0; il < L; il++) { /* ingest_mats is filled once, at creation */
        dc->ingest_outs[2 * il] = dc->k_cache[il] + at;
        dc->ingest_outs[2 * il + 1] = dc->v_cache[il] + at;
    }
    be->ops->matmul_group(be, 2 * L, dc->ingest_mats, x, n, dc->ingest_outs);
    for (int il = 0; il < L; il++) {
        float *k = dc->k_cache[il] + at;
        be->ops->rms_norm(be, k, (const float *)dc->weights.layers[il].attn_k_norm.data, n * nkv, D, hp->rms_eps, k);
        be->ops->rope_neox(be, k, positions, n, nkv, D, D, hp->rope_freq_base);
    }
}

/* Context rows of target positions [first, first + n), n <= chunk, into every layer's cache. */
static void ingest_chunk(specla_draft_context *dc, const specla_context *target, int first, int n) {
    const specla_draft_model *m = dc->model;
    const specla_draft_hparams *hp = &m->hp;
    const int E = hp->n_embd, Et = m->target_n_embd, N = hp->n_target_layers;
    const int64_t W = (int64_t)N * Et;
    const backend *be = dc->be;
    /* the committed rows are consecutive in the target's feature buffer */
    be->ops->copy(be, dc->features, context_features(target, first), sizeof(float) * (size_t)(n * W));
    for (int r = 0; r < n; r++) dc->host_ints[r] = first + r;
    be->ops->upload(be, dc->positions, dc->host_ints, sizeof(int32_t) * (size_t)n);
    if (hp->context_kv_layer_norm)
        for (int r = 0; r < n; r++)
            for (int i = 0; i < N; i++) {
                float *slice = dc->features + r * W + (int64_t)i * Et;
                be->ops->rms_norm(be, slice, (const float *)dc->weights.aux_hidden_norm[i].data, 1, Et, hp->rms_eps,
                                  slice);
            }
    be->ops->matmul(be, &dc->weights.fc, dc->features, n, dc->ctx_rows);
    be->ops->rms_norm(be, dc->ctx_rows, (const float *)dc->weights.hidden_norm.data, n, E, hp->rms_eps, dc->ctx_rows);
    /* cache rows first .. first + n - 1 */
    project_context(dc, dc->ctx_rows, n, dc->positions, (int64_t)first * hp->n_head_kv * hp->head_dim);
}

/* Brings the cache up to the target's n_past: keeps the rows of positions the target has not
 * dropped since they were ingested (its rewrite log; another target context: none), ingests the
 * rest in chunks. */
static void ingest(specla_draft_context *dc, const specla_context *target) {
    const int n_past = target->n_past;
    int keep = 0;
    if (dc->source_id == target->id) {
        keep = context_unchanged_rows(target, dc->source_rewrites);
        if (keep > dc->ingested) keep = dc->ingested;
    }
    dc->ingested = keep;
    dc->source_id = target->id;
    dc->source_rewrites = target->rewrites;
    /* the target's stream may still be writing the rows to ingest (an accepted path's compaction) */
    if (dc->ingested < n_past) dc->be->ops->wait_for(dc->be, target->be);
    while (dc->ingested < n_past) {
        const int n = n_past - dc->ingested < dc->chunk ? n_past - dc->ingested : dc->chunk;
        ingest_chunk(dc, target, dc->ingested, n);
        dc->ingested += n;
    }
}

/* Every index array of the block, in one upload (block_ints): what a recorded proposal reads of n_past
 * and the root token. */
static void upload_block(specla_draft_context *dc, int n_past, int32_t root_token) {
    const specla_draft_hparams *hp = &dc->model->hp;
    const int B = hp->block_size;
    const int swa_first = n_past - hp->sliding_window > 0 ? n_past - hp->sliding_window : 0;
    int32_t *ints = dc->host_ints;
    for (int j = 0; j < B; j++) {
        ints[BLOCK_POSITIONS * B + j] = n_past + j; /* also the cache row of block row j */
        ints[BLOCK_TOKENS * B + j] = j == 0 ? root_token : hp->mask_token_id;
        ints[BLOCK_ROWS_SWA * B + j] = n_past + j - swa_first; /* causal in the block */
        ints[BLOCK_ROWS_FULL * B + j] = n_past + B - 1;        /* every row */
    }
    ints[BLOCK_INT_KINDS * B] = swa_first;
    dc->be->ops->upload(dc->be, dc->block_ints, ints, sizeof(int32_t) * (size_t)BLOCK_INTS(B));
}

/* The block through every layer; leaves the final residual stream in dc->hidden and its output_norm
 * (the draft's final norm) in dc->normed. Reads n_past only
 * from block_ints (upload_block), so the same launches serve every call: the rows a query attends are
 * bounded by the cache's capacity (full layers) or the window plus the block (sliding-window layers),
 * as a target context bounds them by n_ctx, and a GPU's blocks past a query's rows leave. */
static void run_block(specla_draft_context *dc) {
    const specla_draft_model *m = dc->model;
    const specla_draft_hparams *hp = &m->hp;
    const backend *be = dc->be;
    const backend_ops *ops = be->ops;
    const int B = hp->block_size, E = hp->n_embd, D = hp->head_dim, nh = hp->n_head, nkv = hp->n_head_kv;
    const int F = hp->n_ff;
    const int32_t *positions = dc->block_ints + BLOCK_POSITIONS * B;
    const int32_t *window_first = dc->block_ints + BLOCK_INT_KINDS * B;
    const int swa_rows = hp->sliding_window + B < dc->n_rows ? hp->sliding_window + B : dc->n_rows;
    ops->get_rows(be, &dc->target_weights.token_embd, dc->block_ints + BLOCK_TOKENS * B, B, dc->hidden);
    ops->rms_norm(be, dc->hidden, (const float *)dc->weights.layers[0].attn_norm.data, B, E, hp->rms_eps, dc->normed);
    for (int il = 0; il < hp->n_layer; il++) {
        const specla_draft_layer_weights *w = &dc->weights.layers[il];
        /* K, V and Q of the block in one matmul group (one split of the activations on a GPU) */
        const specla_tensor *projections[3] = {&w->attn_k, &w->attn_v, &w->attn_q};
        float *const projected[3] = {dc->block_k, dc->block_v, dc->q};
        ops->matmul_group(be, 3, projections, dc->normed, B, projected);
        /* Q and K normed and rotated, and the KV injection: the block's own K/V go to cache rows
         * n_past .. n_past+B-1 (its positions), right after the context rows (the next ingestion
         * overwrites them with context rows). One op, one kernel on a GPU where six ran: each of the
         * ops it stands for touches its own buffer, so their order is free and the bits are theirs. */
        ops->attention_prepare(be, NULL, dc->q, NULL, dc->block_k, dc->block_v, (const float *)w->attn_q_norm.data,
                               (const float *)w->attn_k_norm.data, hp->rms_eps, positions, D, hp->rope_freq_base,
                               positions, B, nh, nkv, D, dc->k_cache[il], dc->v_cache[il]);

        const int swa = m->layer_is_swa[il];
        ops->attention(be, dc->q, dc->k_cache[il], dc->v_cache[il], swa ? window_first : NULL,
                       dc->block_ints + (swa ? BLOCK_ROWS_SWA : BLOCK_ROWS_FULL) * B, B,
                       swa ? swa_rows : dc->n_rows, nh, nkv, D, dc->mix);
        ops->matmul(be, &w->attn_output, dc->mix, B, dc->branch);
        /* every residual add meets the norm after it: one op (on a GPU one kernel that also adds the
         * matmul's split-K partial sums itself), the bits of add then rms_norm */
        ops->add_rms_norm(be, dc->hidden, dc->branch, (const float *)w->ffn_norm.data, B, E, hp->rms_eps, dc->normed);
        const specla_tensor *ffn_in[2] = {&w->ffn_gate, &w->ffn_up};
        float *const ffn_out[2] = {dc->ffn_a, dc->ffn_b};
        ops->matmul_group(be, 2, ffn_in, dc->normed, B, ffn_out);
        ops->silu_mul(be, dc->ffn_a, dc->ffn_b, (int64_t)B * F);
        ops->matmul(be, &w->ffn_down, dc->ffn_a, B, dc->branch);
        /* the next layer's attn_norm, after the last layer the draft's output_norm */
        const specla_tensor *next_norm =
            il + 1 < hp->n_layer ? &dc->weights.layers[il + 1].attn_norm : &dc->weights.output_norm;
        ops->add_rms_norm(be, dc->hidden, dc->branch, (const float *)next_norm->data, B, E, hp->rms_eps, dc->normed);
    }
}

/* The block, then rows 1..n_depths through the draft's output_norm and the target's LM head matrix,
 * or the rows of it this context scores (not the target's output_norm: the draft's final norm
 * replaces it), then each row's top_k into top_ids / top_logprobs (backend memory). */
static void enqueue_proposal(specla_draft_context *dc, const specla_tensor *head, const int32_t *head_rows_ranked,
                             int n_depths, int top_k, int32_t *top_ids, float *top_logprobs) {
    const specla_draft_hparams *hp = &dc->model->hp;
    const backend *be = dc->be;
    const int E = hp->n_embd;
    run_block(dc);
    be->ops->matmul(be, head, dc->normed + E, n_depths, dc->logits); /* rows 1 .. n_depths */
    be->ops->topk_log_softmax(be, dc->logits, n_depths, (int)head->ne1, top_k, top_ids, top_logprobs,
                              head_rows_ranked);
}

/* A proposal as one recorded step: replayed when one was recorded for these depths, top-k and head,
 * else recorded now and replayed. 1 when it ran so; 0 when the backend could not record (nothing ran;
 * this context proposes eagerly from now on). */
static int replay_proposal(specla_draft_context *dc, const specla_tensor *head, const int32_t *head_rows_ranked,
                           int n_depths, int top_k, int32_t *top_ids, float *top_logprobs) {
    const backend *be = dc->be;
    const recorded_propose_key key = {{head->data, head->ne1, head_rows_ranked}, n_depths, top_k};
    const recorded_propose_key *r = &dc->recorded;
    const int same_key = same_head_key(&r->head, &key.head) && r->n_depths == key.n_depths &&
                         r->top_k == key.top_k;
    if (same_key && be->ops->replay(be, STEP_PROPOSE)) return 1;
    be->ops->capture_begin(be);
    enqueue_proposal(dc, head, head_rows_ranked, n_depths, top_k, top_ids, top_logprobs);
    if (be->ops->capture_end(be, STEP_PROPOSE) == SPECLA_OK && be->ops->replay(be, STEP_PROPOSE)) {
        dc->recorded = key;
        return 1;
    }
    dc->recorded.n_depths = 0;
    dc->no_recorded_steps = 1;
    return 0;
}

SPECLA_API specla_status specla_draft_propose(specla_draft_context *dc, const specla_context *target,
                                              int32_t root_token, int32_t n_depths, int32_t top_k, int32_t *tokens,
                                              float *logprobs) {
    if (!dc || !target || !tokens || !logprobs)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_draft_propose: NULL argument");
    const specla_draft_model *m = dc->model;
    const specla_draft_hparams *hp = &m->hp;
    const int B = hp->block_size, V = m->target->hp.n_vocab;
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
    if (!dc->be->ops->host_memory && top_k > dc->top_capacity)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_draft_propose: top_k %d > %d on backend %s", top_k,
                           dc->top_capacity, dc->be->ops->name);
    if (target->be->kind != dc->be->kind)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                           "specla_draft_propose: the target context runs on %s, the draft context on %s",
                           target->be->ops->name, dc->be->ops->name);
    if (!dc->be->ops->host_memory && target->be->device != dc->be->device)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                           "specla_draft_propose: the target context runs on %s device %d, the draft context on %s "
                           "device %d (the draft reads the target's feature rows and weights on its own device: "
                           "create both on the same one)",
                           target->be->ops->name, target->be->device, dc->be->ops->name, dc->be->device);
    const int n_past = target->n_past;
    if (n_past > dc->n_ctx)
        return specla_fail(SPECLA_ERR_STATE,
                           "specla_draft_propose: the target holds %d positions, the draft context only %d (n_ctx)",
                           n_past, dc->n_ctx);
    for (int pos = 0; pos < n_past; pos++)
        if (!context_features(target, pos))
            return specla_fail(SPECLA_ERR_STATE, "specla_draft_propose: the target has no feature row for position %d",
                               pos);

    ingest(dc, target);
    upload_block(dc, n_past, root_token);
    const backend *be = dc->be;
    const int32_t *head_rows_ranked;
    const specla_tensor head = logit_rows_scored_head(&dc->logit_rows, &dc->logit_head, &head_rows_ranked);
    if (be->ops->host_memory) { /* the answer straight into the caller's arrays */
        enqueue_proposal(dc, &head, head_rows_ranked, n_depths, top_k, tokens, logprobs);
        return be->ops->sync(be);
    }
    /* ids and log-probs side by side in backend memory, read back in one piece */
    const size_t n = (size_t)n_depths * (size_t)top_k;
    int32_t *top_ids = (int32_t *)dc->top;
    float *top_logprobs = (float *)(top_ids + n);
    const int recorded = be->ops->replay && !dc->no_recorded_steps &&
                         replay_proposal(dc, &head, head_rows_ranked, n_depths, top_k, top_ids, top_logprobs);
    if (!recorded) enqueue_proposal(dc, &head, head_rows_ranked, n_depths, top_k, top_ids, top_logprobs);
    const specla_status st = be->ops->download(be, dc->host_top, dc->top, (sizeof(int32_t) + sizeof(float)) * n);
    if (st != SPECLA_OK) return st;
    memcpy(tokens, dc->host_top, sizeof(int32_t) * n);
    memcpy(logprobs, (const int32_t *)dc->host_top + n, sizeof(float) * n);
    return SPECLA_OK;
}
