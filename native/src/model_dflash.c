/* specla_draft_model_create: validate a DFlash draft's hyper-parameters and weight views against
 * themselves and the target model at the ABI boundary (the Python loader checks first, with
 * file-level messages; this is the second gate for embedders calling the C ABI directly). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dflash.h"
#include "error.h"
#include "tensor_types.h"

/* One weight view against its expected shape (tensor_check in tensor_types.c); messages name the
 * tensor as the GGUF does. */
static specla_status check_tensor(const specla_tensor *t, const char *what, int layer, int64_t ne0, int64_t ne1,
                                  int must_be_f32) {
    return tensor_check(t, "draft tensor", what, layer, ne0, ne1, must_be_f32);
}

static specla_status validate_hparams(const specla_draft_hparams *hp, const specla_model *target) {
    if (hp->n_layer <= 0 || hp->n_embd <= 0 || hp->n_ff <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 ||
        hp->head_dim <= 0 || hp->n_target_layers <= 0)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "draft hparams: every size must be positive");
    if (hp->n_head % hp->n_head_kv != 0)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "draft hparams: n_head %d is not a multiple of n_head_kv %d",
                           hp->n_head, hp->n_head_kv);
    if (hp->head_dim % 2 != 0)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                           "draft hparams: head_dim %d must be even (NEOX RoPE rotates all head dims in pairs)",
                           hp->head_dim);
    if (!(hp->rms_eps > 0.0f) || !(hp->rope_freq_base > 0.0f))
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "draft hparams: rms_eps and rope_freq_base must be positive");
    if (hp->block_size < 2)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "draft hparams: block_size %d must be >= 2", hp->block_size);
    if (hp->n_embd != target->hp.n_embd)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                           "draft hparams: n_embd %d differs from the target model's n_embd %d", hp->n_embd,
                           target->hp.n_embd);
    if (hp->mask_token_id < 0 || hp->mask_token_id >= target->hp.n_vocab)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                           "draft hparams: mask_token_id %d is outside the target vocabulary [0, %d)",
                           hp->mask_token_id, target->hp.n_vocab);
    if (hp->sliding_window < 0)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "draft hparams: sliding_window %d is negative",
                           hp->sliding_window);
    if (hp->layer_is_swa)
        for (int il = 0; il < hp->n_layer; il++)
            if (hp->layer_is_swa[il] && hp->sliding_window <= 0)
                return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                                   "draft hparams: layer %d is a sliding-window layer but sliding_window is 0", il);
    if (hp->context_kv_layer_norm != 0 && hp->context_kv_layer_norm != 1)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "draft hparams: context_kv_layer_norm must be 0 or 1, got %d",
                           hp->context_kv_layer_norm);
    if ((int64_t)hp->n_target_layers * target->hp.n_embd > INT32_MAX || (int64_t)hp->n_head * hp->head_dim > INT32_MAX)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "draft hparams: a projection width does not fit in int32");
    return SPECLA_OK;
}

static specla_status validate_layer(const specla_draft_hparams *hp, const specla_draft_layer_weights *lw, int il) {
    const int E = hp->n_embd, F = hp->n_ff, D = hp->head_dim, nh = hp->n_head, nkv = hp->n_head_kv;
    SPECLA_TRY(check_tensor(&lw->attn_norm, "attn_norm.weight", il, E, 1, 1));
    SPECLA_TRY(check_tensor(&lw->ffn_norm, "ffn_norm.weight", il, E, 1, 1));
    SPECLA_TRY(check_tensor(&lw->attn_q, "attn_q.weight", il, E, (int64_t)nh * D, 0));
    SPECLA_TRY(check_tensor(&lw->attn_k, "attn_k.weight", il, E, (int64_t)nkv * D, 0));
    SPECLA_TRY(check_tensor(&lw->attn_v, "attn_v.weight", il, E, (int64_t)nkv * D, 0));
    SPECLA_TRY(check_tensor(&lw->attn_output, "attn_output.weight", il, (int64_t)nh * D, E, 0));
    SPECLA_TRY(check_tensor(&lw->attn_q_norm, "attn_q_norm.weight", il, D, 1, 1));
    SPECLA_TRY(check_tensor(&lw->attn_k_norm, "attn_k_norm.weight", il, D, 1, 1));
    SPECLA_TRY(check_tensor(&lw->ffn_gate, "ffn_gate.weight", il, E, F, 0));
    SPECLA_TRY(check_tensor(&lw->ffn_up, "ffn_up.weight", il, E, F, 0));
    SPECLA_TRY(check_tensor(&lw->ffn_down, "ffn_down.weight", il, F, E, 0));
    return SPECLA_OK;
}

