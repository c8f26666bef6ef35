/* The CUDA backend's element-wise and row ops (backend.h): weight row lookup and dequantization,
 * norms, gates, splits, residual adds, row scatter and in-place row moves.
 *
 * Numerics. Every product, sum and difference that the CPU oracle (elementwise.c, ops_scalar.c,
 * quant_scalar.c, all built with -ffp-contract=off) computes as separate float operations is written
 * here with __fmul_rn / __fadd_rn / __fsub_rn, so nvcc cannot contract it into an FMA; divisions and
 * square roots are __fdiv_rn / __fsqrt_rn (IEEE). Dequantization therefore gives the CPU's bits
 * exactly (same products of the fp16 scale and the integer level, same order). expf / log1pf are
 * the device library's, within an ulp or two of the host's.
 *
 * L2 norm reduction order (l2_norm, gdn_split_qkv; one row = one block of NORM_THREADS threads
 * whatever the number of rows): thread i sums x[i], x[i + NORM_THREADS], ... in order, then the
 * NORM_THREADS partial sums are combined by a fixed xor-butterfly inside each 32-lane group and a
 * fixed sequential sum of the group totals in group order. The RMS norms have their own mapping and
 * order, written above their kernel. Either way a row's result depends only on its values and
 * length.
 *
 * Thread mapping: element-wise ops use one thread per element (grid-stride); get_rows /
 * dequantize decode one output element per thread; move_rows gives each thread one column and
 * walks the moves in ascending i, so overlapping moves keep the CPU's sequential semantics;
 * gather_rows is one launch for all its rows: each block copies one chunk of GATHER_CHUNK floats of
 * one destination row, four floats a thread (one 16-byte load and store where both addresses are
 * 16-byte aligned), moving the bits as 32-bit words so every value, NaN payloads included, arrives
 * unchanged. */
#include <math.h>
#include <stdint.h>

#include "cuda_backend.h"
#include "launch.h"
#include "element_types.h"
#include "row_math.cuh"
#include "matmul_sums.cuh"
#include "matmul_quantize.cuh"

#define EW_THREADS 256

/* ---- element decoders (quant_scalar.c, one element at a time) ------------------------------- */

static __device__ __forceinline__ uint32_t load_u16(const uint8_t *p) { return (uint32_t)p[0] | ((uint32_t)p[1] << 8); }

/* the shared exact binary16 -> binary32 conversion (element_types.h: subnormals, inf and NaN payloads kept) */
static __device__ __forceinline__ float load_half(const uint8_t *p) { return half_to_float((specla_half)load_u16(p)); }

/* Q4_0 / Q4_1 nibble of element l (0..31): low nibble of qs[l] for l < 16, high of qs[l - 16]. */
static __device__ __forceinline__ int nibble_level(const uint8_t *qs, int l) {
    return l < 16 ? qs[l] & 15 : qs[l - 16] >> 4;
}
static __device__ __forceinline__ int five_bit_level(const uint8_t *qs, const uint8_t *qh, int l) {
    return nibble_level(qs, l) | (((qh[l / 8] >> (l % 8)) & 1) << 4);
}

static __device__ __forceinline__ void k_scale_min_dev(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Element e of a row (or tensor) of `type` starting at `src`: the CPU's formula for that element. */
static __device__ float decode_element(int32_t type, const uint8_t *src, int64_t e) {
    switch (type) {
    case SPECLA_TYPE_F32: return ((const float *)src)[e];
    case SPECLA_TYPE_F16: return load_half(src + 2 * e);
    case SPECLA_TYPE_BF16: return __uint_as_float(load_u16(src + 2 * e) << 16);
    case SPECLA_TYPE_Q4_0: {
        const uint8_t *b = src + (e / QK4_0) * (int64_t)sizeof(block_q4_0);
        const int l = (int)(e % QK4_0);
        return __fmul_rn(load_half(b), (float)(nibble_level(b + 2, l) - 8));
    }
    case SPECLA_TYPE_Q4_1: {
        const uint8_t *b = src + (e / QK4_1) * (int64_t)sizeof(block_q4_1);
        const int l = (int)(e % QK4_1);
        return __fadd_rn(__fmul_rn(load_half(b), (float)nibble_level(b + 4, l)), load_half(b + 2));
    }
    case SPECLA_TYPE_Q5_0: {
        const uint8_t *b = src + (e / QK5_0) * (int64_t)sizeof(block_q5_0);
        const int l = (int)(e % QK5_0);
        return __fmul_rn(load_half(b), (float)(five_bit_level(b + 6, b + 2, l) - 16));
    }
    case SPECLA_TYPE_Q5_1: {
        const uint8_t *b = src + (e / QK5_1) * (int64_t)sizeof(block_q5_1);
        const int l = (int)(e % QK5_1);
        return __fadd_rn(__fmul_rn(load_half(b), (float)five_bit_level(b + 8, b + 4, l)), load_half(b + 2));
    }
    case SPECLA_TYPE_Q8_0: {
        const uint8_t *b = src + (e / QK8_0) * (int64_t)sizeof(block_q8_0);
        const int l = (int)(e % QK8_0);
        return __fmul_rn((float)(int8_t)b[2 + l], load_half(b));
    }
    case SPECLA_TYPE_Q4_K:
    case SPECLA_TYPE_Q5_K: {
        /* both: d, dmin, 12 scale bytes; Q5_K adds qh[32] before qs[128] */
        const int five = type == SPECLA_TYPE_Q5_K;
        const uint8_t *b =
            src + (e / QK_K) * (int64_t)(five ? sizeof(block_q5_K) : sizeof(block_q4_K));
        const int w = (int)(e % QK_K), j = w / 32, l = w % 32;
        const uint8_t *scales = b + 4;
        const uint8_t *qh = b + 4 + K_SCALE_SIZE;
        const uint8_t *qs = qh + (five ? QK_K / 8 : 0);
        int sc, m;
        k_scale_min_dev(scales, j, &sc, &m);
        const float scale = __fmul_rn(load_half(b), (float)sc);
        const float offset = __fmul_rn(load_half(b + 2), (float)m);
        int level = (qs[32 * (j / 2) + l] >> (4 * (j & 1))) & 15;
        if (five) level |= ((qh[l] >> j) & 1) << 4;
        return __fsub_rn(__fmul_rn(scale, (float)level), offset);
    }
    case SPECLA_TYPE_Q6_K: {
        const uint8_t *b = src + (e / QK_K) * (int64_t)sizeof(block_q6_K);
        const int w = (int)(e % QK_K), half = w / 128, quarter = (w % 128) / 32, l = w % 32;
        const uint8_t *ql = b + 64 * half;                    /* ql[128] */
        const uint8_t *qh = b + QK_K / 2 + 32 * half;         /* qh[64] */
        const int8_t *sc = (const int8_t *)(b + QK_K / 2 + QK_K / 4) + 8 * half; /* scales[16] */
        const float d = load_half(b + QK_K / 2 + QK_K / 4 + QK_K / 16);
        const int low = quarter & 1 ? ql[l + 32] : ql[l];          /* quarters 1, 3 read ql[l + 32] */
        const int nib = quarter < 2 ? low & 15 : low >> 4;          /* quarters 2, 3 the high nibble */
        const int q = (nib | (((qh[l] >> (2 * quarter)) & 3) << 4)) - 32;
        return __fmul_rn(__fmul_rn(d, (float)sc[l / 16 + 2 * quarter]), (float)q);
    }
    default: return __int_as_float(0x7fc00000); /* unreachable: types are validated at the boundary */
    }
}

static __global__ void get_rows_kernel(int32_t type, const uint8_t *data, int64_t row_bytes, int ne0,
                                       const int32_t *ids, float *out) {
    grid_begin();
    const int r = blockIdx.y;
    const uint8_t *row = data + (int64_t)ids[r] * row_bytes;
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < ne0; e += gridDim.x * blockDim.x)
        out[(int64_t)r * ne0 + e] = decode_element(type, row, e);
}

