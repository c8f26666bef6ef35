/* A recurrent-layer workload resident in one backend's memory (specla.h, "Recurrent workload"):
 * the inputs of every recurrent layer uploaded once, durable states, outputs and factor banks in the
 * backend's memory, one call per step's work over all layers. What tools/bench_specla.py times on
 * a GPU, where the single tree ops would copy their host arguments in and out on every call.
 * The work itself is the factor banks' (factor_banks.c), as a context runs it. */
#include <stdlib.h>
#include <string.h>

#include "backend_registry.h"
#include "error.h"
#include "factor_banks.h"
#include "hld_schedule.h"

struct specla_recurrent_workload {
    specla_recurrent_shape shape;
    backend *be;
    specla_factor_banks *banks;
    /* backend memory, [n_layers][max_nodes][...] per node and layer */
    float *q, *k, *v, *g, *beta, *x;
    float *conv_weight;     /* [n_layers][C][K] */
    float *gdn, *conv;      /* durable states [n_layers][Hv][S][S], [n_layers][K-1][C] */
    float *out, *y;         /* outputs of the last verify [n_layers][max_nodes][Hv][S], [...][C] */
    int32_t *schedule;      /* the tree's schedule in backend memory */
    int32_t *host_schedule; /* the same in host memory (counts, path checks) */
    int32_t *hld_scratch;
    int32_t schedule_ints;
    float **gdn_layers, **conv_layers; /* host arrays of per-layer state pointers (accept, finish) */
    int verified;                      /* a verify ran since the tree was set or the last accept */
};

#define FAIL(status, ...) specla_fail(status, __VA_ARGS__)

/* floats per node of one layer's inputs: q, k, v, g, beta, x */
static int64_t widths(const specla_recurrent_shape *s, int i) {
    const int64_t w[6] = {(int64_t)s->Hk * s->S, (int64_t)s->Hk * s->S, (int64_t)s->Hv * s->S, s->Hv, s->Hv, s->C};
    return w[i];
}

SPECLA_API void specla_recurrent_workload_free(specla_recurrent_workload *w) {
    if (!w) return;
    if (w->banks) specla_factor_banks_free(w->banks);
    if (w->be) {
        void *buffers[] = {w->q, w->k, w->v, w->g, w->beta, w->x, w->conv_weight, w->gdn, w->conv, w->out, w->y,
                           w->schedule};
        for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++)
            if (buffers[i]) w->be->ops->free(w->be, buffers[i]);
        w->be->ops->destroy(w->be);
    }
    free(w->host_schedule);
    free(w->hld_scratch);
    free(w->gdn_layers);
    free(w);
}

