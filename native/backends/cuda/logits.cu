/* The CUDA backend's logit ops (backend.h): argmax per row and the top-k as log-softmax values.
 *
 * Ranking. Both ops rank a row's entries by one total order: a higher value first, equal values
 * (+0 == -0 included) by the lower id; NaN never ranks. The best entry, and the k best, under a
 * total order do not depend on the order of comparisons, so the chunked, parallel selections below
 * return exactly the CPU oracle's ids (elementwise.c):
 *   - argmax: the CPU scans `row[i] > row[best]` from best = 0, so a NaN at index 0 is never
 *     replaced and the answer is 0; otherwise it is the best non-NaN entry, lowest index on ties.
 *     The final step applies exactly that rule.
 *   - top-k: the k best non-NaN entries, best first; missing slots id -1, logprob -inf.
 *
 * Thread mapping. A row is cut into chunks of LOGIT_CHUNK entries (fixed, by index); block (c, r)
 * reads chunk c of row r, thread i the entries i, i + LOGIT_THREADS, ... . Stage 1 writes a chunk's
 * best entry (argmax) or its k best plus its max and sum of exp (top-k) to the workspace; stage 2,
 * one block per row, combines the chunks. When the workspace cannot hold the chunk partials the
 * whole row is one chunk and stage 1 writes the answer itself (same ids).
 *
 * Log-softmax numerics. As on the CPU, the max and the sum of exp are in double: chunk c gets
 * m_c = max and s_c = sum of exp((double)x - m_c) over its non-NaN entries (thread sums in index
 * order, then a fixed butterfly and the groups in order); the row's M = max m_c and
 * S = sum over chunks in chunk order of s_c * exp(m_c - M); logprob = (float)((double)x - (M + log S)).
 * This is the CPU's value up to double rounding of the sum (the CPU sums in index order, this sums
 * per chunk), which changes the float result only in rare double-rounding ties. Deterministic. */
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "cuda_backend.h"
#include "launch.h"

#define SPECLA_WARP 32
#define LOGIT_THREADS 256
#define LOGIT_GROUPS (LOGIT_THREADS / SPECLA_WARP)
#define LOGIT_CHUNK 4096 /* entries per stage-1 block: 16 per thread */
#define NO_ID INT_MAX    /* "no entry": ranks after everything */

/* An entry of the ranking: value and id; id NO_ID (value NaN) when empty. */
struct ranked {
    float v;
    int32_t id;
};

static __device__ __forceinline__ ranked make_entry(float v, int32_t id) {
    ranked e;
    if (v != v) e.v = __int_as_float(0x7fc00000), e.id = NO_ID;
    else e.v = v, e.id = id;
    return e;
}

/* Is a ranked before b? Higher value first, then the lower id; an empty entry never is. */
static __device__ __forceinline__ bool ranks_before(ranked a, ranked b) {
    if (a.id == NO_ID) return false;
    if (b.id == NO_ID) return true;
    return a.v > b.v || (a.v == b.v && a.id < b.id);
}

static __device__ __forceinline__ ranked better(ranked a, ranked b) { return ranks_before(b, a) ? b : a; }

/* The best entry of the block (every thread gets it); `shared_entries` holds LOGIT_GROUPS entries. */
static __device__ ranked block_best(ranked e, ranked *shared_entries) {
    for (int m = SPECLA_WARP / 2; m > 0; m >>= 1) {
        ranked o;
        o.v = SPECLA_SHFL_XOR(e.v, m);
        o.id = SPECLA_SHFL_XOR(e.id, m);
        e = better(e, o);
    }
    if (threadIdx.x % SPECLA_WARP == 0) shared_entries[threadIdx.x / SPECLA_WARP] = e;
    __syncthreads();
    ranked best = shared_entries[0];
    for (int g = 1; g < LOGIT_GROUPS; g++) best = better(best, shared_entries[g]);
    __syncthreads(); /* shared_entries is reused by the next call */
    return best;
}

/* How many of a row's V entries rank: *n_valid clamped to [0, V], or V (backend.h). Read after the
 * grid wait: the count may have been uploaded just before the launch. */
static __device__ __forceinline__ int ranked_entries(const int32_t *n_valid, int V) {
    return n_valid ? max(0, min(*n_valid, V)) : V;
}

/* ---- argmax --------------------------------------------------------------------------------------- */

/* The CPU's answer from the best non-NaN entry: 0 when row[0] is NaN (never replaced) or nothing ranks. */
static __device__ __forceinline__ int32_t argmax_answer(const float *row, ranked best) {
    const float first = row[0];
    return first != first || best.id == NO_ID ? 0 : best.id;
}

/* Block (c, r): best entry of chunk c of row r -> partial[r][c], or with one chunk the answer itself.
 * Rows are V apart and rank their first n_valid entries (ranked_entries): a chunk past them yields no
 * entry. */