static __global__ void dequantize_kernel(int32_t type, const uint8_t *src, int64_t n, float *dst) {
    grid_begin();
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x)
        dst[e] = decode_element(type, src, e);
}

static unsigned grid_for(int64_t n, int threads) {
    int64_t blocks = (n + threads - 1) / threads;
    if (blocks > 65535 * 4) blocks = 65535 * 4; /* grid-stride loops cover the rest */
    return (unsigned)(blocks < 1 ? 1 : blocks);
}

extern "C" void cuda_get_rows(const backend *be, const specla_tensor *w, const int32_t *ids, int n, float *out) {
    if (n <= 0) return;
    const int64_t row_bytes = type_row_bytes(w->type, w->ne0);
    unsigned bx = grid_for(w->ne0, EW_THREADS);
    if (bx > 1024) bx = 1024;
    cuda_launch(get_rows_kernel, dim3(bx, (unsigned)n), dim3(EW_THREADS), 0, cuda_stream(be),
                w->type, (const uint8_t *)w->data, row_bytes, w->ne0, ids, out);
    cuda_note_launch(be, "get_rows");
}

extern "C" void cuda_dequantize(const backend *be, int32_t type, const void *src, int64_t n, float *dst) {
    if (n <= 0) return;
    cuda_launch(dequantize_kernel, dim3(grid_for(n, EW_THREADS)), dim3(EW_THREADS), 0, cuda_stream(be), type,
                (const uint8_t *)src, n, dst);
    cuda_note_launch(be, "dequantize");
}

/* ---- norms (row_math.cuh holds the row arithmetic) ------------------------------------------- */

static __global__ void __launch_bounds__(NORM_THREADS) l2_norm_kernel(const float *x, int n, float eps, float *y) {
    grid_begin();
    __shared__ float partials[NORM_THREADS / SPECLA_WARP];
    const int64_t off = (int64_t)blockIdx.x * n;
    l2_row(x + off, n, eps, y + off, partials);
}

/* ---- RMS norms: rms_norm, add_rms_norm, gated_rms_norm -------------------------------------------
 *
 * Thread mapping: a row is cut into quads of 4 floats (the last one padded with zeros when n is not
 * a multiple of 4) and handled by a group of RMS_GROUP(n) threads: 32 lanes for rows of at most
 * RMS_WARP_MAX_WIDTH floats (RMS_THREADS / 32 rows per block; the q/k norms' 256 and the gated
 * norm's 128), a whole block of RMS_THREADS for wider rows (one row per block; the 5120 of the
 * residual stream). Thread `lane` of the group owns quads lane, lane + G, lane + 2G, ... Each
 * thread first issues the loads of its first C quads of x (and delta, weight, gate; C =
 * RMS_WARP_CACHED_QUADS for warp groups and the gated norm, else RMS_BLOCK_CACHED_QUADS), keeps them in registers, and re-reads from
 * memory only beyond them (rows wider than G * C * 4 floats).
 *
 * Reduction order (depends on n only, never on n_rows, on alignment or on the loads' width):
 * thread partial s = 0, then s += v*v for its quads in ascending order and the 4 floats of a quad in
 * order (padding adds +0: no change); the 32 partials of a warp by the xor butterfly of group_sum;
 * for a block-wide group, the RMS_THREADS / 32 warp totals p[0..W) by the fixed pairwise tree
 * p[w] += p[w + h] for h = W/2, W/4, ..., 1. Then scale = 1 / sqrt(sum / n + eps) and
 * y = x * scale * weight (* silu(gate)), each product rounded (the CPU's order).
 *
 * add_rms_norm stores x + delta (one rounded add, add_kernel's arithmetic) and norms that value, so
 * it gives the bits of cuda_add then cuda_rms_norm. Every element is read and written by its owning
 * thread only, and the y writes come after the reduction, so y == x (in place) is safe. */

#define RMS_THREADS 256
#define RMS_WARP_MAX_WIDTH 512
#define RMS_WARP_CACHED_QUADS 4  /* 32 lanes x 4 quads: rows up to 512 floats in registers */
#define RMS_BLOCK_CACHED_QUADS 8 /* 256 threads x 8 quads: rows up to 8192 floats in registers
                                    (4 for the gated norm, whose gate quads would spill on sm_75) */
#define RMS_WARPS (RMS_THREADS / SPECLA_WARP)

static __device__ __forceinline__ float4 load_quad(const float *row, int e, int n, bool vec) {
    if (vec) return *reinterpret_cast<const float4 *>(row + e);
    float4 v;
    v.x = row[e]; /* e < n: the caller's quad exists */
    v.y = e + 1 < n ? row[e + 1] : 0.0f;
    v.z = e + 2 < n ? row[e + 2] : 0.0f;
    v.w = e + 3 < n ? row[e + 3] : 0.0f;
    return v;
}

static __device__ __forceinline__ void store_quad(float *row, int e, int n, bool vec, float4 v) {
    if (vec) {
        *reinterpret_cast<float4 *>(row + e) = v;
        return;
    }
    row[e] = v.x;
    if (e + 1 < n) row[e + 1] = v.y;
    if (e + 2 < n) row[e + 2] = v.z;
    if (e + 3 < n) row[e + 3] = v.w;
}

