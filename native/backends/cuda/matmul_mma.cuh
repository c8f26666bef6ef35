/* The tensor-core path of matmul.cu for 2..64 tokens on the 8-bit weight types (Q8_0, Q4_0, Q5_0,
 * Q4_K, Q6_K): the same units (row group of 32, chunk), the same per-block integers and the same
 * float operations as mm_kernel, so every (row, token) gets the bits the dp4a path gives it.
 *
 * A warp computes its unit's 32 rows as two 16-row MMA tiles (weight rows on M) times tiles of 8
 * tokens (N), with int8 mma.sync m16n8k16: one MMA per 16 elements of a scale unit (a Q6_K group of
 * 16; two, accumulated in integers, per 32-element Q4_K sub-block or legacy block). The thread
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
 * share of the m16n8k16 s8 product of the 32 lanes' fragments, with the PTX fragment layout. */
void mm_mma_k16_emulated(int32_t c[4], uint32_t a0, uint32_t a1, uint32_t b0, int lane);
#endif

/* c[0..3] += A (a0: row g, a1: row g + 8) . B (b0: token g), k 16; all 32 lanes together */
MM_HD void mm_mma_k16(int32_t c[4], uint32_t a0, uint32_t a1, uint32_t b0, int lane) {
#if MM_DEVICE_CODE && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(SPECLA_USE_HIP)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
#elif MM_DEVICE_CODE
    /* the same integers from the 32 lanes' fragments, through shuffles */
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int tt = 0; tt < 4; tt++) {
        const int32_t ar0 = (int32_t)__shfl_sync(MM_FULL_MASK, a0, 4 * g + tt);
        const int32_t ar1 = (int32_t)__shfl_sync(MM_FULL_MASK, a1, 4 * g + tt);
        const int32_t bn0 = (int32_t)__shfl_sync(MM_FULL_MASK, b0, 4 * (2 * t) + tt);
        const int32_t bn1 = (int32_t)__shfl_sync(MM_FULL_MASK, b0, 4 * (2 * t + 1) + tt);
        c[0] = mm_dot4(ar0, bn0, c[0]);
        c[1] = mm_dot4(ar0, bn1, c[1]);
        c[2] = mm_dot4(ar1, bn0, c[2]);
        c[3] = mm_dot4(ar1, bn1, c[3]);
    }
#else
    mm_mma_k16_emulated(c, a0, a1, b0, lane);
#endif
}

template <int TYPE> struct mm_mma_traits {
    /* 16-byte pieces whose word t each thread reads per row, and the first of them */
    static constexpr int qpieces = TYPE == SPECLA_TYPE_Q6_K ? 12 : TYPE == SPECLA_TYPE_Q4_K ? 8 : TYPE == SPECLA_TYPE_Q8_0 ? 2 : 1;
    static constexpr int qfirst = TYPE == SPECLA_TYPE_Q4_K ? 1 : 0;
    /* a whole 16-byte piece per row: Q4_K's header (piece 0), Q6_K's scales (piece 12) */
    static constexpr int hpiece = TYPE == SPECLA_TYPE_Q4_K ? 0 : TYPE == SPECLA_TYPE_Q6_K ? 12 : -1;
};

/* One block of the thread's 2 rows of a 16-row tile (rows g and g + 8). */
template <int TYPE> struct mm_mma_frag {
    uint32_t q[mm_mma_traits<TYPE>::qpieces][2]; /* [piece][row half]: word t of the piece */
    uint4 h[2];                                   /* header / scales piece */
    mm_side side[2];
};

