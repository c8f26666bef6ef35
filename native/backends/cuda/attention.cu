/* The CUDA backend's NEOX RoPE and decode / verify attention (causal and tree), backend.h.
 *
 * RoPE: one block per token, one thread per rotated pair i; theta = pos * base^(-2i/n_rot), cos and
 * sin in double as the CPU oracle does, then the rotation a*c - b*s, a*s + b*c as separate float
 * operations (__fmul_rn / __fsub_rn / __fadd_rn), the oracle's arithmetic.
 *
 * Attention. Query t of head h sees a LOGICAL sequence of cache rows: causal, rows 0..positions[t] of
 * a window that starts at cache row *first_row (device data, 0 without; a DFlash draft's sliding window);
 * tree, rows 0..n_prefix-1 then n_prefix + a for node t's ancestors a root first and t itself (the
 * parent chain is walked on the device; n_prefix is read from device memory, and the grid is sized
 * for max_rows, so one recorded verify serves every prefix length: blocks past n_prefix + T exit). One device function reduces that sequence, indexed by
 * logical position only, so a tree node gives the same bits as the same token decoded causally,
 * and no result depends on T, on the tree shape or on how many blocks a launch has:
 *   - the sequence is cut at fixed logical positions into segments of ATT_SEG rows, each segment
 *     into tiles of ATT_TILE rows;
 *   - a segment's partial (running max m, sum l, weighted V sum acc[D]) is built tile by tile in
 *     tile order: score s = (q . k) * scale, where lane L of a 32-lane group sums q[d] k[d] for
 *     d = L, L+32, ... with fmaf in that order and the 32 lane sums meet in a fixed xor butterfly;
 *     tile max by butterfly (fmaxf, order-free); m' = max(m, tile max), alpha = exp(m - m'),
 *     p = exp(s - m'); l = l*alpha + (butterfly sum of the tile's p); acc[d] = acc[d]*alpha, then
 *     acc[d] = fmaf(p_r, v_r[d], acc[d]) for the tile's rows r in logical order;
 *   - segment partials are merged in segment order starting from (m = -inf, l = 0, acc = 0) by
 *     merge_scales (the same function in both launch shapes), and out = acc / l.
 * With SPECLA_CUDA_ATTENTION_TC=1 (sm_80+, head_dim a multiple of 16) the score's dot product and the
 * weighted V sum are instead 3xTF32 tensor-core MMAs in the order attention_tensor_cores.cuh fixes;
 * everything else above stays, and every kernel of the backend takes the same path, so the identities
 * below hold on either (docs/cuda-attention.md).
 * Two launch shapes compute exactly these operations: SPLIT (flash-decoding: blocks own segments,
 * write partials to the workspace; a second kernel merges them in segment order) whenever the
 * sequence has more than one segment and the workspace holds the partials, else UNSPLIT (one block
 * walks all segments of its query and merges as it goes). Since a partial written to memory and read
 * back is the same float, both shapes give identical bits and the choice may depend on T freely.
 *
 * Thread mapping: a block of ATT_THREADS (4 groups of 32 lanes) reduces a segment for up to HG
 * (query, head) pairs of one KV head (GQA), so each K/V row it loads serves all of them:
 *   - a decode step (T = 1), SPLIT or UNSPLIT, and a batch's UNSPLIT: one query t and HG of its
 *     heads (attention_kernel; HG = 1 or 2 for a decode step, more blocks for its one
 *     query; ATT_MAX_G = 8 for a batch);
 *   - a batch's SPLIT (attention_tile_kernel): a TILE of qt queries x hb heads, hb = min(G, ATT_MAX_G),
 *     qt = ATT_TILE_PAIRS / hb (27B, G = 6: 2 queries x 6 heads), for every segment all the tile's
 *     queries see in full (causal: below the smallest position of the tile + 1; tree: inside the
 *     prefix); the other segments (a causal query's last one, a tree node's ancestors) are reduced
 *     query by query with hb heads each, one block per query. At depth 4096 a 23-token batch reads
 *     each K/V row of the prefix 12 times (once per tile) instead of 23 times.
 * Within segment_partial: scores, group w takes the tile's rows w, w+4, ... (ATT_K_BATCH rows' K
 * loads in flight, each lane holding dims L, L+32, ... of them), every pair's q from shared memory
 * (a query tile's block reduces 4 pairs' lane sums at once, wide_scores: the same bits, fewer shuffles);
 * softmax bookkeeping, group w takes pairs w, w+4, ...; V, thread i owns dims i and i + ATT_THREADS
 * of every pair, its accumulators in registers (HG x 2 floats).
 * Shared memory and registers (sm_90, ptxas): attention_kernel<2> 2.9 KB, 128 registers (4 blocks
 * per SM; 28 bytes spilled); attention_kernel<8> 10.7 KB, 167; attention_tile_kernel<12> 16 KB (q
 * of 12 pairs x 256 dims = 12 KB, scores 12 x 64 = 3 KB) + 8 T bytes for a tree, 128 registers (4
 * blocks per SM; 8 bytes spilled). The compile-time shapes (segment_partial_for) cost registers and
 * took the 27B shape's batch tile (then of 24 pairs) from 2310 to 1731 SASS instructions per K batch
 * (scores) and 1100 to 611 per 8 rows (V).
 * K and V stay in registers (no shared staging): a row is loaded by one group (K) or by every thread
 * for its own dims (V) and used at once for every pair, so staging would add a copy and no reuse. */
#include <math.h>
#include <stdint.h>

#include "cuda_backend.h"
#include "launch.h"
#include "row_math.cuh"
#include "attention_tensor_cores.cuh"
#include "attention_blocked.cuh"

#define SPECLA_WARP 32
#define ATT_THREADS 128
#define ATT_GROUPS (ATT_THREADS / SPECLA_WARP)
#define ATT_TILE 64   /* rows per tile: 2 per lane in the softmax step */
#define ATT_SEG 128   /* rows per segment (a multiple of ATT_TILE): at depth 4096 a decode query has 32
                       * segments per KV head, 128 blocks on the 27B shape (4 KV heads), so the split
                       * launch fills the GPU; 1024 gave 16 blocks and 0.58 ms per layer there */
#define ATT_MAX_G 8   /* query heads per block of a batch */
#define ATT_MAX_SEG_BLOCKS 64 /* blocks along the segments of a SPLIT launch (8192 rows): the grid is sized
                               * for a context's capacity, which a step's rows rarely reach, so past this a
                               * block walks segments x, x + 64, ... in turn (each its own partial: the same
                               * bits) and a large -c costs a shallow step no sea of blocks that only leave */
/* A decode step's (one query's) blocks hold 1 query head each while those blocks fit one wave of
 * ATT_DECODE_RESIDENT a SM (the launch's segments x heads), else 2 heads of one KV head, which read
 * each K/V row for both. On an H100 one head a block saved 1 % of a shallow 27B decode step and two
 * saved 1.5 % at depth 4096 (docs/cuda-attention.md). A shallow recorded decode step is bounded at
 * DECODE_SHALLOW_ROWS rows (8 segments: 192 one-head blocks on the 27B shape), a deep one by the
 * context's capacity. The bits of a head do not depend on the choice. */
#define ATT_DECODE_RESIDENT 4
#define ATT_V_BATCH 16 /* V rows whose loads are issued together */
#define ATT_K_BATCH 4  /* K rows per group whose loads are issued together */
#define ATT_SPLIT_QUERIES 32 /* queries per SPLIT launch: bounds the partials' workspace */
#define ATT_TILE_PAIRS 12 /* (query, head) pairs per block of a batch's shared segments: 2 queries x 6
                           * heads on the 27B shape (G = 6), so each K/V row is read once per 2 queries.
                           * The tile's accumulators (2 x pairs a thread) set its registers: 24 pairs
                           * took 168 and 3 blocks per SM, 12 fit 128 and 4, and the latency-bound walk
                           * gains more from the fourth block than it loses to reading each row twice as
                           * often (docs/perf.md, twenty-second pass) */
