/* Reading a matmul output that was left as its split-K partial sums (cuda_matmul_sums,
 * cuda_matmul_group_unfinished in cuda_matmul.h): the kernel that consumes the output adds the
 * chunks itself, in chunk order from the first, with the same rounded additions as the matmul's own
 * finish (mm_finish_rows), so it reads y's bits without the matmul's finish on the critical path.
 * The partial sums were written by the previous kernel on the stream: read them only after
 * grid_begin's wait, through L2 (other SMs wrote them). */
#ifndef SPECLA_CUDA_MATMUL_SUMS_CUH
#define SPECLA_CUDA_MATMUL_SUMS_CUH

#include "cuda_matmul.h"

#define MM_SUMS_LOADS 8 /* chunk loads in flight before their adds */

/* element (token b, row r) */
__device__ __forceinline__ float mm_sums_at(const cuda_matmul_sums &s, int64_t b, int64_t r) {
    const float *p = s.partials + b * s.n_chunks * s.rows_padded + r;
    float v = 0.0f;
    for (int c0 = 0; c0 < s.n_chunks; c0 += MM_SUMS_LOADS) {
        float u[MM_SUMS_LOADS];
#pragma unroll
        for (int j = 0; j < MM_SUMS_LOADS; j++)
            if (c0 + j < s.n_chunks) u[j] = __ldcg(p + (c0 + j) * s.rows_padded);
#pragma unroll
        for (int j = 0; j < MM_SUMS_LOADS; j++)
            if (c0 + j < s.n_chunks) v = c0 + j == 0 ? u[j] : __fadd_rn(v, u[j]);
    }
    return v;
}

/* rows r .. r + 3 of token b, r a multiple of 4 (rows_padded is a multiple of 32 and the partial
 * sums are 16-byte aligned: one 16-byte load per chunk) */
__device__ __forceinline__ float4 mm_sums_quad(const cuda_matmul_sums &s, int64_t b, int64_t r) {
    const float *p = s.partials + b * s.n_chunks * s.rows_padded + r;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int c0 = 0; c0 < s.n_chunks; c0 += MM_SUMS_LOADS) {
        float4 u[MM_SUMS_LOADS];
#pragma unroll
        for (int j = 0; j < MM_SUMS_LOADS; j++)
            if (c0 + j < s.n_chunks) u[j] = __ldcg(reinterpret_cast<const float4 *>(p + (c0 + j) * s.rows_padded));
#pragma unroll
        for (int j = 0; j < MM_SUMS_LOADS; j++)
            if (c0 + j < s.n_chunks)
                v = c0 + j == 0 ? u[j]
                                : make_float4(__fadd_rn(v.x, u[j].x), __fadd_rn(v.y, u[j].y), __fadd_rn(v.z, u[j].z),
                                              __fadd_rn(v.w, u[j].w));
    }
    return v;
}

#endif
