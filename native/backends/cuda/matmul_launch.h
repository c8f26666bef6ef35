/* What a matmul launch carries (one launch serves up to CUDA_MATMUL_GROUP_LAUNCH matrices of one
 * type), the compile-time facts of each weight type, and the partial-sum store: shared by the
 * kernels of matmul.cu and matmul_mma.cuh and by the host emulation of the tensor-core kernel in
 * tools/cuda_matmul_check.cu. */
#ifndef SPECLA_CUDA_MATMUL_LAUNCH_H
#define SPECLA_CUDA_MATMUL_LAUNCH_H

#include "cuda_matmul.h"
#include "launch.h"
#include "matmul_blocks.h"

#define MM_FULL_MASK 0xffffffffu
/* activation terms of the F16/BF16 tensor-core path (matmul_float_tc.cuh): 2 for F16, 3 for BF16 */
#define MM_FTC_MAX_TERMS 3

typedef struct mm_mat_args {
    const uint8_t *w; /* prepared weight */
    float *y;
    float *partials;  /* [n_batch][n_chunks][row_groups * 32] when n_chunks > 1 */
    unsigned *counters;
    int ne1, n_blocks, row_groups, chunk_blocks, n_chunks, unit_begin;
    int cta_begin; /* the staged tensor-core kernel's first CTA of this matrix (mm_tile_ctas each) */
    int unfinished; /* 1: no split-K finish, the partial sums are the output (cuda_matmul_group_unfinished) */
} mm_mat_args;

typedef struct mm_launch_args {
    mm_mat_args mat[CUDA_MATMUL_GROUP_LAUNCH];
    int n_mats, n_units, n_batch;
    int n_ctas; /* the staged tensor-core kernel's grid: the sum of the matrices' mm_tile_ctas */
    int64_t n;
    mm_acts act;
} mm_launch_args;

/* Compile-time facts of a type: 16-byte pieces per block, bytes per block, blocks per load group
 * (enough 16-byte loads per lane in flight for the small block types). */
template <int TYPE> struct mm_traits {
    static constexpr int pieces = TYPE == SPECLA_TYPE_Q6_K ? 13
                                  : TYPE == SPECLA_TYPE_Q5_K ? 11
                                  : TYPE == SPECLA_TYPE_Q4_K ? 9
                                  : TYPE == SPECLA_TYPE_F32  ? 8
                                  : TYPE == SPECLA_TYPE_F16 || TYPE == SPECLA_TYPE_BF16 ? 4
                                  : TYPE == SPECLA_TYPE_Q8_0 ? 2
                                                             : 1;
    static constexpr int unit_bytes = TYPE == SPECLA_TYPE_F32 ? 128
                                      : TYPE == SPECLA_TYPE_F16 || TYPE == SPECLA_TYPE_BF16 ? 64
                                      : TYPE == SPECLA_TYPE_Q8_0 ? 34
                                      : TYPE == SPECLA_TYPE_Q4_0 ? 18
                                      : TYPE == SPECLA_TYPE_Q5_0 ? 22
                                      : TYPE == SPECLA_TYPE_Q4_K ? 144
                                      : TYPE == SPECLA_TYPE_Q5_K ? 176
                                                                 : 210;
    static constexpr int load_group = TYPE == SPECLA_TYPE_Q4_0 || TYPE == SPECLA_TYPE_Q5_0 ? 8
                                      : TYPE == SPECLA_TYPE_Q8_0                           ? 4
                                      : TYPE == SPECLA_TYPE_F16 || TYPE == SPECLA_TYPE_BF16 ? 2
                                                                                            : 1;
    /* CTAs of 4 warps per SM the dp4a kernel's register budget is sized for: 3 (168 registers)
     * keeps 12 warps per SM for one token without spills; Q6_K's 13-piece blocks need the full 255
     * (2 CTAs, 8 warps), and so do several tokens per pass (the fallback of the tensor-core path).
     * (More CTAs without the prefetch, branch decode-occupancy, measured within noise: perf.md.) */
    static constexpr int min_blocks(int nt) { return TYPE == SPECLA_TYPE_Q6_K || nt > 1 ? 1 : 3; }
    static constexpr bool int8 = TYPE != SPECLA_TYPE_F32 && TYPE != SPECLA_TYPE_F16 && TYPE != SPECLA_TYPE_BF16;
    static constexpr int has_d = TYPE == SPECLA_TYPE_Q8_0 || TYPE == SPECLA_TYPE_Q4_0 || TYPE == SPECLA_TYPE_Q5_0 ||
                                 TYPE == SPECLA_TYPE_Q6_K;
};

