/* The staged tensor-core path of matmul.cu for 2..64 tokens on Q4_K, Q5_K, Q6_K and Q8_0 weights (and
 * for one token on the types matmul.cu's mm_staged_decode names: Q8_0): the same units (row group of
 * 32, chunk), the same per-block integers and the same float operations as mm_kernel and
 * mm_mma_kernel, so every (row, token) gets the bits the dp4a path gives it.
 *
 * Thread mapping. A CTA of 4 warps owns two row groups (2 x 32 rows) and one chunk of a matrix
 * (mm_tile_ctas, mm_select_mat_cta): warp w takes rows 16 (w & 1) .. 16 (w & 1) + 15 of row group
 * 2 pair + (w >> 1), one 16-row MMA tile (M); thread (g = lane / 4, t = lane % 4) holds rows g and
 * g + 8 of it. Tokens go in passes of 8 NT (NT tiles of 8 tokens on N, up to mm_tile_traits::max_tiles);
 * per pass the CTA walks its chunk block by block (Q8_0: step by step, 8 blocks a step; below):
 *   - the 128 threads stage the block's activations for the pass's tokens in shared memory (codes,
 *     Q8_K scale, the min-term operands of mm_min_operands) with 16-byte asynchronous copies
 *     (cp.async; plain copies before sm_80 and on HIP), one block ahead of the MMAs, double-buffered;
 *     token rows are padded (stride mm_tile_traits::row_stride) so that the B-fragment loads of a warp
 *     hit 32 different banks;
 *   - each warp holds its 16 rows' weight block in registers (and the next one in flight), decodes
 *     the row scales once per block (the 6-bit Q4_K scales and mins as packed bytes), and runs, per
 *     token tile, one MMA per scale unit: m16n8k32 per 32-element Q4_K sub-block (exact int32 dot),
 *     m16n8k16 per 16-element Q6_K group; the thread holding C element (row, token) adds
 *     scale x dot into the block's int32 s. The Q4_K min term t = sum_j m_j pair_j is two m16n8k16
 *     MMAs per tile (A = the row's 8 mins, zero-padded; B = the token's lo / hi bytes of pair_j):
 *     t = lo-dot + 128 hi-dot, the same integer. Q6_K's levels enter the MMAs as stored (0..63) and
 *     its bias comes off the block's s once: s - 32 sum_g sc_g bsum_g, that sum two m16n8k16 MMAs per
 *     tile (A = the row's 16 group scales; B = the lo / hi bytes of the token's 16 bsums), the same
 *     integer as the biased levels' and fewer instructions than subtracting the bias byte by byte
 *     from every A register (three each on sm_90, 96 a block).
 *   - then the block's float step, exactly as matmul_blocks.h: Q4_K acc = fma(da * d, s, acc),
 *     acc = fma(-(da * dmin), t, acc); Q6_K acc = fma(da * d, s, acc).
 * A chunk's partial sums are stored with mm_store; the split-K finish (mm_tile_finish) adds them in
 * chunk order as the other kernels' mm_finish_unit does, the whole last-arriving CTA of a row-group
 * pair at once.
 *
 * Q4_K k order. Any permutation of k applied to A and B alike gives the same exact integer; this
 * kernel feeds MMA k 4t..4t+3 (a0, a1, b0) with sub-block elements 8t..8t+3 and MMA k 16+4t..16+4t+3
 * (a2, a3, b1) with elements 8t+4..8t+7, so the B fragment is one 8-byte shared-memory load of the
 * codes in their natural order, and the A fragment is the nibbles of the 8 bytes 32q + 8t .. 32q + 8t + 7
 * of qs (sub-block 2q: low nibbles, 2q + 1: high nibbles), one 8-byte weight load per row and
 * 32-byte run. Q5_K is Q4_K's step with the fifth bit of each level added: a thread's elements of
 * every sub-block are 8t..8t+7 (of the run), whose fifth bits are bit j of qh bytes 8t..8t+7, one
 * 8-byte load per row a block. Q6_K keeps the natural order (k 4t..4t+3 of a group of 16 = its
 * elements 4t..4t+3).
 *
 * Q8_0. Its blocks are 32 elements with an fp16 scale each, so a step of the chunk walk takes 8 of them
 * (mm_tile_traits::step_blocks): 256 activation codes per token staged as a k-quant block's, 8 scales
 * per token, and 8 x 34 bytes per weight row (a row group's 8 slots are contiguous in the prepared
 * layout: one bulk copy). A chunk need not hold a multiple of 8 blocks: its last step takes the
 * blocks left (nv < 8), the fragments of the others are loaded from the last valid slot and never
 * used. Per block one m16n8k32 per token tile with Q4_K's k order (a thread's A: qs bytes 8t..8t+7
 * of the block's rows g and g + 8, B: the token's codes 8t..8t+7, one 8-byte load each), then
 * matmul_blocks.h's step: acc = fma(d * da, s, acc), block after block in chunk order.
 *
 * Fragments (PTX ISA, .s8): m16n8k32: A reg 0 = row g, k 4t..4t+3; reg 1 = row g + 8, the same k;
 * reg 2 = row g, k 16+4t..16+4t+3; reg 3 = row g + 8, the same; B reg 0 = k 4t..4t+3 of column g,
 * reg 1 = k 16+4t..; m16n8k16: A reg 0 = row g, k 4t..4t+3, reg 1 = row g + 8; B = k 4t..4t+3 of
 * column g; C (both): c0, c1 = row g, columns 2t, 2t+1; c2, c3 = row g + 8, columns 2t, 2t+1.
 * The per-thread code is host-compilable: tools/cuda_matmul_check.cu runs it on 32 host threads per
 * warp with emulated MMAs and barriers and compares the bits with the host model. */
#ifndef SPECLA_CUDA_MATMUL_TILE_CUH
#define SPECLA_CUDA_MATMUL_TILE_CUH

#include "matmul_mma.cuh"

#if !MM_DEVICE_CODE
/* Host emulation (tools/cuda_matmul_check.cu): lane `lane`'s share of the m16n8k32 s8 product with the
 * PTX fragment layout, and the barrier of the threads that emulate one CTA. */
void mm_mma_k32_emulated(int32_t c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1,
                         int lane);
void mm_cta_sync_emulated(void);
#endif

/* c[0..3] += A (16 x 32) . B (32 x 8), all 32 lanes together */
MM_HD void mm_mma_k32(int32_t c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1,
                      int lane) {
#if MM_DEVICE_CODE && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(SPECLA_USE_HIP)
    /* not volatile: a pure function of its operands, which the compiler may schedule freely */
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#elif MM_DEVICE_CODE
    /* k 0..15 and k 16..31 as two k16 products (the same integers) */
    mm_mma_k16(c, a0, a1, b0, lane);
    mm_mma_k16(c, a2, a3, b1, lane);
#else
    mm_mma_k32_emulated(c, a0, a1, a2, a3, b0, b1, lane);
#endif
}

/* Every thread of the CTA (on the host: of the emulated warp) has reached this point, and its shared
 * memory writes (asynchronous copies included, after mm_tile_copies_wait) are visible to all. */
MM_HD void mm_cta_sync(void) {
#if MM_DEVICE_CODE
    __syncthreads();
#else
    mm_cta_sync_emulated();
#endif
}

