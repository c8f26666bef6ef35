/* specla_context: the mutable state of one sequence. Everything is allocated once at creation
 * (KV cache for n_ctx positions, conv windows, GDN states, scratch for max_batch tokens) so a
 * generation step never allocates. */
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "factor_banks.h"
#include "hld_schedule.h"
#include "backend_registry.h"
#include "context.h"
#include "tensor_types.h"

static int imax(int a, int b) { return a > b ? a : b; }

/* Every buffer of a context comes from its backend and goes back to it here. */
static void release(const backend *be, void *ptr) {
    if (ptr) be->ops->free(be, ptr);
}

static void free_array(const backend *be, float **arr, int n) {
    if (!arr) return;
    for (int i = 0; i < n; i++) release(be, arr[i]);
    free(arr);
}

static void free_scratch(const backend *be, forward_scratch *s) {
    void *bufs[] = {s->hidden, s->normed, s->layer_out, s->proj, s->conv_out, s->q, s->k, s->v, s->gate,
                    s->beta, s->g, s->mix, s->ffn_a, s->ffn_b, s->logits, s->argmax, s->tokens, s->positions,
                    s->rows, s->move_from, s->move_to};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) release(be, bufs[i]);
    memset(s, 0, sizeof *s);
}

SPECLA_API void specla_context_free(specla_context *ctx) {
    if (!ctx) return;
    const specla_model *m = ctx->model;
    backend *be = ctx->be;
    if (be) {
        free_array(be, ctx->k_cache, m->n_attention_layers);
        free_array(be, ctx->v_cache, m->n_attention_layers);
        free_array(be, ctx->conv_state, m->n_recurrent_layers);
        free_array(be, ctx->gdn_state, m->n_recurrent_layers);
        free_array(be, ctx->saved_conv_state, m->n_recurrent_layers);
        free_array(be, ctx->saved_gdn_state, m->n_recurrent_layers);
        free_scratch(be, &ctx->scratch);
        release(be, ctx->features);
        specla_factor_banks_free(ctx->tree.banks);
        release(be, ctx->tree.schedule_on_backend);
        logit_rows_release(&ctx->logit_rows, be);
    }
    free(ctx->capture_layers);
    free(ctx->capture_slot);
    free(ctx->tree.schedule);
    free(ctx->tree.hld_scratch);
    free(ctx->tree.positions);
    free(ctx->tree.rows);
    if (be) be->ops->destroy(be);
    free(ctx);
}

SPECLA_API int32_t specla_context_backend(const specla_context *ctx) { return ctx ? ctx->be->kind : -1; }

SPECLA_API specla_status specla_context_sync(specla_context *ctx) {
    if (!ctx) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_context_sync: NULL context");
    return ctx->be->ops->sync(ctx->be);
}

SPECLA_API specla_status specla_context_step_counters(specla_context *ctx, int64_t *launches, int64_t *host_waits,
                                                      int64_t *kernels) {
    if (!ctx || !launches || !host_waits || !kernels)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_context_step_counters: NULL argument");
    int64_t out[3];
    ctx->be->ops->launch_counters(ctx->be, out);
    *launches = out[0], *host_waits = out[1], *kernels = out[2];
    return SPECLA_OK;
}

SPECLA_API specla_status specla_context_launch_counters(specla_context *ctx, int64_t *launches, int64_t *host_waits) {
    if (!ctx || !launches || !host_waits)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_context_launch_counters: NULL argument");
    int64_t kernels;
    return specla_context_step_counters(ctx, launches, host_waits, &kernels);
}

/* Bytes of one recurrent layer's conv window [K-1][C] and GDN state [Hv][S][S]. */
static size_t conv_state_bytes(const specla_model *m) {
    return sizeof(float) * (size_t)(m->hp.ssm_conv_kernel - 1) * (size_t)m->conv_channels;
}
static size_t gdn_state_bytes(const specla_model *m) {
    return sizeof(float) * (size_t)m->hp.ssm_time_step_rank * (size_t)m->hp.ssm_state_size * (size_t)m->hp.ssm_state_size;
}

