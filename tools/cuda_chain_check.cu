/* Stage 1 of docs/persistent-step.md on a GPU: a chain of one-token matmuls run by one persistent
 * kernel (cuda_matmul_chain_*, matmul_chain.cuh) against the same chain of cuda_matmul calls, the
 * op path a decode step takes today (a quantize and a matmul kernel per link, launched with
 * programmatic dependent launch and replayed from a captured graph).
 *
 *   cuda_chain_check [--links N] [--shapes AxB,BxA] [--type q4_k|q6_k] [--check-runs K] [--reps R]
 *                    [--rounds N] [--seed S] [--json OUT.jsonl] [--commit C] [--no-bench]
 *                    [--only CHAIN [--only-flags F]]   (R runs of one chain form, for a profiler)
 *
 * Check (every variant of the chain: both unit orders, with and without the L2 prefetch, the
 * register form at 8 and 12 warps per SM, the ring form at 8, 12 and 16 and with two row groups per
 * unit at 8 and 12, and both forms on a grid of one warp per SM, where each warp runs many tasks and
 * waits often):
 * K runs on fresh random inputs, every output of both paths poisoned with NaN before each run, every
 * y_l of the chain compared with the op path's bit for bit. The weights are random valid blocks whose
 * scales keep the values of a long chain finite (the check fails on any non-finite output).
 *
 * Bench: the op path's graph and each chain variant timed in interleaved rounds (R back-to-back runs
 * each, between two events), plus the chain without its waits (wrong results: how fast its warps
 * stream when nothing holds them) and a device-to-device copy for the copy rate. JSON rows: commit,
 * device, mode, links, shapes, bytes, us per run (median over rounds), GB/s, fraction of copy.
 *
 * Built on a GPU machine by tools/device/chain_check.sh (nvcc, this file and matmul.cu). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cuda_matmul.h"

#define CHECK_CUDA(call)                                                                                    \
    do {                                                                                                   \
        cudaError_t e_ = (call);                                                                           \
        if (e_ != cudaSuccess) {                                                                           \
            fprintf(stderr, "cuda_chain_check: %s failed: %s (%s:%d)\n", #call, cudaGetErrorString(e_),   \
                    __FILE__, __LINE__);                                                                   \
            exit(1);                                                                                       \
        }                                                                                                  \
    } while (0)

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_next(void) { /* xorshift64*: seeded, reproducible */
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}
static float rng_uniform(void) { return (float)(rng_next() >> 40) / (float)(1 << 24); }

static uint16_t f32_to_f16(float f) { /* round to nearest even, subnormals included */
    return __half_as_ushort(__float2half_rn(f));
}

/* One random weight of `type` with ne1 rows of ne0: random quants and scales, the super-block
 * scale chosen so that a row's dot with a unit-variance input has about unit variance. */
static std::vector<uint8_t> random_weight(int32_t type, int ne0, int ne1) {
    const int bb = type == SPECLA_TYPE_Q4_K ? 144 : 210;
    const size_t blocks = (size_t)ne1 * (ne0 / 256);
    std::vector<uint8_t> w(blocks * bb);
    for (size_t i = 0; i + 8 <= w.size(); i += 8) {
        const uint64_t r = rng_next();
        memcpy(&w[i], &r, 8);
    }
    for (size_t b = 0; b < blocks; b++) {
        uint8_t *blk = &w[b * bb];
        const float jitter = 0.5f + rng_uniform();
        if (type == SPECLA_TYPE_Q4_K) {
            /* w = d sc q - dmin m, sc, m in 0..63, q in 0..15: E[w^2] ~ 64300 d^2 with dmin = 7.5 d */
            const float d = jitter / sqrtf(64300.0f * (float)ne0);
            const uint16_t hd = f32_to_f16(d), hm = f32_to_f16(7.5f * d);
            memcpy(blk, &hd, 2), memcpy(blk + 2, &hm, 2);
        } else {
            /* w = d sc (q - 32), sc int8, q in 0..63: E[w^2] ~ 1.86e6 d^2 */
            const float d = jitter / sqrtf(1.86e6f * (float)ne0);
            const uint16_t hd = f32_to_f16(d);
            memcpy(blk + 208, &hd, 2);
        }
    }
    return w;
}