/* 16 (and 4) bytes global -> shared, or zeros when !valid (src must still be a readable address);
 * asynchronous where cp.async exists (sm_80+: its source size 0 fills zeros), else a plain copy */
MM_HD void mm_copy16_async(void *dst_shared, const void *src, bool valid) {
#if MM_DEVICE_CODE && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(SPECLA_USE_HIP)
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst_shared);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0) : "memory");
#elif MM_DEVICE_CODE
    *(uint4 *)dst_shared = valid ? *(const uint4 *)src : make_uint4(0u, 0u, 0u, 0u); /* a plain load: src may be activations */
#else
    if (valid) memcpy(dst_shared, src, 16);
    else memset(dst_shared, 0, 16);
#endif
}
MM_HD void mm_copy4_async(void *dst_shared, const void *src, bool valid) {
#if MM_DEVICE_CODE && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(SPECLA_USE_HIP)
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst_shared);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 4 : 0) : "memory");
#elif MM_DEVICE_CODE
    *(unsigned *)dst_shared = valid ? *(const unsigned *)src : 0u;
#else
    if (valid) memcpy(dst_shared, src, 4);
    else memset(dst_shared, 0, 4);
#endif
}
/* this thread's asynchronous copies have landed (a barrier then publishes them) */
MM_HD void mm_tile_copies_wait(void) {
#if MM_DEVICE_CODE && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(SPECLA_USE_HIP)
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

MM_HD uint2 mm_ld_stream_8(const void *p) {
#if MM_WEIGHTS_EVICT_FIRST
    uint2 v;
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;"
        : "=r"(v.x), "=r"(v.y)
        : "l"(p), "l"(mm_weights_policy()));
    return v;
#elif MM_DEVICE_CODE && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(SPECLA_USE_HIP)
    uint2 v;
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
#else
    uint2 v;
    v.x = mm_ld_u32(p), v.y = mm_ld_u32((const uint8_t *)p + 4);
    return v;
#endif
}

template <int TYPE> struct mm_tile_traits {
    static constexpr bool supported = TYPE == SPECLA_TYPE_Q4_K || TYPE == SPECLA_TYPE_Q5_K || TYPE == SPECLA_TYPE_Q6_K ||
                                      TYPE == SPECLA_TYPE_Q8_0;
    /* Q4_K and Q5_K share the block step (Q5_K adds the fifth bit of each level from qh) */
    static constexpr bool k4k5 = TYPE == SPECLA_TYPE_Q4_K || TYPE == SPECLA_TYPE_Q5_K;
    /* weight blocks per step of the chunk walk (a staging buffer, a barrier): 256 elements either way */
    static constexpr int step_blocks = TYPE == SPECLA_TYPE_Q8_0 ? 8 : 1;
    static constexpr int block_elements = 256 / step_blocks;
    /* token tiles of 8 per pass (more tokens take further passes over the chunk) */
    static constexpr int max_tiles = 4;
    /* bytes per token row of staged codes: 256 + padding. Q4_K and Q8_0 read 8 bytes at 32j + 8t of
     * rows g (a half-warp: 4 rows x 32 bytes; 288 = 32 mod 128 spreads them over 128 bytes of banks);
     * Q6_K reads 4 bytes at 16 grp + 4t of rows g (8 rows x 16 bytes; 272 = 16 mod 128) */
    static constexpr int row_stride = TYPE == SPECLA_TYPE_Q6_K ? 272 : 288;
    static constexpr int has_minops = k4k5;
    /* Q6_K stages the token's 16 bsums (int16) of the block: its levels go into the MMA unbiased
     * (0..63) and the bias comes off once per block as 32 sum_g sc_g bsum_g (mm_tile_block_k) */
    static constexpr int has_bsums = TYPE == SPECLA_TYPE_Q6_K;
    /* bytes per token after the codes: min operands (16) or bsums (32) */
    static constexpr int side_bytes = 16 * has_minops + 32 * has_bsums;
    /* shared-memory stages of the bulk form: Q8_0's steps are 17 KB a CTA (two row groups), so one
     * ahead keeps 4 CTAs an SM (70 KB in flight there) */
    static constexpr int bulk_stages = TYPE == SPECLA_TYPE_Q8_0 ? 2 : 3;
};

/* CTAs of 128 threads per SM the registers are sized for at NT tiles (ptxas, sm_90, no spills): Q5_K 4
 * up to 2 tiles, 3 beyond (it spilled 28 bytes at 4 and 3 tiles); Q4_K 5
 * (<= 96 registers) at 1 tile, 4 (<= 128) at 2 and 3, 3 (<= 168) at 4; Q6_K's larger blocks 3, and 2
 * at 4 tiles. 5 at one tile: the 27B Q4_K matrices' plans give 480-576 CTAs, one wave at 5 per SM
 * (660 on 132 SMs) where 4 (528) left a second wave of a few CTAs for ffn_up, attn_q and ffn_down. */
template <int TYPE, int NT> struct mm_tile_occupancy {
    static constexpr int ctas_per_sm = TYPE == SPECLA_TYPE_Q4_K ? (NT == 1 ? 5 : NT <= 3 ? 4 : 3)
                                       : TYPE == SPECLA_TYPE_Q5_K ? (NT <= 2 ? 4 : 3)
                                       : TYPE == SPECLA_TYPE_Q8_0 ? 3
                                                                  : (NT <= 3 ? 3 : 2);
};


/* One staging buffer for `tokens` tokens: codes [tokens][row_stride], min operands [tokens][16]
 * (Q4_K, Q5_K) or bsums [tokens][16] int16 (Q6_K), activation scales [step block][tokens] (a Q8_K
 * scale, or the 8 Q8_0 scales of a step) */
template <int TYPE> MM_HD constexpr int mm_tile_buf_bytes(int tokens) {
    return tokens * (mm_tile_traits<TYPE>::row_stride + mm_tile_traits<TYPE>::side_bytes +
                     4 * mm_tile_traits<TYPE>::step_blocks);
}

/* The blocks of the step that starts at block k of a chunk ending at k_end (one unless Q8_0). */
template <int TYPE> MM_HD int mm_tile_step_blocks(int k, int k_end) {
    constexpr int S = mm_tile_traits<TYPE>::step_blocks;
    if constexpr (S == 1) return 1; /* k < k_end: a constant for the k-quant kernels */
    else return k_end - k < S ? k_end - k : S;
}

/* Stage the activations of the step at block k (nv blocks) for tokens p0 .. p0 + 8 NT - 1 into buf
 * (zeros past the batch and past the step's blocks): thread `tid` of NTHREADS issues its share of the
 * copies (a fixed set per thread: the same pieces of every step). Offsets are 32-bit: the launch
 * guarantees n_batch * n < 2^31. */
