/* specla_context: the mutable state of one sequence. Everything is allocated once at creation
 * (KV cache for n_ctx positions, conv windows, GDN states, scratch for max_batch tokens) so a
 * generation step never allocates. */
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "qwen35.h"

static int imax(int a, int b) { return a > b ? a : b; }

static void free_array(float **arr, int n) {
    if (!arr) return;
    for (int i = 0; i < n; i++) free(arr[i]);
    free(arr);
}

static void free_scratch(forward_scratch *s) {
    float *bufs[] = {s->hidden, s->normed, s->layer_out, s->proj, s->conv_out, s->q, s->k, s->v,
                     s->gate, s->beta, s->g, s->mix, s->ffn_a, s->ffn_b, s->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    memset(s, 0, sizeof *s);
}

SPECLA_API void specla_context_free(specla_context *ctx) {
    if (!ctx) return;
    const specla_model *m = ctx->model;
    free_array(ctx->k_cache, m->n_attention_layers);
    free_array(ctx->v_cache, m->n_attention_layers);
    free_array(ctx->conv_state, m->n_recurrent_layers);
    free_array(ctx->gdn_state, m->n_recurrent_layers);
    free_scratch(&ctx->scratch);
    free(ctx);
}

static float *alloc_floats(int64_t n) { return (float *)calloc((size_t)(n > 0 ? n : 1), sizeof(float)); }

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
    cpu_exec exec;
    specla_status st = cpu_exec_resolve(params->n_threads, params->cpu_kernels, &exec);
    if (st != SPECLA_OK) return st;

    specla_context *ctx = (specla_context *)calloc(1, sizeof *ctx);
    if (!ctx) return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "context: out of memory");
    ctx->model = model;
    ctx->params = *params;
    ctx->exec = exec;

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
        ctx->k_cache[i] = alloc_floats((int64_t)params->n_ctx * kv_row);
        ctx->v_cache[i] = alloc_floats((int64_t)params->n_ctx * kv_row);
        ok = ctx->k_cache[i] && ctx->v_cache[i];
    }
    for (int i = 0; ok && i < model->n_recurrent_layers; i++) {
        ctx->conv_state[i] = alloc_floats((int64_t)(hp->ssm_conv_kernel - 1) * C);
        ctx->gdn_state[i] = alloc_floats((int64_t)Hv * S * S);
        ok = ctx->conv_state[i] && ctx->gdn_state[i];
    }

    const int64_t B = params->max_batch;
    forward_scratch *s = &ctx->scratch;
    if (ok) {
        s->hidden = alloc_floats(B * hp->n_embd);
        s->normed = alloc_floats(B * hp->n_embd);
        s->layer_out = alloc_floats(B * hp->n_embd);
        s->proj = alloc_floats(B * imax(C, 2 * nh * D));
        s->conv_out = alloc_floats(B * C);
        s->q = alloc_floats(B * imax(Hk * S, nh * D));
        s->k = alloc_floats(B * imax(Hk * S, nkv * D));
        s->v = alloc_floats(B * imax(Hv * S, nkv * D));
        s->gate = alloc_floats(B * imax(Hv * S, nh * D));
        s->beta = alloc_floats(B * Hv);
        s->g = alloc_floats(B * Hv);
        s->mix = alloc_floats(B * imax(Hv * S, nh * D));
        s->ffn_a = alloc_floats(B * hp->n_ff);
        s->ffn_b = alloc_floats(B * hp->n_ff);
        ok = s->hidden && s->normed && s->layer_out && s->proj && s->conv_out && s->q && s->k && s->v && s->gate &&
             s->beta && s->g && s->mix && s->ffn_a && s->ffn_b;
    }
    if (!ok) {
        specla_context_free(ctx);
        return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "context: out of memory for n_ctx %d, max_batch %d",
                           params->n_ctx, params->max_batch);
    }
    *out_context = ctx;
    return SPECLA_OK;
}

SPECLA_API specla_status specla_context_reset(specla_context *ctx) {
    if (!ctx) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_context_reset: NULL context");
    const specla_model *m = ctx->model;
    const specla_hparams *hp = &m->hp;
    /* KV rows beyond n_past are never read, so only the recurrent states need zeroing. */
    for (int i = 0; i < m->n_recurrent_layers; i++) {
        memset(ctx->conv_state[i], 0, sizeof(float) * (size_t)(hp->ssm_conv_kernel - 1) * (size_t)m->conv_channels);
        memset(ctx->gdn_state[i], 0,
               sizeof(float) * (size_t)hp->ssm_time_step_rank * (size_t)hp->ssm_state_size * (size_t)hp->ssm_state_size);
    }
    ctx->n_past = 0;
    return SPECLA_OK;
}

SPECLA_API int32_t specla_context_n_past(const specla_context *ctx) { return ctx ? ctx->n_past : -1; }

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
    specla_status st = qwen35_forward(ctx, batch);
    if (st == SPECLA_OK) ctx->n_past += batch->n_tokens;
    return st;
}