static __device__ __forceinline__ float4 add_quad(float4 a, float4 b) {
    return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z), __fadd_rn(a.w, b.w));
}

/* The group's total of the partials s (the order in the section header); every thread gets it. A
 * block-wide group is threads 0 .. RMS_THREADS - 1; a larger block (add_rms_sums_kernel) calls this
 * with every thread (those beyond the group with s = 0) and room in partials for every warp. */
template <int GROUP>
static __device__ __forceinline__ float rms_group_total(float s, float *partials) {
    s = group_sum(s);
    if (GROUP == SPECLA_WARP) return s;
    if (threadIdx.x % SPECLA_WARP == 0) partials[threadIdx.x / SPECLA_WARP] = s;
    __syncthreads();
    float p[RMS_WARPS];
#pragma unroll
    for (int w = 0; w < RMS_WARPS; w++) p[w] = partials[w];
#pragma unroll
    for (int half = RMS_WARPS / 2; half > 0; half >>= 1)
#pragma unroll
        for (int w = 0; w < half; w++) p[w] = __fadd_rn(p[w], p[w + half]);
    return p[0]; /* one row per block: partials are not reused, no second barrier */
}

/* quad e of row `row` of a matmul output left as partial sums (matmul_sums.cuh), as load_quad reads
 * the finished output */
static __device__ __forceinline__ float4 sums_quad(const cuda_matmul_sums &s, int row, int e, int n, bool vec) {
    if (vec) return mm_sums_load<float4>(s, row, e);
    float4 v;
    v.x = mm_sums_load<float>(s, row, e);
    v.y = e + 1 < n ? mm_sums_load<float>(s, row, e + 1) : 0.0f;
    v.z = e + 2 < n ? mm_sums_load<float>(s, row, e + 2) : 0.0f;
    v.w = e + 3 < n ? mm_sums_load<float>(s, row, e + 3) : 0.0f;
    return v;
}

/* Rows of n floats: y = rms_norm(x) * weight (weight may be NULL); ADD: x += delta first (stored to
 * x, normed); GATED: y *= silu(gate). vec: n % 4 == 0 and every pointer 16-byte aligned. SUMS (with
 * ADD): delta is a matmul's output left as partial sums `dsums`, added up here and also stored to
 * `delta` (its finished values, as the matmul would have written them). */
template <int GROUP, bool ADD, bool GATED, bool SUMS = false>
static __global__ void __launch_bounds__(RMS_THREADS) rms_rows_kernel(float *x, const float *delta,
                                                                      const float *weight, const float *gate,
                                                                      int n_rows, int n, float eps, float *y,
                                                                      bool vec, cuda_matmul_sums dsums) {
    static_assert(!SUMS || (ADD && GROUP == SPECLA_WARP), "wider rows read partial sums in add_rms_sums_kernel");
    grid_begin();
    constexpr int CACHED = GROUP == SPECLA_WARP || GATED ? RMS_WARP_CACHED_QUADS : RMS_BLOCK_CACHED_QUADS;
    __shared__ float partials[RMS_WARPS];
    const int rows_per_block = RMS_THREADS / GROUP;
    const int lane = threadIdx.x % GROUP;
    const int row = blockIdx.x * rows_per_block + threadIdx.x / GROUP;
    if (row >= n_rows) return; /* only when GROUP == 32: whole warps leave, no block barrier follows */
    const int64_t off = (int64_t)row * n;
    x += off;
    y += off;
    if (ADD) delta += off;
    if (GATED) gate += off;
    const int n_quads = (n + 3) / 4;

    float4 xv[CACHED], dv[CACHED], wv[CACHED], gv[CACHED];
#pragma unroll
    for (int k = 0; k < CACHED; k++) { /* every load first, then the arithmetic */
        const int q = lane + k * GROUP;
        if (q < n_quads) {
            xv[k] = load_quad(x, 4 * q, n, vec);
            if (ADD) dv[k] = SUMS ? sums_quad(dsums, row, 4 * q, n, vec) : load_quad(delta, 4 * q, n, vec);
            if (weight) wv[k] = load_quad(weight, 4 * q, n, vec);
            if (GATED) gv[k] = load_quad(gate, 4 * q, n, vec);
        }
    }
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < CACHED; k++) {
        const int q = lane + k * GROUP;
        if (q < n_quads) {
            if (ADD) {
                if (SUMS) store_quad(const_cast<float *>(delta), 4 * q, n, vec, dv[k]);
                xv[k] = add_quad(xv[k], dv[k]);
                store_quad(x, 4 * q, n, vec, xv[k]);
            }
            s = add_squares(s, xv[k]);
        }
    }
    for (int q = lane + CACHED * GROUP; q < n_quads; q += GROUP) { /* beyond the registers */
        float4 v = load_quad(x, 4 * q, n, vec);
        if (ADD) {
            const float4 d = SUMS ? sums_quad(dsums, row, 4 * q, n, vec) : load_quad(delta, 4 * q, n, vec);
            if (SUMS) store_quad(const_cast<float *>(delta), 4 * q, n, vec, d);
            v = add_quad(v, d);
            store_quad(x, 4 * q, n, vec, v);
        }
        s = add_squares(s, v);
    }
    const float sum = rms_group_total<GROUP>(s, partials);
    const float scale = rms_scale(sum, n, eps);

    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int k = 0; k < CACHED; k++) {
        const int q = lane + k * GROUP;
        if (q < n_quads)
            store_quad(y, 4 * q, n, vec,
                       scaled_quad(xv[k], scale, weight, weight ? wv[k] : zero, GATED, GATED ? gv[k] : zero));
    }
    for (int q = lane + CACHED * GROUP; q < n_quads; q += GROUP) {
        const float4 w = weight ? load_quad(weight, 4 * q, n, vec) : zero;
        const float4 g = GATED ? load_quad(gate, 4 * q, n, vec) : zero;
        store_quad(y, 4 * q, n, vec, scaled_quad(load_quad(x, 4 * q, n, vec), scale, weight, w, GATED, g));
    }
}

