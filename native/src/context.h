/* The model and its per-sequence context (private to the library), for every architecture: the
 * model is read-only after creation and may be shared by several contexts; a context owns every
 * piece of mutable state of one sequence, in its backend's memory, allocated once at creation. */
#ifndef SPECLA_CONTEXT_H
#define SPECLA_CONTEXT_H
#include "backend.h"
#include "specla.h"

/* Weights as a context's backend sees them: the host views on the CPU (backend memory is host
 * memory), an upload on a GPU (weights.c). */
typedef struct weight_set {
    specla_tensor token_embd, output_norm, output;
    const specla_layer_weights *layers; /* [n_layer] */
    void *device_memory;                /* the upload (NULL on a host-memory backend) */
} weight_set;

/* One upload of a model's weights to a device, with the backend instance that owns the memory. */
typedef struct model_upload {
    backend *be;
    specla_layer_weights *layers;
    weight_set set;
} model_upload;
#define MODEL_MAX_UPLOADS 8

struct specla_model {
    specla_hparams hp;           /* hp.layer_is_recurrent points at layer_is_recurrent below */
    uint8_t *layer_is_recurrent; /* [n_layer] */
    specla_tensor token_embd, output_norm, output; /* host views; output aliases token_embd when tied */
    specla_layer_weights *layers;                  /* [n_layer] host views */
    int conv_channels;           /* C = 2*Hk*S + Hv*S (0 without recurrent layers) */
    int n_attention_layers, n_recurrent_layers;
    int *state_slot;             /* [n_layer]: index among layers of the same kind */
    model_upload uploads[MODEL_MAX_UPLOADS]; /* device copies made by contexts (weights.c) */
    struct gguf_file *source_file; /* the mapping the views point into when specla_model_load_gguf made the
                                      model (unmapped with it); NULL when the host owns the bytes */
};

/* The weights `be` reads: the host views, or this model's upload to be's device (made now if it is
 * the first context there). */
specla_status model_weights_for(const specla_model *model, const backend *be, weight_set *out);
void model_release_device_weights(specla_model *model);

/* How an attention layer of this architecture is built (the only place the architectures differ
 * outside the recurrent layers). */
typedef struct attention_variant {
    int gated;   /* qwen35: attn_q holds [D query | D gate] per head, output *= sigmoid(gate) */
    int qk_norm; /* qwen35, qwen3: per-head RMSNorm of q and k before RoPE */
    int bias;    /* qwen2: q/k/v biases */
} attention_variant;
attention_variant attention_variant_of(int32_t arch);

/* A reduced LM head named by row ids (set_logit_rows): the rows gathered into backend memory once,
 * only the rows after the unchanged prefix of ids on later calls (a draft vocabulary only grows). */
typedef struct logit_row_set {
    int32_t *ids;        /* host: the ids gathered now */
    int32_t *ids_on_backend; /* the same, uploaded for gather_weight_rows, then n (logit_rows_count) */
    int32_t n, capacity; /* rows gathered, rows the memory holds */
    void *memory;        /* backend memory: capacity rows of the head, laid out as the backend's
                            matmul reads them; rows past n are zero or rows chosen before */
} logit_row_set;
/* n in backend memory (the int after the capacity ids), for ops that read the row count when they run */
static inline const int32_t *logit_rows_count(const logit_row_set *set) { return set->ids_on_backend + set->capacity; }
/* Points *out_head at rows ids[0..n) of head (n = 0: head itself), gathering what changed. */
specla_status logit_rows_select(logit_row_set *set, const backend *be, const specla_tensor *head, int32_t n_vocab,
                                const int32_t *ids, int32_t n, specla_tensor *out_head, const char *op);
void logit_rows_release(logit_row_set *set, const backend *be);
/* *out_head = head, a host view of the full head's shape (NULL: `full` itself), for a context on
 * be; a GPU context refuses host rows and points the caller to `rows_op`, which names rows by id. */
specla_status logit_head_set(const backend *be, const specla_tensor *head, const specla_tensor *full, int32_t n_embd,
                             int32_t n_vocab, specla_tensor *out_head, const char *op, const char *rows_op);
