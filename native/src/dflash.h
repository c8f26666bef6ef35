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

/* The draft's own weights as a context's backend reads them: the host views on the CPU, an upload
 * on a GPU (weights_dflash.c). */
typedef struct draft_weight_set {
    specla_tensor fc, hidden_norm, output_norm;
    const specla_tensor *aux_hidden_norm;     /* [n_target_layers] or NULL */
    const specla_draft_layer_weights *layers; /* [n_layer] */
} draft_weight_set;

/* One upload of a draft's weights to a device, with the backend instance that owns the memory. */
typedef struct draft_upload {
    backend *be;
    void *memory;
    specla_tensor *aux_hidden_norm;     /* host arrays of the device views */
    specla_draft_layer_weights *layers;
    draft_weight_set set;
} draft_upload;

struct specla_draft_model {
    specla_draft_hparams hp;         /* hp.layer_is_swa points at layer_is_swa below */
    uint8_t *layer_is_swa;           /* [n_layer], all 0 when the caller passed NULL */
    specla_tensor fc, hidden_norm, output_norm;
    specla_tensor *aux_hidden_norm;  /* [n_target_layers] or NULL */
    specla_draft_layer_weights *layers; /* [n_layer] */
    const specla_model *target;      /* embedding, LM head, vocabulary */
    int32_t target_n_embd;           /* E_t, width of one captured slice */
    draft_upload uploads[MODEL_MAX_UPLOADS]; /* device copies made by draft contexts */
};

/* The draft weights `be` reads: the host views, or this draft's upload to be's device (made now if
 * it is the first draft context there). */
specla_status draft_weights_for(const specla_draft_model *model, const backend *be, draft_weight_set *out);
void draft_release_device_weights(specla_draft_model *model);

/* What a recorded proposal depends on besides block_ints: its depths, its top-k and the LM head it
 * multiplies (recorded_head_key: its memory, the rows multiplied and where the count of rows that
 * rank is; logit_rows_scored_head). */
typedef struct recorded_propose_key {
    recorded_head_key head;
    int32_t n_depths, top_k;
} recorded_propose_key;

struct specla_draft_context {
    const specla_draft_model *model;
    int32_t n_layer;    /* copied: freeing a context never reads the model (it may be gone) */
    backend *be;        /* where the cache and scratch live and the ops run */
    int32_t n_ctx;      /* most target positions the cache holds */
    int32_t n_rows;     /* cache rows: n_ctx + block_size (the block's K/V sit after the context) */
    int32_t chunk;      /* feature rows ingested per pass */
    draft_weight_set weights;       /* the draft's own weights as be reads them */
    weight_set target_weights;      /* the target's (embedding, LM head) as be reads them */
    /* ingestion state: rows [0, ingested) hold the K/V of target positions [0, ingested) */
    int32_t ingested;
    int64_t source_id;              /* the target context the rows came from (its id; 0: none) */
    int64_t source_rewrites;        /* its `rewrites` count when they were ingested */
    float **k_cache, **v_cache;     /* [n_layer] -> [n_rows][nkv][D], K normed and rotated */
    const specla_tensor **ingest_mats; /* host [2 n_layer]: every layer's attn_k, attn_v (project_context's */
    float **ingest_outs;               /* one matmul group; set at creation) and the cache rows they write
                                          (set per ingested chunk) */
    /* scratch */
    float *features;    /* [chunk][n_target_layers * E_t] */
    float *ctx_rows;    /* [chunk][E] */
    float *hidden;      /* [B][E] residual stream of the block */
    float *normed;      /* [B][E] */
    float *q;           /* [B][nh * D] */
    float *mix;         /* [B][nh * D] attention output */
    float *branch;      /* [B][E] */
    float *ffn_a, *ffn_b; /* [B][F] */
    float *block_k, *block_v; /* [B][nkv * D] the block's K (normed, rotated) and V, then scattered into
                                 the cache rows of its positions: a recorded proposal writes through
                                 device row ids, not through pointers that move with n_past */
    float *logits;      /* [B - 1][V] */
    specla_tensor logit_head; /* rows of the target's LM head the block is scored over (all by default) */
    logit_row_set logit_rows;
    int32_t *positions; /* [max(chunk, B)] rope positions of the context rows being ingested */
    int32_t *block_ints; /* [BLOCK_INT_KINDS][B] of the block, then one int, uploaded at once: its rope
                            positions (= its cache rows), token ids, and last visible cache row per row
                            (relative to the window start) for sliding-window and for full layers;
                            then the sliding window's first cache row */
    int32_t *host_ints; /* host [max(chunk, BLOCK_INTS(B))]: what positions / block_ints are filled
                           from */
    void *top;          /* propose's answer before it is read back in one piece: its n_depths x top_k
                           ids (int32), right after them as many log-probs (float); room for
                           (B - 1) x top_capacity of each */
    void *host_top;     /* host, the same size: where that one read-back lands */
    int32_t top_capacity; /* entries per row `top` holds */
    /* Recorded proposals: the block, the head and the top-k of a propose call read everything that
     * changes per call (n_past, the root token, the window) from block_ints, so a backend that
     * records steps records them once per key and replays them (STEP_PROPOSE). */
    int32_t no_recorded_steps;  /* 1: every proposal runs eagerly (the params', or recording failed) */
    recorded_propose_key recorded; /* what the recording was made for (n_depths 0: none yet) */
};

/* The rows of block_ints. */
enum { BLOCK_POSITIONS = 0, BLOCK_TOKENS = 1, BLOCK_ROWS_SWA = 2, BLOCK_ROWS_FULL = 3, BLOCK_INT_KINDS = 4 };
/* block_ints' ints in all: the rows above, then the sliding window's first cache row */
#define BLOCK_INTS(B) (BLOCK_INT_KINDS * (B) + 1)

#endif
