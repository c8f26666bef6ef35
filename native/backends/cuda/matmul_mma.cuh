/* The tensor-core path of matmul.cu for 2..64 tokens on the 8-bit weight types (Q8_0, Q4_0, Q5_0,
 * Q4_K, Q6_K): the same units (row group of 32, chunk), the same per-block integers and the same
 * float operations as mm_kernel, so every (row, token) gets the bits the dp4a path gives it.
 *
 * A warp computes its unit's 32 rows as two 16-row MMA tiles (weight rows on M) times tiles of 8
 * tokens (N), with int8 mma.sync m16n8k16: one MMA per 16 elements of a scale unit (a Q6_K group of
 * 16; two, accumulated in integers, per 32-element Q4_K sub-block or legacy block). Per pass over
 * the chunk a warp holds a whole block of its 32 rows (4 rows per thread: g, g + 8, g + 16, g + 24)
 * and the next one in flight, runs both row tiles on every activation word it loads, and carries
 * up to max_tiles token tiles (Q6_K 2, Q4_K 3, the legacy types 4); more tokens take another pass
 * over the chunk, whose weights then mostly come from L2. Weights are loaded without allocating in
 * L1, which then keeps the activations every warp of the SM reads. The thread
 * holding C element (row, token) scales the unit's exact int32 dot product by the row's integer
 * scale, sums the block's integers, and then runs the block's float step exactly as
 * matmul_blocks.h does. Biased levels (Q4_0 - 8, Q5_0 - 16, Q6_K - 32) are subtracted per byte
 * before the MMA; the integer is the same as the dp4a path's dot - bias * sum.
 *
 * Fragments (PTX ISA, mma.m16n8k16 with .s8): groupID g = lane / 4, t = lane % 4;
 *   A (16 x 16, row-major): reg 0 = row g, k 4t..4t+3; reg 1 = row g + 8, the same k
 *   B (16 x 8, column-major): k 4t..4t+3 of column (token) g
 *   C (16 x 8 int32): c0, c1 = row g, tokens 2t, 2t+1; c2, c3 = row g + 8, tokens 2t, 2t+1
 * Without sm_80 (and on HIP) mm_mma_k16 computes the same integers with warp shuffles and dp4a.
 * The per-lane code is host-compilable too: tools/cuda_matmul_check.cu runs it on 32 host threads
 * with an emulated MMA and compares the bits with the host model of the dp4a kernel. */
#ifndef SPECLA_CUDA_MATMUL_MMA_CUH
#define SPECLA_CUDA_MATMUL_MMA_CUH

#if !MM_DEVICE_CODE
/* The host emulation of one warp-wide MMA (tools/cuda_matmul_check.cu defines it): lane `lane`'s
 * share of the m16n8k16 product of the 32 lanes' fragments (A signed, B signed or unsigned), with the
 * PTX fragment layout. */
void mm_mma_k16_emulated(int32_t c[4], uint32_t a0, uint32_t a1, uint32_t b0, int lane, bool b_unsigned);
#endif

/* c[0..3] += A (a0: row g, a1: row g + 8) . B (b0: token g), k 16; all 32 lanes together. A's bytes
 * are signed; B's signed, or unsigned (0..255) with B_UNSIGNED (the staged Q6_K kernel's lo bytes of
 * the bsums). */
template <bool B_UNSIGNED = false>
MM_HD void mm_mma_k16(int32_t c[4], uint32_t a0, uint32_t a1, uint32_t b0, int lane) {
#if MM_DEVICE_CODE && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(SPECLA_USE_HIP)
    if constexpr (B_UNSIGNED)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.u8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
                     : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                     : "r"(a0), "r"(a1), "r"(b0));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
                     : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                     : "r"(a0), "r"(a1), "r"(b0));
#elif MM_DEVICE_CODE
    /* the same integers from the 32 lanes' fragments, through shuffles */
    const int g = lane >> 2, t = lane & 3;
    auto dot = [](int32_t a, uint32_t b, int32_t acc) {
        if constexpr (B_UNSIGNED) return mm_dot4_us(b, a, acc);
        else return mm_dot4(a, (int32_t)b, acc);
    };