static __global__ void __launch_bounds__(LOGIT_THREADS)
    argmax_chunks_kernel(const float *logits, int V, const int32_t *n_valid, int chunk, int n_chunks, ranked *partial,
                         int32_t *out) {
    grid_begin();
    __shared__ ranked shared_entries[LOGIT_GROUPS];
    const int c = blockIdx.x, r = blockIdx.y;
    const float *row = logits + (int64_t)r * V;
    const int end = min(ranked_entries(n_valid, V), (c + 1) * chunk);
    ranked e = make_entry(__int_as_float(0x7fc00000), NO_ID);
    if (chunk == LOGIT_CHUNK) { /* the usual case: all of a thread's loads in flight at once */
        float v[LOGIT_CHUNK / LOGIT_THREADS];
#pragma unroll
        for (int j = 0; j < LOGIT_CHUNK / LOGIT_THREADS; j++) {
            const int i = c * chunk + threadIdx.x + j * LOGIT_THREADS;
            v[j] = i < end ? row[i] : __int_as_float(0x7fc00000);
        }
#pragma unroll
        for (int j = 0; j < LOGIT_CHUNK / LOGIT_THREADS; j++)
            e = better(e, make_entry(v[j], c * chunk + threadIdx.x + j * LOGIT_THREADS));
    } else {
        for (int i = c * chunk + threadIdx.x; i < end; i += LOGIT_THREADS) e = better(e, make_entry(row[i], i));
    }
    const ranked best = block_best(e, shared_entries);
    if (threadIdx.x == 0) {
        if (n_chunks == 1) out[r] = argmax_answer(row, best);
        else partial[(int64_t)r * n_chunks + c] = best;
    }
}

/* One 32-lane group per row: the best of the row's chunk partials. */
static __global__ void argmax_combine_kernel(const float *logits, int V, int n_chunks, const ranked *partial,
                                             int32_t *out) {
    grid_begin();
    const int r = blockIdx.x, lane = threadIdx.x;
    ranked e = make_entry(__int_as_float(0x7fc00000), NO_ID);
    for (int c = lane; c < n_chunks; c += SPECLA_WARP) e = better(e, partial[(int64_t)r * n_chunks + c]);
    for (int m = SPECLA_WARP / 2; m > 0; m >>= 1) {
        ranked o;
        o.v = SPECLA_SHFL_XOR(e.v, m);
        o.id = SPECLA_SHFL_XOR(e.id, m);
        e = better(e, o);
    }
    if (lane == 0) out[r] = argmax_answer(logits + (int64_t)r * V, e);
}

extern "C" void cuda_argmax_rows(const backend *be, const float *logits, int n_rows, int V, int32_t *out,
                                 const int32_t *n_valid) {
    if (n_rows <= 0 || V <= 0) return;
    const cuda_backend *cb = cuda_of(be);
    int n_chunks = (V + LOGIT_CHUNK - 1) / LOGIT_CHUNK, chunk = LOGIT_CHUNK;
    const size_t need = sizeof(ranked) * (size_t)n_rows * n_chunks;
    if (!cb->workspace || need > cb->workspace_bytes) n_chunks = 1;
    if (n_chunks == 1) chunk = V;
    ranked *partial = (ranked *)cb->workspace;
    cuda_launch(argmax_chunks_kernel, dim3(n_chunks, n_rows), dim3(LOGIT_THREADS), 0, cuda_stream(be), logits, V,
                n_valid, chunk, n_chunks, partial, out);
    cuda_note_launch(be, "argmax_rows");
    if (n_chunks > 1) {
        cuda_launch(argmax_combine_kernel, dim3(n_rows), dim3(SPECLA_WARP), 0, cuda_stream(be), logits, V, n_chunks,
                    partial, out);
        cuda_note_launch(be, "argmax_rows");
    }
}

/* ---- top-k log-softmax ------------------------------------------------------------------------------ */

/* Entries of a chunk of logits, or of a row's candidate list (stage 2). */
struct logit_source {
    const float *values;
    int first; /* id of values[0] */
    __device__ ranked at(int j) const { return make_entry(values[j], first + j); }
};
struct candidate_source {
    const float *values;
    const int32_t *ids;
    __device__ ranked at(int j) const {
        ranked e;
        e.v = values[j], e.id = ids[j];
        return e;
    }
};

/* The thread's best entry among its own (j = threadIdx.x, + LOGIT_THREADS, ... < n) that rank after `last`. */
template <typename Source>
static __device__ ranked own_best_after(const Source &src, int n, ranked last, bool after_last) {
    ranked e = make_entry(__int_as_float(0x7fc00000), NO_ID);
    for (int j = threadIdx.x; j < n; j += LOGIT_THREADS) {
        const ranked x = src.at(j);
        if (!after_last || ranks_before(last, x)) e = better(e, x);
    }
    return e;
}

