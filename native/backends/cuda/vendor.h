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
#define cudaStreamNonBlocking hipStreamNonBlocking
#define cudaStreamCreateWithFlags hipStreamCreateWithFlags
#define cudaStreamDestroy hipStreamDestroy
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaMalloc hipMalloc
#define cudaFree hipFree
#define cudaMemcpy hipMemcpy
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemsetAsync hipMemsetAsync
#define cudaMemset hipMemset
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaErrorInvalidValue hipErrorInvalidValue
#define cudaErrorNotSupported hipErrorNotSupported
#define cudaErrorMemoryAllocation hipErrorOutOfMemory
#define cudaGetDevice hipGetDevice
#define cudaSetDevice hipSetDevice
#define cudaDeviceGetAttribute hipDeviceGetAttribute
#define cudaDevAttrComputeCapabilityMajor hipDeviceAttributeComputeCapabilityMajor
#define cudaDevAttrMultiProcessorCount hipDeviceAttributeMultiprocessorCount
#define cudaDevAttrMaxSharedMemoryPerMultiprocessor hipDeviceAttributeMaxSharedMemoryPerMultiprocessor
#define cudaGraph_t hipGraph_t
#define cudaGraphExec_t hipGraphExec_t
#define cudaStreamBeginCapture hipStreamBeginCapture
#define cudaStreamEndCapture hipStreamEndCapture
#define cudaStreamCaptureModeRelaxed hipStreamCaptureModeRelaxed
#define cudaGraphInstantiate(exec, graph, flags) hipGraphInstantiate((exec), (graph), NULL, NULL, 0)
#define cudaGraphLaunch hipGraphLaunch
#define cudaGraphExecDestroy hipGraphExecDestroy
#define cudaGraphDestroy hipGraphDestroy
#define cudaGraphNode_t hipGraphNode_t
#define cudaGraphGetNodes hipGraphGetNodes
#define cudaGraphNodeGetType hipGraphNodeGetType
#define cudaGraphNodeType hipGraphNodeType
#define cudaGraphNodeTypeKernel hipGraphNodeTypeKernel
#define cudaEvent_t hipEvent_t
#define cudaEventCreateWithFlags hipEventCreateWithFlags
#define cudaEventDisableTiming hipEventDisableTiming
#define cudaEventRecord hipEventRecord
#define cudaEventDestroy hipEventDestroy
#define cudaStreamWaitEvent hipStreamWaitEvent
/* xor butterfly shuffle within groups of 32 lanes (a whole wave32, half a wave64) */
#define SPECLA_SHFL_XOR(value, lane_mask) __shfl_xor((value), (lane_mask), 32)
/* CUDA's warp-synchronous intrinsics: on AMD a wave runs in lock step, so the mask has no work to
 * do; the cache-hinted loads and stores become plain ones. Widths stay 32 (wave32 on gfx11). */
#define __shfl_xor_sync(mask, value, lane_mask, ...) __shfl_xor((value), (lane_mask), 32)
#define __shfl_sync(mask, value, src_lane, ...) __shfl((value), (src_lane), 32)
#define __shfl_down_sync(mask, value, delta, ...) __shfl_down((value), (delta), 32)
#define __all_sync(mask, predicate) __all(predicate)
#define __any_sync(mask, predicate) __any(predicate)
#define __syncwarp(...) __builtin_amdgcn_wave_barrier()
#define __ldcg(ptr) (*(ptr))
#define __stcg(ptr, value) (*(ptr) = (value))
#else
#include <cuda_runtime.h>
#define SPECLA_SHFL_XOR(value, lane_mask) __shfl_xor_sync(0xffffffffu, (value), (lane_mask), 32)
#endif
#endif