/* The head an LM-head matmul multiplies for `head` (a context's logit_head), and where the count of
 * its rows that rank is (*n_valid; NULL: all of them). A chosen head in set's memory is multiplied
 * over every row the memory holds, and the ops after it (argmax, top-k) rank the first n, read from
 * backend memory when they run: their launches do not depend on n, so a vocabulary that grows within
 * its capacity keeps a recorded step. The rows past n (zero, or rows chosen before) cost their share
 * of the head's matmul, a few per cent. Any other head is returned as it is. */
specla_tensor logit_rows_scored_head(const logit_row_set *set, const specla_tensor *head, const int32_t **n_valid);

/* Scratch activations for up to max_batch tokens (backend memory). */
typedef struct forward_scratch {
    float *hidden;   /* [B][E] residual stream */
    float *normed;   /* [B][E] */
    float *layer_out;/* [B][E] */
    float *proj;     /* [B][max(C, 2*nh*D)] qkv or q|gate projection */
    float *conv_out; /* [B][C] */
    float *q, *k, *v;/* [B][max(Hk*S, nh*D)], [B][max(Hk*S, nkv*D)], [B][max(Hv*S, nkv*D)] */
    float *gate;     /* [B][max(Hv*S, nh*D)] z of GDN, output gate of attention */
    float *beta, *g; /* [B][Hv] */
    float *mix;      /* [B][max(Hv*S, nh*D)] head outputs before the output projection */
    float *ffn_a, *ffn_b; /* [B][F] */
    float *logits;   /* [logit_rows][n_vocab]: logits before they reach the caller */
    int32_t logit_rows;
    int32_t *argmax; /* [max(B, max_tree_nodes)] */
    int32_t *tokens; /* [B] token ids of the batch */
    int32_t *positions; /* [B] RoPE positions */
    int32_t *rows;   /* [B] KV / feature rows the batch writes */
    int32_t *move_from, *move_to; /* [max_tree_nodes] compaction of an accepted path */
} forward_scratch;

/* Tree-verify bookkeeping of a context (allocated when max_tree_nodes > 0). */
typedef struct tree_state {
    specla_factor_banks *banks;
    int32_t *schedule;        /* host: packed HLD schedule of the last verified tree */
    int32_t *schedule_on_backend; /* the same, uploaded for the tree kernels */
    int32_t schedule_ints;
    int32_t *hld_scratch;     /* host: the builder's work arrays (hld_build_into) */
    int32_t *positions;       /* host [max_tree_nodes] n_past + depth */
    int32_t *rows;            /* host [max_tree_nodes] n_past + node index: where K/V/feature rows go */
    int32_t n_verified;       /* nodes of the last verified tree, 0 when none awaits accept */
} tree_state;

/* The LM head a recorded step multiplies: its memory, the rows multiplied (a chosen head's capacity:
 * logit_rows_scored_head) and where the count of rows that rank is (NULL: all). */
typedef struct recorded_head_key {
    const void *data;
    int64_t rows;
    const int32_t *n_valid;
} recorded_head_key;
static inline int same_head_key(const recorded_head_key *a, const recorded_head_key *b) {
    return a->data == b->data && a->rows == b->rows && a->n_valid == b->n_valid;
}

/* What a recorded verify or causal batch was recorded for: every pointer and launch parameter of
 * its ops follows from these (the LM head, the node or token count, and for a verify the factor bank
 * it writes, for a batch whether it scores its last row's argmax). */
typedef struct recorded_step_key {
    recorded_head_key head;
    int32_t n_tokens; /* 0: an empty slot */
    int32_t variant;  /* a verify: the factor bank it writes; a batch: 1 when it scores the argmax */
} recorded_step_key;

/* Eager runs of one keyed step kind whose keys a context remembers, to record a key the second time
 * it comes (a recording costs more than an eager run, so a count that comes once is not recorded
 * and does not evict the recordings in use). */
#define STEP_KEYS_SEEN 8

/* The recordings of one keyed step kind (verify, batch): what each of its STEP_SLOTS backend keys
 * was recorded for, taken round robin (next_slot) by a key among the last STEP_KEYS_SEEN eager ones. */
typedef struct recorded_steps {
    recorded_step_key slot[STEP_SLOTS];
    int32_t next_slot;
    recorded_step_key seen[STEP_KEYS_SEEN];
    int32_t next_seen;
} recorded_steps;

