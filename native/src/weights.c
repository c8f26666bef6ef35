/* The weights a context's backend reads. A backend whose memory is host memory (the CPU) reads the
 * model's host views (the caller's mmap) directly. Any other backend gets one upload per model and
 * device, made by the first context that needs it and kept by the model until it is freed: every
 * matrix laid out for the backend's matmul, vectors and conv weights as stored, and the embedding
 * as stored (its rows are looked up; a tied LM head gets a second, matmul copy). The two-pass
 * upload itself (weight_upload.h) is shared with the DFlash draft's weights (weights_dflash.c). */
#include <stdlib.h>
#include <string.h>

#include "backend_registry.h"
#include "context.h"
#include "error.h"
#include "weight_upload.h"

/* Every tensor field of a layer, with how it is read. */
#define LAYER_FIELDS(X)                                                                                              \
    X(attn_norm, WEIGHT_PLAIN) X(post_attention_norm, WEIGHT_PLAIN) X(attn_qkv, WEIGHT_MATMUL)                       \
    X(attn_gate, WEIGHT_MATMUL) X(ssm_conv1d, WEIGHT_PLAIN) X(ssm_dt_bias, WEIGHT_PLAIN) X(ssm_a, WEIGHT_PLAIN)      \
    X(ssm_beta, WEIGHT_MATMUL) X(ssm_alpha, WEIGHT_MATMUL) X(ssm_norm, WEIGHT_PLAIN) X(ssm_out, WEIGHT_MATMUL)       \
    X(attn_q, WEIGHT_MATMUL) X(attn_k, WEIGHT_MATMUL) X(attn_v, WEIGHT_MATMUL) X(attn_output, WEIGHT_MATMUL)         \
    X(attn_q_norm, WEIGHT_PLAIN) X(attn_k_norm, WEIGHT_PLAIN) X(ffn_gate, WEIGHT_MATMUL) X(ffn_up, WEIGHT_MATMUL)    \
    X(ffn_down, WEIGHT_MATMUL) X(attn_q_bias, WEIGHT_PLAIN) X(attn_k_bias, WEIGHT_PLAIN) X(attn_v_bias, WEIGHT_PLAIN)

static size_t aligned(size_t bytes) { return (bytes + 255) & ~(size_t)255; }

void upload_place(upload_pass *pass, const specla_tensor *host, specla_tensor *dev, int use, const char *name) {
    *dev = *host;
    if (!host->data || pass->status != SPECLA_OK) return;
    const size_t bytes = pass->be->ops->weight_bytes(pass->be, host, use);
    if (bytes == 0) {
        pass->status = SPECLA_ERR_UNSUPPORTED;
        pass->failed = name;
        return;
    }
    if (pass->memory) {
        dev->data = pass->memory + pass->offset;
        const specla_status st = pass->be->ops->upload_weight(pass->be, host, (void *)dev->data, use);
        if (st != SPECLA_OK) {
            pass->status = st;
            pass->failed = name;
        }
    }
    pass->offset += aligned(bytes);
}

specla_status upload_weights(const backend *be, upload_place_all_fn place_all, const void *host_model,
                             void *device_model, const char *what, backend **owner, void **memory) {
    *owner = NULL;
    *memory = NULL;
    const backend_limits none = {1, 1, 1, 0, 0, 0, 0, 0, 0, 0};
    backend *own = NULL;
    specla_status st = backend_open(be->kind, be->device, 1, 0, &none, &own);
    if (st != SPECLA_OK) return st;
    upload_pass count = {own, NULL, 0, SPECLA_OK, NULL};
    place_all(&count, host_model, device_model);
    if (count.status != SPECLA_OK) {
        own->ops->destroy(own);
        return specla_fail(count.status, "%s: backend %s cannot hold tensor %s (type or shape not supported there)",
                           what, be->ops->name, count.failed);
    }
    void *mem = own->ops->alloc(own, count.offset);
    if (!mem) {
        own->ops->destroy(own);
        return specla_fail(SPECLA_ERR_OUT_OF_MEMORY,
                           "%s: its weights need %.2f GB on %s device %d, more than it has free", what,
                           (double)count.offset / 1e9, be->ops->name, be->device);
    }
    /* alloc zero-fills on the instance's stream, and a weight upload may copy outside that stream
     * (the CUDA backend's is a synchronous copy): the zeros must land first */
    st = own->ops->sync(own);
    if (st != SPECLA_OK) {
        own->ops->free(own, mem);
        own->ops->destroy(own);
        return st;
    }
    upload_pass fill = {own, (unsigned char *)mem, 0, SPECLA_OK, NULL};
    place_all(&fill, host_model, device_model);
    if (fill.status != SPECLA_OK) {
        own->ops->free(own, mem);
        own->ops->destroy(own);
        return specla_fail(fill.status, "%s: uploading tensor %s to %s failed", what, fill.failed, be->ops->name);
    }
    *owner = own;
    *memory = mem;
    return SPECLA_OK;
}