template <int TYPE, int NT, int NTHREADS>
MM_HD void mm_tile_stage(uint8_t *buf, const mm_acts &act, uint32_t n, int n_batch, int k, int nv, int p0, int tid) {
    typedef mm_tile_traits<TYPE> tr;
    constexpr int tokens = 8 * NT, pieces = 16 * tokens; /* 16 pieces of 16 codes per token */
    constexpr int n_scales = tokens * tr::step_blocks;
    static_assert(tokens <= NTHREADS, "one thread per token for the min operands and Q8_K scales");
    uint8_t *side = buf + tokens * tr::row_stride; /* min operands or bsums */
    uint8_t *scales = side + tr::side_bytes * tokens;
    const uint32_t blocks = n / (uint32_t)tr::block_elements;
    const int valid_pieces = tr::step_blocks == 1 ? 16 : 2 * nv; /* a Q8_0 block is 2 pieces */
#pragma unroll
    for (int m = 0; m < (pieces + NTHREADS - 1) / NTHREADS; m++) {
        const int i = tid + NTHREADS * m;
        if (pieces % NTHREADS != 0 && i >= pieces) break;
        const int tok = i >> 4, part = i & 15, b = p0 + tok;
        const bool valid = b < n_batch && part < valid_pieces;
        /* an invalid piece still names a readable address: the step's first piece of a batch token */
        const uint32_t src = (uint32_t)(b < n_batch ? b : n_batch - 1) * n + (uint32_t)k * (uint32_t)tr::block_elements +
                             (part < valid_pieces ? 16u * (uint32_t)part : 0u);
        mm_copy16_async(buf + tok * tr::row_stride + 16 * part, act.codes + src, valid);
    }
    if constexpr (tr::step_blocks == 1) {
        if (tid < tokens) { /* the min operands (or bsums) and the scale of token tid */
            const int b = p0 + tid;
            const bool valid = b < n_batch;
            const uint32_t blk = (uint32_t)(valid ? b : n_batch - 1) * blocks + (uint32_t)k;
            if (tr::has_minops) mm_copy16_async(side + 16 * tid, act.minops + 16u * blk, valid);
            if (tr::has_bsums) {
                mm_copy16_async(side + 32 * tid, act.bsums + 16u * blk, valid);
                mm_copy16_async(side + 32 * tid + 16, act.bsums + 16u * blk + 8u, valid);
            }
            mm_copy4_async(scales + 4 * tid, act.scales + blk, valid);
        }
    } else {
#pragma unroll
        for (int m = 0; m < (n_scales + NTHREADS - 1) / NTHREADS; m++) { /* scale j of token tok */
            const int i = tid + NTHREADS * m;
            if (n_scales % NTHREADS != 0 && i >= n_scales) break;
            const int tok = i % tokens, j = i / tokens, b = p0 + tok;
            const bool valid = b < n_batch && j < nv;
            const uint32_t blk = (uint32_t)(b < n_batch ? b : n_batch - 1) * blocks + (uint32_t)k + (uint32_t)(j < nv ? j : 0);
            mm_copy4_async(scales + 4 * i, act.scales + blk, valid);
        }
    }
}

/* A warp's 16 rows of one weight block: thread (g, t) holds rows g (index 0) and g + 8 (index 1). */
template <int TYPE> struct mm_tile_frag;
template <> struct mm_tile_frag<SPECLA_TYPE_Q4_K> {
    uint2 q[2][4]; /* [row][run]: qs bytes 32 run + 8t .. + 7 */
    uint4 h[2];    /* d, dmin | 12 scale bytes */
};
template <> struct mm_tile_frag<SPECLA_TYPE_Q5_K> {
    uint2 q[2][4]; /* as Q4_K */
    uint4 h[2];
    uint2 qh[2];   /* [row]: qh bytes 8t .. 8t + 7, the fifth bits of those elements of every sub-block */
};
template <> struct mm_tile_frag<SPECLA_TYPE_Q6_K> {
    uint32_t q[2][12]; /* [row][piece]: word t of ql (pieces 0..7) and qh (8..11) */
    uint4 sc[2];       /* the 16 int8 group scales */
    uint16_t d[2];
};
template <> struct mm_tile_frag<SPECLA_TYPE_Q8_0> {
    uint2 q[2][8];     /* [row][block of the step]: qs bytes 8t .. 8t + 7 */
    uint16_t d[2][8];  /* [row][block]: the fp16 scale */
};

/* A thread's weight addresses in a row group (rows 16 half + g and, 128 bytes further in every plane,
 * 16 half + g + 8), computed once per pass; a block adds k * 32 * unit_bytes. */
struct mm_tile_wptr {
    const uint8_t *h;  /* the row's 16 bytes of plane 0 (Q4_K, Q5_K: d, dmin, scales) */
    const uint8_t *q;  /* Q4_K: qs bytes 8t.. (piece 1 + t / 2, 8 (t & 1)); Q5_K the same from piece 3;
                          Q8_0 the same from piece 0; Q6_K: word t of plane 0 */
    const uint8_t *d;  /* Q6_K, Q8_0: the row's fp16 d (the side plane) */
    const uint8_t *qh; /* Q5_K: qh bytes 8t.. (piece 1 + t / 2, 8 (t & 1)) */
};
template <int TYPE> MM_HD mm_tile_wptr mm_tile_wptr_for(const uint8_t *group_base, int half, int g, int t) {
    mm_tile_wptr p;
    const int row = 16 * half + g;
    p.h = group_base + 16 * row;
    /* Q5_K's qh takes pieces 1 and 2; Q8_0's qs starts the block */
    const int q_piece = TYPE == SPECLA_TYPE_Q5_K ? 3 : TYPE == SPECLA_TYPE_Q8_0 ? 0 : 1;
    p.q = mm_tile_traits<TYPE>::k4k5 || TYPE == SPECLA_TYPE_Q8_0 ? p.h + 16 * MM_GROUP_ROWS * (q_piece + (t >> 1)) + 8 * (t & 1)
                                                                   : p.h + 4 * t;
    p.d = group_base + mm_traits<TYPE>::pieces * 16 * MM_GROUP_ROWS + 2 * row; /* the side plane (Q6_K, Q8_0) */
    p.qh = p.h + 16 * MM_GROUP_ROWS * (1 + (t >> 1)) + 8 * (t & 1); /* read for Q5_K only */
    return p;
}

/* A T from shared memory (the staged kernels' buffers; on the host, the emulation's byte arrays). */
template <typename T> MM_HD T mm_lds(const uint8_t *p) {
#if MM_DEVICE_CODE
    return *(const T *)p;
#else
    T v;
    memcpy(&v, p, sizeof v);
    return v;
#endif
}

