/* The trunk forward pass, for every architecture: one call runs a batch of T tokens through every
 * layer (a Gated DeltaNet or an attention block, then the SwiGLU FFN) and appends it to the
 * context's durable state. Every op goes through the context's backend; nothing here allocates.
 *
 * Every op computes each token row exactly as it would for a batch of one (matmuls are
 * batch-invariant, the conv and the delta rule walk tokens in order, attention rows are
 * independent), so prefilling a prompt gives bit-identical logits to decoding it token by token. */
#include "context.h"
#include "error.h"
#include "factor_banks.h"
#include "hld_schedule.h"

static void swiglu_ffn(specla_context *ctx, int il, const float *x, int T, float *out) {
    const specla_layer_weights *w = &ctx->weights.layers[il];
    const backend *be = ctx->be;
    forward_scratch *s = &ctx->scratch;
    const int F = ctx->model->hp.n_ff;
    const specla_tensor *mats[2] = {&w->ffn_gate, &w->ffn_up};
    float *const outs[2] = {s->ffn_a, s->ffn_b};
    be->ops->matmul_group(be, 2, mats, x, T, outs);
    be->ops->silu_mul(be, s->ffn_a, s->ffn_b, (int64_t)T * F);
    be->ops->matmul(be, &w->ffn_down, s->ffn_a, T, out);
}

/* The last layer's residual add; with logits wanted, fused with the output norm of the last
 * n_logit_rows rows into the scratch's normed rows (the earlier rows are only added). */
static void last_residual_add(specla_context *ctx, int T, int n_logit_rows, int wants_logits) {
    const backend *be = ctx->be;
    forward_scratch *s = &ctx->scratch;
    const int E = ctx->model->hp.n_embd;
    if (!wants_logits) {
        be->ops->add(be, s->hidden, s->layer_out, (int64_t)T * E);
        return;
    }
    const int64_t first = (int64_t)(T - n_logit_rows) * E;
    if (first > 0) be->ops->add(be, s->hidden, s->layer_out, first);
    be->ops->add_rms_norm(be, s->hidden + first, s->layer_out + first, (const float *)ctx->weights.output_norm.data,
                          n_logit_rows, E, ctx->model->hp.rms_eps, s->normed);
}

/* The LM head over the normed last n_logit_rows rows (last_residual_add), in chunks of the
 * scratch's logit rows (a matmul's rows do not depend on the batch, so chunking changes no bits).
 * A chosen head is multiplied over its capacity (logit_rows_scored_head): the argmax ranks the first
 * V entries of rows `stride` apart, and the caller gets those V. So the same ops serve every row
 * count (a recorded step replays as the vocabulary grows), and logits and argmax come from the same
 * matmul whether a call wants one or both. Logits land in the caller's host buffer directly when the
 * backend's memory is host memory and the rows are V apart. */
static void logits_and_argmax(specla_context *ctx, int n_logit_rows, float *logits_out, int want_argmax) {
    const specla_model *m = ctx->model;
    const backend *be = ctx->be;
    const backend_ops *ops = be->ops;
    forward_scratch *s = &ctx->scratch;
    const int E = m->hp.n_embd;
    const int32_t *n_valid;
    const specla_tensor head = logit_rows_scored_head(&ctx->logit_rows, &ctx->logit_head, &n_valid);
    const int64_t V = ctx->logit_head.ne1; /* n_vocab, or the rows of a chosen subset */
    const int64_t stride = head.ne1;       /* V, or a chosen head's capacity */
    const int direct = ops->host_memory && logits_out && stride == V;
    const int chunk = direct ? n_logit_rows : s->logit_rows;
    for (int r0 = 0; r0 < n_logit_rows; r0 += chunk) {
        const int n = n_logit_rows - r0 < chunk ? n_logit_rows - r0 : chunk;
        float *logits = direct ? logits_out + (int64_t)r0 * V : s->logits;
        ops->matmul(be, &head, s->normed + (int64_t)r0 * E, n, logits);
        if (want_argmax) ops->argmax_rows(be, logits, n, (int)stride, s->argmax + r0, n_valid);
        if (!logits_out || direct) continue;
        if (stride == V) {
            ops->download(be, logits_out + (int64_t)r0 * V, logits, sizeof(float) * (size_t)(n * V));
        } else { /* each row's first V entries: one download (a wait) per row; a chosen head's logits
                  * are a draft's, one row per decode step */
            for (int r = 0; r < n; r++)
                ops->download(be, logits_out + (int64_t)(r0 + r) * V, logits + (int64_t)r * stride, sizeof(float) * (size_t)V);
        }
    }
}

