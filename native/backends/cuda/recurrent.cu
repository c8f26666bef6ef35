/* The recurrent ops of the CUDA (and HIP) backend: the causal conv, the gated delta rule, and the
 * SpecLA tree verify (state-resident HLD chains, the two baselines it is measured against, the
 * factor folds and the tree conv). Semantics are those of backend.h; the CPU oracle is
 * backends/cpu/ops_scalar.c, specla_tree_cpu.c and recurrent_step.h.
 *
 * Exactness. Every kernel that moves a Gated DeltaNet state goes through the one step function
 * gdn_step (or, for accepted factors, gdn_fold), with the same thread mapping and the same
 * reduction tree whatever the kernel, T or tree shape; gdn_step_deferred (the default;
 * SPECLA_CUDA_GDN_DEFER=0 selects gdn_step) is gdn_step's operations in another issue order, each
 * value computed as gdn_step computes it. A node verified in a tree therefore gets the bits of
 * decoding its root path with cuda_gated_delta_rule, and folding an accepted path's factors gives
 * the bits of the sequentially decoded state. Every float operation of the state arithmetic is an
 * explicit round-to-nearest intrinsic, so the compiler can neither contract nor split any of them:
 * the decay is __fmul_rn(row, decay), the rank-1 update is the fused __fmaf_rn(k, delta, decayed
 * row) in both gdn_step and gdn_fold (the state update is fl(row * decay) then fl(k * delta + that)
 * on both paths), and the dot products accumulate with __fmaf_rn (they exist only in gdn_step). The
 * fused update rounds once where the CPU oracle rounds twice: GPU and CPU agree to float rounding,
 * GPU paths agree bit for bit. decay = expf(g) (the accurate expf, no fast math), taken once per
 * token when the token's inputs are put in shared memory (gdn_chunk_put) and read there by gdn_step
 * / gdn_fold; SiLU divides with __fdiv_rn. scale = 1 / sqrtf(S) is computed once on the host
 * (gdn_scale) for every kernel.
 *
 * GDN thread mapping (every state kernel): a block of 128 threads owns one value head h
 * (blockIdx.y, plus a head offset) and GDN_ROWS_PER_BLOCK = 8 R consecutive value rows j of it
 * (blockIdx.x), R = GDN_ROWS_PER_THREAD rows per thread: 2 by default, so S = 128 gives 8 blocks
 * per head, 384 blocks for the 27B's 48 heads (3 per SM of 132), each thread doing two rows' work
 * per token: two independent dot products and butterflies interleave in one thread, where one row
 * left each step's latency chain alone (0.18-0.35 ms off a 23-node verify on the 27B shape,
 * docs/perf.md, twenty-fourth pass); a build with -DGDN_ROWS_PER_THREAD=1 takes 8-row blocks, twice
 * as many. The block's 8 groups of 16 lanes (half warps) take R rows each: thread t has
 * group = t / 16, lane = t % 16, and rows j = 8 R blockIdx.x + 8 r + group (r = 0 .. R - 1). Within
 * a row the lane holds KPL = ceil(S / 16) <= 8 keys in registers, its m-th (m = 0 .. KPL - 1) being
 * i = 64 (m / 4) + 4 lane + m % 4 when KPL is a multiple of 4 (S = 64, 128: float4 runs, 16 lanes
 * covering 256 contiguous bytes) and i = 16 m + lane otherwise, so a thread keeps R * KPL state
 * floats (8 R at S = 128) for the whole call. Keys i >= S (S not a multiple of 16) and rows j >= S
 * (S not a multiple of 8 R) hold zeros and are never stored. Reduction order of a row's dot product
 * (M^T k and M^T q): each lane accumulates its KPL products in increasing m with fmaf, starting
 * from 0; then a butterfly over the 16 lanes, xor 8, 4, 2, 1, each stage adding the partner's
 * partial (IEEE addition is commutative, so all 16 lanes end with the same bits). Per token, in
 * gdn_step: decay the row, kv = row . k, delta = beta * (v_j - kv), row += k * delta, o = row . q,
 * out = o * scale. A row's arithmetic depends only on its lanes' keys, never on which thread or
 * block holds the row, so every R gives the same bits.
 * Token inputs (k, q, v or delta, g, beta) are staged in shared memory GDN_CHUNK tokens at a time
 * by the whole block (gdn_walk_tokens), double buffered, so the serial walk over tokens waits on
 * one memory latency per chunk rather than per token; the chunk's results (outputs, deltas) leave
 * the same way, staged in shared memory and stored by the whole block after the chunk.
 *
 * Conv thread mapping: one thread per channel c (blocks of 128 channels); the window of K raw
 * inputs, the K weights and the output sum (oldest sample first, then SiLU) live in registers.
 * The sequential conv splits T into chunks of CONV_T_CHUNK tokens (grid.y); each chunk rebuilds its
 * window from the rows before it, so outputs do not depend on the chunking.
 *
 * Workspace: only cuda_gdn_tree_chains uses it, for boundary states: per value head in flight
 * gdn_slots_per_head(max_nodes) = max(1, (max_nodes - 1) / 2) slots of S * S floats (a boundary
 * node has at least two children, so a tree of N nodes has at most (N - 1) / 2 of them). All Hv heads
 * in flight need Hv * max(1, (max_nodes - 1) / 2) * S * S * 4 bytes (27B, max_nodes 64: 48 * 31 *
 * 64 KiB = 93 MiB); a smaller workspace runs the heads in batches (one launch per batch), down to
 * one head's slots. */
#include <math.h>
#include <stdint.h>

#include "cuda_backend.h"
#include "launch.h"
#include "hld_layout.h"
#include "row_math.cuh"

#define GDN_LANES 16 /* lanes per state row (one half warp) */
#ifndef GDN_ROWS_PER_THREAD
#define GDN_ROWS_PER_THREAD 2 /* rows of a head each thread keeps (-DGDN_ROWS_PER_THREAD=1 for 8-row blocks) */
#endif
#define GDN_THREADS 128
#define GDN_GROUPS (GDN_THREADS / GDN_LANES)                   /* 8 row groups per block */
#define GDN_ROWS_PER_BLOCK (GDN_GROUPS * GDN_ROWS_PER_THREAD) /* 16 at two rows per thread */
#define GDN_MAX_KEYS_PER_LANE 8
#define GDN_MAX_S (GDN_LANES * GDN_MAX_KEYS_PER_LANE) /* 128 */
#define GDN_CHUNK 8 /* tokens staged in shared memory at once */
static_assert(GDN_ROWS_PER_THREAD >= 1, "a thread keeps at least one row");
/* Blocks per SM the state kernels are compiled to fit by registers (64K / (128 x this) registers
 * a thread at most), 0 for no bound. At one row per thread 6, so that the 768 blocks of a 48-head
 * layer (S = 128) are all resident at once on a 132-SM H200: 80 registers; at KPL 8 the chain
 * kernel spills a few words that it reloads once per chunk of tokens, never in the per-token loop.
 * Unbounded, ptxas takes 112 and an SM holds 4 blocks (528 of the 768). At two rows per thread (the
 * default) no bound: 384 blocks need 3 per SM, and ptxas takes 95-128 at sm_90 (4 blocks), no spills. */
#ifndef GDN_MIN_BLOCKS_PER_SM
#define GDN_MIN_BLOCKS_PER_SM (GDN_ROWS_PER_THREAD == 1 ? 6 : 0)
#endif
#if GDN_MIN_BLOCKS_PER_SM > 0
#define GDN_LAUNCH_BOUNDS __launch_bounds__(GDN_THREADS, GDN_MIN_BLOCKS_PER_SM)
#else
#define GDN_LAUNCH_BOUNDS __launch_bounds__(GDN_THREADS)
#endif

#define CONV_THREADS 128
#define CONV_T_CHUNK 8
#define CONV_MAX_K 64 /* the ABI's bound (api_ops.c, factor_banks.c) */

/* walk entries of the chain kernel: no state load at this node / load the durable state */
#define WALK_NO_LOAD (-2)
#define WALK_DURABLE (-1)

/* ------------------------------------------------------------------------------------------
 * Schedule reads on the device. hld_layout.h's accessors are host functions; these read the same
 * packed layout through its offsets (HLD_*), from device memory.
 * ---------------------------------------------------------------------------------------- */
__device__ __forceinline__ const int32_t *hld_dev_array(const int32_t *s, int which) { return s + s[which]; }
/* The core validates schedules (hld_check); this only keeps a bad one from making a chain kernel
 * write out of bounds: its node and chain counts, and boundaries within the slots per head. */
__device__ __forceinline__ bool hld_dev_chains_fit(const int32_t *s, int max_nodes, int slots_per_head) {
    const int N = s[HLD_N_NODES_AT], n_chains = s[HLD_N_CHAINS_AT];
    return N >= 1 && N <= max_nodes && n_chains >= 1 && n_chains <= N && s[HLD_N_BOUNDARIES_AT] <= slots_per_head;
}

/* ------------------------------------------------------------------------------------------
 * The GDN step and fold: the only state arithmetic of this file.
 * ---------------------------------------------------------------------------------------- */

/* the two halves of the state update; gdn_step and gdn_fold both call exactly these */
__device__ __forceinline__ float gdn_decay(float m, float decay) { return __fmul_rn(m, decay); }
__device__ __forceinline__ float gdn_rank1(float m, float k, float delta) { return __fmaf_rn(k, delta, m); }

/* sum over the 16 lanes of a row group, fixed butterfly xor 8, 4, 2, 1, each of the thread's rows
 * on its own; every lane gets the sum */
__device__ __forceinline__ void gdn_row_sums(float (&part)[GDN_ROWS_PER_THREAD]) {
#pragma unroll
    for (int offset = GDN_LANES / 2; offset > 0; offset /= 2) {
#pragma unroll
        for (int r = 0; r < GDN_ROWS_PER_THREAD; r++) part[r] = __fadd_rn(part[r], SPECLA_SHFL_XOR(part[r], offset));
    }
}

/* gdn_row_sums on two sets of partials at once: per value the same adds in the same order (so the
 * same bits), the two sets' shuffles of a stage independent of each other */
