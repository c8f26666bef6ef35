/* The qwen35 forward pass on the CPU backend: one call runs a batch of T tokens through every
 * trunk layer and appends it to the context's durable state. Math: shared/spec qwen35-contract §3.
 *
 * Every kernel computes each token row exactly as it would for a batch of one (matmuls are
 * batch-invariant, the conv and the delta rule walk tokens in order, attention rows are
 * independent), so prefilling a prompt gives bit-identical logits to decoding it token by token. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "factor_banks.h"
#include "hld_schedule.h"
#include "qwen35.h"

/* What a layer needs to know about the batch. Plain batch: positions n_past + i, K/V rows at the
 * positions, causal attention, sequential recurrent kernels. Tree batch: positions n_past +
 * depth, K/V rows at n_past + node index (scratch until accept), ancestor attention, SpecLA ops. */
typedef struct batch_view {
    int T;
    const int32_t *positions; /* RoPE positions */
    const int32_t *rows;      /* KV-cache / feature rows the tokens write */
    const int32_t *schedule;  /* packed HLD schedule, NULL for a plain batch */
    const int32_t *parents;   /* tree parents, NULL for a plain batch */
} batch_view;

static void add_in_place(float *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}

static void add_bias_rows(float *x, const float *bias, int rows, int n) {
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < n; i++) x[(int64_t)r * n + i] += bias[i];
}

/* Gated DeltaNet layer: x[T][E] (normed) -> out[T][E]. Updates this layer's conv and GDN state. */
static void gated_deltanet_layer(specla_context *ctx, int il, const float *x, const batch_view *bv,
                                 float *out) {
    const int T = bv->T;
    const specla_model *m = ctx->model;
    const specla_hparams *hp = &m->hp;
    const specla_layer_weights *w = &m->layers[il];
    const cpu_exec *ex = &ctx->exec;
    forward_scratch *s = &ctx->scratch;
    const int C = m->conv_channels, S = hp->ssm_state_size, Hk = hp->ssm_group_count;
    const int Hv = hp->ssm_time_step_rank, K = hp->ssm_conv_kernel;
    const int slot = m->state_slot[il];
    const float *dt_bias = (const float *)w->ssm_dt_bias.data;
    const float *ssm_a = (const float *)w->ssm_a.data;

    cpu_matmul(ex, &w->attn_qkv, x, T, s->proj);   /* [T][C] raw conv inputs */
    cpu_matmul(ex, &w->attn_gate, x, T, s->gate);  /* [T][Hv*S] z */
    cpu_matmul(ex, &w->ssm_beta, x, T, s->beta);   /* [T][Hv] */
    cpu_matmul(ex, &w->ssm_alpha, x, T, s->g);     /* [T][Hv] */
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < Hv; h++) {
            const int64_t i = (int64_t)t * Hv + h;
            s->beta[i] = cpu_sigmoid(s->beta[i]);
            s->g[i] = cpu_softplus(s->g[i] + dt_bias[h]) * ssm_a[h]; /* log-decay <= 0 */
        }
    }

    if (bv->schedule) {
        const specla_conv_tree_args args = {bv->schedule, slot, s->proj, (const float *)w->ssm_conv1d.data,
                                            ctx->conv_state[slot], s->conv_out};
        factor_banks_conv_tree(ctx->tree.banks, ex, &args);
    } else {
        cpu_causal_conv(ex, s->proj, (const float *)w->ssm_conv1d.data, T, C, K, ctx->conv_state[slot], s->conv_out);
    }

    /* split each conv row [q (Hk*S) | k (Hk*S) | v (Hv*S)] and L2-normalise q and k per head */
    const int64_t qk_width = (int64_t)Hk * S, v_width = (int64_t)Hv * S;
    for (int t = 0; t < T; t++) {
        const float *row = s->conv_out + (int64_t)t * C;
        cpu_l2_norm(row, Hk, S, hp->rms_eps, s->q + t * qk_width);
        cpu_l2_norm(row + qk_width, Hk, S, hp->rms_eps, s->k + t * qk_width);
        memcpy(s->v + t * v_width, row + 2 * qk_width, sizeof(float) * (size_t)v_width);
    }

    if (bv->schedule) {
        const specla_gdn_tree_args args = {bv->schedule, slot, s->q, s->k, s->v, s->g, s->beta, ctx->gdn_state[slot],
                                           s->mix};
        factor_banks_verify_gdn(ctx->tree.banks, ex, &args);
    } else {
        cpu_gated_delta_rule(ex, s->q, s->k, s->v, s->g, s->beta, T, Hk, Hv, S, ctx->gdn_state[slot], s->mix);
    }

    /* gated RMSNorm: o_h <- rms(o_h) * ssm_norm * silu(z_h), the same S-vector weight for every head */
    const float *norm_w = (const float *)w->ssm_norm.data;
    cpu_rms_norm(s->mix, norm_w, T * Hv, S, hp->rms_eps, s->mix);
    for (int64_t i = 0; i < (int64_t)T * v_width; i++) s->mix[i] *= cpu_silu(s->gate[i]);

    cpu_matmul(ex, &w->ssm_out, s->mix, T, out);
}