/* word i (0..3) of v: a constant i folds to the word, a per-lane one is three selects */
MM_HD uint32_t mm_word_of(const uint4 &v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

/* Load block k of a k-quant's two rows of the thread: from the prepared weight in global memory
 * (streaming loads), or, with SHARED, from slots laid out the same way in shared memory (the bulk
 * kernel's stages). */
template <int TYPE, bool SHARED> MM_HD void mm_tile_load_k(mm_tile_frag<TYPE> &f, const mm_tile_wptr &p, int k) {
    const int koff = k * MM_GROUP_ROWS * mm_traits<TYPE>::unit_bytes;
    const uint8_t *h = p.h + koff, *q = p.q + koff;
#pragma unroll
    for (int r = 0; r < 2; r++) { /* row g + 8 r: 16 * 8 r bytes further in every 16-byte plane */
        if constexpr (TYPE == SPECLA_TYPE_Q5_K) {
            const uint8_t *qh = p.qh + koff + 128 * r;
            if constexpr (SHARED) f.qh[r] = mm_lds<uint2>(qh);
            else f.qh[r] = mm_ld_stream_8(qh);
        }
        if constexpr (mm_tile_traits<TYPE>::k4k5) {
            if constexpr (SHARED) {
                f.h[r] = mm_lds<uint4>(h + 128 * r);
            } else {
                /* two 8-byte loads: a 16-byte one needs 4 aligned consecutive registers, which made
                 * ptxas route the first block's header through local memory at 3 tiles */
                const uint2 lo = mm_ld_stream_8(h + 128 * r), hi = mm_ld_stream_8(h + 128 * r + 8);
                f.h[r] = make_uint4(lo.x, lo.y, hi.x, hi.y);
            }
#pragma unroll
            for (int run = 0; run < 4; run++) { /* qs byte 32 run + 8t sits in piece 1 + 2 run + t / 2 */
                const uint8_t *at = q + 128 * r + 2 * run * 16 * MM_GROUP_ROWS;
                if constexpr (SHARED) f.q[r][run] = mm_lds<uint2>(at);
                else f.q[r][run] = mm_ld_stream_8(at);
            }
        } else {
            const uint8_t *sc = h + 128 * r + 12 * 16 * MM_GROUP_ROWS, *d = p.d + koff + 16 * r;
            if constexpr (SHARED) {
#pragma unroll
                for (int pc = 0; pc < 12; pc++) f.q[r][pc] = mm_lds<uint32_t>(q + 128 * r + pc * 16 * MM_GROUP_ROWS);
                f.sc[r] = mm_lds<uint4>(sc), f.d[r] = mm_lds<uint16_t>(d);
            } else {
#pragma unroll
                for (int pc = 0; pc < 12; pc++) f.q[r][pc] = mm_ld_stream_u32(q + 128 * r + pc * 16 * MM_GROUP_ROWS);
                f.sc[r] = mm_ld_stream_16(sc), f.d[r] = mm_ld_u16(d);
            }
        }
    }
}

/* The same for a Q8_0 step of nv blocks from block k: a block past nv is loaded from block nv - 1
 * (an address the caller vouches for), and never used. */
template <bool SHARED>
MM_HD void mm_tile_load_q8_0(mm_tile_frag<SPECLA_TYPE_Q8_0> &f, const mm_tile_wptr &p, int k, int nv) {
    constexpr int slot_bytes = MM_GROUP_ROWS * mm_traits<SPECLA_TYPE_Q8_0>::unit_bytes;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int koff = (k + (j < nv ? j : nv - 1)) * slot_bytes;
#pragma unroll
        for (int r = 0; r < 2; r++) { /* row g + 8 r: 16 * 8 r bytes further in every plane */
            const uint8_t *q = p.q + koff + 128 * r, *d = p.d + koff + 16 * r;
            if constexpr (SHARED) f.q[r][j] = mm_lds<uint2>(q), f.d[r][j] = mm_lds<uint16_t>(d);
            else f.q[r][j] = mm_ld_stream_8(q), f.d[r][j] = mm_ld_u16(d);
        }
    }
}

/* Load the step at block k (nv blocks: one unless Q8_0) of the thread's two rows. */
template <int TYPE, bool SHARED = false>
MM_HD void mm_tile_load(mm_tile_frag<TYPE> &f, const mm_tile_wptr &p, int k, int nv = 1) {
    if constexpr (TYPE == SPECLA_TYPE_Q8_0) {
        mm_tile_load_q8_0<SHARED>(f, p, k, nv);
    } else {
        (void)nv;
        mm_tile_load_k<TYPE, SHARED>(f, p, k);
    }
}

/* A Q8_0 step of nv blocks (FULL: all 8, no branch inside) for the warp's 16 rows and NT tiles: per
 * block and tile one m16n8k32 (the block's exact int32 dot), then mm_block_q8_0's float step for the
 * thread's C elements, acc = fma(d * da, s, acc), blocks in chunk order. */
template <int NT, bool FULL>
MM_HD void mm_tile_block_q8_0(const mm_tile_frag<SPECLA_TYPE_Q8_0> &f, const uint8_t *buf, int g, int t, int nv,
                              float acc[NT][4]) {
    typedef mm_tile_traits<SPECLA_TYPE_Q8_0> tr;
    const int lane = 4 * g + t;
    const uint8_t *scales = buf + 8 * NT * tr::row_stride; /* [block][token] */
    const uint8_t *brow = buf + g * tr::row_stride;        /* token g of tile 0 */
#pragma unroll
    for (int j = 0; j < 8; j++) {
        if (!FULL && j >= nv) break;
        const float d0 = mm_half(f.d[0][j]), d1 = mm_half(f.d[1][j]);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const uint2 b = mm_lds<uint2>(brow + 8 * nt * tr::row_stride + 32 * j + 8 * t);
            int32_t c[4] = {0, 0, 0, 0};
            mm_mma_k32(c, f.q[0][j].x, f.q[1][j].x, f.q[0][j].y, f.q[1][j].y, b.x, b.y, lane);
            const float2 da = mm_lds<float2>(scales + 4 * (8 * NT * j + 8 * nt + 2 * t)); /* tokens 2t, 2t + 1 */
#pragma unroll
            for (int i = 0; i < 4; i++)
                acc[nt][i] = mm_fma(mm_mul(i < 2 ? d0 : d1, (i & 1) ? da.y : da.x), mm_i2f(c[i]), acc[nt][i]);
        }
    }
}

/* A k-quant block's step for the warp's 16 rows and NT tiles. No branch inside, so the compiler can
 * interleave the shared-memory loads, MMAs and integer adds of different sub-blocks and tiles. */
