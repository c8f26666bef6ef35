/* The tensor-core path of matmul.cu for F16 and BF16 weights (sm_80+, CUDA; every n_batch, n = 1
 * included): mma.sync m16n8k16 with f16 / bf16 operands and fp32 accumulation, on the prepared float
 * layout of matmul_blocks.h (blocks of 32 elements, row groups of 32, 16-byte pieces per lane). It
 * defines its own summation order for these two types (below); F32 weights, HIP, devices before
 * sm_80 and CUDA_MATMUL_TC_OFF keep mm_kernel's sequential fmas.
 *
 * Activations (mm_split_kernel, once per call and weight type, a CTA per token). Each float32 row
 * x[b] is split into terms of the weight's operand type with x = sum of the terms (up to the error
 * below), written to the workspace as [term][n_batch][n] 16-bit values:
 *   F16:  a per-token power of two s = 2^e (mm_split_exponent: from the token's max |x|, so that
 *         max |x s| lies in [2^14, 2^15): hi cannot overflow f16 and lo stays normal for the large
 *         elements); v = x s (exact); hi = f16_rn(v); lo = f16_rn(v - hi) (v - hi is exact in fp32).
 *         Left over: |v - hi - lo| <= 2^-22 |v| (lo's rounding) or 2^-25 (f16 subnormal half-ulp),
 *         i.e. per element <= 2^-22 |x| + 2^-39 max|x| (before any fp32 rounding).
 *   BF16: no scaling (bf16 has fp32's exponent range); three terms by truncation: hi = x with the
 *         low 16 bits cleared, r = x - hi (exact), mid = r truncated the same way, lo = r - mid,
 *         which has at most 8 significant bits and is a bf16 exactly: x = hi + mid + lo EXACTLY
 *         (for |x| >= 2^-110; below, bf16 subnormals drop bits < 2^-133). Two bf16 terms would leave
 *         2^-16 |x|, too coarse for float32-class results; the third costs one more MMA per step.
 *   A token with a non-finite element gets s = 1 and hi = its f16/bf16 value (inf stays inf, NaN
 *   NaN, f16 overflow inf) and zero lower terms: its outputs are non-finite as the CPU's are.
 *
 * Order. The plan (mm_plan_for), the chunks and the chunk-order finish are matmul.cu's. Within a
 * chunk, per (row, token) one fp32 accumulator starting at +0.0f takes the chunk's blocks in order;
 * per block the two halves of 16 k-slots h = 0, 1, and per half the terms lo, (mid,) hi, each one
 * m16n8k16 MMA: acc = mma(W[16 k-slots], term[16 k-slots], acc). The k-slot mapping of half h:
 * slots 2t, 2t+1 hold elements 8t+4h, 8t+4h+1, slots 2t+8, 2t+9 elements 8t+4h+2, 8t+4h+3 (t = 0..3),
 * for A and B alike (a 16-byte piece per thread and row; the set of products per MMA is fixed).
 * F16: the chunk's partial is then multiplied by 2^-e (exact unless it is subnormal) before mm_store.
 * A column (token) of mma.sync depends only on that column's operands, and the instruction sequence
 * of a row does not depend on n_batch (tokens are padded with zero columns to tiles of 8, at most
 * mm_ftc_traits::max_tiles per pass, further passes re-walk the chunk with the same code): a row's
 * bits are the same for every n_batch (prefill == decode), on one device and build.
 *
 * Error model. Products of f16 x f16 (22 significant bits) and bf16 x bf16 (16) are exact in fp32;
 * the hardware adds an MMA's 16 products and the accumulator in fp32 with its own (not IEEE
 * sequential) alignment and rounding, so the device bits are not the host's: the host model
 * (tools/cuda_matmul_check.cu) emulates each MMA as 16 sequential fp32 fmas in k-slot order and the
 * GPU is compared with it by a TOLERANCE for these two types (bits for every other type). Relative to
 * sum_i |w_i x_i| the error is the split's (F16 2^-22, BF16 0) plus fp32 accumulation over
 * terms x ne0 / 16 MMA steps plus the chunk adds, the same class as the fma chain's ne0 roundings;
 * the measured figures against float64 are in the check's output and the commit message.
 *
 * Unit order: a matrix's warps go chunk by chunk (mm_unit_chunk_major): the 4 warps of a CTA take 4
 * row groups of one chunk and read the same activation terms, which the later readers can then find
 * in L1 (the likely reason for the gain; the kernel was not profiled). Against the row-group order
 * (a CTA's warps on 4 chunks of one row group) it took 3-16 % off the DFlash draft's q, o, up and
 * down matrices at 1 and 16 tokens on an H200 (docs/perf.md, seventeenth pass; draft_kv, 1024 rows,
 * 1-5 % slower at 16-23 tokens, draft_up 1 % at 23). A permutation of units: the same bits.
 *
 * Thread mapping (per warp, like matmul_mma.cuh): a warp owns one (row group of 32, chunk) unit:
 * row tiles mt = 0, 1 of 16 rows; thread (g = lane / 4, t = lane % 4) loads, per block and row
 * quarter hr (rows 8 hr + g), piece t of that row's block: elements 8t..8t+7, one 16-byte load
 * (for a warp, 4 pieces x 8 rows = 4 contiguous 128-byte segments per quarter). Tile mt takes quarters
 * 2 mt (its rows g) and 2 mt + 1 (rows g + 8) as A; B for token tile nt is token p0 + 8 nt + g's
 * elements 8t..8t+7 of each term (one 16-byte load from the workspace, through L1). C element i of
 * tile (mt, nt): row 16 mt + 8 (i >> 1) + g, token p0 + 8 nt + 2t + (i & 1). Two blocks per load
 * group, the next group in flight while the current one is computed.
 *
 * Fragments (PTX ISA, mma.m16n8k16 .f16/.bf16, 2 values per register, low half = lower k):
 *   A: a0 (row g, k 2t..2t+1), a1 (row g+8, k 2t..2t+1), a2 (row g, k 2t+8..), a3 (row g+8, k 2t+8..)
 *   B: b0 (k 2t..2t+1, column g), b1 (k 2t+8..2t+9, column g)
 *   C: c0, c1 (row g, columns 2t, 2t+1), c2, c3 (row g+8, the same columns)
 * Without sm_80 (never launched there) mm_ftc_mma computes the same products with shuffles and
 * sequential fmas, so every architecture of the fatbin compiles. */
