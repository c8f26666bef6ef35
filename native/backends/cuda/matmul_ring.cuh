/* The one-token Q4_K and Q6_K matmuls with their weights several blocks ahead and their activations
 * staged once (mm_ring_kernel<TYPE, D>, and mm_ring_pair_kernel<D> for a group's Q4_K and Q6_K
 * matrices in one launch; CUDA sm_80+, the default there for Q4_K and the pair at the deepest of
 * D = 4, 3, 2 stages with which a launch takes no more waves than the kernel it replaces, matmul.cu's
 * mm_try_ring, while a Q6_K launch of its own keeps mm_kernel, which was faster for it;
 * SPECLA_CUDA_DP4A_RING=2, 3 or 4 takes that depth for every such launch, 0 the dp4a kernels).
 * Included by matmul.cu after its dp4a kernels, whose units, plan, stores and split-K finish it
 * shares.
 *
 * Why: Nsight's warp samples of the one-token Q4_K kernel (mm_kernel) put 31 % of its stalls at a
 * block's first dp4a, waiting on that block's activation codes, loaded at the block's start, while
 * its weights come one block ahead in registers. Holding either further ahead alone gained nothing
 * (docs/perf.md: the weights by per-warp bulk copies in the seventh pass, the activations a block
 * ahead in the thirty-sixth): with one of the two latencies hidden the warp waited on the other.
 * This form hides both at once (Q4_K on an H100: 0.9-1.3 % off a recorded decode step, ffn_up's call
 * 24.8 -> 23.7 us; docs/perf.md, thirty-seventh pass):
 *   - the lane's share of its unit's next D blocks of weights (its row's 16-byte pieces of the
 *     prepared layout, 9 for Q4_K and 13 for Q6_K, plus for Q6_K the 4-byte word of the side plane
 *     that holds its scale d; only that lane reads them back) is in flight into a ring of D
 *     shared-memory stages by cp.async, the first D issued before the grid wait (weights are
 *     constant), each stage refilled with the block D further on once its block is computed;
 *   - after the grid wait the warp copies its chunk's activation codes, bsums (Q4_K: as the eight
 *     pairs its block step reads) and scales into shared memory in one round of loads (a chunk of
 *     at most MM_RING_MAX_CHUNK blocks), and every block reads them there.
 * Each block then runs mm_block_q4_k_pairs or mm_block_q6_k on the same words as mm_kernel, in the
 * same order: the same bits. A CTA is one warp (a unit), as in mm_kernel, so an SM holds as many units
 * as its shared memory allows (Q4_K at D = 4: 18.4 KB of stages a warp; Q6_K at D = 3: 20.4 KB). At
 * 96 registers a lane, where mm_pair_kernel takes 251 (8 warps an SM), the pair launch's Q4_K share
 * runs at its own occupancy: that is where the pair form gains (docs/perf.md, thirty-eighth pass).
 * HIP and sm_75 keep the dp4a kernels. */

#define MM_RING_MAX_CHUNK 24 /* activation blocks a warp stages (the 27B LM head's chunks are 20);
                                longer chunks keep mm_kernel */
#define MM_RING_ACT_BYTES (256 + 32 + 4) /* a staged activation block: codes, bsums (or Q4_K's pairs), scale */

/* A stage of one block for the warp: the pieces (piece p of lane r at [p * 32 + r]), then for Q6_K a
 * plane of 32 words, lane r's holding the two bytes of d it reads (the side plane's word r / 2). */
template <int TYPE> struct mm_ring_traits {
    static_assert(TYPE == SPECLA_TYPE_Q4_K || TYPE == SPECLA_TYPE_Q6_K, "the ring kernel takes Q4_K and Q6_K");
    static constexpr int pieces = mm_traits<TYPE>::pieces;
    static constexpr bool has_d = TYPE == SPECLA_TYPE_Q6_K;
    static constexpr int stage_bytes = pieces * 16 * MM_GROUP_ROWS + (has_d ? 4 * MM_GROUP_ROWS : 0);
};

/* the largest launch (4 Q6_K stages, the longest chunk) stays within the 48 KB of dynamic shared
 * memory a kernel gets without cudaFuncSetAttribute, which the ring launches do not call */
static_assert(4 * mm_ring_traits<SPECLA_TYPE_Q6_K>::stage_bytes + MM_RING_MAX_CHUNK * MM_RING_ACT_BYTES <= 48 * 1024,
              "the ring's stages and staged chunk must fit 48 KB");

/* shared memory a ring kernel of depth D over weight type `type` needs for chunks of up to `chunk`
 * blocks: the weight stages, then the codes (256 bytes a block), the bsums (32) and the scales */