#pragma unroll
    for (int tt = 0; tt < 4; tt++) {
        const int32_t ar0 = (int32_t)__shfl_sync(MM_FULL_MASK, a0, 4 * g + tt);
        const int32_t ar1 = (int32_t)__shfl_sync(MM_FULL_MASK, a1, 4 * g + tt);
        const uint32_t bn0 = __shfl_sync(MM_FULL_MASK, b0, 4 * (2 * t) + tt);
        const uint32_t bn1 = __shfl_sync(MM_FULL_MASK, b0, 4 * (2 * t + 1) + tt);
        c[0] = dot(ar0, bn0, c[0]);
        c[1] = dot(ar0, bn1, c[1]);
        c[2] = dot(ar1, bn0, c[2]);
        c[3] = dot(ar1, bn1, c[3]);
    }
#else
    mm_mma_k16_emulated(c, a0, a1, b0, lane, B_UNSIGNED);
#endif
}

template <int TYPE> struct mm_mma_traits {
    /* the types this kernel has a block step for; Q5_K's batches take the staged kernel
     * (matmul_tile.cuh), or the dp4a kernel where that is off: both give its one-token bits */
    static constexpr bool supported = TYPE == SPECLA_TYPE_Q4_K || TYPE == SPECLA_TYPE_Q6_K || TYPE == SPECLA_TYPE_Q8_0 ||
                                      TYPE == SPECLA_TYPE_Q4_0 || TYPE == SPECLA_TYPE_Q5_0;
    /* 16-byte pieces whose word t each thread reads per row, and the first of them */
    static constexpr int qpieces = TYPE == SPECLA_TYPE_Q6_K ? 12 : TYPE == SPECLA_TYPE_Q4_K ? 8 : TYPE == SPECLA_TYPE_Q8_0 ? 2 : 1;
    static constexpr int qfirst = TYPE == SPECLA_TYPE_Q4_K ? 1 : 0;
    /* a whole 16-byte piece per row: Q4_K's header (piece 0), Q6_K's scales (piece 12) */
    static constexpr int hpiece = TYPE == SPECLA_TYPE_Q4_K ? 0 : TYPE == SPECLA_TYPE_Q6_K ? 12 : -1;
    /* token tiles of 8 per pass that fit the 255 registers without spills (ptxas, sm_90): a
     * warp keeps 2 blocks of its 32 rows, 2 x NTILES x 4 float sums and 2 x NTILES x 4 integer
     * sums; more tokens take further passes over the chunk (its weights then come from L2) */
    static constexpr int max_tiles = TYPE == SPECLA_TYPE_Q6_K ? 2 : TYPE == SPECLA_TYPE_Q4_K ? 3 : 4;
};

/* The token tiles per pass the kernel (and the host emulation) runs for n_batch tokens. */
template <int TYPE> MM_HD int mm_mma_tiles(int n_batch) {
    const int need = (n_batch + 7) / 8;
    return need < mm_mma_traits<TYPE>::max_tiles ? need : mm_mma_traits<TYPE>::max_tiles;
}

/* One block of the thread's 4 rows of the unit (row quarters hr = 0..3: rows 8 hr + g; tile mt
 * takes quarters 2 mt and 2 mt + 1 as its rows g and g + 8). */
template <int TYPE> struct mm_mma_frag {
    uint32_t q[mm_mma_traits<TYPE>::qpieces][4]; /* [piece][row quarter]: word t of the piece */
    uint4 h[4];                                   /* header / scales piece */
    mm_side side[4];
};

/* Weight loads that do not allocate in L1: the weights are read once, and L1 then keeps the
 * activation codes, bsums and scales that every row tile of the SM reads again (plain read-only
 * loads where the qualifier does not exist); evict-first in L2 in a build that asks for it
 * (matmul_blocks.h, MM_WEIGHTS_EVICT_FIRST). These asm statements are not volatile, so the compiler
 * may issue them ahead of the branch that guards them: a caller passes only in-bounds addresses,
 * guarded or not (compute-sanitizer caught the F16 kernel reading a slot past its weight's
 * allocation when a guard alone kept the block index inside the chunk). The weight loops clamp the
 * block index into the chunk: such a speculated load reads a block of the chunk, never used. */