template <int TYPE, int NT>
MM_HD void mm_tile_block_k(const mm_tile_frag<TYPE> &f, const uint8_t *buf, int g, int t, float acc[NT][4]) {
    typedef mm_tile_traits<TYPE> tr;
    const int lane = 4 * g + t;
    const uint8_t *scales = buf + 8 * NT * (tr::row_stride + tr::side_bytes);
    const uint8_t *brow = buf + g * tr::row_stride; /* token g of tile 0 */
    int32_t s[NT][4] = {};
    if constexpr (tr::k4k5) {
        /* the 8 scales and 8 mins of each row as packed bytes (mm_scale_min, 4 bytes at a time) */
        uint32_t sc[2][2], mn[2][2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const uint32_t w0 = f.h[r].y, w1 = f.h[r].z, w2 = f.h[r].w;
            sc[r][0] = w0 & 0x3F3F3F3Fu;
            mn[r][0] = w1 & 0x3F3F3F3Fu;
            sc[r][1] = (w2 & 0x0F0F0F0Fu) | ((w0 >> 2) & 0x30303030u);
            mn[r][1] = ((w2 >> 4) & 0x0F0F0F0Fu) | ((w1 >> 2) & 0x30303030u);
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int run = j / 2, shift = 4 * (j % 2);
            uint32_t a0 = (f.q[0][run].x >> shift) & 0x0F0F0F0Fu, a1 = (f.q[1][run].x >> shift) & 0x0F0F0F0Fu;
            uint32_t a2 = (f.q[0][run].y >> shift) & 0x0F0F0F0Fu, a3 = (f.q[1][run].y >> shift) & 0x0F0F0F0Fu;
            if constexpr (TYPE == SPECLA_TYPE_Q5_K) { /* bit j of qh[l] is bit 4 of element l's level */
                a0 |= ((f.qh[0].x >> j) & 0x01010101u) << 4, a1 |= ((f.qh[1].x >> j) & 0x01010101u) << 4;
                a2 |= ((f.qh[0].y >> j) & 0x01010101u) << 4, a3 |= ((f.qh[1].y >> j) & 0x01010101u) << 4;
            }
            const int32_t sc0 = (int32_t)mm_byte_of(sc[0][j / 4], j % 4);
            const int32_t sc1 = (int32_t)mm_byte_of(sc[1][j / 4], j % 4);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const uint2 b = mm_lds<uint2>(brow + 8 * nt * tr::row_stride + 32 * j + 8 * t);
                int32_t c[4] = {0, 0, 0, 0};
                mm_mma_k32(c, a0, a1, a2, a3, b.x, b.y, lane);
                s[nt][0] += sc0 * c[0], s[nt][1] += sc0 * c[1], s[nt][2] += sc1 * c[2], s[nt][3] += sc1 * c[3];
            }
        }
        /* t = sum_j m_j pair_j: A k 0..3 (t = 0) mins 0..3, k 4..7 (t = 1) mins 4..7, the rest zero */
        const uint32_t am0 = t == 0 ? mn[0][0] : t == 1 ? mn[0][1] : 0u;
        const uint32_t am1 = t == 0 ? mn[1][0] : t == 1 ? mn[1][1] : 0u;
        const uint8_t *mins = buf + 8 * NT * tr::row_stride + 16 * g + 4 * (t & 1);
        const float d0 = mm_half((uint16_t)(f.h[0].x & 0xffffu)), d1 = mm_half((uint16_t)(f.h[1].x & 0xffffu));
        const float m0 = mm_half((uint16_t)(f.h[0].x >> 16)), m1 = mm_half((uint16_t)(f.h[1].x >> 16));
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            /* B k 4t..4t+3 of token g: lo (or hi) bytes of pairs 4 (t & 1) .. + 3; A is zero for t >= 2 */
            const uint8_t *mo = mins + 16 * 8 * nt;
            int32_t lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
            mm_mma_k16(lo, am0, am1, mm_lds<uint32_t>(mo), lane);
            mm_mma_k16(hi, am0, am1, mm_lds<uint32_t>(mo + 8), lane);
            const float2 da = mm_lds<float2>(scales + 4 * (8 * nt + 2 * t)); /* tokens 2t, 2t + 1 of the tile */
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float dai = (i & 1) ? da.y : da.x;
                const float d = i < 2 ? d0 : d1, dmin = i < 2 ? m0 : m1;
                const int32_t tm = lo[i] + 128 * hi[i];
                acc[nt][i] = mm_fma(mm_mul(dai, d), mm_i2f(s[nt][i]), acc[nt][i]);
                acc[nt][i] = mm_fma(-mm_mul(dai, dmin), mm_i2f(tm), acc[nt][i]);
            }
        }
    } else {
#pragma unroll
        for (int h6 = 0; h6 < 2; h6++)
#pragma unroll
            for (int m = 0; m < 4; m++)
#pragma unroll
                for (int jj = 0; jj < 2; jj++) {
                    const int grp = 8 * h6 + 2 * m + jj; /* elements 16 grp .. 16 grp + 15 */
                    uint32_t a[2];
                    int32_t sc[2];
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        const uint32_t qa = f.q[r][4 * h6 + jj], qb = f.q[r][4 * h6 + 2 + jj], qhw = f.q[r][8 + 2 * h6 + jj];
                        uint32_t v;
                        if (m == 0) v = (qa & 0x0F0F0F0Fu) | ((qhw << 4) & 0x30303030u);
                        else if (m == 1) v = (qb & 0x0F0F0F0Fu) | ((qhw << 2) & 0x30303030u);
                        else if (m == 2) v = ((qa >> 4) & 0x0F0F0F0Fu) | (qhw & 0x30303030u);
                        else v = ((qb >> 4) & 0x0F0F0F0Fu) | ((qhw >> 2) & 0x30303030u);
                        a[r] = v; /* levels 0..63, the bias of 32 comes off after the groups */
                        sc[r] = (int8_t)(mm_word_of(f.sc[r], grp >> 2) >> (8 * (grp & 3)));
                    }
                    uint32_t b[NT];
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) b[nt] = mm_lds<uint32_t>(brow + 8 * nt * tr::row_stride + 16 * grp + 4 * t);
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) {
                        int32_t c[4] = {0, 0, 0, 0};
                        mm_mma_k16(c, a[0], a[1], b[nt], lane);
                        s[nt][0] += sc[0] * c[0], s[nt][1] += sc[0] * c[1], s[nt][2] += sc[1] * c[2], s[nt][3] += sc[1] * c[3];
                    }
                }
        /* s so far is sum_g sc_g (levels . codes); the block's integer is sum_g sc_g ((levels - 32) .
         * codes) = s - 32 u, u = sum_g sc_g bsum_g: one m16n8k16 per byte of the bsums (A: groups
         * 4t..4t+3 of the row's 16 scales, word t; B: the lo / hi bytes of bsums 4t..4t+3 of token
         * g), u = lo-dot + 256 hi-dot. Every sum is exact in int32 (|s| < 2^28), so the same integer. */
        const uint32_t as0 = mm_word_of(f.sc[0], t), as1 = mm_word_of(f.sc[1], t);
        const uint8_t *bsums = buf + 8 * NT * tr::row_stride + 32 * g + 8 * t; /* token g of tile 0 */
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const uint2 w = mm_lds<uint2>(bsums + 32 * 8 * nt);
            int32_t lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
            mm_mma_k16<true>(lo, as0, as1, mm_byte_perm(w.x, w.y, 0x6420u), lane);
            mm_mma_k16(hi, as0, as1, mm_byte_perm(w.x, w.y, 0x7531u), lane);
#pragma unroll
            for (int i = 0; i < 4; i++) s[nt][i] -= 32 * (lo[i] + 256 * hi[i]);
        }
        const float d0 = mm_half(f.d[0]), d1 = mm_half(f.d[1]);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const float2 da = mm_lds<float2>(scales + 4 * (8 * nt + 2 * t));
#pragma unroll
            for (int i = 0; i < 4; i++)
                acc[nt][i] = mm_fma(mm_mul((i & 1) ? da.y : da.x, i < 2 ? d0 : d1), mm_i2f(s[nt][i]), acc[nt][i]);
        }
    }
}

/* The step's arithmetic for the warp's 16 rows and the pass's NT tiles (tile nt: staged tokens 8 nt ..
 * 8 nt + 7; every tile is computed, staged tokens past the batch are zeros and never stored):
 * acc[nt][i] for the thread's C element i; nv: the step's blocks (Q8_0; one otherwise). */
template <int TYPE, int NT>
MM_HD void mm_tile_block(const mm_tile_frag<TYPE> &f, const uint8_t *buf, int g, int t, float acc[NT][4], int nv = 1) {
    if constexpr (TYPE == SPECLA_TYPE_Q8_0) {
        if (nv == 8) mm_tile_block_q8_0<NT, true>(f, buf, g, t, 8, acc);
        else mm_tile_block_q8_0<NT, false>(f, buf, g, t, nv, acc);
    } else {
        (void)nv;
        mm_tile_block_k<TYPE, NT>(f, buf, g, t, acc);
    }
}

