// Device discovery for the CUDA/HIP backend. The kernels (quant matvec/matmul, GDN, conv,
// attention, SpecLA) land in their own .cu files per op family; until then the library reports
// devices but runs every op on the CPU backend.
#include "specla.h"
#include "vendor.h"

extern "C" int cuda_backend_device_count(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError(); // clear the sticky "no driver" error; no device is not a failure
        return 0;
    }
    return count;
}