static float *alloc_floats(const backend *be, int64_t n) {
    return (float *)be->ops->alloc(be, sizeof(float) * (size_t)(n > 0 ? n : 1));
}
static int32_t *alloc_ints(const backend *be, int64_t n) {
    return (int32_t *)be->ops->alloc(be, sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
}

/* What the backend's workspace must be ready for: the widest matmul input, the most rows, the
 * longest attention row list, the tree kernels' states. */
static backend_limits context_limits(const specla_model *m, const specla_context_params *p) {
    const specla_hparams *hp = &m->hp;
    const int S = hp->ssm_state_size, Hv = hp->ssm_time_step_rank;
    backend_limits limits;
    limits.max_rows = imax(imax(p->max_batch, p->max_tree_nodes), 1);
    limits.max_width = imax(imax(hp->n_embd, hp->n_ff), imax(hp->n_head * hp->head_dim, Hv * S));
    limits.max_kv_rows = p->n_ctx;
    limits.max_nodes = p->max_tree_nodes;
    limits.gdn_head_size = m->n_recurrent_layers > 0 ? S * S : 0;
    limits.conv_window = m->n_recurrent_layers > 0 ? (hp->ssm_conv_kernel - 1) * m->conv_channels : 0;
    limits.gdn_heads = m->n_recurrent_layers > 0 ? Hv : 0;
    limits.attn_heads = hp->n_head;
    limits.attn_head_dim = hp->head_dim;
    limits.n_vocab = hp->n_vocab;
    return limits;
}

/* A context's rows below `floor` stay, the others are dropped (context.h: rewrites). */
static void note_rewrite(specla_context *ctx, int32_t floor) {
    ctx->rewrite_floor[ctx->rewrites % CONTEXT_REWRITE_LOG] = floor;
    ctx->rewrites++;
}

int32_t context_unchanged_rows(const specla_context *ctx, int64_t since) {
    if (since < 0 || since > ctx->rewrites || ctx->rewrites - since > CONTEXT_REWRITE_LOG) return 0;
    int32_t rows = ctx->n_past;
    for (int64_t r = since; r < ctx->rewrites; r++) {
        const int32_t floor = ctx->rewrite_floor[r % CONTEXT_REWRITE_LOG];
        if (floor < rows) rows = floor;
    }
    return rows;
}

SPECLA_API specla_status specla_context_create(const specla_model *model, const specla_context_params *params,
                                               specla_context **out_context) {
    if (!model || !params || !out_context)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_context_create: NULL argument");
    *out_context = NULL;
    if (params->n_ctx <= 0)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "context: n_ctx must be positive, got %d", params->n_ctx);
    if (params->max_batch <= 0 || params->max_batch > params->n_ctx)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "context: max_batch %d must be in [1, n_ctx = %d]",
                           params->max_batch, params->n_ctx);
    if (params->max_tree_nodes < 0 || params->max_tree_nodes > params->n_ctx)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "context: max_tree_nodes %d must be in [0, n_ctx = %d]",
                           params->max_tree_nodes, params->n_ctx);
    if (params->n_capture_layers < 0 || (params->n_capture_layers > 0 && !params->capture_layers))
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "context: capture_layers is NULL but n_capture_layers = %d",
                           params->n_capture_layers);
    for (int i = 0; i < params->n_capture_layers; i++)
        if (params->capture_layers[i] < 0 || params->capture_layers[i] >= model->hp.n_layer)
            return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "context: capture_layers[%d] = %d outside the %d trunk layers",
                               i, params->capture_layers[i], model->hp.n_layer);
    const backend_limits limits = context_limits(model, params);
    backend *be = NULL;
    specla_status st =
        backend_open(params->backend, params->device, params->n_threads, params->cpu_kernels, &limits, &be);
    if (st != SPECLA_OK) return st;

    specla_context *ctx = (specla_context *)calloc(1, sizeof *ctx);
    if (!ctx) {
        be->ops->destroy(be);
        return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "context: out of memory");
    }
    ctx->model = model;
    ctx->params = *params;
    ctx->params.capture_layers = NULL; /* the caller's array is copied below, not kept */
    ctx->be = be;
    ctx->saved_n_past = -1;
    static int64_t contexts_created = 0; /* ids start at 1: 0 names no context */
    ctx->id = __atomic_add_fetch(&contexts_created, 1, __ATOMIC_RELAXED);
    if ((st = model_weights_for(model, be, &ctx->weights)) != SPECLA_OK) {
        specla_context_free(ctx);
        return st;
    }
    ctx->logit_head = ctx->weights.output;

    const specla_hparams *hp = &model->hp;
    const int C = model->conv_channels, S = hp->ssm_state_size, Hv = hp->ssm_time_step_rank;
    const int Hk = hp->ssm_group_count, D = hp->head_dim, nh = hp->n_head, nkv = hp->n_head_kv;
    const int64_t kv_row = (int64_t)nkv * D;
    int ok = 1;

    ctx->k_cache = (float **)calloc((size_t)imax(model->n_attention_layers, 1), sizeof(float *));
    ctx->v_cache = (float **)calloc((size_t)imax(model->n_attention_layers, 1), sizeof(float *));
    ctx->conv_state = (float **)calloc((size_t)imax(model->n_recurrent_layers, 1), sizeof(float *));
    ctx->gdn_state = (float **)calloc((size_t)imax(model->n_recurrent_layers, 1), sizeof(float *));
    ok = ctx->k_cache && ctx->v_cache && ctx->conv_state && ctx->gdn_state;
    for (int i = 0; ok && i < model->n_attention_layers; i++) {
        ctx->k_cache[i] = alloc_floats(be, (int64_t)params->n_ctx * kv_row);
        ctx->v_cache[i] = alloc_floats(be, (int64_t)params->n_ctx * kv_row);
        ok = ctx->k_cache[i] && ctx->v_cache[i];
    }
    for (int i = 0; ok && i < model->n_recurrent_layers; i++) {
        ctx->conv_state[i] = alloc_floats(be, (int64_t)(hp->ssm_conv_kernel - 1) * C);
        ctx->gdn_state[i] = alloc_floats(be, (int64_t)Hv * S * S);
        ok = ctx->conv_state[i] && ctx->gdn_state[i];
    }

    /* a tree batch uses the same scratch as a plain batch */
    const int64_t B = limits.max_rows;
    forward_scratch *s = &ctx->scratch;
    if (ok) {
        s->hidden = alloc_floats(be, B * hp->n_embd);
        s->normed = alloc_floats(be, B * hp->n_embd);
        s->layer_out = alloc_floats(be, B * hp->n_embd);
        s->proj = alloc_floats(be, B * imax(C, 2 * nh * D));
        s->conv_out = alloc_floats(be, B * C);
        s->q = alloc_floats(be, B * imax(Hk * S, nh * D));
        s->k = alloc_floats(be, B * imax(Hk * S, nkv * D));
        s->v = alloc_floats(be, B * imax(Hv * S, nkv * D));
        s->gate = alloc_floats(be, B * imax(Hv * S, nh * D));
        s->beta = alloc_floats(be, B * Hv);
        s->g = alloc_floats(be, B * Hv);
        s->mix = alloc_floats(be, B * imax(Hv * S, nh * D));
        s->ffn_a = alloc_floats(be, B * hp->n_ff);
        s->ffn_b = alloc_floats(be, B * hp->n_ff);
        /* logits pass through the scratch in chunks of logit_rows rows when they cannot land in the
         * caller's buffer directly (argmax only, or a device backend) */
        s->logit_rows = (int32_t)(B < 64 ? B : 64);
        s->logits = alloc_floats(be, (int64_t)s->logit_rows * hp->n_vocab);
        s->argmax = alloc_ints(be, B);
        s->tokens = alloc_ints(be, B);
        s->positions = alloc_ints(be, B);
        s->rows = alloc_ints(be, B);
        s->move_from = alloc_ints(be, params->max_tree_nodes);
        s->move_to = alloc_ints(be, params->max_tree_nodes);
        ok = s->hidden && s->normed && s->layer_out && s->proj && s->conv_out && s->q && s->k && s->v && s->gate &&
             s->beta && s->g && s->mix && s->ffn_a && s->ffn_b && s->logits && s->argmax && s->tokens &&
             s->positions && s->rows && s->move_from && s->move_to;
    }
    if (ok && params->n_capture_layers > 0) {
        ctx->n_capture = params->n_capture_layers;
        ctx->capture_layers = (int32_t *)malloc(sizeof(int32_t) * (size_t)ctx->n_capture);
        ctx->capture_slot = (int32_t *)malloc(sizeof(int32_t) * (size_t)hp->n_layer);
        ctx->features = alloc_floats(be, (int64_t)params->n_ctx * ctx->n_capture * hp->n_embd);
        ok = ctx->capture_layers && ctx->capture_slot && ctx->features;
        if (ok) {
            for (int il = 0; il < hp->n_layer; il++) ctx->capture_slot[il] = -1;
            for (int i = 0; i < ctx->n_capture; i++) {
                const int layer = params->capture_layers[i];
                if (ctx->capture_slot[layer] >= 0) {
                    specla_context_free(ctx);
                    return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "context: capture layer %d is listed twice", layer);
                }
                ctx->capture_layers[i] = layer;
                ctx->capture_slot[layer] = i;
            }
        }
    }
    if (ok && params->max_tree_nodes > 0) {
        tree_state *tr = &ctx->tree;
        const int cap = params->max_tree_nodes;
        tr->schedule_ints = specla_hld_size(cap);
        tr->schedule = (int32_t *)malloc(sizeof(int32_t) * (size_t)tr->schedule_ints);
        tr->schedule_on_backend = alloc_ints(be, tr->schedule_ints);
        tr->hld_scratch = (int32_t *)malloc(sizeof(int32_t) * HLD_SCRATCH_INTS_PER_NODE * (size_t)cap);
        tr->positions = (int32_t *)malloc(sizeof(int32_t) * (size_t)cap);
        tr->rows = (int32_t *)malloc(sizeof(int32_t) * (size_t)cap);
        ok = tr->schedule && tr->schedule_on_backend && tr->hld_scratch && tr->positions && tr->rows;
        if (ok && model->n_recurrent_layers > 0) {
            const specla_recurrent_shape shape = {model->n_recurrent_layers, Hk, Hv, S, C, hp->ssm_conv_kernel,
                                                  cap, params->verify_method, params->commit_method};
            st = factor_banks_create(&shape, be, &tr->banks);
            if (st != SPECLA_OK) {
                specla_context_free(ctx);
                return st;
            }
        }
    }
    if (!ok) {
        specla_context_free(ctx);
        return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "context: out of memory for n_ctx %d, max_batch %d",
                           params->n_ctx, params->max_batch);
    }
    *out_context = ctx;
    return SPECLA_OK;
}