/* How many rewrites of committed rows a context remembers the position of (context_unchanged_rows). */
#define CONTEXT_REWRITE_LOG 16

struct specla_context {
    const specla_model *model;
    specla_context_params params;
    backend *be;                /* where everything below lives and runs */
    weight_set weights;
    int32_t n_past;
    /* durable state; see specla.h for layouts */
    float **k_cache, **v_cache; /* [n_attention_layers] -> [n_ctx][nkv][D]; a verified tree's rows
                                   sit at n_past + node index until accept moves them */
    float **conv_state;         /* [n_recurrent_layers] -> [K-1][C] */
    float **gdn_state;          /* [n_recurrent_layers] -> [Hv][S][S] */
    forward_scratch scratch;
    /* captured features for a draft model: [n_ctx][n_capture][E], rows at positions (a verified
     * tree's rows at n_past + node index until accept) */
    int32_t n_capture;
    int32_t *capture_layers;    /* [n_capture] */
    int32_t *capture_slot;      /* [n_layer]: index in capture_layers, -1 = not captured */
    float *features;
    tree_state tree;
    /* specla_context_save_state: the recurrent state at saved_n_past (-1: nothing saved) */
    int32_t saved_n_past;
    float **saved_conv_state, **saved_gdn_state; /* [n_recurrent_layers], allocated by the first save */
    /* the rows logits are scored over: the model's LM head, or a subset a draft's caller chose
     * (specla_context_set_logit_head / _rows); logits rows have logit_head.ne1 entries */
    specla_tensor logit_head;
    logit_row_set logit_rows;
    /* the LM head each depth class's recorded decode step was recorded with (part of the recording:
     * another head means recording again; a chosen head that grows within its capacity is the same
     * head) */
    recorded_head_key recorded_head[DECODE_CLASSES];
    /* what the recorded verifies (keys STEP_VERIFY + slot) and causal batches (STEP_BATCH + slot)
     * were recorded for */
    recorded_steps recorded_verify, recorded_batch;
    /* For readers that keep what they derived from committed rows (a DFlash draft context's K/V):
     * an id unique in the process, and the calls that dropped committed rows (a truncate below
     * n_past, a reset) — how many so far, and the n_past each left, rewrite_floor[r % LOG] for the
     * r-th. Rows below every floor since a reader looked are the bits it saw then. */
    int64_t id;
    int64_t rewrites;
    int32_t rewrite_floor[CONTEXT_REWRITE_LOG];
};

/* Plain batch (positions n_past + i); tokens and positions already uploaded into the scratch. */
specla_status model_forward(specla_context *ctx, const specla_batch *batch);
/* Tree batch: schedule already built into ctx->tree (host and backend copies). */
specla_status model_forward_tree(specla_context *ctx, const specla_tree_batch *tree);

/* The per-layer blocks of the trunk (layer_*.c): x[T][E] (normed) -> out[T][E]. */
typedef struct batch_view {
    int T;
    const int32_t *positions; /* backend memory: RoPE positions */
    const int32_t *rows;      /* backend memory: KV-cache / feature rows the tokens write */
    const int32_t *schedule;  /* backend memory: packed HLD schedule, NULL for a plain batch */
    const int32_t *parents;   /* backend memory: tree parents, NULL for a plain batch */
    int32_t max_rows;         /* most cache rows a query of the batch sees (the attention grid's bound) */
} batch_view;
void gated_deltanet_layer(specla_context *ctx, int il, const float *x, const batch_view *bv, float *out);
void attention_layer(specla_context *ctx, int il, const float *x, const batch_view *bv, float *out);

/* Committed positions whose rows (KV, features) are the same bits now as when ctx->rewrites was
 * `since`: [0, returned value). n_past when nothing was dropped since; 0 when more rewrites happened
 * than the log holds. Reads nothing on the device. */
int32_t context_unchanged_rows(const specla_context *ctx, int64_t since);

/* For the draft model: the captured feature row [n_capture][E] of committed position pos (backend
 * memory), or NULL when features are not captured or pos is not committed. */
const float *context_features(const specla_context *ctx, int32_t pos);

#endif