struct timing {
    std::string mode;
    int flags;        /* chain flags, -1 for the op path */
    int chain;        /* index into the chains, -1 for the op path */
    std::vector<double> us;
};

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
    int n_links = 16, check_runs = 3, reps = 20, rounds = 5, bench = 1, only_flags = 0;
    std::string only;
    std::string shapes = "5120x17408,17408x5120", type_name = "q4_k", json, commit = "unknown";
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        auto value = [&](void) -> std::string {
            if (i + 1 >= argc) {
                fprintf(stderr, "cuda_chain_check: %s needs a value\n", a.c_str());
                exit(2);
            }
            return argv[++i];
        };
        if (a == "--links") n_links = atoi(value().c_str());
        else if (a == "--shapes") shapes = value();
        else if (a == "--type") type_name = value();
        else if (a == "--check-runs") check_runs = atoi(value().c_str());
        else if (a == "--reps") reps = atoi(value().c_str());
        else if (a == "--rounds") rounds = atoi(value().c_str());
        else if (a == "--json") json = value();
        else if (a == "--commit") commit = value();
        else if (a == "--seed") rng_state = strtoull(value().c_str(), nullptr, 0) * 0x9e3779b97f4a7c15ull | 1u;
        else if (a == "--no-bench") bench = 0;
        else if (a == "--only") only = value(); /* e.g. "ring 8/SM": R runs of that chain, nothing else */
        else if (a == "--only-flags") only_flags = atoi(value().c_str());
        else {
            fprintf(stderr, "cuda_chain_check: unknown argument '%s'\n", a.c_str());
            return 2;
        }
    }
    const int32_t type = type_name == "q4_k" ? SPECLA_TYPE_Q4_K : type_name == "q6_k" ? SPECLA_TYPE_Q6_K : -1;
    if (type < 0) {
        fprintf(stderr, "cuda_chain_check: --type must be q4_k or q6_k (got '%s')\n", type_name.c_str());
        return 2;
    }
    if (n_links < 1 || n_links > 64 || check_runs < 1 || reps < 1 || rounds < 1) {
        fprintf(stderr, "cuda_chain_check: --links 1..64, --check-runs, --reps and --rounds at least 1\n");
        return 2;
    }
    /* the shape cycle: "AxB,BxA" gives links A->B, B->A, A->B, ... */
    std::vector<std::pair<int, int>> cycle;
    for (size_t p = 0; p < shapes.size();) {
        size_t q = shapes.find(',', p);
        if (q == std::string::npos) q = shapes.size();
        int a = 0, b = 0;
        if (sscanf(shapes.substr(p, q - p).c_str(), "%dx%d", &a, &b) != 2 || a <= 0 || b <= 0 || a % 256 || b % 256) {
            fprintf(stderr, "cuda_chain_check: --shapes wants NE0xNE1 pairs, multiples of 256 (got '%s')\n", shapes.c_str());
            return 2;
        }
        cycle.push_back({a, b});
        p = q + 1;
    }
    for (size_t i = 0; i < cycle.size(); i++)
        if (cycle[i].second != cycle[(i + 1) % cycle.size()].first && (n_links > 1)) {
            fprintf(stderr, "cuda_chain_check: --shapes must chain (each NE1 the next NE0, cyclically)\n");
            return 2;
        }

    const unsigned long long seed_shown = (unsigned long long)rng_state;
    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    /* weights, outputs */
    std::vector<specla_tensor> w(n_links);
    std::vector<float *> y_op(n_links), y_chain(n_links);
    size_t weight_bytes = 0;
    int max_n = 0;
    for (int l = 0; l < n_links; l++) {
        const int ne0 = cycle[l % cycle.size()].first, ne1 = cycle[l % cycle.size()].second;
        max_n = std::max(max_n, std::max(ne0, ne1));
        std::vector<uint8_t> host = random_weight(type, ne0, ne1);
        specla_tensor t;
        memset(&t, 0, sizeof t);
        t.data = host.data(), t.type = type, t.ne0 = ne0, t.ne1 = ne1, t.nbytes = (int64_t)host.size();
        const size_t prepared = cuda_matmul_prepared_bytes(type, ne0, ne1);
        void *dev = nullptr;
        CHECK_CUDA(cudaMalloc(&dev, prepared));
        CHECK_CUDA(cuda_matmul_prepare_weight(&t, dev));
        weight_bytes += host.size();
        t.data = dev;
        w[l] = t;
        CHECK_CUDA(cudaMalloc((void **)&y_op[l], (size_t)ne1 * sizeof(float)));
        CHECK_CUDA(cudaMalloc((void **)&y_chain[l], (size_t)ne1 * sizeof(float)));
    }
    const int n0 = w[0].ne0;
    float *x = nullptr;
    CHECK_CUDA(cudaMalloc((void **)&x, (size_t)n0 * sizeof(float)));
    cuda_matmul_workspace ws;
    ws.bytes = cuda_matmul_workspace_bytes(1, max_n);
    CHECK_CUDA(cudaMalloc(&ws.data, ws.bytes));
    CHECK_CUDA(cudaMemset(ws.data, 0, ws.bytes));
    std::vector<const specla_tensor *> wp(n_links);
    for (int l = 0; l < n_links; l++) wp[l] = &w[l];
    printf("device %s, %d SMs; %d links of %s (%s), %.1f MB of weights; seed state %llx\n", prop.name,
           prop.multiProcessorCount, n_links, type_name.c_str(), shapes.c_str(), weight_bytes / 1e6, seed_shown);

    /* the op path, captured once */
    cudaGraph_t graph;
    cudaGraphExec_t op_exec;
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int l = 0; l < n_links; l++) CHECK_CUDA(cuda_matmul(stream, &w[l], l == 0 ? x : y_op[l - 1], 1, y_op[l], ws));
    CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
    CHECK_CUDA(cudaGraphInstantiate(&op_exec, graph, 0));

    /* the chains: (warps per SM, warps) */
    struct chain_variant {
        const char *name;
        int form, warps;
        cuda_matmul_chain *chain;
    };
    const int sms = prop.multiProcessorCount;
    std::vector<chain_variant> chains = {{"regs 8/SM", CUDA_MATMUL_CHAIN_REGISTERS_8, 0, nullptr},
                                         {"regs 1 warp/SM", CUDA_MATMUL_CHAIN_REGISTERS_8, sms, nullptr},
                                         {"ring 8/SM", CUDA_MATMUL_CHAIN_RING_8, 0, nullptr},
                                         {"ring 12/SM", CUDA_MATMUL_CHAIN_RING_12, 0, nullptr},
                                         {"ring 16/SM", CUDA_MATMUL_CHAIN_RING_16, 0, nullptr},
                                         {"ring pairs 8/SM", CUDA_MATMUL_CHAIN_RING_PAIRS_8, 0, nullptr},
                                         {"ring pairs 12/SM", CUDA_MATMUL_CHAIN_RING_PAIRS_12, 0, nullptr},
                                         {"ring 1 warp/SM", CUDA_MATMUL_CHAIN_RING_8, sms, nullptr}};
    if (type == SPECLA_TYPE_Q4_K) chains.insert(chains.begin() + 1, {"regs 12/SM", CUDA_MATMUL_CHAIN_REGISTERS_12, 0, nullptr});
    for (auto &c : chains) {
        CHECK_CUDA(cuda_matmul_chain_create(n_links, wp.data(), y_chain.data(), c.form, c.warps, &c.chain));
        printf("chain %s: %d warps\n", c.name, cuda_matmul_chain_warps(c.chain));
    }

    if (!only.empty()) { /* for a profiler: R runs of one chain on one input, no op path, no check */
        for (auto &c : chains)
            if (only == c.name) {
                for (int i = 0; i < reps; i++) CHECK_CUDA(cuda_matmul_chain_run(stream, c.chain, x, only_flags));
                CHECK_CUDA(cudaStreamSynchronize(stream));
                printf("ran %d runs of chain %s, flags %d\n", reps, c.name, only_flags);
                return 0;
            }
        fprintf(stderr, "cuda_chain_check: --only names no chain ('%s')\n", only.c_str());
        return 2;
    }

    /* the check */
    const int flag_sets[] = {0, CUDA_MATMUL_CHAIN_CHUNK_MAJOR, CUDA_MATMUL_CHAIN_L2_PREFETCH,
                             CUDA_MATMUL_CHAIN_L2_PREFETCH | CUDA_MATMUL_CHAIN_CHUNK_MAJOR};
    std::vector<float> hx(n0), a, b;
    int failures = 0;
    for (auto &c : chains) {
        for (int flags : flag_sets) {
            int bad_links = 0, nonfinite = 0;
            float largest = 0.0f;
            for (int run = 0; run < check_runs; run++) {
                for (int i = 0; i < n0; i++) hx[i] = 2.0f * rng_uniform() - 1.0f;
                CHECK_CUDA(cudaMemcpy(x, hx.data(), hx.size() * sizeof(float), cudaMemcpyHostToDevice));
                for (int l = 0; l < n_links; l++) {
                    CHECK_CUDA(cudaMemset(y_op[l], 0xff, (size_t)w[l].ne1 * sizeof(float))); /* NaN */
                    CHECK_CUDA(cudaMemset(y_chain[l], 0xff, (size_t)w[l].ne1 * sizeof(float)));
                }
                CHECK_CUDA(cudaGraphLaunch(op_exec, stream));
                CHECK_CUDA(cuda_matmul_chain_run(stream, c.chain, x, flags));
                CHECK_CUDA(cudaStreamSynchronize(stream));
                for (int l = 0; l < n_links; l++) {
                    const size_t n = (size_t)w[l].ne1;
                    a.resize(n), b.resize(n);
                    CHECK_CUDA(cudaMemcpy(a.data(), y_op[l], n * sizeof(float), cudaMemcpyDeviceToHost));
                    CHECK_CUDA(cudaMemcpy(b.data(), y_chain[l], n * sizeof(float), cudaMemcpyDeviceToHost));
                    if (memcmp(a.data(), b.data(), n * sizeof(float)) != 0) bad_links++;
                    for (size_t i = 0; i < n; i++) {
                        if (!std::isfinite(a[i])) nonfinite++;
                        else largest = std::max(largest, fabsf(a[i]));
                    }
                }
            }
            const int ok = bad_links == 0 && nonfinite == 0;
            failures += !ok;
            printf("check %-18s flags %d: %s (%d of %d link outputs differ, %d non-finite, largest |y| %.3g)\n", c.name,
                   flags, ok ? "PASSED" : "FAIL", bad_links, n_links * check_runs, nonfinite, largest);
        }
    }
    printf("check: %s\n", failures ? "FAIL" : "PASSED");
    if (!bench) return failures ? 1 : 0;

    /* the copy rate: (bytes read + written) / time, as tools/bench_gpu.py */
    const size_t copy_bytes = (size_t)1 << 31;
    void *c0 = nullptr, *c1 = nullptr;
    CHECK_CUDA(cudaMalloc(&c0, copy_bytes));
    CHECK_CUDA(cudaMalloc(&c1, copy_bytes));
    CHECK_CUDA(cudaMemset(c0, 1, copy_bytes));
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    std::vector<double> copy_ms;
    for (int i = 0; i < 8; i++) {
        CHECK_CUDA(cudaEventRecord(e0, stream));
        CHECK_CUDA(cudaMemcpyAsync(c1, c0, copy_bytes, cudaMemcpyDeviceToDevice, stream));
        CHECK_CUDA(cudaEventRecord(e1, stream));
        CHECK_CUDA(cudaEventSynchronize(e1));
        float ms = 0;
        CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 2) copy_ms.push_back(ms);
    }
    const double copy_gbs = 2.0 * copy_bytes / (median(copy_ms) * 1e-3) / 1e9;
    CHECK_CUDA(cudaFree(c0));
    CHECK_CUDA(cudaFree(c1));

    std::vector<timing> timings;
    timings.push_back({"op path (graph)", -1, -1, {}});
    for (size_t ci = 0; ci < chains.size(); ci++) {
        const std::string base = std::string("chain ") + chains[ci].name;
        timings.push_back({base, 0, (int)ci, {}});
        timings.push_back({base + " chunk-major", CUDA_MATMUL_CHAIN_CHUNK_MAJOR, (int)ci, {}});
        if (chains[ci].form < CUDA_MATMUL_CHAIN_RING_8) /* the ring form streams its blocks ahead itself */
            timings.push_back({base + " L2 prefetch", CUDA_MATMUL_CHAIN_L2_PREFETCH, (int)ci, {}});
        timings.push_back({base + " no wait (bound)", CUDA_MATMUL_CHAIN_NO_WAIT, (int)ci, {}});
    }
    for (int r = 0; r < rounds + 1; r++) { /* round 0 warms up */
        for (auto &t : timings) {
            CHECK_CUDA(cudaEventRecord(e0, stream));
            for (int i = 0; i < reps; i++) {
                if (t.chain < 0) CHECK_CUDA(cudaGraphLaunch(op_exec, stream));
                else CHECK_CUDA(cuda_matmul_chain_run(stream, chains[t.chain].chain, x, t.flags));
            }
            CHECK_CUDA(cudaEventRecord(e1, stream));
            CHECK_CUDA(cudaEventSynchronize(e1));
            float ms = 0;
            CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
            if (r > 0) t.us.push_back(1e3 * ms / reps);
        }
    }
    FILE *out = json.empty() ? nullptr : fopen(json.c_str(), "a");
    if (!json.empty() && !out) {
        fprintf(stderr, "cuda_chain_check: cannot open --json %s\n", json.c_str());
        return 1;
    }
    const double op_us = median(timings[0].us);
    printf("copy rate %.0f GB/s; %d rounds of %d runs; us per run (median, min-max), GB/s, fraction of copy, op/this\n",
           copy_gbs, rounds, reps);
    for (auto &t : timings) {
        const double us = median(t.us);
        const double gbs = weight_bytes / (us * 1e-6) / 1e9;
        printf("  %-36s %9.1f (%.1f-%.1f)  %7.0f  %.3f  %.3f\n", t.mode.c_str(), us,
               *std::min_element(t.us.begin(), t.us.end()), *std::max_element(t.us.begin(), t.us.end()), gbs,
               gbs / copy_gbs, op_us / us);
        if (out)
            fprintf(out,
                    "{\"commit\": \"%s\", \"device\": \"%s\", \"bench\": \"cuda_chain_check\", \"mode\": \"%s\", "
                    "\"type\": \"%s\", \"links\": %d, \"shapes\": \"%s\", \"weight_bytes\": %zu, \"warps\": %d, "
                    "\"us_per_run\": %.2f, \"us_min\": %.2f, \"us_max\": %.2f, \"gbs\": %.1f, \"copy_gbs\": %.1f, "
                    "\"fraction_of_copy\": %.4f, \"op_over_this\": %.4f, \"rounds\": %d, \"reps\": %d, "
                    "\"check\": \"%s\"}\n",
                    commit.c_str(), prop.name, t.mode.c_str(), type_name.c_str(), n_links, shapes.c_str(), weight_bytes,
                    t.chain < 0 ? 0 : cuda_matmul_chain_warps(chains[t.chain].chain), us,
                    *std::min_element(t.us.begin(), t.us.end()), *std::max_element(t.us.begin(), t.us.end()), gbs,
                    copy_gbs, gbs / copy_gbs, op_us / us, rounds, reps, failures ? "FAIL" : "PASSED");
    }
    if (out) fclose(out);
    for (auto &c : chains) cuda_matmul_chain_destroy(c.chain);
    return failures ? 1 : 0;
}