MM_HD uint32_t mm_ld_stream_u32(const void *p) {
#if MM_WEIGHTS_EVICT_FIRST
    uint32_t v;
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.b32 %0, [%1], %2;" : "=r"(v) : "l"(p), "l"(mm_weights_policy()));
    return v;
#elif MM_DEVICE_CODE && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(SPECLA_USE_HIP)
    uint32_t v;
    asm("ld.global.nc.L1::no_allocate.b32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
#else
    return mm_ld_u32(p);
#endif
}
MM_HD uint4 mm_ld_stream_16(const void *p) {
#if MM_WEIGHTS_EVICT_FIRST
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p), "l"(mm_weights_policy()));
    return v;
#elif MM_DEVICE_CODE && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(SPECLA_USE_HIP)
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
#else
    uint32_t w[4];
    mm_load16(p, w);
    return make_uint4(w[0], w[1], w[2], w[3]);
#endif
}

template <int TYPE>
MM_HD void mm_mma_load(mm_mma_frag<TYPE> &f, const uint8_t *group_base, int k, int g, int t) {
    typedef mm_mma_traits<TYPE> tr;
    const uint8_t *slot = group_base + (int64_t)k * MM_GROUP_ROWS * mm_traits<TYPE>::unit_bytes;
    const uint8_t *side = slot + mm_traits<TYPE>::pieces * 16 * MM_GROUP_ROWS;
#pragma unroll
    for (int hr = 0; hr < 4; hr++) {
        const int r = 8 * hr + g;
#pragma unroll
        for (int p = 0; p < tr::qpieces; p++)
            f.q[p][hr] = mm_ld_stream_u32(slot + (tr::qfirst + p) * 16 * MM_GROUP_ROWS + 16 * r + 4 * t);
        if (tr::hpiece >= 0) f.h[hr] = mm_ld_stream_16(slot + tr::hpiece * 16 * MM_GROUP_ROWS + 16 * r);
        if (mm_traits<TYPE>::has_d) f.side[hr].d = mm_ld_u16(side + 2 * r);
        if (TYPE == SPECLA_TYPE_Q5_0) f.side[hr].qh = mm_ld_u32(side + 2 * MM_GROUP_ROWS + 4 * r);
    }
}

/* 4 activation codes of token b at element e (0 for a token past the batch) */
MM_HD uint32_t mm_act_word(const mm_acts &act, int64_t n, int b, int n_batch, int64_t e) {
    return b < n_batch ? mm_ld_act_u32(act.codes + (int64_t)b * n + e) : 0u;
}

/* The levels word (signed bytes, bias removed) of legacy block rows for k-word kw (0..7) */
template <int TYPE>
MM_HD uint32_t mm_legacy_levels(const mm_mma_frag<TYPE> &f, int hr, int kw, int t) {
    if (TYPE == SPECLA_TYPE_Q8_0) return f.q[kw / 4][hr]; /* kw = t or 4 + t: piece 0 or 1, word t */
    const uint32_t qs = f.q[0][hr];
    uint32_t v = kw < 4 ? (qs & 0x0F0F0F0Fu) : ((qs >> 4) & 0x0F0F0F0Fu);
    if (TYPE == SPECLA_TYPE_Q5_0) {
        v |= mm_spread4_bit4((f.side[hr].qh >> (kw < 4 ? 4 * t : 16 + 4 * t)) & 15u);
        return mm_unbias(v, 0x10101010u);
    }
    return mm_unbias(v, 0x08080808u);
}

/* Q6_K levels word (bias removed) of group (h6, m, jj) for the thread's k-word t */
template <int TYPE>
MM_HD uint32_t mm_q6_levels(const mm_mma_frag<TYPE> &f, int hr, int h6, int m, int jj) {
    const uint32_t qa = f.q[4 * h6 + jj][hr], qb = f.q[4 * h6 + 2 + jj][hr], qhw = f.q[8 + 2 * h6 + jj][hr];
    uint32_t v;
    if (m == 0) v = (qa & 0x0F0F0F0Fu) | ((qhw << 4) & 0x30303030u);
    else if (m == 1) v = (qb & 0x0F0F0F0Fu) | ((qhw << 2) & 0x30303030u);
    else if (m == 2) v = ((qa >> 4) & 0x0F0F0F0Fu) | (qhw & 0x30303030u);
    else v = ((qb >> 4) & 0x0F0F0F0Fu) | ((qhw >> 2) & 0x30303030u);
    return mm_unbias(v, 0x20202020u);
}