#ifndef SPECLA_CUDA_MATMUL_FLOAT_TC_CUH
#define SPECLA_CUDA_MATMUL_FLOAT_TC_CUH

template <int TYPE> struct mm_ftc_traits {
    static constexpr bool supported = TYPE == SPECLA_TYPE_F16 || TYPE == SPECLA_TYPE_BF16;
    static constexpr int terms = TYPE == SPECLA_TYPE_BF16 ? 3 : 2;
    static constexpr int load_group = 2; /* blocks of the unit's 32 rows per load (2 KiB per warp) */
    static constexpr int max_tiles = 4;  /* token tiles of 8 per pass */
};

/* The token tiles per pass the kernel (and the host emulation) runs for n_batch tokens. */
MM_HD int mm_ftc_tiles(int n_batch) {
    const int need = (n_batch + 7) / 8, most = mm_ftc_traits<SPECLA_TYPE_F16>::max_tiles;
    return need < most ? need : most;
}

/* ---- the activation split (host and device) ------------------------------------------------------ */
/* e of the F16 split's scale 2^e for a token whose largest |x| is amax (0 for amax 0 or non-finite):
 * amax = m 2^E with m in [0.5, 1), e = 15 - E, so amax 2^e = m 2^15 in [2^14, 2^15); clamped to
 * [-126, 127] so that 2^e and 2^-e are floats (tokens with amax < 2^-112 lose precision). */
MM_HD int mm_split_exponent(float amax) {
    if (!(amax > 0.0f) || !mm_isfinite(amax)) return 0;
    int E = 0;
    (void)frexpf(amax, &E);
    const int e = 15 - E;
    return e < -126 ? -126 : e > 127 ? 127 : e;
}
MM_HD float mm_pow2(int e) { return ldexpf(1.0f, e); } /* exact for e in [-149, 127] */

MM_HD uint32_t mm_f32_bits(float v) {
    uint32_t b;
    memcpy(&b, &v, 4);
    return b;
}
MM_HD float mm_bits_f32(uint32_t b) {
    float v;
    memcpy(&v, &b, 4);
    return v;
}

/* The terms of one element x (scaled by s for F16): out[0] = hi, out[1] = lo (F16) or mid (BF16),
 * out[2] = lo (BF16), as 16-bit patterns; `finite_token` 0 gives hi only (see the header). */
