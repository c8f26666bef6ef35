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
#define cudaStream_t hipStream_t
/* butterfly shuffle over the whole wave (every lane takes part) */
#define SPECLA_SHFL_XOR(value, lane_mask) __shfl_xor((value), (lane_mask))
#else
#include <cuda_runtime.h>
#define SPECLA_SHFL_XOR(value, lane_mask) __shfl_xor_sync(0xffffffffu, (value), (lane_mask))
#endif
#endif