__device__ __forceinline__ void gdn_row_sums2(float (&a)[GDN_ROWS_PER_THREAD], float (&b)[GDN_ROWS_PER_THREAD]) {
#pragma unroll
    for (int offset = GDN_LANES / 2; offset > 0; offset /= 2) {
#pragma unroll
        for (int r = 0; r < GDN_ROWS_PER_THREAD; r++) {
            a[r] = __fadd_rn(a[r], SPECLA_SHFL_XOR(a[r], offset));
            b[r] = __fadd_rn(b[r], SPECLA_SHFL_XOR(b[r], offset));
        }
    }
}

/* where a thread sits: its head, key lane and rows */
struct gdn_lane {
    int S, Hk, Hv, h, kh, lane;
    int row[GDN_ROWS_PER_THREAD];
};

__device__ __forceinline__ gdn_lane gdn_lane_of(int S, int Hk, int Hv, int h) {
    gdn_lane L;
    L.S = S;
    L.Hk = Hk;
    L.Hv = Hv;
    L.h = h;
    L.kh = h % Hk; /* tiled V-head mapping of the qwen35 converter */
    L.lane = (int)threadIdx.x % GDN_LANES;
    const int group = (int)threadIdx.x / GDN_LANES;
#pragma unroll
    for (int r = 0; r < GDN_ROWS_PER_THREAD; r++) L.row[r] = (int)blockIdx.x * GDN_ROWS_PER_BLOCK + r * GDN_GROUPS + group;
    return L;
}

/* one token's inputs as one thread needs them */
template <int KPL> struct gdn_token {
    float k[KPL], q[KPL], v[GDN_ROWS_PER_THREAD];
    float decay, beta; /* decay = expf(g), from the chunk in shared memory */
};

/* one accepted token's factors as one thread needs them */
template <int KPL> struct gdn_factor {
    float k[KPL], delta[GDN_ROWS_PER_THREAD];
    float decay; /* as in gdn_token */
};

/* Token inputs reach the threads through shared memory, GDN_CHUNK tokens at a time: the block
 * loads a chunk with all its threads (every load independent, so one memory latency per chunk
 * rather than one per token) while it steps through the previous chunk, double buffered. A chunk
 * holds the key head's k and q (zero beyond S), the block's rows of v (or of delta, for folds), the
 * decay expf(g) and beta. Thread t's share: keys flat = e * 128 + t (e < KPL), or, where a token's
 * keys are 16 KPL floats on a 16-byte boundary (S = 64, 128: gdn_keys_by_vectors), 16-byte pieces
 * flat = e * 128 + t (e < KPL / 4), so one token id and one load per 4 keys; row elements
 * flat = e * 128 + t below GDN_CHUNK_ROWS (8 tokens x 8 rows = 64 at one row per thread: threads
 * 0 .. 63 load one each; 128 at two, one per thread), and g / beta for t < GDN_CHUNK. The expf of g
 * is taken at the put, once per token for the whole block, when its load has long arrived. */
template <int KPL> struct __align__(16) gdn_chunk {
    float k[GDN_CHUNK][KPL * GDN_LANES], q[GDN_CHUNK][KPL * GDN_LANES];
    float rows[GDN_CHUNK][GDN_ROWS_PER_BLOCK];
    float decay[GDN_CHUNK], beta[GDN_CHUNK];
    /* the chunk's results (gdn_stage_rows), written out once the block has walked it */
    float out[GDN_CHUNK][GDN_ROWS_PER_BLOCK], delta[GDN_CHUNK][GDN_ROWS_PER_BLOCK];
};
#define GDN_CHUNK_ROWS (GDN_CHUNK * GDN_ROWS_PER_BLOCK)                  /* row elements of a chunk */
#define GDN_ROW_SHARES ((GDN_CHUNK_ROWS + GDN_THREADS - 1) / GDN_THREADS) /* of them per thread, at most */
static_assert(GDN_CHUNK * GDN_LANES == GDN_THREADS, "KPL key elements per thread and chunk");
static_assert(GDN_CHUNK <= GDN_THREADS, "g and beta: one thread per token of a chunk");

/* whether row element `flat` (e * GDN_THREADS + thread) exists; always where the threads divide
 * the elements evenly, so that mapping has no test */
__device__ __forceinline__ bool gdn_row_share_exists(int flat) {
    return GDN_CHUNK_ROWS % GDN_THREADS == 0 || flat < GDN_CHUNK_ROWS;
}

/* a thread's share of one chunk, held in registers between the global loads and the shared stores */
template <int KPL> struct gdn_chunk_share {
    float k[KPL], q[KPL], row[GDN_ROW_SHARES], g, beta;
};

/* token c of a chunk starting at `base`: ids[base + c], or base + c when ids is NULL */
__device__ __forceinline__ int gdn_token_id(const int32_t *ids, int base, int c) { return ids ? ids[base + c] : base + c; }

/* Whether k and q travel in 16-byte pieces: a token's keys are exactly 16 KPL floats (S = 64, 128)
 * and both tensors start on a 16-byte boundary (every token's keys then do). The same for the whole
 * block, chosen once per walk. */
template <int KPL> __device__ __forceinline__ bool gdn_keys_by_vectors(const gdn_lane &L, const float *k, const float *q) {
    return KPL % 4 == 0 && L.S == KPL * GDN_LANES && (((uintptr_t)k | (uintptr_t)q) & 15) == 0;
}
/* in the vector layout: the 16-byte pieces of one token's keys, and where thread piece e lands */
#define GDN_KEY_PIECES(KPL) ((KPL) * GDN_LANES / 4)
__device__ __forceinline__ int gdn_piece_token(int flat, int pieces) { return flat / pieces; }
__device__ __forceinline__ int gdn_piece_key(int flat, int pieces) { return (flat % pieces) * 4; }

/* this thread's share of tokens base .. base + GDN_CHUNK - 1 (those < n) from k, q [.][Hk][S] (q may
 * be NULL), rows [.][Hv][S], g and beta [.][Hv] (beta may be NULL); `vectors` from gdn_keys_by_vectors */
template <int KPL>
__device__ __forceinline__ void gdn_chunk_fetch(gdn_chunk_share<KPL> &sh, bool vectors, const int32_t *ids, int base,
                                                int n, const gdn_lane &L, const float *k, const float *q,
                                                const float *rows, const float *g, const float *beta) {
    const int tid = (int)threadIdx.x;
    if (KPL % 4 == 0 && vectors) {
        /* piece e of the thread: token c, keys i .. i + 3; one token id and one load per 4 keys */
#pragma unroll
        for (int e = 0; e < KPL / 4; e++) {
            const int flat = e * GDN_THREADS + tid;
            const int c = gdn_piece_token(flat, GDN_KEY_PIECES(KPL)), i = gdn_piece_key(flat, GDN_KEY_PIECES(KPL));
            float4 kv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), qv = kv;
            if (base + c < n) {
                const int64_t at = ((int64_t)gdn_token_id(ids, base, c) * L.Hk + L.kh) * L.S + i;
                kv = *reinterpret_cast<const float4 *>(k + at);
                if (q) qv = *reinterpret_cast<const float4 *>(q + at);
            }
            sh.k[4 * e] = kv.x, sh.k[4 * e + 1] = kv.y, sh.k[4 * e + 2] = kv.z, sh.k[4 * e + 3] = kv.w;
            sh.q[4 * e] = qv.x, sh.q[4 * e + 1] = qv.y, sh.q[4 * e + 2] = qv.z, sh.q[4 * e + 3] = qv.w;
        }
    } else {
#pragma unroll
        for (int e = 0; e < KPL; e++) {
            const int flat = e * GDN_THREADS + tid, c = flat / (KPL * GDN_LANES), i = flat % (KPL * GDN_LANES);
            float kv = 0.0f, qv = 0.0f;
            if (base + c < n && i < L.S) {
                const int64_t at = ((int64_t)gdn_token_id(ids, base, c) * L.Hk + L.kh) * L.S + i;
                kv = k[at];
                if (q) qv = q[at];
            }
            sh.k[e] = kv;
            sh.q[e] = qv;
        }
    }
#pragma unroll
    for (int e = 0; e < GDN_ROW_SHARES; e++) {
        const int flat = e * GDN_THREADS + tid, c = flat / GDN_ROWS_PER_BLOCK;
        const int row = (int)blockIdx.x * GDN_ROWS_PER_BLOCK + flat % GDN_ROWS_PER_BLOCK;
        sh.row[e] = gdn_row_share_exists(flat) && base + c < n && row < L.S
                        ? rows[((int64_t)gdn_token_id(ids, base, c) * L.Hv + L.h) * L.S + row]
                        : 0.0f;
    }
    sh.g = 0.0f;
    sh.beta = 0.0f;
    if (tid < GDN_CHUNK && base + tid < n) {
        const int64_t at = (int64_t)gdn_token_id(ids, base, tid) * L.Hv + L.h;
        sh.g = g[at];
        if (beta) sh.beta = beta[at];
    }
}

/* the share into chunk s, in the layout gdn_chunk_fetch loaded it with (`vectors`); g becomes the decay */
template <int KPL>
__device__ __forceinline__ void gdn_chunk_put(gdn_chunk<KPL> &s, const gdn_chunk_share<KPL> &sh, bool vectors) {
    const int tid = (int)threadIdx.x;
    if (KPL % 4 == 0 && vectors) {
#pragma unroll
        for (int e = 0; e < KPL / 4; e++) {
            const int flat = e * GDN_THREADS + tid;
            const int c = gdn_piece_token(flat, GDN_KEY_PIECES(KPL)), i = gdn_piece_key(flat, GDN_KEY_PIECES(KPL));
            *reinterpret_cast<float4 *>(&s.k[c][i]) = make_float4(sh.k[4 * e], sh.k[4 * e + 1], sh.k[4 * e + 2], sh.k[4 * e + 3]);
            *reinterpret_cast<float4 *>(&s.q[c][i]) = make_float4(sh.q[4 * e], sh.q[4 * e + 1], sh.q[4 * e + 2], sh.q[4 * e + 3]);
        }
    } else {
#pragma unroll
        for (int e = 0; e < KPL; e++) {
            const int flat = e * GDN_THREADS + tid, c = flat / (KPL * GDN_LANES), i = flat % (KPL * GDN_LANES);
            s.k[c][i] = sh.k[e];
            s.q[c][i] = sh.q[e];
        }
    }
#pragma unroll
    for (int e = 0; e < GDN_ROW_SHARES; e++) {
        const int flat = e * GDN_THREADS + tid;
        if (gdn_row_share_exists(flat)) s.rows[flat / GDN_ROWS_PER_BLOCK][flat % GDN_ROWS_PER_BLOCK] = sh.row[e];
    }
    if (tid < GDN_CHUNK) {
        s.decay[tid] = expf(sh.g);
        s.beta[tid] = sh.beta;
    }
}