template <int TYPE> MM_HD void mm_split_element(float x, float s, int finite_token, uint16_t out[MM_FTC_MAX_TERMS]) {
    out[1] = 0, out[2] = 0;
    if (TYPE == SPECLA_TYPE_F16) {
        const float v = mm_mul(x, s);
        const uint16_t hi = float_to_half(v);
        out[0] = hi;
        if (finite_token) out[1] = float_to_half(mm_add(v, -half_to_float(hi)));
        return;
    }
    if (!finite_token) {
        const uint32_t b = mm_f32_bits(x);
        out[0] = (b & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((b >> 16) | 0x40u) : (uint16_t)(b >> 16); /* NaN stays NaN */
        return;
    }
    const uint32_t hb = mm_f32_bits(x) & 0xffff0000u;
    const float r = mm_add(x, -mm_bits_f32(hb));
    const uint32_t mb = mm_f32_bits(r) & 0xffff0000u;
    const float lo = mm_add(r, -mm_bits_f32(mb));
    out[0] = (uint16_t)(hb >> 16), out[1] = (uint16_t)(mb >> 16), out[2] = (uint16_t)(mm_f32_bits(lo) >> 16);
}

/* ---- the MMA ------------------------------------------------------------------------------------- */
#if !MM_DEVICE_CODE
/* The host emulation (tools/cuda_matmul_check.cu defines it): lane `lane`'s C share of m16n8k16 with
 * f16 (bf16 = 0) or bf16 (bf16 = 1) operands, the PTX fragment layout, each C element the 16 products
 * added to it one by one in k order with fp32 fmas (products exact). */
void mm_ftc_mma_emulated(float c[4], const uint32_t a[4], const uint32_t b[2], int bf16, int lane);
#endif

/* value k of a packed pair (low half = even k) */
MM_HD float mm_ftc_value(uint32_t pair, int hi_half, int bf16) {
    const uint16_t h = (uint16_t)(hi_half ? pair >> 16 : pair & 0xffffu);
    return bf16 ? mm_bits_f32((uint32_t)h << 16) : half_to_float(h);
}

/* c[0..3] += A (a[0..3]) . B (b[0..1]) for one m16n8k16 tile; all 32 lanes together */
template <int TYPE> MM_HD void mm_ftc_mma(float c[4], const uint32_t a[4], const uint32_t b[2], int lane) {
#if MM_DEVICE_CODE && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(SPECLA_USE_HIP)
    (void)lane;
    if (TYPE == SPECLA_TYPE_F16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                     "{%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                     "{%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif MM_DEVICE_CODE
    /* never launched (matmul.cu takes mm_kernel there); the same products through shuffles, the k
     * loop not unrolled (small code: ptxas then compiles the fallback kernels quickly) */
    const int g = lane >> 2, t = lane & 3, bf16 = TYPE == SPECLA_TYPE_BF16;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int col = 2 * t + (i & 1), hi_row = i >> 1;
        float acc = c[i];
#pragma unroll 1
        for (int k = 0; k < 16; k++) {
            const int src_a = 4 * g + (k & 7) / 2, reg_a = 2 * (k >> 3) + hi_row; /* a0/a1: k < 8 */
            const uint32_t a0 = __shfl_sync(MM_FULL_MASK, a[0], src_a), a1 = __shfl_sync(MM_FULL_MASK, a[1], src_a);
            const uint32_t a2 = __shfl_sync(MM_FULL_MASK, a[2], src_a), a3 = __shfl_sync(MM_FULL_MASK, a[3], src_a);
            const uint32_t av = reg_a == 0 ? a0 : reg_a == 1 ? a1 : reg_a == 2 ? a2 : a3;
            const int src_b = 4 * col + (k & 7) / 2;
            const uint32_t b0 = __shfl_sync(MM_FULL_MASK, b[0], src_b), b1 = __shfl_sync(MM_FULL_MASK, b[1], src_b);
            const uint32_t bv = k < 8 ? b0 : b1;
            acc = mm_fma(mm_ftc_value(av, k & 1, bf16), mm_ftc_value(bv, k & 1, bf16), acc);
        }
        c[i] = acc;
    }
#else
    mm_ftc_mma_emulated(c, a, b, TYPE == SPECLA_TYPE_BF16, lane);
#endif
}

/* ---- the unit ------------------------------------------------------------------------------------ */
/* 16 bytes (8 values) of term j, token b, elements e..e+7 (zeros for a padding token): mm_acts.split */
MM_HD uint4 mm_ftc_act16(const mm_acts &sa, int64_t n, int n_batch, int j, int b, int64_t e) {
    if (b >= n_batch) return make_uint4(0u, 0u, 0u, 0u);
    const uint16_t *p = sa.split + ((int64_t)j * n_batch + b) * n + e;
    uint32_t w[4];
    mm_load16_act(p, w); /* after the grid dependency wait (mm_load16_act says why) */
    return make_uint4(w[0], w[1], w[2], w[3]);
}

MM_HD uint32_t mm_u4(const uint4 &v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

/* Where a pass's activation terms come from, for the unit below. `piece(j, nt, g, t, k)` gives lane
 * (g, t)'s 16 bytes of term j for token p0 + 8 nt + g, elements 32 k + 8 t .. + 7 (zeros for a padding
 * token); `prepare(p0)` runs once per pass after the unit's first weight group is in flight. The
 * pass's AHEAD says whether a block's terms are worth loading one block before its MMAs (the
 * workspace's L2 round trip) or right before them (shared memory). Both sources give the same 16 bytes, so the bits never
 * depend on the source. */
struct mm_ftc_workspace_acts { /* the split's workspace, each lane its own 16-byte loads */
    const mm_acts &sa;
    int64_t n;
    int n_batch, p0;
    MM_HD void prepare(int pass_p0) {
        p0 = pass_p0;
        mm_wait_prior_grid(); /* the weights are constant; the activations are the previous kernel's */
    }
    MM_HD uint4 piece(int j, int nt, int g, int t, int k) const {
        return mm_ftc_act16(sa, n, n_batch, j, p0 + 8 * nt + g, (int64_t)k * 32 + 8 * t);
    }
};

/* Unit (P, lane), the tokens p0 .. p0 + 8 NTILES - 1: the partial sums of its 32 rows (mm_store);
 * weights in load groups of G blocks, the next group in flight while the current one is computed. */
template <int TYPE, int NTILES, int G, bool AHEAD, class Acts>
MM_HD void mm_ftc_pass(const mm_launch_args &args, const mm_unit_place &P, int p0, int lane, Acts &acts) {
    const mm_acts &sa = args.act;
    typedef mm_ftc_traits<TYPE> tr;
    constexpr int TERMS = tr::terms;
    static_assert(G % 2 == 0, "a load group's blocks alternate the two activation buffers");
    const int g = lane >> 2, t = lane & 3;
    const mm_mat_args &M = P.M;
    const int rg = P.rg, c = P.c, k_begin = P.k_begin, k_end = P.k_end;
    const uint8_t *group_base = P.group_base;
    constexpr int64_t slot_bytes = (int64_t)MM_GROUP_ROWS * 64; /* F16/BF16: 64 bytes per block */
    const int n_batch = args.n_batch;

    float acc[2][NTILES][4] = {};
    uint4 cur[G][4], nxt[G][4];
    /* the weights of blocks k..k+G-1 (rows 8 hr + g, piece t); the block index clamped into the
     * chunk as well as guarded (matmul_mma.cuh's mm_ld_stream_u32 says why) */
    auto load = [&](uint4 (&f)[G][4], int k) {
#pragma unroll
        for (int gg = 0; gg < G; gg++)
            if (k + gg < k_end) {
                const int kk = min(k + gg, k_end - 1);
                const uint8_t *slot = group_base + (int64_t)kk * slot_bytes + (int64_t)t * 16 * MM_GROUP_ROWS;
#pragma unroll
                for (int hr = 0; hr < 4; hr++) f[gg][hr] = mm_ld_stream_16(slot + 16 * (8 * hr + g));
            }
    };
    /* The activation terms of block k for every tile. From the workspace, up to 4 tile-terms (F16 at
     * <= 2 tiles, BF16 at 1: the draft's 16-row blocks and decode) are loaded one block ahead of the
     * MMAs that take them, act[gg % 2] consumed while act[(gg + 1) % 2] is in flight (G even); with
     * more tiles the registers are not there (ptxas spilled at 4 F16 tiles, 3 BF16 ones), and from
     * shared memory there is nothing to hide, so each block's are loaded right before its MMAs. */
    constexpr bool ahead = AHEAD && NTILES * TERMS <= 4;
    uint4 act[2][NTILES][TERMS];
    auto load_tile = [&](uint4 (&f)[TERMS], int nt, int k) {
#pragma unroll
        for (int j = 0; j < TERMS; j++) f[j] = acts.piece(j, nt, g, t, k);
    };
    auto load_acts = [&](uint4 (&f)[NTILES][TERMS], int k) {
#pragma unroll
        for (int nt = 0; nt < NTILES; nt++)
            if (p0 + 8 * nt < n_batch) load_tile(f[nt], nt, k); /* warp-uniform */
    };
    load(cur, k_begin);
    acts.prepare(p0);
    if (p0 == 0 && lane == 0) mm_trace(P.M.unit_begin + rg * M.n_chunks + c, MM_TRACE_WAITED);
    if (ahead) load_acts(act[0], k_begin);
    for (int k0 = k_begin; k0 < k_end; k0 += G) {
        if (k0 + G < k_end) load(nxt, k0 + G);
#pragma unroll
        for (int gg = 0; gg < G; gg++) {
            const int k = k0 + gg;
            if (k >= k_end) break;
            if (ahead && k + 1 < k_end) load_acts(act[(gg + 1) % 2], k + 1);
#pragma unroll
            for (int nt = 0; nt < NTILES; nt++) {
                if (p0 + 8 * nt >= n_batch) continue; /* warp-uniform */
                uint4 now[TERMS];
                if (!ahead) load_tile(now, nt, k);
                const uint4(&bt)[TERMS] = ahead ? act[gg % 2][nt] : now;
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int jj = TERMS - 1; jj >= 0; jj--) { /* lo, (mid,) hi */
                        const uint32_t b[2] = {mm_u4(bt[jj], 2 * h), mm_u4(bt[jj], 2 * h + 1)};
#pragma unroll
                        for (int mt = 0; mt < 2; mt++) {
                            const uint32_t a[4] = {mm_u4(cur[gg][2 * mt], 2 * h), mm_u4(cur[gg][2 * mt + 1], 2 * h),
                                                   mm_u4(cur[gg][2 * mt], 2 * h + 1), mm_u4(cur[gg][2 * mt + 1], 2 * h + 1)};
                            mm_ftc_mma<TYPE>(acc[mt][nt], a, b, lane);
                        }
                    }
            }
        }
#pragma unroll
        for (int gg = 0; gg < G; gg++)
#pragma unroll
            for (int hr = 0; hr < 4; hr++) cur[gg][hr] = nxt[gg][hr];
    }
#pragma unroll
    for (int nt = 0; nt < NTILES; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int tok = p0 + 8 * nt + 2 * t + (i & 1);
            if (tok >= n_batch) continue;
            const float inv = TYPE == SPECLA_TYPE_F16 ? sa.inv_scale[tok] : 1.0f;
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                const int row = rg * MM_GROUP_ROWS + 16 * mt + 8 * (i >> 1) + g;
                mm_store(M, c, row, tok, TYPE == SPECLA_TYPE_F16 ? mm_mul(acc[mt][nt][i], inv) : acc[mt][nt][i]);
            }
        }
}

/* Unit u of a launch, lane `lane`: the partial sums of its 32 rows for every token (mm_store), the
 * activation terms read from the workspace. */
template <int TYPE, int NTILES>
MM_HD void mm_ftc_unit(const mm_launch_args &args, int u, int lane) {
    const mm_unit_place P = mm_unit_of<TYPE>(args, u);
    mm_ftc_workspace_acts acts{args.act, args.n, args.n_batch, 0};
    for (int p0 = 0; p0 < args.n_batch; p0 += 8 * NTILES)
        mm_ftc_pass<TYPE, NTILES, mm_ftc_traits<TYPE>::load_group, true>(args, P, p0, lane, acts);
}

#ifdef MM_KERNELS /* matmul.cu: the kernels */
/* Threads per CTA of the split: its CTA walks a whole token twice (the max, then the terms) while the
 * matmul after it waits, so the walk is spread wide: 5 elements per thread on a 5120-wide token
 * (docs/perf.md, tenth pass: 128 threads kept that matmul waiting 15 us). */
#define MM_SPLIT_THREADS 1024
/* The split of x[n_batch][n] for weight TYPE (a CTA of MM_SPLIT_THREADS per token: the token's max |x| by
 * a warp max and a shared-memory max over the CTA's warps, exact in any order), and the zeroing of
 * n_counters split-K arrival counters (grid-stride) when it is a call's first kernel. */
template <int TYPE>
__global__ void __launch_bounds__(MM_SPLIT_THREADS) mm_split_kernel(const float *__restrict__ x, int64_t n, int n_batch,
                                                              uint16_t *split, float *inv_scale, unsigned *counters,
                                                              int n_counters) {
    __shared__ float warp_max[MM_SPLIT_THREADS / 32];
    __shared__ int warp_finite[MM_SPLIT_THREADS / 32];
    grid_begin(); /* x is the previous kernel's output, the split and counters its matmul's */
    for (int64_t i = (int64_t)blockIdx.x * MM_SPLIT_THREADS + threadIdx.x; i < n_counters; i += (int64_t)gridDim.x * MM_SPLIT_THREADS)
        counters[i] = 0;
    const int b = blockIdx.x;
    const float *xb = x + (int64_t)b * n;
    float amax = 0.0f;
    int finite = 1;
    for (int64_t i = threadIdx.x; i < n; i += MM_SPLIT_THREADS) {
        const float v = xb[i];
        finite &= mm_isfinite(v);
        amax = fmaxf(amax, fabsf(v));
    }
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(MM_FULL_MASK, amax, o));
    finite = __all_sync(MM_FULL_MASK, finite);
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = amax, warp_finite[threadIdx.x >> 5] = finite;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < MM_SPLIT_THREADS / 32; w++) amax = fmaxf(amax, warp_max[w]), finite &= warp_finite[w];
    const int e = TYPE == SPECLA_TYPE_F16 && finite ? mm_split_exponent(amax) : 0;
    const float s = mm_pow2(e);
    if (threadIdx.x == 0) inv_scale[b] = mm_pow2(-e);
    for (int64_t i = threadIdx.x; i < n; i += MM_SPLIT_THREADS) {
        uint16_t terms[MM_FTC_MAX_TERMS];
        mm_split_element<TYPE>(xb[i], s, finite, terms);
#pragma unroll
        for (int j = 0; j < mm_ftc_traits<TYPE>::terms; j++) split[((int64_t)j * n_batch + b) * n + i] = terms[j];
    }
}