/* Every op of a batch, on the backend's stream: embedding, every trunk layer (capturing feature
 * rows where asked), final norm, LM head for the last n_logit_rows rows, argmax into the scratch.
 * Token ids and rows are already in the scratch (backend memory). Waits for nothing unless logits
 * go back to the host (then per logits chunk). */
static void enqueue_model(specla_context *ctx, const batch_view *bv, int n_logit_rows, float *logits_out,
                          int want_argmax) {
    const specla_model *m = ctx->model;
    const specla_hparams *hp = &m->hp;
    const backend *be = ctx->be;
    const backend_ops *ops = be->ops;
    forward_scratch *s = &ctx->scratch;
    const int T = bv->T, E = hp->n_embd;

    /* Each residual add is fused with the norm that reads its result (add_rms_norm: the same bits
     * as the add then the norm): the post-attention norm, the next layer's attention norm, and
     * after the last layer the output norm. */
    const int wants_logits = logits_out || want_argmax;
    ops->get_rows(be, &ctx->weights.token_embd, s->tokens, T, s->hidden);
    ops->rms_norm(be, s->hidden, (const float *)ctx->weights.layers[0].attn_norm.data, T, E, hp->rms_eps, s->normed);
    for (int il = 0; il < hp->n_layer; il++) {
        const specla_layer_weights *w = &ctx->weights.layers[il];
        if (m->layer_is_recurrent[il])
            gated_deltanet_layer(ctx, il, s->normed, bv, s->layer_out);
        else
            attention_layer(ctx, il, s->normed, bv, s->layer_out);
        ops->add_rms_norm(be, s->hidden, s->layer_out, (const float *)w->post_attention_norm.data, T, E, hp->rms_eps,
                          s->normed);
        swiglu_ffn(ctx, il, s->normed, T, s->layer_out);
        if (il + 1 < hp->n_layer)
            ops->add_rms_norm(be, s->hidden, s->layer_out, (const float *)ctx->weights.layers[il + 1].attn_norm.data,
                              T, E, hp->rms_eps, s->normed);
        else
            last_residual_add(ctx, T, n_logit_rows, wants_logits);
        /* the residual stream after this layer's add (hidden), not the normed rows */
        if (ctx->features && ctx->capture_slot[il] >= 0)
            ops->scatter_rows(be, ctx->features + (int64_t)ctx->capture_slot[il] * E, (int64_t)ctx->n_capture * E,
                              bv->rows, s->hidden, T, E);
    }
    if (wants_logits) logits_and_argmax(ctx, n_logit_rows, logits_out, want_argmax);
}

/* The one read-back of a step, the argmax of its n rows, and the step's only wait: a download waits
 * for the stream and reports its errors, so no further sync is needed. */
static specla_status read_argmax(specla_context *ctx, int32_t *argmax_out, int n_rows) {
    const backend *be = ctx->be;
    return be->ops->download(be, argmax_out, ctx->scratch.argmax, sizeof(int32_t) * (size_t)n_rows);
}

/* The end of a step: the argmax of its n_rows rows read back (read_argmax) or, without one, a sync:
 * the backend's status either way. */