/* add_rms_norm with delta a matmul output left as partial sums, for rows of RMS_WARP_MAX_WIDTH <
 * n <= RMS_SUMS_MAX_WIDTH floats (the residual stream's 5120) with every pointer 16-byte aligned
 * (cuda_add_rms_norm_reads_sums): the bits of add_rms_norm on the finished delta.
 *
 * Why its own kernel: the reader adds n_chunks partial sums per element (6-7 for the 27B shape's
 * residual matrices, 140 KB from L2 a row), and one row is one block on one SM, so the row's loads
 * must be in flight together. rms_rows_kernel's 256 threads would each read up to 8 quads' chunks
 * quad after quad, a chain of L2 round trips (measured in docs/perf.md, twenty-first pass). Here
 * RMS_SUMS_THREADS threads own RMS_SUMS_QUADS quads each (quad q: thread q % RMS_SUMS_THREADS) and
 * issue the loads of RMS_SUMS_LOADS chunks of both quads at once (mm_sums_load_n), so a 7-chunk row
 * of 5120 takes two rounds of L2 loads.
 *
 * The arithmetic is rms_rows_kernel's: delta = the chunks added in chunk order (mm_sums_add, the
 * matmul finish's additions), x += delta, then the x values go through shared memory so that threads
 * 0 .. RMS_THREADS - 1 take the squares in the 256-lane order of the section header (lane l: quads
 * l, l + 256, ... ascending), and rms_group_total combines them; y is written by each quad's owner
 * after the barrier (y == x in place stays safe). */
#define RMS_SUMS_THREADS 768 /* x 2 quads: rows up to 6144 floats, no spills at sm_90 (1024 threads with 4 loads
                                in flight spill at their 64-register cap) */
#define RMS_SUMS_QUADS 2
#define RMS_SUMS_LOADS 4
#define RMS_SUMS_MAX_WIDTH (RMS_SUMS_THREADS * RMS_SUMS_QUADS * 4)
static_assert(RMS_SUMS_THREADS >= RMS_THREADS && RMS_SUMS_THREADS % SPECLA_WARP == 0, "the 256-lane order needs the lanes");
static __global__ void __launch_bounds__(RMS_SUMS_THREADS)
    add_rms_sums_kernel(float *x, float *delta, const float *weight, int n, float eps, float *y, cuda_matmul_sums dsums,
                        cuda_matmul_q8k q) {
    grid_begin();
    __shared__ float4 xs[RMS_SUMS_THREADS * RMS_SUMS_QUADS];
    __shared__ float partials[RMS_SUMS_THREADS / SPECLA_WARP]; /* rms_group_total reads the first RMS_WARPS */
    const int row = blockIdx.x;
    const int64_t off = (int64_t)row * n;
    x += off;
    y += off;
    delta += off;
    const int n_quads = n / 4;

    float4 xv[RMS_SUMS_QUADS], dv[RMS_SUMS_QUADS], wv[RMS_SUMS_QUADS];
    int64_t elements[RMS_SUMS_QUADS];
    bool mine[RMS_SUMS_QUADS];
#pragma unroll
    for (int k = 0; k < RMS_SUMS_QUADS; k++) {
        const int q = threadIdx.x + k * RMS_SUMS_THREADS;
        elements[k] = 4 * q, mine[k] = q < n_quads;
        if (mine[k]) {
            xv[k] = load_quad(x, 4 * q, n, true);
            if (weight) wv[k] = load_quad(weight, 4 * q, n, true);
        }
    }
    mm_sums_load_n<float4, RMS_SUMS_QUADS, RMS_SUMS_LOADS>(dsums, row, elements, mine, dv);
#pragma unroll
    for (int k = 0; k < RMS_SUMS_QUADS; k++) {
        const int q = threadIdx.x + k * RMS_SUMS_THREADS;
        if (mine[k]) {
            store_quad(delta, 4 * q, n, true, dv[k]);
            xv[k] = add_quad(xv[k], dv[k]);
            store_quad(x, 4 * q, n, true, xv[k]);
            xs[q] = xv[k];
        }
    }
    __syncthreads();
    float s = 0.0f;
    if (threadIdx.x < RMS_THREADS)
        for (int q = threadIdx.x; q < n_quads; q += RMS_THREADS) s = add_squares(s, xs[q]);
    const float sum = rms_group_total<RMS_THREADS>(s, partials);
    const float scale = rms_scale(sum, n, eps);
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int k = 0; k < RMS_SUMS_QUADS; k++) {
        const int e = threadIdx.x + k * RMS_SUMS_THREADS;
        if (mine[k]) {
            const float4 yv = scaled_quad(xv[k], scale, weight, weight ? wv[k] : zero, false, zero);
            store_quad(y, 4 * e, n, true, yv);
            if (q.codes) xs[e] = yv; /* every read of xs came before rms_group_total's barrier */
        }
    }
    if (!q.codes) return;
    /* the fused quantize (n a multiple of 256): warp w takes the row's blocks w, w + warps, ... */
    __syncthreads();
    const int lane = threadIdx.x % SPECLA_WARP;
    for (int k = threadIdx.x / SPECLA_WARP; k < n / 256; k += RMS_SUMS_THREADS / SPECLA_WARP) {
        mm_warp_quantize_q8k_block(q, xs[64 * k + 2 * lane], xs[64 * k + 2 * lane + 1], (int64_t)row * (n / 256) + k,
                                   lane);
    }
}

/* gated_rms_norm on rows of GATED_Q8K_WIDTH floats (a GDN head's S = 128) whose output ssm_out reads
 * next, with its Q8_K blocks (the fused quantize, matmul_quantize.cuh): a warp per two rows, one
 * 256-block, lane l holding elements 8l .. 8l + 7 of it (row 2 blk for l < 16, 2 blk + 1 above). The
 * arithmetic is rms_rows_kernel's for a 32-lane group: each quad's squares from 0, then the xor
 * butterfly over the row's 32 quads. Lane j of a row's half-warp holds quads 2j and 2j + 1, so the
 * butterfly's steps 16, 8, 4, 2 are lane steps 8, 4, 2, 1 within the half-warp and its step 1 adds the
 * lane's two quads: the same additions of the same values, the same bits. x is 16-byte aligned, the
 * rows are whole blocks (n_rows * 128 a multiple of 256). */