/* Full-attention layer: x[T][E] (normed) -> out[T][E]. Writes K/V rows at the batch positions. */
static void attention_layer(specla_context *ctx, int il, const float *x, const batch_view *bv, float *out) {
    const int T = bv->T;
    const int32_t *positions = bv->positions;
    const specla_model *m = ctx->model;
    const specla_hparams *hp = &m->hp;
    const specla_layer_weights *w = &m->layers[il];
    const cpu_exec *ex = &ctx->exec;
    forward_scratch *s = &ctx->scratch;
    const int D = hp->head_dim, nh = hp->n_head, nkv = hp->n_head_kv;
    const int slot = m->state_slot[il];
    float *k_cache = ctx->k_cache[slot], *v_cache = ctx->v_cache[slot];

    const int gated = m->hp.arch == SPECLA_ARCH_QWEN35;     /* qwen35: per head [query | gate] */
    const int qk_norm = m->hp.arch != SPECLA_ARCH_QWEN2;     /* qwen35, qwen3: per-head q/k RMSNorm */
    cpu_matmul(ex, &w->attn_q, x, T, gated ? s->proj : s->q); /* [T][nh][2D] or [T][nh][D] */
    cpu_matmul(ex, &w->attn_k, x, T, s->k);                   /* [T][nkv][D] */
    cpu_matmul(ex, &w->attn_v, x, T, s->v);                   /* [T][nkv][D] */
    if (w->attn_q_bias.data) { /* qwen2 */
        add_bias_rows(s->q, (const float *)w->attn_q_bias.data, T, nh * D);
        add_bias_rows(s->k, (const float *)w->attn_k_bias.data, T, nkv * D);
        add_bias_rows(s->v, (const float *)w->attn_v_bias.data, T, nkv * D);
    }
    if (gated) {
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < nh; h++) {
                const float *src = s->proj + ((int64_t)t * nh + h) * 2 * D;
                memcpy(s->q + ((int64_t)t * nh + h) * D, src, sizeof(float) * (size_t)D);
                memcpy(s->gate + ((int64_t)t * nh + h) * D, src + D, sizeof(float) * (size_t)D);
            }
        }
    }
    if (qk_norm) {
        cpu_rms_norm(s->q, (const float *)w->attn_q_norm.data, T * nh, D, hp->rms_eps, s->q);
        cpu_rms_norm(s->k, (const float *)w->attn_k_norm.data, T * nkv, D, hp->rms_eps, s->k);
    }
    cpu_rope_neox(s->q, positions, T, nh, D, hp->rope_dims, hp->rope_freq_base);
    cpu_rope_neox(s->k, positions, T, nkv, D, hp->rope_dims, hp->rope_freq_base);

    const int64_t kv_row = (int64_t)nkv * D;
    for (int t = 0; t < T; t++) {
        memcpy(k_cache + (int64_t)bv->rows[t] * kv_row, s->k + t * kv_row, sizeof(float) * (size_t)kv_row);
        memcpy(v_cache + (int64_t)bv->rows[t] * kv_row, s->v + t * kv_row, sizeof(float) * (size_t)kv_row);
    }
    if (bv->parents)
        cpu_attention_tree(ex, s->q, k_cache, v_cache, ctx->n_past, bv->parents, T, nh, nkv, D, s->mix);
    else
        cpu_attention(ex, s->q, k_cache, v_cache, positions, T, ctx->params.n_ctx, nh, nkv, D, s->mix);
    if (gated)
        for (int64_t i = 0; i < (int64_t)T * nh * D; i++) s->mix[i] *= cpu_sigmoid(s->gate[i]);

    cpu_matmul(ex, &w->attn_output, s->mix, T, out);
}

