/* What the running CPU can do, and how an op's options resolve against it. */
#include <omp.h>

#include "cpu_ops.h"
#include "error.h"

int cpu_has_avx2_fma(void) {
    /* The AVX2 files are compiled with -mavx2 -mfma -mf16c, so all three must be present. The answer
     * cannot change while the process runs; computing it twice from two threads is harmless. */
    static int cached = -1;
    if (cached < 0) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
        cached = 0;
#endif
    }
    return cached;
}

int cpu_has_avx512_vnni(void) {
    /* matmul_avx512.c is compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni (and the AVX2
     * flags); libgcc's answer includes the OS saving the AVX-512 register state. */
    static int cached = -1;
    if (cached < 0) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
        __builtin_cpu_init();
        cached = cpu_has_avx2_fma() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#else
        cached = 0;
#endif
    }
    return cached;
}

static int best_kernels(void) {
    return cpu_has_avx512_vnni() ? SPECLA_CPU_AVX512 : cpu_has_avx2_fma() ? SPECLA_CPU_AVX2 : SPECLA_CPU_SCALAR;
}

specla_status cpu_exec_resolve(int n_threads, int kernels, cpu_exec *out) {
    if (out == NULL) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "cpu_exec_resolve: out is NULL");
    switch (kernels) {
    case SPECLA_CPU_AUTO: kernels = best_kernels(); break;
    case SPECLA_CPU_SCALAR: break;
    case SPECLA_CPU_AVX2:
        if (!cpu_has_avx2_fma())
            return specla_fail(SPECLA_ERR_UNSUPPORTED,
                               "cpu_kernels: AVX2 kernels requested but this CPU lacks AVX2/FMA/F16C");
        break;
    case SPECLA_CPU_AVX512:
        if (!cpu_has_avx512_vnni())
            return specla_fail(SPECLA_ERR_UNSUPPORTED,
                               "cpu_kernels: AVX512 kernels requested but this CPU lacks AVX-512 F/BW/VL/VNNI "
                               "(or AVX2/FMA/F16C)");
        break;
    default:
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                           "cpu_kernels: unknown value %d (0 = auto, 1 = scalar, 2 = avx2, 3 = avx512)", kernels);
    }
    if (n_threads <= 0) n_threads = omp_get_num_procs();
    if (n_threads <= 0) n_threads = 1;
    out->n_threads = n_threads;
    out->kernels = kernels;
    return SPECLA_OK;
}

SPECLA_API int specla_cpu_best_kernels(void) { return best_kernels(); }