SPECLA_API specla_status specla_recurrent_workload_create(const specla_op_options *opt,
                                                          const specla_recurrent_shape *shape,
                                                          const specla_recurrent_inputs *in,
                                                          specla_recurrent_workload **out_workload) {
    static const char op[] = "specla_recurrent_workload_create";
    if (!shape || !in || !out_workload) return FAIL(SPECLA_ERR_INVALID_ARGUMENT, "%s: NULL argument", op);
    *out_workload = NULL;
    const float *const inputs[9] = {in->q, in->k, in->v, in->g, in->beta, in->x, in->conv_weight, in->gdn_state,
                                    in->conv_state};
    static const char *const names[9] = {"q", "k", "v", "g", "beta", "x", "conv_weight", "gdn_state", "conv_state"};
    for (int i = 0; i < 9; i++)
        if (!inputs[i]) return FAIL(SPECLA_ERR_INVALID_ARGUMENT, "%s: inputs->%s is NULL", op, names[i]);
    const specla_recurrent_shape *s = shape;
    if (s->n_layers <= 0 || s->max_nodes <= 0 || s->Hk <= 0 || s->Hv <= 0 || s->S <= 0 || s->C <= 0 || s->K < 2)
        return FAIL(SPECLA_ERR_INVALID_ARGUMENT,
                    "%s: n_layers %d, max_nodes %d, Hk %d, Hv %d, S %d, C %d must be positive and K %d >= 2", op,
                    s->n_layers, s->max_nodes, s->Hk, s->Hv, s->S, s->C, s->K);

    specla_recurrent_workload *w = (specla_recurrent_workload *)calloc(1, sizeof *w);
    if (!w) return FAIL(SPECLA_ERR_OUT_OF_MEMORY, "%s: out of memory", op);
    w->shape = *s;
    /* limits of the tree ops (as a context's) plus the sequential kernels the replay baseline runs */
    const backend_limits limits = {s->max_nodes, 0, 0, s->max_nodes, s->S * s->S, (s->K - 1) * s->C, s->Hv, 0, 0, 0};
    specla_status st = backend_open(opt ? opt->backend : SPECLA_BACKEND_CPU, opt ? opt->device : 0,
                                    opt ? opt->n_threads : 0, opt ? opt->cpu_kernels : SPECLA_CPU_AUTO, &limits, &w->be);
    if (st != SPECLA_OK) {
        free(w);
        return st; /* backend_open names the backend */
    }
    if ((st = factor_banks_create(s, w->be, &w->banks)) != SPECLA_OK) {
        w->banks = NULL;
        specla_recurrent_workload_free(w);
        return st;
    }
    const backend *be = w->be;
    const int64_t L = s->n_layers, N = s->max_nodes;
    float **dst[6] = {&w->q, &w->k, &w->v, &w->g, &w->beta, &w->x};
    int ok = 1;
    for (int i = 0; i < 6 && ok; i++) {
        const size_t bytes = sizeof(float) * (size_t)(L * N * widths(s, i));
        ok = (*dst[i] = (float *)be->ops->alloc(be, bytes)) != NULL;
        if (ok) be->ops->upload(be, *dst[i], inputs[i], bytes);
    }
    const size_t weight_bytes = sizeof(float) * (size_t)(L * s->C * s->K);
    const size_t gdn_bytes = sizeof(float) * (size_t)(L * s->Hv) * (size_t)s->S * (size_t)s->S;
    const size_t conv_bytes = sizeof(float) * (size_t)(L * (s->K - 1) * s->C);
    if (ok && (ok = (w->conv_weight = (float *)be->ops->alloc(be, weight_bytes)) != NULL))
        be->ops->upload(be, w->conv_weight, in->conv_weight, weight_bytes);
    if (ok && (ok = (w->gdn = (float *)be->ops->alloc(be, gdn_bytes)) != NULL))
        be->ops->upload(be, w->gdn, in->gdn_state, gdn_bytes);
    if (ok && (ok = (w->conv = (float *)be->ops->alloc(be, conv_bytes)) != NULL))
        be->ops->upload(be, w->conv, in->conv_state, conv_bytes);
    ok = ok && (w->out = (float *)be->ops->alloc(be, sizeof(float) * (size_t)(L * N * s->Hv * s->S))) != NULL;
    ok = ok && (w->y = (float *)be->ops->alloc(be, sizeof(float) * (size_t)(L * N * s->C))) != NULL;
    w->schedule_ints = specla_hld_size(s->max_nodes);
    ok = ok && w->schedule_ints > 0;
    ok = ok && (w->schedule = (int32_t *)be->ops->alloc(be, sizeof(int32_t) * (size_t)w->schedule_ints)) != NULL;
    ok = ok && (w->host_schedule = (int32_t *)calloc((size_t)w->schedule_ints, sizeof(int32_t))) != NULL;
    ok = ok && (w->hld_scratch = (int32_t *)malloc(sizeof(int32_t) * HLD_SCRATCH_INTS_PER_NODE * (size_t)N)) != NULL;
    ok = ok && (w->gdn_layers = (float **)malloc(sizeof(float *) * 2 * (size_t)L)) != NULL;
    if (!ok) {
        specla_recurrent_workload_free(w);
        return FAIL(SPECLA_ERR_OUT_OF_MEMORY, "%s: out of %s memory for %d layers x %d nodes", op,
                    backend_kind_name(opt ? opt->backend : SPECLA_BACKEND_CPU), s->n_layers, s->max_nodes);
    }
    w->conv_layers = w->gdn_layers + L;
    for (int64_t l = 0; l < L; l++) {
        w->gdn_layers[l] = w->gdn + l * s->Hv * s->S * s->S;
        w->conv_layers[l] = w->conv + l * (s->K - 1) * s->C;
    }
    if ((st = be->ops->sync(be)) != SPECLA_OK) {
        specla_recurrent_workload_free(w);
        return st;
    }
    *out_workload = w;
    return SPECLA_OK;
}

SPECLA_API specla_status specla_recurrent_workload_set_tree(specla_recurrent_workload *w, const int32_t *parents,
                                                            int32_t n) {
    static const char op[] = "specla_recurrent_workload_set_tree";
    if (!w || !parents) return FAIL(SPECLA_ERR_INVALID_ARGUMENT, "%s: NULL argument", op);
    if (n < 1 || n > w->shape.max_nodes)
        return FAIL(SPECLA_ERR_INVALID_ARGUMENT, "%s: %d nodes, the workload takes 1 .. %d", op, n, w->shape.max_nodes);
    if (w->verified)
        return FAIL(SPECLA_ERR_STATE, "%s: the last verify awaits accept (or finish) before the tree changes", op);
    specla_status st = hld_build_into(parents, n, w->shape.max_nodes, w->host_schedule, w->schedule_ints, w->hld_scratch);
    if (st != SPECLA_OK) return st; /* the builder names the bad parent */
    w->be->ops->upload(w->be, w->schedule, w->host_schedule, sizeof(int32_t) * (size_t)w->schedule_ints);
    return w->be->ops->sync(w->be);
}