template <int TYPE>
MM_HD void mm_mma_load(mm_mma_frag<TYPE> &f, const uint8_t *group_base, int k, int mt, int g,
                                            int t) {
    typedef mm_mma_traits<TYPE> tr;
    const uint8_t *slot = group_base + (int64_t)k * MM_GROUP_ROWS * mm_traits<TYPE>::unit_bytes;
    const uint8_t *side = slot + mm_traits<TYPE>::pieces * 16 * MM_GROUP_ROWS;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int r = 16 * mt + 8 * hr + g;
#pragma unroll
        for (int p = 0; p < tr::qpieces; p++)
            f.q[p][hr] = mm_ld_u32(slot + (tr::qfirst + p) * 16 * MM_GROUP_ROWS + 16 * r + 4 * t);
        if (tr::hpiece >= 0) {
            uint32_t w[4];
            mm_load16(slot + tr::hpiece * 16 * MM_GROUP_ROWS + 16 * r, w);
            f.h[hr] = make_uint4(w[0], w[1], w[2], w[3]);
        }
        if (mm_traits<TYPE>::has_d) f.side[hr].d = mm_ld_u16(side + 2 * r);
        if (TYPE == SPECLA_TYPE_Q5_0) f.side[hr].qh = mm_ld_u32(side + 2 * MM_GROUP_ROWS + 4 * r);
    }
}

