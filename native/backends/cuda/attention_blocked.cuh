/* A query tile's shared segments on a register-blocked fp32 walk (attention.cu includes this; its
 * attention_blocked_kernel runs these phases).
 *
 * Why. At depth a batch's or a tree's queries share most of their rows: at 4096 rows a 23-token batch
 * on the 27B shape spends about 3 ms of a 13.5 ms step in the attention of its shared segments
 * (docs/cuda-attention.md). The tile kernel's fp32 walk keeps each dot product on one 32-lane group
 * (lane L sums dims L, L + 32, ..., the lanes meet in an xor butterfly) and about 70 % of its
 * instructions are shuffles, selects, loads and address arithmetic, not fmas. The arithmetic itself
 * does not need the lanes: a butterfly over lanes is a fixed binary tree over 32 lane sums, which one
 * thread can fold itself. So here a thread owns whole scores and whole accumulators, and operands
 * come from shared memory as vectors that feed several of them (an SGEMM's register blocking):
 *   - scores: a thread owns 4 pairs x 2 rows of a 64-row tile; for each lane index L it runs the 8
 *     products' fmaf chain of lane sum L (dims L + 32 j) for all 8 scores, one 16-byte q read (4 pairs
 *     of dim d) and one 8-byte K read (2 rows of dim d) per 8 fmas, and folds the lane sums into the
 *     butterfly's tree as it goes;
 *   - weighted V: a thread owns 8 pairs x 4 dims; per 4 rows it reads 8 pairs' probabilities (16 bytes
 *     each) and 4 rows' dims (16 bytes each) for 128 fmas.
 *
 * The arithmetic is the fp32 path's (attention.cu's header), operation for operation:
 *   - lane sum L of (pair, row) = fmaf(q[d], k[d], .) over d = L + 32 j, j ascending, from 0;
 *   - the dot = the xor butterfly's tree: lane sums L and L ^ 16 first, then ^ 8, ^ 4, ^ 2, ^ 1. Taking
 *     the lanes in bit-reversed order (leaf i is lane bitrev5(i)), that tree is the binary counter's:
 *     leaf i meets leaf i ^ 1, those meet their neighbours, and so on. IEEE addition is commutative,
 *     so which operand is left does not matter;
 *   - score = dot * scale; the softmax bookkeeping is attention.cu's; acc = acc * alpha, then
 *     fmaf(p_r, v_r[d], acc) over the tile's rows in order.
 * So a pair's partial has the bits the tile kernel and a decode step give it; GPU tests compare the
 * batch and tree with decoding, bit for bit, and tools/cuda_attention_blocked_check.cu runs these
 * phases on the host against plain loops of the arithmetic.
 *
 * Shared memory (atb_shared, 105 KB at head_dim 256, ATB_BLOCKS_PER_SM = 2 a SM on sm_90): the block's
 * queries transposed (dim-major, its 32 pairs adjacent), one tile's K transposed (dim-major, rows
 * adjacent, swizzled) or V as stored (row-major), the tile's scores / probabilities, the running
 * max, sum and scale per pair. Needs head_dim a multiple of 32, at most 256. */
#ifndef SPECLA_CUDA_ATTENTION_BLOCKED_CUH
#define SPECLA_CUDA_ATTENTION_BLOCKED_CUH

#include <stdint.h>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define ATB_HD __host__ __device__ __forceinline__
#else
#define ATB_HD static inline
#endif

/* rounded fp32 add and multiply that the compiler never fuses (a host build of the check compiles
 * with -ffp-contract=off) */
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define ATB_ADD(a, b) __fadd_rn((a), (b))
#define ATB_MUL(a, b) __fmul_rn((a), (b))
#else
#define ATB_ADD(a, b) ((a) + (b))
#define ATB_MUL(a, b) ((a) * (b))
#endif

#define ATB_THREADS 256   /* 8 warps */
#define ATB_WARPS (ATB_THREADS / 32)
#define ATB_BLOCKS_PER_SM 2 /* resident blocks an SM must hold: 2 x 128 registers x 256 threads fill
                             * its 64 K registers; attention.cu launches only where 2 x atb_shared fit */
#define ATB_PAIRS 32      /* (query, head) pairs a block holds: 8 threads x 4 in the scores */
#define ATB_ROWS 64       /* a tile's rows (attention.cu's ATT_TILE) */
#define ATB_MAX_D 256
#define ATB_LEAVES 32     /* lane sums a dot product has (the fp32 path's 32-lane group) */
#define ATB_LEVELS 5      /* levels of their tree */
#define ATB_P_STRIDE (ATB_ROWS + 4) /* floats per pair row of the probabilities: 16-byte rows that
                                     * start on different banks */
#define ATB_K_BATCH 4     /* K staging loads a thread has in flight together */
#define ATB_V_LOADS (ATB_ROWS * ATB_MAX_D / 4 / ATB_THREADS) /* 16-byte V pieces per thread and tile */