/* C element i of tile mt lies in row quarter 2 mt + (i >> 1) (rows g, g + 8 of the tile) */
#define MM_HR(mt, i) (2 * (mt) + ((i) >> 1))

/* The K-quants' float step of 256-block k: acc[mt][nt][i] = fma(factor(da, MM_HR(mt, i)), sums[mt][nt][i],
 * acc[mt][nt][i]) for the thread's C elements of tokens inside the batch, da the token's activation
 * scale of the block and factor the row quarter's multiplier (d_a times a weight scale, negated
 * for Q4_K's min term). */
template <int NTILES, class Factor>
MM_HD void mm_k_float_step(float acc[2][NTILES][4], const int32_t (&sums)[2][NTILES][4], const mm_acts &act, int64_t n,
                           int n_batch, int k, int p0, int t, Factor factor) {
#pragma unroll
    for (int nt = 0; nt < NTILES; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int tok = p0 + 8 * nt + 2 * t + (i & 1);
            if (tok >= n_batch) continue;
            const float da = act.scales[(int64_t)tok * (n / 256) + k];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
                acc[mt][nt][i] = mm_fma(factor(da, MM_HR(mt, i)), mm_i2f(sums[mt][nt][i]), acc[mt][nt][i]);
        }
}

/* The block's step for both 16-row tiles and NTILES tiles of 8 tokens (tokens p0 + 8 nt + ...):
 * acc[mt][nt][i] for the thread's C element i of row tile mt and token tile nt. The weight side
 * (levels, scales) is unpacked once per block, and every activation word feeds both row tiles. */
template <int TYPE, int NTILES>
MM_HD void mm_mma_block(const mm_mma_frag<TYPE> &f, const mm_acts &act, int64_t n, int n_batch, int k, int p0,
                        int g, int t, float acc[2][NTILES][4]) {
    const int lane = 4 * g + t;
    if (TYPE == SPECLA_TYPE_Q4_K) {
        const int64_t e0 = (int64_t)k * 256;
        /* s = sum_j sc_j dot_j first (and its float step), then t = sum_j m_j bsum pair: only one
         * of the two integer sets is live at a time */
        int32_t s[2][NTILES][4] = {};
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int p = j / 2, shift = 4 * (j % 2);
            int sc[4], mn[4];
            uint32_t a_lo[4], a_hi[4];
#pragma unroll
            for (int hr = 0; hr < 4; hr++) {
                const uint32_t sw[3] = {f.h[hr].y, f.h[hr].z, f.h[hr].w};
                mm_scale_min(sw, j, &sc[hr], &mn[hr]);
                a_lo[hr] = (f.q[2 * p][hr] >> shift) & 0x0F0F0F0Fu;
                a_hi[hr] = (f.q[2 * p + 1][hr] >> shift) & 0x0F0F0F0Fu;
            }
#pragma unroll
            for (int nt = 0; nt < NTILES; nt++) {
                if (p0 + 8 * nt >= n_batch) continue; /* warp-uniform */
                const int bt = p0 + 8 * nt + g;       /* the token whose codes this thread feeds to B */
                const uint32_t b_lo = mm_act_word(act, n, bt, n_batch, e0 + 32 * j + 4 * t);
                const uint32_t b_hi = mm_act_word(act, n, bt, n_batch, e0 + 32 * j + 16 + 4 * t);
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    int32_t c[4] = {0, 0, 0, 0};
                    mm_mma_k16(c, a_lo[2 * mt], a_lo[2 * mt + 1], b_lo, lane);
                    mm_mma_k16(c, a_hi[2 * mt], a_hi[2 * mt + 1], b_hi, lane);
#pragma unroll
                    for (int i = 0; i < 4; i++) s[mt][nt][i] += sc[MM_HR(mt, i)] * c[i];
                }
            }
        }
        mm_k_float_step<NTILES>(acc, s, act, n, n_batch, k, p0, t,
                                [&](float da, int hr) { return mm_mul(da, mm_half((uint16_t)(f.h[hr].x & 0xffffu))); });
        int32_t tt[2][NTILES][4] = {};
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int sc[4], mn[4];
#pragma unroll
            for (int hr = 0; hr < 4; hr++) {
                const uint32_t sw[3] = {f.h[hr].y, f.h[hr].z, f.h[hr].w};
                mm_scale_min(sw, j, &sc[hr], &mn[hr]);
            }
