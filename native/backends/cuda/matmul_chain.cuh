/* A chain of one-token matmuls in ONE persistent kernel: y_0 = W_0 x, y_l = W_l y_{l-1}. Stage 1 of
 * docs/persistent-step.md: the task runtime (a global task list, epoch counters, waits at the data's
 * granularity) on matmuls alone, measured against the same chain launched op by op
 * (tools/cuda_chain_check.cu). Included at the end of matmul.cu, whose device functions it runs.
 *
 * Tasks. The chain's work is one list: first the Q8_K blocks of x (a warp quantizes one), then each
 * link's units (row group, chunk) exactly as mm_plan_for cuts them. Warp w of the W resident warps
 * runs tasks w, w + W, w + 2W, ... in that order. Every task waits only for tasks earlier in the list,
 * and every warp is resident (the grid is the occupancy, cuda_matmul_chain_create), so the chain
 * cannot deadlock: the earliest unfinished task never waits for an unfinished one.
 *
 * Dependencies, at the granularity the data has:
 *   - unit (rg, c) of link l reads chunk c of its input's Q8_K blocks: it waits until
 *     ready_l[c] counts the chunk's blocks quantized;
 *   - the split-K finish of row group rg is done by the last of its chunks to arrive (the arrival
 *     counter, as mm_finish_unit), adding the partial sums in chunk order;
 *   - Q8_K block j of y_l (rows 256j .. 256j + 255, row groups 8j .. 8j + 7) is quantized, into link
 *     l + 1's input, by the warp that finishes the last of those 8 row groups (rows_done_l[j]), which
 *     then bumps ready_{l+1} of the chunk holding block j.
 * So a unit of link l + 1 starts as soon as its own chunk of the input exists, while the rest of
 * link l still runs; no grid-wide wait anywhere.
 *
 * Epochs. Counters only grow: run e (e = 1, 2, ...) waits for e times the per-run count, and the
 * split-K and row-group arrivals recognise the last arrival by e times their count minus one. The
 * run number lives on the device (completed runs); every warp reads it at its start and the last
 * warp to end the run writes the next one, after all W warps have read it. So nothing is zeroed
 * between runs and a captured graph replays the launch unchanged.
 *
 * Exactness: each unit runs mm_kernel's loads and mm_block_step in the same order, the finish is
 * mm_finish_rows, the quantization mm_warp_quantize_q8_k: every y_l is the bits of cuda_matmul on
 * y_{l-1} (the check compares them on fresh inputs with every intermediate poisoned).
 *
 * Visibility: a writer's data, then __threadfence, then its counter bump (relaxed atomic: the
 * release pattern); a waiter's acquire load of the counter (or its atomic, then __threadfence) before
 * it reads. CUDA (sm_70+) only: HIP returns cudaErrorNotSupported from the host functions. */
#if !defined(SPECLA_USE_HIP)

typedef struct mm_chain_link {
    const uint8_t *w;                 /* prepared weight */
    float *y;                         /* [ne1]: the link's output */
    float *partials;                  /* [n_chunks][row_groups * 32] when n_chunks > 1 */
    unsigned *arrivals;               /* [row_groups]: split-K arrivals */
    unsigned *rows_done;              /* [ne1 / 256]: row groups finished per Q8_K block of y */
    int8_t *codes;                    /* the input's Q8_K blocks: [ne0] codes, [ne0/256] scales, */
    float *scales;                    /* [ne0/16] bsums */
    int16_t *bsums;
    unsigned *ready;                  /* [n_chunks]: Q8_K blocks of the input quantized, per chunk */
    int ne0, ne1, n_blocks, row_groups, chunk_blocks, n_chunks;
    int task_begin;                   /* the link's first task in the chain's list */
    int groups_per_unit;              /* row groups a unit computes side by side: 1, or 2 (pairs) */
} mm_chain_link;


typedef struct mm_chain_args {
    const mm_chain_link *links; /* device memory, [n_links] */
    const float *x;             /* the chain's input [links[0].ne0] */
    unsigned *completed;        /* runs completed */
    unsigned *warps_done;       /* warps that ended a run */
    int n_links, n_tasks, n_input_blocks, flags;
} mm_chain_args;