static specla_status finish_step(specla_context *ctx, int32_t *argmax_out, int n_rows) {
    return argmax_out ? read_argmax(ctx, argmax_out, n_rows) : ctx->be->ops->sync(ctx->be);
}

/* The whole batch, then finish_step. */
static specla_status run_model(specla_context *ctx, const batch_view *bv, int n_logit_rows, float *logits_out,
                               int32_t *argmax_out) {
    enqueue_model(ctx, bv, n_logit_rows, logits_out, argmax_out != NULL);
    return finish_step(ctx, argmax_out, n_logit_rows);
}

/* A decode step that wants only the argmax is the same sequence of ops at every position (positions
 * and rows are read from the scratch on the device), so a backend that records steps runs it as
 * one recorded step: recorded the first time, replayed after. */
static int decode_step_recordable(const specla_context *ctx, const specla_batch *batch) {
    return batch->n_tokens == 1 && !batch->logits && batch->argmax && ctx->be->ops->replay &&
           !ctx->params.no_recorded_steps;
}

/* Records the ops of a batch whose only output is the argmax of its n rows (none when !want_argmax)
 * under `key`, then replays them: 1 when they ran so; 0 when the backend could not record (nothing
 * ran; the context runs its steps eagerly from now on). */
static int record_and_replay(specla_context *ctx, int key, const batch_view *bv, int n_rows, int want_argmax) {
    const backend *be = ctx->be;
    be->ops->capture_begin(be);
    enqueue_model(ctx, bv, n_rows, NULL, want_argmax); /* recorded, not run; the host side of the layers is done */
    if (be->ops->capture_end(be, key) == SPECLA_OK && be->ops->replay(be, key)) return 1;
    ctx->params.no_recorded_steps = 1;
    return 0;
}

/* The LM head a recorded step's launches depend on (logits_and_argmax multiplies a chosen head over
 * its capacity, so its row count is not part of it). */
static recorded_head_key scored_head_key(const specla_context *ctx) {
    recorded_head_key key;
    const specla_tensor head = logit_rows_scored_head(&ctx->logit_rows, &ctx->logit_head, &key.n_valid);
    key.data = head.data;
    key.rows = head.ne1;
    return key;
}

static int same_step_key(const recorded_step_key *a, const recorded_step_key *b) {
    return same_head_key(&a->head, &b->head) && a->n_tokens == b->n_tokens && a->variant == b->variant;
}

/* Enqueues a step of a keyed kind (verify, causal batch) whose outputs are the argmax of its n_rows
 * rows (none when !want_argmax): the replay of key's recording among r's (backend keys first_key +
 * slot), or, the second time key comes, a recording of it made now and replayed, or, the first time
 * (and when recording fails), the ops eagerly. 1 when an earlier recording was replayed (the host
 * side of the layers did not run); the caller reads the result. A key's count is never 0, so an
 * empty slot matches no key. */
static int enqueue_keyed_step(specla_context *ctx, recorded_steps *r, int first_key, const recorded_step_key *key,
                              const batch_view *bv, int n_rows, int want_argmax) {
    const backend *be = ctx->be;
    int slot = -1;
    for (int i = 0; i < STEP_SLOTS && slot < 0; i++)
        if (same_step_key(&r->slot[i], key)) slot = i;
    if (slot >= 0 && be->ops->replay(be, first_key + slot)) return 1;
    int seen = slot >= 0;
    for (int i = 0; i < STEP_KEYS_SEEN && !seen; i++) seen = same_step_key(&r->seen[i], key);
    if (!seen) {
        r->seen[r->next_seen] = *key;
        r->next_seen = (r->next_seen + 1) % STEP_KEYS_SEEN;
    } else {
        if (slot < 0) {
            slot = r->next_slot;
            r->next_slot = (slot + 1) % STEP_SLOTS;
        }
        r->slot[slot] = *key;
        if (record_and_replay(ctx, first_key + slot, bv, n_rows, want_argmax)) return 0;
        r->slot[slot].n_tokens = 0; /* nothing ran: the same ops eagerly, below */
    }
    enqueue_model(ctx, bv, n_rows, NULL, want_argmax);
    return 0;
}

