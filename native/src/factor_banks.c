/* Factor banks and the speculative-state lifecycle of the recurrent layers (SpecLA).
 *
 * Two FP32 banks; per verified node and recurrent layer each holds k [Hk][S], delta [Hv][S],
 * g [Hv] and the raw conv input x [C] (the REPLAY baseline also keeps v and beta). The verify
 * running now writes bank `write_bank`; the other bank holds the accepted path of the previous
 * step, in path order, `n_pending` tokens long, waiting to be folded into the durable state.
 *
 * Per layer, flags remember whether this step already folded the pending path (so a repeated
 * verify or a finish never folds twice) and whether the layer was verified (accept needs all).
 * The ops that fold read the count to fold from `fold_counts` in backend memory (what the flags say,
 * uploaded once per verify by factor_banks_prepare_verify), so a verify issues the same ops whatever
 * is pending: a GPU records it once and replays it (forward.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "factor_banks.h"
#include "hld_schedule.h"

struct specla_factor_banks {
    specla_recurrent_shape shape;
    const backend *be;        /* whose memory holds the banks (the context's, or own_backend) */
    backend *own_backend;     /* banks created through the public ABI own a CPU backend */
    float *replay_scratch;    /* REPLAY: the accepted path's inputs gathered in order, and outputs */
    int32_t *path_rows;       /* [max_nodes]: an accepted path in backend memory, read by gather_rows */
    float *bank[2];
    int64_t layer_floats;                    /* floats of one layer's block in one bank */
    int64_t off_k, off_delta, off_g, off_x;  /* offsets inside a layer block */
    int64_t off_v, off_beta;                 /* REPLAY only, else -1 */
    int write_bank;
    int32_t n_pending;
    /* fold counts, backend memory [2 * n_layers + 1]: per layer what this verify's chain op folds,
     * then what its conv fold folds, then the count of a fold outside a verify (finish, accept) */
    int32_t *fold_counts;
    int32_t *fold_counts_host; /* the same, host side, uploaded from here */
    int32_t n_verified;
    uint8_t *gdn_folded, *conv_folded, *gdn_verified, *conv_verified; /* [n_layers] */
    specla_tree_stats stats; /* of the verify running now / last run (counted by the backend) */
    float *checkpoints;  /* DENSE_CHECKPOINTS: [n_layers][max_nodes][Hv][S][S] */
    float *conv_windows; /* DENSE_CHECKPOINTS: [n_layers][max_nodes][K-1][C] */
};

/* a no-op when the producer already wrote the rows in place (factor_banks_layer_inputs): the
 * backends' copy does nothing for dst == src */
static void copy_rows(const backend *be, float *dst, const float *src, int64_t n) {
    be->ops->copy(be, dst, src, sizeof(float) * (size_t)n);
}

static float *layer_block(const specla_factor_banks *b, int bank, int layer) {
    return b->bank[bank] + (int64_t)layer * b->layer_floats;
}

SPECLA_API void specla_factor_banks_free(specla_factor_banks *b) {
    if (!b) return;
    const backend *be = b->be;
    void *buffers[] = {b->bank[0], b->bank[1], b->checkpoints, b->conv_windows, b->replay_scratch, b->path_rows,
                       b->fold_counts};
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++)
        if (buffers[i]) be->ops->free(be, buffers[i]);
    free(b->gdn_folded);
    free(b->fold_counts_host);
    if (b->own_backend) b->own_backend->ops->destroy(b->own_backend);
    free(b);
}

/* Floats per accepted token of the REPLAY scratch: k [Hk*S], v [Hv*S], g [Hv], beta [Hv], the
 * conv input x [C] and the discarded outputs [Hv*S]. */
static int64_t replay_row_floats(const specla_recurrent_shape *s) {
    return (int64_t)s->Hk * s->S + 2 * (int64_t)s->Hv * s->S + 2 * (int64_t)s->Hv + s->C;
}

