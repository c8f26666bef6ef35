/* The one place CUDA names meet HIP names: every .cu file of this backend includes this header
 * instead of cuda_runtime.h, so the HIP build compiles the same sources (backends/hip/ is only a
 * build file). */
#ifndef SPECLA_CUDA_VENDOR_H
#define SPECLA_CUDA_VENDOR_H
#if defined(SPECLA_USE_HIP)
#include <hip/hip_runtime.h>
#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaGetLastError hipGetLastError
#define cudaGetErrorString hipGetErrorString
/* xor shuffle within a group of 32 lanes (a whole wave32; half a wave64) */
#define specla_shfl_xor(v, lane_mask) __shfl_xor((v), (lane_mask), 32)
#else
#include <cuda_runtime.h>
#define specla_shfl_xor(v, lane_mask) __shfl_xor_sync(0xffffffffu, (v), (lane_mask), 32)
#endif
#endif