/* The k best of n entries, best first, into global (vals, ids) (empty entries: NaN, NO_ID), by k
 * rounds of a block-wide best among the entries ranked after the previous winner. A thread rescans
 * its own entries only when the winner was its own best. Ends in a barrier, so the block then reads
 * what thread 0 wrote. */
template <typename Source>
static __device__ void select_top_k(const Source &src, int n, int k, ranked *shared_entries, float *vals,
                                    int32_t *ids) {
    ranked mine = own_best_after(src, n, make_entry(0.0f, NO_ID), false);
    for (int j = 0; j < k; j++) {
        const ranked win = block_best(mine, shared_entries);
        if (threadIdx.x == 0) vals[j] = win.v, ids[j] = win.id;
        if (win.id == NO_ID) { /* nothing left: every thread sees the same winner, so all leave */
            for (int rest = j + 1 + threadIdx.x; rest < k; rest += LOGIT_THREADS)
                vals[rest] = __int_as_float(0x7fc00000), ids[rest] = NO_ID;
            break;
        }
        if (mine.id == win.id) mine = own_best_after(src, n, win, true);
    }
    __syncthreads();
}

/* Max (ignoring NaN) and sum of exp(x - max) in double of a chunk, every thread gets both. */
static __device__ void chunk_max_sum(const float *values, int n, double *shared_doubles, double *m_out, double *s_out) {
    float m = -INFINITY;
    for (int j = threadIdx.x; j < n; j += LOGIT_THREADS) m = fmaxf(m, values[j]); /* fmaxf drops NaN */
    for (int o = SPECLA_WARP / 2; o > 0; o >>= 1) m = fmaxf(m, SPECLA_SHFL_XOR(m, o));
    if (threadIdx.x % SPECLA_WARP == 0) shared_doubles[threadIdx.x / SPECLA_WARP] = m;
    __syncthreads();
    double max = -INFINITY;
    for (int g = 0; g < LOGIT_GROUPS; g++) max = fmax(max, shared_doubles[g]);
    __syncthreads();
    double s = 0.0;
    for (int j = threadIdx.x; j < n; j += LOGIT_THREADS) {
        const float x = values[j];
        if (x == x) s += exp((double)x - max);
    }
    for (int o = SPECLA_WARP / 2; o > 0; o >>= 1) s += SPECLA_SHFL_XOR(s, o);
    if (threadIdx.x % SPECLA_WARP == 0) shared_doubles[threadIdx.x / SPECLA_WARP] = s;
    __syncthreads();
    double sum = 0.0;
    for (int g = 0; g < LOGIT_GROUPS; g++) sum += shared_doubles[g];
    __syncthreads();
    *m_out = max;
    *s_out = sum;
}

/* Turn a row's k selected entries, held in (logprobs, tokens) as (value, id), into the answer in
 * place: log-softmax values with lse; empty slots -1 / -inf. Each thread rewrites its own slots. */
static __device__ void finish_top_k(int k, double lse, int32_t *tokens, float *logprobs) {
    for (int j = threadIdx.x; j < k; j += LOGIT_THREADS) {
        if (tokens[j] == NO_ID) tokens[j] = -1, logprobs[j] = -INFINITY;
        else logprobs[j] = (float)((double)logprobs[j] - lse);
    }
}

/* Stage-1 workspace layout for n_rows x n_chunks chunk partials of k entries. */
struct topk_partials {
    double *max_sum; /* [rows][chunks][2] */
    float *vals;     /* [rows][chunks][k] */
    int32_t *ids;    /* [rows][chunks][k] */
};
static size_t topk_workspace_bytes(int n_rows, int n_chunks, int k) {
    return (size_t)n_rows * n_chunks * (2 * sizeof(double) + (size_t)k * (sizeof(float) + sizeof(int32_t)));
}
extern "C" size_t cuda_logits_workspace_bytes(const backend_limits *l) {
    if (l->n_vocab <= 0) return 0;
    const int n_chunks = (l->n_vocab + LOGIT_CHUNK - 1) / LOGIT_CHUNK;
    const size_t argmax = sizeof(ranked) * (size_t)l->max_rows * n_chunks;
    const size_t topk = topk_workspace_bytes(l->max_rows < 16 ? l->max_rows : 16, n_chunks, 64);
    return argmax > topk ? argmax : topk;
}
static topk_partials topk_layout(void *ws, int n_rows, int n_chunks, int k) {
    topk_partials p;
    p.max_sum = (double *)ws;
    p.vals = (float *)(p.max_sum + (size_t)n_rows * n_chunks * 2);
    p.ids = (int32_t *)(p.vals + (size_t)n_rows * n_chunks * k);
    return p;
}