/* A causal batch of more than one token that returns no logits (a prompt's chunks: the last one's
 * argmax, or nothing; bench_gpu's N-token batches) is, like a decode step, the same sequence of ops
 * at every position. So a backend that records batches (records_batches) records it per key (token
 * count, whether it scores the argmax, LM head) the second time the key comes, and replays it after. */
static int batch_step_recordable(const specla_context *ctx, const specla_batch *batch) {
    return batch->n_tokens > 1 && !batch->logits && !batch->logits_all && ctx->be->ops->replay &&
           ctx->be->records_batches && !ctx->params.no_recorded_steps;
}

/* The rows a step's attention grids are sized for when its queries see at most rows_seen rows: the
 * context's capacity, or DECODE_SHALLOW_ROWS when rows_seen is at most that and the capacity larger
 * (the shallow class: a launch has blocks for 8 segments, not for the capacity's, most of which would
 * only leave). Every decode step, batch and verify takes it. The bits do not depend on the bound; a
 * recorded step is keyed by its class, whose grids it holds. */
static int32_t step_rows_bound(const specla_context *ctx, int64_t rows_seen) {
    return rows_seen <= DECODE_SHALLOW_ROWS && ctx->params.n_ctx > DECODE_SHALLOW_ROWS ? DECODE_SHALLOW_ROWS
                                                                                      : ctx->params.n_ctx;
}
/* a step's depth class: 0 shallow, 1 bounded by the capacity (step_rows_bound) */
static int depth_class(const specla_context *ctx, const batch_view *bv) { return bv->max_rows == ctx->params.n_ctx; }
/* a keyed step's variant with its depth class in bit 1 */
static int32_t with_depth_class(const specla_context *ctx, const batch_view *bv, int32_t variant) {
    return variant | depth_class(ctx, bv) << 1;
}

static specla_status run_batch_step(specla_context *ctx, const batch_view *bv, int32_t *argmax_out) {
    const recorded_step_key key = {scored_head_key(ctx), bv->T, with_depth_class(ctx, bv, argmax_out != NULL)};
    enqueue_keyed_step(ctx, &ctx->recorded_batch, STEP_BATCH, &key, bv, 1, argmax_out != NULL);
    return finish_step(ctx, argmax_out, 1);
}

/* A recorded decode step's attention grid covers the rows of its depth class (bv->max_rows, from
 * step_rows_bound), so a shallow step (at most DECODE_SHALLOW_ROWS rows) replays a recording bounded
 * there and a deeper one a recording bounded by the context's capacity: the
 * backend shapes each launch for its bound (CUDA: one query head a block while the bound's blocks
 * fit one wave, else two; docs/cuda-attention.md). The bits do not depend on the bound. */
static specla_status run_decode_step(specla_context *ctx, const batch_view *bv, int32_t *argmax_out) {
    const backend *be = ctx->be;
    const int deep = depth_class(ctx, bv);
    const recorded_head_key head = scored_head_key(ctx);
    if (!same_head_key(&ctx->recorded_head[deep], &head) || !be->ops->replay(be, STEP_DECODE + deep)) {
        ctx->recorded_head[deep] = head;
        if (!record_and_replay(ctx, STEP_DECODE + deep, bv, 1, 1)) return run_model(ctx, bv, 1, NULL, argmax_out);
    }
    return read_argmax(ctx, argmax_out, 1);
}