/* 4 activation codes of token b at element e (0 for a token past the batch) */
MM_HD uint32_t mm_act_word(const mm_acts &act, int64_t n, int b, int n_batch, int64_t e) {
    return b < n_batch ? mm_ld_u32(act.codes + (int64_t)b * n + e) : 0u;
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

/* The block's step for one 16-row tile and NTILES tiles of 8 tokens (tokens p0 + 8 nt + ...):
 * acc[nt][i] for the thread's C element i of token tile nt. The weight side (levels, scales) is
 * unpacked once per block and used for every token tile. */
template <int TYPE, int NTILES>
MM_HD void mm_mma_block(const mm_mma_frag<TYPE> &f, const mm_acts &act, int64_t n, int n_batch, int k, int p0,
                        int g, int t, float acc[NTILES][4]) {
    const int lane = 4 * g + t;
    int32_t s[NTILES][4];
#pragma unroll
    for (int nt = 0; nt < NTILES; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) s[nt][i] = 0;
    if (TYPE == SPECLA_TYPE_Q4_K) {
        const int64_t e0 = (int64_t)k * 256;
        int32_t tt[NTILES][4];
#pragma unroll
        for (int nt = 0; nt < NTILES; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) tt[nt][i] = 0;
        const uint32_t sw0[3] = {f.h[0].y, f.h[0].z, f.h[0].w}, sw1[3] = {f.h[1].y, f.h[1].z, f.h[1].w};
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int p = j / 2, shift = 4 * (j % 2);
            int sc0, m0, sc1, m1; /* rows g and g + 8 */
            mm_scale_min(sw0, j, &sc0, &m0);
            mm_scale_min(sw1, j, &sc1, &m1);
            const uint32_t a_lo0 = (f.q[2 * p][0] >> shift) & 0x0F0F0F0Fu, a_lo1 = (f.q[2 * p][1] >> shift) & 0x0F0F0F0Fu;
            const uint32_t a_hi0 = (f.q[2 * p + 1][0] >> shift) & 0x0F0F0F0Fu,
                           a_hi1 = (f.q[2 * p + 1][1] >> shift) & 0x0F0F0F0Fu;
#pragma unroll
            for (int nt = 0; nt < NTILES; nt++) {
                if (p0 + 8 * nt >= n_batch) continue; /* warp-uniform */
                const int bt = p0 + 8 * nt + g;       /* the token whose codes this thread feeds to B */
                int32_t c[4] = {0, 0, 0, 0};
                mm_mma_k16(c, a_lo0, a_lo1, mm_act_word(act, n, bt, n_batch, e0 + 32 * j + 4 * t), lane);
                mm_mma_k16(c, a_hi0, a_hi1, mm_act_word(act, n, bt, n_batch, e0 + 32 * j + 16 + 4 * t), lane);
                s[nt][0] += sc0 * c[0], s[nt][1] += sc0 * c[1], s[nt][2] += sc1 * c[2], s[nt][3] += sc1 * c[3];
                /* bsums[2j] + bsums[2j + 1] of the thread's two C tokens (one word holds both) */
                const int c0 = p0 + 8 * nt + 2 * t;
                const uint32_t w0 = c0 < n_batch ? mm_ld_u32(act.bsums + (int64_t)c0 * (n / 16) + 16 * k + 2 * j) : 0u;
                const uint32_t w1 = c0 + 1 < n_batch ? mm_ld_u32(act.bsums + (int64_t)(c0 + 1) * (n / 16) + 16 * k + 2 * j) : 0u;
                const int32_t pair0 = (int32_t)(int16_t)(w0 & 0xffffu) + (int32_t)(int16_t)(w0 >> 16);
                const int32_t pair1 = (int32_t)(int16_t)(w1 & 0xffffu) + (int32_t)(int16_t)(w1 >> 16);
                tt[nt][0] += m0 * pair0, tt[nt][1] += m0 * pair1;
                tt[nt][2] += m1 * pair0, tt[nt][3] += m1 * pair1;
            }
        }
#pragma unroll
        for (int nt = 0; nt < NTILES; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int tok = p0 + 8 * nt + 2 * t + (i & 1);
                if (tok >= n_batch) continue;
                const uint32_t w0 = f.h[i >> 1].x;
                const float d = mm_half((uint16_t)(w0 & 0xffffu)), dmin = mm_half((uint16_t)(w0 >> 16));
                const float da = act.scales[(int64_t)tok * (n / 256) + k];
                acc[nt][i] = mm_fma(mm_mul(da, d), mm_i2f(s[nt][i]), acc[nt][i]);
                acc[nt][i] = mm_fma(-mm_mul(da, dmin), mm_i2f(tt[nt][i]), acc[nt][i]);
            }
        return;
    }
    if (TYPE == SPECLA_TYPE_Q6_K) {
        const int64_t e0 = (int64_t)k * 256;
#pragma unroll
        for (int h6 = 0; h6 < 2; h6++)
#pragma unroll
            for (int m = 0; m < 4; m++)
#pragma unroll
                for (int jj = 0; jj < 2; jj++) {
                    const int grp = 8 * h6 + 2 * m + jj; /* elements 16 grp .. 16 grp + 15 */
                    const uint32_t a0 = mm_q6_levels(f, 0, h6, m, jj), a1 = mm_q6_levels(f, 1, h6, m, jj);
                    const uint32_t word0 = grp < 4 ? f.h[0].x : grp < 8 ? f.h[0].y : grp < 12 ? f.h[0].z : f.h[0].w;
                    const uint32_t word1 = grp < 4 ? f.h[1].x : grp < 8 ? f.h[1].y : grp < 12 ? f.h[1].z : f.h[1].w;
                    const int sc0 = (int8_t)(word0 >> (8 * (grp & 3))), sc1 = (int8_t)(word1 >> (8 * (grp & 3)));
#pragma unroll
                    for (int nt = 0; nt < NTILES; nt++) {
                        if (p0 + 8 * nt >= n_batch) continue; /* warp-uniform */
                        const int bt = p0 + 8 * nt + g;
                        int32_t c[4] = {0, 0, 0, 0};
                        mm_mma_k16(c, a0, a1, mm_act_word(act, n, bt, n_batch, e0 + 16 * grp + 4 * t), lane);
                        s[nt][0] += sc0 * c[0], s[nt][1] += sc0 * c[1], s[nt][2] += sc1 * c[2], s[nt][3] += sc1 * c[3];
                    }
                }
#pragma unroll
        for (int nt = 0; nt < NTILES; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int tok = p0 + 8 * nt + 2 * t + (i & 1);
                if (tok >= n_batch) continue;
                const float da = act.scales[(int64_t)tok * (n / 256) + k];
                acc[nt][i] = mm_fma(mm_mul(da, mm_half(f.side[i >> 1].d)), mm_i2f(s[nt][i]), acc[nt][i]);
            }
        return;
    }
    /* Q8_0 / Q4_0 / Q5_0: one block of 32 = k-words t and 4 + t */
    const int64_t e0 = (int64_t)k * 32;
    const uint32_t lo0 = mm_legacy_levels(f, 0, t, t), lo1 = mm_legacy_levels(f, 1, t, t);
    const uint32_t hi0 = mm_legacy_levels(f, 0, 4 + t, t), hi1 = mm_legacy_levels(f, 1, 4 + t, t);
#pragma unroll
    for (int nt = 0; nt < NTILES; nt++) {
        if (p0 + 8 * nt >= n_batch) continue; /* warp-uniform */
        const int bt = p0 + 8 * nt + g;
        mm_mma_k16(s[nt], lo0, lo1, mm_act_word(act, n, bt, n_batch, e0 + 4 * t), lane);
        mm_mma_k16(s[nt], hi0, hi1, mm_act_word(act, n, bt, n_batch, e0 + 16 + 4 * t), lane);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int tok = p0 + 8 * nt + 2 * t + (i & 1);
            if (tok >= n_batch) continue;
            const float da = act.scales[(int64_t)tok * (n / 32) + k];
            acc[nt][i] = mm_fma(mm_mul(mm_half(f.side[i >> 1].d), da), mm_i2f(s[nt][i]), acc[nt][i]);
        }
    }
}