__device__ __forceinline__ unsigned mm_chain_load_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* Lane 0 waits until *counter has reached target (counters only grow; compared modulo 2^32), then
 * every lane's own acquire load of it orders the lane's later reads after the counted writers'
 * bumps. A wait that lasts about 2^26 polls (seconds) is a bug in the task lists or counters: it
 * reports the counter and traps, so a broken chain fails its launch instead of hanging. */
__device__ __forceinline__ void mm_chain_wait(const unsigned *counter, unsigned target, int lane) {
    if (lane == 0) {
        unsigned polls = 0;
        while ((int)(mm_chain_load_acquire(counter) - target) < 0) {
            __nanosleep(32);
            if (++polls == (1u << 26)) {
                printf("mm_chain_kernel: block %d waits for counter %p to reach %u (it holds %u)\n", (int)blockIdx.x,
                       (const void *)counter, target, mm_chain_load_acquire(counter));
                __trap();
            }
        }
    }
    __syncwarp();
    (void)mm_chain_load_acquire(counter);
}

/* The Q8_K block j of `y` (256 floats) quantized into `to`'s input blocks, then counted in the
 * chunk of `to` that holds it. */
__device__ __forceinline__ void mm_chain_quantize_block(const float *y, const mm_chain_link &to, int j, int lane) {
    mm_warp_quantize_q8_k(y + (int64_t)j * 256, to.codes + (int64_t)j * 256, to.scales + j, to.bsums + (int64_t)j * 16,
                          nullptr, lane);
    __threadfence();
    __syncwarp();
    if (lane == 0) atomicAdd(to.ready + j / to.chunk_blocks, 1u);
}

/* The blocks of chunk c of link L's input (the last chunk may be shorter). */
__device__ __forceinline__ unsigned mm_chain_chunk_blocks(const mm_chain_link &L, int c) {
    const int k_end = min(L.n_blocks, (c + 1) * L.chunk_blocks);
    return (unsigned)(k_end - c * L.chunk_blocks);
}

/* First row group and chunk of task g, a unit of link L (groups_per_unit row groups from rg):
 * unit by unit along the row groups, or chunk by chunk. */
__device__ __forceinline__ void mm_chain_unit_of(const mm_chain_link &L, int g, int flags, int *rg, int *c) {
    const int local = g - L.task_begin, units = (L.row_groups + L.groups_per_unit - 1) / L.groups_per_unit;
    int u;
    if (flags & CUDA_MATMUL_CHAIN_CHUNK_MAJOR) u = local % units, *c = local / units;
    else u = local / L.n_chunks, *c = local % L.n_chunks;
    *rg = u * L.groups_per_unit;
}

/* After unit (rg, c) of link l computed its partial sum `acc`: the store, the split-K finish by the
 * row group's last chunk to arrive, and for a finished row group the quantization of its Q8_K block
 * of y into link l + 1's input by the last of the block's 8 row groups. Not inlined: the unit's loop
 * then keeps only its weights, sum and activation pointers in registers (inlined, the link's other
 * fields spilled at 12 warps per SM). */
__device__ __noinline__ void mm_chain_unit_end(const mm_chain_link *links, int l, int n_links, int rg, int c, float acc,
                                               unsigned epoch, int lane) {
    const mm_chain_link &L = links[l];
    mm_mat_args M;
    memset(&M, 0, sizeof M);
    M.w = L.w, M.y = L.y, M.partials = L.partials, M.counters = L.arrivals;
    M.ne1 = L.ne1, M.n_blocks = L.n_blocks, M.row_groups = L.row_groups;
    M.chunk_blocks = L.chunk_blocks, M.n_chunks = L.n_chunks;
    mm_store(M, c, rg * MM_GROUP_ROWS + lane, 0, acc);
    if (L.n_chunks > 1) {
        __threadfence();
        __syncwarp();
        unsigned arrived = 0;
        if (lane == 0) arrived = atomicAdd(L.arrivals + rg, 1u);
        arrived = __shfl_sync(MM_FULL_MASK, arrived, 0);
        if (arrived != epoch * (unsigned)L.n_chunks - 1u) return;
        __threadfence();
        mm_finish_rows<16>(M, rg * MM_GROUP_ROWS, MM_GROUP_ROWS, 1, lane, 32);
    }
    if (l + 1 == n_links) return;
    /* row group rg of y_l is final */
    __threadfence();
    __syncwarp();
    const int j = rg / (256 / MM_GROUP_ROWS);
    unsigned done = 0;
    if (lane == 0) done = atomicAdd(L.rows_done + j, 1u);
    done = __shfl_sync(MM_FULL_MASK, done, 0);
    if (done != epoch * (unsigned)(256 / MM_GROUP_ROWS) - 1u) return;
    __threadfence();
    mm_chain_quantize_block(L.y, links[l + 1], j, lane);
}