SPECLA_API specla_status specla_context_set_logit_head(specla_context *ctx, const specla_tensor *head) {
    if (!ctx) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_context_set_logit_head: NULL context");
    const specla_hparams *hp = &ctx->model->hp;
    return logit_head_set(ctx->be, head, &ctx->weights.output, hp->n_embd, hp->n_vocab, &ctx->logit_head,
                          "specla_context_set_logit_head", "specla_context_set_logit_rows");
}

SPECLA_API specla_status specla_context_set_logit_rows(specla_context *ctx, const int32_t *ids, int32_t n) {
    static const char op[] = "specla_context_set_logit_rows";
    if (!ctx) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: NULL context", op);
    return logit_rows_select(&ctx->logit_rows, ctx->be, &ctx->weights.output, ctx->model->hp.n_vocab, ids, n,
                             &ctx->logit_head, op);
}

SPECLA_API specla_status specla_context_reset(specla_context *ctx) {
    if (!ctx) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_context_reset: NULL context");
    const specla_model *m = ctx->model;
    /* KV rows beyond n_past are never read, so only the recurrent states need zeroing. */
    const backend *be = ctx->be;
    for (int i = 0; i < m->n_recurrent_layers; i++) {
        be->ops->fill(be, ctx->conv_state[i], 0.0f, (int64_t)(conv_state_bytes(m) / sizeof(float)));
        be->ops->fill(be, ctx->gdn_state[i], 0.0f, (int64_t)(gdn_state_bytes(m) / sizeof(float)));
    }
    ctx->n_past = 0;
    note_rewrite(ctx, 0);
    ctx->saved_n_past = -1; /* the saved state belongs to the forgotten sequence */
    factor_banks_discard(ctx->tree.banks); /* pending factors belong to the forgotten sequence */
    ctx->tree.n_verified = 0;
    return SPECLA_OK;
}