template <int TYPE, int NTILES, bool CHUNK_MAJOR>
__global__ void __launch_bounds__(MM_THREADS, 2) mm_ftc_kernel(const mm_launch_args args) {
    mm_run_warp_unit<CHUNK_MAJOR>(args, [&args](int u, int lane) { mm_ftc_unit<TYPE, NTILES>(args, u, lane); });
}

/* The staged form (mm_ftc_staged_kernel on sm_80+ with SPECLA_CUDA_FTC_STAGE=1, 2 or 4; opt-in until
 * timed on a GPU, mm_ftc_kernel otherwise). Measured on the mm_ftc_kernel form (the fourteenth
 * session's launch traces of draft_up: a warp's unit took about 1 us a block at 16 tokens and 0.75 at
 * one; Nsight on draft_kv at one token: 1.9 warps active per scheduler, long scoreboard the stall):
 * each block waits on its activation terms, loaded from L2 one block before their MMAs, and on its
 * weights, one group of 2 blocks ahead. Here the four warps of a CTA, which chunk-major order puts on
 * four row groups of ONE chunk, share the chunk's terms: the CTA copies them into shared memory once
 * per pass (tokens p0 .. p0 + 8 NTILES - 1, cp.async, one latency for the whole chunk) and each
 * block's fragments come from there; the registers that held the terms ahead go to a weight group of
 * G blocks. A CTA whose warps are not on one chunk (a one-row-group matrix, a matrix's last CTA, a
 * group launch's matrix boundary) runs mm_ftc_unit as mm_ftc_kernel does. The same operations in the
 * same order either way. */