/* Task g of a warp's walk (l: the link of its previous unit task, advanced here): an input block is
 * quantized here (false); a unit gives its link l, first row group rg, chunk c and blocks
 * [k_begin, k_end) (true). */
__device__ __forceinline__ bool mm_chain_task(const mm_chain_args &a, int g, int lane, int &l, int &rg, int &c,
                                              int &k_begin, int &k_end) {
    if (g < a.n_input_blocks) { /* the chain's input: Q8_K block g of x */
        mm_chain_quantize_block(a.x, a.links[0], g, lane);
        return false;
    }
    while (l + 1 < a.n_links && g >= a.links[l + 1].task_begin) l++;
    const mm_chain_link &L = a.links[l];
    mm_chain_unit_of(L, g, a.flags, &rg, &c);
    k_begin = c * L.chunk_blocks, k_end = min(L.n_blocks, k_begin + L.chunk_blocks);
    return true;
}

/* The run's end: the last of the grid's warps to get here makes the next launch's run number
 * epoch + 1 (every warp read this one at its start, before it arrived here). */
__device__ __forceinline__ void mm_chain_run_end(const mm_chain_args &a, unsigned epoch, int lane) {
    __syncwarp();
    if (lane == 0 && atomicAdd(a.warps_done, 1u) == epoch * gridDim.x - 1u) {
        __threadfence();
        *(volatile unsigned *)a.completed = epoch;
    }
}

/* WARPS_PER_SM: the register budget, 65536 / (32 WARPS_PER_SM) per thread. Q4_K's unit takes 240
 * registers unbounded; at 12 warps per SM (mm_kernel's) it spills 180 bytes, at 8 none. */
template <int TYPE, int WARPS_PER_SM>
__global__ void __launch_bounds__(32, WARPS_PER_SM) mm_chain_kernel(const mm_chain_args a) {
    constexpr int G = mm_traits<TYPE>::load_group;
    constexpr int64_t slot_bytes = (int64_t)MM_GROUP_ROWS * mm_traits<TYPE>::unit_bytes;
    grid_begin(); /* the previous run (or the writer of x) has ended */
    const int lane = threadIdx.x & 31;
    const unsigned W = gridDim.x;
    const unsigned epoch = *(volatile const unsigned *)a.completed + 1;
    const bool wait = !(a.flags & CUDA_MATMUL_CHAIN_NO_WAIT);
    int l = 0;
    for (int g = blockIdx.x; g < a.n_tasks; g += (int)W) {
        int rg, c, k_begin, k_end;
        if (!mm_chain_task(a, g, lane, l, rg, c, k_begin, k_end)) continue;
        const mm_chain_link &L = a.links[l];
        const uint8_t *group_base = L.w + mm_slot_offset(TYPE, L.n_blocks, rg, 0);

        mm_frag<TYPE> cur, nxt;
        mm_load(cur, group_base, k_begin, k_end, lane);
        if ((a.flags & CUDA_MATMUL_CHAIN_L2_PREFETCH) && lane == 0 && k_end - k_begin > G) {
            /* the rest of the unit's weights (contiguous slots) to L2 while the warp waits */
            const uint8_t *from = group_base + (int64_t)(k_begin + G) * slot_bytes;
            const unsigned bytes = (unsigned)((k_end - k_begin - G) * slot_bytes);
#if MM_TILE_BULK_DEVICE
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(from), "r"(bytes) : "memory");
#else
            (void)from, (void)bytes;
#endif
        }
        if (wait) mm_chain_wait(L.ready + c, epoch * mm_chain_chunk_blocks(L, c), lane);

        mm_acts act;
        memset(&act, 0, sizeof act);
        act.codes = L.codes, act.scales = L.scales, act.bsums = L.bsums;
        float acc = 0.0f;
        for (int k = k_begin; k < k_end; k += G) {
            if (k + G < k_end) mm_load(nxt, group_base, k + G, k_end, lane);
#pragma unroll
            for (int gi = 0; gi < G; gi++)
                if (k + gi < k_end) acc = mm_block_step<TYPE>(cur.w[gi], cur.side[gi], act, L.ne0, 0, k + gi, acc);
            cur = nxt;
        }
        mm_chain_unit_end(a.links, l, a.n_links, rg, c, acc, epoch, lane);
    }
    mm_chain_run_end(a, epoch, lane);
}