/* Key i that lane `lane` holds as its m-th: with KPL a multiple of 4 (S = 64, 128) the lanes take
 * float4 runs, i = 64 (m / 4) + 4 lane + m % 4, so 16 lanes read 256 contiguous bytes per
 * access; otherwise i = 16 m + lane. */
template <int KPL> __device__ __forceinline__ int gdn_key(int lane, int m) {
    if constexpr (KPL % 4 == 0)
        return (m / 4) * (4 * GDN_LANES) + lane * 4 + m % 4;
    else
        return m * GDN_LANES + lane;
}

/* the lane's KPL keys of one key vector src [KPL * 16] (no masking: src holds KPL * 16 floats) */
template <int KPL> __device__ __forceinline__ void gdn_keys_of(float (&dst)[KPL], const float *src, int lane) {
    if constexpr (KPL % 4 == 0) {
#pragma unroll
        for (int m = 0; m < KPL; m += 4) {
            const float4 x = *reinterpret_cast<const float4 *>(src + gdn_key<KPL>(lane, m));
            dst[m] = x.x;
            dst[m + 1] = x.y;
            dst[m + 2] = x.z;
            dst[m + 3] = x.w;
        }
    } else {
#pragma unroll
        for (int m = 0; m < KPL; m++) dst[m] = src[gdn_key<KPL>(lane, m)];
    }
}

/* the thread's view of token c of a chunk */
template <int KPL>
__device__ __forceinline__ void gdn_token_of(gdn_token<KPL> &in, const gdn_chunk<KPL> &s, int c, const gdn_lane &L) {
    gdn_keys_of<KPL>(in.k, s.k[c], L.lane);
    gdn_keys_of<KPL>(in.q, s.q[c], L.lane);
#pragma unroll
    for (int r = 0; r < GDN_ROWS_PER_THREAD; r++) in.v[r] = s.rows[c][L.row[r] % GDN_ROWS_PER_BLOCK];
    in.decay = s.decay[c];
    in.beta = s.beta[c];
}

template <int KPL>
__device__ __forceinline__ void gdn_factor_of(gdn_factor<KPL> &in, const gdn_chunk<KPL> &s, int c, const gdn_lane &L) {
    gdn_keys_of<KPL>(in.k, s.k[c], L.lane);
#pragma unroll
    for (int r = 0; r < GDN_ROWS_PER_THREAD; r++) in.delta[r] = s.rows[c][L.row[r] % GDN_ROWS_PER_BLOCK];
    in.decay = s.decay[c];
}

/* Row results of token c (equal on all 16 lanes) into the chunk; lane 0 writes them. */
__device__ __forceinline__ void gdn_stage_rows(float (&dst)[GDN_CHUNK][GDN_ROWS_PER_BLOCK], int c, const gdn_lane &L,
                                               const float (&val)[GDN_ROWS_PER_THREAD]) {
    if (L.lane != 0) return;
#pragma unroll
    for (int r = 0; r < GDN_ROWS_PER_THREAD; r++) dst[c][L.row[r] % GDN_ROWS_PER_BLOCK] = val[r];
}

/* The staged results of the chunk's first `count` tokens into out and delta_out [.][Hv][S] (either
 * may be NULL) at the tokens' ids, by the whole block: one store per element instead of a lane-0
 * store per token and row inside the serial walk. */
template <int KPL>
__device__ __forceinline__ void gdn_write_chunk(const gdn_chunk<KPL> &s, const int32_t *ids, int base, int count,
                                                const gdn_lane &L, float *out, float *delta_out) {
#pragma unroll
    for (int e0 = 0; e0 < 2 * GDN_CHUNK_ROWS; e0 += GDN_THREADS) {
        const int f = e0 + (int)threadIdx.x;
        if (2 * GDN_CHUNK_ROWS % GDN_THREADS != 0 && f >= 2 * GDN_CHUNK_ROWS) break;
        const bool is_delta = f >= GDN_CHUNK_ROWS;
        const int e = is_delta ? f - GDN_CHUNK_ROWS : f, c = e / GDN_ROWS_PER_BLOCK, r = e % GDN_ROWS_PER_BLOCK;
        const int row = (int)blockIdx.x * GDN_ROWS_PER_BLOCK + r;
        float *dst = is_delta ? delta_out : out;
        if (dst != NULL && c < count && row < L.S)
            dst[((int64_t)gdn_token_id(ids, base, c) * L.Hv + L.h) * L.S + row] = is_delta ? s.delta[c][r] : s.out[c][r];
    }
}

/* Calls body(index, chunk, c) for the n tokens in order (index = position 0 .. n - 1, token c of the
 * chunk in shared memory), fetching the next chunk while the body walks the current one, then
 * chunk_end(chunk) once the body has walked a chunk (a deferred step stages its last result there);
 * what was staged (gdn_stage_rows) goes to out and delta_out (either may be NULL) at the tokens' ids
 * after the chunk. Every thread of the block must call it with the same n (it synchronises the
 * block, also on return, so a caller may then rewrite ids or reuse the chunks). */
template <int KPL, class Body, class ChunkEnd>
__device__ __forceinline__ void gdn_walk_tokens(gdn_chunk<KPL> (&buf)[2], const int32_t *ids, int n, const gdn_lane &L,
                                                const float *k, const float *q, const float *rows, const float *g,
                                                const float *beta, float *out, float *delta_out, Body body,
                                                ChunkEnd chunk_end) {
    if (n <= 0) return;
    const bool vectors = gdn_keys_by_vectors<KPL>(L, k, q ? q : k);
    const bool writes = out != NULL || delta_out != NULL;
    gdn_chunk_share<KPL> sh;
    gdn_chunk_fetch<KPL>(sh, vectors, ids, 0, n, L, k, q, rows, g, beta);
    gdn_chunk_put<KPL>(buf[0], sh, vectors);
    __syncthreads();
    for (int base = 0, b = 0; base < n; base += GDN_CHUNK, b ^= 1) {
        const bool more = base + GDN_CHUNK < n;
        if (more) gdn_chunk_fetch<KPL>(sh, vectors, ids, base + GDN_CHUNK, n, L, k, q, rows, g, beta);
        const int count = min(GDN_CHUNK, n - base);
        for (int c = 0; c < count; c++) body(base + c, buf[b], c);
        chunk_end(buf[b]);
        if (more) gdn_chunk_put<KPL>(buf[b ^ 1], sh, vectors);
        __syncthreads();
        /* buf[b]'s results are complete; its next writer is the body two chunks on, after a barrier */
        if (writes) gdn_write_chunk<KPL>(buf[b], ids, base, count, L, out, delta_out);
    }
    __syncthreads();
}
template <int KPL, class Body>
__device__ __forceinline__ void gdn_walk_tokens(gdn_chunk<KPL> (&buf)[2], const int32_t *ids, int n, const gdn_lane &L,
                                                const float *k, const float *q, const float *rows, const float *g,
                                                const float *beta, float *out, float *delta_out, Body body) {
    gdn_walk_tokens<KPL>(buf, ids, n, L, k, q, rows, g, beta, out, delta_out, body, [](gdn_chunk<KPL> &) {});
}

/* One token of the gated delta rule on the thread's rows (see the mapping at the top). */
template <int KPL>
__device__ __forceinline__ void gdn_step(float (&M)[GDN_ROWS_PER_THREAD][KPL], const gdn_token<KPL> &in, float scale,
                                         float (&out)[GDN_ROWS_PER_THREAD], float (&delta)[GDN_ROWS_PER_THREAD]) {
    const float decay = in.decay;
    float part[GDN_ROWS_PER_THREAD];
#pragma unroll
    for (int r = 0; r < GDN_ROWS_PER_THREAD; r++) {
        float acc = 0.0f;
#pragma unroll
        for (int m = 0; m < KPL; m++) {
            M[r][m] = gdn_decay(M[r][m], decay);
            acc = __fmaf_rn(M[r][m], in.k[m], acc);
        }
        part[r] = acc;
    }
    gdn_row_sums(part); /* part[r] = (M^T k)_j */
#pragma unroll
    for (int r = 0; r < GDN_ROWS_PER_THREAD; r++) delta[r] = __fmul_rn(in.beta, __fsub_rn(in.v[r], part[r]));
#pragma unroll
    for (int r = 0; r < GDN_ROWS_PER_THREAD; r++) {
        float acc = 0.0f;
#pragma unroll
        for (int m = 0; m < KPL; m++) {
            M[r][m] = gdn_rank1(M[r][m], in.k[m], delta[r]);
            acc = __fmaf_rn(M[r][m], in.q[m], acc);
        }
        part[r] = acc;
    }
    gdn_row_sums(part); /* part[r] = (M^T q)_j */
#pragma unroll
    for (int r = 0; r < GDN_ROWS_PER_THREAD; r++) out[r] = __fmul_rn(part[r], scale);
}

/* gdn_step on token c of a walked chunk: its outputs (and with KEEP_DELTA its deltas) staged for the
 * chunk's store; what every kernel that walks tokens through the state runs per token */
template <int KPL, bool KEEP_DELTA>
__device__ __forceinline__ void gdn_step_staged(float (&M)[GDN_ROWS_PER_THREAD][KPL], gdn_chunk<KPL> &s, int c,
                                                const gdn_lane &L, float scale) {
    gdn_token<KPL> in;
    gdn_token_of<KPL>(in, s, c, L);
    float o[GDN_ROWS_PER_THREAD], d[GDN_ROWS_PER_THREAD];
    gdn_step<KPL>(M, in, scale, o, d);
    gdn_stage_rows(s.out, c, L, o);
    if (KEEP_DELTA) gdn_stage_rows(s.delta, c, L, d);
}

/* gdn_step with its second reduction deferred to the next token (the default; SPECLA_CUDA_GDN_DEFER=0
 * selects gdn_step). In gdn_step the M^T q dot product and its butterfly sit between one token's
 * update and the next token's decay, on the serial chain that walks the state; yet nothing of the
 * next token needs them. Here token c's step first takes the M^T q partials of the token before it
 * (the state as that token left it, before this token's decay touches it), interleaved element by
 * element with this token's decay and M^T k partials, then runs both butterflies together
 * (gdn_row_sums2) and stages the earlier token's output; token c's own M^T q waits for the next
 * step, or for gdn_finish_deferred where the walk ends a chunk or the state changes hands. Every
 * value is computed by gdn_step's operations in gdn_step's order (the dots with __fmaf_rn from 0 in
 * increasing m, the decay and the rank-1 update by gdn_decay / gdn_rank1, the same butterfly), so
 * the bits are gdn_step's: only the order in which a warp issues independent work changes. */