SPECLA_API specla_status specla_draft_model_create(const specla_draft_hparams *hparams,
                                                   const specla_draft_weights *weights, const specla_model *target,
                                                   specla_draft_model **out_model) {
    if (!hparams || !weights || !target || !out_model || !weights->layers)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_draft_model_create: NULL argument");
    *out_model = NULL;
    SPECLA_TRY(validate_hparams(hparams, target));
    const int E = hparams->n_embd, Et = target->hp.n_embd, N = hparams->n_target_layers;
    SPECLA_TRY(check_tensor(&weights->fc, "dflash.fc.weight", -1, (int64_t)N * Et, E, 0));
    SPECLA_TRY(check_tensor(&weights->hidden_norm, "dflash.hidden_norm.weight", -1, E, 1, 1));
    SPECLA_TRY(check_tensor(&weights->output_norm, "output_norm.weight", -1, E, 1, 1));
    if (hparams->context_kv_layer_norm) {
        if (!weights->aux_hidden_norm)
            return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                               "draft weights: context_kv_layer_norm is set but aux_hidden_norm is NULL");
        for (int i = 0; i < N; i++) {
            char name[64];
            snprintf(name, sizeof name, "dflash.aux_hidden_norm.%d.weight", i);
            SPECLA_TRY(check_tensor(&weights->aux_hidden_norm[i], name, -1, Et, 1, 1));
        }
    }
    for (int il = 0; il < hparams->n_layer; il++) SPECLA_TRY(validate_layer(hparams, &weights->layers[il], il));

    specla_draft_model *m = (specla_draft_model *)calloc(1, sizeof *m);
    if (!m) return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "specla_draft_model_create: out of memory");
    const size_t L = (size_t)hparams->n_layer;
    m->layer_is_swa = (uint8_t *)calloc(L, 1);
    m->layers = (specla_draft_layer_weights *)malloc(sizeof(specla_draft_layer_weights) * L);
    if (hparams->context_kv_layer_norm) m->aux_hidden_norm = (specla_tensor *)malloc(sizeof(specla_tensor) * (size_t)N);
    if (!m->layer_is_swa || !m->layers || (hparams->context_kv_layer_norm && !m->aux_hidden_norm)) {
        specla_draft_model_free(m);
        return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "specla_draft_model_create: out of memory");
    }
    if (hparams->layer_is_swa)
        for (size_t il = 0; il < L; il++) m->layer_is_swa[il] = hparams->layer_is_swa[il] ? 1 : 0;
    memcpy(m->layers, weights->layers, sizeof(specla_draft_layer_weights) * L);
    if (m->aux_hidden_norm) memcpy(m->aux_hidden_norm, weights->aux_hidden_norm, sizeof(specla_tensor) * (size_t)N);
    m->hp = *hparams;
    m->hp.layer_is_swa = m->layer_is_swa;
    m->fc = weights->fc;
    m->hidden_norm = weights->hidden_norm;
    m->output_norm = weights->output_norm;
    m->target = target;
    m->target_n_embd = Et;
    *out_model = m;
    return SPECLA_OK;
}

SPECLA_API void specla_draft_model_free(specla_draft_model *model) {
    if (!model) return;
    draft_release_device_weights(model);
    free(model->layer_is_swa);
    free(model->layers);
    free(model->aux_hidden_norm);
    free(model);
}
