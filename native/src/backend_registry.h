/* Opening backend instances (backend.c): the only place the core names a backend. */
#ifndef SPECLA_BACKEND_REGISTRY_H
#define SPECLA_BACKEND_REGISTRY_H
#include "backend.h"

/* An instance of `kind` (specla_backend_kind; AUTO resolved) ready for `limits`; n_threads and
 * cpu_kernels apply to the CPU backend, device to a GPU one. */
specla_status backend_open(int32_t kind, int32_t device, int n_threads, int cpu_kernels, const backend_limits *limits,
                           backend **out);
/* What AUTO means in this build on this machine. */
int32_t backend_resolve_kind(int32_t kind);
const char *backend_kind_name(int32_t kind);

#endif