template <int KPL> struct gdn_deferred {
    float q[KPL]; /* the deferred token's q keys; zeros when there is none */
    int c;        /* its slot in the chunk being walked, -1 when there is none */
};

template <int KPL> __device__ __forceinline__ void gdn_defer_none(gdn_deferred<KPL> &d) {
#pragma unroll
    for (int m = 0; m < KPL; m++) d.q[m] = 0.0f;
    d.c = -1;
}

template <int KPL, bool KEEP_DELTA>
__device__ __forceinline__ void gdn_step_deferred(float (&M)[GDN_ROWS_PER_THREAD][KPL], gdn_deferred<KPL> &d,
                                                  gdn_chunk<KPL> &s, int c, const gdn_lane &L, float scale) {
    gdn_token<KPL> in;
    gdn_token_of<KPL>(in, s, c, L);
    const float decay = in.decay;
    float kv[GDN_ROWS_PER_THREAD], earlier[GDN_ROWS_PER_THREAD];
#pragma unroll
    for (int r = 0; r < GDN_ROWS_PER_THREAD; r++) {
        float qa = 0.0f, ka = 0.0f;
#pragma unroll
        for (int m = 0; m < KPL; m++) {
            qa = __fmaf_rn(M[r][m], d.q[m], qa); /* the earlier token's M^T q, on its state */
            M[r][m] = gdn_decay(M[r][m], decay);
            ka = __fmaf_rn(M[r][m], in.k[m], ka);
        }
        earlier[r] = qa;
        kv[r] = ka;
    }
    gdn_row_sums2(kv, earlier);
    if (d.c >= 0) {
        float o[GDN_ROWS_PER_THREAD];
#pragma unroll
        for (int r = 0; r < GDN_ROWS_PER_THREAD; r++) o[r] = __fmul_rn(earlier[r], scale);
        gdn_stage_rows(s.out, d.c, L, o);
    }
    float delta[GDN_ROWS_PER_THREAD];
#pragma unroll
    for (int r = 0; r < GDN_ROWS_PER_THREAD; r++) delta[r] = __fmul_rn(in.beta, __fsub_rn(in.v[r], kv[r]));
    if (KEEP_DELTA) gdn_stage_rows(s.delta, c, L, delta);
#pragma unroll
    for (int r = 0; r < GDN_ROWS_PER_THREAD; r++) {
#pragma unroll
        for (int m = 0; m < KPL; m++) M[r][m] = gdn_rank1(M[r][m], in.k[m], delta[r]);
    }
#pragma unroll
    for (int m = 0; m < KPL; m++) d.q[m] = in.q[m];
    d.c = c;
}

/* The deferred token's output, staged now: at the end of a chunk (before the block writes it) and
 * before the state in registers is replaced. The same for every thread of the block (d.c is). */
template <int KPL>
__device__ __forceinline__ void gdn_finish_deferred(const float (&M)[GDN_ROWS_PER_THREAD][KPL], gdn_deferred<KPL> &d,
                                                    gdn_chunk<KPL> &s, const gdn_lane &L, float scale) {
    if (d.c < 0) return;
    float o[GDN_ROWS_PER_THREAD];
#pragma unroll
    for (int r = 0; r < GDN_ROWS_PER_THREAD; r++) {
        float acc = 0.0f;
#pragma unroll
        for (int m = 0; m < KPL; m++) acc = __fmaf_rn(M[r][m], d.q[m], acc);
        o[r] = acc;
    }
    gdn_row_sums(o);
#pragma unroll
    for (int r = 0; r < GDN_ROWS_PER_THREAD; r++) o[r] = __fmul_rn(o[r], scale);
    gdn_stage_rows(s.out, d.c, L, o);
    gdn_defer_none<KPL>(d);
}

/* The per-token step a token-walking kernel runs, DEFER picking gdn_step_deferred over
 * gdn_step_staged (the same bits): step() for each token, finish() where the walk ends a chunk or
 * the state in registers is about to be replaced (nothing to do without DEFER). */
template <int KPL, bool DEFER, bool KEEP_DELTA> struct gdn_stepper {
    gdn_deferred<KPL> d;
    __device__ __forceinline__ gdn_stepper() { gdn_defer_none<KPL>(d); }
    __device__ __forceinline__ void step(float (&M)[GDN_ROWS_PER_THREAD][KPL], gdn_chunk<KPL> &s, int c,
                                         const gdn_lane &L, float scale) {
        gdn_step_deferred<KPL, KEEP_DELTA>(M, d, s, c, L, scale);
    }
    __device__ __forceinline__ void finish(const float (&M)[GDN_ROWS_PER_THREAD][KPL], gdn_chunk<KPL> &s,
                                           const gdn_lane &L, float scale) {
        gdn_finish_deferred<KPL>(M, d, s, L, scale);
    }
};
template <int KPL, bool KEEP_DELTA> struct gdn_stepper<KPL, false, KEEP_DELTA> {
    __device__ __forceinline__ void step(float (&M)[GDN_ROWS_PER_THREAD][KPL], gdn_chunk<KPL> &s, int c,
                                         const gdn_lane &L, float scale) {
        gdn_step_staged<KPL, KEEP_DELTA>(M, s, c, L, scale);
    }
    __device__ __forceinline__ void finish(const float (&)[GDN_ROWS_PER_THREAD][KPL], gdn_chunk<KPL> &,
                                           const gdn_lane &, float) {}
};

/* One accepted token's factors into the state: gdn_step's update without the reads. */
template <int KPL>
__device__ __forceinline__ void gdn_fold(float (&M)[GDN_ROWS_PER_THREAD][KPL], const gdn_factor<KPL> &in) {
    const float decay = in.decay;
#pragma unroll
    for (int r = 0; r < GDN_ROWS_PER_THREAD; r++) {
#pragma unroll
        for (int m = 0; m < KPL; m++) M[r][m] = gdn_rank1(gdn_decay(M[r][m], decay), in.k[m], in.delta[r]);
    }
}

/* the thread's part of one head's state [S][S] (rows j, keys gdn_key(lane, m)); float4 accesses
 * when S = 16 KPL with KPL a multiple of 4 (S = 64, 128) and the head is 16-byte aligned */
template <int KPL> __device__ __forceinline__ bool gdn_state_vectorizable(const float *head, const gdn_lane &L) {
    return KPL % 4 == 0 && L.S == KPL * GDN_LANES && ((uintptr_t)head & 15) == 0;
}

template <int KPL>
__device__ __forceinline__ void gdn_load_state(float (&M)[GDN_ROWS_PER_THREAD][KPL], const float *head,
                                               const gdn_lane &L) {
    if (gdn_state_vectorizable<KPL>(head, L)) {
#pragma unroll
        for (int r = 0; r < GDN_ROWS_PER_THREAD; r++) {
            if (L.row[r] < L.S) {
                gdn_keys_of<KPL>(M[r], head + (int64_t)L.row[r] * L.S, L.lane);
            } else {
#pragma unroll
                for (int m = 0; m < KPL; m++) M[r][m] = 0.0f;
            }
        }
        return;
    }
#pragma unroll
    for (int r = 0; r < GDN_ROWS_PER_THREAD; r++) {
#pragma unroll
        for (int m = 0; m < KPL; m++) {
            const int i = gdn_key<KPL>(L.lane, m);
            M[r][m] = L.row[r] < L.S && i < L.S ? head[(int64_t)L.row[r] * L.S + i] : 0.0f;
        }
    }
}

template <int KPL>
__device__ __forceinline__ void gdn_store_state(const float (&M)[GDN_ROWS_PER_THREAD][KPL], float *head,
                                                const gdn_lane &L) {
    if constexpr (KPL % 4 == 0) {
        if (gdn_state_vectorizable<KPL>(head, L)) {
#pragma unroll
            for (int r = 0; r < GDN_ROWS_PER_THREAD; r++) {
                if (L.row[r] >= L.S) continue;
                float *at = head + (int64_t)L.row[r] * L.S;
#pragma unroll
                for (int m = 0; m < KPL; m += 4)
                    *reinterpret_cast<float4 *>(at + gdn_key<KPL>(L.lane, m)) =
                        make_float4(M[r][m], M[r][m + 1], M[r][m + 2], M[r][m + 3]);
            }
            return;
        }
    }
#pragma unroll
    for (int r = 0; r < GDN_ROWS_PER_THREAD; r++) {
#pragma unroll
        for (int m = 0; m < KPL; m++) {
            const int i = gdn_key<KPL>(L.lane, m);
            if (L.row[r] < L.S && i < L.S) head[(int64_t)L.row[r] * L.S + i] = M[r][m];
        }
    }
}

/* a thread's state registers parked in / restored from one shared-memory slot, [r][m][thread]
 * (consecutive threads at consecutive words: no bank conflicts) */
#define GDN_PARKED_FLOATS(KPL) (GDN_ROWS_PER_THREAD * (KPL) * GDN_THREADS)
template <int KPL> __device__ __forceinline__ void gdn_park(const float (&M)[GDN_ROWS_PER_THREAD][KPL], float *slot) {
#pragma unroll
    for (int r = 0; r < GDN_ROWS_PER_THREAD; r++) {
#pragma unroll
        for (int m = 0; m < KPL; m++) slot[(r * KPL + m) * GDN_THREADS + threadIdx.x] = M[r][m];
    }
}
template <int KPL> __device__ __forceinline__ void gdn_unpark(float (&M)[GDN_ROWS_PER_THREAD][KPL], const float *slot) {
#pragma unroll
    for (int r = 0; r < GDN_ROWS_PER_THREAD; r++) {
#pragma unroll
        for (int m = 0; m < KPL; m++) M[r][m] = slot[(r * KPL + m) * GDN_THREADS + threadIdx.x];
    }
}

/* ------------------------------------------------------------------------------------------
 * GDN kernels; grid (ceil(S / GDN_ROWS_PER_BLOCK), heads), GDN_THREADS threads, head = head0 + blockIdx.y.
 * ---------------------------------------------------------------------------------------- */