#define MM_FTC_STAGE_MAX_BYTES (96 * 1024) /* dynamic shared memory a staged launch may take */

/* 16-byte pieces per staged row (one token's term over the chunk, 64 bytes a block) for chunks of
 * up to `chunk_blocks` blocks: 64 bytes over a multiple of 128, so that the two tokens a quarter
 * warp reads (lanes g, g + 1, pieces t = 0..3) fall in different banks */
MM_HD int mm_ftc_row_pieces(int chunk_blocks) { return ((chunk_blocks * 64 + 127) / 128 * 128 + 64) / 16; }
/* the largest chunk of a launch's matrices */
MM_HD int mm_ftc_max_chunk_blocks(const mm_launch_args &args) {
    int cb = args.mat[0].chunk_blocks;
    for (int i = 1; i < args.n_mats && i < CUDA_MATMUL_GROUP_LAUNCH; i++) cb = max(cb, args.mat[i].chunk_blocks);
    return cb;
}
/* dynamic shared memory of a staged launch with NTILES token tiles a pass */
template <int TYPE, int NTILES> MM_HD int64_t mm_ftc_stage_bytes(const mm_launch_args &args) {
    const int ntok = min(8 * NTILES, args.n_batch);
    return (int64_t)mm_ftc_traits<TYPE>::terms * ntok * mm_ftc_row_pieces(mm_ftc_max_chunk_blocks(args)) * 16;
}

