/* The DFlash draft model and its context (private to the library). The ABI is in specla.h
 * ("DFlash block-diffusion draft"); the math in docs/ddtree-dflash.md.
 *
 * A draft model borrows the target's token_embd and LM head (specla_model) and reads the feature
 * rows a target context captures; it owns only its own layers. A draft context caches, per draft
 * layer, the K/V rows of every target position it has ingested, so a propose call only processes
 * the positions committed since the previous call plus the 16-row block. */
#ifndef SPECLA_DFLASH_H
#define SPECLA_DFLASH_H
#include "backend.h"
#include "context.h"
#include "specla.h"

struct specla_draft_model {
    specla_draft_hparams hp;         /* hp.layer_is_swa points at layer_is_swa below */
    uint8_t *layer_is_swa;           /* [n_layer], all 0 when the caller passed NULL */
    specla_tensor fc, hidden_norm, output_norm;
    specla_tensor *aux_hidden_norm;  /* [n_target_layers] or NULL */
    specla_draft_layer_weights *layers; /* [n_layer] */
    const specla_model *target;      /* embedding, LM head, vocabulary */
    int32_t target_n_embd;           /* E_t, width of one captured slice */
};

struct specla_draft_context {
    const specla_draft_model *model;
    int32_t n_layer;    /* copied: freeing a context never reads the model (it may be gone) */
    backend *be;        /* where the cache and scratch live and the ops run */
    int32_t n_ctx;      /* most target positions the cache holds */
    int32_t n_rows;     /* cache rows: n_ctx + block_size (the block's K/V sit after the context) */
    int32_t chunk;      /* feature rows ingested per pass */
    /* ingestion state: rows [0, ingested) hold the K/V of target positions [0, ingested) */
    int32_t ingested;
    const specla_context *source;   /* the target context the rows came from */
    float *last_feature;            /* host [n_target_layers * E_t] feature row of position ingested - 1,
                                       to notice a target rolled back and re-advanced */
    float *feature_probe;           /* host, the same size: that row as the target holds it now */
    float **k_cache, **v_cache;     /* [n_layer] -> [n_rows][nkv][D], K normed and rotated */
    /* scratch */
    float *features;    /* [chunk][n_target_layers * E_t] */
    float *ctx_rows;    /* [chunk][E] */
    float *k_rows;      /* [max(chunk, B)][nkv * D] */
    float *hidden;      /* [B][E] residual stream of the block */
    float *normed;      /* [B][E] */
    float *q;           /* [B][nh * D] */
    float *mix;         /* [B][nh * D] attention output */
    float *branch;      /* [B][E] */
    float *ffn_a, *ffn_b; /* [B][F] */
    float *logits;      /* [B - 1][V] */
    specla_tensor logit_head; /* rows of the target's LM head the block is scored over (all by default) */
    logit_row_set logit_rows;
    int32_t *positions; /* [max(chunk, B)] rope positions */
    int32_t *attn_rows; /* [B] last visible cache row per block row, relative to the window start */
    int32_t *block_tokens; /* [B] the block's token ids */
    int32_t *host_ints; /* host [max(chunk, B)]: what positions / attn_rows / block_tokens are filled from */
    int32_t *top_tokens; /* [B - 1][top_k capacity]: propose's answer before it is read back */
    float *top_logprobs;
    int32_t top_capacity; /* entries per row top_tokens holds */
};

#endif
