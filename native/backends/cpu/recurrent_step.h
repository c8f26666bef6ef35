/* The per-token arithmetic of the recurrent layers, shared by the sequential kernels
 * (ops_scalar.c) and the tree-verify kernels (specla_tree_cpu.c). Both call exactly these
 * functions, so a node verified in a tree goes through the same float operations in the same
 * order as the token decoded alone: results are bit-identical, not merely close. The library is
 * built with -ffp-contract=off, so no FMA contraction can differ between call sites. */
#ifndef SPECLA_RECURRENT_STEP_H
#define SPECLA_RECURRENT_STEP_H
#include <math.h>

static inline float silu_f32(float x) { return x / (1.0f + expf(-x)); }

/* One token of the gated delta rule for one value head. M is the head's state [S][S] laid out
 * [value j][key i]. Per row j: decay, read (M^T k)_j, delta_j = beta (v_j - read), rank-1 update,
 * read (M^T q)_j. delta_out (may be NULL) receives the S deltas: the factor SpecLA records. */
static inline void gdn_head_step(float *M, int S, const float *q, const float *k, const float *v, float decay,
                                 float beta, float scale, float *out, float *delta_out) {
    for (int j = 0; j < S; j++) {
        float *row = M + (long)j * S;
        float kv = 0.0f;
        for (int i = 0; i < S; i++) {
            row[i] *= decay;
            kv += row[i] * k[i];
        }
        const float delta = beta * (v[j] - kv);
        if (delta_out) delta_out[j] = delta;
        float o = 0.0f;
        for (int i = 0; i < S; i++) {
            row[i] += k[i] * delta;
            o += row[i] * q[i];
        }
        out[j] = o * scale;
    }
}

/* Apply one accepted token's factors (k, delta, decay = exp(g)) to a head's state: the state
 * part of gdn_head_step without the reads. fl(fl(row*decay) + fl(k*delta)) is what the step
 * computes too (it stores row*decay, then adds k*delta), so folding factors reproduces the
 * sequentially decoded state bit for bit. */
static inline void gdn_head_fold(float *M, int S, const float *k, const float *delta, float decay) {
    for (int j = 0; j < S; j++) {
        float *row = M + (long)j * S;
        const float d = delta[j];
        for (int i = 0; i < S; i++) row[i] = row[i] * decay + k[i] * d;
    }
}

/* One conv output: SiLU of the window (K raw inputs of one channel, oldest first) dotted with the
 * channel's weights, summed from the oldest sample. */
/* The kernel set picks one step/fold pair for a whole call, so every token of a sequence and every
 * node of a tree goes through the same arithmetic. */
typedef void (*gdn_step_fn)(float *M, int S, const float *q, const float *k, const float *v, float decay,
                            float beta, float scale, float *out, float *delta_out);
typedef void (*gdn_fold_fn)(float *M, int S, const float *k, const float *delta, float decay);

static inline float conv_window_output(const float *window, const float *w, int K) {
    float acc = 0.0f;
    for (int j = 0; j < K; j++) acc += window[j] * w[j];
    return silu_f32(acc);
}

#endif