SPECLA_API int32_t specla_context_n_past(const specla_context *ctx) { return ctx ? ctx->n_past : -1; }

SPECLA_API specla_status specla_context_truncate(specla_context *ctx, int32_t n_past) {
    static const char op[] = "specla_context_truncate";
    if (!ctx) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: NULL context", op);
    if (n_past < 0 || n_past > ctx->n_past)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: n_past %d is not in [0, %d] (the tokens evaluated so far)",
                           op, n_past, ctx->n_past);
    /* A conv window or GDN state holds every earlier token folded together: there is no row to
     * drop, only a saved copy to go back to. (A pending accepted path, which only recurrent layers
     * have, was folded in before that copy was taken.) */
    const specla_model *m = ctx->model;
    if (m->n_recurrent_layers > 0 && n_past != ctx->n_past) {
        if (n_past != ctx->saved_n_past)
            return specla_fail(SPECLA_ERR_UNSUPPORTED,
                               "%s: the model has %d recurrent (Gated DeltaNet) layers, whose state cannot be rolled "
                               "back except to a saved position (specla_context_save_state; saved: %d), not to %d",
                               op, m->n_recurrent_layers, ctx->saved_n_past, n_past);
        factor_banks_discard(ctx->tree.banks); /* a pending path lies after the saved position */
        const backend *be = ctx->be;
        for (int i = 0; i < m->n_recurrent_layers; i++) {
            be->ops->copy(be, ctx->conv_state[i], ctx->saved_conv_state[i], conv_state_bytes(m));
            be->ops->copy(be, ctx->gdn_state[i], ctx->saved_gdn_state[i], gdn_state_bytes(m));
        }
    }
    /* KV and feature rows at positions >= n_past are never read again (reads stop at n_past) and
     * the next batch overwrites them, exactly as specla_context_reset relies on. */
    if (n_past < ctx->n_past) note_rewrite(ctx, n_past);
    ctx->n_past = n_past;
    ctx->tree.n_verified = 0; /* its rows were placed after the old n_past */
    return SPECLA_OK;
}