/* Limits a CPU backend needs to run the tree ops of these banks (public ABI calls). */
static backend_limits tree_limits(const specla_recurrent_shape *s) {
    const backend_limits limits = {s->max_nodes, 0, 0, s->max_nodes, s->S * s->S, (s->K - 1) * s->C, s->Hv, 0, 0, 0};
    return limits;
}

SPECLA_API specla_status specla_factor_banks_create(const specla_recurrent_shape *shape,
                                                    specla_factor_banks **out_banks) {
    if (!shape || !out_banks) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_factor_banks_create: NULL argument");
    *out_banks = NULL;
    backend *own = NULL;
    const backend_limits limits = tree_limits(shape);
    specla_status st = backend_open(SPECLA_BACKEND_CPU, 0, 1, SPECLA_CPU_SCALAR, &limits, &own);
    if (st != SPECLA_OK) return st;
    st = factor_banks_create(shape, own, out_banks);
    if (st != SPECLA_OK) {
        own->ops->destroy(own);
        return st;
    }
    (*out_banks)->own_backend = own;
    return SPECLA_OK;
}

specla_status factor_banks_create(const specla_recurrent_shape *shape, const backend *be,
                                  specla_factor_banks **out_banks) {
    *out_banks = NULL;
    const specla_recurrent_shape *s = shape;
    if (s->n_layers <= 0 || s->Hk <= 0 || s->Hv <= 0 || s->S <= 0 || s->C <= 0 || s->K < 2 || s->K > 64 ||
        s->max_nodes <= 0)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                           "factor banks: n_layers %d, Hk %d, Hv %d, S %d, C %d, max_nodes %d must be positive and "
                           "K %d in [2, 64]",
                           s->n_layers, s->Hk, s->Hv, s->S, s->C, s->max_nodes, s->K);
    if (s->Hv % s->Hk != 0)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "factor banks: Hv %d is not a multiple of Hk %d", s->Hv, s->Hk);
    if (s->verify_method < SPECLA_VERIFY_HLD_CHAINS || s->verify_method > SPECLA_VERIFY_DENSE_CHECKPOINTS)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "factor banks: unknown verify_method %d", s->verify_method);
    if (s->commit_method < SPECLA_COMMIT_DEFERRED_FACTORS || s->commit_method > SPECLA_COMMIT_CHECKPOINT_RESTORE)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "factor banks: unknown commit_method %d", s->commit_method);
    if (s->commit_method == SPECLA_COMMIT_CHECKPOINT_RESTORE && s->verify_method != SPECLA_VERIFY_DENSE_CHECKPOINTS)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                           "factor banks: commit_method CHECKPOINT_RESTORE needs verify_method DENSE_CHECKPOINTS");

    specla_factor_banks *b = (specla_factor_banks *)calloc(1, sizeof *b);
    if (!b) return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "factor banks: out of memory");
    b->shape = *s;
    b->be = be;
    const int64_t N = s->max_nodes;
    int64_t off = 0;
    b->off_k = off, off += N * s->Hk * s->S;
    b->off_delta = off, off += N * s->Hv * s->S;
    b->off_g = off, off += N * s->Hv;
    b->off_x = off, off += N * s->C;
    b->off_v = b->off_beta = -1;
    if (s->commit_method == SPECLA_COMMIT_REPLAY) {
        b->off_v = off, off += N * s->Hv * s->S;
        b->off_beta = off, off += N * s->Hv;
    }
    b->layer_floats = off;
    int ok = 1;
    for (int i = 0; i < 2 && ok; i++) {
        b->bank[i] = (float *)be->ops->alloc(be, sizeof(float) * (size_t)(off * s->n_layers));
        ok = b->bank[i] != NULL;
    }
    b->path_rows = ok ? (int32_t *)be->ops->alloc(be, sizeof(int32_t) * (size_t)N) : NULL;
    ok = ok && b->path_rows;
    const size_t count_bytes = sizeof(int32_t) * (size_t)(2 * s->n_layers + 1);
    b->fold_counts = ok ? (int32_t *)be->ops->alloc(be, count_bytes) : NULL;
    b->fold_counts_host = (int32_t *)calloc(1, count_bytes);
    ok = ok && b->fold_counts && b->fold_counts_host;
    b->gdn_folded = (uint8_t *)calloc((size_t)s->n_layers * 4, 1);
    ok = ok && b->gdn_folded;
    if (ok) {
        b->conv_folded = b->gdn_folded + s->n_layers;
        b->gdn_verified = b->gdn_folded + 2 * s->n_layers;
        b->conv_verified = b->gdn_folded + 3 * s->n_layers;
    }
    if (ok && s->verify_method == SPECLA_VERIFY_DENSE_CHECKPOINTS) {
        b->checkpoints = (float *)be->ops->alloc(be, sizeof(float) * (size_t)(s->n_layers * N * s->Hv) * (size_t)s->S *
                                                          (size_t)s->S);
        b->conv_windows = (float *)be->ops->alloc(be, sizeof(float) * (size_t)(s->n_layers * N * (s->K - 1)) * (size_t)s->C);
        ok = b->checkpoints && b->conv_windows;
    }
    if (ok && s->commit_method == SPECLA_COMMIT_REPLAY) {
        b->replay_scratch = (float *)be->ops->alloc(be, sizeof(float) * (size_t)(N * replay_row_floats(s)));
        ok = b->replay_scratch != NULL;
    }
    if (!ok) {
        specla_factor_banks_free(b);
        return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "factor banks: out of memory for %d layers x %d nodes",
                           s->n_layers, s->max_nodes);
    }
    *out_banks = b;
    return SPECLA_OK;
}