#define GATED_Q8K_WIDTH 128
static __global__ void __launch_bounds__(RMS_THREADS) gated_rms_q8k_kernel(float *x, const float *weight,
                                                                          const float *gate, int64_t n_blocks,
                                                                          float eps, cuda_matmul_q8k q) {
    grid_begin();
    const int lane = threadIdx.x % SPECLA_WARP, j = lane % 16;
    const int64_t blk = ((int64_t)blockIdx.x * RMS_THREADS + threadIdx.x) / SPECLA_WARP;
    if (blk >= n_blocks) return; /* whole warps leave */
    float *xr = x + blk * 256 + 8 * lane;
    const float *gr = gate + blk * 256 + 8 * lane;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float4 x0 = *(const float4 *)xr, x1 = *(const float4 *)(xr + 4);
    const float4 g0 = *(const float4 *)gr, g1 = *(const float4 *)(gr + 4);
    const float4 w0 = weight ? *(const float4 *)(weight + 8 * j) : zero;
    const float4 w1 = weight ? *(const float4 *)(weight + 8 * j + 4) : zero;
    float even = add_squares(0.0f, x0), odd = add_squares(0.0f, x1);
    for (int m = 8; m > 0; m >>= 1) {
        even = __fadd_rn(even, SPECLA_SHFL_XOR(even, m));
        odd = __fadd_rn(odd, SPECLA_SHFL_XOR(odd, m));
    }
    const float sum = __fadd_rn(even, odd);
    const float scale = rms_scale(sum, GATED_Q8K_WIDTH, eps);
    const float4 y0 = scaled_quad(x0, scale, weight, w0, true, g0), y1 = scaled_quad(x1, scale, weight, w1, true, g1);
    *(float4 *)xr = y0, *(float4 *)(xr + 4) = y1;
    mm_warp_quantize_q8k_block(q, y0, y1, blk, lane);
}
static bool gated_rms_in_blocks(const float *x, const float *weight, const float *gate, int n_rows, int n) {
    return n == GATED_Q8K_WIDTH && n_rows > 0 && ((int64_t)n_rows * n) % 256 == 0 && cuda_aligned16(x) &&
           cuda_aligned16(weight) && cuda_aligned16(gate);
}

/* How add_rms_norm reads delta as partial sums, the one decision behind both
 * cuda_add_rms_norm_reads_sums and cuda_add_rms_norm_sums: rows of the 32-lane norm in
 * rms_rows_kernel's SUMS form, wider 16-byte aligned rows up to RMS_SUMS_MAX_WIDTH in
 * add_rms_sums_kernel, no other rows (their matmul keeps its finish). */
enum rms_sums_path { RMS_SUMS_NONE, RMS_SUMS_WARP, RMS_SUMS_WIDE };
static rms_sums_path rms_sums_path_for(const float *x, const float *delta, const float *weight, const float *y, int n) {
    if (n <= 0) return RMS_SUMS_NONE;
    if (n <= RMS_WARP_MAX_WIDTH) return RMS_SUMS_WARP;
    const bool wide = n <= RMS_SUMS_MAX_WIDTH && n % 4 == 0 && cuda_aligned16(x) && cuda_aligned16(delta) &&
                      cuda_aligned16(weight) && cuda_aligned16(y);
    return wide ? RMS_SUMS_WIDE : RMS_SUMS_NONE;
}
static __global__ void nan_fill_kernel(float *y, int64_t n) {
    grid_begin();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __int_as_float(0x7fc00000);
}

template <bool ADD, bool GATED, bool SUMS = false>
static void launch_rms_rows(const backend *be, const char *op, float *x, const float *delta, const float *weight,
                            const float *gate, int n_rows, int n, float eps, float *y,
                            cuda_matmul_sums dsums = cuda_matmul_sums{}) {
    if (n_rows <= 0 || n <= 0) return;
    const bool vec = n % 4 == 0 && cuda_aligned16(x) && cuda_aligned16(delta) && cuda_aligned16(weight) &&
                     cuda_aligned16(gate) && cuda_aligned16(y);
    if (n <= RMS_WARP_MAX_WIDTH) {
        const int rows_per_block = RMS_THREADS / SPECLA_WARP;
        cuda_launch(rms_rows_kernel<SPECLA_WARP, ADD, GATED, SUMS>, dim3((n_rows + rows_per_block - 1) / rows_per_block),
                    dim3(RMS_THREADS), 0, cuda_stream(be), x, delta, weight, gate, n_rows, n, eps, y, vec, dsums);
    } else if constexpr (!SUMS) { /* SUMS comes here only for rows of the 32-lane norm (rms_sums_path_for) */
        cuda_launch(rms_rows_kernel<RMS_THREADS, ADD, GATED>, dim3(n_rows), dim3(RMS_THREADS), 0, cuda_stream(be), x,
                    delta, weight, gate, n_rows, n, eps, y, vec, dsums);
    }
    cuda_note_launch(be, op);
}

extern "C" void cuda_rms_norm(const backend *be, const float *x, const float *weight, int n_rows, int n, float eps,
                              float *y) {
    /* without ADD the kernel only reads x: the const is cast away for the shared signature */
    launch_rms_rows<false, false>(be, "rms_norm", const_cast<float *>(x), NULL, weight, NULL, n_rows, n, eps, y);
}

extern "C" void cuda_add_rms_norm(const backend *be, float *x, const float *delta, const float *weight, int n_rows,
                                  int n, float eps, float *y) {
    launch_rms_rows<true, false>(be, "add_rms_norm", x, delta, weight, NULL, n_rows, n, eps, y);
}

extern "C" int cuda_add_rms_norm_sums(const backend *be, float *x, float *delta, cuda_matmul_sums dsums,
                                      const float *weight, int n_rows, int n, float eps, float *y, cuda_matmul_q8k q) {
    if (n_rows <= 0 || n <= 0) return 0;
    if (!dsums.partials) {
        launch_rms_rows<true, false>(be, "add_rms_norm", x, delta, weight, NULL, n_rows, n, eps, y);
        return 0;
    }
    switch (rms_sums_path_for(x, delta, weight, y, n)) {
    case RMS_SUMS_WARP:
        launch_rms_rows<true, false, true>(be, "add_rms_norm", x, delta, weight, NULL, n_rows, n, eps, y, dsums);
        return 0;
    case RMS_SUMS_WIDE: {
        const cuda_matmul_q8k blocks = n % 256 == 0 ? q : cuda_matmul_q8k{}; /* whole blocks a row only */
        cuda_launch(add_rms_sums_kernel, dim3(n_rows), dim3(RMS_SUMS_THREADS), 0, cuda_stream(be), x, delta, weight, n,
                    eps, y, dsums, blocks);
        cuda_note_launch(be, "add_rms_norm");
        return blocks.codes != nullptr;
    }
    case RMS_SUMS_NONE: /* the caller did not ask cuda_add_rms_norm_reads_sums: NaN, never a wrong row */
        cuda_launch(nan_fill_kernel, dim3(grid_for((int64_t)n_rows * n, EW_THREADS)), dim3(EW_THREADS), 0,
                    cuda_stream(be), y, (int64_t)n_rows * n);
        cuda_note_launch(be, "add_rms_norm");
        return 0;
    }
    return 0;
}