SPECLA_API specla_status specla_recurrent_workload_verify(specla_recurrent_workload *w) {
    static const char op[] = "specla_recurrent_workload_verify";
    if (!w) return FAIL(SPECLA_ERR_INVALID_ARGUMENT, "%s: NULL workload", op);
    if (w->host_schedule[0] != SPECLA_HLD_MAGIC)
        return FAIL(SPECLA_ERR_STATE, "%s: no tree yet (specla_recurrent_workload_set_tree)", op);
    const specla_recurrent_shape *s = &w->shape;
    const int64_t N = s->max_nodes;
    factor_banks_prepare_verify(w->banks); /* the counts of the pending path's folds, per layer */
    for (int64_t l = 0; l < s->n_layers; l++) {
        const specla_conv_tree_args conv = {w->schedule, (int32_t)l, w->x + l * N * s->C,
                                            w->conv_weight + l * s->C * s->K, w->conv_layers[l], w->y + l * N * s->C};
        factor_banks_conv_tree(w->banks, w->be, w->host_schedule, &conv);
        const int64_t hk = l * N * widths(s, 0), hv = l * N * widths(s, 2), gate = l * N * s->Hv;
        const specla_gdn_tree_args gdn = {w->schedule,   (int32_t)l,     w->q + hk,          w->k + hk,
                                          w->v + hv,     w->g + gate,    w->beta + gate,     w->gdn_layers[l],
                                          w->out + hv};
        factor_banks_verify_gdn(w->banks, w->be, w->host_schedule, &gdn);
    }
    w->verified = 1;
    return SPECLA_OK;
}

SPECLA_API specla_status specla_recurrent_workload_accept(specla_recurrent_workload *w, const int32_t *path,
                                                          int32_t n) {
    static const char op[] = "specla_recurrent_workload_accept";
    if (!w || !path) return FAIL(SPECLA_ERR_INVALID_ARGUMENT, "%s: NULL argument", op);
    if (!w->verified) return FAIL(SPECLA_ERR_STATE, "%s: no verify awaits accept", op);
    specla_status st = hld_check_path(w->host_schedule, path, n, op);
    if (st != SPECLA_OK) return st;
    const specla_recurrent_states states = {w->gdn_layers, w->conv_layers};
    if ((st = factor_banks_accept(w->banks, w->be, path, n, &states)) != SPECLA_OK) return st;
    w->verified = 0;
    return SPECLA_OK;
}

SPECLA_API specla_status specla_recurrent_workload_finish(specla_recurrent_workload *w) {
    if (!w) return FAIL(SPECLA_ERR_INVALID_ARGUMENT, "specla_recurrent_workload_finish: NULL workload");
    const specla_recurrent_states states = {w->gdn_layers, w->conv_layers};
    factor_banks_finish(w->banks, w->be, &states);
    w->verified = 0;
    return SPECLA_OK;
}

SPECLA_API specla_status specla_recurrent_workload_sync(specla_recurrent_workload *w) {
    if (!w) return FAIL(SPECLA_ERR_INVALID_ARGUMENT, "specla_recurrent_workload_sync: NULL workload");
    return w->be->ops->sync(w->be);
}

SPECLA_API specla_status specla_recurrent_workload_read(const specla_recurrent_workload *w, int32_t what,
                                                        int32_t layer, float *out) {
    static const char op[] = "specla_recurrent_workload_read";
    if (!w || !out) return FAIL(SPECLA_ERR_INVALID_ARGUMENT, "%s: NULL argument", op);
    const specla_recurrent_shape *s = &w->shape;
    if (layer < 0 || layer >= s->n_layers)
        return FAIL(SPECLA_ERR_INVALID_ARGUMENT, "%s: layer %d outside [0, %d)", op, layer, s->n_layers);
    const int64_t N = s->max_nodes, l = layer;
    const int n = w->host_schedule[0] == SPECLA_HLD_MAGIC ? hld_n_nodes(w->host_schedule) : 0;
    const float *src;
    int64_t floats;
    switch (what) {
    case SPECLA_WORKLOAD_GDN_OUT:
        src = w->out + l * N * s->Hv * s->S, floats = (int64_t)n * s->Hv * s->S;
        break;
    case SPECLA_WORKLOAD_CONV_OUT:
        src = w->y + l * N * s->C, floats = (int64_t)n * s->C;
        break;
    case SPECLA_WORKLOAD_GDN_STATE:
        src = w->gdn_layers[l], floats = (int64_t)s->Hv * s->S * s->S;
        break;
    case SPECLA_WORKLOAD_CONV_STATE:
        src = w->conv_layers[l], floats = (int64_t)(s->K - 1) * s->C;
        break;
    default:
        return FAIL(SPECLA_ERR_INVALID_ARGUMENT, "%s: what = %d is not one of 0 (GDN outputs), 1 (conv outputs), "
                    "2 (GDN state), 3 (conv state)", op, what);
    }
    if (floats == 0) return SPECLA_OK;
    w->be->ops->download(w->be, out, src, sizeof(float) * (size_t)floats);
    return w->be->ops->sync(w->be);
}
