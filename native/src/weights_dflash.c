/* A DFlash draft's own weights on a context's backend: the host views on the CPU, else one upload
 * per draft and device (weight_upload.h), made by the first draft context there and kept by the
 * draft model until it is freed; matrices laid out for the backend's matmul, norms as stored. The
 * target's embedding and LM head are not copied: a draft context reads the target model's upload
 * to the same device (model_weights_for). */
#include <stdlib.h>
#include <string.h>

#include "dflash.h"
#include "error.h"
#include "weight_upload.h"

/* Every tensor field of a draft layer, with how it is read. */
#define DRAFT_LAYER_FIELDS(X)                                                                                        \
    X(attn_norm, WEIGHT_PLAIN) X(ffn_norm, WEIGHT_PLAIN) X(attn_q, WEIGHT_MATMUL) X(attn_k, WEIGHT_MATMUL)           \
    X(attn_v, WEIGHT_MATMUL) X(attn_output, WEIGHT_MATMUL) X(attn_q_norm, WEIGHT_PLAIN)                              \
    X(attn_k_norm, WEIGHT_PLAIN) X(ffn_gate, WEIGHT_MATMUL) X(ffn_up, WEIGHT_MATMUL) X(ffn_down, WEIGHT_MATMUL)

/* The device views being filled: the set and the host arrays its pointers lead to. */
typedef struct draft_views {
    draft_weight_set *set;
    specla_tensor *aux_hidden_norm;     /* [n_target_layers] or NULL */
    specla_draft_layer_weights *layers; /* [n_layer] */
} draft_views;

static void place_draft(upload_pass *pass, const void *host_model, void *device_model) {
    const specla_draft_model *m = (const specla_draft_model *)host_model;
    draft_views *out = (draft_views *)device_model;
    upload_place(pass, &m->fc, &out->set->fc, WEIGHT_MATMUL, "dflash.fc.weight");
    upload_place(pass, &m->hidden_norm, &out->set->hidden_norm, WEIGHT_PLAIN, "dflash.hidden_norm.weight");
    upload_place(pass, &m->output_norm, &out->set->output_norm, WEIGHT_PLAIN, "output_norm.weight");
    if (m->aux_hidden_norm)
        for (int i = 0; i < m->hp.n_target_layers; i++)
            upload_place(pass, &m->aux_hidden_norm[i], &out->aux_hidden_norm[i], WEIGHT_PLAIN,
                         "dflash.aux_hidden_norm.weight");
    for (int il = 0; il < m->hp.n_layer; il++) {
        const specla_draft_layer_weights *h = &m->layers[il];
        specla_draft_layer_weights *d = &out->layers[il];
#define PLACE_FIELD(field, use) upload_place(pass, &h->field, &d->field, use, "draft " #field);
        DRAFT_LAYER_FIELDS(PLACE_FIELD)
#undef PLACE_FIELD
    }
}

void draft_release_device_weights(specla_draft_model *m) {
    for (int i = 0; i < MODEL_MAX_UPLOADS; i++) {
        draft_upload *u = &m->uploads[i];
        if (!u->be) continue;
        if (u->memory) u->be->ops->free(u->be, u->memory);
        free(u->aux_hidden_norm);
        free(u->layers);
        u->be->ops->destroy(u->be);
        memset(u, 0, sizeof *u);
    }
}

specla_status draft_weights_for(const specla_draft_model *model, const backend *be, draft_weight_set *out) {
    if (be->ops->host_memory) {
        out->fc = model->fc;
        out->hidden_norm = model->hidden_norm;
        out->output_norm = model->output_norm;
        out->aux_hidden_norm = model->aux_hidden_norm;
        out->layers = model->layers;
        return SPECLA_OK;
    }
    /* the upload cache is the one mutable part of a draft model: its contexts share what it holds */
    specla_draft_model *m = (specla_draft_model *)model;
    draft_upload *slot = NULL;
    for (int i = 0; i < MODEL_MAX_UPLOADS; i++) {
        draft_upload *u = &m->uploads[i];
        if (u->be && u->be->kind == be->kind && u->be->device == be->device) {
            *out = u->set;
            return SPECLA_OK;
        }
        if (!u->be && !slot) slot = u;
    }
    if (!slot)
        return specla_fail(SPECLA_ERR_UNSUPPORTED, "draft model: weights are already on %d devices", MODEL_MAX_UPLOADS);
    specla_draft_layer_weights *layers =
        (specla_draft_layer_weights *)calloc((size_t)m->hp.n_layer, sizeof(specla_draft_layer_weights));
    specla_tensor *aux =
        m->aux_hidden_norm ? (specla_tensor *)calloc((size_t)m->hp.n_target_layers, sizeof(specla_tensor)) : NULL;
    if (!layers || (m->aux_hidden_norm && !aux)) {
        free(layers);
        free(aux);
        return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "draft model: out of memory");
    }
    draft_weight_set set;
    memset(&set, 0, sizeof set);
    draft_views views = {&set, aux, layers};
    backend *own = NULL;
    void *memory = NULL;
    const specla_status st = upload_weights(be, place_draft, m, &views, "draft model", &own, &memory);
    if (st != SPECLA_OK) {
        free(layers);
        free(aux);
        return st;
    }
    set.aux_hidden_norm = aux;
    set.layers = layers;
    slot->be = own;
    slot->memory = memory;
    slot->aux_hidden_norm = aux;
    slot->layers = layers;
    slot->set = set;
    *out = set;
    return SPECLA_OK;
}