MM_HD int mm_ring_smem_bytes(int32_t type, int depth, int chunk) {
    const int stage = type == SPECLA_TYPE_Q6_K ? mm_ring_traits<SPECLA_TYPE_Q6_K>::stage_bytes
                                               : mm_ring_traits<SPECLA_TYPE_Q4_K>::stage_bytes;
    return depth * stage + chunk * MM_RING_ACT_BYTES;
}

#if !defined(SPECLA_USE_HIP)
/* cp.async exists from sm_80 on; the ring kernels are launched only there (mm_ring_setting_now), and
 * the plain copies below only keep the sm_75 build compiling */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define MM_RING_ASYNC 1
#else
#define MM_RING_ASYNC 0
#endif
/* lane's 16-byte piece of a weight block into its stage slot, with the weight stream's L2 policy */
__device__ __forceinline__ void mm_ring_copy16(uint4 *dst, const void *src) {
#if MM_RING_ASYNC
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
#if MM_WEIGHTS_EVICT_FIRST
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
                 "l"(mm_weights_policy())
                 : "memory");
#else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
#endif
#else
    *dst = *(const uint4 *)src;
#endif
}
/* the same for a 4-byte word (cp.async takes 4 bytes only through L1, .ca) */
__device__ __forceinline__ void mm_ring_copy4(uint32_t *dst, const void *src) {
#if MM_RING_ASYNC
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
#if MM_WEIGHTS_EVICT_FIRST
    asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src),
                 "l"(mm_weights_policy())
                 : "memory");
#else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(src) : "memory");
#endif
#else
    *dst = *(const uint32_t *)src;
