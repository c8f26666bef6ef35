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
/* matmul.cu */
#define cudaStream_t hipStream_t
#define cudaMalloc hipMalloc
#define cudaFree hipFree
#define cudaMemcpy hipMemcpy
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaErrorInvalidValue hipErrorInvalidValue
#define cudaErrorNotSupported hipErrorNotSupported
#define cudaErrorMemoryAllocation hipErrorOutOfMemory
#define cudaGetDevice hipGetDevice
#define cudaDeviceGetAttribute hipDeviceGetAttribute
#define cudaDevAttrComputeCapabilityMajor hipDeviceAttributeComputeCapabilityMajor
#else
#include <cuda_runtime.h>
#endif
#endif