static void swiglu_ffn(specla_context *ctx, int il, const float *x, int T, float *out) {
    const specla_layer_weights *w = &ctx->model->layers[il];
    forward_scratch *s = &ctx->scratch;
    const int F = ctx->model->hp.n_ff;
    cpu_matmul(&ctx->exec, &w->ffn_gate, x, T, s->ffn_a);
    cpu_matmul(&ctx->exec, &w->ffn_up, x, T, s->ffn_b);
    for (int64_t i = 0; i < (int64_t)T * F; i++) s->ffn_a[i] = cpu_silu(s->ffn_a[i]) * s->ffn_b[i];
    cpu_matmul(&ctx->exec, &w->ffn_down, s->ffn_a, T, out);
}

static int32_t argmax_row(const float *row, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (row[i] > row[best]) best = i; /* strict: the lowest index wins ties */
    return best;
}

/* Embedding, every trunk layer (capturing feature rows where asked), final norm, LM head for
 * the last n_logit_rows rows, argmax. */
static specla_status run_model(specla_context *ctx, const int32_t *tokens, const batch_view *bv, int n_logit_rows,
                               float *logits_out, int32_t *argmax_out) {
    const specla_model *m = ctx->model;
    const specla_hparams *hp = &m->hp;
    forward_scratch *s = &ctx->scratch;
    const int T = bv->T, E = hp->n_embd;
    const int64_t V = ctx->logit_head.ne1; /* n_vocab, or the rows of a chosen subset */

    /* allocate before touching any state, so a failure leaves the context as it was */
    if (argmax_out && !logits_out && s->logits_floats < n_logit_rows * V) {
        free(s->logits);
        s->logits = (float *)malloc(sizeof(float) * (size_t)(n_logit_rows * V));
        s->logits_floats = s->logits ? n_logit_rows * V : 0;
        if (!s->logits) return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "forward: out of memory for logits");
    }

    for (int t = 0; t < T; t++) cpu_get_row(&m->token_embd, tokens[t], s->hidden + (int64_t)t * E);

    for (int il = 0; il < hp->n_layer; il++) {
        const specla_layer_weights *w = &m->layers[il];
        cpu_rms_norm(s->hidden, (const float *)w->attn_norm.data, T, E, hp->rms_eps, s->normed);
        if (m->layer_is_recurrent[il])
            gated_deltanet_layer(ctx, il, s->normed, bv, s->layer_out);
        else
            attention_layer(ctx, il, s->normed, bv, s->layer_out);
        add_in_place(s->hidden, s->layer_out, (int64_t)T * E);
        cpu_rms_norm(s->hidden, (const float *)w->post_attention_norm.data, T, E, hp->rms_eps, s->normed);
        swiglu_ffn(ctx, il, s->normed, T, s->layer_out);
        add_in_place(s->hidden, s->layer_out, (int64_t)T * E);
        if (ctx->features && ctx->capture_slot[il] >= 0) {
            const int64_t row = (int64_t)ctx->n_capture * E;
            for (int t = 0; t < T; t++)
                memcpy(ctx->features + bv->rows[t] * row + (int64_t)ctx->capture_slot[il] * E,
                       s->hidden + (int64_t)t * E, sizeof(float) * (size_t)E);
        }
    }

    if (!logits_out && !argmax_out) return SPECLA_OK;
    const float *first = s->hidden + (int64_t)(T - n_logit_rows) * E;
    cpu_rms_norm(first, (const float *)m->output_norm.data, n_logit_rows, E, hp->rms_eps, s->normed);
    float *logits = logits_out ? logits_out : s->logits;
    cpu_matmul(&ctx->exec, &ctx->logit_head, s->normed, n_logit_rows, logits);
    if (argmax_out)
        for (int r = 0; r < n_logit_rows; r++) argmax_out[r] = argmax_row(logits + (int64_t)r * V, (int)V);
    return SPECLA_OK;
}

specla_status qwen35_forward(specla_context *ctx, const specla_batch *batch) {
    const batch_view bv = {batch->n_tokens, batch->positions, batch->positions, NULL, NULL};
    return run_model(ctx, batch->tokens, &bv, batch->logits_all ? batch->n_tokens : 1, batch->logits, batch->argmax);
}

specla_status qwen35_forward_tree(specla_context *ctx, const specla_tree_batch *tree) {
    const tree_state *tr = &ctx->tree;
    const batch_view bv = {tree->n_nodes, tr->positions, tr->rows, tr->schedule, hld_parents(tr->schedule)};
    if (ctx->model->n_recurrent_layers > 0 && !tr->banks)
        return specla_fail(SPECLA_ERR_STATE, "specla_verify_tree: no factor banks in this context");
    return run_model(ctx, tree->tokens, &bv, tree->n_nodes, tree->logits, tree->argmax);
}