#define ATT_SHARE_MIN_ROWS 1024 /* a tile's queries share their common segments once they all see more
                                 * rows than this: below, one block per query and segment (23 queries x 4
                                 * KV heads x at most 8 segments on the 27B shape) keeps them parallel,
                                 * where a shared block's pairs walked the rows longer. A batch bounded at
                                 * DECODE_SHALLOW_ROWS (the same 1024: the core's shallow class) never
                                 * shares, so its launches need no attention_blocked_kernel */
/* resident blocks per SM the tile kernel's registers leave room for: 4 (128 registers; sm_90 and gfx11);
 * sm_75 keeps the 2 it had at 24 pairs, where its ptxas spilled at 3 (no sm_75 GPU has timed either) */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define ATT_TILE_MIN_BLOCKS 2
#else
#define ATT_TILE_MIN_BLOCKS 4
#endif
#define ATT_MAX_D 256 /* head_dim limit: 2 dims per thread */
/* The pair counts the 27B shape's blocks hold, compiled as constants (segment_partial_for): a query's
 * heads of one KV head (G = 24 / 4) in a batch's blocks, 1 or 2 in a decode step's */
#define ATT_QUERY_HEADS_27B 6
/* resident blocks per SM a decode step's kernel keeps (at most 128 registers): at depth 4096 its 408
 * blocks on the 27B shape then fit one wave of 528 (the compile-time pairs took 147 registers and 3
 * blocks per SM); a batch's attention_kernel leaves ptxas free */
#define ATT_KERNEL_MIN_BLOCKS(HG) ((HG) <= 2 ? ATT_DECODE_RESIDENT : 1)
/* The compile-time pair count of attention_kernel's segments (segment_partial_for; 0: the general
 * code alone). SPECLA_CUDA_ATTENTION_DECODE_GENERAL=1 takes a decode step's kernel without it: with
 * the 2-pair shape beside the general code that kernel is 9,224 SASS instructions (144 KB; 128
 * registers, 28 bytes spilled), and Nsight Compute saw its few blocks stalled on instruction fetch
 * for 9.8 of the 22.5 cycles between instructions (H100, docs/perf.md, thirtieth pass); alone, the
 * general code is 4,280 (127 registers, no spills). The same operations in the same order: the same
 * bits either way. */
#define ATT_KERNEL_FIXED_PAIRS(HG) ((HG) <= 2 ? (HG) : ATT_QUERY_HEADS_27B)
#define ATT_DIMS_PER_THREAD 2 /* ATT_MAX_D / ATT_THREADS: dims tid and tid + ATT_THREADS */
#define ATT_DIMS_PER_LANE (ATT_MAX_D / SPECLA_WARP)

/* ---- RoPE ---------------------------------------------------------------------------------------- */

/* Pair i (< n_rot / 2) of one head's row xh at `position`: the one rotation of both RoPE kernels. */
static __device__ __forceinline__ void rope_neox_pair(float *xh, int i, int n_rot, int position, float freq_base) {
    const int half = n_rot / 2;
    const double theta = (double)position * pow((double)freq_base, -2.0 * i / n_rot);
    const float c = (float)cos(theta), s = (float)sin(theta);
    const float a = xh[i], b = xh[i + half];
    xh[i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    xh[i + half] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
}

/* Block (t, h): one head of one token. Every block computes its pairs' angles itself (the same
 * double-precision values for every head), so a decode step's rotation is n_heads blocks wide
 * instead of one block walking the heads after a serial trig latency per pair. */
static __global__ void rope_neox_kernel(float *x, const int32_t *positions, int n_heads, int head_dim, int n_rot,
                                        float freq_base) {
    grid_begin();
    const int t = blockIdx.x, h = blockIdx.y;
    float *xh = x + ((int64_t)t * n_heads + h) * head_dim;
    for (int i = threadIdx.x; i < n_rot / 2; i += blockDim.x) rope_neox_pair(xh, i, n_rot, positions[t], freq_base);
}

extern "C" void cuda_rope_neox(const backend *be, float *x, const int32_t *positions, int T, int n_heads,
                               int head_dim, int n_rot, float freq_base) {
    if (T <= 0 || n_rot < 2) return;
    if (n_heads <= 0) return;
    cuda_launch(rope_neox_kernel, dim3(T, n_heads), dim3(64), 0, cuda_stream(be), x, positions, n_heads, head_dim,
                n_rot, freq_base);
    cuda_note_launch(be, "rope_neox");
}

/* ---- the attention inputs in one kernel (attention_prepare) ------------------------------------------
 * One warp per (token t, head row): rows 0 .. nh - 1 of a token are its query heads, nh .. nh + nkv - 1
 * its key heads, then its value heads. A query or key row is read into registers as quads (lane l
 * owns quads l, l + 32, ...: rms_rows_kernel's 32-lane mapping), normed with that kernel's order
 * (add_squares over the lane's quads in ascending order, group_sum, rms_scale, scaled_quad), put
 * in shared memory, rotated pair by pair with rope_neox_pair, and
 * stored: q in place (or from the [query | gate] projection, whose gate half the warp copies out),
 * k in place and into its cache row. A value row is copied into its cache row. Every value is
 * computed by the functions of split_q_gate, rms_norm, rope_neox and scatter_rows, so the bits are
 * theirs; the seven launches of a layer become one. Rows of at most ATT_PREPARE_MAX_D floats, a
 * multiple of 4, 16-byte aligned (cuda_attention_prepare says whether it ran). */
#define ATT_PREPARE_MAX_D 512 /* 4 quads a lane: the 32-lane norm's whole row in registers */
#define ATT_PREPARE_QUADS (ATT_PREPARE_MAX_D / 4 / SPECLA_WARP)
static __global__ void __launch_bounds__(SPECLA_WARP)
    attention_prepare_kernel(const float *qg, float *q, float *gate, float *k, const float *v, const float *q_norm,
                             const float *k_norm, float eps, const int32_t *positions, int n_rot, float freq_base,
                             const int32_t *rows, int nh, int nkv, int D, float *k_cache, float *v_cache) {
    grid_begin();
    __shared__ __align__(16) float row[ATT_PREPARE_MAX_D];
    const int t = blockIdx.x, head = blockIdx.y, lane = threadIdx.x, n_quads = D / 4;
    const int64_t kv_row = (int64_t)nkv * D;
    if (head >= nh + nkv) { /* a value head: its row into the cache */
        const int j = head - nh - nkv;
        const float4 *src = reinterpret_cast<const float4 *>(v + (int64_t)t * kv_row + (int64_t)j * D);
        float4 *dst = reinterpret_cast<float4 *>(v_cache + (int64_t)rows[t] * kv_row + (int64_t)j * D);
        for (int e = lane; e < n_quads; e += SPECLA_WARP) dst[e] = src[e];
        return;
    }
    const bool is_q = head < nh;
    const int j = is_q ? head : head - nh;
    float *out = is_q ? q + ((int64_t)t * nh + j) * D : k + (int64_t)t * kv_row + (int64_t)j * D;
    const float *src = out, *weight = is_q ? q_norm : k_norm;
    if (is_q && qg) {
        src = qg + ((int64_t)t * nh + j) * 2 * D;
        const float4 *gsrc = reinterpret_cast<const float4 *>(src + D);
        float4 *gdst = reinterpret_cast<float4 *>(gate + ((int64_t)t * nh + j) * D);
        for (int e = lane; e < n_quads; e += SPECLA_WARP) gdst[e] = gsrc[e];
    }
    float4 x[ATT_PREPARE_QUADS];
#pragma unroll
    for (int c = 0; c < ATT_PREPARE_QUADS; c++) {
        const int e = lane + c * SPECLA_WARP;
        if (e < n_quads) x[c] = reinterpret_cast<const float4 *>(src)[e];
    }
    if (weight) {
        float s = 0.0f;
#pragma unroll
        for (int c = 0; c < ATT_PREPARE_QUADS; c++)
            if (lane + c * SPECLA_WARP < n_quads) s = add_squares(s, x[c]);
        const float scale = rms_scale(group_sum(s), D, eps);
#pragma unroll
        for (int c = 0; c < ATT_PREPARE_QUADS; c++) {
            const int e = lane + c * SPECLA_WARP;
            if (e >= n_quads) continue;
            const float4 w = reinterpret_cast<const float4 *>(weight)[e];
            x[c] = scaled_quad(x[c], scale, weight, w, false, w); /* ungated: the last operand is unread */
        }
    }
#pragma unroll
    for (int c = 0; c < ATT_PREPARE_QUADS; c++) {
        const int e = lane + c * SPECLA_WARP;
        if (e < n_quads) reinterpret_cast<float4 *>(row)[e] = x[c];
    }
    __syncwarp();
    for (int i = lane; i < n_rot / 2; i += SPECLA_WARP) rope_neox_pair(row, i, n_rot, positions[t], freq_base);
    __syncwarp();
    float4 *cache = is_q ? nullptr : reinterpret_cast<float4 *>(k_cache + (int64_t)rows[t] * kv_row + (int64_t)j * D);
    for (int e = lane; e < n_quads; e += SPECLA_WARP) {
        const float4 value = reinterpret_cast<const float4 *>(row)[e];
        reinterpret_cast<float4 *>(out)[e] = value;
        if (cache) cache[e] = value;
    }
}

extern "C" int cuda_attention_prepare(const backend *be, const float *qg, float *q, float *gate, float *k,
                                      const float *v, const float *q_norm, const float *k_norm, float eps,
                                      const int32_t *positions, int n_rot, float freq_base, const int32_t *rows, int T,
                                      int nh, int nkv, int D, float *k_cache, float *v_cache) {
    if (T <= 0) return 1;
    if (D <= 0 || D > ATT_PREPARE_MAX_D || D % 4 != 0 || n_rot > D || nh <= 0 || nkv <= 0 ||
        (q_norm == NULL) != (k_norm == NULL))
        return 0;
    const void *pointers[] = {qg, q, gate, k, v, q_norm, k_norm, k_cache, v_cache};
    for (const void *p : pointers)
        if (!cuda_aligned16(p)) return 0;
    if (qg && !gate) return 0;
    cuda_launch(attention_prepare_kernel, dim3(T, nh + 2 * nkv), dim3(SPECLA_WARP), 0, cuda_stream(be), qg, q, gate, k,
                v, q_norm, k_norm, eps, positions, n_rot < 2 ? 0 : n_rot, freq_base, rows, nh, nkv, D, k_cache,
                v_cache);
    cuda_note_launch(be, "attention_prepare");
    return 1;
}

/* ---- attention ----------------------------------------------------------------------------------- */

/* group_sum (row_math.cuh) adds a 32-lane group's values by the fixed xor butterfly; group_max the same for the max */
static __device__ __forceinline__ float group_max(float v) {
    for (int m = SPECLA_WARP / 2; m > 0; m >>= 1) v = fmaxf(v, SPECLA_SHFL_XOR(v, m));
    return v;
}

/* Merge a partial (m, l) into the running (M, L): scales a (old) and b (new) for the weighted sums. */
static __device__ __forceinline__ void merge_scales(float M, float L, float m, float l, float *M_out, float *L_out,
                                                    float *a, float *b) {
    const float Mn = fmaxf(M, m);
    *a = M == -INFINITY ? 0.0f : expf(M - Mn);
    *b = m == -INFINITY ? 0.0f : expf(m - Mn);
    *M_out = Mn;
    *L_out = __fadd_rn(__fmul_rn(L, *a), __fmul_rn(l, *b));
}

template <int HG> struct att_shared {
    float q[HG * ATT_MAX_D];
    alignas(16) float p[HG][ATT_TILE]; /* scores, then probabilities of the current tile (float4 reads) */
    int32_t rows[ATT_TILE];       /* physical cache rows of the current tile */
    float m[HG], l[HG], alpha[HG]; /* the segment's running state */
    float M[HG], L[HG], a[HG], b[HG]; /* merged over segments (unsplit) */
    int n_rows, n_direct;
};

/* Physical row of logical position i: the first n_direct positions are rows 0..n_direct-1, the rest
 * n_direct + chain[i - n_direct] (causal: n_direct = n_rows, no chain). */
static __device__ __forceinline__ int32_t logical_row(int i, int n_direct, const int32_t *chain) {
    return i < n_direct ? i : n_direct + chain[i - n_direct];
}

/* Compile-time shapes. A segment's code is instantiated for the shapes that carry the work (the
 * 27B shape's query tile of 12 pairs and a query's 6 or 2 heads, head_dim 256, whole tiles of
 * ATT_TILE rows) besides the general one: with the pair count, head_dim and tile length known, the
 * per-pair, per-dim and per-row guards of the loops disappear and a pair's probabilities are read 4
 * rows at a time. NG / DD = 0: taken from the arguments at run time; FULL: tile_n == ATT_TILE (only
 * with NG and DD fixed: segment_partial). The operations and their order are the same in every
 * instantiation (each guard only skips work past the shape), so the bits are those of the general
 * code. */
template <int NG, int DD, bool FULL> struct att_shape {
    static_assert(!FULL || (NG > 0 && DD > 0), "whole tiles are compiled with the pairs and head_dim fixed");
    static constexpr bool full = FULL;
    int ng_rt, D_rt, tile_n_rt;
    __device__ __forceinline__ int ng() const { return NG ? NG : ng_rt; }
    __device__ __forceinline__ int D() const { return DD ? DD : D_rt; }
    __device__ __forceinline__ int tile_n() const { return FULL ? ATT_TILE : tile_n_rt; }
};

/* Scores of a group's ATT_K_BATCH rows i0, i0 + 4, ... for all ng pairs of a wide block (a query
 * tile), ATT_WIDE_ITEMS = 4 pairs at a time: each (pair, row) lane sum is the same fmaf chain over
 * d = L, L + 32, ... as in tile_scores; the 4 pairs' lane sums of one row are then reduced
 * together by two halving steps (xor 16, 8: a lane keeps the half of the pairs its lane bit selects
 * and adds its partner's value of those to its own) and three butterfly steps (xor 4, 2, 1). Every
 * step adds, for each pair, the values of lanes L and L ^ m, in group_sum's step order, so each pair's
 * sum has group_sum's bits (IEEE addition is commutative: which lane of the two adds does not matter),
 * with 6 shuffles for 4 pairs instead of 20. Lane L ends with pair g0 + ((L >> 3) & 3). (8 pairs at a
 * time spilled: 32 lane sums next to 32 K values and the tile's 48 accumulators.) */
#define ATT_WIDE_ITEMS 4
template <int HG, class Shape>
static __device__ __forceinline__ void wide_scores(att_shared<HG> &sh, const float (&kv)[ATT_K_BATCH][ATT_DIMS_PER_LANE],
                                                   int lane, const Shape &shape, float scale, int i0) {
    static_assert(HG % ATT_WIDE_ITEMS == 0, "a wide block's pairs come in groups of ATT_WIDE_ITEMS");
    static_assert(SPECLA_WARP == 32, "the halving steps are xor 16, 8");
    const int ng = shape.ng(), D = shape.D(), tile_n = shape.tile_n();
    const bool hi16 = lane & 16, hi8 = lane & 8;
#pragma unroll
    for (int g0 = 0; g0 < HG; g0 += ATT_WIDE_ITEMS) {
        if (g0 >= ng) continue;
        float dot[ATT_WIDE_ITEMS][ATT_K_BATCH];
#pragma unroll
        for (int c = 0; c < ATT_WIDE_ITEMS; c++)
#pragma unroll
            for (int u = 0; u < ATT_K_BATCH; u++) dot[c][u] = 0.0f;
#pragma unroll
        for (int c = 0; c < ATT_WIDE_ITEMS; c++) {
            if (g0 + c >= ng) continue; /* a pair past ng: its sum stays 0 and is not stored */
#pragma unroll
            for (int j = 0; j < ATT_DIMS_PER_LANE; j++) {
                const int d = lane + SPECLA_WARP * j;
                if (d < D) {
                    const float qd = sh.q[(g0 + c) * D + d];
#pragma unroll
                    for (int u = 0; u < ATT_K_BATCH; u++) dot[c][u] = fmaf(qd, kv[u][j], dot[c][u]);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < ATT_K_BATCH; u++) {
            float x[2];
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const float send = hi16 ? dot[c][u] : dot[c + 2][u], keep = hi16 ? dot[c + 2][u] : dot[c][u];
                x[c] = __fadd_rn(keep, SPECLA_SHFL_XOR(send, 16));
            }
            const float send = hi8 ? x[0] : x[1], keep = hi8 ? x[1] : x[0];
            float sum = __fadd_rn(keep, SPECLA_SHFL_XOR(send, 8));
            sum = __fadd_rn(sum, SPECLA_SHFL_XOR(sum, 4));
            sum = __fadd_rn(sum, SPECLA_SHFL_XOR(sum, 2));
            sum = __fadd_rn(sum, SPECLA_SHFL_XOR(sum, 1));
            const int pair = g0 + ((lane >> 3) & 3), row = i0 + ATT_GROUPS * u;
            if ((lane & 7) == 0 && pair < ng && row < tile_n) sh.p[pair][row] = __fmul_rn(sum, scale);
        }
    }
}

/* The scores of a tile's rows for the block's pairs, into sh.p: group grp takes rows grp, grp + 4,
 * ..., ATT_K_BATCH of them at a time (their K loads in flight together); each (row, pair) dot is the
 * same fmaf chain and butterfly. */
template <int HG, class Shape>
static __device__ __forceinline__ void tile_scores(att_shared<HG> &sh, const float *k_cache, int64_t row_stride, int kvh,
                                                   const Shape &shape, float scale) {
    const int tid = threadIdx.x, lane = tid % SPECLA_WARP, grp = tid / SPECLA_WARP;
    const int ng = shape.ng(), D = shape.D(), tile_n = shape.tile_n();
    for (int i0 = grp; i0 < tile_n; i0 += ATT_GROUPS * ATT_K_BATCH) {
        float kv[ATT_K_BATCH][ATT_DIMS_PER_LANE];
#pragma unroll
        for (int u = 0; u < ATT_K_BATCH; u++) {
            const int i = i0 + ATT_GROUPS * u;
            const float *kr = k_cache + (int64_t)sh.rows[i < tile_n ? i : i0] * row_stride + (int64_t)kvh * D;
#pragma unroll
            for (int j = 0; j < ATT_DIMS_PER_LANE; j++) {
                const int d = lane + SPECLA_WARP * j;
                kv[u][j] = i < tile_n && d < D ? kr[d] : 0.0f;
            }
        }
        if constexpr (HG > ATT_MAX_G) { /* a query tile's many pairs: their sums reduced together */
            wide_scores(sh, kv, lane, shape, scale, i0);
        } else {
#pragma unroll
            for (int g = 0; g < HG; g++) {
                if (g >= ng) continue; /* not break: a loop with one exit unrolls fully for HIP too */
                float dot[ATT_K_BATCH];
#pragma unroll
                for (int u = 0; u < ATT_K_BATCH; u++) {
                    dot[u] = 0.0f;
#pragma unroll
                    for (int j = 0; j < ATT_DIMS_PER_LANE; j++) {
                        const int d = lane + SPECLA_WARP * j;
                        if (d < D) dot[u] = fmaf(sh.q[g * D + d], kv[u][j], dot[u]);
                    }
                }
#pragma unroll
                for (int u = 0; u < ATT_K_BATCH; u++) dot[u] = group_sum(dot[u]);
                if (lane == 0) {
#pragma unroll
                    for (int u = 0; u < ATT_K_BATCH; u++)
                        if (i0 + ATT_GROUPS * u < tile_n) sh.p[g][i0 + ATT_GROUPS * u] = __fmul_rn(dot[u], scale);
                }
            }
        }
    }
}

/* The tile's weighted V into acc: thread tid owns dims tid, tid + ATT_THREADS of every pair; each
 * accumulator takes its rows in logical order, acc = fmaf(p_r, v_r[d], acc). A batch of rows' V
 * loads is issued first (all in flight), then the FMAs; a whole tile of compile-time pairs reads a
 * pair's probabilities 4 rows at a time (float4) and runs its rows' FMAs pair by pair, which is
 * each accumulator's same sequence. */
template <int HG, class Shape>
static __device__ __forceinline__ void tile_values(att_shared<HG> &sh, const float *v_cache, int64_t row_stride, int kvh,
                                                   const Shape &shape, float (&acc)[HG][ATT_DIMS_PER_THREAD]) {
    const int tid = threadIdx.x, ng = shape.ng(), D = shape.D(), tile_n = shape.tile_n();
    if (tid >= D) return;
    const float *vbase = v_cache + (int64_t)kvh * D + tid;
    const bool second = tid + ATT_THREADS < D;
    /* rows whose loads are in flight together: fewer when many heads keep the registers busy
     * (how many loads are batched does not change any FMA or its order) */
    constexpr int VB = HG > ATT_MAX_G ? ATT_V_BATCH / 2 : ATT_V_BATCH;
    constexpr bool whole = Shape::full;
    for (int i0 = 0; i0 < tile_n; i0 += VB) {
        float v0[VB], v1[VB];
#pragma unroll
        for (int u = 0; u < VB; u++) {
            const bool live = whole || i0 + u < tile_n;
            const float *vr = vbase + (int64_t)sh.rows[live ? i0 + u : i0] * row_stride;
            v0[u] = live ? vr[0] : 0.0f;
            v1[u] = live && second ? vr[ATT_THREADS] : 0.0f;
        }
        if constexpr (whole) {
            static_assert(VB % 4 == 0, "a pair's probabilities are read 4 rows at a time");
#pragma unroll
            for (int g = 0; g < HG; g++) {
                if (g >= ng) continue;
#pragma unroll
                for (int u4 = 0; u4 < VB; u4 += 4) {
                    const float4 p4 = *reinterpret_cast<const float4 *>(&sh.p[g][i0 + u4]);
                    const float pr[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
                    for (int u = 0; u < 4; u++) {
                        acc[g][0] = fmaf(pr[u], v0[u4 + u], acc[g][0]);
                        if (second) acc[g][1] = fmaf(pr[u], v1[u4 + u], acc[g][1]);
                    }
                }
            }
        } else {
#pragma unroll
            for (int u = 0; u < VB; u++) {
                if (i0 + u >= tile_n) break;
#pragma unroll
                for (int g = 0; g < HG; g++) {
                    if (g < ng) {
                        const float pg = sh.p[g][i0 + u];
                        acc[g][0] = fmaf(pg, v0[u], acc[g][0]);
                        if (second) acc[g][1] = fmaf(pg, v1[u], acc[g][1]);
                    }
                }
            }
        }
    }
}

/* The softmax bookkeeping of one pair's tile of scores p[0 .. tile_n) (lanes of one 32-lane group
 * call it together): the running max m and sum l, the scale alpha of the accumulators, the scores
 * replaced by their weights (p[lane], p[lane + 32]). Every kernel's softmax is this function. */
static __device__ __forceinline__ void softmax_tile_pair(float *p, float *m, float *l, float *alpha, int tile_n,
                                                         int lane) {
    const float s0 = lane < tile_n ? p[lane] : -INFINITY;
    const float s1 = lane + SPECLA_WARP < tile_n ? p[lane + SPECLA_WARP] : -INFINITY;
    const float m_old = *m;
    const float m_new = fmaxf(m_old, group_max(fmaxf(s0, s1)));
    const float a = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
    const float p0 = lane < tile_n ? expf(s0 - m_new) : 0.0f;
    const float p1 = lane + SPECLA_WARP < tile_n ? expf(s1 - m_new) : 0.0f;
    p[lane] = p0;
    p[lane + SPECLA_WARP] = p1;
    const float tile_sum = group_sum(__fadd_rn(p0, p1));
    if (lane == 0) {
        *l = __fadd_rn(__fmul_rn(*l, a), tile_sum);
        *m = m_new;
        *alpha = a;
    }
}

/* The softmax bookkeeping of a tile's scores in sh.p: group grp takes pairs grp, grp + 4, ... */
template <int HG>
static __device__ __forceinline__ void tile_softmax(att_shared<HG> &sh, int ng, int tile_n, int lane, int grp) {
    for (int g = grp; g < ng; g += ATT_GROUPS) softmax_tile_pair(sh.p[g], &sh.m[g], &sh.l[g], &sh.alpha[g], tile_n, lane);
}

/* One tile of a segment, whatever the arithmetic: its physical rows, then scores() (into sh.p),
 * the softmax bookkeeping, values() (the accumulators scaled by alpha and the tile's weighted V added),
 * each phase after a block barrier. */
template <int HG, class Scores, class Values>
static __device__ __forceinline__ void tile_walk(att_shared<HG> &sh, const int32_t *chain, int tile, int tile_n, int ng,
                                                 Scores scores, Values values) {
    const int tid = threadIdx.x;
    if (tid < tile_n) sh.rows[tid] = logical_row(tile + tid, sh.n_direct, chain);
    __syncthreads();
    scores();
    __syncthreads();
    tile_softmax(sh, ng, tile_n, tid % SPECLA_WARP, tid / SPECLA_WARP);
    __syncthreads();
    values();
    __syncthreads(); /* rows and p are rewritten by the next tile */
}

/* One tile of a segment on the fp32 path. */
template <int HG, class Shape>
static __device__ __forceinline__ void tile_step(att_shared<HG> &sh, const int32_t *chain, const float *k_cache,
                                                 const float *v_cache, int64_t row_stride, int kvh, const Shape &shape,
                                                 float scale, int tile, float (&acc)[HG][ATT_DIMS_PER_THREAD]) {
    const int ng = shape.ng();
    tile_walk(
        sh, chain, tile, shape.tile_n(), ng, [&] { tile_scores(sh, k_cache, row_stride, kvh, shape, scale); },
        [&] {
#pragma unroll
            for (int g = 0; g < HG; g++)
#pragma unroll
                for (int j = 0; j < ATT_DIMS_PER_THREAD; j++)
                    if (g < ng) acc[g][j] = __fmul_rn(acc[g][j], sh.alpha[g]);
            tile_values(sh, v_cache, row_stride, kvh, shape, acc);
        });
}

/* The partial of segment `seg` for the block's pairs: m, l in sh, acc in the caller's registers.
 * NG, DD: the pair count and head_dim when the caller knows them at compile time (0: ng, D). */
template <int HG, int NG = 0, int DD = 0>
static __device__ __forceinline__ void segment_partial(att_shared<HG> &sh, const int32_t *chain, const float *k_cache,
                                                       const float *v_cache, int nkv, int kvh, int D, int ng,
                                                       float scale, int seg, float (&acc)[HG][ATT_DIMS_PER_THREAD]) {
    static_assert(NG <= HG, "a block holds at most HG pairs");
    const int tid = threadIdx.x;
    const int64_t row_stride = (int64_t)nkv * D;
    if (tid < HG) sh.m[tid] = -INFINITY, sh.l[tid] = 0.0f;
#pragma unroll
    for (int g = 0; g < HG; g++)
#pragma unroll
        for (int j = 0; j < ATT_DIMS_PER_THREAD; j++) acc[g][j] = 0.0f;
    const int seg_end = min((seg + 1) * ATT_SEG, sh.n_rows);
    for (int tile = seg * ATT_SEG; tile < seg_end; tile += ATT_TILE) {
        const int tile_n = min(ATT_TILE, seg_end - tile);
        if constexpr (NG > 0 && DD > 0) {
            if (tile_n == ATT_TILE) {
                tile_step(sh, chain, k_cache, v_cache, row_stride, kvh, att_shape<NG, DD, true>{ng, D, tile_n}, scale,
                          tile, acc);
                continue;
            }
        }
        tile_step(sh, chain, k_cache, v_cache, row_stride, kvh, att_shape<NG, DD, false>{ng, D, tile_n}, scale, tile,
                  acc);
    }
}

/* segment_partial with NG pairs and head_dim ATT_MAX_D at compile time when NG > 0 and the block has
 * them (the 27B shape's pair counts: every Qwen3.5/3.6 attention layer has head_dim 256), else the
 * general code; both give the same bits. */
template <int HG, int NG>
static __device__ __forceinline__ void segment_partial_for(att_shared<HG> &sh, const int32_t *chain, const float *k_cache,
                                                           const float *v_cache, int nkv, int kvh, int D, int ng,
                                                           float scale, int seg, float (&acc)[HG][ATT_DIMS_PER_THREAD]) {
    if constexpr (NG > 0) {
        if (ng == NG && D == ATT_MAX_D) {
            segment_partial<HG, NG, ATT_MAX_D>(sh, chain, k_cache, v_cache, nkv, kvh, D, ng, scale, seg, acc);
            return;
        }
    }
    segment_partial<HG>(sh, chain, k_cache, v_cache, nkv, kvh, D, ng, scale, seg, acc);
}

/* ---- the same segment on the tensor cores (attention_tensor_cores.cuh; SPECLA_CUDA_ATTENTION_TC=1) ----
 * The rows, the softmax bookkeeping, the segments' merge and everything around a segment are the
 * fp32 path's; the scores and the weighted V sums are 3xTF32 MMAs with the block's pairs as the M
 * rows. A segment's accumulators live in the warps' C fragments and reach the caller's per-thread
 * layout (dims tid, tid + ATT_THREADS) through shared memory at its end, so store_partials and the
 * unsplit merge take them unchanged. */

/* The split queries (pair rows of head_dim + ATT_TC_Q_PAD words), then, once a segment's tiles are
 * done, the staging of its accumulators (pair rows of head_dim floats) in the same bytes. */
template <int HG> union alignas(16) att_tc_shared {
    struct {
        uint32_t hi[HG * (ATT_MAX_D + ATT_TC_Q_PAD)], lo[HG * (ATT_MAX_D + ATT_TC_Q_PAD)];
    } q;
    float stage[HG * ATT_MAX_D];
};

/* The tensor-core kernels' own shared memory: declared only in the instantiations that call this,
 * so the fp32 kernels' footprint (and resident blocks) stay as they are. */
template <int HG> static __device__ __forceinline__ att_tc_shared<HG> &att_tc_area() {
    __shared__ att_tc_shared<HG> area;
    return area;
}

/* Tile row i's V (at its KV head); past the tile's rows its last row (where p is 0): att_tc_values's v_row */
struct att_tc_tile_rows {
    const float *v;
    const int32_t *rows;
    int64_t stride;
    int tile_n;
    __host__ __device__ const float *operator()(int i) const { return v + (int64_t)rows[i < tile_n ? i : tile_n - 1] * stride; }
};

template <int HG>
static __device__ __forceinline__ void tc_tile_step(att_shared<HG> &sh, const att_tc_shared<HG> &tc, const int32_t *chain,
                                                    const float *k_cache, const float *v_cache, int64_t row_stride,
                                                    int kvh, int D, int ng, float scale, int tile, int tile_n,
                                                    float (&acc)[ATT_TC_NTILES][4]) {
    const int lane = threadIdx.x % SPECLA_WARP, warp = threadIdx.x / SPECLA_WARP;
    tile_walk(
        sh, chain, tile, tile_n, ng,
        [&] {
            /* warp w: tile rows 16w .. 16w + 15; this lane's K rows 16w + 8n + g */
            const int g = lane >> 2, t = lane & 3;
            const float *k_row[2];
#pragma unroll
            for (int n = 0; n < 2; n++) {
                const int i = 16 * warp + 8 * n + g; /* past the tile's rows: its last row, scores not stored */
                k_row[n] = k_cache + (int64_t)sh.rows[i < tile_n ? i : tile_n - 1] * row_stride + (int64_t)kvh * D;
            }
            float s[2][4];
            att_tc_scores(s, tc.q.hi, tc.q.lo, D + ATT_TC_Q_PAD, HG, k_row, D, lane);
#pragma unroll
            for (int n = 0; n < 2; n++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const int pair = g + 8 * (c >> 1), row = 16 * warp + 8 * n + 2 * t + (c & 1);
                    if (pair < ng && row < tile_n) sh.p[pair][row] = __fmul_rn(s[n][c], scale);
                }
        },
        [&] {
#pragma unroll
            for (int j = 0; j < ATT_TC_NTILES; j++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const int pair = att_tc_acc_pair(lane, c);
                    acc[j][c] = __fmul_rn(acc[j][c], pair < ng ? sh.alpha[pair] : 0.0f);
                }
            if (ATT_TC_WARP_DIMS * warp < D)
                att_tc_values(acc, &sh.p[0][0], ATT_TILE, HG,
                              att_tc_tile_rows{v_cache + (int64_t)kvh * D, sh.rows, row_stride, tile_n},
                              ATT_TC_WARP_DIMS * warp, D, lane);
        });
}

/* segment_partial on the tensor cores: the same outputs (m, l in sh, acc in the per-thread layout). */
template <int HG>
static __device__ __forceinline__ void segment_partial_tc(att_shared<HG> &sh, const int32_t *chain, const float *k_cache,
                                                          const float *v_cache, int nkv, int kvh, int D, int ng,
                                                          float scale, int seg, float (&out)[HG][ATT_DIMS_PER_THREAD]) {
    static_assert(HG <= ATT_TC_PAIRS, "the block's pairs are one MMA's 16 rows");
    att_tc_shared<HG> &tc = att_tc_area<HG>();
    const int tid = threadIdx.x, lane = tid % SPECLA_WARP, warp = tid / SPECLA_WARP;
    const int64_t row_stride = (int64_t)nkv * D;
    const int q_stride = D + ATT_TC_Q_PAD;
    for (int i = tid; i < ng * D; i += ATT_THREADS) {
        const int g = i / D, d = i % D;
        att_tc_split(sh.q[i], tc.q.hi[g * q_stride + d], tc.q.lo[g * q_stride + d]);
    }
    if (tid < HG) sh.m[tid] = -INFINITY, sh.l[tid] = 0.0f;
    float acc[ATT_TC_NTILES][4];
#pragma unroll
    for (int j = 0; j < ATT_TC_NTILES; j++)
#pragma unroll
        for (int c = 0; c < 4; c++) acc[j][c] = 0.0f;
    /* the first tile's barrier (after its rows) publishes the split queries and m, l */
    const int seg_end = min((seg + 1) * ATT_SEG, sh.n_rows);
    for (int tile = seg * ATT_SEG; tile < seg_end; tile += ATT_TILE)
        tc_tile_step(sh, tc, chain, k_cache, v_cache, row_stride, kvh, D, ng, scale, tile, min(ATT_TILE, seg_end - tile),
                     acc);
    /* each tile ends with a barrier: the split queries are read no more, their bytes take the stage */
    if (ATT_TC_WARP_DIMS * warp < D) {
#pragma unroll
        for (int j = 0; j < ATT_TC_NTILES; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int pair = att_tc_acc_pair(lane, c), d = att_tc_acc_dim(ATT_TC_WARP_DIMS * warp, lane, j, c);
                if (pair < ng && d < D) tc.stage[pair * D + d] = acc[j][c];
            }
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < HG; g++)
#pragma unroll
        for (int j = 0; j < ATT_DIMS_PER_THREAD; j++) {
            const int d = tid + ATT_THREADS * j;
            out[g][j] = g < ng && d < D ? tc.stage[g * D + d] : 0.0f;
        }
    __syncthreads(); /* the stage's bytes are the next segment's split queries */
}

/* A segment's partial by the arithmetic the launch picked: the tensor cores' (TC) or the fp32 path's */
template <int HG, int NG, bool TC>
static __device__ __forceinline__ void att_segment(att_shared<HG> &sh, const int32_t *chain, const float *k_cache,
                                                   const float *v_cache, int nkv, int kvh, int D, int ng, float scale,
                                                   int seg, float (&acc)[HG][ATT_DIMS_PER_THREAD]) {
    if constexpr (TC)
        segment_partial_tc<HG>(sh, chain, k_cache, v_cache, nkv, kvh, D, ng, scale, seg, acc);
    else
        segment_partial_for<HG, NG>(sh, chain, k_cache, v_cache, nkv, kvh, D, ng, scale, seg, acc);
}

/* Query t's logical sequence, set by one thread of the block: a tree node (parents = the block's
 * shared copy) sees rows 0..n_prefix-1 then its ancestors and itself, written to `chain` root first;
 * a causal query (parents NULL) rows 0..positions[t]. */
template <int HG>
static __device__ __forceinline__ void query_rows(att_shared<HG> &sh, const int32_t *parents, int32_t *chain, int t,
                                                  int n_prefix, const int32_t *positions) {
    if (parents) {
        int n = 0;
        for (int a = t; a >= 0; a = parents[a]) n++;
        int i = n;
        for (int a = t; a >= 0; a = parents[a]) chain[--i] = a;
        sh.n_rows = n_prefix + n;
        sh.n_direct = n_prefix;
    } else {
        sh.n_rows = positions[t] + 1;
        sh.n_direct = sh.n_rows;
    }
}

/* A segment's partials of the block's first `count` heads (or query-head pairs) to the SPLIT
 * workspace: (m, l) from sh, acc from the caller's registers; entry g goes to slot slot_of(g) (a slot
 * is one (query, head, segment)). */
template <int HG, class SlotOf>
static __device__ __forceinline__ void store_partials(const att_shared<HG> &sh, const float (&acc)[HG][ATT_DIMS_PER_THREAD],
                                                      int count, int D, SlotOf slot_of, float *part_acc, float *part_ml) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int g = 0; g < HG; g++) {
        if (g >= count) continue;
        const int64_t slot = slot_of(g);
        if (tid == 0) part_ml[2 * slot] = sh.m[g], part_ml[2 * slot + 1] = sh.l[g];
#pragma unroll
        for (int j = 0; j < ATT_DIMS_PER_THREAD; j++) {
            const int d = tid + ATT_THREADS * j;
            if (d < D) part_acc[slot * D + d] = acc[g][j];
        }
    }
}

/* A causal window's start (first_row: one int in device memory, NULL for 0): the cache pointers move
 * to its first row, so logical position i is row first + i and the reduction is that of a cache
 * starting there. Read after grid_begin: the value was uploaded before the launch, in stream order. */
static __device__ __forceinline__ void window_start(const int32_t *first_row, int nkv, int D, const float **k_cache,
                                                    const float **v_cache) {
    if (!first_row) return;
    const int64_t offset = (int64_t)*first_row * nkv * D;
    *k_cache += offset;
    *v_cache += offset;
}

/* Block (x, kvh * n_hgroups + hg, t). seg_blocks > 0: SPLIT, block x computes segments x, x +
 * seg_blocks, ... and writes their partials; seg_blocks == 0: UNSPLIT, one block per (t, heads) walks
 * every segment and writes out. Tree mode when parents != NULL (chain walked into dynamic shared
 * memory: 2 * T ints). */
template <int HG, bool TC, int FIXED>
static __global__ void __launch_bounds__(ATT_THREADS, ATT_KERNEL_MIN_BLOCKS(HG))
    attention_kernel(const float *q, const float *k_cache, const float *v_cache, const int32_t *first_row,
                     const int32_t *positions, const int32_t *parents, const int32_t *n_prefix_at, int T, int nh, int nkv, int D, int n_hgroups,
                     float scale, int seg_blocks, int n_seg_max, int t0, float *part_acc, float *part_ml, int32_t *part_rows,
                     float *out) {
    grid_begin();
    __shared__ att_shared<HG> sh;
    extern __shared__ int32_t tree_shared[]; /* parents copy [T], chain [T] */
    window_start(first_row, nkv, D, &k_cache, &v_cache);
    /* query t of the whole call; tp indexes the partials of this launch's queries t0 .. */
    const int t = blockIdx.z + t0, tp = blockIdx.z, kvh = blockIdx.y / n_hgroups, hg = blockIdx.y % n_hgroups, tid = threadIdx.x;
    const int G = nh / nkv, head0 = kvh * G + hg * HG, ng = min(HG, G - hg * HG);
    int32_t *chain = tree_shared + T;
    const int n_prefix = parents ? *n_prefix_at : 0;
    /* a segment past every node's rows (a tree has at most n_prefix + T): the whole block leaves
     * before any shared-memory work (the grid is sized for the cache's capacity) */
    if (parents && seg_blocks > 0 && (int64_t)blockIdx.x * ATT_SEG >= (int64_t)n_prefix + T) return;
    if (parents) {
        for (int i = tid; i < T; i += ATT_THREADS) tree_shared[i] = parents[i];
        __syncthreads();
    }
    if (tid == 0) query_rows(sh, parents ? tree_shared : nullptr, chain, t, n_prefix, positions);
    __syncthreads();
    const int n_seg = (sh.n_rows + ATT_SEG - 1) / ATT_SEG;
    if (seg_blocks > 0 && (int)blockIdx.x >= n_seg) return; /* a segment past this query's rows */
    for (int i = tid; i < ng * D; i += ATT_THREADS) sh.q[i] = q[((int64_t)t * nh + head0) * D + i];
    if (tid < HG) sh.M[tid] = -INFINITY, sh.L[tid] = 0.0f;
    __syncthreads();
    float acc[HG][ATT_DIMS_PER_THREAD];

    if (seg_blocks > 0) {
        if (blockIdx.x == 0 && blockIdx.y == 0 && tid == 0) part_rows[tp] = sh.n_rows;
        for (int seg = blockIdx.x; seg < n_seg; seg += seg_blocks) {
            att_segment<HG, FIXED, TC>(sh, chain, k_cache, v_cache, nkv, kvh, D, ng, scale, seg, acc);
            store_partials(sh, acc, ng, D, [&](int g) { return ((int64_t)tp * nh + head0 + g) * n_seg_max + seg; },
                           part_acc, part_ml);
            __syncthreads(); /* m, l are reset by the next segment */
        }
        return;
    }

    float total[HG][ATT_DIMS_PER_THREAD];
#pragma unroll
    for (int g = 0; g < HG; g++)
#pragma unroll
        for (int j = 0; j < ATT_DIMS_PER_THREAD; j++) total[g][j] = 0.0f;
    for (int seg = 0; seg < n_seg; seg++) {
        att_segment<HG, FIXED, TC>(sh, chain, k_cache, v_cache, nkv, kvh, D, ng, scale, seg, acc);
        if (tid < ng) merge_scales(sh.M[tid], sh.L[tid], sh.m[tid], sh.l[tid], &sh.M[tid], &sh.L[tid], &sh.a[tid],
                                   &sh.b[tid]);
        __syncthreads();
#pragma unroll
        for (int g = 0; g < HG; g++)
#pragma unroll
            for (int j = 0; j < ATT_DIMS_PER_THREAD; j++)
                if (g < ng) total[g][j] = fmaf(acc[g][j], sh.b[g], __fmul_rn(total[g][j], sh.a[g]));
        __syncthreads(); /* a, b and the segment state are rewritten by the next segment */
    }
#pragma unroll
    for (int g = 0; g < HG; g++)
#pragma unroll
        for (int j = 0; j < ATT_DIMS_PER_THREAD; j++) {
            const int d = tid + ATT_THREADS * j;
            if (g < ng && d < D) out[((int64_t)t * nh + head0 + g) * D + d] = __fdiv_rn(total[g][j], sh.L[g]);
        }
}

/* The rows every query of a tile (queries t_first .. t_first + nq - 1 of the call) sees at the same
 * logical positions as the same physical rows: a tree's prefix (n_prefix_at), else the smallest
 * positions[t] + 1 of the tile. Every thread reads them itself. */
static __device__ __forceinline__ int tile_shared_rows(const int32_t *positions, const int32_t *n_prefix_at, int t_first,
                                                       int nq) {
    if (n_prefix_at) return *n_prefix_at;
    int rows = positions[t_first] + 1;
    for (int j = 1; j < nq; j++) rows = min(rows, positions[t_first + j] + 1);
    return rows;
}
/* How many segments (0, 1, ...) a tile seeing n_shared rows in common SHARES: its whole segments,
 * none unless it sees more than ATT_SHARE_MIN_ROWS */
static __device__ __forceinline__ int shared_segments(int n_shared) {
    return n_shared > ATT_SHARE_MIN_ROWS ? n_shared / ATT_SEG : 0;
}

/* SPLIT for a batch (T > 1): block (x, kvh * n_hgroups + hg, tile * qt + jq) serves segments x, x +
 * gridDim.x, ... (one each up to ATT_MAX_SEG_BLOCKS segments) of the query heads head0 .. head0 + ngh - 1 (ngh = min(hb, G - hg * hb)) for the tile's queries t0 +
 * tile * qt .. (at most qt of them; pairs = queries x heads <= ATT_TILE_PAIRS). A segment is SHARED by
 * the tile when every query of it sees all ATT_SEG of its logical positions as the same physical rows
 * and those rows are many: seg < shared_segments(n_shared), where n_shared (tile_shared_rows) is,
 * causal, the smallest positions[t] + 1 of the tile, and, tree, n_prefix (the prefix rows are direct). Block jq = 0 reduces a shared segment once for all (query,
 * head) pairs of the tile: pair i = (query i / ngh, head i % ngh) takes the place of a head in
 * segment_partial, so each K and V row is loaded once for every pair, and each pair's operations are
 * those of segment_partial for one head (they never depend on what else the block holds); blocks jq >
 * 0 skip it. With shared_elsewhere every block skips it: attention_blocked_kernel reduces the shared
 * segments of the same tiles (qt queries). Any other segment (a causal query's last one, a tree node's ancestor rows) is reduced by
 * block jq for the tile's query jq alone, with its ngh heads, exactly as attention_kernel's SPLIT
 * shape does (short batches at small depths have only such segments: one block per query keeps them
 * parallel). Partials go to the same workspace slots as attention_kernel's, for
 * attention_merge_kernel. Tree: dynamic shared memory of 2 * T ints (parents, the query's chain). */
template <int P, bool TC>
static __global__ void __launch_bounds__(ATT_THREADS, ATT_TILE_MIN_BLOCKS)
    attention_tile_kernel(const float *q, const float *k_cache, const float *v_cache, const int32_t *first_row,
                          const int32_t *positions, const int32_t *parents, const int32_t *n_prefix_at, int T, int nh, int nkv, int D,
                          int n_hgroups, int hb, int qt, int n_q, int n_seg_max, int t0, float *part_acc, float *part_ml,
                          int32_t *part_rows, float scale, int shared_elsewhere) {
    grid_begin();
    __shared__ att_shared<P> sh;
    extern __shared__ int32_t tree_shared[]; /* parents copy [T], query t's chain [T] */
    window_start(first_row, nkv, D, &k_cache, &v_cache);
    const int kvh = blockIdx.y / n_hgroups, hg = blockIdx.y % n_hgroups, tid = threadIdx.x;
    const int G = nh / nkv, head0 = kvh * G + hg * hb, ngh = min(hb, G - hg * hb);
    /* the tile's queries and this block's query jq, in this launch's numbering */
    const int tq0 = (blockIdx.z / qt) * qt, jq = blockIdx.z % qt, nq = min(qt, n_q - tq0);
    if (jq >= nq) return; /* past the last query of the launch */
    const int tp = tq0 + jq, t = t0 + tp;
    int32_t *chain = tree_shared + T;
    const int n_prefix = parents ? *n_prefix_at : 0;
    /* a segment past every node's rows (a tree has at most n_prefix + T): the whole block leaves
     * before any shared-memory work */
    if (parents && (int64_t)blockIdx.x * ATT_SEG >= (int64_t)n_prefix + T) return;
    if (parents) {
        for (int i = tid; i < T; i += ATT_THREADS) tree_shared[i] = parents[i];
        __syncthreads();
    }
    const int n_shared = tile_shared_rows(positions, n_prefix_at, t0 + tq0, nq), n_shared_segs = shared_segments(n_shared);
    bool rows_ready = false; /* sh holds query t's rows (and chain): a shared segment overwrites them */
    float acc[P][ATT_DIMS_PER_THREAD];
    /* segments x, x + gridDim.x, ... in increasing order: shared ones (below n_shared) come first */
    for (int seg = blockIdx.x; seg < n_seg_max; seg += gridDim.x) {
        if (parents && (int64_t)seg * ATT_SEG >= (int64_t)n_prefix + T) break;
        const bool shared = seg < n_shared_segs;
        const bool counts = seg == 0 && blockIdx.y == 0; /* this block writes query t's row count */
        if ((!shared || counts) && !rows_ready) { /* query t's rows (and chain) */
            if (tid == 0) query_rows(sh, parents ? tree_shared : nullptr, chain, t, n_prefix, positions);
            __syncthreads();
            rows_ready = true;
        }
        if (counts && tid == 0) part_rows[tp] = sh.n_rows; /* the row counts the merge kernel reads */

        if (shared) {
            /* block 0 of the tile serves all its queries, unless attention_blocked_kernel does */
            if (shared_elsewhere || jq != 0) continue;
            const int np = nq * ngh;
            for (int i = tid; i < np * D; i += ATT_THREADS) {
                const int pair = i / D, d = i % D;
                const int tpair = t0 + tq0 + pair / ngh, h = head0 + pair % ngh;
                sh.q[i] = q[((int64_t)tpair * nh + h) * D + d];
            }
            __syncthreads(); /* query_rows' n_rows read above (counts) before it is overwritten */
            if (tid == 0) sh.n_rows = n_shared, sh.n_direct = n_shared; /* all its positions direct */
            rows_ready = false;
            __syncthreads();
            att_segment<P, P, TC>(sh, chain, k_cache, v_cache, nkv, kvh, D, np, scale, seg, acc);
            store_partials(sh, acc, np, D,
                           [&](int g) { return ((int64_t)(tq0 + g / ngh) * nh + head0 + g % ngh) * n_seg_max + seg; },
                           part_acc, part_ml);
            __syncthreads(); /* q, m, l and the rows are rewritten by the next segment */
            continue;
        }

        if (seg * ATT_SEG >= sh.n_rows) break; /* past query t's rows, as every later one (uniform) */
        for (int i = tid; i < ngh * D; i += ATT_THREADS) sh.q[i] = q[((int64_t)t * nh + head0) * D + i];
        __syncthreads();
        att_segment<P, ATT_QUERY_HEADS_27B, TC>(sh, chain, k_cache, v_cache, nkv, kvh, D, ngh, scale, seg, acc);
        store_partials(sh, acc, ngh, D, [&](int g) { return ((int64_t)tp * nh + head0 + g) * n_seg_max + seg; },
                       part_acc, part_ml);
        __syncthreads(); /* q, m and l are rewritten by the next segment */
    }
}

/* A batch's SHARED segments (attention_tile_kernel's definition, for tiles of qs queries) on the
 * register-blocked walk of attention_blocked.cuh: block (x, kvh * n_hgroups + hg, tile) holds the
 * tile's pairs (query i / ngh, head head0 + i % ngh; at most ATB_PAIRS) and reduces its shared segments
 * x, x + gridDim.x, ..., each into the workspace slots attention_tile_kernel would write, with the same
 * bits (the header says why). Tree when n_prefix_at != NULL (the prefix rows are the shared ones).
 * Dynamic shared memory: one atb_shared. NJ = head_dim / 32 at compile time (0: D / 32 at run time). */
template <int NJ>
static __global__ void __launch_bounds__(ATB_THREADS, ATB_BLOCKS_PER_SM)
    attention_blocked_kernel(const float *q, const float *k_cache, const float *v_cache, const int32_t *first_row,
                             const int32_t *positions, const int32_t *n_prefix_at, int nh, int nkv, int D,
                             int n_hgroups, int hb, int qs, int n_q, int n_seg_max, int t0, float *part_acc,
                             float *part_ml, float scale) {
    grid_begin();
    extern __shared__ float4 atb_area[];
    atb_shared &sh = *reinterpret_cast<atb_shared *>(atb_area);
    window_start(first_row, nkv, D, &k_cache, &v_cache);
    const int kvh = blockIdx.y / n_hgroups, hg = blockIdx.y % n_hgroups, tid = threadIdx.x;
    const int lane = tid % SPECLA_WARP, warp = tid / SPECLA_WARP;
    const int G = nh / nkv, head0 = kvh * G + hg * hb, ngh = min(hb, G - hg * hb);
    const int tq0 = blockIdx.z * qs, nq = min(qs, n_q - tq0);
    const int n_shared_segs = shared_segments(tile_shared_rows(positions, n_prefix_at, t0 + tq0, nq));
    if ((int)blockIdx.x >= n_shared_segs) return;
    const int np = nq * ngh, nj = D / ATB_LEAVES;
    const int64_t row_stride = (int64_t)nkv * D;
    const float *k_head = k_cache + (int64_t)kvh * D, *v_head = v_cache + (int64_t)kvh * D;
    atb_stage_q(sh, q, nh, D, t0 + tq0, head0, ngh, np, tid);
    const int pair0 = atb_value_pair0(tid), dim0 = atb_value_dim0(tid);
    for (int seg = blockIdx.x; seg < n_shared_segs; seg += gridDim.x) {
        float acc[8][4];
#pragma unroll
        for (int a = 0; a < 8; a++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[a][e] = 0.0f;
        if (tid < ATB_PAIRS) sh.m[tid] = -INFINITY, sh.l[tid] = 0.0f;
        for (int tile = seg * ATT_SEG; tile < (seg + 1) * ATT_SEG; tile += ATT_TILE) {
            atb_stage_k<NJ>(sh, k_head + tile * row_stride, row_stride, nj, tid);
            __syncthreads(); /* the tile's K (the first time also q, m and l) */
            atb_scores<NJ>(sh, nj, scale, tid);
            __syncthreads(); /* the scores; K is read no more */
            atb_copy_v(sh, v_head + tile * row_stride, row_stride, D, tid); /* in flight under the softmax */
            for (int g = warp; g < ATB_PAIRS; g += ATB_WARPS)
                softmax_tile_pair(sh.p + g * ATB_P_STRIDE, &sh.m[g], &sh.l[g], &sh.alpha[g], ATT_TILE, lane);
            atb_wait_v();
            __syncthreads(); /* the probabilities, alpha and the tile's V */
            atb_values(sh, acc, D, tid);
            __syncthreads(); /* kv and p are rewritten by the next tile */
        }
        /* the segment's partials: slot of pair g as attention_tile_kernel numbers it */
        const auto slot_of = [&](int g) { return ((int64_t)(tq0 + g / ngh) * nh + head0 + g % ngh) * n_seg_max + seg; };
        if (tid < np) part_ml[2 * slot_of(tid)] = sh.m[tid], part_ml[2 * slot_of(tid) + 1] = sh.l[tid];
        if (dim0 < D) {
#pragma unroll
            for (int a = 0; a < 8; a++)
                if (pair0 + a < np)
                    *reinterpret_cast<float4 *>(&part_acc[slot_of(pair0 + a) * D + dim0]) =
                        make_float4(acc[a][0], acc[a][1], acc[a][2], acc[a][3]);
        }
        /* m and l are reset by the next segment's threads tid < ATB_PAIRS, which read them here
         * themselves first; the next reads by others follow its first barrier */
    }
}

/* SPLIT's second kernel: block (h, tp, dim chunk) merges query t0 + tp's segment partials of head h in
 * segment order. The segments' (m, l) are loaded into shared memory by all threads at once; the (m, l)
 * chain (merge_scales, sequential by definition) then runs once per block in thread 0 on them, writing
 * each segment's scales in place; then each thread folds its dimension's partials in segment order
 * with their loads ATT_MERGE_BATCH at a time in flight. (Thread 0 used to load each (m, l) inside the
 * chain, one dependent L2 round trip per segment: 19.9 us for a decode step's merge at depth 4096,
 * Nsight Compute at b76f7f9.) Dynamic shared memory: 2 * n_seg_max floats. */
#define ATT_MERGE_THREADS 64
#define ATT_MERGE_BATCH 16
static __global__ void __launch_bounds__(ATT_MERGE_THREADS)
    attention_merge_kernel(const float *part_acc, const float *part_ml, const int32_t *part_rows, int nh, int D,
                           int n_seg_max, int t0, float *out) {
    grid_begin();
    extern __shared__ float merge_shared[]; /* a [n_seg_max], b [n_seg_max] */
    __shared__ float L_final;
    const int h = blockIdx.x, tp = blockIdx.y, d = blockIdx.z * ATT_MERGE_THREADS + threadIdx.x;
    const int n_seg = (part_rows[tp] + ATT_SEG - 1) / ATT_SEG;
    const int64_t slot0 = ((int64_t)tp * nh + h) * n_seg_max;
    float *sa = merge_shared, *sb = merge_shared + n_seg_max; /* (m, l), then the scales (a, b) */
    for (int seg = threadIdx.x; seg < n_seg; seg += ATT_MERGE_THREADS)
        sa[seg] = part_ml[2 * (slot0 + seg)], sb[seg] = part_ml[2 * (slot0 + seg) + 1];
    __syncthreads();
    if (threadIdx.x == 0) {
        float M = -INFINITY, L = 0.0f;
        for (int seg = 0; seg < n_seg; seg++) merge_scales(M, L, sa[seg], sb[seg], &M, &L, &sa[seg], &sb[seg]);
        L_final = L;
    }
    __syncthreads();
    if (d >= D) return;
    float total = 0.0f;
    for (int s0 = 0; s0 < n_seg; s0 += ATT_MERGE_BATCH) {
        float v[ATT_MERGE_BATCH];
#pragma unroll
        for (int j = 0; j < ATT_MERGE_BATCH; j++) v[j] = s0 + j < n_seg ? part_acc[(slot0 + s0 + j) * D + d] : 0.0f;
#pragma unroll
        for (int j = 0; j < ATT_MERGE_BATCH; j++)
            if (s0 + j < n_seg) total = fmaf(v[j], sb[s0 + j], __fmul_rn(total, sa[s0 + j]));
    }
    out[((int64_t)(t0 + tp) * nh + h) * D + d] = __fdiv_rn(total, L_final);
}

static __global__ void fill_nan_kernel(float *out, int64_t n) {
    grid_begin();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __int_as_float(0x7fc00000);
}

/* The segments of a SPLIT call bounded at `rows` rows, and the blocks its grid has along them (a
 * block walks the segments past ATT_MAX_SEG_BLOCKS) */
static int split_segments(int rows) { return (rows + ATT_SEG - 1) / ATT_SEG; }
static int split_seg_blocks(int n_seg) { return n_seg < ATT_MAX_SEG_BLOCKS ? n_seg : ATT_MAX_SEG_BLOCKS; }

/* Workspace of the SPLIT shape, in bytes: partial acc and (m, l) per query, head and segment, plus
 * the row count of each query. */
static size_t split_workspace_bytes(int T, int nh, int D, int n_seg_max) {
    return sizeof(float) * (size_t)T * nh * n_seg_max * (size_t)(D + 2) + sizeof(int32_t) * (size_t)T;
}

extern "C" size_t cuda_attention_workspace_bytes(const backend_limits *l) {
    if (l->attn_heads <= 0 || l->attn_head_dim <= 0) return 0;
    const int queries = l->max_rows < ATT_SPLIT_QUERIES ? l->max_rows : ATT_SPLIT_QUERIES;
    return split_workspace_bytes(queries, l->attn_heads, l->attn_head_dim, split_segments(l->max_kv_rows));
}

/* Whether a call's scores and weighted V sums take the tensor cores (attention_tensor_cores.cuh): the
 * backend's switch (SPECLA_CUDA_ATTENTION_TC=1, opt-in until it has been run on a GPU), a device with
 * tf32 MMAs (sm_80+) and a head_dim the fragments tile; never on HIP. Every call of one backend with
 * one head_dim decides alike, decode, batch and tree, so their bit identities hold on either path. */
#if defined(SPECLA_USE_HIP)
#define ATT_TC_KERNELS false /* HIP instantiates no tensor-core kernel and never takes the path */
#else
#define ATT_TC_KERNELS true
#endif
static bool att_tensor_cores(const backend *be, int D) {
    return ATT_TC_KERNELS && cuda_of(be)->attention_tensor_cores && cuda_device_major() >= 8 && D % 16 == 0 &&
           D <= ATT_MAX_D;
}

/* Whether a batch's shared segments take attention_blocked_kernel: the fp32 path (not the tensor
 * cores'), head_dim a multiple of 32 up to 256, and an SM that holds two of its blocks (105 KB of
 * shared memory each: sm_90 and up; never on HIP, whose gfx11 work groups have 64 KB), unless
 * SPECLA_CUDA_ATTENTION_BLOCKED=0 (the tile kernel's own shared walk then: the same bits). */
#if defined(SPECLA_USE_HIP)
#define ATT_BLOCKED_KERNELS false
#else
#define ATT_BLOCKED_KERNELS true
#endif
#define ATB_SMEM_RESERVED 1024 /* the runtime's shared memory per block on sm_80+ */
static bool att_blocked(const backend *be, bool tc, int D) {
    const cuda_backend *cb = cuda_of(be);
    return ATT_BLOCKED_KERNELS && cb->attention_blocked && !tc && D % ATB_LEAVES == 0 && D <= ATB_MAX_D &&
           (size_t)cb->shared_per_sm >= ATB_BLOCKS_PER_SM * (sizeof(atb_shared) + ATB_SMEM_RESERVED);
}

#if !defined(SPECLA_USE_HIP)
/* attention_blocked_kernel for head_dim D (att_blocked(D)), its shared-memory limit raised once */
static void launch_attention_blocked(const backend *be, dim3 grid, int D, const float *q, const float *k_cache,
                                     const float *v_cache, const int32_t *first_row, const int32_t *positions,
                                     const int32_t *n_prefix, int nh, int nkv, int n_hgroups, int hb, int qs, int n_q,
                                     int n_seg_max, int t0, float *part_acc, float *part_ml, float scale) {
    auto kernel = D == ATB_MAX_D ? attention_blocked_kernel<ATB_MAX_D / ATB_LEAVES> : attention_blocked_kernel<0>;
    static const cudaError_t fixed_attr = cudaFuncSetAttribute(
        attention_blocked_kernel<ATB_MAX_D / ATB_LEAVES>, cudaFuncAttributeMaxDynamicSharedMemorySize, sizeof(atb_shared));
    static const cudaError_t general_attr = cudaFuncSetAttribute(
        attention_blocked_kernel<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, sizeof(atb_shared));
    (void)fixed_attr, (void)general_attr; /* a refused limit shows as the launch's error */
    cuda_launch(kernel, grid, dim3(ATB_THREADS), sizeof(atb_shared), cuda_stream(be), q, k_cache, v_cache, first_row,
                positions, n_prefix, nh, nkv, D, n_hgroups, hb, qs, n_q, n_seg_max, t0, part_acc, part_ml, scale);
}
#endif

/* The attention_kernel of HG heads a block: on the tensor cores (tc) or not, and for a decode step's
 * blocks with or without the compile-time pair shape (ATT_KERNEL_FIXED_PAIRS). */
template <int HG> static auto attention_kernel_for(bool tc, bool decode_general) {
    if constexpr (HG <= 2) {
        if (decode_general) return tc ? attention_kernel<HG, ATT_TC_KERNELS, 0> : attention_kernel<HG, false, 0>;
    }
    (void)decode_general;
    return tc ? attention_kernel<HG, ATT_TC_KERNELS, ATT_KERNEL_FIXED_PAIRS(HG)>
              : attention_kernel<HG, false, ATT_KERNEL_FIXED_PAIRS(HG)>;
}

/* One attention call with HG query heads per block (the bits of a head do not depend on HG: each
 * (row, head) score, softmax step and V sum is the same sequence of operations whatever else the
 * block holds). */
template <int HG>
static void launch_attention_heads(const backend *be, const char *name, const float *q, const float *k_cache,
                                   const float *v_cache, const int32_t *first_row, const int32_t *positions,
                                   const int32_t *parents, const int32_t *n_prefix, int max_rows, int T, int nh, int nkv, int D, float scale,
                                   float *out) {
    const cuda_backend *cb = cuda_of(be);
    const bool tc = att_tensor_cores(be, D);
    const int G = nh / nkv, n_hgroups = (G + HG - 1) / HG;
    const int n_seg_max = split_segments(max_rows);
    const size_t tree_bytes = parents ? 2 * sizeof(int32_t) * (size_t)T : 0;
    const int split_queries = T < ATT_SPLIT_QUERIES ? T : ATT_SPLIT_QUERIES;
    const size_t need = split_workspace_bytes(split_queries, nh, D, n_seg_max);
    const size_t merge_shared_bytes = 2 * sizeof(float) * (size_t)n_seg_max;
    if (n_seg_max > 1 && cb->workspace && need <= cb->workspace_bytes && merge_shared_bytes <= 48 * 1024) {
        /* one block per segment up to ATT_MAX_SEG_BLOCKS of them (the serial walk of a block is ATT_SEG
         * rows up to 8192 rows), in launches of at most ATT_SPLIT_QUERIES queries that reuse the
         * workspace in stream order */
        const int seg_blocks = split_seg_blocks(n_seg_max);
        float *part_acc = (float *)cb->workspace;
        float *part_ml = part_acc + (size_t)split_queries * nh * n_seg_max * D;
        int32_t *part_rows = (int32_t *)(part_ml + (size_t)split_queries * nh * n_seg_max * 2);
        /* a batch: blocks of query tiles (attention_tile_kernel), hb heads x qt queries per block; with
         * attention_blocked_kernel (att_blocked) tiles of up to ATB_PAIRS pairs, whose shared segments
         * it reduces before the tile kernel reduces the rest */
        const bool blocked = T > 1 && max_rows > ATT_SHARE_MIN_ROWS && att_blocked(be, tc, D);
        const int hb = G < ATT_MAX_G ? G : ATT_MAX_G, tile_hgroups = (G + hb - 1) / hb;
        const int qt = (blocked ? ATB_PAIRS : ATT_TILE_PAIRS) / hb;
        for (int t0 = 0; t0 < T; t0 += split_queries) {
            const int n_q = T - t0 < split_queries ? T - t0 : split_queries;
#if !defined(SPECLA_USE_HIP) /* att_blocked is false there */
            if (blocked) {
                /* blocks along the segments: as many as sit on the SMs at once, two a SM, over the
                 * tiles (a block walks the segments x, x + gx, ...; one block more than fit would
                 * start its walk only when a first one ends), at most one per segment */
                const int tiles = (n_q + qt - 1) / qt, others = nkv * tile_hgroups * tiles;
                const int resident = cb->sm_count > 0 ? ATB_BLOCKS_PER_SM * cb->sm_count / others : seg_blocks;
                const int gx = resident < seg_blocks ? (resident > 0 ? resident : 1) : seg_blocks;
                launch_attention_blocked(be, dim3(gx, nkv * tile_hgroups, tiles), D, q, k_cache, v_cache, first_row,
                                         positions, n_prefix, nh, nkv, tile_hgroups, hb, qt, n_q, n_seg_max, t0,
                                         part_acc, part_ml, scale);
                cuda_note_launch(be, name);
            }
#endif
            if (T > 1)
                cuda_launch(tc ? attention_tile_kernel<ATT_TILE_PAIRS, ATT_TC_KERNELS>
                               : attention_tile_kernel<ATT_TILE_PAIRS, false>,
                            dim3(seg_blocks, nkv * tile_hgroups, (n_q + qt - 1) / qt * qt), dim3(ATT_THREADS),
                            tree_bytes, cuda_stream(be), q, k_cache, v_cache, first_row, positions, parents, n_prefix, T,
                            nh, nkv, D, tile_hgroups, hb, qt, n_q, n_seg_max, t0, part_acc, part_ml, part_rows, scale,
                            (int)blocked);
            else
                cuda_launch(attention_kernel_for<HG>(tc, cb->attention_decode_general),
                            dim3(seg_blocks, nkv * n_hgroups, n_q), dim3(ATT_THREADS), tree_bytes,
                            cuda_stream(be), q, k_cache, v_cache, first_row, positions, parents, n_prefix, T, nh,
                            nkv, D, n_hgroups, scale, seg_blocks, n_seg_max, t0, part_acc, part_ml, part_rows, out);
            cuda_note_launch(be, name);
            cuda_launch(attention_merge_kernel, dim3(nh, n_q, (D + ATT_MERGE_THREADS - 1) / ATT_MERGE_THREADS),
                        dim3(ATT_MERGE_THREADS), merge_shared_bytes, cuda_stream(be), part_acc, part_ml, part_rows, nh,
                        D, n_seg_max, t0, out);
            cuda_note_launch(be, name);
        }
        return;
    }
    cuda_launch(attention_kernel_for<HG>(tc, cb->attention_decode_general), dim3(1, nkv * n_hgroups, T),
                dim3(ATT_THREADS), tree_bytes, cuda_stream(be), q,
                k_cache, v_cache, first_row, positions, parents, n_prefix, T, nh, nkv, D, n_hgroups, scale, 0, 0, 0, NULL, NULL,
                NULL, out);
    cuda_note_launch(be, name);
}

static void launch_attention(const backend *be, const char *name, const float *q, const float *k_cache,
                             const float *v_cache, const int32_t *first_row, const int32_t *positions,
                             const int32_t *parents,
                             const int32_t *n_prefix, int max_rows, int T, int nh, int nkv, int D, float *out) {
    if (T <= 0 || nh <= 0) return;
    if (D > ATT_MAX_D || D <= 0 || nkv <= 0 || nh % nkv != 0) {
        /* shapes the core never passes (it checks them); a NaN output rather than a silent wrong one */
        cuda_launch(fill_nan_kernel, dim3(64), dim3(256), 0, cuda_stream(be), out, (int64_t)T * nh * (D > 0 ? D : 1));
        cuda_note_launch(be, name);
        return;
    }
    const float scale = 1.0f / sqrtf((float)D);
    /* a decode step (one query) has few blocks at short depths: 1 or 2 heads per block give it
     * more (27B, one segment: 24 or 12 blocks, not 4 walking 6 heads each); a batch has blocks from
     * its queries and reads each K/V row once for ATT_MAX_G heads */
    if (T == 1) {
        const int64_t one_head_blocks = (int64_t)split_seg_blocks(split_segments(max_rows)) * nh;
        const int sms = cuda_of(be)->sm_count;
        if (sms > 0 && one_head_blocks <= (int64_t)sms * ATT_DECODE_RESIDENT)
            launch_attention_heads<1>(be, name, q, k_cache, v_cache, first_row, positions, parents, n_prefix, max_rows,
                                      T, nh, nkv, D, scale, out);
        else
            launch_attention_heads<2>(be, name, q, k_cache, v_cache, first_row, positions, parents, n_prefix, max_rows,
                                      T, nh, nkv, D, scale, out);
    } else
        launch_attention_heads<ATT_MAX_G>(be, name, q, k_cache, v_cache, first_row, positions, parents, n_prefix,
                                          max_rows, T, nh, nkv, D, scale, out);
}

extern "C" void cuda_attention(const backend *be, const float *q, const float *k_cache, const float *v_cache,
                               const int32_t *first_row, const int32_t *positions, int T, int n_kv, int nh, int nkv,
                               int D, float *out) {
    launch_attention(be, "attention", q, k_cache, v_cache, first_row, positions, NULL, NULL, n_kv, T, nh, nkv, D, out);
}

extern "C" void cuda_attention_tree(const backend *be, const float *q, const float *k_cache, const float *v_cache,
                                    const int32_t *n_prefix, int max_rows, const int32_t *parents, int T, int nh,
                                    int nkv, int D, float *out) {
    launch_attention(be, "attention_tree", q, k_cache, v_cache, NULL, NULL, parents, n_prefix, max_rows, T, nh, nkv, D,
                     out);
}