/* One step of a pass (the step at block k; kn = k + step_blocks the next): load step kn into `ahead`,
 * stage step kn's activations into the other buffer, run step k from `cur` and the buffer staged one
 * step earlier, then wait for this thread's copies and meet the CTA (after which the buffer just read
 * may be staged again and the one just staged may be read). */
template <int TYPE, int NT, int NTHREADS>
MM_HD void mm_tile_step(const mm_launch_args &args, const mm_tile_frag<TYPE> &cur, mm_tile_frag<TYPE> &ahead, bool active,
                        const mm_tile_wptr &wp, int k, int k_begin, int k_end, int p0, int g, int t, int tid,
                        uint8_t *smem, float acc[NT][4]) {
    constexpr int buf_bytes = mm_tile_buf_bytes<TYPE>(8 * NT), S = mm_tile_traits<TYPE>::step_blocks;
    const int kn = k + S, next_buf = ((kn - k_begin) / S) & 1;
    /* clamped as well as guarded (matmul_mma.cuh's mm_ld_stream_u32 says why) */
    const int kn_clamped = min(kn, k_end - 1);
    if (active && kn < k_end) mm_tile_load(ahead, wp, kn_clamped, mm_tile_step_blocks<TYPE>(kn_clamped, k_end));
    if (kn < k_end) /* buffer next_buf was last read before the previous step's barrier */
        mm_tile_stage<TYPE, NT, NTHREADS>(smem + next_buf * buf_bytes, args.act, (uint32_t)args.n, args.n_batch, kn,
                                          mm_tile_step_blocks<TYPE>(kn, k_end), p0, tid);
    if (active) mm_tile_block<TYPE, NT>(cur, smem + (next_buf ^ 1) * buf_bytes, g, t, acc, mm_tile_step_blocks<TYPE>(k, k_end));
    mm_tile_copies_wait();
    mm_cta_sync();
}

/* Where warp `warp` of staged CTA `cta` works: its matrix, row-group pair and chunk c, its row group
 * rg = 2 pair + warp / 2 (active: it exists; the second of an odd count does not) and 16-row half,
 * and the chunk's blocks [k_begin, k_end). */
typedef struct mm_tile_place {
    mm_mat_args M;
    int pair, c, rg, half, k_begin, k_end;
    bool active;
} mm_tile_place;
MM_HD mm_tile_place mm_tile_place_of(const mm_launch_args &args, int cta, int warp) {
    mm_tile_place P;
    P.M = mm_select_mat_cta(args, cta);
    const int local = cta - P.M.cta_begin;
    P.pair = local / P.M.n_chunks, P.c = local % P.M.n_chunks;
    P.rg = 2 * P.pair + (warp >> 1), P.half = warp & 1;
    P.active = P.rg < P.M.row_groups;
    P.k_begin = P.c * P.M.chunk_blocks;
    P.k_end = P.M.n_blocks < P.k_begin + P.M.chunk_blocks ? P.M.n_blocks : P.k_begin + P.M.chunk_blocks;
    return P;
}

/* CTA `cta` of a launch, as thread `tid` of NTHREADS (warp `warp`, lane `lane`) with the CTA's shared
 * memory `smem` (2 staging buffers): the partial sums of the warp's 16 rows for every token, stored
 * with mm_store. The split-K finish is the caller's. Each step's weights are loaded one step ahead of
 * its MMAs (two register fragments, the loop unrolled by 2 so that no fragment is copied; a third,
 * deeper one cost the registers of a fifth CTA per SM at one tile). On the host (the emulation) NTHREADS is 32: each emulated warp stages every copy itself,
 * which writes the same bytes. */
template <int TYPE, int NT, int NTHREADS>
MM_HD void mm_tile_cta(const mm_launch_args &args, int cta, int warp, int lane, int tid, uint8_t *smem) {
    const int g = lane >> 2, t = lane & 3;
    const mm_tile_place P = mm_tile_place_of(args, cta, warp);
    const mm_mat_args &M = P.M;
    const int c = P.c, rg = P.rg, half = P.half, k_begin = P.k_begin, k_end = P.k_end;
    const bool active = P.active;
    const mm_tile_wptr wp = mm_tile_wptr_for<TYPE>(M.w + mm_slot_offset(TYPE, M.n_blocks, active ? rg : 0, 0), half, g, t);
    constexpr int tokens = 8 * NT, S = mm_tile_traits<TYPE>::step_blocks;
    const int nv_first = mm_tile_step_blocks<TYPE>(k_begin, k_end);

    for (int p0 = 0; p0 < args.n_batch; p0 += tokens) {
        float acc[NT][4] = {};
        mm_tile_frag<TYPE> f0, f1;
        if (active) mm_tile_load(f0, wp, k_begin, nv_first);
        mm_wait_prior_grid(); /* the weights are constant; the activations are the previous kernel's */
        if (p0 == 0 && tid == 0) mm_trace(cta, MM_TRACE_WAITED);
        mm_tile_stage<TYPE, NT, NTHREADS>(smem, args.act, (uint32_t)args.n, args.n_batch, k_begin, nv_first, p0, tid);
        mm_tile_copies_wait();
        mm_cta_sync();
        for (int k = k_begin; k < k_end; k += 2 * S) {
            mm_tile_step<TYPE, NT, NTHREADS>(args, f0, f1, active, wp, k, k_begin, k_end, p0, g, t, tid, smem, acc);
            if (k + S < k_end) mm_tile_step<TYPE, NT, NTHREADS>(args, f1, f0, active, wp, k + S, k_begin, k_end, p0, g, t, tid, smem, acc);
        }
        if (active) mm_store_c_tiles<NT>(M, c, rg, half, g, t, p0, args.n_batch, acc);
    }
}

/* The token tiles per pass the staged kernel (and the host emulation) runs for n_batch tokens. */
template <int TYPE> MM_HD int mm_tile_tiles(int n_batch) {
    const int need = (n_batch + 7) / 8;
    return need < mm_tile_traits<TYPE>::max_tiles ? need : mm_tile_traits<TYPE>::max_tiles;
}

/* A row group's slot of one block, and its slots of one step (a stage of the bulk form holds two). */
template <int TYPE> MM_HD constexpr int mm_tile_slot_bytes() { return MM_GROUP_ROWS * mm_traits<TYPE>::unit_bytes; }
/* a row group's weights of one step, as one stage holds them */
template <int TYPE> MM_HD constexpr int mm_tile_step_bytes() { return mm_tile_traits<TYPE>::step_blocks * mm_tile_slot_bytes<TYPE>(); }

#ifdef MM_KERNELS /* matmul.cu: the kernel */
/* The split-K finish of the staged kernel, for the whole CTA: the last CTA of a row-group pair to arrive
 * (one arrival counter per pair, counters[pair]) adds the pair's partial sums in chunk order,
 * ((p_0 + p_1) + p_2) + ..., as mm_finish_unit does (mm_finish_rows: thread tid takes the 4 rows
 * 64 pair + 4 (tid % 16) and every eighth token from tid / 16, 16 reads of 16 bytes in flight). */