/* The state kernels that walk tokens through gdn_step take DEFER: gdn_step_deferred instead, the
 * same bits (SPECLA_CUDA_GDN_DEFER, gdn_defer_steps). */
template <int KPL, bool DEFER>
__global__ void GDN_LAUNCH_BOUNDS
    gdn_sequential_kernel(const float *q, const float *k, const float *v, const float *g, const float *beta, int T,
                          int Hk, int Hv, int S, float scale, float *state, float *out) {
    grid_begin();
    __shared__ gdn_chunk<KPL> chunks[2];
    const gdn_lane L = gdn_lane_of(S, Hk, Hv, (int)blockIdx.y);
    float *head = state + (int64_t)L.h * S * S;
    float M[GDN_ROWS_PER_THREAD][KPL];
    gdn_load_state<KPL>(M, head, L);
    gdn_stepper<KPL, DEFER, false> stepper;
    gdn_walk_tokens<KPL>(
        chunks, NULL, T, L, k, q, v, g, beta, out, NULL,
        [&](int, gdn_chunk<KPL> &s, int c) { stepper.step(M, s, c, L, scale); },
        [&](gdn_chunk<KPL> &s) { stepper.finish(M, s, L, scale); });
    gdn_store_state<KPL>(M, head, L);
}

/* n accepted tokens' factors k [.][Hk][S], delta [.][Hv][S], g [.][Hv] into M, in order */
template <int KPL>
__device__ __forceinline__ void gdn_fold_tokens(float (&M)[GDN_ROWS_PER_THREAD][KPL], gdn_chunk<KPL> (&chunks)[2],
                                                const gdn_lane &L, const float *k, const float *delta, const float *g,
                                                int n) {
    gdn_walk_tokens<KPL>(chunks, NULL, n, L, k, NULL, delta, g, NULL, NULL, NULL, [&](int, gdn_chunk<KPL> &s, int c) {
        gdn_factor<KPL> f;
        gdn_factor_of<KPL>(f, s, c, L);
        gdn_fold<KPL>(M, f);
    });
}

template <int KPL>
__global__ void GDN_LAUNCH_BOUNDS
    gdn_fold_kernel(float *state, const float *k, const float *delta, const float *g, int P, int Hk, int Hv, int S) {
    grid_begin();
    __shared__ gdn_chunk<KPL> chunks[2];
    const gdn_lane L = gdn_lane_of(S, Hk, Hv, (int)blockIdx.y);
    float *head = state + (int64_t)L.h * S * S;
    float M[GDN_ROWS_PER_THREAD][KPL];
    gdn_load_state<KPL>(M, head, L);
    gdn_fold_tokens<KPL>(M, chunks, L, k, delta, g, P);
    gdn_store_state<KPL>(M, head, L);
}

/* SpecLA's state-resident chain verify. The block first copies the walk out of the schedule into
 * shared memory: position p of `order` gives the node, whether a chain starts there (and from which
 * state: the durable one or a boundary slot) and the slot that receives the state after it. Then
 * it folds the pending accepted path into the durable state and writes it back once (the deferred
 * fused commit), and walks the nodes in schedule order with the state in registers: loaded once per
 * chain, stored only at boundary nodes. Boundary slots below smem_slots live in shared memory (the
 * block's rows only, [slot][r][m][thread]); the others in the workspace, [head in launch][slot][S][S].
 * Each thread reloads exactly the slot elements it stored, so no synchronisation is needed between
 * a boundary store and the chains that start from it. */
template <int KPL, bool DEFER>
__global__ void GDN_LAUNCH_BOUNDS
    gdn_tree_chains_kernel(const int32_t *schedule, const float *q, const float *k, const float *v, const float *g,
                           const float *beta, int Hk, int Hv, int S, float scale, float *state, const float *pending_k,
                           const float *pending_delta, const float *pending_g, const int32_t *pending_n, float *out,
                           float *delta_out, float *slots, int slots_per_head, int smem_slots, int head0,
                           int max_nodes) {
    grid_begin();
    __shared__ gdn_chunk<KPL> chunks[2];
    extern __shared__ float4 chains_shared[]; /* smem_slots parked states, then the walk */
    float *parked = reinterpret_cast<float *>(chains_shared);
    int32_t *walk = reinterpret_cast<int32_t *>(parked + (size_t)smem_slots * GDN_PARKED_FLOATS(KPL));
    int32_t *walk_node = walk, *walk_load = walk + max_nodes, *walk_store = walk + 2 * max_nodes;
    /* The prologue's reads are issued in as few dependent rounds as the layout allows: the durable
     * state and the schedule's header, offsets and the pending count together, then the walk's node,
     * boundary and chain-start entries, then (after a barrier) the chain starts into the walk. */
    const gdn_lane L = gdn_lane_of(S, Hk, Hv, head0 + (int)blockIdx.y);
    const int64_t head_size = (int64_t)S * S;
    float *durable = state + (int64_t)L.h * head_size;
    float *head_slots = slots + (int64_t)blockIdx.y * slots_per_head * head_size;
    float M[GDN_ROWS_PER_THREAD][KPL];
    gdn_load_state<KPL>(M, durable, L);
    const int N = schedule[HLD_N_NODES_AT], n_chains = schedule[HLD_N_CHAINS_AT];
    const int32_t *order = hld_dev_array(schedule, HLD_OFF_ORDER);
    const int32_t *chain_offsets = hld_dev_array(schedule, HLD_OFF_CHAIN_OFFSETS);
    const int32_t *chain_parent_boundary = hld_dev_array(schedule, HLD_OFF_CHAIN_PARENT_BOUNDARY);
    const int32_t *node_boundary = hld_dev_array(schedule, HLD_OFF_NODE_BOUNDARY);
    /* the pending path's length is read when the kernel runs (a recorded verify folds what the step
     * before accepted); the same value for every thread, so the branches on it are uniform */
    const int n_pending = pending_n ? *pending_n : 0;
    if (!hld_dev_chains_fit(schedule, max_nodes, slots_per_head)) return;

    /* walk_load[p]: the state a chain starting at position p loads (every other position loads none) */
    const int c0 = (int)threadIdx.x;
    int start0 = -1, from0 = WALK_NO_LOAD;
    if (c0 < n_chains) start0 = chain_offsets[c0], from0 = chain_parent_boundary[c0];
    for (int p = (int)threadIdx.x; p < N; p += (int)blockDim.x) {
        const int node = order[p];
        walk_node[p] = node;
        walk_load[p] = WALK_NO_LOAD;
        walk_store[p] = node_boundary[node];
    }
    __syncthreads();
    if (start0 >= 0 && start0 < N) walk_load[start0] = from0;
    for (int c = c0 + (int)blockDim.x; c < n_chains; c += (int)blockDim.x) {
        const int start = chain_offsets[c];
        if (start >= 0 && start < N) walk_load[start] = chain_parent_boundary[c];
    }
    __syncthreads();

    if (n_pending > 0) {
        gdn_fold_tokens<KPL>(M, chunks, L, pending_k, pending_delta, pending_g, n_pending);
        gdn_store_state<KPL>(M, durable, L);
    }
    /* position 0 is the root chain's first node: it starts from the durable state now in M */
    gdn_stepper<KPL, DEFER, true> stepper;
    gdn_walk_tokens<KPL>(
        chunks, walk_node, N, L, k, q, v, g, beta, out, delta_out,
        [&](int p, gdn_chunk<KPL> &s, int c) {
            const int load = walk_load[p];
            /* a deferred output reads the state its token left: finish it before another replaces it */
            if (load >= 0 || (load == WALK_DURABLE && p > 0)) stepper.finish(M, s, L, scale);
            if (load >= 0 && load < smem_slots)
                gdn_unpark<KPL>(M, parked + load * GDN_PARKED_FLOATS(KPL));
            else if (load >= 0)
                gdn_load_state<KPL>(M, head_slots + load * head_size, L);
            else if (load == WALK_DURABLE && p > 0)
                gdn_load_state<KPL>(M, durable, L);
            stepper.step(M, s, c, L, scale);
            const int store = walk_store[p];
            if (store >= 0 && store < smem_slots)
                gdn_park<KPL>(M, parked + store * GDN_PARKED_FLOATS(KPL));
            else if (store >= 0)
                gdn_store_state<KPL>(M, head_slots + store * head_size, L);
        },
        [&](gdn_chunk<KPL> &s) { stepper.finish(M, s, L, scale); });
}

/* Baseline: every root-to-leaf path replayed from the durable state (read only). The leaves are
 * the last nodes of the chains; thread 0 writes each path root first into shared memory (the walk
 * ends with a block barrier, so the next leaf's path waits for every reader). Nodes on several
 * paths are written once per path, with the same bits. */
template <int KPL, bool DEFER>
__global__ void GDN_LAUNCH_BOUNDS
    gdn_tree_root_to_leaf_kernel(const int32_t *schedule, const float *q, const float *k, const float *v,
                                 const float *g, const float *beta, int Hk, int Hv, int S, float scale,
                                 const float *state, float *out, float *delta_out, int max_nodes) {
    grid_begin();
    __shared__ gdn_chunk<KPL> chunks[2];
    extern __shared__ int32_t path[];
    const int N = schedule[HLD_N_NODES_AT];
    if (N < 1 || N > max_nodes) return;
    const int n_chains = schedule[HLD_N_CHAINS_AT];
    const int32_t *parents = hld_dev_array(schedule, HLD_OFF_PARENTS);
    const int32_t *order = hld_dev_array(schedule, HLD_OFF_ORDER);
    const int32_t *chain_offsets = hld_dev_array(schedule, HLD_OFF_CHAIN_OFFSETS);
    const int32_t *node_depth = hld_dev_array(schedule, HLD_OFF_NODE_DEPTH);
    const gdn_lane L = gdn_lane_of(S, Hk, Hv, (int)blockIdx.y);
    const float *durable = state + (int64_t)L.h * S * S;
    for (int c = 0; c < n_chains; c++) {
        const int leaf = order[chain_offsets[c + 1] - 1];
        const int len = node_depth[leaf] + 1;
        if (threadIdx.x == 0)
            for (int t = leaf; t >= 0; t = parents[t]) path[node_depth[t]] = t;
        __syncthreads();
        float M[GDN_ROWS_PER_THREAD][KPL];
        gdn_load_state<KPL>(M, durable, L);
        gdn_stepper<KPL, DEFER, true> stepper;
        gdn_walk_tokens<KPL>(
            chunks, path, len, L, k, q, v, g, beta, out, delta_out,
            [&](int, gdn_chunk<KPL> &s, int cc) { stepper.step(M, s, cc, L, scale); },
            [&](gdn_chunk<KPL> &s) { stepper.finish(M, s, L, scale); });
    }
}