SPECLA_API int32_t specla_factor_banks_pending(const specla_factor_banks *b) { return b ? b->n_pending : -1; }

SPECLA_API specla_status specla_factor_banks_read(const specla_factor_banks *b, int32_t bank, int32_t layer,
                                                  int32_t field, int32_t n, float *out) {
    static const char op[] = "specla_factor_banks_read";
    if (!b || !out) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: NULL argument", op);
    const specla_recurrent_shape *s = &b->shape;
    if (bank < 0 || bank > 1 || field < 0 || field > 3 || layer < 0 || layer >= s->n_layers || n < 0 ||
        n > s->max_nodes)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: bank %d, layer %d, field %d, n %d out of range", op, bank,
                           layer, field, n);
    const int64_t offsets[4] = {b->off_k, b->off_delta, b->off_g, b->off_x};
    const int64_t widths[4] = {(int64_t)s->Hk * s->S, (int64_t)s->Hv * s->S, s->Hv, s->C};
    const float *block = layer_block(b, bank == 0 ? b->write_bank ^ 1 : b->write_bank, layer);
    b->be->ops->download(b->be, out, block + offsets[field], sizeof(float) * (size_t)(widths[field] * n));
    return SPECLA_OK;
}

SPECLA_API int64_t specla_factor_banks_bytes(const specla_factor_banks *b) {
    if (!b) return -1;
    const specla_recurrent_shape *s = &b->shape;
    int64_t bytes = 2 * b->layer_floats * s->n_layers * (int64_t)sizeof(float);
    if (b->checkpoints)
        bytes += (int64_t)sizeof(float) * s->n_layers * s->max_nodes *
                 ((int64_t)s->Hv * s->S * s->S + (int64_t)(s->K - 1) * s->C);
    return bytes;
}

/* A public tree op runs on a CPU backend of the caller's options (threads, kernel set), created for
 * the call: the banks' memory is host memory, which every CPU backend reads. */