struct alignas(16) atb_shared {
    float q_t[ATB_MAX_D * ATB_PAIRS]; /* q_t[d * ATB_PAIRS + pair] (pairs past the block's: 0) */
    float kv[ATB_ROWS * ATB_MAX_D];   /* K: kv[atb_k_index(d, row)]; V: kv[row * ATB_MAX_D + d] */
    float p[ATB_PAIRS * ATB_P_STRIDE]; /* scores, then probabilities: p[pair * ATB_P_STRIDE + row] */
    float m[ATB_PAIRS], l[ATB_PAIRS], alpha[ATB_PAIRS];
};

/* lane index of leaf i: the 5-bit reversal */
ATB_HD constexpr int atb_leaf_lane(int i) {
    return ((i & 1) << 4) | ((i & 2) << 2) | (i & 4) | ((i & 8) >> 2) | ((i & 16) >> 4);
}

/* Where the transposed K keeps (dim d, tile row `row`): dim-major rows of ATB_ROWS, the row XORed
 * with 4 x ((d / 4) mod 8). A staging warp stores 4 rows x 8 groups of 4 dims at once: without the
 * swizzle all 32 stores of one dim offset would meet on the 4 banks of their rows; with it they take
 * 32 banks. A XOR with a multiple of 4 keeps an even row next to its odd neighbour (the scores read
 * 2 rows at once) */
ATB_HD int atb_k_index(int d, int row) { return d * ATB_ROWS + (row ^ (((d >> 2) & 7) << 2)); }

/* The block's queries into q_t: pair i is (query t_first + i / ngh, head head0 + i % ngh) of q
 * ([T][nh][D]); pairs np .. ATB_PAIRS - 1 are 0 (their scores are computed and never stored). */
ATB_HD void atb_stage_q(atb_shared &sh, const float *q, int nh, int D, int t_first, int head0, int ngh, int np, int tid) {
    for (int i = tid; i < ATB_PAIRS * D; i += ATB_THREADS) {
        const int pair = i / D, d = i % D;
        const float x = pair < np ? q[((int64_t)(t_first + pair / ngh) * nh + head0 + pair % ngh) * D + d] : 0.0f;
        sh.q_t[d * ATB_PAIRS + pair] = x;
    }
}

/* One tile's K into kv, transposed. k_rows: the tile's row 0 at the block's KV head; rows row_stride
 * floats apart; nj = D / 32. The tile is cut into units of 4 rows x 32 dims (unit u: rows 4 (u % 16)
 * .., dims 32 (u / 16) ..); warp w loads units w, w + 8, ...; its lane takes row 4 (u % 16) + lane / 8,
 * dims 32 (u / 16) + 4 (lane % 8) .. + 3 (16 bytes; a warp reads 4 whole 128-byte pieces). */
template <int NJ> ATB_HD void atb_stage_k(atb_shared &sh, const float *k_rows, int64_t row_stride, int nj, int tid) {
    const int lane = tid & 31, warp = tid >> 5, units = 16 * (NJ ? NJ : nj);
    for (int u0 = warp; u0 < units; u0 += ATB_WARPS * ATB_K_BATCH) {
        float4 x[ATB_K_BATCH];
#pragma unroll
        for (int b = 0; b < ATB_K_BATCH; b++) {
            const int u = u0 + ATB_WARPS * b, row = 4 * (u & 15) + (lane >> 3), d = 32 * (u >> 4) + 4 * (lane & 7);
            if (u < units) x[b] = *reinterpret_cast<const float4 *>(k_rows + row * row_stride + d);
        }
#pragma unroll
        for (int b = 0; b < ATB_K_BATCH; b++) {
            const int u = u0 + ATB_WARPS * b, row = 4 * (u & 15) + (lane >> 3), d = 32 * (u >> 4) + 4 * (lane & 7);
            if (u >= units) continue;
            sh.kv[atb_k_index(d, row)] = x[b].x;
            sh.kv[atb_k_index(d + 1, row)] = x[b].y;
            sh.kv[atb_k_index(d + 2, row)] = x[b].z;
            sh.kv[atb_k_index(d + 3, row)] = x[b].w;
        }
    }
}

/* The tile's scores (times scale) into p. Thread: pairs 4 (lane % 8) .. + 3, rows 8 warp + 2 (lane / 8)
 * and + 1 (a warp's q reads are one 128-byte piece, its K reads 32 bytes). Leaf i = lane sum
 * atb_leaf_lane(i) of all 8 scores, then the binary counter folds it: while bit `level` of i is set,
 * it meets the pending partial of that level; it waits at the first level whose bit is clear. After
 * leaf 31 the root is left. */