SPECLA_API specla_status specla_context_save_state(specla_context *ctx) {
    if (!ctx) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_context_save_state: NULL context");
    const specla_model *m = ctx->model;
    specla_status st = specla_context_finish_speculative_state(ctx);
    if (st != SPECLA_OK) return st;
    const backend *be = ctx->be;
    if (m->n_recurrent_layers > 0 && !ctx->saved_conv_state) {
        /* the slot is allocated by the first save: only autoregressive drafts ever save */
        const size_t n = (size_t)m->n_recurrent_layers;
        float **conv = (float **)calloc(n, sizeof(float *)), **gdn = (float **)calloc(n, sizeof(float *));
        int ok = conv && gdn;
        for (size_t i = 0; ok && i < n; i++) {
            conv[i] = (float *)be->ops->alloc(be, conv_state_bytes(m));
            gdn[i] = (float *)be->ops->alloc(be, gdn_state_bytes(m));
            ok = conv[i] && gdn[i];
        }
        if (!ok) {
            free_array(be, conv, (int)n);
            free_array(be, gdn, (int)n);
            return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "specla_context_save_state: out of memory");
        }
        ctx->saved_conv_state = conv;
        ctx->saved_gdn_state = gdn;
    }
    for (int i = 0; i < m->n_recurrent_layers; i++) {
        be->ops->copy(be, ctx->saved_conv_state[i], ctx->conv_state[i], conv_state_bytes(m));
        be->ops->copy(be, ctx->saved_gdn_state[i], ctx->gdn_state[i], gdn_state_bytes(m));
    }
    ctx->saved_n_past = ctx->n_past;
    return SPECLA_OK;
}