/* The chunk partial sum `v` of (row, token b): y itself when the row is one chunk, else the
 * workspace (read back by mm_finish_unit). */
MM_HD void mm_store(const mm_mat_args &M, int c, int row, int b, float v) {
    if (M.n_chunks == 1) {
        if (row < M.ne1) M.y[(int64_t)b * M.ne1 + row] = v;
    } else {
        float *p = M.partials + ((int64_t)b * M.n_chunks + c) * (M.row_groups * MM_GROUP_ROWS) + row;
#if MM_DEVICE_CODE
        __stcg(p, v); /* to L2: another SM's warp adds the partials */
#else
        *p = v;
#endif
    }
}

/* The split-K finish of rows [row0, row0 + nrows) for every token: each output is its chunks' partial
 * sums added in chunk order, p_0, then + p_1, ... (point 4 of matmul.cu), so the bits do not depend
 * on how the work is shared. `nthreads` threads share it (thread `tid`): nrows / 4 of them cover the
 * rows 4 at a time with 16-byte reads of the workspace (rows_padded is a multiple of 32, so a quad
 * never crosses a token's rows), the other factor of nthreads / (nrows / 4) splits the tokens. Each
 * thread keeps LOADS reads in flight across its tokens and chunks together, all asked for before any
 * is added. A finish is the last work of its launch and its reads are round trips to L2, so its
 * time is its reads in flight: with 4 bytes per lane and one token at a time it was the longest
 * part of the small matrices' launches (docs/perf.md, tenth pass). Rows at or past ne1 are neither
 * read nor written. */
MM_HD float4 mm_ld_partial4(const float *p) {
#if MM_DEVICE_CODE
    return __ldcg((const float4 *)p); /* L2: other SMs' warps wrote them */
#else
    float4 v;
    memcpy(&v, p, 16);
    return v;
#endif
}
template <int LOADS>
MM_HD void mm_finish_rows(const mm_mat_args &M, int row0, int nrows, int n_batch, int tid, int nthreads) {
    const int quads = nrows / 4, lanes = nthreads / quads;
    const int q = tid % quads, first = tid / quads;
    const int row = row0 + 4 * q;
    if (first >= lanes || first >= n_batch || row >= M.ne1) return;
    const int n_chunks = M.n_chunks;
    const int64_t rows_padded = (int64_t)M.row_groups * MM_GROUP_ROWS;
    const int total = (n_batch - first + lanes - 1) / lanes * n_chunks; /* (token, chunk) pairs, token-major */
    int lb = first, lc = 0;                                             /* the next read's token and chunk */
    int sb = first, sc = 0;                                             /* the next add's */
    float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int i0 = 0; i0 < total; i0 += LOADS) {
        float4 v[LOADS];
#pragma unroll
        for (int j = 0; j < LOADS; j++)
            if (i0 + j < total) {
                v[j] = mm_ld_partial4(M.partials + ((int64_t)lb * n_chunks + lc) * rows_padded + row);
                if (++lc == n_chunks) lc = 0, lb += lanes;
            }
#pragma unroll
        for (int j = 0; j < LOADS; j++) /* guarded, not left by break: hipcc then unrolls it too */
            if (i0 + j < total) {
                if (sc == 0) s = v[j];
                else s.x = mm_add(s.x, v[j].x), s.y = mm_add(s.y, v[j].y), s.z = mm_add(s.z, v[j].z), s.w = mm_add(s.w, v[j].w);
                if (++sc == n_chunks) {
                    float *y = M.y + (int64_t)sb * M.ne1 + row;
                    y[0] = s.x;
                    if (row + 1 < M.ne1) y[1] = s.y;
                    if (row + 2 < M.ne1) y[2] = s.z;
                    if (row + 3 < M.ne1) y[3] = s.w;
                    sc = 0, sb += lanes;
                }
            }
    }
}

/* Programmatic dependent launch (launch.h): the matmul kernels wait for the previous kernel only
 * after loading their first constant weights, so these are the host-compilable forms of launch.h's
 * device instructions (no-ops in the host model of tools/cuda_matmul_check.cu). Nothing written by an
 * earlier kernel (activations, counters, partials, y) may be touched before mm_wait_prior_grid. */
MM_HD void mm_wait_prior_grid(void) {
#if MM_DEVICE_CODE
    grid_wait_prior();
#endif
}
MM_HD void mm_allow_dependents(void) {
#if MM_DEVICE_CODE
    grid_allow_dependents();
#endif
}