/* a pass's terms in the CTA's shared memory, rows [term][token of the pass] of row_pieces pieces */
template <int TYPE, int NTILES> struct mm_ftc_staged_acts {
    uint4 *rows;
    const mm_acts &sa;
    int64_t n;
    int n_batch, k_begin, k_end, row_pieces, ntok;
    /* every thread of the CTA, in step: the previous pass's readers are done, then the copies */
    __device__ void prepare(int p0) {
        constexpr int TERMS = mm_ftc_traits<TYPE>::terms;
        if (p0 > 0) __syncthreads();
        else mm_wait_prior_grid(); /* the terms are the previous kernel's (the split) */
        ntok = min(8 * NTILES, n_batch - p0);
        const int pieces = (k_end - k_begin) * 4, total = TERMS * ntok * pieces;
        for (int i = (int)threadIdx.x; i < total; i += MM_THREADS) {
            const int piece = i % pieces, r = i / pieces, j = r / ntok, b = r % ntok;
            const uint16_t *src = sa.split + ((int64_t)j * n_batch + p0 + b) * n + (int64_t)k_begin * 32 + 8 * piece;
            mm_copy16_async(rows + (int64_t)r * row_pieces + piece, src, true);
        }
        mm_tile_copies_wait();
        __syncthreads();
    }
    __device__ uint4 piece(int j, int nt, int g, int t, int k) const {
        const int b = 8 * nt + g;
        if (b >= ntok) return make_uint4(0u, 0u, 0u, 0u);
        return rows[(j * ntok + b) * row_pieces + (k - k_begin) * 4 + t];
    }
};