/* ---- the ring form: each warp's weight blocks by bulk copy into a ring of shared-memory stages ---- */
/* The register form holds one block ahead per warp, and a warp that waits for its input streams
 * nothing more. Here each warp (a CTA of one warp) keeps S blocks in flight: lane 0 walks the warp's
 * own task list ahead of the computation and issues each next block's slot (32 rows x unit_bytes,
 * contiguous in the prepared layout) with cp.async.bulk into the stage the warp has just read, an
 * mbarrier per stage counting its bytes. The weights are constant and the task list is known, so
 * the copies run ahead across task boundaries and across the waits for inputs: a warp that waits
 * has its next S blocks landing meanwhile. The lanes read their block from the stage with mm_load's
 * offsets, so the arithmetic is the register form's, bit for bit. sm_90 (bulk copies) only. */
template <int TYPE, int WARPS_PER_SM, int PAIR> struct mm_chain_ring_traits {
    static constexpr int slot_bytes = MM_GROUP_ROWS * mm_traits<TYPE>::unit_bytes;
    static constexpr int stage_bytes = PAIR * slot_bytes; /* a block of each of the unit's row groups */
    /* as many stages as WARPS_PER_SM rings fit in an SM's 227 KB, 2 to 6 */
    static constexpr int fit = (227 * 1024 / WARPS_PER_SM - 64) / stage_bytes;
    static constexpr int stages = fit > 6 ? 6 : fit < 2 ? 2 : fit;
    static constexpr int smem_bytes = 64 + stages * stage_bytes; /* the mbarriers, then the stages */
};

/* Lane 0's walk over the warp's blocks, in the order the warp computes them: task g, g + W, ...
 * (the unit tasks only), block k_begin .. k_end - 1 of each. */
struct mm_chain_cursor {
    int g, l, k, k_end, n_slots;  /* n_slots: the unit's row groups (the last pair may have one) */
    const uint8_t *base;          /* the unit's first row group's first slot */
    int64_t group_stride;         /* bytes from a row group's slots to the next one's */
};
template <int TYPE>
__device__ __forceinline__ bool mm_chain_cursor_task(const mm_chain_args &a, mm_chain_cursor &cur) {
    while (cur.g < a.n_input_blocks) cur.g += gridDim.x;
    if (cur.g >= a.n_tasks) return false;
    while (cur.l + 1 < a.n_links && cur.g >= a.links[cur.l + 1].task_begin) cur.l++;
    const mm_chain_link &L = a.links[cur.l];
    int rg, c;
    mm_chain_unit_of(L, cur.g, a.flags, &rg, &c);
    cur.k = c * L.chunk_blocks, cur.k_end = min(L.n_blocks, cur.k + L.chunk_blocks);
    cur.base = L.w + mm_slot_offset(TYPE, L.n_blocks, rg, 0);
    cur.n_slots = min(L.groups_per_unit, L.row_groups - rg);
    cur.group_stride = mm_slot_offset(TYPE, L.n_blocks, 1, 0);
    return true;
}

/* PAIR 2: a unit is two row groups of one chunk, computed side by side from one stage (two slots),
 * so each lane has two independent sums in flight, and the activation operands each block loads
 * serve both; each row group's sum is the one-row-group unit's, bit for bit. */
