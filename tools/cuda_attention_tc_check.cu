// Host check of the tensor-core attention's per-lane code (native/backends/cuda/attention_tensor_cores.cuh):
// att_tc_scores and att_tc_values run on 32 host threads per warp with an emulated m16n8k8 tf32 MMA
// (the PTX fragment layout; each C element adds its 8 exact products to the accumulator one by one in
// k order, in fp32), against plain loops of the arithmetic the header defines (the 3xTF32 split, the
// k-step and k-slot order of head dims and tile rows), bit for bit. It checks the fragment indices,
// the dim permutation, the masking of pairs, rows and dims, and where each C element lands, before
// any device run. The hardware's own order inside one MMA is not the emulation's: on a GPU the bits
// differ from these, which tools/device/cuda_ops_check compares against float64 instead.
//
//     nvcc -O2 -std=c++20 -Inative/backends/cuda tools/cuda_attention_tc_check.cu -o att_tc_check
//     ./att_tc_check [--self-test]
//
// --self-test plants faults (rows g and g + 8 swapped in the emulated MMA; k-slots t and t + 4 swapped)
// and fails unless every one is caught. Needs nvcc (for the CUDA headers' float4), no GPU.
#define ATT_TC_HOST_EMULATION 1
#include "attention_tensor_cores.cuh"
#include "host_check_values.h"

#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

static std::barrier<> *g_barrier = nullptr;
static uint32_t g_in[32][6];
static int g_fault = 0; // 1: rows g and g + 8 swapped in A; 2: k-slots t and t + 4 swapped in B

void att_tc_mma_emulated(float c[4], const uint32_t a[4], const uint32_t b[2], int lane) {
    const uint32_t in[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
    memcpy(g_in[lane], in, sizeof in);
    g_barrier->arrive_and_wait();
    const int g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; i++) {
        const int row = (i >> 1) ? g + 8 : g, col = 2 * t + (i & 1);
        float acc = c[i];
        for (int k = 0; k < 8; k++) {
            // A (row, k): lane 4 (row % 8) + k % 4, register 2 (k / 4) + row / 8
            int reg = 2 * (k / 4) + row / 8;
            if (g_fault == 1) reg ^= 1;
            const float av = att_tc_float(g_in[4 * (row % 8) + k % 4][reg]);
            // B (k, col): lane 4 col + k % 4, register 4 + k / 4
            int kb = k;
            if (g_fault == 2) kb ^= 4;
            const float bv = att_tc_float(g_in[4 * col + kb % 4][4 + kb / 4]);
            acc = acc + av * bv; // the product of two tf32 values is exact in fp32
        }
        c[i] = acc;
    }
    g_barrier->arrive_and_wait(); // nobody overwrites g_in before all have read it
}

// one warp: lane(l) on 32 host threads that meet at the emulated MMAs
static void run_warp(const std::function<void(int)> &lane) {
    std::barrier<> barrier(32);
    g_barrier = &barrier;
    std::vector<std::thread> threads;
    for (int l = 0; l < 32; l++) threads.emplace_back([&lane, l] { lane(l); });
    for (auto &th : threads) th.join();
    g_barrier = nullptr;
}

static int failures = 0;
static std::mt19937 rng(1234);
static void report(const char *name, long bad, long total) {
    printf("%-56s %s (%ld of %ld differ)\n", name, bad ? "FAIL" : "ok", bad, total);
    if (bad) failures++;
}

// the three products of 3xTF32 of (a, b) added to acc in the header's order: lo.hi, hi.lo, hi.hi
// are three separate MMAs; within each the 8 k-slots in order. `terms` gets acc after each.
static float split_hi(float x) { return att_tc_float(att_tf32(x)); }
static float split_lo(float x) { return att_tc_float(att_tf32(x - split_hi(x))); }

// Scores: 16 x 64 tile rows of pairs x rows, each warp's 16 rows, against the plain loop.
static void check_scores(int n_pair_rows, int D, int tile_n) {
    const int q_stride = D + ATT_TC_Q_PAD;
    auto Q = random_normals(rng, (size_t)16 * D), K = random_normals(rng, (size_t)64 * D);
    // the split queries of n_pair_rows pairs; rows past them are never used (read as row n_pair_rows - 1)
    std::vector<uint32_t> q_hi((size_t)n_pair_rows * q_stride, 0x7fc00000u), q_lo((size_t)n_pair_rows * q_stride, 0x7fc00000u);
    for (int p = 0; p < n_pair_rows; p++)
        for (int d = 0; d < D; d++) att_tc_split(Q[p * D + d], q_hi[p * q_stride + d], q_lo[p * q_stride + d]);
    std::vector<float> got((size_t)16 * 64, NAN);
    for (int w = 0; w < 4; w++)
        run_warp([&](int lane) {
            const int g = lane >> 2, t = lane & 3;
            const float *rows[2];
            for (int n = 0; n < 2; n++) {
                const int i = 16 * w + 8 * n + g;
                rows[n] = &K[(size_t)(i < tile_n ? i : tile_n - 1) * D]; // as the kernel: past the tile, its last row
            }
            float s[2][4];
            att_tc_scores(s, q_hi.data(), q_lo.data(), q_stride, n_pair_rows, rows, D, lane);
            for (int n = 0; n < 2; n++)
                for (int c = 0; c < 4; c++) got[(size_t)(g + 8 * (c >> 1)) * 64 + 16 * w + 8 * n + 2 * t + (c & 1)] = s[n][c];
        });
    long bad = 0, total = 0;
    for (int p = 0; p < n_pair_rows; p++) // the scores the kernel stores: its pairs, the tile's rows
        for (int i = 0; i < tile_n; i++) {
            float acc = 0.0f;
            for (int u = 0; u < D / 16; u++)
                for (int e = 0; e < 2; e++)
                    for (int term = 0; term < 3; term++)
                        for (int k = 0; k < 8; k++) {
                            const int d = 16 * u + 4 * (k % 4) + 2 * e + k / 4;
                            const float q = Q[p * D + d], kv = K[(size_t)i * D + d];
                            const float a = term == 1 ? split_hi(q) : term == 0 ? split_lo(q) : split_hi(q);
                            const float b = term == 0 ? split_hi(kv) : term == 1 ? split_lo(kv) : split_hi(kv);
                            acc = acc + a * b;
                        }
            total++;
            if (!same_bits(acc, got[(size_t)p * 64 + i])) bad++;
        }
    char name[96];
    snprintf(name, sizeof name, "scores pairs=%d D=%d tile rows=%d", n_pair_rows, D, tile_n);
    report(name, bad, total);
}