static specla_status call_backend(const specla_factor_banks *b, const specla_op_options *opt, backend **out) {
    if (opt && opt->backend != SPECLA_BACKEND_AUTO && opt->backend != SPECLA_BACKEND_CPU)
        return specla_fail(SPECLA_ERR_UNSUPPORTED, "factor banks: the public tree ops run on the CPU backend only");
    const backend_limits limits = tree_limits(&b->shape);
    return backend_open(SPECLA_BACKEND_CPU, 0, opt ? opt->n_threads : 0, opt ? opt->cpu_kernels : SPECLA_CPU_AUTO, &limits,
                        out);
}

/* What every per-layer tree op checks of arguments handed in through the ABI: the schedule in
 * full (hld_check), the layer index, the options. */
static specla_status check_layer_op(const specla_factor_banks *b, const specla_op_options *opt,
                                    const int32_t *schedule, int32_t layer, const char *op, backend **be) {
    specla_status st = hld_check(schedule, b->shape.max_nodes, op);
    if (st != SPECLA_OK) return st;
    if (layer < 0 || layer >= b->shape.n_layers)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: layer %d outside [0, %d)", op, layer, b->shape.n_layers);
    return call_backend(b, opt, be);
}

SPECLA_API specla_status specla_op_gdn_tree_verify(const specla_op_options *opt, specla_factor_banks *b,
                                                   const specla_gdn_tree_args *a) {
    static const char op[] = "specla_op_gdn_tree_verify";
    if (!b || !a || !a->q || !a->k || !a->v || !a->g || !a->beta || !a->state || !a->out)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: NULL argument", op);
    backend *be;
    const specla_status st = check_layer_op(b, opt, a->schedule, a->layer, op, &be);
    if (st != SPECLA_OK) return st;
    factor_banks_prepare_verify(b);
    factor_banks_verify_gdn(b, be, a->schedule, a);
    be->ops->destroy(be);
    return SPECLA_OK;
}

/* Whether layer l's GDN state has the pending path still to fold in this step. The chain op folds it
 * itself (its count in fold_counts); the baselines fold it in a pass of their own. */
static int gdn_fold_due(const specla_factor_banks *b, int l) { return b->n_pending > 0 && !b->gdn_folded[l]; }

void factor_banks_prepare_verify(specla_factor_banks *b) {
    const int L = b->shape.n_layers;
    const int chains = b->shape.verify_method == SPECLA_VERIFY_HLD_CHAINS;
    for (int l = 0; l < L; l++) {
        b->fold_counts_host[l] = chains && gdn_fold_due(b, l) ? b->n_pending : 0;
        b->fold_counts_host[L + l] = b->n_pending > 0 && !b->conv_folded[l] ? b->n_pending : 0;
    }
    b->be->ops->upload(b->be, b->fold_counts, b->fold_counts_host, sizeof(int32_t) * (size_t)(2 * L));
}

int factor_banks_verify_recordable(const specla_factor_banks *b) {
    /* a baseline verify folds a pending path in a pass the host decides on; only deferred commit
     * leaves a path pending */
    return b->shape.verify_method == SPECLA_VERIFY_HLD_CHAINS || b->shape.commit_method != SPECLA_COMMIT_DEFERRED_FACTORS;
}

int factor_banks_write_bank(const specla_factor_banks *b) { return b->write_bank; }

void factor_banks_layer_inputs(const specla_factor_banks *b, int layer, float **x, float **k, float **g) {
    float *bank = layer_block(b, b->write_bank, layer);
    *x = bank + b->off_x, *k = bank + b->off_k, *g = bank + b->off_g;
}

/* The host side of a layer's GDN verify: a verify starts when no layer is verified yet, or when
 * this layer already was (the tree is verified again before any accept): its statistics and
 * "verified" marks start afresh. counts: the backend's tree counters for this layer (-1: none). */