__device__ __forceinline__ void mm_tile_finish(const mm_mat_args &M, int pair, int n_batch) {
    if (M.n_chunks == 1 || M.unfinished) return; /* the partial sums were y, or are the output */
    __shared__ unsigned arrived;
    __threadfence(); /* this thread's partial sums, before the CTA's arrival */
    __syncthreads();
    if (threadIdx.x == 0) arrived = atomicAdd(M.counters + pair, 1u);
    __syncthreads();
    if (arrived != (unsigned)M.n_chunks - 1) return; /* the whole CTA */
    __threadfence();
    mm_finish_rows<16>(M, pair * 2 * MM_GROUP_ROWS, 2 * MM_GROUP_ROWS, n_batch, threadIdx.x, MM_THREADS);
    if (threadIdx.x == 0) M.counters[pair] = 0; /* ready for the next launch that uses this slot */
}

template <int TYPE, int NT>
__global__ void __launch_bounds__(MM_THREADS, (mm_tile_occupancy<TYPE, NT>::ctas_per_sm)) mm_tile_kernel(const mm_launch_args args) {
    __shared__ __align__(16) uint8_t smem[2 * mm_tile_buf_bytes<TYPE>(8 * NT)];
    const int cta = blockIdx.x;
    mm_allow_dependents(); /* launch.h: the next kernel may launch; it waits for this grid's end */
    if (cta >= args.n_ctas) return; /* the whole CTA */
    if (threadIdx.x == 0) mm_trace(cta, MM_TRACE_START);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    mm_tile_cta<TYPE, NT, MM_THREADS>(args, cta, warp, lane, threadIdx.x, smem);
    if (threadIdx.x == 0) mm_trace(cta, MM_TRACE_LOOP_DONE);
    const mm_tile_place P = mm_tile_place_of(args, cta, warp);
    mm_tile_finish(P.M, P.pair, args.n_batch);
    if (threadIdx.x == 0) mm_trace(cta, MM_TRACE_END);
}

/* ---- sm_90: the weights by bulk copy (TMA) into a ring of shared-memory stages ------------------- */
/* The same CTA, units, fragments and step as mm_tile_cta, with the weight stream moved off the
 * registers: the CTA's two row groups' slots of a step (2 x step_blocks x 32 x unit_bytes bytes, each
 * row group's contiguous in the prepared layout) land in one of mm_tile_traits::bulk_stages (S)
 * shared-memory stages by two cp.async.bulk copies, which one thread issues and an mbarrier per stage
 * counts in bytes. So S - 1 steps are in flight while one is computed (the register path holds one),
 * the first S are issued before the wait for the previous kernel (the weights are constant), and no
 * register holds a step ahead, which leaves room for a fifth CTA per SM. A thread reads its fragment
 * of the current step from the stage with mm_tile_load's offsets (its SHARED form); the arithmetic
 * (mm_tile_block) and the partial sums are mm_tile_cta's, bit for bit. The activations are staged as
 * there (cp.async, one step ahead, a CTA barrier per step); that barrier also frees the stage just
 * read, into which thread 0 then issues the step S further on. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(SPECLA_USE_HIP)
#define MM_TILE_BULK_DEVICE 1
#else
#define MM_TILE_BULK_DEVICE 0
#endif

/* dynamic shared memory of the bulk kernel: the mbarriers (128 bytes), the weight stages, the two
 * activation buffers */
template <int TYPE, int NT> MM_HD constexpr int mm_tile_bulk_smem_bytes() {
    return 128 + mm_tile_traits<TYPE>::bulk_stages * 2 * mm_tile_step_bytes<TYPE>() + 2 * mm_tile_buf_bytes<TYPE>(8 * NT);
}
/* CTAs per SM the bulk kernel's registers are sized for (shared memory allows these too: Q4_K 42.6 KB
 * per CTA at 3 tiles, Q6_K 55.2 KB with its staged bsums (4 x 56.2 KB with the per-CTA reserve is
 * 225 KB of the SM's 228 KiB), Q8_0 50.3 KB): without the register fragment ahead Q4_K fits 5
 * up to 3 tiles (one wave for the 27B Q4_K matrices, 480-576 CTAs on 660 slots), Q6_K 4. */
template <int TYPE, int NT> struct mm_tile_bulk_occupancy {
    /* Q5_K: 48.6 KB of shared memory a CTA at 3 tiles (its 176-byte blocks), so 4 an SM */
    static constexpr int ctas_per_sm = TYPE == SPECLA_TYPE_Q4_K ? (NT <= 3 ? 5 : 4) : (NT <= 3 ? 4 : 3);
};

#if MM_TILE_BULK_DEVICE
__device__ __forceinline__ uint32_t mm_smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mm_bar_init(uint64_t *bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(mm_smem_addr(bar)), "r"(count) : "memory");
}
/* thread 0: the stage's barrier expects `bytes` more bytes, then the copies that bring them */
__device__ __forceinline__ void mm_bar_expect(uint64_t *bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(mm_smem_addr(bar)), "r"(bytes) : "memory");
}
/* evict-first in L2 in a build that asks for it, as every weight load (matmul_blocks.h,
 * MM_WEIGHTS_EVICT_FIRST) */
__device__ __forceinline__ void mm_bulk_copy(void *dst, const void *src, unsigned bytes, uint64_t *bar) {
#if MM_WEIGHTS_EVICT_FIRST
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
            mm_smem_addr(dst)),
        "l"(src), "r"(bytes), "r"(mm_smem_addr(bar)), "l"(mm_weights_policy())
        : "memory");
#else
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     mm_smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(mm_smem_addr(bar))
                 : "memory");
#endif
}
/* blocks until the barrier's phase of parity `parity` has completed (its bytes landed) */
__device__ __forceinline__ void mm_bar_wait(uint64_t *bar, unsigned parity) {
    unsigned done = 0;
    while (!done)
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(mm_smem_addr(bar)), "r"(parity)
                     : "memory");
}

#endif

/* CTA `cta` of a bulk launch (mm_tile_bulk_kernel, or its type's share of mm_tile_bulk_pair_kernel),
 * with the launch's dynamic shared memory `dyn` (mm_tile_bulk_smem_bytes<TYPE, NT> of it used). */