template <int NJ> ATB_HD void atb_scores(atb_shared &sh, int nj, float scale, int tid) {
    const int lane = tid & 31, warp = tid >> 5;
    const int pair0 = 4 * (lane & 7), row0 = 8 * warp + 2 * (lane >> 3);
    float pending[ATB_LEVELS][8];
    float dot[8];
#pragma unroll
    for (int i = 0; i < ATB_LEAVES; i++) {
        const int L = atb_leaf_lane(i);
#pragma unroll
        for (int s = 0; s < 8; s++) dot[s] = 0.0f;
#pragma unroll
        for (int j = 0; j < ATB_MAX_D / ATB_LEAVES; j++) {
            if (NJ ? j >= NJ : j >= nj) continue;
            const int d = L + ATB_LEAVES * j;
            const float4 q4 = *reinterpret_cast<const float4 *>(&sh.q_t[d * ATB_PAIRS + pair0]);
            const float2 k2 = *reinterpret_cast<const float2 *>(&sh.kv[atb_k_index(d, row0)]);
            const float qa[4] = {q4.x, q4.y, q4.z, q4.w}, kb[2] = {k2.x, k2.y};
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int b = 0; b < 2; b++) dot[2 * a + b] = fmaf(qa[a], kb[b], dot[2 * a + b]);
        }
        int level = 0;
#pragma unroll
        for (; level < ATB_LEVELS && ((i >> level) & 1); level++)
#pragma unroll
            for (int s = 0; s < 8; s++) dot[s] = ATB_ADD(pending[level][s], dot[s]);
        if (level < ATB_LEVELS) {
#pragma unroll
            for (int s = 0; s < 8; s++) pending[level][s] = dot[s];
        }
    }
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 2; b++) sh.p[(pair0 + a) * ATB_P_STRIDE + row0 + b] = ATB_MUL(dot[2 * a + b], scale);
}

/* One tile's V as stored (row-major, rows ATB_MAX_D floats apart in kv), copied by the thread's
 * 16-byte pieces c = tid + ATB_THREADS b (row c / (D / 4), dims 4 (c % (D / 4)) ..). On sm_80+ the
 * copies are asynchronous (cp.async, no registers) so that they pass under the softmax, and
 * atb_wait_v waits for them; elsewhere (the host check; HIP never takes this kernel) they are plain
 * loads and stores. */
ATB_HD void atb_copy_v(atb_shared &sh, const float *v_rows, int64_t row_stride, int D, int tid) {
    const int per_row = D / 4;
#pragma unroll
    for (int b = 0; b < ATB_V_LOADS; b++) {
        const int c = tid + ATB_THREADS * b, row = c / per_row, col = c % per_row;
        if (row >= ATB_ROWS) continue;
        const float *src = v_rows + row * row_stride + 4 * col;
        float *dst = &sh.kv[row * ATB_MAX_D + 4 * col];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(SPECLA_USE_HIP)
        const unsigned dst_shared = (unsigned)__cvta_generic_to_shared(dst);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst_shared), "l"(src) : "memory");
#else
        *reinterpret_cast<float4 *>(dst) = *reinterpret_cast<const float4 *>(src);
#endif
    }
}
ATB_HD void atb_wait_v() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(SPECLA_USE_HIP)
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

/* The pairs and dims a thread accumulates: pairs 8 (warp / 2) .. + 7, dims 4 (32 (warp % 2) + lane) .. + 3
 * (a warp's V reads are 512 contiguous bytes, its probability reads one address) */
ATB_HD int atb_value_pair0(int tid) { return 8 * ((tid >> 5) >> 1); }
ATB_HD int atb_value_dim0(int tid) { return 4 * (32 * ((tid >> 5) & 1) + (tid & 31)); }

/* The tile's weighted V into acc (pairs atb_value_pair0 .., dims atb_value_dim0 ..): acc = acc *
 * alpha, then fmaf(p_r, v_r[d], acc) over rows 0 .. ATB_ROWS - 1 in order. A thread whose dims pass
 * D does nothing. */
ATB_HD void atb_values(const atb_shared &sh, float (&acc)[8][4], int D, int tid) {
    const int pair0 = atb_value_pair0(tid), dim0 = atb_value_dim0(tid);
    if (dim0 >= D) return;
#pragma unroll
    for (int a = 0; a < 8; a++) {
        const float alpha = sh.alpha[pair0 + a];
#pragma unroll
        for (int e = 0; e < 4; e++) acc[a][e] = ATB_MUL(acc[a][e], alpha);
    }
#pragma unroll 2
    for (int r0 = 0; r0 < ATB_ROWS; r0 += 4) {
        float pr[8][4];
#pragma unroll
        for (int a = 0; a < 8; a++) {
            const float4 p4 = *reinterpret_cast<const float4 *>(&sh.p[(pair0 + a) * ATB_P_STRIDE + r0]);
            pr[a][0] = p4.x, pr[a][1] = p4.y, pr[a][2] = p4.z, pr[a][3] = p4.w;
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const float4 v4 = *reinterpret_cast<const float4 *>(&sh.kv[(r0 + u) * ATB_MAX_D + dim0]);
            const float v[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
            for (int a = 0; a < 8; a++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[a][e] = fmaf(pr[a][u], v[e], acc[a][e]);
        }
    }
}

#endif