extern "C" int cuda_add_rms_norm_reads_sums(const float *x, const float *delta, const float *weight, const float *y,
                                            int n) {
    return rms_sums_path_for(x, delta, weight, y, n) != RMS_SUMS_NONE;
}

extern "C" int cuda_gated_rms_norm(const backend *be, float *x, const float *weight, const float *gate, int n_rows,
                                   int n, float eps, cuda_matmul_q8k q) {
    if (q.codes && gated_rms_in_blocks(x, weight, gate, n_rows, n)) {
        const int64_t n_blocks = (int64_t)n_rows * n / 256, warps_per_block = RMS_THREADS / SPECLA_WARP;
        cuda_launch(gated_rms_q8k_kernel, dim3((unsigned)((n_blocks + warps_per_block - 1) / warps_per_block)),
                    dim3(RMS_THREADS), 0, cuda_stream(be), x, weight, gate, n_blocks, eps, q);
        cuda_note_launch(be, "gated_rms_norm");
        return 1;
    }
    launch_rms_rows<false, true>(be, "gated_rms_norm", x, NULL, weight, gate, n_rows, n, eps, x);
    return 0;
}

extern "C" void cuda_l2_norm(const backend *be, const float *x, int n_rows, int n, float eps, float *y) {
    if (n_rows <= 0 || n <= 0) return;
    cuda_launch(l2_norm_kernel, dim3(n_rows), dim3(NORM_THREADS), 0, cuda_stream(be), x, n, eps, y);
    cuda_note_launch(be, "l2_norm");
}

/* Block (part, t): parts 0 .. Hk-1 normalise q heads, Hk .. 2Hk-1 the k heads, each later part
 * copies one slice of NORM_THREADS floats of v, one float per thread (a single block looping over
 * all of v serialised Hv * S / NORM_THREADS load round trips). */
static __global__ void __launch_bounds__(NORM_THREADS) gdn_split_qkv_kernel(const float *conv_out, int Hk, int Hv,
                                                                            int S, float eps, float *q, float *k,
                                                                            float *v) {
    grid_begin();
    __shared__ float partials[NORM_THREADS / SPECLA_WARP];
    const int part = blockIdx.x, t = blockIdx.y;
    const int64_t qk_width = (int64_t)Hk * S, v_width = (int64_t)Hv * S;
    const float *row = conv_out + (int64_t)t * (2 * qk_width + v_width);
    if (part < 2 * Hk) {
        const int is_k = part >= Hk, head = part % Hk;
        float *dst = (is_k ? k : q) + t * qk_width + (int64_t)head * S;
        l2_row(row + (is_k ? qk_width : 0) + (int64_t)head * S, S, eps, dst, partials);
    } else {
        const int64_t i = (int64_t)(part - 2 * Hk) * NORM_THREADS + threadIdx.x;
        if (i < v_width) v[t * v_width + i] = row[2 * qk_width + i];
    }
}

extern "C" void cuda_gdn_split_qkv(const backend *be, const float *conv_out, int T, int Hk, int Hv, int S, float eps,
                                   float *q, float *k, float *v) {
    if (T <= 0) return;
    const int v_parts = (int)(((int64_t)Hv * S + NORM_THREADS - 1) / NORM_THREADS);
    cuda_launch(gdn_split_qkv_kernel, dim3(2 * Hk + v_parts, T), dim3(NORM_THREADS), 0, cuda_stream(be), conv_out, Hk,
                Hv, S, eps, q, k, v);
    cuda_note_launch(be, "gdn_split_qkv");
}

/* ---- element-wise -------------------------------------------------------------------------------- */

#define GRID_STRIDE(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

static __global__ void add_kernel(float *dst, const float *src, int64_t n) {
    grid_begin();
    GRID_STRIDE(i, n) dst[i] = __fadd_rn(dst[i], src[i]);
}
static __global__ void add_bias_rows_kernel(float *x, const float *bias, int64_t total, int n) {
    grid_begin();
    GRID_STRIDE(i, total) x[i] = __fadd_rn(x[i], bias[i % n]);
}
static __global__ void silu_mul_kernel(float *a, const float *b, int64_t n) {
    grid_begin();
    GRID_STRIDE(i, n) a[i] = __fmul_rn(silu_dev(a[i]), b[i]);
}
/* silu_mul on two matmul outputs of `width` rows per token, either left as partial sums (sa / sb,
 * partials NULL: read the output itself): a = silu(a) * b, and b's finished values stored to b */
static __global__ void silu_mul_sums_kernel(float *a, float *b, cuda_matmul_sums sa, cuda_matmul_sums sb, int64_t n,
                                            int width) {
    grid_begin();
    GRID_STRIDE(i, n) {
        const int64_t t = i / width, r = i % width;
        const float av = sa.partials ? mm_sums_load<float>(sa, t, r) : a[i];
        const float bv = sb.partials ? mm_sums_load<float>(sb, t, r) : b[i];
        if (sb.partials) b[i] = bv;
        a[i] = __fmul_rn(silu_dev(av), bv);
    }
}
/* silu_mul_sums_kernel for rows whose width is a multiple of 256 (the FFN's 17408) with a and b
 * 16-byte aligned: a warp per 256 elements of a row, lane l elements 8l .. 8l + 7 as two quads, the
 * loads of both quads' chunks issued before their adds (the same additions in the same order: the
 * same bits), and no 64-bit division per element. q.codes non-NULL: the warp also quantizes its
 * 256 results into q (the fused quantize, matmul_quantize.cuh). */