SPECLA_API specla_status specla_forward(specla_context *ctx, const specla_batch *batch) {
    if (!ctx || !batch) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_forward: NULL argument");
    if (!batch->tokens || !batch->positions)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_forward: tokens and positions are required");
    if (batch->n_tokens <= 0 || batch->n_tokens > ctx->params.max_batch)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_forward: n_tokens %d not in [1, max_batch = %d]",
                           batch->n_tokens, ctx->params.max_batch);
    if (ctx->n_past + batch->n_tokens > ctx->params.n_ctx)
        return specla_fail(SPECLA_ERR_STATE, "specla_forward: context full (n_past %d + %d tokens > n_ctx %d)",
                           ctx->n_past, batch->n_tokens, ctx->params.n_ctx);
    const int32_t n_vocab = ctx->model->hp.n_vocab;
    for (int i = 0; i < batch->n_tokens; i++) {
        if (batch->tokens[i] < 0 || batch->tokens[i] >= n_vocab)
            return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_forward: token %d at index %d is outside [0, %d)",
                               batch->tokens[i], i, n_vocab);
        if (batch->positions[i] != ctx->n_past + i)
            return specla_fail(SPECLA_ERR_STATE,
                               "specla_forward: position %d at index %d, expected %d (a plain batch continues the "
                               "sequence; tree batches go through the verify call)",
                               batch->positions[i], i, ctx->n_past + i);
    }
    /* plain decoding continues from the durable state: fold any pending path first */
    specla_status st = specla_context_finish_speculative_state(ctx);
    if (st != SPECLA_OK) return st;
    ctx->tree.n_verified = 0;
    st = model_forward(ctx, batch);
    if (st == SPECLA_OK) ctx->n_past += batch->n_tokens;
    return st;
}

/* The durable per-layer states in the form the factor banks take. */
static specla_recurrent_states recurrent_states(specla_context *ctx) {
    specla_recurrent_states states = {ctx->gdn_state, ctx->conv_state};
    return states;
}

SPECLA_API specla_status specla_context_finish_speculative_state(specla_context *ctx) {
    if (!ctx) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_context_finish_speculative_state: NULL context");
    ctx->tree.n_verified = 0;
    if (!ctx->tree.banks) return SPECLA_OK;
    const specla_recurrent_states states = recurrent_states(ctx);
    factor_banks_finish(ctx->tree.banks, ctx->be, &states);
    return SPECLA_OK;
}

SPECLA_API specla_status specla_context_tree_stats(const specla_context *ctx, specla_tree_stats *out) {
    if (!ctx || !out) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_context_tree_stats: NULL argument");
    if (!ctx->tree.banks) {
        *out = (specla_tree_stats){0, 0, 0, 0}; /* no recurrent layers (or no tree verify): nothing to count */
        return SPECLA_OK;
    }
    return specla_factor_banks_stats(ctx->tree.banks, out);
}

SPECLA_API int32_t specla_context_pending(const specla_context *ctx) {
    if (!ctx) return -1;
    return ctx->tree.banks ? specla_factor_banks_pending(ctx->tree.banks) : 0;
}

SPECLA_API specla_status specla_verify_tree(specla_context *ctx, const specla_tree_batch *tree) {
    static const char op[] = "specla_verify_tree";
    if (!ctx || !tree || !tree->tokens || !tree->parents)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: NULL argument", op);
    tree_state *tr = &ctx->tree;
    if (!tr->schedule)
        return specla_fail(SPECLA_ERR_STATE, "%s: context created with max_tree_nodes = 0 (no tree verify)", op);
    const int N = tree->n_nodes;
    if (N < 1 || N > ctx->params.max_tree_nodes)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: %d nodes, the context takes 1 .. %d", op, N,
                           ctx->params.max_tree_nodes);
    if (ctx->n_past + N > ctx->params.n_ctx)
        return specla_fail(SPECLA_ERR_STATE, "%s: context full (n_past %d + %d nodes > n_ctx %d)", op, ctx->n_past, N,
                           ctx->params.n_ctx);
    for (int i = 0; i < N; i++)
        if (tree->tokens[i] < 0 || tree->tokens[i] >= ctx->model->hp.n_vocab)
            return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: token %d of node %d is outside [0, %d)", op,
                               tree->tokens[i], i, ctx->model->hp.n_vocab);
    specla_status st =
        hld_build_into(tree->parents, N, ctx->params.max_tree_nodes, tr->schedule, tr->schedule_ints, tr->hld_scratch);
    if (st != SPECLA_OK) return st; /* the builder names the bad parent */
    const int32_t *depth = tr->schedule + tr->schedule[HLD_OFF_NODE_DEPTH];
    for (int i = 0; i < N; i++) {
        tr->positions[i] = ctx->n_past + depth[i];
        tr->rows[i] = ctx->n_past + i;
    }
    tr->n_verified = 0;
    st = model_forward_tree(ctx, tree);
    if (st == SPECLA_OK) tr->n_verified = N;
    return st;
}