/* Baseline: the full state after every node, checkpoints [N][Hv][S][S], nodes in topological
 * order from their parent's checkpoint (kept in registers when the parent is the previous node). */
template <int KPL, bool DEFER>
__global__ void GDN_LAUNCH_BOUNDS
    gdn_tree_checkpoints_kernel(const int32_t *schedule, const float *q, const float *k, const float *v,
                                const float *g, const float *beta, int Hk, int Hv, int S, float scale,
                                const float *state, float *out, float *delta_out, float *checkpoints, int max_nodes) {
    grid_begin();
    __shared__ gdn_chunk<KPL> chunks[2];
    const int N = schedule[HLD_N_NODES_AT];
    if (N < 1 || N > max_nodes) return;
    const int32_t *parents = hld_dev_array(schedule, HLD_OFF_PARENTS);
    const gdn_lane L = gdn_lane_of(S, Hk, Hv, (int)blockIdx.y);
    const int64_t head_size = (int64_t)S * S, node_size = (int64_t)Hv * head_size;
    float M[GDN_ROWS_PER_THREAD][KPL];
    gdn_load_state<KPL>(M, state + (int64_t)L.h * head_size, L);
    gdn_stepper<KPL, DEFER, true> stepper;
    gdn_walk_tokens<KPL>(
        chunks, NULL, N, L, k, q, v, g, beta, out, delta_out,
        [&](int t, gdn_chunk<KPL> &s, int c) {
            const int parent = parents[t];
            if (t > 0 && parent != t - 1) {
                stepper.finish(M, s, L, scale); /* before the state is replaced */
                gdn_load_state<KPL>(M, checkpoints + parent * node_size + L.h * head_size, L);
            }
            stepper.step(M, s, c, L, scale);
            gdn_store_state<KPL>(M, checkpoints + t * node_size + L.h * head_size, L);
        },
        [&](gdn_chunk<KPL> &s) { stepper.finish(M, s, L, scale); });
}

/* ------------------------------------------------------------------------------------------
 * Conv: one thread per channel, window of KMAX registers of which the first K are used.
 * ---------------------------------------------------------------------------------------- */

/* SiLU of window . w, summed from the oldest sample (window[0]); the one conv output function */
template <int KMAX>
__device__ __forceinline__ float conv_output(const float (&window)[KMAX], const float (&w)[KMAX], int K) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < KMAX; j++)
        if (j < K) acc = __fadd_rn(acc, __fmul_rn(window[j], w[j]));
    return silu_dev(acc);
}

template <int KMAX>
__device__ __forceinline__ void conv_load_weights(float (&w)[KMAX], const float *weight, int c, int K) {
#pragma unroll
    for (int j = 0; j < KMAX; j++) w[j] = j < K ? weight[(int64_t)c * K + j] : 0.0f;
}

/* row `row` of the concatenated sequence [conv_state (K - 1 rows) ; x], channel c */
__device__ __forceinline__ float conv_row(const float *conv_state, const float *x, int row, int hist, int C, int c) {
    return row < hist ? conv_state[(int64_t)row * C + c] : x[(int64_t)(row - hist) * C + c];
}

/* window[0 .. K - 1) = channel c's raw inputs at rows row0 .. row0 + K - 2 of [conv_state ; x], the rest 0 */
template <int KMAX>
__device__ __forceinline__ void conv_load_window(float (&window)[KMAX], const float *conv_state, const float *x,
                                                 int row0, int C, int K, int c) {
    const int hist = K - 1;
#pragma unroll
    for (int j = 0; j < KMAX; j++) window[j] = j < hist ? conv_row(conv_state, x, row0 + j, hist, C, c) : 0.0f;
}

/* Channel c's causal conv over tokens t0 .. t1 - 1 (one thread): the window starts from the K - 1 rows
 * before t0 of [conv_state ; x], then per token the raw input enters last, out(t, SiLU(window . w))
 * receives the output and the window shifts. On return window[0 .. K - 1) holds the raw inputs of rows
 * t1 .. t1 + K - 2 of the concatenation: the new conv state when t0 = 0 and t1 = T. */
template <int KMAX, class Out>
__device__ __forceinline__ void conv_channel(const float *x, const float *weight, int C, int K, const float *conv_state,
                                             int c, int t0, int t1, float (&window)[KMAX], Out out) {
    const int hist = K - 1;
    float w[KMAX];
    conv_load_weights<KMAX>(w, weight, c, K);
    conv_load_window<KMAX>(window, conv_state, x, t0, C, K, c);
    for (int t = t0; t < t1; t++) {
        /* window of token t = rows t .. t + K - 1 of the concatenation, oldest first */
#pragma unroll
        for (int j = 0; j < KMAX; j++)
            if (j == hist) window[j] = x[(int64_t)t * C + c];
        out(t, conv_output<KMAX>(window, w, K));
#pragma unroll
        for (int j = 0; j + 1 < KMAX; j++)
            if (j < hist) window[j] = window[j + 1];
    }
}

/* the last K - 1 raw inputs (conv_channel's window after the last token) as channel c's conv state */
template <int KMAX>
__device__ __forceinline__ void conv_store_state(float *conv_state, int C, int K, int c, const float (&window)[KMAX]) {
#pragma unroll
    for (int j = 0; j < KMAX; j++)
        if (j < K - 1) conv_state[(int64_t)j * C + c] = window[j];
}

/* grid (ceil(C / 128), ceil(T / CONV_T_CHUNK)); with one chunk the thread also writes the new state */
template <int KMAX>
__global__ void __launch_bounds__(CONV_THREADS)
    causal_conv_kernel(const float *x, const float *weight, int T, int C, int K, float *conv_state, float *y) {
    grid_begin();
    const int c = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (c >= C) return;
    const int t0 = (int)blockIdx.y * CONV_T_CHUNK, t1 = min(T, t0 + CONV_T_CHUNK);
    float window[KMAX];
    conv_channel<KMAX>(x, weight, C, K, conv_state, c, t0, t1, window,
                       [&](int t, float out) { y[(int64_t)t * C + c] = out; });
    if (gridDim.y == 1) conv_store_state<KMAX>(conv_state, C, K, c, window);
}

/* The blocks of gdn_prepare_kernel: 2 Hk head blocks (q heads, then k heads), the v channels' blocks
 * (NORM_THREADS channels each), then one block for the gates. This is the index of the gates block;
 * the grid is one more. */
__host__ __device__ __forceinline__ int gdn_gates_block_index(int Hk, int Hv, int S) {
    return 2 * Hk + (Hv * S + NORM_THREADS - 1) / NORM_THREADS;
}

/* The gates block of that kernel: the gates of the T x Hv values (gdn_gate_values, gdn_gates'
 * function). Returns whether this block was it (and is done). */
__device__ __forceinline__ bool gdn_gates_block(float *beta, float *g, const float *dt_bias, const float *ssm_a, int T,
                                                int Hk, int Hv, int S) {
    if ((int)blockIdx.x != gdn_gates_block_index(Hk, Hv, S)) return false;
    for (int i = (int)threadIdx.x; i < T * Hv; i += NORM_THREADS) {
        const int h = i % Hv;
        gdn_gate_values(&beta[i], &g[i], dt_bias[h], ssm_a[h]);
    }
    return true;
}

/* gdn_prepare as one launch, for at most CONV_T_CHUNK tokens (a decode step: one) and S <= NORM_THREADS.
 * Block b, NORM_THREADS threads:
 *   - b < 2 Hk: q head b, or k head b - Hk (a conv row starts with the 2 Hk S channels of q and k):
 *     thread i < S runs channel b S + i through conv_channel (causal_conv_kernel's steps), writes
 *     conv_out and the channel's new state and keeps the T outputs in shared memory; then the block
 *     L2-normalises each token's head row with l2_row, gdn_split_qkv's function, into q or k;
 *   - the next ceil(Hv S / NORM_THREADS) blocks: the v channels, each output to conv_out and v;
 *   - the last block: the gates of the T x Hv values (gdn_gate_values, gdn_gates' function).
 * Every channel has one thread, so its conv state is read and written by that thread only; every
 * value is computed by the functions of the three ops it replaces, so the bits are theirs. */
template <int KMAX>
__global__ void __launch_bounds__(NORM_THREADS)
    gdn_prepare_kernel(float *beta, float *g, const float *dt_bias, const float *ssm_a, const float *x,
                       const float *weight, int T, int Hk, int Hv, int S, int K, float eps, float *conv_state,
                       float *conv_out, float *q, float *k, float *v) {
    grid_begin();
    __shared__ float rows[CONV_T_CHUNK][NORM_THREADS];
    __shared__ float partials[NORM_THREADS / SPECLA_WARP];
    const int tid = (int)threadIdx.x, b = (int)blockIdx.x;
    const int qk_width = Hk * S, v_width = Hv * S, C = 2 * qk_width + v_width;
    if (gdn_gates_block(beta, g, dt_bias, ssm_a, T, Hk, Hv, S)) return;
    const bool head = b < 2 * Hk;
    const int c = head ? b * S + tid : 2 * qk_width + (b - 2 * Hk) * NORM_THREADS + tid;
    if (head ? tid < S : c < C) {
        float window[KMAX];
        conv_channel<KMAX>(x, weight, C, K, conv_state, c, 0, T, window, [&](int t, float out) {
            conv_out[(int64_t)t * C + c] = out;
            if (head) rows[t][tid] = out;
            else v[(int64_t)t * v_width + (c - 2 * qk_width)] = out;
        });
        conv_store_state<KMAX>(conv_state, C, K, c, window);
    }
    if (!head) return; /* the whole block */
    __syncthreads();
    float *dst = (b < Hk ? q + (int64_t)b * S : k + (int64_t)(b - Hk) * S);
    for (int t = 0; t < T; t++) l2_row(rows[t], S, eps, dst + (int64_t)t * qk_width, partials);
}

/* the new conv state after P more raw inputs: rows P .. P + K - 2 of [conv_state ; x], read into
 * registers before any is written (causal conv with several chunks, and the accepted-path fold).
 * P_at != NULL: P is read from device memory when the kernel runs (the fold's count, which changes
 * from step to step under one recorded verify); P <= 0 leaves the state as it is. */
