/* specla_model_create: validate a qwen35 / qwen2 / qwen3 trunk's hyper-parameters and weight views at the ABI
 * boundary, so that the forward pass can trust every shape. The Python loader validates first
 * with file-level messages; this is the second gate for embedders calling the C ABI directly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "context.h"
#include "gguf_file.h"
#include "tensor_types.h"

/* One weight view against its expected shape (tensor_check in tensor_types.c); messages name the
 * tensor as the GGUF does. */
static specla_status check_tensor(const specla_tensor *t, const char *what, int layer, int64_t ne0, int64_t ne1,
                                  int must_be_f32) {
    return tensor_check(t, "tensor", what, layer, ne0, ne1, must_be_f32);
}

static specla_status validate_hparams(const specla_hparams *hp) {
    if (hp->arch != SPECLA_ARCH_QWEN35 && hp->arch != SPECLA_ARCH_QWEN2 && hp->arch != SPECLA_ARCH_QWEN3)
        return specla_fail(SPECLA_ERR_UNSUPPORTED, "hparams: unknown architecture id %d", hp->arch);
    if (hp->n_layer <= 0 || hp->n_embd <= 0 || hp->n_ff <= 0 || hp->n_vocab <= 0 || hp->n_head <= 0 ||
        hp->n_head_kv <= 0 || hp->head_dim <= 0)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "hparams: every size must be positive");
    if (hp->n_head % hp->n_head_kv != 0)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "hparams: n_head %d is not a multiple of n_head_kv %d",
                           hp->n_head, hp->n_head_kv);
    if (hp->rope_dims <= 0 || hp->rope_dims % 2 != 0 || hp->rope_dims > hp->head_dim)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "hparams: rope_dims %d must be even and <= head_dim %d",
                           hp->rope_dims, hp->head_dim);
    if (!(hp->rms_eps > 0.0f) || !(hp->rope_freq_base > 0.0f))
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "hparams: rms_eps and rope_freq_base must be positive");
    if (hp->layer_is_recurrent == NULL)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "hparams: layer_is_recurrent is NULL");
    int n_recurrent = 0;
    for (int il = 0; il < hp->n_layer; il++) n_recurrent += hp->layer_is_recurrent[il] != 0;
    if (hp->arch != SPECLA_ARCH_QWEN35 && n_recurrent > 0)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "hparams: %s has no recurrent layers",
                           hp->arch == SPECLA_ARCH_QWEN2 ? "qwen2" : "qwen3");
    if (n_recurrent == 0) return SPECLA_OK; /* the ssm sizes are not used */
    if (hp->ssm_conv_kernel < 2 || hp->ssm_state_size <= 0 || hp->ssm_group_count <= 0 || hp->ssm_time_step_rank <= 0)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "hparams: ssm sizes must be positive (conv kernel >= 2)");
    if (hp->ssm_time_step_rank % hp->ssm_group_count != 0)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "hparams: Hv %d is not a multiple of Hk %d",
                           hp->ssm_time_step_rank, hp->ssm_group_count);
    if (hp->ssm_conv_kernel > 64)
        return specla_fail(SPECLA_ERR_UNSUPPORTED, "hparams: conv kernel %d > 64", hp->ssm_conv_kernel);
    return SPECLA_OK;
}

static specla_status validate_layer(const specla_hparams *hp, const specla_layer_weights *lw, int il, int C) {
    const int E = hp->n_embd, F = hp->n_ff, S = hp->ssm_state_size, Hv = hp->ssm_time_step_rank;
    const int D = hp->head_dim, nh = hp->n_head, nkv = hp->n_head_kv;
    SPECLA_TRY(check_tensor(&lw->attn_norm, "attn_norm.weight", il, E, 1, 1));
    SPECLA_TRY(check_tensor(&lw->post_attention_norm, "post_attention_norm.weight", il, E, 1, 1));
    if (hp->layer_is_recurrent[il]) {
        SPECLA_TRY(check_tensor(&lw->attn_qkv, "attn_qkv.weight", il, E, C, 0));
        SPECLA_TRY(check_tensor(&lw->attn_gate, "attn_gate.weight", il, E, Hv * S, 0));
        SPECLA_TRY(check_tensor(&lw->ssm_conv1d, "ssm_conv1d.weight", il, hp->ssm_conv_kernel, C, 1));
        SPECLA_TRY(check_tensor(&lw->ssm_dt_bias, "ssm_dt.bias", il, Hv, 1, 1));
        SPECLA_TRY(check_tensor(&lw->ssm_a, "ssm_a", il, Hv, 1, 1));
        SPECLA_TRY(check_tensor(&lw->ssm_beta, "ssm_beta.weight", il, E, Hv, 0));
        SPECLA_TRY(check_tensor(&lw->ssm_alpha, "ssm_alpha.weight", il, E, Hv, 0));
        SPECLA_TRY(check_tensor(&lw->ssm_norm, "ssm_norm.weight", il, S, 1, 1));
        SPECLA_TRY(check_tensor(&lw->ssm_out, "ssm_out.weight", il, Hv * S, E, 0));
    } else if (hp->arch == SPECLA_ARCH_QWEN2) { /* biases, no q/k norms, no output gate */
        SPECLA_TRY(check_tensor(&lw->attn_q, "attn_q.weight", il, E, nh * D, 0));
        SPECLA_TRY(check_tensor(&lw->attn_k, "attn_k.weight", il, E, nkv * D, 0));
        SPECLA_TRY(check_tensor(&lw->attn_v, "attn_v.weight", il, E, nkv * D, 0));
        SPECLA_TRY(check_tensor(&lw->attn_q_bias, "attn_q.bias", il, nh * D, 1, 1));
        SPECLA_TRY(check_tensor(&lw->attn_k_bias, "attn_k.bias", il, nkv * D, 1, 1));
        SPECLA_TRY(check_tensor(&lw->attn_v_bias, "attn_v.bias", il, nkv * D, 1, 1));
        SPECLA_TRY(check_tensor(&lw->attn_output, "attn_output.weight", il, nh * D, E, 0));
    } else { /* q/k norms: qwen35 gated attention (query | gate per head), qwen3 plain */
        const int q_width = hp->arch == SPECLA_ARCH_QWEN35 ? 2 * nh * D : nh * D;
        SPECLA_TRY(check_tensor(&lw->attn_q, "attn_q.weight", il, E, q_width, 0));
        SPECLA_TRY(check_tensor(&lw->attn_k, "attn_k.weight", il, E, nkv * D, 0));
        SPECLA_TRY(check_tensor(&lw->attn_v, "attn_v.weight", il, E, nkv * D, 0));
        SPECLA_TRY(check_tensor(&lw->attn_output, "attn_output.weight", il, nh * D, E, 0));
        SPECLA_TRY(check_tensor(&lw->attn_q_norm, "attn_q_norm.weight", il, D, 1, 1));
        SPECLA_TRY(check_tensor(&lw->attn_k_norm, "attn_k_norm.weight", il, D, 1, 1));
    }
    SPECLA_TRY(check_tensor(&lw->ffn_gate, "ffn_gate.weight", il, E, F, 0));
    SPECLA_TRY(check_tensor(&lw->ffn_up, "ffn_up.weight", il, E, F, 0));
    SPECLA_TRY(check_tensor(&lw->ffn_down, "ffn_down.weight", il, F, E, 0));
    return SPECLA_OK;
}

