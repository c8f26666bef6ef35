/* The core's one place that knows which backends exist: opens an instance of the backend a caller
 * asked for (AUTO resolved here), or says in one line why it cannot. */
#include "backend_registry.h"

#include "error.h"

const char *backend_kind_name(int32_t kind) {
    switch (kind) {
    case SPECLA_BACKEND_AUTO: return "auto";
    case SPECLA_BACKEND_CPU: return "cpu";
    case SPECLA_BACKEND_CUDA: return "cuda";
    default: return "unknown";
    }
}

#ifdef SPECLA_WITH_CUDA
int cuda_backend_device_count(void);
SPECLA_API int specla_cuda_device_count(void) { return cuda_backend_device_count(); }
#else
SPECLA_API int specla_cuda_device_count(void) { return 0; }
#endif

int32_t backend_resolve_kind(int32_t kind) {
    if (kind != SPECLA_BACKEND_AUTO) return kind;
#ifdef SPECLA_WITH_CUDA
    if (cuda_backend_device_count() > 0) return SPECLA_BACKEND_CUDA;
#endif
    return SPECLA_BACKEND_CPU;
}

specla_status backend_open(int32_t kind, int32_t device, int n_threads, int cpu_kernels, const backend_limits *limits,
                           backend **out) {
    *out = NULL;
    switch (backend_resolve_kind(kind)) {
    case SPECLA_BACKEND_CPU: return cpu_backend_create(n_threads, cpu_kernels, limits, out);
    case SPECLA_BACKEND_CUDA:
#ifdef SPECLA_WITH_CUDA
        return cuda_backend_create(device, limits, out);
#else
        return specla_fail(SPECLA_ERR_UNSUPPORTED,
                           "backend cuda: this library was built without CUDA (rebuild with nvcc on PATH or "
                           "-DSPECLA_CUDA=ON); use --device cpu");
#endif
    default:
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "backend: unknown kind %d (0 = auto, 1 = cpu, 2 = cuda)", kind);
    }
}