/* Unit u of a launch, lane `lane`: the partial sums of its 32 rows for every token, stored with
 * mm_store. NTILES tiles of 8 tokens per pass over the chunk. */
template <int TYPE, int NTILES>
MM_HD void mm_mma_unit(const mm_launch_args &args, int u, int lane) {
    const int g = lane >> 2, t = lane & 3;
    const mm_mat_args M = mm_select_mat(args, u);
    const int local = u - M.unit_begin;
    const int rg = local / M.n_chunks, c = local % M.n_chunks;
    const int k_begin = c * M.chunk_blocks;
    const int k_end = M.n_blocks < k_begin + M.chunk_blocks ? M.n_blocks : k_begin + M.chunk_blocks;
    const uint8_t *group_base = M.w + mm_slot_offset(TYPE, M.n_blocks, rg, 0);

    /* the two 16-row tiles one after the other (each streams its own half of the slots) */
    for (int mt = 0; mt < 2; mt++)
        for (int p0 = 0; p0 < args.n_batch; p0 += 8 * NTILES) {
            float acc[NTILES][4];
#pragma unroll
            for (int nt = 0; nt < NTILES; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) acc[nt][i] = 0.0f;
            mm_mma_frag<TYPE> cur, nxt;
            mm_mma_load(cur, group_base, k_begin, mt, g, t);
            for (int k = k_begin; k < k_end; k++) {
                if (k + 1 < k_end) mm_mma_load(nxt, group_base, k + 1, mt, g, t);
                mm_mma_block<TYPE, NTILES>(cur, args.act, args.n, args.n_batch, k, p0, g, t, acc);
                cur = nxt;
            }
#pragma unroll
            for (int nt = 0; nt < NTILES; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int tok = p0 + 8 * nt + 2 * t + (i & 1);
                    const int row = rg * MM_GROUP_ROWS + 16 * mt + 8 * (i >> 1) + g;
                    if (tok < args.n_batch) mm_store(M, c, row, tok, acc[nt][i]);
                }
        }
}

#ifdef MM_KERNELS /* matmul.cu: the kernel */
template <int TYPE, int NTILES>
__global__ void __launch_bounds__(MM_THREADS, 1) mm_mma_kernel(const mm_launch_args args) {
    const int lane = threadIdx.x & 31;
    const int u = blockIdx.x * MM_WARPS_PER_BLOCK + (threadIdx.x >> 5);
    if (u >= args.n_units) return; /* whole warps */
    mm_mma_unit<TYPE, NTILES>(args, u, lane);
    const mm_mat_args M = mm_select_mat(args, u);
    mm_finish_unit(M, (u - M.unit_begin) / M.n_chunks, lane, args.n_batch);
}
#endif

#endif