#if MM_TILE_BULK_DEVICE
template <int TYPE, int NT> __device__ __forceinline__ void mm_tile_bulk_cta(const mm_launch_args &args, int cta, uint8_t *dyn) {
    /* S stages of 2 x step_bytes; a step is SB blocks (k counts blocks) */
    constexpr int S = mm_tile_traits<TYPE>::bulk_stages, SB = mm_tile_traits<TYPE>::step_blocks;
    constexpr int slot_bytes = mm_tile_slot_bytes<TYPE>(), step_bytes = mm_tile_step_bytes<TYPE>(), tokens = 8 * NT;
    constexpr int buf_bytes = mm_tile_buf_bytes<TYPE>(tokens);
    uint64_t *full = (uint64_t *)dyn;
    uint8_t *stages = dyn + 128, *acts = stages + S * 2 * step_bytes;
    const int tid = threadIdx.x;
    mm_allow_dependents(); /* launch.h: the next kernel may launch; it waits for this grid's end */
    if (cta >= args.n_ctas) return; /* the whole CTA */
    if (tid == 0) mm_trace(cta, MM_TRACE_START);
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const mm_tile_place P = mm_tile_place_of(args, cta, warp);
    const mm_mat_args &M = P.M;
    const int pair = P.pair, c = P.c, rg = P.rg, half = P.half, k_begin = P.k_begin, k_end = P.k_end;
    const bool active = P.active;
    const int n_slots = 2 * pair + 1 < M.row_groups ? 2 : 1;
    /* slot k of row group 2 pair; the second row group's slot k sits n_blocks slots further */
    const uint8_t *w0 = M.w + mm_slot_offset(TYPE, M.n_blocks, 2 * pair, 0);
    const int64_t rg_stride = (int64_t)M.n_blocks * slot_bytes;
    /* thread 0 brings the step at block k (its slots are consecutive in each row group) into stage `st` */
    auto issue = [&](int k, int st) {
        const unsigned bytes = (unsigned)(mm_tile_step_blocks<TYPE>(k, k_end) * slot_bytes);
        mm_bar_expect(full + st, (unsigned)n_slots * bytes);
        for (int i = 0; i < n_slots; i++)
            mm_bulk_copy(stages + (st * 2 + i) * step_bytes, w0 + i * rg_stride + (int64_t)k * slot_bytes, bytes, full + st);
    };
    if (tid == 0) {
        for (int st = 0; st < S; st++) mm_bar_init(full + st, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    int step = 0; /* steps consumed so far, over every pass: stage step % S, phase parity (step / S) & 1 */
    for (int p0 = 0; p0 < args.n_batch; p0 += tokens) {
        if (tid == 0)
            for (int i = 0; i < S && k_begin + i * SB < k_end; i++) issue(k_begin + i * SB, (step + i) % S);
        float acc[NT][4] = {};
        mm_wait_prior_grid(); /* the weights are constant; the activations are the previous kernel's */
        if (p0 == 0 && tid == 0) mm_trace(cta, MM_TRACE_WAITED);
        mm_tile_stage<TYPE, NT, MM_THREADS>(acts, args.act, (uint32_t)args.n, args.n_batch, k_begin,
                                            mm_tile_step_blocks<TYPE>(k_begin, k_end), p0, tid);
        mm_tile_copies_wait();
        mm_cta_sync();
        for (int k = k_begin; k < k_end; k += SB, step++) {
            const int nv = mm_tile_step_blocks<TYPE>(k, k_end);
#if defined(MM_TILE_DIAG_ACT_ONCE)
            /* diagnostic build: every step reads the first step's staged activations (wrong
             * results), to time the kernel without its per-step activation staging */
            const int cur_buf = 0, st = step % S;
#else
            const int cur_buf = ((k - k_begin) / SB) & 1, st = step % S;
            if (k + SB < k_end) /* buffer cur_buf ^ 1 was last read before the previous step's barrier */
                mm_tile_stage<TYPE, NT, MM_THREADS>(acts + (cur_buf ^ 1) * buf_bytes, args.act, (uint32_t)args.n,
                                                    args.n_batch, k + SB, mm_tile_step_blocks<TYPE>(k + SB, k_end), p0, tid);
#endif
            mm_bar_wait(full + st, (unsigned)(step / S) & 1u);
            if (active) {
                mm_tile_frag<TYPE> f;
                /* the warp's row group's slots in stage st, read as blocks 0.. of a row group there */
                mm_tile_load<TYPE, true>(f, mm_tile_wptr_for<TYPE>(stages + (st * 2 + (warp >> 1)) * step_bytes, half, g, t), 0, nv);
#if defined(MM_LOAD_ONLY)
                /* diagnostic build: the same stage reads, no arithmetic (results meaningless) */
                uint32_t fold = 0;
                const uint32_t *words = reinterpret_cast<const uint32_t *>(&f);
#pragma unroll
                for (int i = 0; i < (int)(sizeof(f) / 4); i++) fold ^= words[i];
                acc[0][0] += __uint_as_float(fold & 0x3f7fffffu);
#else
                mm_tile_block<TYPE, NT>(f, acts + cur_buf * buf_bytes, g, t, acc, nv);
#endif
            }
            mm_tile_copies_wait();
            mm_cta_sync(); /* every thread is done with stage st and activation buffer cur_buf */
            if (tid == 0 && k + S * SB < k_end) issue(k + S * SB, st);
        }
        if (active) mm_store_c_tiles<NT>(M, c, rg, half, g, t, p0, args.n_batch, acc);
    }
    if (tid == 0) mm_trace(cta, MM_TRACE_LOOP_DONE);
    mm_tile_finish(M, pair, args.n_batch);
    if (tid == 0) mm_trace(cta, MM_TRACE_END);
}
#endif

template <int TYPE, int NT>
__global__ void __launch_bounds__(MM_THREADS, (mm_tile_bulk_occupancy<TYPE, NT>::ctas_per_sm))
    mm_tile_bulk_kernel(const mm_launch_args args) {
#if MM_TILE_BULK_DEVICE
    extern __shared__ __align__(128) uint8_t mm_tile_dyn[];
    mm_tile_bulk_cta<TYPE, NT>(args, blockIdx.x, mm_tile_dyn);
#else
    (void)args; /* launched on sm_90+ CUDA only (matmul.cu) */
#endif
}

/* The bulk kernel for a group of two weight types (as mm_pair_kernel for the dp4a kernel): the first
 * a.n_ctas CTAs run launch `a` of type TA, the rest launch `b` of type TB, each CTA as in its own
 * type's launch, so the same bits. The dynamic shared memory is the larger type's and the CTAs per SM
 * the fewer of the two. */
template <int TA, int TB, int NT> struct mm_tile_bulk_pair_occupancy {
    static constexpr int a = mm_tile_bulk_occupancy<TA, NT>::ctas_per_sm, b = mm_tile_bulk_occupancy<TB, NT>::ctas_per_sm;
    static constexpr int ctas_per_sm = a < b ? a : b;
};
template <int TA, int TB, int NT> MM_HD constexpr int mm_tile_bulk_pair_smem_bytes() {
    return mm_tile_bulk_smem_bytes<TA, NT>() > mm_tile_bulk_smem_bytes<TB, NT>() ? mm_tile_bulk_smem_bytes<TA, NT>()
                                                                                 : mm_tile_bulk_smem_bytes<TB, NT>();
}
template <int TA, int TB, int NT>
__global__ void __launch_bounds__(MM_THREADS, (mm_tile_bulk_pair_occupancy<TA, TB, NT>::ctas_per_sm))
    mm_tile_bulk_pair_kernel(const mm_launch_args a, const mm_launch_args b) {
#if MM_TILE_BULK_DEVICE
    extern __shared__ __align__(128) uint8_t mm_tile_dyn[];
    if ((int)blockIdx.x < a.n_ctas) mm_tile_bulk_cta<TA, NT>(a, blockIdx.x, mm_tile_dyn);
    else mm_tile_bulk_cta<TB, NT>(b, blockIdx.x - a.n_ctas, mm_tile_dyn);
#else
    (void)a, (void)b; /* launched on sm_90+ CUDA only (matmul.cu) */
#endif
}
#endif

#endif