specla_status model_forward(specla_context *ctx, const specla_batch *batch) {
    forward_scratch *s = &ctx->scratch;
    const backend *be = ctx->be;
    const size_t bytes = sizeof(int32_t) * (size_t)batch->n_tokens;
    be->ops->upload(be, s->tokens, batch->tokens, bytes);
    be->ops->upload(be, s->positions, batch->positions, bytes);
    int32_t last = 0;
    for (int i = 0; i < batch->n_tokens; i++) last = batch->positions[i] > last ? batch->positions[i] : last;
    const batch_view bv = {batch->n_tokens, s->positions, s->positions, NULL, NULL,
                           step_rows_bound(ctx, (int64_t)last + 1)};
    if (decode_step_recordable(ctx, batch)) return run_decode_step(ctx, &bv, batch->argmax);
    if (batch_step_recordable(ctx, batch)) return run_batch_step(ctx, &bv, batch->argmax);
    return run_model(ctx, &bv, batch->logits_all ? batch->n_tokens : 1, batch->logits, batch->argmax);
}

/* A verify that wants only the argmax is the same sequence of ops for every tree of N nodes: tokens,
 * positions, KV rows, the HLD schedule (the topology), the prefix length (node 0's position) and
 * how much of a pending path each layer folds are read from backend memory uploaded before. So a
 * backend that records steps records it once per key (node count, the factor bank the verify
 * writes, which alternates when an accept swaps the banks, and the LM head) and replays it after,
 * recorded the second time the key comes (enqueue_keyed_step). A DDTree fills its node budget
 * nearly every step, so a run needs two of the STEP_SLOTS recordings. */
static int verify_step_recordable(const specla_context *ctx, const specla_tree_batch *tree) {
    return !tree->logits && tree->argmax && ctx->be->ops->replay && !ctx->params.no_recorded_steps &&
           (!ctx->tree.banks || factor_banks_verify_recordable(ctx->tree.banks));
}

static specla_status run_verify_step(specla_context *ctx, const batch_view *bv, int32_t *argmax_out) {
    const int N = bv->T;
    specla_factor_banks *banks = ctx->tree.banks;
    const recorded_step_key key = {scored_head_key(ctx), N,
                                   with_depth_class(ctx, bv, banks ? factor_banks_write_bank(banks) : 0)};
    const int replayed = enqueue_keyed_step(ctx, &ctx->recorded_verify, STEP_VERIFY, &key, bv, N, 1);
    /* a replay ran the recording's ops; the host side of its layers is what recording them left */
    if (replayed && banks) factor_banks_note_replayed_verify(banks, N);
    return read_argmax(ctx, argmax_out, N);
}

specla_status model_forward_tree(specla_context *ctx, const specla_tree_batch *tree) {
    const tree_state *tr = &ctx->tree;
    forward_scratch *s = &ctx->scratch;
    const backend *be = ctx->be;
    if (ctx->model->n_recurrent_layers > 0 && !tr->banks)
        return specla_fail(SPECLA_ERR_STATE, "specla_verify_tree: no factor banks in this context");
    const int N = tree->n_nodes;
    const size_t bytes = sizeof(int32_t) * (size_t)N;
    be->ops->upload(be, s->tokens, tree->tokens, bytes);
    be->ops->upload(be, s->positions, tr->positions, bytes);
    be->ops->upload(be, s->rows, tr->rows, bytes);
    be->ops->upload(be, tr->schedule_on_backend, tr->schedule, sizeof(int32_t) * (size_t)tr->schedule_ints);
    if (tr->banks) factor_banks_prepare_verify(tr->banks);
    /* node 0 sits at the prefix length; a node sees the prefix and at most N tree rows */
    const batch_view bv = {N, s->positions, s->rows, tr->schedule_on_backend,
                           tr->schedule_on_backend + tr->schedule[HLD_OFF_PARENTS],
                           step_rows_bound(ctx, (int64_t)tr->positions[0] + N)};
    if (verify_step_recordable(ctx, tree)) return run_verify_step(ctx, &bv, tree->argmax);
    return run_model(ctx, &bv, N, tree->logits, tree->argmax);
}
