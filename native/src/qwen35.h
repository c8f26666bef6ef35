/* The qwen35 model and its per-sequence context (private to the library). The model is read-only
 * after creation and may be shared by several contexts; a context owns every piece of mutable
 * state of one sequence. */
#ifndef SPECLA_QWEN35_H
#define SPECLA_QWEN35_H
#include "cpu_ops.h"
#include "specla.h"

struct specla_model {
    specla_hparams hp;           /* hp.layer_is_recurrent points at layer_is_recurrent below */
    uint8_t *layer_is_recurrent; /* [n_layer] */
    specla_tensor token_embd, output_norm, output; /* output aliases token_embd when tied */
    specla_layer_weights *layers;                  /* [n_layer] */
    int conv_channels;           /* C = 2*Hk*S + Hv*S */
    int n_attention_layers, n_recurrent_layers;
    int *state_slot;             /* [n_layer]: index among layers of the same kind */
};

/* Scratch activations for up to max_batch tokens, allocated once per context. */
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
    float *logits;   /* [rows][n_logits] only when the caller wants argmax without logits */
    int64_t logits_floats; /* its capacity */
} forward_scratch;

/* Tree-verify bookkeeping of a context (allocated when max_tree_nodes > 0). */
typedef struct tree_state {
    specla_factor_banks *banks;
    int32_t *schedule;        /* packed HLD schedule of the last verified tree */
    int32_t schedule_ints;
    int32_t *positions;       /* [max_tree_nodes] n_past + depth */
    int32_t *rows;            /* [max_tree_nodes] n_past + node index: where K/V/feature rows go */
    int32_t n_verified;       /* nodes of the last verified tree, 0 when none awaits accept */
} tree_state;

struct specla_context {
    const specla_model *model;
    specla_context_params params;
    cpu_exec exec;
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
     * (specla_context_set_logit_head); logits rows have logit_head.ne1 entries */
    specla_tensor logit_head;
};

/* Plain batch (positions n_past + i). */
specla_status qwen35_forward(specla_context *ctx, const specla_batch *batch);
/* Tree batch: schedule already built into ctx->tree.schedule, positions into ctx->tree.positions. */
specla_status qwen35_forward_tree(specla_context *ctx, const specla_tree_batch *tree);

/* For the draft model: the captured feature row [n_capture][E] of committed position pos, or
 * NULL when features are not captured or pos is not committed. */
const float *qwen35_context_features(const specla_context *ctx, int32_t pos);

#endif