template <int TYPE, int WARPS_PER_SM, int PAIR>
__global__ void __launch_bounds__(32, WARPS_PER_SM) mm_chain_ring_kernel(const mm_chain_args a) {
#if MM_TILE_BULK_DEVICE
    using R = mm_chain_ring_traits<TYPE, WARPS_PER_SM, PAIR>;
    constexpr int S = R::stages, P = mm_traits<TYPE>::pieces;
    extern __shared__ __align__(128) uint8_t mm_chain_dyn[];
    uint64_t *full = (uint64_t *)mm_chain_dyn;
    uint8_t *stages = mm_chain_dyn + 64;
    const int lane = threadIdx.x & 31;
    const unsigned W = gridDim.x;
    /* lane 0's issue cursor and the blocks issued / consumed so far */
    mm_chain_cursor ahead = {(int)blockIdx.x, 0, 0, 0, 0, nullptr, 0};
    bool more = false;
    unsigned issued = 0, consumed = 0;
    auto issue_next = [&](void) { /* lane 0: the next block of the walk into stage issued % S */
        if (!more) return;
        const int st = (int)(issued % S);
        mm_bar_expect(full + st, (unsigned)(ahead.n_slots * R::slot_bytes));
        for (int i = 0; i < ahead.n_slots; i++)
            mm_bulk_copy(stages + st * R::stage_bytes + i * R::slot_bytes,
                         ahead.base + i * ahead.group_stride + (int64_t)ahead.k * R::slot_bytes, R::slot_bytes, full + st);
        issued++;
        if (++ahead.k == ahead.k_end) {
            ahead.g += (int)W;
            more = mm_chain_cursor_task<TYPE>(a, ahead);
        }
    };
    if (lane == 0) {
        for (int st = 0; st < S; st++) mm_bar_init(full + st, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        more = mm_chain_cursor_task<TYPE>(a, ahead);
        for (int st = 0; st < S; st++) issue_next(); /* constant weights: before the wait for the previous grid */
    }
    __syncwarp();
    grid_begin();
    const unsigned epoch = *(volatile const unsigned *)a.completed + 1;
    const bool wait = !(a.flags & CUDA_MATMUL_CHAIN_NO_WAIT);
    int l = 0;
    for (int g = blockIdx.x; g < a.n_tasks; g += (int)W) {
        int rg, c, k_begin, k_end;
        if (!mm_chain_task(a, g, lane, l, rg, c, k_begin, k_end)) continue;
        const mm_chain_link &L = a.links[l];
        if (wait) mm_chain_wait(L.ready + c, epoch * mm_chain_chunk_blocks(L, c), lane);

        mm_acts act;
        memset(&act, 0, sizeof act);
        act.codes = L.codes, act.scales = L.scales, act.bsums = L.bsums;
        const bool second = PAIR == 2 && rg + 1 < L.row_groups;
        float acc[PAIR];
#pragma unroll
        for (int i = 0; i < PAIR; i++) acc[i] = 0.0f;
        for (int k = k_begin; k < k_end; k++) {
            const int st = (int)(consumed % S);
            mm_bar_wait(full + st, (consumed / S) & 1u);
            uint32_t wv[PAIR][4 * P];
            mm_side side[PAIR];
#pragma unroll
            for (int i = 0; i < PAIR; i++) {
                const uint8_t *slot = stages + st * R::stage_bytes + i * R::slot_bytes;
#pragma unroll
                for (int p = 0; p < P; p++) {
                    const uint4 v = *(const uint4 *)(slot + p * 16 * MM_GROUP_ROWS + 16 * lane);
                    wv[i][4 * p] = v.x, wv[i][4 * p + 1] = v.y, wv[i][4 * p + 2] = v.z, wv[i][4 * p + 3] = v.w;
                }
                side[i].d = 0, side[i].qh = 0;
                if (mm_traits<TYPE>::has_d) side[i].d = ((const unsigned short *)(slot + P * 16 * MM_GROUP_ROWS))[lane];
            }
            consumed++;
            __syncwarp(); /* every lane has its blocks: the stage is free */
            if (lane == 0) issue_next();
            acc[0] = mm_block_step<TYPE>(wv[0], side[0], act, L.ne0, 0, k, acc[0]);
            if (PAIR == 2 && second) acc[PAIR - 1] = mm_block_step<TYPE>(wv[PAIR - 1], side[PAIR - 1], act, L.ne0, 0, k, acc[PAIR - 1]);
        }
        mm_chain_unit_end(a.links, l, a.n_links, rg, c, acc[0], epoch, lane);
        if (PAIR == 2 && second) mm_chain_unit_end(a.links, l, a.n_links, rg + 1, c, acc[PAIR - 1], epoch, lane);
    }
    mm_chain_run_end(a, epoch, lane);
#else
    (void)a;
    __trap(); /* the host launches it on sm_90+ only */
#endif
}

#endif

/* ---- host side (matmul.cu includes this file after its own host functions) ------------------------ */
#if !defined(SPECLA_USE_HIP)
struct cuda_matmul_chain {
    int32_t type;
    int form; /* CUDA_MATMUL_CHAIN_REGISTERS_8 / _12, CUDA_MATMUL_CHAIN_RING_8 / _12 / _16 or _PAIRS_8 / _12 */
    int n_links, n_tasks, n_input_blocks, warps;
    mm_chain_link *links; /* device: the start of the chain's one allocation (links, counters, partial
                           * sums, activation blocks) */
    unsigned *completed, *warps_done;
};

template <typename... KArgs> static int mm_chain_resident_warps(void (*kernel)(KArgs...), size_t smem) {
    int per_sm = 0, dev = 0, sms = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 32, smem) != cudaSuccess) return 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        return 0;
    return per_sm * sms;
}

