/* The Gated DeltaNet block of a qwen35 trunk layer (docs/qwen35.md, forward pass): x[T][E] (normed)
 * -> out[T][E], updating the layer's conv window and recurrent state. A plain batch walks its
 * tokens in order through the sequential kernels; a tree batch goes through the SpecLA ops of the
 * factor banks (tree conv, state-resident chain verify), which leave the durable state untouched
 * except for the deferred fold of the previous step's accepted path. */
#include "context.h"
#include "factor_banks.h"

void gated_deltanet_layer(specla_context *ctx, int il, const float *x, const batch_view *bv, float *out) {
    const int T = bv->T;
    const specla_model *m = ctx->model;
    const specla_hparams *hp = &m->hp;
    const specla_layer_weights *w = &ctx->weights.layers[il];
    const backend *be = ctx->be;
    const backend_ops *ops = be->ops;
    forward_scratch *s = &ctx->scratch;
    const int S = hp->ssm_state_size, Hk = hp->ssm_group_count;
    const int Hv = hp->ssm_time_step_rank, K = hp->ssm_conv_kernel;
    const int slot = m->state_slot[il];

    /* a tree batch records its raw conv inputs, keys and gates in the factor bank: they are produced
     * there directly rather than copied in after */
    float *proj = s->proj, *k = s->k, *g = s->g;
    if (bv->schedule) factor_banks_layer_inputs(ctx->tree.banks, slot, &proj, &k, &g);

    /* one pass over x for the four projections: raw conv inputs [T][2 Hk S + Hv S], z [T][Hv*S], beta, alpha [T][Hv] */
    const specla_tensor *mats[4] = {&w->attn_qkv, &w->attn_gate, &w->ssm_beta, &w->ssm_alpha};
    float *const outs[4] = {proj, s->gate, s->beta, g};
    ops->matmul_group(be, 4, mats, x, T, outs);
    const float *dt_bias = (const float *)w->ssm_dt_bias.data, *ssm_a = (const float *)w->ssm_a.data;
    const float *conv_weight = (const float *)w->ssm_conv1d.data;

    if (bv->schedule) {
        ops->gdn_gates(be, s->beta, g, dt_bias, ssm_a, T, Hv);
        const specla_conv_tree_args args = {bv->schedule, slot, proj, conv_weight, ctx->conv_state[slot], s->conv_out};
        factor_banks_conv_tree(ctx->tree.banks, be, ctx->tree.schedule, &args);
        ops->gdn_split_qkv(be, s->conv_out, T, Hk, Hv, S, hp->rms_eps, s->q, k, s->v);
    } else {
        /* gates, causal conv and split as one op (one kernel on a GPU for a decode step) */
        ops->gdn_prepare(be, s->beta, g, dt_bias, ssm_a, proj, conv_weight, T, Hk, Hv, S, K, hp->rms_eps,
                         ctx->conv_state[slot], s->conv_out, s->q, k, s->v);
    }

    if (bv->schedule) {
        const specla_gdn_tree_args args = {bv->schedule, slot, s->q, k, s->v, g, s->beta, ctx->gdn_state[slot],
                                           s->mix};
        factor_banks_verify_gdn(ctx->tree.banks, be, ctx->tree.schedule, &args);
    } else {
        ops->gated_delta_rule(be, s->q, k, s->v, g, s->beta, T, Hk, Hv, S, ctx->gdn_state[slot], s->mix);
    }

    /* o_h <- rms(o_h) * ssm_norm * silu(z_h), the same S-vector weight for every head */
    ops->gated_rms_norm(be, s->mix, (const float *)w->ssm_norm.data, s->gate, T * Hv, S, hp->rms_eps);
    ops->matmul(be, &w->ssm_out, s->mix, T, out);
}