SPECLA_API specla_status specla_accept_path(specla_context *ctx, const int32_t *path, int32_t n) {
    static const char op[] = "specla_accept_path";
    if (!ctx || !path) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: NULL argument", op);
    tree_state *tr = &ctx->tree;
    if (tr->n_verified == 0) return specla_fail(SPECLA_ERR_STATE, "%s: no verified tree awaits acceptance", op);
    specla_status st = hld_check_path(tr->schedule, path, n, op);
    if (st != SPECLA_OK) return st;
    if (tr->banks) {
        const specla_recurrent_states states = recurrent_states(ctx);
        if ((st = factor_banks_accept(tr->banks, ctx->be, path, n, &states)) != SPECLA_OK) return st;
    }
    /* KV and feature compaction: the row of path[i] moves to position n_past + i, for the i where
     * path[i] != i (the others are in place already: an accept of the tree's first nodes, as a
     * DDTree's spine usually is, moves nothing and launches nothing). Ascending i is safe in place:
     * path[i] >= i, and no later source path[j] (j > i) can be a destination < j; the rows in place
     * are neither sources nor destinations of the others (the path's nodes increase). */
    const specla_model *m = ctx->model;
    const backend *be = ctx->be;
    const int kv_row = m->hp.n_head_kv * m->hp.head_dim;
    const int feature_row = ctx->n_capture * m->hp.n_embd;
    int32_t *from = tr->positions, *to = tr->rows; /* host scratch of the verified tree, free now */
    int n_moves = 0;
    for (int i = 1; i < n; i++)
        if (path[i] != i) from[n_moves] = ctx->n_past + path[i], to[n_moves] = ctx->n_past + i, n_moves++;
    if (n_moves > 0) {
        be->ops->upload(be, ctx->scratch.move_from, from, sizeof(int32_t) * (size_t)n_moves);
        be->ops->upload(be, ctx->scratch.move_to, to, sizeof(int32_t) * (size_t)n_moves);
        for (int l = 0; l < m->n_attention_layers; l++) {
            be->ops->move_rows(be, ctx->k_cache[l], kv_row, kv_row, ctx->scratch.move_from, ctx->scratch.move_to,
                               n_moves);
            be->ops->move_rows(be, ctx->v_cache[l], kv_row, kv_row, ctx->scratch.move_from, ctx->scratch.move_to,
                               n_moves);
        }
        if (ctx->features)
            be->ops->move_rows(be, ctx->features, feature_row, feature_row, ctx->scratch.move_from,
                               ctx->scratch.move_to, n_moves);
    }
    ctx->n_past += n;
    tr->n_verified = 0;
    return SPECLA_OK;
}

const float *context_features(const specla_context *ctx, int32_t pos) {
    if (!ctx || !ctx->features || pos < 0 || pos >= ctx->n_past) return NULL;
    return ctx->features + (int64_t)pos * ctx->n_capture * ctx->model->hp.n_embd;
}

SPECLA_API specla_status specla_context_read_features(const specla_context *ctx, int32_t first, int32_t n, float *out) {
    if (!ctx || !out) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_context_read_features: NULL argument");
    if (!ctx->features)
        return specla_fail(SPECLA_ERR_STATE, "specla_context_read_features: the context captures no features");
    if (first < 0 || n < 0 || first + n > ctx->n_past)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                           "specla_context_read_features: rows [%d, %d) are not committed (n_past %d)", first, first + n,
                           ctx->n_past);
    const int64_t row = (int64_t)ctx->n_capture * ctx->model->hp.n_embd;
    return ctx->be->ops->download(ctx->be, out, ctx->features + (int64_t)first * row, sizeof(float) * (size_t)(row * n));
}