/* f(kernel, dynamic shared memory bytes) for the ring form's instantiation of (type, form). */
template <class F> static auto mm_chain_ring_visit(int32_t type, int form, F f) {
#define MM_CHAIN_RING_CASE(T, WPS, PAIR) \
    return f(mm_chain_ring_kernel<T, WPS, PAIR>, mm_chain_ring_traits<T, WPS, PAIR>::smem_bytes)
    if (type == SPECLA_TYPE_Q6_K) {
        if (form == CUDA_MATMUL_CHAIN_RING_16) MM_CHAIN_RING_CASE(SPECLA_TYPE_Q6_K, 16, 1);
        if (form == CUDA_MATMUL_CHAIN_RING_12) MM_CHAIN_RING_CASE(SPECLA_TYPE_Q6_K, 12, 1);
        if (form == CUDA_MATMUL_CHAIN_RING_PAIRS_8) MM_CHAIN_RING_CASE(SPECLA_TYPE_Q6_K, 8, 2);
        if (form == CUDA_MATMUL_CHAIN_RING_PAIRS_12) MM_CHAIN_RING_CASE(SPECLA_TYPE_Q6_K, 12, 2);
        MM_CHAIN_RING_CASE(SPECLA_TYPE_Q6_K, 8, 1);
    }
    if (form == CUDA_MATMUL_CHAIN_RING_16) MM_CHAIN_RING_CASE(SPECLA_TYPE_Q4_K, 16, 1);
    if (form == CUDA_MATMUL_CHAIN_RING_12) MM_CHAIN_RING_CASE(SPECLA_TYPE_Q4_K, 12, 1);
    if (form == CUDA_MATMUL_CHAIN_RING_PAIRS_8) MM_CHAIN_RING_CASE(SPECLA_TYPE_Q4_K, 8, 2);
    if (form == CUDA_MATMUL_CHAIN_RING_PAIRS_12) MM_CHAIN_RING_CASE(SPECLA_TYPE_Q4_K, 12, 2);
    MM_CHAIN_RING_CASE(SPECLA_TYPE_Q4_K, 8, 1);
#undef MM_CHAIN_RING_CASE
}
#endif