static void mark_gdn_verified(specla_factor_banks *b, int l, int N, const int64_t counts[2]) {
    const specla_recurrent_shape *s = &b->shape;
    if (b->n_pending > 0) b->gdn_folded[l] = 1;
    int new_verify = b->gdn_verified[l];
    if (!new_verify) {
        new_verify = 1;
        for (int i = 0; i < s->n_layers; i++) new_verify &= !b->gdn_verified[i];
    }
    if (new_verify) {
        memset(b->gdn_verified, 0, (size_t)s->n_layers);
        b->stats = (specla_tree_stats){N, 0, 0, 0};
    }
    b->stats.n_layers++;
    b->stats.node_steps = counts[0] < 0 || b->stats.node_steps < 0 ? -1 : b->stats.node_steps + counts[0];
    b->stats.state_copies = counts[1] < 0 || b->stats.state_copies < 0 ? -1 : b->stats.state_copies + counts[1];
    b->gdn_verified[l] = 1;
    b->n_verified = N;
}

static void mark_conv_verified(specla_factor_banks *b, int l, int N) {
    if (b->n_pending > 0) b->conv_folded[l] = 1;
    b->conv_verified[l] = 1;
    b->n_verified = N;
}

void factor_banks_verify_gdn(specla_factor_banks *b, const backend *be, const int32_t *host_schedule,
                             const specla_gdn_tree_args *a) {
    const backend_ops *ops = be->ops;
    const specla_recurrent_shape *s = &b->shape;
    const int N = hld_n_nodes(host_schedule), l = a->layer;

    /* deferred commit: the previous step's accepted path enters the durable state here, once; the
     * chain kernel fuses it into its per-head loop, reading how many tokens to fold (0: none) from
     * fold_counts; the baselines fold in a separate pass */
    const float *pending_bank = layer_block(b, b->write_bank ^ 1, l);
    const gdn_pending pending = {pending_bank + b->off_k, pending_bank + b->off_delta, pending_bank + b->off_g,
                                 b->fold_counts + l};
    if (gdn_fold_due(b, l) && s->verify_method != SPECLA_VERIFY_HLD_CHAINS)
        ops->gdn_fold(be, a->state, pending.k, pending.delta, pending.g, b->n_pending, s->Hk, s->Hv, s->S);
    float *bank = layer_block(b, b->write_bank, l);
    float *delta = bank + b->off_delta;
    switch (s->verify_method) {
    case SPECLA_VERIFY_HLD_CHAINS:
        ops->gdn_tree_chains(be, a->schedule, a->q, a->k, a->v, a->g, a->beta, s->Hk, s->Hv, s->S, a->state, &pending,
                            a->out, delta);
        break;
    case SPECLA_VERIFY_ROOT_TO_LEAF:
        ops->gdn_tree_root_to_leaf(be, a->schedule, a->q, a->k, a->v, a->g, a->beta, s->Hk, s->Hv, s->S, a->state,
                                  a->out, delta);
        break;
    default: {
        const int64_t per_layer = (int64_t)s->max_nodes * s->Hv * s->S * s->S;
        ops->gdn_tree_checkpoints(be, a->schedule, a->q, a->k, a->v, a->g, a->beta, s->Hk, s->Hv, s->S, a->state,
                                 a->out, delta, b->checkpoints + l * per_layer);
    }
    }
    /* k and g are inputs, recorded as they are (they are half of every node's factors) */
    copy_rows(be, bank + b->off_k, a->k, (int64_t)N * s->Hk * s->S);
    copy_rows(be, bank + b->off_g, a->g, (int64_t)N * s->Hv);
    if (b->off_v >= 0) {
        copy_rows(be, bank + b->off_v, a->v, (int64_t)N * s->Hv * s->S);
        copy_rows(be, bank + b->off_beta, a->beta, (int64_t)N * s->Hv);
    }
    int64_t counts[2];
    ops->tree_counters(be, counts);
    mark_gdn_verified(b, l, N, counts);
}

SPECLA_API specla_status specla_factor_banks_stats(const specla_factor_banks *b, specla_tree_stats *out) {
    if (!b || !out) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_factor_banks_stats: NULL argument");
    *out = b->stats;
    return SPECLA_OK;
}