// V rows of a tile: row i, past tile_n its last row (the kernel's v_row)
struct TileRows {
    const float *V;
    int D, tile_n;
    __host__ __device__ const float *operator()(int i) const { return V + (size_t)(i < tile_n ? i : tile_n - 1) * D; }
};

// Weighted V: acc (16 pairs x D dims, from random starts) += P . V over a tile, warps of 64 dims.
static void check_values(int n_pairs, int D, int tile_n) {
    const int p_stride = 64 + 4;
    std::uniform_real_distribution<float> u01(0.0f, 1.0f);
    // pairs >= n_pairs do not exist (the kernel reads row n_pairs - 1 for them); NaN past each row's end
    std::vector<float> P((size_t)n_pairs * p_stride, NAN);
    for (int p = 0; p < n_pairs; p++)
        for (int i = 0; i < 64; i++) P[p * p_stride + i] = i < tile_n ? u01(rng) : 0.0f;
    auto V = random_normals(rng, (size_t)64 * D), A0 = random_normals(rng, (size_t)16 * D);
    std::vector<float> got((size_t)16 * D, NAN);
    for (int w = 0; 64 * w < D; w++)
        run_warp([&](int lane) {
            float acc[ATT_TC_NTILES][4];
            for (int j = 0; j < ATT_TC_NTILES; j++)
                for (int c = 0; c < 4; c++) {
                    const int d = att_tc_acc_dim(64 * w, lane, j, c), p = att_tc_acc_pair(lane, c);
                    acc[j][c] = d < D ? A0[(size_t)p * D + d] : 0.0f;
                }
            att_tc_values(acc, P.data(), p_stride, n_pairs, TileRows{V.data(), D, tile_n}, 64 * w, D, lane);
            for (int j = 0; j < ATT_TC_NTILES; j++)
                for (int c = 0; c < 4; c++) {
                    const int d = att_tc_acc_dim(64 * w, lane, j, c), p = att_tc_acc_pair(lane, c);
                    if (d < D) got[(size_t)p * D + d] = acc[j][c];
                }
        });
    long bad = 0, total = 0;
    for (int p = 0; p < n_pairs; p++)
        for (int d = 0; d < D; d++) {
            float acc = A0[(size_t)p * D + d];
            for (int s = 0; s < 8; s++)
                for (int term = 0; term < 3; term++)
                    for (int k = 0; k < 8; k++) {
                        const int i = 8 * s + k % 4 + 4 * (k / 4);
                        const float pv = P[p * p_stride + i], v = V[(size_t)(i < tile_n ? i : tile_n - 1) * D + d];
                        const float a = term == 0 ? split_lo(pv) : split_hi(pv);
                        const float b = term == 1 ? split_lo(v) : split_hi(v);
                        acc = acc + a * b;
                    }
            total++;
            if (!same_bits(acc, got[(size_t)p * D + d])) bad++;
        }
    char name[96];
    snprintf(name, sizeof name, "weighted V pairs=%d D=%d tile rows=%d", n_pairs, D, tile_n);
    report(name, bad, total);
}

// the split itself: hi + lo within 2^-22 of x, hi and lo tf32 values (13 low bits zero)
static void check_split() {
    auto X = random_normals(rng, 100000, 10.0f);
    long bad = 0;
    for (float x : X) {
        uint32_t hi, lo;
        att_tc_split(x, hi, lo);
        const double rest = std::fabs((double)x - ((double)att_tc_float(hi) + (double)att_tc_float(lo)));
        if ((hi & 0x1fffu) || (lo & 0x1fffu) || rest > std::ldexp(std::fabs((double)x), -22)) bad++;
    }
    report("3xTF32 split: hi + lo within 2^-22, both tf32", bad, (long)X.size());
}

static int run_all() {
    failures = 0;
    check_split();
    for (int pairs : {2, 6, 8, 12, 16})
        for (int D : {16, 80, 256}) check_scores(pairs, D, 64);
    check_scores(12, 256, 37);
    check_scores(6, 128, 1);
    for (int pairs : {2, 6, 12, 16})
        for (int D : {16, 80, 256}) check_values(pairs, D, 64);
    check_values(12, 256, 37);
    check_values(2, 128, 5);
    return failures;
}

int main(int argc, char **argv) {
    const bool self_test = argc > 1 && !strcmp(argv[1], "--self-test");
    const int f = run_all();
    int missed = 0;
    if (self_test) {
        for (int fault : {1, 2}) {
            g_fault = fault;
            printf("-- planted fault %d (must FAIL):\n", fault);
            if (run_all() == 0) {
                printf("planted fault %d was not caught\n", fault);
                missed++;
            }
        }
        g_fault = 0;
    }
    printf("%s: %d failure(s)%s\n", f || missed ? "FAILED" : "PASSED", f,
           self_test ? (missed ? ", a planted fault missed" : ", every planted fault caught") : "");
    return f || missed ? 1 : 0;
}
