/* The one-token Q4_K matmul with its weights several blocks ahead and its activations staged once
 * (mm_ring_kernel; CUDA sm_80+, the default there at D = 4 stages wherever a launch takes no more
 * waves than mm_kernel's, matmul.cu's mm_try_ring; SPECLA_CUDA_DP4A_RING=2, 3 or 4 takes that depth
 * for every launch, 0 mm_kernel). Included by matmul.cu after its dp4a kernel, whose units,
 * plan, stores and split-K finish it shares.
 *
 * Why: Nsight's warp samples of the one-token Q4_K kernel (mm_kernel) put 31 % of its stalls at a
 * block's first dp4a, waiting on that block's activation codes, loaded at the block's start, while
 * its weights come one block ahead in registers. Holding either further ahead alone gained nothing
 * (docs/perf.md: the weights by per-warp bulk copies in the seventh pass, the activations a block
 * ahead in the thirty-sixth): with one of the two latencies hidden the warp waited on the other.
 * This form hides both at once (on an H100: 0.9-1.3 % off a recorded decode step, ffn_up's call
 * 24.8 -> 23.7 us; docs/perf.md, thirty-seventh pass):
 *   - the lane's share of its unit's next D blocks of weights (9 x 16 bytes a block, the prepared
 *     layout's pieces, which only that lane reads) is in flight into a ring of D shared-memory
 *     stages by cp.async, the first D issued before the grid wait (weights are constant), each
 *     stage refilled with the block D further on once its block is computed;
 *   - after the grid wait the warp copies its chunk's activation codes, bsum pairs and scales into
 *     shared memory in one round of loads (a chunk of at most MM_RING_MAX_CHUNK blocks), and every
 *     block reads them there.
 * Each block then runs mm_block_q4_k_pairs on the same words as mm_kernel, in the same order: the
 * same bits. A CTA is one warp (a unit), as in mm_kernel, so an SM holds as many units as its
 * shared memory allows (D = 4: 21 KB a warp, 10 warps an SM). HIP and sm_75 keep mm_kernel. */

#define MM_RING_MAX_CHUNK 16 /* activation blocks a warp stages; longer chunks keep mm_kernel */
#define MM_RING_PIECES (mm_traits<SPECLA_TYPE_Q4_K>::pieces) /* 16-byte pieces a lane holds of a block */

/* shared memory a ring kernel of depth D needs for chunks of up to `chunk` blocks: the weight
 * stages, then the codes (256 bytes a block), the bsum pairs (8 words) and the scales */
MM_HD int mm_ring_smem_bytes(int depth, int chunk) {
    return depth * MM_RING_PIECES * 16 * MM_GROUP_ROWS + chunk * (256 + 8 * 4 + 4);
}

#if !defined(SPECLA_USE_HIP)
/* cp.async exists from sm_80 on; the ring kernel is launched only there (mm_ring_depth), and the
 * plain copies below only keep the sm_75 build compiling */
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

/* block k of the lane's row group into stage s: the lane's own 9 pieces (it alone reads them back) */
__device__ __forceinline__ void mm_ring_fetch(uint4 *stage, const uint8_t *group_base, int k, int lane) {
    constexpr int64_t slot_bytes = (int64_t)MM_GROUP_ROWS * mm_traits<SPECLA_TYPE_Q4_K>::unit_bytes;
    const uint8_t *slot = group_base + (int64_t)k * slot_bytes;
#pragma unroll
    for (int p = 0; p < MM_RING_PIECES; p++)
        mm_ring_copy16(stage + p * MM_GROUP_ROWS + lane, (const uint4 *)(slot + p * 16 * MM_GROUP_ROWS) + lane);
}

template <int D>
__global__ void __launch_bounds__(MM_DP4A_THREADS) mm_ring_kernel(const mm_launch_args args) {
    static_assert(D >= 2 && D <= 4 && MM_DP4A_WARPS_PER_BLOCK == 1, "a ring of 2..4 stages, a warp a CTA");
    extern __shared__ uint4 mm_ring_smem[];
    const int lane = threadIdx.x & 31;
    const int u = blockIdx.x;
    mm_allow_dependents(); /* launch.h: the next kernel may launch; it waits for this grid's end */
    if (u >= args.n_units) return;
    if (lane == 0) mm_trace(u, MM_TRACE_START);
    const mm_unit_place P = mm_unit_of<SPECLA_TYPE_Q4_K>(args, u);
    const mm_mat_args &M = P.M;
    const int k_begin = P.k_begin, k_end = P.k_end;
    uint4 *stages = mm_ring_smem; /* stage s, piece p, lane: stages[(s * 9 + p) * 32 + lane] */
    int8_t *codes = (int8_t *)(stages + D * MM_RING_PIECES * MM_GROUP_ROWS);
    const int chunk = k_end - k_begin;
    int32_t *pairs = (int32_t *)(codes + 256 * chunk);
    float *scales = (float *)(pairs + 8 * chunk);

    /* one commit group per block, empty past the chunk, so that "block k landed" is always
     * "at most D - 1 groups pending" */
#pragma unroll
    for (int s = 0; s < D; s++) {
        if (k_begin + s < k_end) mm_ring_fetch(stages + s * MM_RING_PIECES * MM_GROUP_ROWS, P.group_base, k_begin + s, lane);
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
        mm_bsum_pairs(args.act.bsums + (int64_t)(k_begin + i) * 16, pairs + 8 * i);
        scales[i] = args.act.scales[k_begin + i];
    }
    __syncwarp();

    float acc = 0.0f;
    int s = 0;
    for (int k = k_begin; k < k_end; k++) {
        mm_ring_wait<D - 1>(); /* this lane's copies of block k have landed */
        uint4 *stage = stages + s * MM_RING_PIECES * MM_GROUP_ROWS;
        uint32_t w[4 * MM_RING_PIECES];
#pragma unroll
        for (int p = 0; p < MM_RING_PIECES; p++) {
            const uint4 v = stage[p * MM_GROUP_ROWS + lane];
            w[4 * p] = v.x, w[4 * p + 1] = v.y, w[4 * p + 2] = v.z, w[4 * p + 3] = v.w;
        }
        const int i = k - k_begin;
#if defined(MM_LOAD_ONLY)
        uint32_t fold = 0; /* the diagnostic build (cuda_matmul_check -DMM_LOAD_ONLY): loads without arithmetic */
#pragma unroll
        for (int q = 0; q < 4 * MM_RING_PIECES; q++) fold ^= w[q];
        acc += __uint_as_float(fold & 0x3f7fffffu);
#else
        acc = mm_block_q4_k_pairs(w, codes + 256 * i, pairs + 8 * i, scales[i], acc);
#endif
        /* the stage's words are in registers and used: refill it with block k + D */
        if (k + D < k_end) mm_ring_fetch(stage, P.group_base, k + D, lane);
        mm_ring_commit();
        s = s + 1 == D ? 0 : s + 1;
    }
    mm_store(M, P.c, P.rg * MM_GROUP_ROWS + lane, 0, acc);
    if (lane == 0) mm_trace(u, MM_TRACE_LOOP_DONE);
    mm_finish_unit(M, P.rg, lane, 1);
    if (lane == 0) mm_trace(u, MM_TRACE_END);
}
#endif