SPECLA_API specla_status specla_op_conv_tree(const specla_op_options *opt, specla_factor_banks *b,
                                             const specla_conv_tree_args *a) {
    static const char op[] = "specla_op_conv_tree";
    if (!b || !a || !a->x || !a->weight || !a->conv_state || !a->y)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: NULL argument", op);
    backend *be;
    const specla_status st = check_layer_op(b, opt, a->schedule, a->layer, op, &be);
    if (st != SPECLA_OK) return st;
    factor_banks_prepare_verify(b);
    factor_banks_conv_tree(b, be, a->schedule, a);
    be->ops->destroy(be);
    return SPECLA_OK;
}

void factor_banks_conv_tree(specla_factor_banks *b, const backend *be, const int32_t *host_schedule,
                            const specla_conv_tree_args *a) {
    const specla_recurrent_shape *s = &b->shape;
    const int N = hld_n_nodes(host_schedule), l = a->layer;

    /* the pending path's raw inputs enter the window first (fold_counts says how many: 0 once folded) */
    be->ops->conv_fold(be, a->conv_state, layer_block(b, b->write_bank ^ 1, l) + b->off_x,
                       b->fold_counts + s->n_layers + l, s->C, s->K);
    float *windows = b->conv_windows ? b->conv_windows + (int64_t)l * s->max_nodes * (s->K - 1) * s->C : NULL;
    be->ops->conv_tree(be, a->schedule, a->x, a->weight, s->C, s->K, a->conv_state, a->y, windows);
    copy_rows(be, layer_block(b, b->write_bank, l) + b->off_x, a->x, (int64_t)N * s->C);
    mark_conv_verified(b, l, N);
}

void factor_banks_note_replayed_verify(specla_factor_banks *b, int n_nodes) {
    const int64_t not_counted[2] = {-1, -1};
    for (int l = 0; l < b->shape.n_layers; l++) {
        mark_conv_verified(b, l, n_nodes);
        mark_gdn_verified(b, l, n_nodes, not_counted);
    }
}

/* The count of a fold outside a verify (finish, accept), in backend memory for conv_fold. */
static const int32_t *outside_fold_count(specla_factor_banks *b, int32_t n) {
    const int L = b->shape.n_layers;
    b->fold_counts_host[2 * L] = n;
    b->be->ops->upload(b->be, b->fold_counts + 2 * L, b->fold_counts_host + 2 * L, sizeof(int32_t));
    return b->fold_counts + 2 * L;
}

static int is_prefix_path(const int32_t *path, int32_t n) {
    for (int i = 0; i < n; i++)
        if (path[i] != i) return 0;
    return 1;
}

/* Fold the pending path of layer l into its durable states (the parts not folded yet); count is
 * n_pending in backend memory (outside_fold_count). */
static void fold_layer(const backend *be, specla_factor_banks *b, int l, const specla_recurrent_states *states,
                       const int32_t *count) {
    const specla_recurrent_shape *s = &b->shape;
    const float *pending = layer_block(b, b->write_bank ^ 1, l);
    if (!b->gdn_folded[l])
        be->ops->gdn_fold(be, states->gdn[l], pending + b->off_k, pending + b->off_delta, pending + b->off_g, b->n_pending,
                     s->Hk, s->Hv, s->S);
    if (!b->conv_folded[l]) be->ops->conv_fold(be, states->conv[l], pending + b->off_x, count, s->C, s->K);
}

static void reset_step_flags(specla_factor_banks *b) { memset(b->gdn_folded, 0, (size_t)b->shape.n_layers * 4); }

static specla_status check_states(const specla_factor_banks *b, const specla_recurrent_states *states, const char *op) {
    if (!states || !states->gdn || !states->conv)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: the durable states are needed here", op);
    for (int l = 0; l < b->shape.n_layers; l++)
        if (!states->gdn[l] || !states->conv[l])
            return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: state pointer of layer %d is NULL", op, l);
    return SPECLA_OK;
}

