/* The full-attention block of a trunk layer, for every architecture (attention_variant says how
 * they differ): x[T][E] (normed) -> out[T][E]; writes the batch's K/V rows into the cache. A plain
 * batch attends causally; a tree batch attends over the committed prefix plus each node's
 * ancestors, with the same per-row arithmetic, so a node's output equals decoding its path. */
#include "context.h"

attention_variant attention_variant_of(int32_t arch) {
    attention_variant v = {0, 0, 0};
    v.gated = arch == SPECLA_ARCH_QWEN35;
    v.qk_norm = arch != SPECLA_ARCH_QWEN2;
    v.bias = arch == SPECLA_ARCH_QWEN2;
    return v;
}

void attention_layer(specla_context *ctx, int il, const float *x, const batch_view *bv, float *out) {
    const int T = bv->T;
    const specla_model *m = ctx->model;
    const specla_hparams *hp = &m->hp;
    const specla_layer_weights *w = &ctx->weights.layers[il];
    const backend *be = ctx->be;
    const backend_ops *ops = be->ops;
    forward_scratch *s = &ctx->scratch;
    const int D = hp->head_dim, nh = hp->n_head, nkv = hp->n_head_kv;
    const int slot = m->state_slot[il];
    float *k_cache = ctx->k_cache[slot], *v_cache = ctx->v_cache[slot];
    const attention_variant variant = attention_variant_of(hp->arch);

    /* q (or per head [query | gate]) [T][nh][D or 2D], k and v [T][nkv][D], one pass over x */
    const specla_tensor *mats[3] = {&w->attn_q, &w->attn_k, &w->attn_v};
    float *const outs[3] = {variant.gated ? s->proj : s->q, s->k, s->v};
    ops->matmul_group(be, 3, mats, x, T, outs);
    if (variant.bias) {
        ops->add_bias_rows(be, s->q, (const float *)w->attn_q_bias.data, T, nh * D);
        ops->add_bias_rows(be, s->k, (const float *)w->attn_k_bias.data, T, nkv * D);
        ops->add_bias_rows(be, s->v, (const float *)w->attn_v_bias.data, T, nkv * D);
    }
    /* q/gate split, q/k norms, RoPE and the batch's K/V rows into the cache, as one op */
    ops->attention_prepare(be, variant.gated ? s->proj : NULL, s->q, variant.gated ? s->gate : NULL, s->k, s->v,
                           variant.qk_norm ? (const float *)w->attn_q_norm.data : NULL,
                           variant.qk_norm ? (const float *)w->attn_k_norm.data : NULL, hp->rms_eps, bv->positions,
                           hp->rope_dims, hp->rope_freq_base, bv->rows, T, nh, nkv, D, k_cache, v_cache);
    if (bv->parents)
        /* node 0 is the root, at position n_past: positions[0] is the prefix length, read on the
         * backend; the grid is sized for bv->max_rows (the whole cache for a verify), so a recorded
         * verify serves every n_past */
        ops->attention_tree(be, s->q, k_cache, v_cache, bv->positions, bv->max_rows, bv->parents, T, nh, nkv, D,
                            s->mix);
    else
        ops->attention(be, s->q, k_cache, v_cache, NULL, bv->positions, T, bv->max_rows, nh, nkv, D, s->mix);
    if (variant.gated) ops->sigmoid_mul(be, s->mix, s->gate, (int64_t)T * nh * D);

    ops->matmul(be, &w->attn_output, s->mix, T, out);
}