#endif
}
__device__ __forceinline__ void mm_ring_commit(void) {
#if MM_RING_ASYNC
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int PENDING> __device__ __forceinline__ void mm_ring_wait(void) {
#if MM_RING_ASYNC
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
#endif
}

/* block k of the lane's row group into a stage: the lane's own pieces, and for Q6_K its d's word */
template <int TYPE> __device__ __forceinline__ void mm_ring_fetch(uint4 *stage, const uint8_t *group_base, int k, int lane) {
    constexpr int P = mm_ring_traits<TYPE>::pieces;
    constexpr int64_t slot_bytes = (int64_t)MM_GROUP_ROWS * mm_traits<TYPE>::unit_bytes;
    const uint8_t *slot = group_base + (int64_t)k * slot_bytes;
#pragma unroll
    for (int p = 0; p < P; p++)
        mm_ring_copy16(stage + p * MM_GROUP_ROWS + lane, (const uint4 *)(slot + p * 16 * MM_GROUP_ROWS) + lane);
    if constexpr (mm_ring_traits<TYPE>::has_d) /* the side plane's d values, 2 bytes a lane */
        mm_ring_copy4((uint32_t *)(stage + P * MM_GROUP_ROWS) + lane,
                      (const uint32_t *)(slot + P * 16 * MM_GROUP_ROWS) + lane / 2);
}

/* Unit u of a one-token launch of weight type TYPE, by one warp, over D stages at `smem`. */
template <int TYPE, int D> __device__ __forceinline__ void mm_ring_cta(const mm_launch_args &args, int u, uint4 *smem) {
    static_assert(D >= 2 && D <= 4 && MM_DP4A_WARPS_PER_BLOCK == 1, "a ring of 2..4 stages, a warp a CTA");
    constexpr int P = mm_ring_traits<TYPE>::pieces, STAGE = mm_ring_traits<TYPE>::stage_bytes / 16;
    const int lane = threadIdx.x & 31;
    mm_allow_dependents(); /* launch.h: the next kernel may launch; it waits for this grid's end */
    if (u >= args.n_units) return;
    if (lane == 0) mm_trace(u, MM_TRACE_START);
    const mm_unit_place Pl = mm_unit_of<TYPE>(args, u);
    const mm_mat_args &M = Pl.M;
    const int k_begin = Pl.k_begin, k_end = Pl.k_end;
    uint4 *stages = smem; /* stage s at stages + s * STAGE */
    int8_t *codes = (int8_t *)(stages + D * STAGE);
    const int chunk = k_end - k_begin;
    int32_t *bsums = (int32_t *)(codes + 256 * chunk); /* 8 words a block: Q4_K's pairs, Q6_K's 16 int16 */
    float *scales = (float *)(bsums + 8 * chunk);

    /* one commit group per block, empty past the chunk, so that "block k landed" is always
     * "at most D - 1 groups pending" */
#pragma unroll
    for (int s = 0; s < D; s++) {
        if (k_begin + s < k_end) mm_ring_fetch<TYPE>(stages + s * STAGE, Pl.group_base, k_begin + s, lane);
        mm_ring_commit();
    }
    mm_wait_prior_grid(); /* the weights are constant; the activations are the previous kernel's */
    if (lane == 0) mm_trace(u, MM_TRACE_WAITED);

    /* the chunk's activations, one round of plain loads (mm_load16_act: what the previous kernel
     * wrote is never read through the non-coherent path) */
    for (int i = lane; i < 16 * chunk; i += 32) {
        uint32_t v[4];
        mm_load16_act(args.act.codes + (int64_t)k_begin * 256 + 16 * i, v);
        ((uint4 *)codes)[i] = make_uint4(v[0], v[1], v[2], v[3]);
    }
    for (int i = lane; i < chunk; i += 32) {
        const int16_t *bs = args.act.bsums + (int64_t)(k_begin + i) * 16;
        if constexpr (TYPE == SPECLA_TYPE_Q4_K) {
            mm_bsum_pairs(bs, bsums + 8 * i);
        } else {
            uint32_t v[8];
            mm_load16_act(bs, v), mm_load16_act(bs + 8, v + 4);
            ((uint4 *)(bsums + 8 * i))[0] = make_uint4(v[0], v[1], v[2], v[3]);
            ((uint4 *)(bsums + 8 * i))[1] = make_uint4(v[4], v[5], v[6], v[7]);
        }
        scales[i] = args.act.scales[k_begin + i];
    }
    __syncwarp();

    float acc = 0.0f;
    int s = 0;
    for (int k = k_begin; k < k_end; k++) {
        mm_ring_wait<D - 1>(); /* this lane's copies of block k have landed */
        uint4 *stage = stages + s * STAGE;
        uint32_t w[4 * P];
#pragma unroll
        for (int p = 0; p < P; p++) {
            const uint4 v = stage[p * MM_GROUP_ROWS + lane];
            w[4 * p] = v.x, w[4 * p + 1] = v.y, w[4 * p + 2] = v.z, w[4 * p + 3] = v.w;
        }
        mm_side side;
        side.d = 0, side.qh = 0;
        if constexpr (mm_ring_traits<TYPE>::has_d)
            side.d = (uint16_t)(((const uint32_t *)(stage + P * MM_GROUP_ROWS))[lane] >> (16 * (lane & 1)));
        const int i = k - k_begin;
#if defined(MM_LOAD_ONLY)
        uint32_t fold = side.d; /* the diagnostic build (cuda_matmul_check -DMM_LOAD_ONLY): loads without arithmetic */
#pragma unroll
        for (int q = 0; q < 4 * P; q++) fold ^= w[q];
        acc += __uint_as_float(fold & 0x3f7fffffu);
#else
        if constexpr (TYPE == SPECLA_TYPE_Q4_K)
            acc = mm_block_q4_k_pairs(w, codes + 256 * i, bsums + 8 * i, scales[i], acc);
        else
            acc = mm_block_q6_k(w, side, codes + 256 * i, (const int16_t *)(bsums + 8 * i), scales[i], acc);
#endif
        /* the stage's words are in registers and used: refill it with block k + D */
        if (k + D < k_end) mm_ring_fetch<TYPE>(stage, Pl.group_base, k + D, lane);
        mm_ring_commit();
        s = s + 1 == D ? 0 : s + 1;
    }
    mm_store(M, Pl.c, Pl.rg * MM_GROUP_ROWS + lane, 0, acc);
    if (lane == 0) mm_trace(u, MM_TRACE_LOOP_DONE);
    mm_finish_unit(M, Pl.rg, lane, 1);
    if (lane == 0) mm_trace(u, MM_TRACE_END);
}

template <int TYPE, int D> __global__ void __launch_bounds__(MM_DP4A_THREADS) mm_ring_kernel(const mm_launch_args args) {
    extern __shared__ uint4 mm_ring_smem[];
    mm_ring_cta<TYPE, D>(args, blockIdx.x, mm_ring_smem);
}

/* A group's Q4_K matrices (launch a, its first a_ctas CTAs) and Q6_K matrices (launch b) in one
 * launch, as mm_pair_kernel pairs their dp4a forms (docs/cuda-matmul.md, the pair launch): each unit
 * the operations of its own type's ring kernel, so the same bits. The dynamic shared memory is the
 * larger share's, Q6_K's stages. */
template <int D>
__global__ void __launch_bounds__(MM_DP4A_THREADS) mm_ring_pair_kernel(const mm_launch_args a, const mm_launch_args b,
                                                                       int a_ctas) {
    extern __shared__ uint4 mm_ring_smem[];
    if ((int)blockIdx.x < a_ctas) mm_ring_cta<SPECLA_TYPE_Q4_K, D>(a, blockIdx.x, mm_ring_smem);
    else mm_ring_cta<SPECLA_TYPE_Q6_K, D>(b, blockIdx.x - a_ctas, mm_ring_smem);
}
#endif