/* A target model's device views: the weight set and its layer array. */
typedef struct model_views {
    weight_set *set;
    specla_layer_weights *layers;
} model_views;

static void place_model(upload_pass *pass, const void *host_model, void *device_model) {
    const specla_model *m = (const specla_model *)host_model;
    model_views *out = (model_views *)device_model;
    upload_place(pass, &m->token_embd, &out->set->token_embd, WEIGHT_PLAIN, "token_embd.weight");
    upload_place(pass, &m->output_norm, &out->set->output_norm, WEIGHT_PLAIN, "output_norm.weight");
    upload_place(pass, &m->output, &out->set->output, WEIGHT_MATMUL, "output.weight");
    for (int il = 0; il < m->hp.n_layer; il++) {
        const specla_layer_weights *h = &m->layers[il];
        specla_layer_weights *d = &out->layers[il];
#define PLACE_FIELD(field, use) upload_place(pass, &h->field, &d->field, use, #field);
        LAYER_FIELDS(PLACE_FIELD)
#undef PLACE_FIELD
    }
}

void model_release_device_weights(specla_model *m) {
    for (int i = 0; i < MODEL_MAX_UPLOADS; i++) {
        model_upload *u = &m->uploads[i];
        if (!u->be) continue;
        if (u->set.device_memory) u->be->ops->free(u->be, u->set.device_memory);
        free(u->layers);
        u->be->ops->destroy(u->be);
        memset(u, 0, sizeof *u);
    }
}

specla_status model_weights_for(const specla_model *model, const backend *be, weight_set *out) {
    if (be->ops->host_memory) {
        out->token_embd = model->token_embd;
        out->output_norm = model->output_norm;
        out->output = model->output;
        out->layers = model->layers;
        out->device_memory = NULL;
        return SPECLA_OK;
    }
    /* the upload cache is the one mutable part of a model: contexts share what it holds */
    specla_model *m = (specla_model *)model;
    model_upload *slot = NULL;
    for (int i = 0; i < MODEL_MAX_UPLOADS; i++) {
        model_upload *u = &m->uploads[i];
        if (u->be && u->be->kind == be->kind && u->be->device == be->device) {
            *out = u->set;
            return SPECLA_OK;
        }
        if (!u->be && !slot) slot = u;
    }
    if (!slot) return specla_fail(SPECLA_ERR_UNSUPPORTED, "model: weights are already on %d devices", MODEL_MAX_UPLOADS);

    specla_layer_weights *layers = (specla_layer_weights *)calloc((size_t)m->hp.n_layer, sizeof *layers);
    if (!layers) return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "model: out of memory");
    weight_set set;
    memset(&set, 0, sizeof set);
    model_views views = {&set, layers};
    backend *own = NULL;
    void *memory = NULL;
    const specla_status st = upload_weights(be, place_model, m, &views, "model", &own, &memory);
    if (st != SPECLA_OK) {
        free(layers);
        return st;
    }
    /* the embedding is read by rows as stored; a tied LM head needs the matmul layout as well */
    set.layers = layers;
    set.device_memory = memory;
    slot->be = own;
    slot->layers = layers;
    slot->set = set;
    *out = set;
    return SPECLA_OK;
}