extern "C" cudaError_t cuda_matmul_chain_create(int n_links, const specla_tensor *const *w, float *const *y,
                                                int form, int warps, cuda_matmul_chain **out) {
#if defined(SPECLA_USE_HIP)
    (void)n_links, (void)w, (void)y, (void)form, (void)warps, (void)out;
    return cudaErrorNotSupported;
#else
    if (!out || n_links < 1 || n_links > 64 || !w || !y || warps < 0) return cudaErrorInvalidValue;
    if (form < CUDA_MATMUL_CHAIN_REGISTERS_8 || form > CUDA_MATMUL_CHAIN_RING_PAIRS_12) return cudaErrorInvalidValue;
    const int groups_per_unit = form >= CUDA_MATMUL_CHAIN_RING_PAIRS_8 ? 2 : 1;
    const int ring = form >= CUDA_MATMUL_CHAIN_RING_8;
    if (ring && cuda_device_major() < 9) return cudaErrorNotSupported; /* bulk copies */
    *out = nullptr;
    const int32_t type = w[0] ? w[0]->type : -1;
    if (type != SPECLA_TYPE_Q4_K && type != SPECLA_TYPE_Q6_K) return cudaErrorNotSupported;
    for (int l = 0; l < n_links; l++) {
        if (!w[l] || !w[l]->data || !y[l] || w[l]->type != type) return cudaErrorInvalidValue;
        if (w[l]->ne0 <= 0 || w[l]->ne0 % 256 != 0 || w[l]->ne1 < 1) return cudaErrorInvalidValue;
        if (l > 0 && w[l]->ne0 != w[l - 1]->ne1) return cudaErrorInvalidValue;
        if (l + 1 < n_links && w[l]->ne1 % 256 != 0) return cudaErrorInvalidValue; /* whole Q8_K blocks */
    }
    if (form == CUDA_MATMUL_CHAIN_REGISTERS_12 && type != SPECLA_TYPE_Q4_K) return cudaErrorInvalidValue;
    int resident = 0;
    if (ring)
        resident = mm_chain_ring_visit(type, form, [&](auto kernel, int smem) { return mm_chain_resident_warps(kernel, smem); });
    else if (type == SPECLA_TYPE_Q6_K)
        resident = mm_chain_resident_warps(mm_chain_kernel<SPECLA_TYPE_Q6_K, 8>, 0);
    else if (form == CUDA_MATMUL_CHAIN_REGISTERS_12)
        resident = mm_chain_resident_warps(mm_chain_kernel<SPECLA_TYPE_Q4_K, 12>, 0);
    else
        resident = mm_chain_resident_warps(mm_chain_kernel<SPECLA_TYPE_Q4_K, 8>, 0);
    if (resident < 1) return cudaErrorNotSupported;
    /* more warps than fit at once could wait for a task no running warp holds */
    if (warps == 0 || warps > resident) warps = resident;

    mm_chain_link *host = (mm_chain_link *)calloc((size_t)n_links, sizeof *host);
    if (!host) return cudaErrorMemoryAllocation;
    size_t off = mm_align((size_t)n_links * sizeof(mm_chain_link));
    const size_t completed_at = off;
    off = mm_align(off + 2 * sizeof(unsigned));
    struct {
        size_t partials, arrivals, rows_done, codes, scales, bsums, ready;
    } at[64]; /* each link's arrays: offsets into the allocation */
    int task = w[0]->ne0 / 256;
    for (int l = 0; l < n_links; l++) {
        const mm_plan p = mm_plan_for(type, w[l]->ne0, w[l]->ne1);
        const size_t rows_padded = (size_t)p.row_groups * MM_GROUP_ROWS, ne0 = (size_t)w[l]->ne0;
        auto carve = [&off](size_t bytes) {
            const size_t at_off = off;
            off = mm_align(off + bytes);
            return at_off;
        };
        at[l].partials = carve(p.n_chunks > 1 ? (size_t)p.n_chunks * rows_padded * sizeof(float) : 0);
        at[l].arrivals = carve((size_t)p.row_groups * sizeof(unsigned));
        at[l].rows_done = carve((size_t)(w[l]->ne1 / 256 + 1) * sizeof(unsigned));
        at[l].codes = carve(ne0);
        at[l].scales = carve(ne0 / 256 * sizeof(float));
        at[l].bsums = carve(ne0 / 16 * sizeof(int16_t));
        at[l].ready = carve((size_t)p.n_chunks * sizeof(unsigned));
        mm_chain_link &L = host[l];
        L.w = (const uint8_t *)w[l]->data, L.y = y[l];
        L.ne0 = w[l]->ne0, L.ne1 = w[l]->ne1, L.n_blocks = p.n_blocks, L.row_groups = p.row_groups;
        L.chunk_blocks = p.chunk_blocks, L.n_chunks = p.n_chunks;
        L.task_begin = task, L.groups_per_unit = groups_per_unit;
        task += (p.row_groups + groups_per_unit - 1) / groups_per_unit * p.n_chunks;
    }
    uint8_t *mem = nullptr;
    cudaError_t err = cudaMalloc((void **)&mem, off);
    if (err == cudaSuccess) err = cudaMemset(mem, 0, off); /* every counter starts at 0: run 1 */
    if (err != cudaSuccess) {
        if (mem) cudaFree(mem);
        free(host);
        return err;
    }
    for (int l = 0; l < n_links; l++) {
        mm_chain_link &L = host[l];
        L.partials = (float *)(mem + at[l].partials), L.arrivals = (unsigned *)(mem + at[l].arrivals);
        L.rows_done = (unsigned *)(mem + at[l].rows_done), L.codes = (int8_t *)(mem + at[l].codes);
        L.scales = (float *)(mem + at[l].scales), L.bsums = (int16_t *)(mem + at[l].bsums);
        L.ready = (unsigned *)(mem + at[l].ready);
    }
    err = cudaMemcpy(mem, host, (size_t)n_links * sizeof *host, cudaMemcpyHostToDevice);
    free(host);
    cuda_matmul_chain *chain = err == cudaSuccess ? (cuda_matmul_chain *)calloc(1, sizeof *chain) : nullptr;
    if (!chain) {
        cudaFree(mem);
        return err != cudaSuccess ? err : cudaErrorMemoryAllocation;
    }
    chain->type = type, chain->form = form, chain->n_links = n_links, chain->n_tasks = task, chain->n_input_blocks = w[0]->ne0 / 256;
    chain->warps = warps, chain->links = (mm_chain_link *)mem;
    chain->completed = (unsigned *)(mem + completed_at), chain->warps_done = chain->completed + 1;
    *out = chain;
    return cudaSuccess;
#endif
}