template <int KMAX>
__global__ void __launch_bounds__(CONV_THREADS)
    conv_shift_kernel(float *conv_state, const float *x, int P, const int32_t *P_at, int C, int K) {
    grid_begin();
    const int c = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (P_at) P = *P_at;
    if (c >= C || P <= 0) return;
    float window[KMAX];
    conv_load_window<KMAX>(window, conv_state, x, P, C, K, c);
    conv_store_state<KMAX>(conv_state, C, K, c, window);
}

/* Node t's conv window as conv_tree builds it: t's raw input last (window[hist]), its ancestors'
 * before it, newest first up the parent links, then the rows of the window the tree grows from,
 * newest last (row hist - 1, hist - 2, ...); zeros past K. input(node): a node's raw input;
 * state(row): that window's row. */
template <int KMAX, class Input, class State>
__device__ __forceinline__ void tree_conv_window(float (&window)[KMAX], int t, const int32_t *parents, int hist,
                                                 Input input, State state) {
    int node = parents[t], state_row = hist - 1;
#pragma unroll
    for (int j = KMAX - 1; j >= 0; j--) {
        if (j > hist) {
            window[j] = 0.0f;
        } else if (j == hist) {
            window[j] = input(t);
        } else if (node >= 0) {
            window[j] = input(node);
            node = parents[node];
        } else {
            window[j] = state(state_row--);
        }
    }
}

/* node t's window as the state a commit of t takes: its K - 1 newest rows */
template <int KMAX>
__device__ __forceinline__ void tree_conv_store_window(float *window_out, int t, int hist, int C, int c,
                                                       const float (&window)[KMAX]) {
#pragma unroll
    for (int j = 0; j < KMAX; j++)
        if (j < hist) window_out[((int64_t)t * hist + j) * C + c] = window[j + 1 < KMAX ? j + 1 : j];
}

/* grid (ceil(C / 128), max_nodes): thread (c, node t); the window is t's raw input and its
 * ancestors' (newest first up the parent links), then the durable window's rows, newest last */
template <int KMAX>
__global__ void __launch_bounds__(CONV_THREADS)
    conv_tree_kernel(const int32_t *schedule, const float *x, const float *weight, int C, int K,
                     const float *conv_state, float *y, float *window_out) {
    grid_begin();
    const int c = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    const int t = (int)blockIdx.y;
    if (c >= C || t >= schedule[HLD_N_NODES_AT]) return;
    const int32_t *parents = hld_dev_array(schedule, HLD_OFF_PARENTS);
    const int hist = K - 1;
    float w[KMAX], window[KMAX];
    conv_load_weights<KMAX>(w, weight, c, K);
    tree_conv_window<KMAX>(
        window, t, parents, hist, [&](int node) { return x[(int64_t)node * C + c]; },
        [&](int row) { return conv_state[(int64_t)row * C + c]; });
    y[(int64_t)t * C + c] = conv_output<KMAX>(window, w, K);
    if (window_out) tree_conv_store_window<KMAX>(window_out, t, hist, C, c, window);
}

/* ------------------------------------------------------------------------------------------
 * Host entry points (cuda_backend.h).
 * ---------------------------------------------------------------------------------------- */

static float gdn_scale(int S) { return 1.0f / sqrtf((float)S); }

/* keys per lane of the state mapping, 1 .. GDN_MAX_KEYS_PER_LANE; 0 for an S this file cannot keep on
 * chip (S > 128). Every GDN kernel dispatches on this one value, so for a given S all of them run
 * the same instantiation of gdn_step. */
static int gdn_keys_per_lane(int S) { return S >= 1 && S <= GDN_MAX_S ? (S + GDN_LANES - 1) / GDN_LANES : 0; }

static int gdn_slots_per_head(int max_nodes) { return max_nodes > 2 ? (max_nodes - 1) / 2 : 1; }

extern "C" size_t cuda_recurrent_workspace_bytes(const backend_limits *l) {
    if (l->max_nodes <= 0 || l->gdn_heads <= 0) return 0;
    return sizeof(float) * (size_t)l->gdn_heads * (size_t)gdn_slots_per_head(l->max_nodes) * (size_t)l->gdn_head_size;
}

/* An op this file cannot run records a launch error naming it: a launch with an empty grid fails
 * with "invalid configuration argument", and cuda_note_launch reports it under `why`. */
__global__ void recurrent_refused_kernel(void) {}
static void refuse(const backend *be, const char *why) {
    cuda_launch(recurrent_refused_kernel, dim3(0), dim3(1), 0, cuda_stream(be));
    cuda_note_launch(be, why);
}

#define GDN_DISPATCH(kpl, LAUNCH)                                                                                      \
    switch (kpl) {                                                                                                     \
    case 1: LAUNCH(1); break;                                                                                          \
    case 2: LAUNCH(2); break;                                                                                          \
    case 3: LAUNCH(3); break;                                                                                          \
    case 4: LAUNCH(4); break;                                                                                          \
    case 5: LAUNCH(5); break;                                                                                          \
    case 6: LAUNCH(6); break;                                                                                          \
    case 7: LAUNCH(7); break;                                                                                          \
    default: LAUNCH(8); break;                                                                                         \
    }

/* Whether the token-walking state kernels take gdn_step_deferred (the same bits, the M^T q reduction
 * off the serial chain): yes unless the backend's SPECLA_CUDA_GDN_DEFER=0. The default because the
 * batch and the SpecLA verify run a little faster with it (docs/perf.md, twenty-ninth pass). */
static bool gdn_defer_steps(const backend *be) { return cuda_of(be)->gdn_deferred_steps != 0; }

static dim3 gdn_grid(int S, int heads) { return dim3((unsigned)((S + GDN_ROWS_PER_BLOCK - 1) / GDN_ROWS_PER_BLOCK), (unsigned)heads); }

extern "C" void cuda_gated_delta_rule(const backend *be, const float *q, const float *k, const float *v,
                                      const float *g, const float *beta, int T, int Hk, int Hv, int S, float *state,
                                      float *out) {
    const int kpl = gdn_keys_per_lane(S);
    if (kpl == 0) return refuse(be, "gated_delta_rule: state size S must be 1 .. 128 on this backend");
    const float scale = gdn_scale(S);
#define LAUNCH(KPL)                                                                                                    \
    cuda_launch(gdn_defer_steps(be) ? gdn_sequential_kernel<KPL, true> : gdn_sequential_kernel<KPL, false>,            \
                dim3(gdn_grid(S, Hv)), dim3(GDN_THREADS), 0, cuda_stream(be), q, k, v, g, beta, T, Hk, Hv, S, scale,   \
                state, out)
    GDN_DISPATCH(kpl, LAUNCH)
#undef LAUNCH
    cuda_note_launch(be, "gated_delta_rule");
}

extern "C" void cuda_gdn_fold(const backend *be, float *state, const float *k, const float *delta, const float *g,
                              int P, int Hk, int Hv, int S) {
    const int kpl = gdn_keys_per_lane(S);
    if (kpl == 0) return refuse(be, "gdn_fold: state size S must be 1 .. 128 on this backend");
    if (P <= 0) return;
#define LAUNCH(KPL)                                                                                                    \
    cuda_launch(gdn_fold_kernel<KPL>, dim3(gdn_grid(S, Hv)), dim3(GDN_THREADS), 0, cuda_stream(be), state, k, delta, g,\
                P, Hk, Hv, S)
    GDN_DISPATCH(kpl, LAUNCH)
#undef LAUNCH
    cuda_note_launch(be, "gdn_fold");
}

/* Shared memory the CUDA runtime reserves per block on sm_80+ (cudaDevAttrReservedSharedMemoryPerBlock);
 * counted on every target, which only errs on the safe side. */
#define GDN_SMEM_RESERVED_PER_BLOCK 1024

/* A chain-verify block's shared memory: the 48 KiB every CUDA and HIP target gives a block without
 * opt-in, or less where the launch has more blocks than the SMs hold at that size: then the share
 * of an SM that lets ceil(blocks / SMs) blocks sit on each at once, so that no block waits for a
 * second round. (S = 128, 48 heads on an H200, 132 SMs of 228 KiB: 384 16-row blocks, 3 per SM,
 * take 48 KiB; 768 8-row blocks, 6 per SM, 37 KiB.) */
static size_t gdn_chains_smem_budget(const cuda_backend *cb, int64_t blocks) {
    const size_t unopted = 48 * 1024;
    if (cb->sm_count <= 0 || cb->shared_per_sm <= 0 || blocks <= 0) return unopted;
    const size_t per_sm = (size_t)((blocks + cb->sm_count - 1) / cb->sm_count);
    const size_t share = (size_t)cb->shared_per_sm / per_sm;
    const size_t budget = share > GDN_SMEM_RESERVED_PER_BLOCK ? share - GDN_SMEM_RESERVED_PER_BLOCK : 0;
    return budget < unopted ? budget : unopted;
}

/* Boundary slots kept in shared memory per block: as many as fit beside the static staging buffers
 * and the walk within the budget (S = 128 on an H200: 3 of a 16-row block's, 4 of an 8-row block's,
 * so the few boundaries of a typical tree never leave the SM). */
template <int KPL> static int gdn_smem_slots(size_t budget, int slots_per_head, int max_nodes) {
    const size_t fixed = 2 * sizeof(gdn_chunk<KPL>) + sizeof(int32_t) * 3 * (size_t)max_nodes;
    const size_t per_slot = sizeof(float) * GDN_PARKED_FLOATS(KPL);
    const size_t fit = fixed < budget ? (budget - fixed) / per_slot : 0;
    return fit < (size_t)slots_per_head ? (int)fit : slots_per_head;
}