static __global__ void __launch_bounds__(EW_THREADS) silu_mul_blocks_kernel(float *a, float *b, cuda_matmul_sums sa,
                                                                            cuda_matmul_sums sb, int n_rows,
                                                                            int width, cuda_matmul_q8k q) {
    grid_begin();
    const int lane = threadIdx.x % SPECLA_WARP;
    const int per_row = width / 256;
    const int64_t blk = ((int64_t)blockIdx.x * EW_THREADS + threadIdx.x) / SPECLA_WARP;
    if (blk >= (int64_t)n_rows * per_row) return; /* whole warps leave */
    const int64_t t = blk / per_row;
    const int k = (int)(blk % per_row);
    const int64_t r = (int64_t)k * 256 + 8 * lane, rows[2] = {r, r + 4};
    const bool use[2] = {true, true};
    float *ar = a + t * width + r, *br = b + t * width + r;
    float4 av[2], bv[2];
    if (sa.partials)
        mm_sums_load_n<float4, 2, MM_SUMS_LOADS / 2>(sa, t, rows, use, av);
    else
        av[0] = *(const float4 *)ar, av[1] = *(const float4 *)(ar + 4);
    if (sb.partials) {
        mm_sums_load_n<float4, 2, MM_SUMS_LOADS / 2>(sb, t, rows, use, bv);
        *(float4 *)br = bv[0], *(float4 *)(br + 4) = bv[1];
    } else {
        bv[0] = *(const float4 *)br, bv[1] = *(const float4 *)(br + 4);
    }
    float as[8], bs[8], v[8];
    mm_eight_of(av[0], av[1], as);
    mm_eight_of(bv[0], bv[1], bs);
#pragma unroll
    for (int j = 0; j < 8; j++) v[j] = __fmul_rn(silu_dev(as[j]), bs[j]);
    *(float4 *)ar = make_float4(v[0], v[1], v[2], v[3]);
    *(float4 *)(ar + 4) = make_float4(v[4], v[5], v[6], v[7]);
    if (q.codes) mm_warp_quantize_q8k_block(q, v, blk, lane);
}
static bool silu_mul_in_blocks(const float *a, const float *b, int64_t n, int width) {
    return width > 0 && width % 256 == 0 && n % width == 0 && n / width <= INT32_MAX && cuda_aligned16(a) &&
           cuda_aligned16(b);
}
static __global__ void sigmoid_mul_kernel(float *x, const float *gate, int64_t n) {
    grid_begin();
    GRID_STRIDE(i, n) x[i] = __fmul_rn(x[i], sigmoid_dev(gate[i]));
}
/* sigmoid_mul on a whole number of 256-blocks whose output a matmul reads next, with their Q8_K
 * blocks (the fused quantize): a warp per block, lane l elements 8l .. 8l + 7; sigmoid_mul_kernel's
 * arithmetic. x and gate 16-byte aligned. */
static __global__ void __launch_bounds__(EW_THREADS) sigmoid_mul_q8k_kernel(float *x, const float *gate,
                                                                           int64_t n_blocks, cuda_matmul_q8k q) {
    grid_begin();
    const int lane = threadIdx.x % SPECLA_WARP;
    const int64_t blk = ((int64_t)blockIdx.x * EW_THREADS + threadIdx.x) / SPECLA_WARP;
    if (blk >= n_blocks) return; /* whole warps leave */
    float *xr = x + blk * 256 + 8 * lane;
    const float *gr = gate + blk * 256 + 8 * lane;
    const float4 x0 = *(const float4 *)xr, x1 = *(const float4 *)(xr + 4);
    const float4 g0 = *(const float4 *)gr, g1 = *(const float4 *)(gr + 4);
    float xs[8], gs[8], v[8];
    mm_eight_of(x0, x1, xs);
    mm_eight_of(g0, g1, gs);
#pragma unroll
    for (int i = 0; i < 8; i++) v[i] = __fmul_rn(xs[i], sigmoid_dev(gs[i]));
    *(float4 *)xr = make_float4(v[0], v[1], v[2], v[3]);
    *(float4 *)(xr + 4) = make_float4(v[4], v[5], v[6], v[7]);
    mm_warp_quantize_q8k_block(q, v, blk, lane);
}
static bool sigmoid_mul_in_blocks(const float *x, const float *gate, int64_t n) {
    return n > 0 && n % 256 == 0 && cuda_aligned16(x) && cuda_aligned16(gate);
}
static __global__ void gdn_gates_kernel(float *beta, float *g, const float *dt_bias, const float *ssm_a, int64_t total,
                                        int Hv) {
    grid_begin();
    GRID_STRIDE(i, total) {
        const int h = (int)(i % Hv);
        gdn_gate_values(&beta[i], &g[i], dt_bias[h], ssm_a[h]);
    }
}
/* qg[t][h] = [D query | D gate] -> q[t][h], gate[t][h] */
static __global__ void split_q_gate_kernel(const float *qg, int64_t total, int D, float *q, float *gate) {
    grid_begin();
    GRID_STRIDE(i, total) {
        const int64_t head = i / D, d = i % D;
        q[i] = qg[head * 2 * D + d];
        gate[i] = qg[head * 2 * D + D + d];
    }
}
static __global__ void scatter_rows_kernel(float *dst, int64_t dst_stride, const int32_t *rows, const float *src,
                                           int width) {
    grid_begin();
    const int t = blockIdx.y;
    float *d = dst + (int64_t)rows[t] * dst_stride;
    const float *s = src + (int64_t)t * width;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < width; c += gridDim.x * blockDim.x) d[c] = s[c];
}
/* One thread per column walks the moves in order: column c of every row is touched by this thread
 * only, so the moves happen exactly as the CPU's sequential memcpy loop does them. */
static __global__ void move_rows_kernel(float *buf, int64_t stride, int width, const int32_t *from, const int32_t *to,
                                        int n) {
    grid_begin();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= width) return;
    for (int i = 0; i < n; i++) {
        const int32_t f = from[i], t = to[i];
        if (f != t) buf[(int64_t)t * stride + c] = buf[(int64_t)f * stride + c];
    }
}

/* The fields of a gather, by value (a kernel parameter: no upload). */
typedef struct gather_fields {
    row_field field[GATHER_MAX_FIELDS];
} gather_fields;
#define GATHER_CHUNK (4 * EW_THREADS)

/* Work unit u = ((b * n_fields + f) * n + i) * chunks + chunk: block b, field f, destination row i,
 * floats [chunk * GATHER_CHUNK, (chunk + 1) * GATHER_CHUNK) of it. Destination rows never overlap
 * each other or a source row (backend.h), so the units run in any order. */
static __global__ void gather_rows_kernel(uint32_t *dst, int64_t dst_block, const uint32_t *src, int64_t src_block,
                                          gather_fields fields, int n_fields, const int32_t *rows, int n, int chunks,
                                          int64_t units) {
    grid_begin();
    for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
        const int chunk = (int)(u % chunks);
        int64_t rest = u / chunks;
        const int i = (int)(rest % n);
        rest /= n;
        const row_field field = fields.field[rest % n_fields];
        const int64_t b = rest / n_fields;
        const int64_t width = field.width;
        const int64_t e = (int64_t)chunk * GATHER_CHUNK + 4 * (int64_t)threadIdx.x;
        if (e >= width) continue;
        const uint32_t *s = src + b * src_block + field.src_offset + (int64_t)rows[i] * width + e;
        uint32_t *d = dst + b * dst_block + field.dst_offset + (int64_t)i * width + e;
        if (e + 4 <= width && (((uintptr_t)s | (uintptr_t)d) & 15) == 0) {
            *(uint4 *)d = *(const uint4 *)s;
        } else {
            const int m = width - e < 4 ? (int)(width - e) : 4;
            for (int j = 0; j < m; j++) d[j] = s[j];
        }
    }
}