SPECLA_API specla_status specla_factor_banks_accept(const specla_op_options *opt, specla_factor_banks *b,
                                                    const int32_t *schedule, const int32_t *path, int32_t n,
                                                    const specla_recurrent_states *states) {
    static const char op[] = "specla_factor_banks_accept";
    if (!b || !path) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: NULL argument", op);
    specla_status st = hld_check(schedule, b->shape.max_nodes, op);
    if (st != SPECLA_OK) return st;
    if (hld_n_nodes(schedule) != b->n_verified)
        return specla_fail(SPECLA_ERR_STATE, "%s: schedule has %d nodes, the last verify had %d", op,
                           hld_n_nodes(schedule), b->n_verified);
    if ((st = hld_check_path(schedule, path, n, op)) != SPECLA_OK) return st;
    backend *be;
    if ((st = call_backend(b, opt, &be)) != SPECLA_OK) return st;
    st = factor_banks_accept(b, be, path, n, states);
    be->ops->destroy(be);
    return st;
}

specla_status factor_banks_accept(specla_factor_banks *b, const backend *be, const int32_t *path, int32_t n,
                                  const specla_recurrent_states *states) {
    static const char op[] = "specla_factor_banks_accept";
    const specla_recurrent_shape *s = &b->shape;
    specla_status st;
    for (int l = 0; l < s->n_layers; l++)
        if (!b->gdn_verified[l] || !b->conv_verified[l])
            return specla_fail(SPECLA_ERR_STATE, "%s: layer %d was not verified (GDN and conv) in this step", op, l);
    if (s->commit_method != SPECLA_COMMIT_DEFERRED_FACTORS && (st = check_states(b, states, op)) != SPECLA_OK) return st;

    switch (s->commit_method) {
    case SPECLA_COMMIT_DEFERRED_FACTORS:
    case SPECLA_COMMIT_FACTORS_NOW:
        if (is_prefix_path(path, n)) {
            b->write_bank ^= 1; /* the bank just written is in path order already: swap roles, no copy */
        } else {
            /* gather the path's factors into the other bank (its old pending path is folded): one
             * call for every layer and field; the destination rows 0..n-1 of each field are disjoint
             * from one another and lie in the other bank, apart from every source row */
            const row_field fields[4] = {
                {b->off_k, b->off_k, s->Hk * s->S},
                {b->off_delta, b->off_delta, s->Hv * s->S},
                {b->off_g, b->off_g, s->Hv},
                {b->off_x, b->off_x, s->C},
            };
            be->ops->upload(be, b->path_rows, path, sizeof(int32_t) * (size_t)n);
            be->ops->gather_rows(be, b->bank[b->write_bank ^ 1], b->layer_floats, b->bank[b->write_bank],
                                 b->layer_floats, s->n_layers, fields, 4, b->path_rows, n);
        }
        b->n_pending = n;
        reset_step_flags(b);
        if (s->commit_method == SPECLA_COMMIT_FACTORS_NOW) {
            const int32_t *count = outside_fold_count(b, n);
            for (int l = 0; l < s->n_layers; l++) fold_layer(be, b, l, states, count);
            b->n_pending = 0;
        }
        break;
    case SPECLA_COMMIT_REPLAY: {
        /* the durable state was never written during verify: it is the snapshot; decode the
         * accepted tokens again from their recorded inputs, in path order, in one call of the
         * sequential kernels per layer. A path 0..n-1 reads them where the bank holds them (its
         * first n rows are the path in order); any other path is gathered first. */
        const int64_t hks = (int64_t)s->Hk * s->S, hvs = (int64_t)s->Hv * s->S;
        float *k = b->replay_scratch, *v = k + n * hks, *g = v + n * hvs, *beta = g + (int64_t)n * s->Hv;
        float *x = beta + (int64_t)n * s->Hv, *out = x + (int64_t)n * s->C;
        const int in_place = is_prefix_path(path, n);
        /* a gather of one layer: its scratch rows k | v | g | beta | x, each in path order */
        const row_field fields[5] = {
            {k - b->replay_scratch, b->off_k, s->Hk * s->S},
            {v - b->replay_scratch, b->off_v, s->Hv * s->S},
            {g - b->replay_scratch, b->off_g, s->Hv},
            {beta - b->replay_scratch, b->off_beta, s->Hv},
            {x - b->replay_scratch, b->off_x, s->C},
        };
        if (!in_place) be->ops->upload(be, b->path_rows, path, sizeof(int32_t) * (size_t)n);
        const int32_t *count = outside_fold_count(b, n);
        for (int l = 0; l < s->n_layers; l++) {
            const float *bank = layer_block(b, b->write_bank, l);
            if (in_place) {
                be->ops->gated_delta_rule(be, bank + b->off_k, bank + b->off_k, bank + b->off_v, bank + b->off_g,
                                          bank + b->off_beta, n, s->Hk, s->Hv, s->S, states->gdn[l], out);
                be->ops->conv_fold(be, states->conv[l], bank + b->off_x, count, s->C, s->K);
                continue;
            }
            be->ops->gather_rows(be, b->replay_scratch, 0, bank, 0, 1, fields, 5, b->path_rows, n);
            /* outputs are discarded: q only feeds the output read, so k stands in for it */
            be->ops->gated_delta_rule(be, k, k, v, g, beta, n, s->Hk, s->Hv, s->S, states->gdn[l], out);
            be->ops->conv_fold(be, states->conv[l], x, count, s->C, s->K);
        }
        reset_step_flags(b);
        break;
    }
    default: { /* CHECKPOINT_RESTORE */
        const int leaf = path[n - 1];
        const int64_t gdn_node = (int64_t)s->Hv * s->S * s->S, conv_node = (int64_t)(s->K - 1) * s->C;
        for (int l = 0; l < s->n_layers; l++) {
            copy_rows(be, states->gdn[l], b->checkpoints + ((int64_t)l * s->max_nodes + leaf) * gdn_node, gdn_node);
            copy_rows(be, states->conv[l], b->conv_windows + ((int64_t)l * s->max_nodes + leaf) * conv_node, conv_node);
        }
        reset_step_flags(b);
    }
    }
    b->n_verified = 0;
    return SPECLA_OK;
}