template <int KPL>
static void launch_tree_chains(const backend *be, const int32_t *schedule, const float *q, const float *k,
                               const float *v, const float *g, const float *beta, int Hk, int Hv, int S, float *state,
                               const gdn_pending *pending, float *out, float *delta_out, int heads_per_launch,
                               int slots_per_head, int max_nodes) {
    const int64_t blocks = (int64_t)gdn_grid(S, heads_per_launch).x * heads_per_launch; /* the largest launch */
    const int smem_slots =
        gdn_smem_slots<KPL>(gdn_chains_smem_budget(cuda_of(be), blocks), slots_per_head, max_nodes);
    const size_t shared = sizeof(float) * GDN_PARKED_FLOATS(KPL) * (size_t)smem_slots + sizeof(int32_t) * 3 * (size_t)max_nodes;
    const float *pk = pending ? pending->k : NULL, *pd = pending ? pending->delta : NULL;
    const float *pg = pending ? pending->g : NULL;
    const int32_t *pn = pending ? pending->n : NULL;
    float *slots = (float *)cuda_of(be)->workspace;
    for (int head0 = 0; head0 < Hv; head0 += heads_per_launch) {
        const int heads = Hv - head0 < heads_per_launch ? Hv - head0 : heads_per_launch;
        cuda_launch(gdn_defer_steps(be) ? gdn_tree_chains_kernel<KPL, true> : gdn_tree_chains_kernel<KPL, false>,
                    dim3(gdn_grid(S, heads)), dim3(GDN_THREADS), shared, cuda_stream(be), schedule, q, k, v, g, beta,
                    Hk, Hv, S, gdn_scale(S), state, pk, pd, pg, pn, out, delta_out, slots, slots_per_head, smem_slots,
                    head0, max_nodes);
        cuda_note_launch(be, "gdn_tree_chains");
    }
}

extern "C" void cuda_gdn_tree_chains(const backend *be, const int32_t *schedule, const float *q, const float *k,
                                     const float *v, const float *g, const float *beta, int Hk, int Hv, int S,
                                     float *state, const gdn_pending *pending, float *out, float *delta_out) {
    const cuda_backend *cb = cuda_of(be);
    const int kpl = gdn_keys_per_lane(S);
    if (kpl == 0) return refuse(be, "gdn_tree_chains: state size S must be 1 .. 128 on this backend");
    const int max_nodes = cb->limits.max_nodes;
    if (max_nodes < 1) return refuse(be, "gdn_tree_chains: backend created without tree limits (max_nodes 0)");
    const int slots_per_head = gdn_slots_per_head(max_nodes);
    const size_t head_bytes = sizeof(float) * (size_t)slots_per_head * (size_t)S * (size_t)S;
    const size_t fit = head_bytes > 0 ? cb->workspace_bytes / head_bytes : 0;
    if (cb->workspace == NULL || fit == 0)
        return refuse(be, "gdn_tree_chains: workspace smaller than one head's boundary states");
    const int heads_per_launch = fit < (size_t)Hv ? (int)fit : Hv;
#define LAUNCH(KPL)                                                                                                    \
    launch_tree_chains<KPL>(be, schedule, q, k, v, g, beta, Hk, Hv, S, state, pending, out, delta_out,                \
                            heads_per_launch, slots_per_head, max_nodes)
    GDN_DISPATCH(kpl, LAUNCH)
#undef LAUNCH
}

extern "C" void cuda_gdn_tree_root_to_leaf(const backend *be, const int32_t *schedule, const float *q, const float *k,
                                           const float *v, const float *g, const float *beta, int Hk, int Hv, int S,
                                           const float *state, float *out, float *delta_out) {
    const int kpl = gdn_keys_per_lane(S);
    if (kpl == 0) return refuse(be, "gdn_tree_root_to_leaf: state size S must be 1 .. 128 on this backend");
    const int max_nodes = cuda_of(be)->limits.max_nodes;
    if (max_nodes < 1) return refuse(be, "gdn_tree_root_to_leaf: backend created without tree limits (max_nodes 0)");
    const float scale = gdn_scale(S);
    const size_t shared = sizeof(int32_t) * (size_t)max_nodes;
#define LAUNCH(KPL)                                                                                                    \
    cuda_launch(gdn_defer_steps(be) ? gdn_tree_root_to_leaf_kernel<KPL, true>                                          \
                                    : gdn_tree_root_to_leaf_kernel<KPL, false>,                                        \
                dim3(gdn_grid(S, Hv)), dim3(GDN_THREADS), shared, cuda_stream(be), schedule, q, k, v, g, beta, Hk,     \
                Hv, S, scale, state, out, delta_out, max_nodes)
    GDN_DISPATCH(kpl, LAUNCH)
#undef LAUNCH
    cuda_note_launch(be, "gdn_tree_root_to_leaf");
}

extern "C" void cuda_gdn_tree_checkpoints(const backend *be, const int32_t *schedule, const float *q, const float *k,
                                          const float *v, const float *g, const float *beta, int Hk, int Hv, int S,
                                          const float *state, float *out, float *delta_out, float *checkpoints) {
    const int kpl = gdn_keys_per_lane(S);
    if (kpl == 0) return refuse(be, "gdn_tree_checkpoints: state size S must be 1 .. 128 on this backend");
    const int max_nodes = cuda_of(be)->limits.max_nodes;
    if (max_nodes < 1) return refuse(be, "gdn_tree_checkpoints: backend created without tree limits (max_nodes 0)");
    const float scale = gdn_scale(S);
#define LAUNCH(KPL)                                                                                                    \
    cuda_launch(gdn_defer_steps(be) ? gdn_tree_checkpoints_kernel<KPL, true>                                           \
                                    : gdn_tree_checkpoints_kernel<KPL, false>,                                         \
                dim3(gdn_grid(S, Hv)), dim3(GDN_THREADS), 0, cuda_stream(be), schedule, q, k, v, g, beta, Hk, Hv, S,   \
                scale, state, out, delta_out, checkpoints, max_nodes)
    GDN_DISPATCH(kpl, LAUNCH)
#undef LAUNCH
    cuda_note_launch(be, "gdn_tree_checkpoints");
}

/* K <= 4 (the models' 4 taps) keeps the window in 4 registers; larger K up to the ABI's 64 takes
 * the wide instantiation: the same float operations in the same order, so outputs agree. */
#define CONV_DISPATCH(K, LAUNCH)                                                                                       \
    if ((K) <= 4)                                                                                                      \
        LAUNCH(4);                                                                                                     \
    else                                                                                                               \
        LAUNCH(CONV_MAX_K)

static unsigned conv_blocks(int C) { return (unsigned)((C + CONV_THREADS - 1) / CONV_THREADS); }

extern "C" void cuda_causal_conv(const backend *be, const float *x, const float *weight, int T, int C, int K,
                                 float *conv_state, float *y) {
    if (K < 2 || K > CONV_MAX_K) return refuse(be, "causal_conv: kernel size K must be 2 .. 64");
    if (T <= 0 || C <= 0) return;
    const unsigned chunks = (unsigned)((T + CONV_T_CHUNK - 1) / CONV_T_CHUNK);
#define LAUNCH(KMAX)                                                                                                   \
    cuda_launch(causal_conv_kernel<KMAX>, dim3(conv_blocks(C), chunks), dim3(CONV_THREADS), 0, cuda_stream(be), x,     \
                weight, T, C, K, conv_state, y)
    CONV_DISPATCH(K, LAUNCH);
#undef LAUNCH
    cuda_note_launch(be, "causal_conv");
    if (chunks > 1) {
#define LAUNCH(KMAX)                                                                                                   \
    cuda_launch(conv_shift_kernel<KMAX>, dim3(conv_blocks(C)), dim3(CONV_THREADS), 0, cuda_stream(be), conv_state, x,  \
                T, NULL, C, K)
        CONV_DISPATCH(K, LAUNCH);
#undef LAUNCH
        cuda_note_launch(be, "causal_conv (state)");
    }
}

extern "C" void cuda_gdn_prepare(const backend *be, float *beta, float *g, const float *dt_bias, const float *ssm_a,
                                 const float *x, const float *conv_weight, int T, int Hk, int Hv, int S, int K,
                                 float eps, float *conv_state, float *conv_out, float *q, float *k, float *v) {
    if (T <= 0) return;
    if (T > CONV_T_CHUNK || S > NORM_THREADS || K < 2 || K > CONV_MAX_K) { /* the three ops (which refuse a bad K) */
        cuda_gdn_gates(be, beta, g, dt_bias, ssm_a, T, Hv);
        cuda_causal_conv(be, x, conv_weight, T, 2 * Hk * S + Hv * S, K, conv_state, conv_out);
        cuda_gdn_split_qkv(be, conv_out, T, Hk, Hv, S, eps, q, k, v);
        return;
    }
    const unsigned blocks = (unsigned)(gdn_gates_block_index(Hk, Hv, S) + 1);
#define LAUNCH(KMAX)                                                                                                   \
    cuda_launch(gdn_prepare_kernel<KMAX>, dim3(blocks), dim3(NORM_THREADS), 0, cuda_stream(be), beta, g, dt_bias,     \
                ssm_a, x, conv_weight, T, Hk, Hv, S, K, eps, conv_state, conv_out, q, k, v)
    CONV_DISPATCH(K, LAUNCH);
#undef LAUNCH
    cuda_note_launch(be, "gdn_prepare");
}

extern "C" void cuda_conv_tree(const backend *be, const int32_t *schedule, const float *x, const float *weight, int C,
                               int K, const float *conv_state, float *y, float *window_out) {
    if (K < 2 || K > CONV_MAX_K) return refuse(be, "conv_tree: kernel size K must be 2 .. 64");
    const int max_nodes = cuda_of(be)->limits.max_nodes;
    if (max_nodes < 1) return refuse(be, "conv_tree: backend created without tree limits (max_nodes 0)");
    if (C <= 0) return;
#define LAUNCH(KMAX)                                                                                                   \
    cuda_launch(conv_tree_kernel<KMAX>, dim3(conv_blocks(C), (unsigned)max_nodes), dim3(CONV_THREADS), 0,              \
                cuda_stream(be), schedule, x, weight, C, K, conv_state, y, window_out)
    CONV_DISPATCH(K, LAUNCH);
#undef LAUNCH
    cuda_note_launch(be, "conv_tree");
}

extern "C" void cuda_conv_fold(const backend *be, float *conv_state, const float *x, const int32_t *P, int C, int K) {
    if (K < 2 || K > CONV_MAX_K) return refuse(be, "conv_fold: kernel size K must be 2 .. 64");
    if (C <= 0) return;
    /* launched whatever the count: a recorded verify replays it with the count of its step */
#define LAUNCH(KMAX)                                                                                                   \
    cuda_launch(conv_shift_kernel<KMAX>, dim3(conv_blocks(C)), dim3(CONV_THREADS), 0, cuda_stream(be), conv_state, x,  \
                0, P, C, K)
    CONV_DISPATCH(K, LAUNCH);
#undef LAUNCH
    cuda_note_launch(be, "conv_fold");
}