extern "C" int cuda_matmul_chain_warps(const cuda_matmul_chain *chain) {
#if defined(SPECLA_USE_HIP)
    (void)chain;
    return 0;
#else
    return chain ? chain->warps : 0;
#endif
}

extern "C" cudaError_t cuda_matmul_chain_run(cudaStream_t stream, const cuda_matmul_chain *chain, const float *x, int flags) {
#if defined(SPECLA_USE_HIP)
    (void)stream, (void)chain, (void)x, (void)flags;
    return cudaErrorNotSupported;
#else
    if (!chain || !x) return cudaErrorInvalidValue;
    mm_chain_args a;
    a.links = chain->links, a.x = x, a.completed = chain->completed, a.warps_done = chain->warps_done;
    a.n_links = chain->n_links, a.n_tasks = chain->n_tasks, a.n_input_blocks = chain->n_input_blocks, a.flags = flags;
    const unsigned grid = (unsigned)chain->warps;
    if (chain->form >= CUDA_MATMUL_CHAIN_RING_8) {
        return mm_chain_ring_visit(chain->type, chain->form, [&](auto kernel, int smem) {
            return mm_start_smem(kernel, grid, 32, (size_t)smem, stream, a);
        });
    }
    if (chain->type == SPECLA_TYPE_Q6_K) return mm_start_threads(mm_chain_kernel<SPECLA_TYPE_Q6_K, 8>, grid, 32, stream, a);
    if (chain->form == CUDA_MATMUL_CHAIN_REGISTERS_12)
        return mm_start_threads(mm_chain_kernel<SPECLA_TYPE_Q4_K, 12>, grid, 32, stream, a);
    return mm_start_threads(mm_chain_kernel<SPECLA_TYPE_Q4_K, 8>, grid, 32, stream, a);
#endif
}

extern "C" void cuda_matmul_chain_destroy(cuda_matmul_chain *chain) {
#if !defined(SPECLA_USE_HIP)
    if (!chain) return;
    cudaFree(chain->links);
    free(chain);
#else
    (void)chain;
#endif
}
