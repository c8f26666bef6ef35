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

__device__ __forceinline__ float mm_sums_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float4 mm_sums_add(float4 a, float4 b) {
    return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z), __fadd_rn(a.w, b.w));
}

/* v[k] = element r[k] of token b's output for each k < N with use[k] (the others are left as they
 * are), the chunks added in chunk order from the first; the loads of LOADS chunks of all N elements
 * are issued before their adds. T = float: element (b, r); T = float4: rows r .. r + 3, r a multiple
 * of 4 (rows_padded is a multiple of 32 and the partial sums are 16-byte aligned: one 16-byte load
 * per chunk). */
template <class T, int N, int LOADS>
__device__ __forceinline__ void mm_sums_load_n(const cuda_matmul_sums &s, int64_t b, const int64_t (&r)[N],
                                               const bool (&use)[N], T (&v)[N]) {
    const float *p = s.partials + b * s.n_chunks * s.rows_padded;
    for (int c0 = 0; c0 < s.n_chunks; c0 += LOADS) {
        T u[N][LOADS];
#pragma unroll
        for (int k = 0; k < N; k++)
#pragma unroll
            for (int j = 0; j < LOADS; j++)
                if (use[k] && c0 + j < s.n_chunks)
                    u[k][j] = __ldcg(reinterpret_cast<const T *>(p + r[k] + (c0 + j) * s.rows_padded));
#pragma unroll
        for (int k = 0; k < N; k++)
#pragma unroll
            for (int j = 0; j < LOADS; j++)
                if (use[k] && c0 + j < s.n_chunks) v[k] = c0 + j == 0 ? u[k][j] : mm_sums_add(v[k], u[k][j]);
    }
}

/* one element (T = float) or quad (T = float4) of mm_sums_load_n */
template <class T> __device__ __forceinline__ T mm_sums_load(const cuda_matmul_sums &s, int64_t b, int64_t r) {
    T v[1] = {T{}};
    const int64_t rows[1] = {r};
    const bool use[1] = {true};
    mm_sums_load_n<T, 1, MM_SUMS_LOADS>(s, b, rows, use, v);
    return v[0];
}

#endif