SPECLA_API specla_status specla_finish_speculative_state(const specla_op_options *opt, specla_factor_banks *b,
                                                         const specla_recurrent_states *states) {
    static const char op[] = "specla_finish_speculative_state";
    if (!b) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: NULL banks", op);
    if (b->n_pending > 0) {
        specla_status st = check_states(b, states, op);
        if (st != SPECLA_OK) return st;
        backend *be;
        if ((st = call_backend(b, opt, &be)) != SPECLA_OK) return st;
        factor_banks_finish(b, be, states);
        be->ops->destroy(be);
    }
    factor_banks_finish(b, b->be, states); /* nothing pending now: only drops an unaccepted verify */
    return SPECLA_OK;
}

void factor_banks_finish(specla_factor_banks *b, const backend *be, const specla_recurrent_states *states) {
    if (b->n_pending > 0) {
        const int32_t *count = outside_fold_count(b, b->n_pending);
        for (int l = 0; l < b->shape.n_layers; l++) fold_layer(be, b, l, states, count);
        b->n_pending = 0;
    }
    /* an unaccepted verify (a cancelled step) is dropped: its factors are never used */
    reset_step_flags(b);
    b->n_verified = 0;
}

void factor_banks_discard(specla_factor_banks *b) {
    if (!b) return;
    b->n_pending = 0;
    b->n_verified = 0;
    reset_step_flags(b);
}
