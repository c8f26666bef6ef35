/* How this backend launches its kernels: one helper for every launch, and the two instructions
 * every kernel starts with.
 *
 * Programmatic dependent launch (CUDA, sm_90+, on unless SPECLA_CUDA_PDL=0): each kernel is launched
 * with programmatic stream serialization and starts by letting the stream's next kernel launch
 * (griddepcontrol.launch_dependents) and then waiting until the previous kernel has finished and its
 * writes are visible (griddepcontrol.wait). So the next kernel's CTAs are already resident, waiting,
 * when a kernel ends (no launch gap between the ~600 small dependent kernels of a decode step), and a
 * matmul, which loads its constant weights before its wait, streams them during the tails of the
 * kernels before it. A kernel may launch only once every CTA of its predecessor has started, so the
 * waiting CTAs never hold resources a running predecessor still needs.
 *
 * The rule that keeps every result exact: nothing an earlier kernel of the stream writes or reads
 * is touched before the wait (only constant data may be read before it: a matmul's prepared weights,
 * which cuda_matmul_prepare_weight writes synchronously, never on the stream), and every
 * kernel executes the wait, so a kernel's completion implies its predecessor's and, by induction,
 * every earlier kernel's. Memory copies and event waits in the stream keep their full ordering. On
 * HIP, before sm_90 and with the overlap off, the launch is a plain one and both instructions are
 * no-ops. */
#ifndef SPECLA_CUDA_LAUNCH_H
#define SPECLA_CUDA_LAUNCH_H

#include <string.h>

#include "vendor.h"

#if defined(__CUDACC__) || defined(__HIPCC__)
/* Lets the stream's next kernel launch (it still waits for this grid's end before touching memory). */
__device__ __forceinline__ void grid_allow_dependents(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(SPECLA_USE_HIP)
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
/* Blocks until the stream's previous kernel has finished and its writes are visible. */
__device__ __forceinline__ void grid_wait_prior(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(SPECLA_USE_HIP)
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
/* The first statement of every kernel that does not stream constant data before its wait. */
__device__ __forceinline__ void grid_begin(void) {
    grid_allow_dependents();
    grid_wait_prior();
}
#endif

/* The current device's compute capability major, read once per device (0 when it cannot be read). */
inline int cuda_device_major(void) {
    static int major_of[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
    if (major_of[dev] == 0) {
        int major = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return 0;
        major_of[dev] = major;
    }
    return major_of[dev];
}

/* The overlap switch: on by default, off with SPECLA_CUDA_PDL=0 (cuda_backend.cu) or the matmul
 * check's --no-overlap, for comparisons; the bits are the same either way. */
inline int g_launch_overlap = 1;
inline void cuda_set_launch_overlap(int enable) { g_launch_overlap = enable != 0; }

/* Whether launches use programmatic stream serialization: the switch on and a device of compute
 * capability 9 or more (never on HIP). */
inline int cuda_launch_overlap(void) {
#if defined(SPECLA_USE_HIP)
    return 0;
#else
    return g_launch_overlap && cuda_device_major() >= 9;
#endif
}

/* The kernel's own parameter type, in a context that does not deduce it: the arguments convert at
 * the call as in kernel<<<...>>>(...) (NULL to a pointer, an int to an int64_t). */
template <typename T> struct launch_param { typedef T type; };

/* kernel<<<grid, block, smem, stream>>>(args...), with programmatic stream serialization when
 * cuda_launch_overlap() says so. A launch error is the runtime's last error, as after <<<...>>>
 * (cudaGetLastError, which cuda_note_launch reads). */
template <typename... KArgs>
static inline void cuda_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                               typename launch_param<KArgs>::type... args) {
#if !defined(SPECLA_USE_HIP)
    if (cuda_launch_overlap()) {
        cudaLaunchConfig_t config;
        memset(&config, 0, sizeof config);
        config.gridDim = grid, config.blockDim = block, config.dynamicSmemBytes = smem, config.stream = stream;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        config.attrs = attr, config.numAttrs = 1;
        (void)cudaLaunchKernelEx(&config, kernel, args...); /* its error stays the last error */
        return;
    }
#endif
    kernel<<<grid, block, smem, stream>>>(args...);
}

#endif