#define LAUNCH_EW(kernel, n, name, ...)                                                           \
    do {                                                                                          \
        if ((n) <= 0) return;                                                                     \
        cuda_launch(kernel, dim3(grid_for((n), EW_THREADS)), dim3(EW_THREADS), 0, cuda_stream(be), __VA_ARGS__);       \
        cuda_note_launch(be, name);                                                               \
    } while (0)

extern "C" void cuda_add(const backend *be, float *dst, const float *src, int64_t n) {
    LAUNCH_EW(add_kernel, n, "add", dst, src, n);
}
extern "C" void cuda_add_bias_rows(const backend *be, float *x, const float *bias, int rows, int n) {
    const int64_t total = (int64_t)rows * n;
    LAUNCH_EW(add_bias_rows_kernel, total, "add_bias_rows", x, bias, total, n);
}
extern "C" void cuda_silu_mul(const backend *be, float *a, const float *b, int64_t n) {
    LAUNCH_EW(silu_mul_kernel, n, "silu_mul", a, b, n);
}
extern "C" int cuda_silu_mul_sums(const backend *be, float *a, float *b, cuda_matmul_sums sa, cuda_matmul_sums sb,
                                  int64_t n, int width, cuda_matmul_q8k q) {
    if (n <= 0) return 0;
    if (!silu_mul_in_blocks(a, b, n, width)) {
        cuda_launch(silu_mul_sums_kernel, dim3(grid_for(n, EW_THREADS)), dim3(EW_THREADS), 0, cuda_stream(be), a, b, sa,
                    sb, n, width);
        cuda_note_launch(be, "silu_mul");
        return 0;
    }
    const int n_rows = (int)(n / width);
    const int64_t threads = n / 8; /* a lane per 8 elements */
    cuda_launch(silu_mul_blocks_kernel, dim3((unsigned)((threads + EW_THREADS - 1) / EW_THREADS)), dim3(EW_THREADS), 0,
                cuda_stream(be), a, b, sa, sb, n_rows, width, q);
    cuda_note_launch(be, "silu_mul");
    return q.codes != nullptr;
}
extern "C" int cuda_sigmoid_mul(const backend *be, float *x, const float *gate, int64_t n, cuda_matmul_q8k q) {
    if (q.codes && sigmoid_mul_in_blocks(x, gate, n)) {
        const int64_t n_blocks = n / 256, warps_per_block = EW_THREADS / SPECLA_WARP;
        cuda_launch(sigmoid_mul_q8k_kernel, dim3((unsigned)((n_blocks + warps_per_block - 1) / warps_per_block)),
                    dim3(EW_THREADS), 0, cuda_stream(be), x, gate, n_blocks, q);
        cuda_note_launch(be, "sigmoid_mul");
        return 1;
    }
    if (n > 0) {
        cuda_launch(sigmoid_mul_kernel, dim3(grid_for(n, EW_THREADS)), dim3(EW_THREADS), 0, cuda_stream(be), x, gate, n);
        cuda_note_launch(be, "sigmoid_mul");
    }
    return 0;
}
extern "C" void cuda_gdn_gates(const backend *be, float *beta, float *g, const float *dt_bias, const float *ssm_a,
                               int T, int Hv) {
    const int64_t total = (int64_t)T * Hv;
    LAUNCH_EW(gdn_gates_kernel, total, "gdn_gates", beta, g, dt_bias, ssm_a, total, Hv);
}
extern "C" void cuda_split_q_gate(const backend *be, const float *qg, int T, int nh, int D, float *q, float *gate) {
    const int64_t total = (int64_t)T * nh * D;
    LAUNCH_EW(split_q_gate_kernel, total, "split_q_gate", qg, total, D, q, gate);
}

extern "C" void cuda_scatter_rows(const backend *be, float *dst, int64_t dst_stride, const int32_t *rows,
                                  const float *src, int T, int width) {
    if (T <= 0 || width <= 0) return;
    cuda_launch(scatter_rows_kernel, dim3(grid_for(width, EW_THREADS), T), dim3(EW_THREADS), 0, cuda_stream(be), dst,
                dst_stride, rows, src, width);
    cuda_note_launch(be, "scatter_rows");
}

extern "C" void cuda_move_rows(const backend *be, float *buf, int64_t stride, int width, const int32_t *from,
                               const int32_t *to, int n) {
    if (n <= 0 || width <= 0) return;
    cuda_launch(move_rows_kernel, dim3((width + EW_THREADS - 1) / EW_THREADS), dim3(EW_THREADS), 0, cuda_stream(be),
                buf, stride, width, from, to, n);
    cuda_note_launch(be, "move_rows");
}

extern "C" void cuda_gather_rows(const backend *be, float *dst, int64_t dst_block, const float *src, int64_t src_block,
                                 int n_blocks, const row_field *fields, int n_fields, const int32_t *rows, int n) {
    if (n <= 0 || n_blocks <= 0 || n_fields <= 0) return;
    gather_fields packed = {};
    int32_t widest = 0;
    for (int f = 0; f < n_fields && f < GATHER_MAX_FIELDS; f++) {
        packed.field[f] = fields[f];
        if (fields[f].width > widest) widest = fields[f].width;
    }
    if (n_fields > GATHER_MAX_FIELDS) n_fields = GATHER_MAX_FIELDS; /* backend.h: the caller keeps it <= */
    const int chunks = (widest + GATHER_CHUNK - 1) / GATHER_CHUNK;
    const int64_t units = (int64_t)n_blocks * n_fields * n * chunks;
    const unsigned grid = units > 65535 * 4 ? 65535 * 4 : (unsigned)units; /* units past the grid: its loop */
    cuda_launch(gather_rows_kernel, dim3(grid), dim3(EW_THREADS), 0, cuda_stream(be), (uint32_t *)dst, dst_block,
                (const uint32_t *)src, src_block, packed, n_fields, rows, n, chunks, units);
    cuda_note_launch(be, "gather_rows");
}