/* Block (c, r): chunk c of row r -> its k best, max and sum; with one chunk, the row's answer. Rows
 * are V apart; the entries ranked are the first *n_valid of a row (n_valid NULL: V), read here so a
 * recorded launch follows a count the host changes between replays. A chunk past them is empty: max
 * -inf, sum 0 and no entries, which the combine adds as nothing. */
static __global__ void __launch_bounds__(LOGIT_THREADS)
    topk_chunks_kernel(const float *logits, int V, const int32_t *n_valid, int chunk, int n_chunks, int k,
                       topk_partials part, int32_t *tokens, float *logprobs) {
    grid_begin();
    __shared__ ranked shared_entries[LOGIT_GROUPS];
    __shared__ double shared_doubles[LOGIT_GROUPS];
    const int c = blockIdx.x, r = blockIdx.y;
    const int n_ranked = ranked_entries(n_valid, V);
    const int first = c * chunk, n = max(0, min(n_ranked, first + chunk) - first);
    const float *values = logits + (int64_t)r * V + first;
    double m, s;
    chunk_max_sum(values, n, shared_doubles, &m, &s);
    const logit_source src = {values, first};
    if (n_chunks == 1) {
        select_top_k(src, n, k, shared_entries, logprobs + (int64_t)r * k, tokens + (int64_t)r * k);
        finish_top_k(k, m + log(s), tokens + (int64_t)r * k, logprobs + (int64_t)r * k);
        return;
    }
    const int64_t slot = (int64_t)r * n_chunks + c;
    if (threadIdx.x == 0) part.max_sum[2 * slot] = m, part.max_sum[2 * slot + 1] = s;
    select_top_k(src, n, k, shared_entries, part.vals + slot * k, part.ids + slot * k);
}

/* Block r: the row's k best among its chunks' candidates and its log-sum-exp from the chunk partials. */
static __global__ void __launch_bounds__(LOGIT_THREADS)
    topk_combine_kernel(int n_chunks, int k, topk_partials part, int32_t *tokens, float *logprobs) {
    grid_begin();
    __shared__ ranked shared_entries[LOGIT_GROUPS];
    __shared__ double lse;
    const int r = blockIdx.x;
    const double *ms = part.max_sum + (int64_t)r * n_chunks * 2;
    if (threadIdx.x == 0) {
        double M = -INFINITY;
        for (int c = 0; c < n_chunks; c++) M = fmax(M, ms[2 * c]);
        double S = 0.0;
        for (int c = 0; c < n_chunks; c++) {
            const double mc = ms[2 * c], sc = ms[2 * c + 1];
            /* a chunk without a finite max adds 0 unless the whole row has none (then the CPU's NaN / 0) */
            if (mc == -INFINITY) S += M == -INFINITY ? sc : 0.0;
            else S += sc * exp(mc - M);
        }
        lse = M + log(S);
    }
    const candidate_source src = {part.vals + (int64_t)r * n_chunks * k, part.ids + (int64_t)r * n_chunks * k};
    select_top_k(src, n_chunks * k, k, shared_entries, logprobs + (int64_t)r * k, tokens + (int64_t)r * k);
    finish_top_k(k, lse, tokens + (int64_t)r * k, logprobs + (int64_t)r * k); /* lse: written before the barrier */
}

extern "C" void cuda_topk_log_softmax(const backend *be, const float *logits, int n_rows, int V, int k,
                                      int32_t *tokens, float *logprobs, const int32_t *n_valid) {
    if (n_rows <= 0 || k <= 0) return;
    const cuda_backend *cb = cuda_of(be);
    int n_chunks = (V + LOGIT_CHUNK - 1) / LOGIT_CHUNK, chunk = LOGIT_CHUNK;
    if (!cb->workspace || topk_workspace_bytes(n_rows, n_chunks, k) > cb->workspace_bytes) n_chunks = 1;
    if (n_chunks <= 1) n_chunks = 1, chunk = V;
    const topk_partials part = topk_layout(cb->workspace, n_rows, n_chunks, k);
    cuda_launch(topk_chunks_kernel, dim3(n_chunks, n_rows), dim3(LOGIT_THREADS), 0, cuda_stream(be), logits, V, n_valid,
                chunk, n_chunks, k, part, tokens, logprobs);
    cuda_note_launch(be, "topk_log_softmax");
    if (n_chunks > 1) {
        cuda_launch(topk_combine_kernel, dim3(n_rows), dim3(LOGIT_THREADS), 0, cuda_stream(be), n_chunks, k, part,
                    tokens, logprobs);
        cuda_note_launch(be, "topk_log_softmax");
    }
}