template <int TYPE, int NTILES, int G>
__global__ void __launch_bounds__(MM_THREADS, 2) mm_ftc_staged_kernel(const mm_launch_args args) {
    extern __shared__ uint4 mm_ftc_terms[];
    __shared__ int cta_chunk[2];
    const int lane = threadIdx.x & 31;
    const int w = blockIdx.x * MM_WARPS_PER_BLOCK + (threadIdx.x >> 5);
    mm_allow_dependents();
    const bool valid = w < args.n_units;
    const int u = valid ? mm_unit_chunk_major(args, w) : 0;
    const mm_unit_place P = mm_unit_of<TYPE>(args, u);
    if (threadIdx.x == 0) cta_chunk[0] = P.M.unit_begin, cta_chunk[1] = P.c;
    __syncthreads();
    const bool one_chunk = __syncthreads_and(valid && cta_chunk[0] == P.M.unit_begin && cta_chunk[1] == P.c);
    if (!valid) return; /* whole warps, after the CTA's last barrier on the unstaged path */
    if (lane == 0) mm_trace(u, MM_TRACE_START);
    if (one_chunk) {
        mm_ftc_staged_acts<TYPE, NTILES> acts{mm_ftc_terms, args.act, args.n, args.n_batch, P.k_begin, P.k_end,
                                      mm_ftc_row_pieces(mm_ftc_max_chunk_blocks(args)), 0};
        for (int p0 = 0; p0 < args.n_batch; p0 += 8 * NTILES) mm_ftc_pass<TYPE, NTILES, G, false>(args, P, p0, lane, acts);
    } else {
        mm_ftc_unit<TYPE, NTILES>(args, u, lane);
    }
    if (lane == 0) mm_trace(u, MM_TRACE_LOOP_DONE);
    mm_finish_unit(P.M, P.rg, lane, args.n_batch);
    if (lane == 0) mm_trace(u, MM_TRACE_END);
}
#endif

#endif