#pragma unroll
            for (int nt = 0; nt < NTILES; nt++) {
                if (p0 + 8 * nt >= n_batch) continue; /* warp-uniform */
                /* bsums[2j] + bsums[2j + 1] of the thread's two C tokens (one word holds both) */
                const int c0 = p0 + 8 * nt + 2 * t;
                const uint32_t w0 = c0 < n_batch ? mm_ld_act_u32(act.bsums + (int64_t)c0 * (n / 16) + 16 * k + 2 * j) : 0u;
                const uint32_t w1 = c0 + 1 < n_batch ? mm_ld_act_u32(act.bsums + (int64_t)(c0 + 1) * (n / 16) + 16 * k + 2 * j) : 0u;
                const int32_t pair0 = (int32_t)(int16_t)(w0 & 0xffffu) + (int32_t)(int16_t)(w0 >> 16);
                const int32_t pair1 = (int32_t)(int16_t)(w1 & 0xffffu) + (int32_t)(int16_t)(w1 >> 16);
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                    for (int i = 0; i < 4; i++) tt[mt][nt][i] += mn[MM_HR(mt, i)] * ((i & 1) ? pair1 : pair0);
            }
        }
        mm_k_float_step<NTILES>(acc, tt, act, n, n_batch, k, p0, t,
                                [&](float da, int hr) { return -mm_mul(da, mm_half((uint16_t)(f.h[hr].x >> 16))); });
        return;
    }
    if (TYPE == SPECLA_TYPE_Q6_K) {
        const int64_t e0 = (int64_t)k * 256;
        int32_t s[2][NTILES][4] = {};
#pragma unroll
        for (int h6 = 0; h6 < 2; h6++)
#pragma unroll
            for (int m = 0; m < 4; m++)
#pragma unroll
                for (int jj = 0; jj < 2; jj++) {
                    const int grp = 8 * h6 + 2 * m + jj; /* elements 16 grp .. 16 grp + 15 */
                    uint32_t a[4];
                    int sc[4];
#pragma unroll
                    for (int hr = 0; hr < 4; hr++) {
                        a[hr] = mm_q6_levels(f, hr, h6, m, jj);
                        const uint32_t word = grp < 4 ? f.h[hr].x : grp < 8 ? f.h[hr].y : grp < 12 ? f.h[hr].z : f.h[hr].w;
                        sc[hr] = (int8_t)(word >> (8 * (grp & 3)));
                    }
#pragma unroll
                    for (int nt = 0; nt < NTILES; nt++) {
                        if (p0 + 8 * nt >= n_batch) continue; /* warp-uniform */
                        const int bt = p0 + 8 * nt + g;
                        const uint32_t b = mm_act_word(act, n, bt, n_batch, e0 + 16 * grp + 4 * t);
#pragma unroll
                        for (int mt = 0; mt < 2; mt++) {
                            int32_t c[4] = {0, 0, 0, 0};
                            mm_mma_k16(c, a[2 * mt], a[2 * mt + 1], b, lane);
#pragma unroll
                            for (int i = 0; i < 4; i++) s[mt][nt][i] += sc[MM_HR(mt, i)] * c[i];
                        }
                    }
                }
        mm_k_float_step<NTILES>(acc, s, act, n, n_batch, k, p0, t,
                                [&](float da, int hr) { return mm_mul(da, mm_half(f.side[hr].d)); });
        return;
    }
    /* Q8_0 / Q4_0 / Q5_0: one block of 32 = k-words t and 4 + t */
    const int64_t e0 = (int64_t)k * 32;
    uint32_t lo[4], hi[4];
#pragma unroll
    for (int hr = 0; hr < 4; hr++) lo[hr] = mm_legacy_levels(f, hr, t, t), hi[hr] = mm_legacy_levels(f, hr, 4 + t, t);