/* Launch timelines, in a -DMM_TRACE build only (tools/cuda_matmul_check.cu --trace): per warp unit of
 * the per-warp kernels, or per CTA of the staged kernel, the SM it ran on and four %globaltimer
 * readings (ns): its start, past its wait for the previous kernel, its main loop done (partial sums
 * stored), its split-K finish done. cuda_matmul_set_trace (matmul.cu) points its kernels at a record
 * array; the default build compiles none of this. */
typedef struct mm_trace_record {
    unsigned sm, pad;
    unsigned long long t[4];
} mm_trace_record;
#define MM_TRACE_START 0
#define MM_TRACE_WAITED 1
#define MM_TRACE_LOOP_DONE 2
#define MM_TRACE_END 3
#if defined(MM_TRACE) && (defined(__CUDACC__) || defined(__HIPCC__))
/* each translation unit's own (no separate device linking); matmul.cu's kernels read matmul.cu's */
static __device__ mm_trace_record *mm_trace_records;
static __device__ int mm_trace_capacity;
#endif
#if defined(MM_TRACE) && MM_DEVICE_CODE
MM_HD void mm_trace(int index, int at) {
    if (!mm_trace_records || index < 0 || index >= mm_trace_capacity) return;
    unsigned long long t;
    unsigned sm;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    mm_trace_records[index].t[at] = t;
    mm_trace_records[index].sm = sm;
}
#else
MM_HD void mm_trace(int index, int at) { (void)index, (void)at; }
#endif

/* The matrix of a group launch that unit u belongs to (selects, no indexed parameter access). */
MM_HD mm_mat_args mm_select_mat(const mm_launch_args &args, int u) {
    mm_mat_args M = args.mat[0];
#pragma unroll
    for (int i = 1; i < CUDA_MATMUL_GROUP_LAUNCH; i++)
        if (i < args.n_mats && u >= args.mat[i].unit_begin) M = args.mat[i];
    return M;
}

/* Where warp unit u of a launch works (the per-warp kernels: mm_kernel, mm_mma_kernel, mm_ftc_kernel):
 * its matrix, row group rg, chunk c, the chunk's blocks [k_begin, k_end) and the row group's first
 * weight slot. */
typedef struct mm_unit_place {
    mm_mat_args M;
    int rg, c, k_begin, k_end;
    const uint8_t *group_base;
} mm_unit_place;
template <int TYPE> MM_HD mm_unit_place mm_unit_of(const mm_launch_args &args, int u) {
    mm_unit_place p;
    p.M = mm_select_mat(args, u);
    const int local = u - p.M.unit_begin;
    p.rg = local / p.M.n_chunks, p.c = local % p.M.n_chunks;
    p.k_begin = p.c * p.M.chunk_blocks;
    p.k_end = p.M.n_blocks < p.k_begin + p.M.chunk_blocks ? p.M.n_blocks : p.k_begin + p.M.chunk_blocks;
    p.group_base = p.M.w + mm_slot_offset(TYPE, p.M.n_blocks, p.rg, 0);
    return p;
}

/* The unit that warp w of a launch runs when a matrix's warps go chunk by chunk: consecutive warps
 * take consecutive row groups of one chunk (u itself orders them row group by row group), so the
 * warps of a CTA read the same activation blocks. A permutation of the units within each matrix:
 * every unit computes what it computes in either order. */
MM_HD int mm_unit_chunk_major(const mm_launch_args &args, int w) {
    const mm_mat_args M = mm_select_mat(args, w);
    const int local = w - M.unit_begin;
    return M.unit_begin + (local % M.row_groups) * M.n_chunks + local / M.row_groups;
}

/* The staged tensor-core kernel (matmul_tile.cuh) runs a CTA per (pair of row groups, chunk): CTA
 * `local` of a matrix takes row groups 2 (local / n_chunks) and 2 (local / n_chunks) + 1, chunk
 * local % n_chunks. */
MM_HD int mm_tile_ctas(int row_groups, int n_chunks) { return (row_groups + 1) / 2 * n_chunks; }

/* The matrix of a group launch that CTA `cta` of the staged tensor-core kernel belongs to. */
MM_HD mm_mat_args mm_select_mat_cta(const mm_launch_args &args, int cta) {
    mm_mat_args M = args.mat[0];
#pragma unroll
    for (int i = 1; i < CUDA_MATMUL_GROUP_LAUNCH; i++)
        if (i < args.n_mats && cta >= args.mat[i].cta_begin) M = args.mat[i];
    return M;
}

#endif
