// What the host checks of CUDA device code (tools/cuda_*_check.cu) share: seeded random inputs and a
// bit-for-bit comparison of floats.
#ifndef SPECLA_TOOLS_HOST_CHECK_VALUES_H
#define SPECLA_TOOLS_HOST_CHECK_VALUES_H

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

// n normal floats of standard deviation `scale` from rng
inline std::vector<float> random_normals(std::mt19937 &rng, size_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto &x : v) x = d(rng);
    return v;
}

// whether a and b are the same bits (NaN payloads and signed zeros included)
inline bool same_bits(float a, float b) {
    uint32_t x, y;
    memcpy(&x, &a, 4), memcpy(&y, &b, 4);
    return x == y;
}

#endif