SPECLA_API specla_status specla_model_create(const specla_hparams *hparams, const specla_weights *weights,
                                             specla_model **out_model) {
    if (!hparams || !weights || !out_model || !weights->layers)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_model_create: NULL argument");
    *out_model = NULL;
    SPECLA_TRY(validate_hparams(hparams));
    /* conv channels of the recurrent layers (0 for an attention-only architecture) */
    const int C = hparams->arch != SPECLA_ARCH_QWEN35 ? 0
                                                      : 2 * hparams->ssm_group_count * hparams->ssm_state_size +
                                                            hparams->ssm_time_step_rank * hparams->ssm_state_size;
    SPECLA_TRY(check_tensor(&weights->token_embd, "token_embd.weight", -1, hparams->n_embd, hparams->n_vocab, 0));
    SPECLA_TRY(check_tensor(&weights->output_norm, "output_norm.weight", -1, hparams->n_embd, 1, 1));
    if (weights->output.data)
        SPECLA_TRY(check_tensor(&weights->output, "output.weight", -1, hparams->n_embd, hparams->n_vocab, 0));
    int n_attention = 0;
    for (int il = 0; il < hparams->n_layer; il++) {
        SPECLA_TRY(validate_layer(hparams, &weights->layers[il], il, C));
        n_attention += !hparams->layer_is_recurrent[il];
    }

    specla_model *m = (specla_model *)calloc(1, sizeof *m);
    if (!m) return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "specla_model_create: out of memory");
    m->hp = *hparams;
    m->layer_is_recurrent = (uint8_t *)malloc((size_t)hparams->n_layer);
    m->layers = (specla_layer_weights *)malloc(sizeof(specla_layer_weights) * (size_t)hparams->n_layer);
    m->state_slot = (int *)malloc(sizeof(int) * (size_t)hparams->n_layer);
    if (!m->layer_is_recurrent || !m->layers || !m->state_slot) {
        specla_model_free(m);
        return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "specla_model_create: out of memory");
    }
    memcpy(m->layer_is_recurrent, hparams->layer_is_recurrent, (size_t)hparams->n_layer);
    memcpy(m->layers, weights->layers, sizeof(specla_layer_weights) * (size_t)hparams->n_layer);
    m->hp.layer_is_recurrent = m->layer_is_recurrent;
    m->token_embd = weights->token_embd;
    m->output_norm = weights->output_norm;
    m->output = weights->output.data ? weights->output : weights->token_embd;
    m->conv_channels = C;
    for (int il = 0; il < hparams->n_layer; il++) {
        if (m->layer_is_recurrent[il])
            m->state_slot[il] = m->n_recurrent_layers++;
        else
            m->state_slot[il] = m->n_attention_layers++;
    }
    *out_model = m;
    return SPECLA_OK;
}

SPECLA_API void specla_model_free(specla_model *model) {
    if (!model) return;
    model_release_device_weights(model);
    free(model->layer_is_recurrent);
    free(model->layers);
    free(model->state_slot);
    gguf_file_close(model->source_file);
    free(model);
}

SPECLA_API specla_status specla_model_hparams(const specla_model *model, specla_hparams *out) {
    if (!model || !out) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_model_hparams: NULL argument");
    *out = model->hp;
    return SPECLA_OK;
}