#pragma unroll
    for (int nt = 0; nt < NTILES; nt++) {
        if (p0 + 8 * nt >= n_batch) continue; /* warp-uniform */
        const int bt = p0 + 8 * nt + g;
        const uint32_t b_lo = mm_act_word(act, n, bt, n_batch, e0 + 4 * t);
        const uint32_t b_hi = mm_act_word(act, n, bt, n_batch, e0 + 16 + 4 * t);
        int32_t s[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; mt++) {
#pragma unroll
            for (int i = 0; i < 4; i++) s[mt][i] = 0;
            mm_mma_k16(s[mt], lo[2 * mt], lo[2 * mt + 1], b_lo, lane);
            mm_mma_k16(s[mt], hi[2 * mt], hi[2 * mt + 1], b_hi, lane);
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int tok = p0 + 8 * nt + 2 * t + (i & 1);
            if (tok >= n_batch) continue;
            const float da = act.scales[(int64_t)tok * (n / 32) + k];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
                acc[mt][nt][i] = mm_fma(mm_mul(mm_half(f.side[MM_HR(mt, i)].d), da), mm_i2f(s[mt][i]), acc[mt][nt][i]);
        }
    }
}

/* Unit u of a launch, lane `lane`: the partial sums of its 32 rows for every token, stored with
 * mm_store. Per pass over the chunk: both 16-row tiles and NTILES tiles of 8 tokens; the next
 * block (all 32 rows) is loaded while the current one is computed. */
/* A pass's partial sums in the m16n8 C fragments of one 16-row half of row group rg (the thread's
 * elements: tokens p0 + 8 nt + 2 t (+1), rows 16 half + g (+8)) for chunk c: mm_store, tokens past
 * the batch left out. The per-warp and the staged tensor-core kernels store through it. */
template <int NT>
MM_HD void mm_store_c_tiles(const mm_mat_args &M, int c, int rg, int half, int g, int t, int p0, int n_batch,
                            const float acc[NT][4]) {
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int tok = p0 + 8 * nt + 2 * t + (i & 1);
            const int row = rg * MM_GROUP_ROWS + 16 * half + 8 * (i >> 1) + g;
            if (tok < n_batch) mm_store(M, c, row, tok, acc[nt][i]);
        }
}

template <int TYPE, int NTILES>
MM_HD void mm_mma_unit(const mm_launch_args &args, int u, int lane) {
    const int g = lane >> 2, t = lane & 3;
    const mm_unit_place P = mm_unit_of<TYPE>(args, u);
    const mm_mat_args &M = P.M;
    const int rg = P.rg, c = P.c, k_begin = P.k_begin, k_end = P.k_end;
    const uint8_t *group_base = P.group_base;

    for (int p0 = 0; p0 < args.n_batch; p0 += 8 * NTILES) {
        float acc[2][NTILES][4] = {};
        mm_mma_frag<TYPE> cur, nxt;
        mm_mma_load(cur, group_base, k_begin, g, t);
        mm_wait_prior_grid(); /* the weights are constant; the activations are the previous kernel's */
        if (p0 == 0 && lane == 0) mm_trace(u, MM_TRACE_WAITED);
        for (int k = k_begin; k < k_end; k++) {
            /* clamped as well as guarded (mm_ld_stream_u32 says why) */
            if (k + 1 < k_end) mm_mma_load(nxt, group_base, min(k + 1, k_end - 1), g, t);
            mm_mma_block<TYPE, NTILES>(cur, args.act, args.n, args.n_batch, k, p0, g, t, acc);
            cur = nxt;
        }
#pragma unroll
        for (int mt = 0; mt < 2; mt++) mm_store_c_tiles<NTILES>(M, c, rg, mt, g, t, p0, args.n_batch, acc[mt]);
    }
}

#ifdef MM_KERNELS /* matmul.cu: the kernel */
template <int TYPE, int NTILES>
__global__ void __launch_bounds__(MM_THREADS, 1) mm_mma_kernel(const mm_launch_args args) {
    mm_run_warp_unit(args, [&args](int u, int lane) { mm_mma_unit<TYPE, NTILES>(args, u, lane); });
}
#endif

#endif
