/* Check and benchmark of the CUDA matmul (native/backends/cuda/matmul.cu) against the CPU oracle.
 *
 *   cuda_matmul_check [--host-model] [--quick] [--no-check] [--no-bench] [--self-test]
 *                     [--json PATH] [--commit HASH] [--oracle-kernels N] [--no-overlap] [--tensor-cores M]
 *                     [--batches 1,2,..] [--matrix NAME] [--trace PATH]
 *
 * Check (default on): for every supported type and a set of shapes (odd row counts, one block up to
 * 17408 inputs), seeded random valid weight blocks and activations:
 *   (1) every output element is written (y is poisoned with NaN first) and finite;
 *   (2) every row is bit-identical to the n_batch = 1 run of the same input row, for n_batch in
 *       {1, 2, 3, 4, 5, 8, 16, 23, 32, 64}, with each kernel choice of cuda_matmul_set_tensor_cores
 *       (the default: the staged int8 tensor-core kernel for Q4_K/Q5_K/Q6_K/Q8_0, the per-warp one for the
 *       other 8-bit types; the per-warp one for all; the dp4a kernel alone), and a group launch gives the
 *       bits of separate calls, a group of Q4_K and Q6_K matrices also in one launch for both
 *       (cuda_matmul_set_pair_launch);
 *   (3) |gpu - cpu| <= bound * sum_i |w_i x_i| per element against specla_op_matmul (the CPU oracle,
 *       scalar kernels unless --oracle-kernels says otherwise), the bound per type printed below;
 *       for Q5_K, whose activations the GPU rounds to Q8_K blocks where the CPU multiplies floats,
 *       against the float64 product of what the GPU multiplies (oracle_matmul_seen);
 *   (4) the GPU's activation blocks are the CPU's bytes (specla_op_quantize_activations), special
 *       rows (zeros, ties, NaN, inf, tiny, huge) included;
 *   (5) every output is bit-identical to the host model of the kernels (below), which computes the
 *       order matmul.cu documents with the same per-block code: a difference says the device
 *       arithmetic departs from its specification (and where).
 *       F16/BF16 on the tensor-core path (every mode but 0, every n_batch): the host model of its
 *       order (host_ftc_model, the MMA as 16 sequential fp32 fmas) meets the GPU within the bound of
 *       (3), not in bits: the hardware's MMA accumulation is its own. The fma path of these types
 *       runs as well (mode 0) and is checked in bits; (2) stays a bit check for both.
 * Also (host model and GPU alike): the F16/BF16 tensor-core order and the fma order against the
 * float64 sum, activation rows scaled by 2^-100 .. 2^60 (check_ftc_error_vs_float64: the figures,
 * and a failure over the bound of (3)).
 * --host-model runs, instead of the GPU, a host model of the kernels built from the same per-block
 * code (matmul_blocks.h) and the same layout, chunking and summation order: it exercises this
 * program's generation and comparison logic (and the arithmetic) on a machine without a GPU; the
 * batch-invariance checks are then true by construction, and the group test is skipped.
 * --self-test (with --host-model) injects a fault into each check and fails unless every one is caught.
 * --host-model also runs the tensor-core kernel's per-lane code on 32 host threads with an emulated
 * MMA (check_mma_emulation) and compares it bit for bit with the host model; the same for the staged
 * kernel (matmul_tile.cuh, Q4_K/Q5_K/Q6_K/Q8_0: its CTA barriers emulated too, m16n8k32 emulated on its own),
 * and the F16/BF16 tensor-core kernel (matmul_float_tc.cuh, f16/bf16 m16n8k16 emulated) against
 * host_ftc_model, bit for bit (check_ftc_emulation). Always (host code): the staged kernel's weight
 * fragments read from a shared-memory stage (its bulk form) against those read from the weight
 * (check_tile_stage_loads).
 *
 * Benchmark (default on, GPU only): the 27B-shape matrices at n_batch 1..64, CUDA events, median of
 * 20 passes over enough copies of the weights to defeat the L2; prints a table and, with --json,
 * appends one JSON line per (matrix, n_batch) to the file. --no-overlap turns off the programmatic dependent
 * launch (cuda_set_launch_overlap(0), launch.h) for the whole run, to measure what it gains; --tensor-cores M
 * benchmarks kernel choice M (0 dp4a, 1 staged = the default, 2 per-warp) for 2+ tokens; --matrix NAME
 * benchmarks only the shapes of that name (one launch pattern under compute-sanitizer, say). */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "activation_blocks.h"
#include "cuda_matmul.h"
#include "matmul_launch.h"
#include "matmul_mma.cuh"
#include "matmul_tile.cuh"
#include "matmul_float_tc.cuh"
#include "specla.h"

#define CK(call)                                                                                                    \
    do {                                                                                                            \
        cudaError_t e_ = (call);                                                                                    \
        if (e_ != cudaSuccess) {                                                                                    \
            fprintf(stderr, "cuda_matmul_check: %s failed: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__, \
                    __LINE__);                                                                                      \
            exit(2);                                                                                                \
        }                                                                                                           \
    } while (0)

static const int kBatches[] = {1, 2, 3, 4, 5, 8, 16, 23, 32, 64};
enum { MAX_BATCH = 64 };

struct Options {
    bool host_model = false, quick = false, check = true, bench = true, self_test = false, overlap = true;
    std::string json, commit = "unknown";
    std::string trace; /* --trace: the bench's launch timelines (a -DMM_TRACE build) */
    std::vector<int> batches; /* --batches: the benchmark's token counts (default kBenchBatches) */
    std::string matrix;       /* --matrix: only the benchmark shapes of this name (e.g. under compute-sanitizer) */
    int oracle_kernels = SPECLA_CPU_SCALAR;
    int tc_mode = CUDA_MATMUL_TC_STAGED; /* --tensor-cores: the kernel choice the benchmark runs */
};
static Options g_opt;

/* ---- seeded random inputs ----------------------------------------------------------------------- */
struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
    uint64_t next() { /* splitmix64 */
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    float uniform() { return (float)((next() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; } /* [-1, 1) */
};

/* a finite fp16 scale of magnitude 2^-12 .. 2^-6, random sign */
static uint16_t random_scale(Rng &r) {
    const float mag = ldexpf(1.0f + 0.5f * (r.uniform() + 1.0f), -6 - (int)(r.next() % 7));
    return float_to_half((r.next() & 1) ? -mag : mag);
}

/* GGUF bytes of a random valid weight: random quants, finite small scales. */
static std::vector<uint8_t> make_weight(int32_t type, int ne0, int ne1, Rng &r) {
    const int64_t row_bytes = type_row_bytes(type, ne0);
    std::vector<uint8_t> w((size_t)(row_bytes * ne1));
    for (size_t i = 0; i < w.size(); i += 8) { /* 8 random bytes per draw */
        const uint64_t v = r.next();
        memcpy(w.data() + i, &v, std::min<size_t>(8, w.size() - i));
    }
    const int bb = type_block_bytes(type);
    const size_t n_blocks = w.size() / bb;
    for (size_t i = 0; i < n_blocks; i++) {
        uint8_t *blk = w.data() + i * bb;
        uint16_t h;
        switch (type) {
        case SPECLA_TYPE_F32: {
            const float f = r.uniform();
            memcpy(blk, &f, 4);
            break;
        }
        case SPECLA_TYPE_F16: h = float_to_half(r.uniform()), memcpy(blk, &h, 2); break;
        case SPECLA_TYPE_BF16: {
            const float f = r.uniform();
            uint32_t bits;
            memcpy(&bits, &f, 4);
            h = (uint16_t)(bits >> 16);
            memcpy(blk, &h, 2);
            break;
        }
        case SPECLA_TYPE_Q8_0:
        case SPECLA_TYPE_Q4_0:
        case SPECLA_TYPE_Q5_0: h = random_scale(r), memcpy(blk, &h, 2); break;
        case SPECLA_TYPE_Q4_K:
        case SPECLA_TYPE_Q5_K:
            h = random_scale(r), memcpy(blk, &h, 2);
            h = random_scale(r), memcpy(blk + 2, &h, 2);
            break;
        case SPECLA_TYPE_Q6_K: h = random_scale(r), memcpy(blk + 208, &h, 2); break;
        default: break;
        }
    }
    return w;
}

/* MAX_BATCH activation rows of n: random, with row 1 starting with a zero block of 256, row 2 with
 * ties of largest magnitude (+A first, then -A) in every block of 32, row 3 small with an outlier. */
static std::vector<float> make_activations(int n, Rng &r) {
    std::vector<float> x((size_t)MAX_BATCH * n);
    for (int b = 0; b < MAX_BATCH; b++) {
        const float row_scale = 0.25f + 2.0f * (r.uniform() + 1.0f);
        for (int i = 0; i < n; i++) x[(size_t)b * n + i] = r.uniform() * row_scale;
    }
    for (int i = 0; i < std::min(n, 256); i++) x[(size_t)1 * n + i] = 0.0f;
    for (int k = 0; k + 32 <= n; k += 32) x[(size_t)2 * n + k + 5] = 3.0f, x[(size_t)2 * n + k + 9] = -3.0f;
    for (int i = 0; i < n; i++) x[(size_t)3 * n + i] *= 1e-3f;
    x[(size_t)3 * n + n / 2] = 50.0f;
    return x;
}

/* Rows only the quantizer check sees: a NaN, an infinity, tiny values (the scale underflows), huge
 * values (the fp16 Q8_0 scale overflows), all zeros, negative ties. */
static std::vector<float> make_special_rows(int n, Rng &r, int *rows) {
    *rows = 6;
    std::vector<float> x((size_t)*rows * n);
    for (auto &v : x) v = r.uniform();
    x[7] = NAN;
    x[(size_t)1 * n + 40] = INFINITY;
    for (int i = 0; i < n; i++) x[(size_t)2 * n + i] *= 1e-38f;
    for (int i = 0; i < n; i++) x[(size_t)3 * n + i] *= 2e7f;
    for (int i = 0; i < n; i++) x[(size_t)4 * n + i] = 0.0f;
    for (int k = 0; k + 32 <= n; k += 32) x[(size_t)5 * n + k + 3] = -4.0f, x[(size_t)5 * n + k + 30] = 4.0f;
    return x;
}

/* ---- the CPU oracle (libspecla's public ABI) ------------------------------------------------------ */
static specla_tensor host_tensor(const std::vector<uint8_t> &w, int32_t type, int ne0, int ne1) {
    specla_tensor t;
    memset(&t, 0, sizeof t);
    t.data = w.data(), t.type = type, t.ne0 = ne0, t.ne1 = ne1, t.nbytes = (int64_t)w.size();
    return t;
}

static void oracle_matmul(const specla_tensor &w, const float *x, int n_batch, float *y);

/* Whether the GPU rounds this type's activations where the CPU oracle multiplies floats (Q5_K:
 * matmul_blocks.h's mm_act_kind); its oracle is then what the GPU multiplies, below. */
static bool gpu_rounds_float_activations(int32_t type) {
    return mm_act_kind(type) != MM_ACT_FLOAT && act_kind_for_weight(type) == ACT_FLOAT;
}

/* y = W x' in float64 (stored as float), x' the Q8_K blocks of x as the GPU takes them (codes x
 * scale, the CPU's quantizer: specla_op_quantize_activations on a type with the same blocks) and W
 * the CPU's dequantized weights: the product the GPU rounds, with none of its roundings. */
static void oracle_matmul_seen(const specla_tensor &w, const float *x, int n_batch, float *y) {
    const int n = w.ne0;
    std::vector<int8_t> codes((size_t)n_batch * n);
    std::vector<float> scales((size_t)n_batch * (n / 256));
    std::vector<double> seen((size_t)n_batch * n); /* code x scale, exact in double */
    specla_op_options opt = {1, SPECLA_CPU_SCALAR, SPECLA_BACKEND_CPU, 0};
    if (specla_op_quantize_activations(&opt, SPECLA_TYPE_Q4_K, x, n_batch, n, codes.data(), scales.data()) != SPECLA_OK) {
        fprintf(stderr, "cuda_matmul_check: specla_op_quantize_activations failed: %s\n", specla_last_error());
        exit(2);
    }
    for (size_t i = 0; i < seen.size(); i++) seen[i] = (double)codes[i] * (double)scales[i / 256];
    const int64_t row_bytes = type_row_bytes(w.type, n);
#pragma omp parallel
    {
        std::vector<float> wf(n);
#pragma omp for schedule(static)
        for (int o = 0; o < w.ne1; o++) {
            if (specla_op_dequantize(&opt, w.type, (const uint8_t *)w.data + (size_t)o * row_bytes, n, wf.data()) !=
                SPECLA_OK) {
                fprintf(stderr, "cuda_matmul_check: specla_op_dequantize(%s) failed: %s\n", type_name(w.type),
                        specla_last_error());
                exit(2);
            }
            for (int b = 0; b < n_batch; b++) {
                double acc = 0;
                for (int i = 0; i < n; i++) acc += (double)wf[i] * seen[(size_t)b * n + i];
                y[(size_t)b * w.ne1 + o] = (float)acc;
            }
        }
    }
}

static void oracle_matmul(const specla_tensor &w, const float *x, int n_batch, float *y) {
    if (gpu_rounds_float_activations(w.type)) return oracle_matmul_seen(w, x, n_batch, y);
    specla_op_options opt = {0, g_opt.oracle_kernels, SPECLA_BACKEND_CPU, 0}; /* the CPU oracle */
    if (specla_op_matmul(&opt, &w, x, n_batch, y) != SPECLA_OK) {
        fprintf(stderr, "cuda_matmul_check: specla_op_matmul(%s %dx%d) failed: %s\n", type_name(w.type), w.ne0, w.ne1,
                specla_last_error());
        exit(2);
    }
}

/* Magnitudes of the float terms an element's weight enters the sums with, row o of w (double):
 * |w| for most types; for Q4_K and Q5_K |d sc q| + |dmin m| (the s and t sums are separate fma terms),
 * for Q6_K |d sc| (q + 32) (the CPU's lanes carry q a and 32 bsum separately). */
static void term_magnitudes(const specla_tensor &w, int o, double *out) {
    const int64_t row_bytes = type_row_bytes(w.type, w.ne0);
    const uint8_t *row = (const uint8_t *)w.data + (size_t)o * row_bytes;
    if (w.type == SPECLA_TYPE_Q4_K || w.type == SPECLA_TYPE_Q5_K) {
        const bool five = w.type == SPECLA_TYPE_Q5_K;
        for (int k = 0; k < w.ne0 / 256; k++) {
            /* the same fields, and Q5_K's qh with the fifth bits */
            const block_q4_K *b4 = (const block_q4_K *)row + k;
            const block_q5_K *b5 = (const block_q5_K *)row + k;
            const uint8_t *qs = five ? b5->qs : b4->qs, *scales = five ? b5->scales : b4->scales;
            const double d = fabs(half_to_float(five ? b5->d : b4->d)), dmin = fabs(half_to_float(five ? b5->dmin : b4->dmin));
            for (int j = 0; j < 8; j++) {
                int sc, m;
                k_scale_min(scales, j, &sc, &m);
                for (int i = 0; i < 32; i++) {
                    const int q = ((qs[32 * (j / 2) + i] >> (4 * (j % 2))) & 15) | (five ? ((b5->qh[i] >> j) & 1) << 4 : 0);
                    out[256 * k + 32 * j + i] = d * sc * q + dmin * m;
                }
            }
        }
        return;
    }
    if (w.type == SPECLA_TYPE_Q6_K) {
        for (int k = 0; k < w.ne0 / 256; k++) {
            const block_q6_K *b = (const block_q6_K *)row + k;
            const double d = fabs(half_to_float(b->d));
            for (int h = 0; h < 2; h++)
                for (int l = 0; l < 32; l++) {
                    const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
                    const int q[4] = {(ql[l] & 15) | ((qh[l] >> 0) & 3) << 4, (ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4,
                                      (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4, (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4};
                    for (int m = 0; m < 4; m++) {
                        const int e = 128 * h + 32 * m + l;
                        out[256 * k + e] = d * abs(b->scales[e / 16]) * (q[m] + 32);
                    }
                }
        }
        return;
    }
    std::vector<float> wf(w.ne0);
    specla_op_options opt = {1, SPECLA_CPU_SCALAR, SPECLA_BACKEND_CPU, 0};
    if (specla_op_dequantize(&opt, w.type, row, w.ne0, wf.data()) != SPECLA_OK) {
        fprintf(stderr, "cuda_matmul_check: specla_op_dequantize(%s) failed: %s\n", type_name(w.type), specla_last_error());
        exit(2);
    }
    for (int i = 0; i < w.ne0; i++) out[i] = fabs((double)wf[i]);
}

/* scale[b][o] = sum_i term_magnitude(W[o][i]) |x[b][i]|: the size of the terms both sides round */
static std::vector<double> abs_scale(const specla_tensor &w, const float *x, int n_batch) {
    std::vector<double> s((size_t)n_batch * w.ne1);
#pragma omp parallel
    {
        std::vector<double> mag(w.ne0);
#pragma omp for schedule(static)
        for (int o = 0; o < w.ne1; o++) {
            term_magnitudes(w, o, mag.data());
            for (int b = 0; b < n_batch; b++) {
                double acc = 0;
                const float *xr = x + (size_t)b * w.ne0;
                for (int i = 0; i < w.ne0; i++) acc += mag[i] * fabs((double)xr[i]);
                s[(size_t)b * w.ne1 + o] = acc;
            }
        }
    }
    return s;
}

/* ---- the host model of the kernels --------------------------------------------------------------- */
struct HostActs {
    std::vector<int8_t> codes;
    std::vector<float> scales;
    std::vector<int16_t> bsums;
    std::vector<uint8_t> minops; /* Q8_K: mm_min_operands per block */
};

static HostActs host_quantize(int kind, const float *x, int n_batch, int n) {
    HostActs a;
    const int unit = kind == MM_ACT_Q8_K ? 256 : 32;
    a.codes.resize((size_t)n_batch * n);
    a.scales.resize((size_t)n_batch * (n / unit));
    a.bsums.resize((size_t)n_batch * (n / 16));
    a.minops.resize(kind == MM_ACT_Q8_K ? (size_t)n_batch * (n / 256) * 16 : 0);
    for (int b = 0; b < n_batch; b++)
        for (int k = 0; k < n / unit; k++) {
            const size_t e = (size_t)b * n + (size_t)k * unit, blk = (size_t)b * (n / unit) + k;
            if (kind == MM_ACT_Q8_K) {
                mm_quantize_q8_k_block(x + e, a.codes.data() + e, &a.scales[blk], a.bsums.data() + blk * 16);
                mm_min_operands(a.bsums.data() + blk * 16, a.minops.data() + blk * 16);
            } else
                mm_quantize_q8_0_block(x + e, a.codes.data() + e, &a.scales[blk]);
        }
    return a;
}

template <int TYPE>
static float host_chunk(const uint8_t *prep, const mm_plan &p, int rg, int lane, int c, const mm_acts &act, int n, int b) {
    uint32_t w[MM_MAX_WORDS];
    float acc = 0.0f;
    const int k_end = std::min(p.n_blocks, (c + 1) * p.chunk_blocks);
    for (int k = c * p.chunk_blocks; k < k_end; k++) {
        const uint8_t *slot = prep + mm_slot_offset(TYPE, p.n_blocks, rg, k);
        for (int q = 0; q < mm_pieces(TYPE); q++) memcpy(w + 4 * q, slot + ((size_t)q * MM_GROUP_ROWS + lane) * 16, 16);
        acc = mm_block_step<TYPE>(w, mm_load_side(TYPE, slot, lane), act, n, b, k, acc);
    }
    return acc;
}

/* y[n_batch][ne1] in the kernels' order: chunk partial sums, then added in chunk order. */
static void host_model(int32_t type, const uint8_t *prep, int ne0, int ne1, const float *x, int n_batch, float *y) {
    const mm_plan p = mm_plan_for(type, ne0, ne1);
    const int kind = mm_act_kind(type);
    HostActs a;
    if (kind != MM_ACT_FLOAT) a = host_quantize(kind, x, n_batch, ne0);
    mm_acts act;
    act.x = x, act.codes = a.codes.data(), act.scales = a.scales.data(), act.bsums = a.bsums.data();
    act.minops = a.minops.data();
#pragma omp parallel for schedule(dynamic)
    for (int o = 0; o < ne1; o++) {
        const int rg = o / MM_GROUP_ROWS, lane = o % MM_GROUP_ROWS;
        for (int b = 0; b < n_batch; b++) {
            float s = 0.0f;
            for (int c = 0; c < p.n_chunks; c++) {
                float part = 0.0f;
                switch (type) {
                case SPECLA_TYPE_F32: part = host_chunk<SPECLA_TYPE_F32>(prep, p, rg, lane, c, act, ne0, b); break;
                case SPECLA_TYPE_F16: part = host_chunk<SPECLA_TYPE_F16>(prep, p, rg, lane, c, act, ne0, b); break;
                case SPECLA_TYPE_BF16: part = host_chunk<SPECLA_TYPE_BF16>(prep, p, rg, lane, c, act, ne0, b); break;
                case SPECLA_TYPE_Q8_0: part = host_chunk<SPECLA_TYPE_Q8_0>(prep, p, rg, lane, c, act, ne0, b); break;
                case SPECLA_TYPE_Q4_0: part = host_chunk<SPECLA_TYPE_Q4_0>(prep, p, rg, lane, c, act, ne0, b); break;
                case SPECLA_TYPE_Q5_0: part = host_chunk<SPECLA_TYPE_Q5_0>(prep, p, rg, lane, c, act, ne0, b); break;
                case SPECLA_TYPE_Q4_K: part = host_chunk<SPECLA_TYPE_Q4_K>(prep, p, rg, lane, c, act, ne0, b); break;
                case SPECLA_TYPE_Q5_K: part = host_chunk<SPECLA_TYPE_Q5_K>(prep, p, rg, lane, c, act, ne0, b); break;
                case SPECLA_TYPE_Q6_K: part = host_chunk<SPECLA_TYPE_Q6_K>(prep, p, rg, lane, c, act, ne0, b); break;
                default: break;
                }
                s = c == 0 ? part : mm_add(s, part);
            }
            y[(size_t)b * ne1 + o] = s;
        }
    }
}

/* ---- the host model of the F16/BF16 tensor-core order (matmul_float_tc.cuh) ------------------------ */
struct HostSplit {
    std::vector<uint16_t> split; /* [term][n_batch][n] */
    std::vector<float> inv_scale;
};

/* The activation terms as mm_split_kernel makes them (the same per-element code, mm_split_element). */
static HostSplit host_split(int32_t type, const float *x, int n_batch, int n) {
    HostSplit h;
    h.split.assign((size_t)MM_FTC_MAX_TERMS * n_batch * n, 0);
    h.inv_scale.resize(n_batch);
    const int terms = type == SPECLA_TYPE_BF16 ? 3 : 2;
    for (int b = 0; b < n_batch; b++) {
        const float *xb = x + (size_t)b * n;
        float amax = 0.0f;
        int finite = 1;
        for (int i = 0; i < n; i++) finite &= mm_isfinite(xb[i]), amax = fmaxf(amax, fabsf(xb[i]));
        const int e = type == SPECLA_TYPE_F16 && finite ? mm_split_exponent(amax) : 0;
        h.inv_scale[b] = mm_pow2(-e);
        for (int i = 0; i < n; i++) {
            uint16_t t[MM_FTC_MAX_TERMS];
            if (type == SPECLA_TYPE_F16) mm_split_element<SPECLA_TYPE_F16>(xb[i], mm_pow2(e), finite, t);
            else mm_split_element<SPECLA_TYPE_BF16>(xb[i], mm_pow2(e), finite, t);
            for (int j = 0; j < terms; j++) h.split[((size_t)j * n_batch + b) * n + i] = t[j];
        }
    }
    return h;
}

/* Element of a 32-element block that k-slot `slot` (0..15) of half h holds (the header's mapping). */
static int ftc_element(int h, int slot) {
    const int t = (slot & 7) / 2, j = slot & 1;
    return 8 * t + 4 * h + (slot >= 8 ? 2 : 0) + j;
}

/* y[n_batch][ne1] in the order matmul_float_tc.cuh documents, written directly (no warp): per chunk
 * and (row, token) one accumulator; per block, half h, term lo, (mid,) hi: the MMA emulated as 16
 * sequential fp32 fmas in k-slot order; F16 partials times 2^-e; chunks added in chunk order. */
static void host_ftc_model(int32_t type, const uint8_t *prep, int ne0, int ne1, const float *x, int n_batch, float *y) {
    const mm_plan p = mm_plan_for(type, ne0, ne1);
    const HostSplit hs = host_split(type, x, n_batch, ne0);
    const int terms = type == SPECLA_TYPE_BF16 ? 3 : 2, bf16 = type == SPECLA_TYPE_BF16;
#pragma omp parallel for schedule(dynamic)
    for (int o = 0; o < ne1; o++) {
        const int rg = o / MM_GROUP_ROWS, lane = o % MM_GROUP_ROWS;
        std::vector<float> wrow(ne0);
        for (int k = 0; k < p.n_blocks; k++) {
            const uint8_t *slot = prep + mm_slot_offset(type, p.n_blocks, rg, k);
            for (int i = 0; i < 32; i++) {
                uint16_t v;
                memcpy(&v, slot + ((size_t)(i / 8) * MM_GROUP_ROWS + lane) * 16 + 2 * (i % 8), 2);
                wrow[32 * k + i] = bf16 ? mm_bits_f32((uint32_t)v << 16) : half_to_float(v);
            }
        }
        for (int b = 0; b < n_batch; b++) {
            float s = 0.0f;
            for (int c = 0; c < p.n_chunks; c++) {
                float acc = 0.0f;
                const int k_end = std::min(p.n_blocks, (c + 1) * p.chunk_blocks);
                for (int k = c * p.chunk_blocks; k < k_end; k++)
                    for (int h = 0; h < 2; h++)
                        for (int j = terms - 1; j >= 0; j--) {
                            const uint16_t *tb = hs.split.data() + ((size_t)j * n_batch + b) * ne0 + 32 * k;
                            for (int slot = 0; slot < 16; slot++) {
                                const int e = ftc_element(h, slot);
                                const float xv = bf16 ? mm_bits_f32((uint32_t)tb[e] << 16) : half_to_float(tb[e]);
                                acc = mm_fma(wrow[32 * k + e], xv, acc);
                            }
                        }
                if (type == SPECLA_TYPE_F16) acc = mm_mul(acc, hs.inv_scale[b]);
                s = c == 0 ? acc : mm_add(s, acc);
            }
            y[(size_t)b * ne1 + o] = s;
        }
    }
}

/* Whether the GPU runs `type` on the F16/BF16 tensor-core path in kernel choice `mode`. */
static bool float_tc_path(int32_t type, int mode) {
    return (type == SPECLA_TYPE_F16 || type == SPECLA_TYPE_BF16) && mode != CUDA_MATMUL_TC_OFF;
}

/* ---- checks ------------------------------------------------------------------------------------- */
static int g_failures = 0;
static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stdout, "FAIL ");
    vfprintf(stdout, fmt, ap);
    fprintf(stdout, "\n");
    va_end(ap);
    g_failures++;
}

/* ---- the tensor-core kernel's per-lane code, emulated on 32 host threads -------------------------- */
/* mm_mma_unit (matmul_mma.cuh) runs here as host code, one thread per lane; mm_mma_k16 meets its 31
 * partners at a barrier and computes its C share from all lanes' fragments with the PTX layout of
 * mma.m16n8k16 .s8 (A: lane (g, t) holds rows g and g + 8, k 4t..4t+3; B: k 4t..4t+3 of column g;
 * C: rows g, g + 8 x columns 2t, 2t + 1). This checks the kernel's unpacking, scales, fragment
 * indices and stores against the host model bit for bit, before any device run. */
struct MmaEmulation {
    std::barrier<> *barrier = nullptr;
    uint32_t in[32][3];
};
static MmaEmulation g_mma;
/* --self-test: the emulated m16n8k16 (1) or m16n8k32 (2) swaps the rows g and g + 8 */
static int g_mma_fault = 0;

void mm_mma_k16_emulated(int32_t c[4], uint32_t a0, uint32_t a1, uint32_t b0, int lane, bool b_unsigned) {
    g_mma.in[lane][0] = a0, g_mma.in[lane][1] = a1, g_mma.in[lane][2] = b0;
    g_mma.barrier->arrive_and_wait();
    const int g = lane >> 2, t = lane & 3;
    auto dot = [b_unsigned](int32_t a, uint32_t b, int32_t acc) {
        return b_unsigned ? mm_dot4_us(b, a, acc) : mm_dot4(a, (int32_t)b, acc);
    };
    for (int tt = 0; tt < 4; tt++) {
        int32_t a_row_g = (int32_t)g_mma.in[4 * g + tt][0], a_row_g8 = (int32_t)g_mma.in[4 * g + tt][1];
        if (g_mma_fault == 1) std::swap(a_row_g, a_row_g8);
        const uint32_t b_col0 = g_mma.in[4 * (2 * t) + tt][2], b_col1 = g_mma.in[4 * (2 * t + 1) + tt][2];
        c[0] = dot(a_row_g, b_col0, c[0]);
        c[1] = dot(a_row_g, b_col1, c[1]);
        c[2] = dot(a_row_g8, b_col0, c[2]);
        c[3] = dot(a_row_g8, b_col1, c[3]);
    }
    g_mma.barrier->arrive_and_wait(); /* nobody overwrites `in` before all have read it */
}

/* m16n8k32 .s8 with the PTX layout (A: lane (g, t) holds row g k 4t..4t+3, row g + 8 the same k, row g
 * k 16+4t.., row g + 8 k 16+4t..; B: k 4t..4t+3 and k 16+4t.. of column g; C as k16), computed from
 * the 32 lanes' registers on its own (not through the k16 emulation). */
static uint32_t g_mma32_in[32][6];
void mm_mma_k32_emulated(int32_t c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1,
                         int lane) {
    const uint32_t in[6] = {a0, a1, a2, a3, b0, b1};
    memcpy(g_mma32_in[lane], in, sizeof in);
    g_mma.barrier->arrive_and_wait();
    const int g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; i++) {
        const int row = (i >> 1) ? g + 8 : g, col = 2 * t + (i & 1);
        int32_t acc = c[i];
        for (int k = 0; k < 32; k++) {
            /* A element (row, k): lane 4 (row % 8) + (k % 16) / 4, register (k / 16) * 2 + row / 8, byte k % 4 */
            const uint32_t *al = g_mma32_in[4 * (row % 8) + (k % 16) / 4];
            int ar = (k / 16) * 2 + row / 8;
            if (g_mma_fault == 2) ar ^= 1; /* --self-test: rows g and g + 8 swapped */
            const int8_t av = (int8_t)(al[ar] >> (8 * (k % 4)));
            /* B element (k, col): lane 4 col + (k % 16) / 4, register 4 + k / 16, byte k % 4 */
            const int8_t bv = (int8_t)(g_mma32_in[4 * col + (k % 16) / 4][4 + k / 16] >> (8 * (k % 4)));
            acc += (int32_t)av * (int32_t)bv;
        }
        c[i] = acc;
    }
    g_mma.barrier->arrive_and_wait();
}
void mm_cta_sync_emulated(void) { g_mma.barrier->arrive_and_wait(); }

/* m16n8k16 with f16/bf16 operands and fp32 C, the PTX layout (A: a0 row g k 2t..2t+1, a1 row g+8 the
 * same k, a2 row g k 2t+8.., a3 row g+8 k 2t+8..; B: b0 k 2t..2t+1, b1 k 2t+8.. of column g; C as the
 * s8 one), each C element the 16 products added one by one in k order with fp32 fmas. The hardware
 * adds them in its own way: this defines the host model's order, not the device's bits. */
static uint32_t g_ftc_in[32][6];
void mm_ftc_mma_emulated(float c[4], const uint32_t a[4], const uint32_t b[2], int bf16, int lane) {
    const uint32_t in[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
    memcpy(g_ftc_in[lane], in, sizeof in);
    g_mma.barrier->arrive_and_wait();
    const int g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; i++) {
        const int row = (i >> 1) ? g + 8 : g, col = 2 * t + (i & 1);
        float acc = c[i];
        for (int k = 0; k < 16; k++) {
            int ar = 2 * (k / 8) + row / 8; /* a0 / a1 for k < 8, a2 / a3 above */
            if (g_mma_fault == 3) ar ^= 1;  /* --self-test: rows g and g + 8 swapped */
            const uint32_t av = g_ftc_in[4 * (row % 8) + (k % 8) / 2][ar];
            const uint32_t bv = g_ftc_in[4 * col + (k % 8) / 2][4 + k / 8];
            acc = mm_fma(mm_ftc_value(av, k & 1, bf16), mm_ftc_value(bv, k & 1, bf16), acc);
        }
        c[i] = acc;
    }
    g_mma.barrier->arrive_and_wait();
}

/* One warp on 32 host threads that meet at the emulated MMAs' barrier: lane `lane` runs unit(u, lane)
 * for every unit u of the launch, in order (a per-warp kernel's units, one warp after another). */
template <class Unit> static void emulate_warp(const mm_launch_args &args, Unit unit) {
    std::barrier<> barrier(32);
    g_mma.barrier = &barrier;
    std::vector<std::thread> lanes;
    for (int lane = 0; lane < 32; lane++)
        lanes.emplace_back([&args, &unit, lane] {
            for (int u = 0; u < args.n_units; u++) unit(u, lane);
        });
    for (auto &th : lanes) th.join();
    g_mma.barrier = nullptr;
}

template <int TYPE, int NTILES>
static void emulate_units(const mm_launch_args &args) {
    emulate_warp(args, [&args](int u, int lane) { mm_mma_unit<TYPE, NTILES>(args, u, lane); });
}

template <int TYPE>
static void emulate_dispatch(const mm_launch_args &args) { /* the tile count matmul.cu picks */
    switch (mm_mma_tiles<TYPE>(args.n_batch)) {
    case 1: emulate_units<TYPE, 1>(args); break;
    case 2: emulate_units<TYPE, 2>(args); break;
    case 3: emulate_units<TYPE, mm_mma_traits<TYPE>::max_tiles < 3 ? 1 : 3>(args); break;
    default: emulate_units<TYPE, mm_mma_traits<TYPE>::max_tiles < 4 ? 1 : 4>(args); break;
    }
}

/* The split-K sum of output (token b, row o) as the order defines it: p_0, then + p_1, ... over the
 * chunks of partials[n_batch][n_chunks][rows_padded]. */
static float chunk_order_sum(const float *partials, int n_chunks, int64_t rows_padded, int b, int o) {
    const float *q = partials + (size_t)b * n_chunks * rows_padded + o;
    float s = q[0];
    for (int c = 1; c < n_chunks; c++) s = mm_add(s, q[(size_t)c * rows_padded]);
    return s;
}

/* One emulated matmul call of one matrix: its launch arguments (activations quantized on the host,
 * partial sums in a host buffer), run(args) for the kernel's code, then the split-K sums added in
 * chunk order as mm_finish_unit adds them. */
template <class Run>
static void emulate_matmul(int32_t type, const uint8_t *prep, int ne0, int ne1, const float *x, int n_batch, float *y,
                           Run run) {
    const mm_plan p = mm_plan_for(type, ne0, ne1);
    const HostActs a = host_quantize(mm_act_kind(type), x, n_batch, ne0);
    const int64_t rows_padded = (int64_t)p.row_groups * MM_GROUP_ROWS;
    std::vector<float> partials((size_t)n_batch * p.n_chunks * rows_padded, NAN);
    mm_launch_args args;
    memset(&args, 0, sizeof args);
    mm_mat_args &m = args.mat[0];
    m.w = prep, m.y = y, m.partials = partials.data(), m.counters = nullptr;
    m.ne1 = ne1, m.n_blocks = p.n_blocks, m.row_groups = p.row_groups, m.chunk_blocks = p.chunk_blocks;
    m.n_chunks = p.n_chunks, m.unit_begin = 0;
    args.n_mats = 1, args.n_units = p.row_groups * p.n_chunks, args.n_batch = n_batch, args.n = ne0;
    args.act.x = x, args.act.codes = a.codes.data(), args.act.scales = a.scales.data(), args.act.bsums = a.bsums.data();
    args.act.minops = a.minops.data();
    run(args, p);
    if (p.n_chunks > 1)
        for (int b = 0; b < n_batch; b++)
            for (int o = 0; o < ne1; o++) y[(size_t)b * ne1 + o] = chunk_order_sum(partials.data(), p.n_chunks, rows_padded, b, o);
}

/* y[n_batch][ne1] through the per-warp tensor-core kernel's code (emulated). */
static void emulate_mma_matmul(int32_t type, const uint8_t *prep, int ne0, int ne1, const float *x, int n_batch,
                               float *y) {
    emulate_matmul(type, prep, ne0, ne1, x, n_batch, y, [type](mm_launch_args &args, const mm_plan &) {
        switch (type) {
        case SPECLA_TYPE_Q8_0: emulate_dispatch<SPECLA_TYPE_Q8_0>(args); break;
        case SPECLA_TYPE_Q4_0: emulate_dispatch<SPECLA_TYPE_Q4_0>(args); break;
        case SPECLA_TYPE_Q5_0: emulate_dispatch<SPECLA_TYPE_Q5_0>(args); break;
        case SPECLA_TYPE_Q4_K: emulate_dispatch<SPECLA_TYPE_Q4_K>(args); break;
        case SPECLA_TYPE_Q6_K: emulate_dispatch<SPECLA_TYPE_Q6_K>(args); break;
        default: fprintf(stderr, "cuda_matmul_check: no tensor-core kernel for %s\n", type_name(type)), exit(2);
        }
    });
}

/* The staged kernel's code (matmul_tile.cuh) on 32 host threads: every CTA's 4 warps one after the
 * other, each with its own staging (nthreads 32), then the split-K sums in chunk order. */
template <int TYPE, int NT>
static void emulate_tile_ctas(const mm_launch_args &args) {
    std::barrier<> barrier(32);
    g_mma.barrier = &barrier;
    std::vector<uint8_t> smem(2 * mm_tile_buf_bytes<TYPE>(8 * NT) + 16);
    uint8_t *buf = smem.data() + (16 - (uintptr_t)smem.data() % 16) % 16;
    std::vector<std::thread> lanes;
    for (int lane = 0; lane < 32; lane++)
        lanes.emplace_back([&args, lane, buf] {
            for (int cta = 0; cta < args.n_ctas; cta++)
                for (int warp = 0; warp < 4; warp++) mm_tile_cta<TYPE, NT, 32>(args, cta, warp, lane, lane, buf);
        });
    for (auto &th : lanes) th.join();
    g_mma.barrier = nullptr;
}

template <int TYPE>
static void emulate_tile_dispatch(const mm_launch_args &args) { /* the tile count matmul.cu picks */
    switch (mm_tile_tiles<TYPE>(args.n_batch)) {
    case 1: emulate_tile_ctas<TYPE, 1>(args); break;
    case 2: emulate_tile_ctas<TYPE, 2>(args); break;
    case 3: emulate_tile_ctas<TYPE, mm_tile_traits<TYPE>::max_tiles < 3 ? 1 : 3>(args); break;
    default: emulate_tile_ctas<TYPE, mm_tile_traits<TYPE>::max_tiles < 4 ? 1 : 4>(args); break;
    }
}

static void emulate_tile_matmul(int32_t type, const uint8_t *prep, int ne0, int ne1, const float *x, int n_batch,
                                float *y) {
    emulate_matmul(type, prep, ne0, ne1, x, n_batch, y, [type](mm_launch_args &args, const mm_plan &p) {
        args.mat[0].cta_begin = 0;
        args.n_ctas = mm_tile_ctas(p.row_groups, p.n_chunks);
        switch (type) {
        case SPECLA_TYPE_Q4_K: emulate_tile_dispatch<SPECLA_TYPE_Q4_K>(args); break;
        case SPECLA_TYPE_Q5_K: emulate_tile_dispatch<SPECLA_TYPE_Q5_K>(args); break;
        case SPECLA_TYPE_Q6_K: emulate_tile_dispatch<SPECLA_TYPE_Q6_K>(args); break;
        case SPECLA_TYPE_Q8_0: emulate_tile_dispatch<SPECLA_TYPE_Q8_0>(args); break;
        default: fprintf(stderr, "cuda_matmul_check: no staged tensor-core kernel for %s\n", type_name(type)), exit(2);
        }
    });
}

/* Q8_0 fragments hold 8 blocks; those past the step's nv are never used: zeroed before a comparison */
template <int TYPE> static void clear_unused_blocks(mm_tile_frag<TYPE> &f, int nv) {
    if constexpr (TYPE == SPECLA_TYPE_Q8_0)
        for (int r = 0; r < 2; r++)
            for (int j = nv; j < 8; j++) f.q[r][j] = make_uint2(0u, 0u), f.d[r][j] = 0;
    else (void)f, (void)nv;
}

/* The staged kernel's fragment loads, from the prepared weight (the register form) and from a
 * shared-memory stage holding a CTA's two row groups' slots of the step at block k (the bulk form,
 * mm_tile_load<TYPE, true>; the stage past the step's slots holds stale bytes, 0xA5 here): the same
 * fragment for every thread of every CTA and step, bytes compared. Q8_0's steps are those of a chunk
 * of `chunk` blocks (a short last one included). An odd row-group count puts a pair's second slot
 * past the weight: that warp is inactive in the kernels and skipped here. */
template <int TYPE> static void check_tile_stage_loads_of(int ne0, int ne1, uint64_t seed, int chunk = 1) {
    Rng r(seed);
    const std::vector<uint8_t> w = make_weight(TYPE, ne0, ne1, r);
    const specla_tensor hw = host_tensor(w, TYPE, ne0, ne1);
    std::vector<uint8_t> prep(cuda_matmul_prepared_bytes(TYPE, ne0, ne1));
    if (cuda_matmul_repack_host(&hw, prep.data()) != 0) fail("cannot prepare %s", type_name(TYPE));
    const mm_plan p = mm_plan_for(TYPE, ne0, ne1);
    const int slot_bytes = MM_GROUP_ROWS * mm_traits<TYPE>::unit_bytes, step_bytes = mm_tile_step_bytes<TYPE>();
    std::vector<uint8_t> stage(2 * (size_t)step_bytes);
    const int before = g_failures;
    for (int pair = 0; 2 * pair < p.row_groups && g_failures == before; pair++)
        for (int k_begin = 0; k_begin < p.n_blocks; k_begin += chunk)
            for (int k = k_begin; k < std::min(k_begin + chunk, p.n_blocks) && g_failures == before;
                 k += mm_tile_traits<TYPE>::step_blocks) {
                const int nv = mm_tile_step_blocks<TYPE>(k, std::min(k_begin + chunk, p.n_blocks));
                std::fill(stage.begin(), stage.end(), 0xA5);
                for (int i = 0; i < 2 && 2 * pair + i < p.row_groups; i++)
                    memcpy(stage.data() + (size_t)i * step_bytes, prep.data() + mm_slot_offset(TYPE, p.n_blocks, 2 * pair + i, k),
                           (size_t)nv * slot_bytes);
                for (int warp = 0; warp < 4; warp++) {
                    const int rg = 2 * pair + (warp >> 1), half = warp & 1;
                    if (rg >= p.row_groups) continue;
                    for (int lane = 0; lane < 32; lane++) {
                        const int g = lane >> 2, t = lane & 3;
                        mm_tile_frag<TYPE> from_global, from_stage;
                        memset(&from_global, 0, sizeof from_global), memset(&from_stage, 0, sizeof from_stage);
                        mm_tile_load<TYPE>(from_global,
                                           mm_tile_wptr_for<TYPE>(prep.data() + mm_slot_offset(TYPE, p.n_blocks, rg, 0), half, g, t),
                                           k, nv);
                        mm_tile_load<TYPE, true>(
                            from_stage, mm_tile_wptr_for<TYPE>(stage.data() + (size_t)(warp >> 1) * step_bytes, half, g, t), 0,
                            nv);
                        clear_unused_blocks(from_global, nv), clear_unused_blocks(from_stage, nv);
                        if (memcmp(&from_global, &from_stage, sizeof from_global) != 0) {
                            fail("%s %dx%d: the staged fragment of row group %d step %d (%d blocks) warp %d lane %d differs "
                                 "between global memory and the shared-memory stage", type_name(TYPE), ne0, ne1, rg, k, nv,
                                 warp, lane);
                            break;
                        }
                    }
                }
            }
    printf("  %-5s ne0 %5d ne1 %4d: fragments from the weight and from a stage %s\n", type_name(TYPE), ne0, ne1,
           g_failures == before ? "equal" : "FAILED");
}
static void check_tile_stage_loads() {
    printf("staged kernel fragments, register form against bulk form (matmul_tile.cuh):\n");
    check_tile_stage_loads_of<SPECLA_TYPE_Q4_K>(5 * 256, 70, 7100); /* 3 row groups: an odd last pair */
    check_tile_stage_loads_of<SPECLA_TYPE_Q5_K>(5 * 256, 70, 7102);
    check_tile_stage_loads_of<SPECLA_TYPE_Q6_K>(5 * 256, 70, 7101);
    /* chunks of 19 blocks: two full steps of 8 and one of 3 */
    check_tile_stage_loads_of<SPECLA_TYPE_Q8_0>(40 * 32, 70, 7103, 19);
}

/* The split-K finish (matmul_launch.h's mm_finish_rows, as the per-warp kernels and the staged CTA
 * call it) against the chunk-order sum written out here, bit for bit, on random partial sums spread
 * over 2^-20..2^20 (so that another order rounds differently): every thread of every row group (32
 * threads, 32 rows) or row-group pair (128 threads, 64 rows) in turn, outputs poisoned first, rows
 * past ne1 never written. `swap_chunks` (the self-test) hands the finish the partials with chunks 1
 * and 2 exchanged, the sum of a finish that adds out of order. */
static void check_finish_rows(bool swap_chunks = false) {
    printf("split-K finish (mm_finish_rows) against the chunk-order sum:\n");
    static const int kChunks[] = {2, 3, 7, 54}, kTokens[] = {1, 5, 23, 64}, kRows[] = {1024, 990, 70};
    Rng r(7300);
    for (int per_cta = 0; per_cta < 2; per_cta++) {
        const int nthreads = per_cta ? 128 : 32, nrows = per_cta ? 2 * MM_GROUP_ROWS : MM_GROUP_ROWS;
        int bad = 0, cases = 0;
        for (int n_chunks : kChunks)
            for (int n_batch : kTokens)
                for (int ne1 : kRows) {
                    const int row_groups = (ne1 + MM_GROUP_ROWS - 1) / MM_GROUP_ROWS;
                    const int64_t rows_padded = (int64_t)row_groups * MM_GROUP_ROWS;
                    std::vector<float> partials((size_t)n_batch * n_chunks * rows_padded);
                    for (float &v : partials) v = ldexpf(r.uniform(), (int)(r.next() % 41) - 20);
                    std::vector<float> given = partials;
                    if (swap_chunks && n_chunks > 2)
                        for (int b = 0; b < n_batch; b++)
                            for (int64_t o = 0; o < rows_padded; o++)
                                std::swap(given[((size_t)b * n_chunks + 1) * rows_padded + o],
                                          given[((size_t)b * n_chunks + 2) * rows_padded + o]);
                    std::vector<float> y((size_t)n_batch * ne1 + 1, NAN); /* one more: a guard past the end */
                    mm_mat_args M;
                    memset(&M, 0, sizeof M);
                    M.y = y.data(), M.partials = given.data(), M.ne1 = ne1, M.row_groups = row_groups;
                    M.n_chunks = n_chunks;
                    for (int64_t row0 = 0; row0 < rows_padded; row0 += nrows)
                        for (int tid = 0; tid < nthreads; tid++)
                            mm_finish_rows<16>(M, (int)row0, nrows, n_batch, tid, nthreads);
                    cases++;
                    for (int b = 0; b < n_batch; b++)
                        for (int o = 0; o < ne1; o++) {
                            const float s = chunk_order_sum(partials.data(), n_chunks, rows_padded, b, o);
                            const float got = y[(size_t)b * ne1 + o];
                            if (memcmp(&got, &s, 4) != 0 && bad++ == 0)
                                fail("finish, %d threads over %d rows: %d chunks, %d tokens, ne1 %d: y[%d][%d] = %.9g, "
                                     "the chunk-order sum %.9g",
                                     nthreads, nrows, n_chunks, n_batch, ne1, b, o, got, s);
                        }
                    if (!std::isnan(y.back()) && bad++ == 0)
                        fail("finish, %d threads: %d chunks, %d tokens, ne1 %d: wrote past the last output", nthreads,
                             n_chunks, n_batch, ne1);
                }
        printf("  %3d threads, %2d rows each: %d shapes, %s\n", nthreads, nrows, cases,
               bad ? "MISMATCHES" : "equal in bits");
    }
}

/* The emulated tensor-core code against the host model of the dp4a kernel, bit for bit. */
static void check_mma_emulation(bool one_type = false) {
    printf("tensor-core kernel code, emulated on the host, against the host model:\n");
    const int32_t all_types[] = {SPECLA_TYPE_Q8_0, SPECLA_TYPE_Q4_0, SPECLA_TYPE_Q5_0, SPECLA_TYPE_Q4_K, SPECLA_TYPE_Q5_K,
                                 SPECLA_TYPE_Q6_K};
    const std::vector<int32_t> types = one_type ? std::vector<int32_t>{SPECLA_TYPE_Q4_K}
                                                : std::vector<int32_t>(all_types, all_types + 6);
    uint64_t seed = 5000;
    for (int32_t type : types) {
        const int unit = mm_unit_elements(type);
        /* the last shape's plan has chunks of 2 blocks (34 chunks x 31 row groups): the kernels'
         * prefetch and double buffering across blocks; only 5 and 23 tokens there (it is the slow one) */
        /* Q8_0's staged steps of 8 blocks need chunks longer than 8, so shapes of 20M+ weights under its
         * plan: 110 x 200 row groups is cut into chunks of 10 blocks (a full step and one of 2) */
        const int shapes[][2] = {{unit, 7}, {4 * unit, 33}, {2 * unit, 100}, {5 * unit, 70}, {68 * unit, 990},
                                 {110 * unit, 6400}};
        for (const auto &sh : shapes) {
            const int ne0 = sh[0], ne1 = sh[1];
            const bool slow = ne1 >= 990;
            if (ne1 == 6400 && type != SPECLA_TYPE_Q8_0) continue;
            if (one_type && slow) continue; /* the self-test: the small shapes catch its fault */
            /* one token: the staged kernel only (cuda_matmul_staged_decode's one-token calls) */
            const std::vector<int> batches = slow ? std::vector<int>{1, 5, 23} : std::vector<int>{1, 2, 5, 8, 17, 23, 25, 64};
            Rng r(seed++);
            const std::vector<uint8_t> w = make_weight(type, ne0, ne1, r);
            const std::vector<float> x = make_activations(ne0, r);
            const specla_tensor hw = host_tensor(w, type, ne0, ne1);
            std::vector<uint8_t> prep(cuda_matmul_prepared_bytes(type, ne0, ne1));
            if (cuda_matmul_repack_host(&hw, prep.data()) != 0) fail("cannot prepare %s", type_name(type));
            std::vector<float> model((size_t)MAX_BATCH * ne1), y((size_t)MAX_BATCH * ne1);
            host_model(type, prep.data(), ne0, ne1, x.data(), MAX_BATCH, model.data());
            const int before = g_failures;
            const bool staged = type == SPECLA_TYPE_Q4_K || type == SPECLA_TYPE_Q5_K || type == SPECLA_TYPE_Q6_K ||
                                type == SPECLA_TYPE_Q8_0;
            const bool per_warp = type != SPECLA_TYPE_Q5_K; /* Q5_K has no per-warp tensor-core step */
            for (int kernel = per_warp ? 0 : 1; kernel < (staged ? 2 : 1); kernel++)
                for (int n_batch : batches) {
                    if (kernel == 0 && n_batch == 1) continue;
                    std::fill(y.begin(), y.end(), NAN);
                    if (kernel == 0) emulate_mma_matmul(type, prep.data(), ne0, ne1, x.data(), n_batch, y.data());
                    else emulate_tile_matmul(type, prep.data(), ne0, ne1, x.data(), n_batch, y.data());
                    for (size_t i = 0; i < (size_t)n_batch * ne1; i++)
                        if (memcmp(&y[i], &model[i], 4) != 0) {
                            fail("%s %dx%d n_batch %d: emulated %s tensor-core y[%zu][%zu] = %.9g, host model %.9g",
                                 type_name(type), ne0, ne1, n_batch, kernel ? "staged" : "per-warp", i / ne1, i % ne1,
                                 y[i], model[i]);
                            break;
                        }
                }
            const mm_plan p = mm_plan_for(type, ne0, ne1);
            printf("  %-5s ne0 %5d ne1 %4d (chunks %2d x %d blocks)  n_batch %s, %s: %s\n", type_name(type), ne0, ne1,
                   p.n_chunks, p.chunk_blocks, slow ? "{1,5,23}" : "{1,2,5,8,17,23,25,64}",
                   !per_warp ? "staged kernel" : staged ? "per-warp and staged kernels" : "per-warp kernel",
                   g_failures == before ? "bits equal" : "FAILED");
            fflush(stdout);
        }
    }
}

/* The F16/BF16 tensor-core kernel's per-lane code (matmul_float_tc.cuh) on 32 host threads with the
 * emulated f16/bf16 MMA, its activation terms made by host_split, the split-K sums in chunk order. */
template <int TYPE, int NT>
static void emulate_ftc_units(const mm_launch_args &args) {
    emulate_warp(args, [&args](int u, int lane) { mm_ftc_unit<TYPE, NT>(args, u, lane); });
}

template <int TYPE>
static void emulate_ftc_dispatch(const mm_launch_args &args) { /* the tile count matmul.cu picks */
    switch (mm_ftc_tiles(args.n_batch)) {
    case 1: emulate_ftc_units<TYPE, 1>(args); break;
    case 2: emulate_ftc_units<TYPE, 2>(args); break;
    case 3: emulate_ftc_units<TYPE, 3>(args); break;
    default: emulate_ftc_units<TYPE, 4>(args); break;
    }
}

static void emulate_ftc_matmul(int32_t type, const uint8_t *prep, int ne0, int ne1, const float *x, int n_batch,
                               float *y) {
    const HostSplit hs = host_split(type, x, n_batch, ne0);
    emulate_matmul(type, prep, ne0, ne1, x, n_batch, y, [type, &hs](mm_launch_args &args, const mm_plan &) {
        args.act.split = hs.split.data(), args.act.inv_scale = hs.inv_scale.data();
        if (type == SPECLA_TYPE_F16) emulate_ftc_dispatch<SPECLA_TYPE_F16>(args);
        else emulate_ftc_dispatch<SPECLA_TYPE_BF16>(args);
    });
}

/* The emulated F16/BF16 tensor-core code against host_ftc_model, bit for bit (both define the same
 * order with the MMA as sequential fmas: this checks the kernel's fragments, k-slot mapping, token
 * padding, scales and stores). */
static void check_ftc_emulation(bool one_type = false) {
    printf("F16/BF16 tensor-core kernel code, emulated on the host, against its host model:\n");
    uint64_t seed = 7000;
    for (int32_t type : {SPECLA_TYPE_F16, SPECLA_TYPE_BF16}) {
        if (one_type && type == SPECLA_TYPE_BF16) continue;
        /* the last shape: chunks of 2 blocks over 31 row groups (prefetch across load groups) */
        const int shapes[][2] = {{32, 7}, {128, 33}, {64, 100}, {160, 70}, {68 * 32, 990}};
        for (const auto &sh : shapes) {
            const int ne0 = sh[0], ne1 = sh[1];
            if (one_type && ne1 == 990) continue;
            const std::vector<int> batches = ne1 == 990 ? std::vector<int>{1, 23} : std::vector<int>{1, 2, 5, 8, 17, 25, 33, 64};
            Rng r(seed++);
            const std::vector<uint8_t> w = make_weight(type, ne0, ne1, r);
            std::vector<float> x = make_activations(ne0, r);
            for (int i = 0; i < ne0; i++) x[(size_t)4 * ne0 + i] *= 1e6f, x[(size_t)5 * ne0 + i] *= 1e-30f; /* the F16 scale */
            const specla_tensor hw = host_tensor(w, type, ne0, ne1);
            std::vector<uint8_t> prep(cuda_matmul_prepared_bytes(type, ne0, ne1));
            if (cuda_matmul_repack_host(&hw, prep.data()) != 0) fail("cannot prepare %s", type_name(type));
            std::vector<float> model((size_t)MAX_BATCH * ne1), y((size_t)MAX_BATCH * ne1);
            host_ftc_model(type, prep.data(), ne0, ne1, x.data(), MAX_BATCH, model.data());
            const int before = g_failures;
            for (int n_batch : batches) {
                std::fill(y.begin(), y.end(), NAN);
                emulate_ftc_matmul(type, prep.data(), ne0, ne1, x.data(), n_batch, y.data());
                for (size_t i = 0; i < (size_t)n_batch * ne1; i++)
                    if (memcmp(&y[i], &model[i], 4) != 0) {
                        fail("%s %dx%d n_batch %d: emulated tensor-core y[%zu][%zu] = %.9g, its host model %.9g",
                             type_name(type), ne0, ne1, n_batch, i / ne1, i % ne1, y[i], model[i]);
                        break;
                    }
            }
            const mm_plan p = mm_plan_for(type, ne0, ne1);
            printf("  %-5s ne0 %5d ne1 %4d (chunks %2d x %d blocks)  n_batch %s: %s\n", type_name(type), ne0, ne1,
                   p.n_chunks, p.chunk_blocks, ne1 == 990 ? "{1,23}" : "{1,2,5,8,17,25,33,64}",
                   g_failures == before ? "bits equal" : "FAILED");
            fflush(stdout);
        }
    }
}

/* Error of the F16/BF16 tensor-core order (host_ftc_model) and of the fma order (host_model) against
 * the float64 sum, in units of sum_i |w_i x_i|, over activation rows scaled by 2^-100 .. 2^60 (the
 * F16 split's per-token power of two). Prints the figures; fails when the tensor-core order is over
 * the check's bound (error_bound). */
static double error_bound(int32_t type, int ne0);
static void check_ftc_error_vs_float64() {
    printf("F16/BF16 tensor-core order vs float64 (max |y - exact| / sum|w x|; fma order alongside):\n");
    uint64_t seed = 8000;
    for (int32_t type : {SPECLA_TYPE_F16, SPECLA_TYPE_BF16})
        for (int ne0 : {512, 5120, 17408}) {
            if (g_opt.quick && ne0 == 17408) continue;
            const int ne1 = 65, n_batch = 16;
            Rng r(seed++);
            const std::vector<uint8_t> w = make_weight(type, ne0, ne1, r);
            std::vector<float> x = make_activations(ne0, r);
            x.resize((size_t)n_batch * ne0);
            const int exps[] = {-100, -20, 0, 20, 60};
            for (int b = 5; b < n_batch; b++)
                for (int i = 0; i < ne0; i++) x[(size_t)b * ne0 + i] = ldexpf(x[(size_t)b * ne0 + i], exps[b % 5]);
            const specla_tensor hw = host_tensor(w, type, ne0, ne1);
            std::vector<uint8_t> prep(cuda_matmul_prepared_bytes(type, ne0, ne1));
            if (cuda_matmul_repack_host(&hw, prep.data()) != 0) fail("cannot prepare %s", type_name(type));
            std::vector<float> tc((size_t)n_batch * ne1), fm((size_t)n_batch * ne1), wf(ne0);
            host_ftc_model(type, prep.data(), ne0, ne1, x.data(), n_batch, tc.data());
            host_model(type, prep.data(), ne0, ne1, x.data(), n_batch, fm.data());
            double max_tc = 0, max_fma = 0, sum_tc = 0;
            specla_op_options opt = {1, SPECLA_CPU_SCALAR, SPECLA_BACKEND_CPU, 0};
            for (int o = 0; o < ne1; o++) {
                const uint8_t *row = w.data() + (size_t)o * type_row_bytes(type, ne0);
                if (specla_op_dequantize(&opt, type, row, ne0, wf.data()) != SPECLA_OK) fail("dequantize %s", type_name(type));
                for (int b = 0; b < n_batch; b++) {
                    double exact = 0, mag = 0;
                    for (int i = 0; i < ne0; i++) {
                        const double p = (double)wf[i] * (double)x[(size_t)b * ne0 + i];
                        exact += p, mag += fabs(p);
                    }
                    if (mag == 0) continue;
                    const size_t i = (size_t)b * ne1 + o;
                    const double e_tc = fabs(tc[i] - exact) / mag, e_fma = fabs(fm[i] - exact) / mag;
                    max_tc = std::max(max_tc, e_tc), max_fma = std::max(max_fma, e_fma), sum_tc += e_tc;
                }
            }
            const double bound = error_bound(type, ne0);
            const bool ok = max_tc <= bound;
            if (!ok) fail("%s ne0 %d: tensor-core order error %.3g of sum|w x| > bound %.3g", type_name(type), ne0, max_tc, bound);
            printf("  %-5s ne0 %5d ne1 %d n_batch %d (x scaled 2^-100..2^60): tensor-core max %.3g (%.2f u) mean %.3g, "
                   "fma max %.3g (%.2f u); bound %.3g: %s\n",
                   type_name(type), ne0, ne1, n_batch, max_tc, max_tc / ldexp(1.0, -24), sum_tc / (n_batch * ne1), max_fma,
                   max_fma / ldexp(1.0, -24), bound, ok ? "ok" : "FAILED");
            fflush(stdout);
        }
}

/* ---- one matrix under test, on the GPU or in the host model -------------------------------------- */
struct Subject {
    int32_t type;
    int ne0, ne1;
    std::vector<uint8_t> prep_host;
    void *prep_dev = nullptr;
    /* The host model's y for all MAX_BATCH rows: the specification of the GPU's arithmetic (its
     * results do not depend on n_batch), compared bit for bit with the GPU's. */
    float *x_dev = nullptr, *y_dev = nullptr;
    cuda_matmul_workspace ws = {nullptr, 0};
    std::vector<float> host_rows;
    /* F16/BF16: host_ftc_model's y (the tensor-core path's order; the GPU is within a tolerance of it) */
    std::vector<float> tc_rows;

    Subject(int32_t t, int n0, int n1, const std::vector<uint8_t> &gguf, const std::vector<float> &x,
            bool with_host_model = true)
        : type(t), ne0(n0), ne1(n1) {
        specla_tensor hw = host_tensor(gguf, t, n0, n1);
        prep_host.resize(cuda_matmul_prepared_bytes(t, n0, n1));
        if (prep_host.empty() || cuda_matmul_repack_host(&hw, prep_host.data()) != 0) {
            fprintf(stderr, "cuda_matmul_check: cannot prepare %s %dx%d\n", type_name(t), n0, n1);
            exit(2);
        }
        if (with_host_model || g_opt.host_model) {
            host_rows.resize((size_t)MAX_BATCH * n1);
            host_model(t, prep_host.data(), n0, n1, x.data(), MAX_BATCH, host_rows.data());
            if (t == SPECLA_TYPE_F16 || t == SPECLA_TYPE_BF16) {
                tc_rows.resize((size_t)MAX_BATCH * n1);
                host_ftc_model(t, prep_host.data(), n0, n1, x.data(), MAX_BATCH, tc_rows.data());
            }
        }
        if (g_opt.host_model) return;
        CK(cudaMalloc(&prep_dev, prep_host.size()));
        CK(cuda_matmul_prepare_weight(&hw, prep_dev));
        CK(cudaMalloc(&x_dev, x.size() * sizeof(float)));
        CK(cudaMemcpy(x_dev, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
        CK(cudaMalloc(&y_dev, (size_t)MAX_BATCH * n1 * sizeof(float)));
        ws.bytes = cuda_matmul_workspace_bytes(MAX_BATCH, n0);
        CK(cudaMalloc(&ws.data, ws.bytes));
    }
    ~Subject() {
        if (prep_dev) cudaFree(prep_dev), cudaFree(x_dev), cudaFree(y_dev), cudaFree(ws.data);
    }
    specla_tensor dev_tensor() const {
        specla_tensor t;
        memset(&t, 0, sizeof t);
        t.data = prep_dev, t.type = type, t.ne0 = ne0, t.ne1 = ne1;
        t.nbytes = type_row_bytes(type, ne0) * ne1;
        return t;
    }
    /* y[n_batch][ne1] for input rows first_row .. first_row + n_batch - 1, y poisoned first; the host
     * model stands for the GPU's kernel choice `mode` (the F16/BF16 tensor-core order or not) */
    void run(int first_row, int n_batch, float *y, int mode = CUDA_MATMUL_TC_STAGED) {
        const size_t count = (size_t)n_batch * ne1;
        if (g_opt.host_model) {
            for (size_t i = 0; i < count; i++) y[i] = NAN;
            const std::vector<float> &rows = float_tc_path(type, mode) ? tc_rows : host_rows;
            memcpy(y, rows.data() + (size_t)first_row * ne1, count * sizeof(float));
            return;
        }
        CK(cudaMemset(y_dev, 0xff, count * sizeof(float))); /* all-ones words are NaNs */
        const specla_tensor t = dev_tensor();
        CK(cuda_matmul(0, &t, x_dev + (size_t)first_row * ne0, n_batch, y_dev, ws));
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(y, y_dev, count * sizeof(float), cudaMemcpyDeviceToHost));
    }
};

/* The bound of check (3), in units of sum |term| (abs_scale): both sides round every term into float
 * sums, in different orders: the CPU over 8 lanes of n_blocks fmas each plus 3 adds (the float types:
 * one chain of ne0 rounded adds), the GPU over chunks of chunk_blocks fmas plus n_chunks adds (the
 * float types: ne0 fmas plus n_chunks adds). Rounding errors of such chains grow like a random walk,
 * u sqrt(N) with u = 2^-24 and N the longer chain; the bound is 8 u sqrt(N + 4): measured maxima in
 * the host model (the GPU's arithmetic, run here) sit 3.4x to 4.2x below it at worst (Q4_K 5120 x
 * 4101, two versions of the random data) and mostly 5-20x. */
static double error_bound(int32_t type, int ne0) {
    const double chain = mm_act_kind(type) == MM_ACT_FLOAT ? ne0 : (double)ne0 / mm_unit_elements(type);
    return 8.0 * ldexp(1.0, -24) * sqrt(chain + 4.0);
}

/* Fault injection for --self-test: which check to break (0 = none). */
static int g_inject = 0;
enum { INJECT_UNWRITTEN = 1, INJECT_VARIANCE = 2, INJECT_ERROR = 3 };

struct CaseResult {
    double max_err = 0, bound = 0;
    double max_tc_diff = -1; /* F16/BF16: max |gpu - host_ftc_model| / sum|terms| (-1: not run) */
    int n_checked = 0;
};

static CaseResult check_case(int32_t type, int ne0, int ne1, uint64_t seed) {
    CaseResult res;
    Rng r(seed);
    const std::vector<uint8_t> w = make_weight(type, ne0, ne1, r);
    const std::vector<float> x = make_activations(ne0, r);
    const specla_tensor hw = host_tensor(w, type, ne0, ne1);
    std::vector<float> oracle((size_t)MAX_BATCH * ne1);
    oracle_matmul(hw, x.data(), MAX_BATCH, oracle.data()); /* the CPU is batch-invariant: one run serves all */
    const std::vector<double> scale = abs_scale(hw, x.data(), MAX_BATCH);

    const double bound = error_bound(type, ne0);
    res.bound = bound;
    Subject s(type, ne0, ne1, w, x);
    std::vector<float> ref1((size_t)MAX_BATCH * ne1), y((size_t)MAX_BATCH * ne1);
    for (int b = 0; b < MAX_BATCH; b++) s.run(b, 1, ref1.data() + (size_t)b * ne1);
    static const int kModes[3] = {CUDA_MATMUL_TC_STAGED, CUDA_MATMUL_TC_PER_WARP, CUDA_MATMUL_TC_OFF};
    const bool has_staged = type == SPECLA_TYPE_Q4_K || type == SPECLA_TYPE_Q5_K || type == SPECLA_TYPE_Q6_K ||
                            type == SPECLA_TYPE_Q8_0;
    for (int pass = 0; pass < 3 * (int)(sizeof kBatches / sizeof kBatches[0]); pass++) {
        /* every n_batch with each kernel choice (cuda_matmul_set_tensor_cores): the default (the
         * staged tensor-core kernel for Q4_K/Q5_K/Q6_K/Q8_0, the per-warp one for the other 8-bit types, at
         * n_batch >= 2 on sm_80 and later), the per-warp tensor-core kernel, the dp4a kernel only */
        const int n_batch = kBatches[pass / 3];
        const int mode = kModes[pass % 3];
        /* F16/BF16 also with the tensor cores off (the fma path: another order), every n_batch */
        const bool ftc_type = type == SPECLA_TYPE_F16 || type == SPECLA_TYPE_BF16;
        const bool fma_pass = ftc_type && mode == CUDA_MATMUL_TC_OFF;
        /* one token: every mode runs the default's kernel, but where one-token calls take the staged
         * kernel (cuda_matmul_staged_decode: Q8_0) the dp4a-only mode runs the dp4a kernel, checked too */
        const bool one_token_dp4a = n_batch == 1 && mode == CUDA_MATMUL_TC_OFF && !g_opt.host_model &&
                                    cuda_matmul_staged_decode(type);
        if (mode != CUDA_MATMUL_TC_STAGED && !fma_pass && !one_token_dp4a && (n_batch == 1 || mm_act_kind(type) == MM_ACT_FLOAT))
            continue; /* the same kernel */
        if (mode == CUDA_MATMUL_TC_PER_WARP && !has_staged) continue; /* the default already is */
        if (!g_opt.host_model) cuda_matmul_set_tensor_cores(mode);
        s.run(0, n_batch, y.data(), mode);
        if (!g_opt.host_model) cuda_matmul_set_tensor_cores(CUDA_MATMUL_TC_STAGED);
        const char *path = fma_pass ? " (fma path)" : mode == CUDA_MATMUL_TC_OFF ? " (dp4a only)" : mode == CUDA_MATMUL_TC_PER_WARP ? " (per-warp MMA)" : "";
        /* the F16/BF16 tensor-core path: the host model's order with the MMA as sequential fmas, the
         * hardware's accumulation its own, so a tolerance (the oracle's bound) instead of bits */
        const bool tc = float_tc_path(type, mode);
        if (g_inject == INJECT_UNWRITTEN && n_batch == 23) y[(size_t)22 * ne1 + ne1 - 1] = NAN;
        if (g_inject == INJECT_VARIANCE && n_batch == 23) {
            uint32_t bits;
            memcpy(&bits, &y[(size_t)5 * ne1], 4), bits ^= 1u, memcpy(&y[(size_t)5 * ne1], &bits, 4);
        }
        int bad_finite = 0, bad_bits = 0, bad_err = 0, bad_model = 0;
        for (int b = 0; b < n_batch; b++)
            for (int o = 0; o < ne1; o++) {
                const size_t i = (size_t)b * ne1 + o;
                if (!std::isfinite(y[i])) {
                    if (bad_finite++ == 0)
                        fail("%s %dx%d n_batch %d%s: y[%d][%d] = %g not written or not finite", type_name(type), ne0,
                             ne1, n_batch, path, b, o, y[i]);
                    continue;
                }
                if (tc) {
                    const double d = fabs((double)y[i] - (double)s.tc_rows[i]) / (scale[i] > 0 ? scale[i] : 1.0);
                    res.max_tc_diff = std::max(res.max_tc_diff, d);
                    if (d > bound && bad_model++ == 0)
                        fail("%s %dx%d n_batch %d: y[%d][%d] = %.9g but the tensor-core host model gives %.9g: "
                             "%.3g of sum|terms| = %.6g > %.3g",
                             type_name(type), ne0, ne1, n_batch, b, o, y[i], s.tc_rows[i], d, scale[i], bound);
                } else if (memcmp(&y[i], &s.host_rows[i], 4) != 0 && bad_model++ == 0)
                    fail("%s %dx%d n_batch %d%s: y[%d][%d] = %.9g but the host model of the kernels gives %.9g",
                         type_name(type), ne0, ne1, n_batch, path, b, o, y[i], s.host_rows[i]);
                /* ref1 is the default kernel choice's n_batch = 1 run; the fma pass is checked against
                 * the host model's bits above (which do not depend on n_batch) */
                if (!fma_pass && memcmp(&y[i], &ref1[i], 4) != 0 && bad_bits++ == 0)
                    fail("%s %dx%d n_batch %d%s: y[%d][%d] = %.9g but the n_batch = 1 run gave %.9g", type_name(type),
                         ne0, ne1, n_batch, path, b, o, y[i], ref1[i]);
                double got = y[i];
                if (g_inject == INJECT_ERROR && n_batch == 23 && b == 7 && o == 0) got += 1e-4 * scale[i] + 1e-30;
                const double err = fabs(got - (double)oracle[i]) / (scale[i] > 0 ? scale[i] : 1.0);
                if (getenv("CMC_DEBUG") && err > res.max_err)
                    printf("    debug: n_batch %d b %d o %d got %.9g cpu %.9g scale %.6g err %.3g\n", n_batch, b, o, got,
                           oracle[i], scale[i], err);
                res.max_err = std::max(res.max_err, err);
                if (err > bound && bad_err++ == 0)
                    fail("%s %dx%d n_batch %d%s: y[%d][%d] = %.9g, CPU %.9g: error %.3g of sum|terms| = %.6g > %.3g",
                         type_name(type), ne0, ne1, n_batch, path, b, o, got, oracle[i], err, scale[i], bound);
                res.n_checked++;
            }
    }
    return res;
}

/* Group launch: the same bits per matrix as separate calls (GPU only). Five matrices of `type` (more
 * than one launch holds) plus one of another type, all on one input. */
static void check_group(int32_t type, int ne0, uint64_t seed) {
    Rng r(seed);
    const std::vector<float> x = make_activations(ne0, r);
    const int32_t other = mm_act_kind(type) == MM_ACT_Q8_K ? SPECLA_TYPE_Q8_0 : SPECLA_TYPE_Q4_K;
    const bool other_ok = ne0 % mm_unit_elements(other) == 0;
    const int shapes[6] = {33, 48, 4101, 1, 7, 100};
    std::vector<std::vector<uint8_t>> ws;
    std::vector<Subject *> subj;
    const int n_mats = other_ok ? 6 : 5;
    for (int i = 0; i < n_mats; i++) {
        const int32_t t = i == 5 ? other : type;
        ws.push_back(make_weight(t, ne0, shapes[i], r));
        subj.push_back(new Subject(t, ne0, shapes[i], ws.back(), x, false));
    }
    for (int n_batch : {1, 5, 23}) {
        std::vector<specla_tensor> ts(n_mats);
        std::vector<const specla_tensor *> tp(n_mats);
        std::vector<float *> yp(n_mats);
        for (int i = 0; i < n_mats; i++) {
            ts[i] = subj[i]->dev_tensor(), tp[i] = &ts[i];
            CK(cudaMalloc(&yp[i], (size_t)n_batch * shapes[i] * sizeof(float)));
            CK(cudaMemset(yp[i], 0xff, (size_t)n_batch * shapes[i] * sizeof(float)));
        }
        CK(cuda_matmul_group(0, n_mats, tp.data(), subj[0]->x_dev, n_batch, yp.data(), subj[0]->ws));
        CK(cudaDeviceSynchronize());
        for (int i = 0; i < n_mats; i++) {
            std::vector<float> g((size_t)n_batch * shapes[i]), sep((size_t)n_batch * shapes[i]);
            CK(cudaMemcpy(g.data(), yp[i], g.size() * sizeof(float), cudaMemcpyDeviceToHost));
            subj[i]->run(0, n_batch, sep.data());
            if (memcmp(g.data(), sep.data(), g.size() * sizeof(float)) != 0)
                fail("group %s: matrix %d (%s %dx%d) n_batch %d differs from its separate call", type_name(type), i,
                     type_name(ts[i].type), ne0, shapes[i], n_batch);
            cudaFree(yp[i]);
        }
    }
    for (auto *s : subj) delete s;
}

/* A group of Q4_K and Q6_K matrices (the mix of the 27B file's GDN and attention input groups) with
 * each pair form of cuda_matmul_set_pair_launch: one launch for both types where the form applies
 * (counted), the bits of separate calls from cuda_matmul_group, and from
 * cuda_matmul_group_unfinished the same partial sums (and one-chunk outputs) as with no pairing. The
 * Q6_K matrices come first in the call, so their slots follow the Q4_K ones' out of call order. */
static void check_pair_group(int ne0, uint64_t seed) {
    Rng r(seed);
    const std::vector<float> x = make_activations(ne0, r);
    const int32_t types[4] = {SPECLA_TYPE_Q6_K, SPECLA_TYPE_Q4_K, SPECLA_TYPE_Q6_K, SPECLA_TYPE_Q4_K};
    const int shapes[4] = {48, 33, 4101, 100};
    const int n_mats = 4;
    std::vector<std::vector<uint8_t>> ws;
    std::vector<Subject *> subj;
    for (int i = 0; i < n_mats; i++) {
        ws.push_back(make_weight(types[i], ne0, shapes[i], r));
        subj.push_back(new Subject(types[i], ne0, shapes[i], ws.back(), x, false));
    }
    std::vector<specla_tensor> ts(n_mats);
    std::vector<const specla_tensor *> tp(n_mats);
    for (int i = 0; i < n_mats; i++) ts[i] = subj[i]->dev_tensor(), tp[i] = &ts[i];
    const int saved = cuda_matmul_pair_launch();
    for (int n_batch : {1, 5, 16, 23, 64}) {
        std::vector<float *> yp(n_mats);
        for (int i = 0; i < n_mats; i++) CK(cudaMalloc(&yp[i], (size_t)n_batch * shapes[i] * sizeof(float)));
        /* the unfinished call's outputs under form `forms`: per matrix its partial sums, or y */
        auto unfinished = [&](int forms) {
            cuda_matmul_set_pair_launch(forms);
            for (int i = 0; i < n_mats; i++) CK(cudaMemset(yp[i], 0xff, (size_t)n_batch * shapes[i] * sizeof(float)));
            cuda_matmul_sums sums[4];
            CK(cuda_matmul_group_unfinished(0, n_mats, tp.data(), subj[0]->x_dev, n_batch, yp.data(), subj[0]->ws, sums));
            CK(cudaDeviceSynchronize());
            std::vector<std::vector<float>> out(n_mats);
            for (int i = 0; i < n_mats; i++) {
                const size_t count = sums[i].partials ? (size_t)n_batch * sums[i].n_chunks * sums[i].rows_padded
                                                      : (size_t)n_batch * shapes[i];
                out[i].resize(count);
                CK(cudaMemcpy(out[i].data(), sums[i].partials ? sums[i].partials : yp[i], count * sizeof(float),
                              cudaMemcpyDeviceToHost));
            }
            return out;
        };
        const std::vector<std::vector<float>> unpaired = unfinished(0);
        for (int forms : {CUDA_MATMUL_PAIR_DECODE | CUDA_MATMUL_PAIR_BATCH, CUDA_MATMUL_PAIR_DECODE, CUDA_MATMUL_PAIR_BATCH}) {
            const bool pairs = n_batch == 1 ? (forms & CUDA_MATMUL_PAIR_DECODE) != 0
                                            : (forms & CUDA_MATMUL_PAIR_BATCH) != 0 && cuda_matmul_staged_bulk();
            cuda_matmul_set_pair_launch(forms);
            for (int i = 0; i < n_mats; i++) CK(cudaMemset(yp[i], 0xff, (size_t)n_batch * shapes[i] * sizeof(float)));
            const int64_t before = cuda_matmul_kernel_launches();
            CK(cuda_matmul_group(0, n_mats, tp.data(), subj[0]->x_dev, n_batch, yp.data(), subj[0]->ws));
            const int64_t launched = cuda_matmul_kernel_launches() - before;
            CK(cudaDeviceSynchronize());
            if (launched != (pairs ? 2 : 3)) /* the quantize kernel, then one launch or one per type */
                fail("pair group, forms %d, n_batch %d: %lld kernels, expected %d", forms, n_batch, (long long)launched,
                     pairs ? 2 : 3);
            for (int i = 0; i < n_mats; i++) {
                std::vector<float> g((size_t)n_batch * shapes[i]), sep((size_t)n_batch * shapes[i]);
                CK(cudaMemcpy(g.data(), yp[i], g.size() * sizeof(float), cudaMemcpyDeviceToHost));
                subj[i]->run(0, n_batch, sep.data());
                if (memcmp(g.data(), sep.data(), g.size() * sizeof(float)) != 0)
                    fail("pair group, forms %d: matrix %d (%s %dx%d) n_batch %d differs from its separate call", forms, i,
                         type_name(types[i]), ne0, shapes[i], n_batch);
            }
            const std::vector<std::vector<float>> paired = unfinished(forms);
            for (int i = 0; i < n_mats; i++)
                if (paired[i].size() != unpaired[i].size() ||
                    memcmp(paired[i].data(), unpaired[i].data(), paired[i].size() * sizeof(float)) != 0)
                    fail("pair group, forms %d: matrix %d (%s %dx%d) n_batch %d: its unfinished sums differ from those "
                         "without pairing", forms, i, type_name(types[i]), ne0, shapes[i], n_batch);
        }
        for (int i = 0; i < n_mats; i++) cudaFree(yp[i]);
    }
    cuda_matmul_set_pair_launch(saved);
    for (auto *s : subj) delete s;
}

/* (4) the activation blocks against specla_op_quantize_activations */
static void check_activations(int32_t weight_type, int n, uint64_t seed) {
    Rng r(seed);
    int n_special = 0;
    std::vector<float> x = make_activations(n, r);
    const std::vector<float> sp = make_special_rows(n, r, &n_special);
    x.insert(x.end(), sp.begin(), sp.end());
    const int rows = MAX_BATCH + n_special;
    const int unit = mm_act_kind(weight_type) == MM_ACT_Q8_K ? 256 : 32;
    std::vector<int8_t> cpu_codes((size_t)rows * n), gpu_codes((size_t)rows * n);
    std::vector<float> cpu_scales((size_t)rows * (n / unit)), gpu_scales((size_t)rows * (n / unit));
    std::vector<int16_t> gpu_bsums((size_t)rows * (n / 16));
    specla_op_options opt = {0, g_opt.oracle_kernels, SPECLA_BACKEND_CPU, 0}; /* the CPU oracle */
    if (specla_op_quantize_activations(&opt, weight_type, x.data(), rows, n, cpu_codes.data(), cpu_scales.data()) !=
        SPECLA_OK) {
        fprintf(stderr, "cuda_matmul_check: specla_op_quantize_activations failed: %s\n", specla_last_error());
        exit(2);
    }
    if (g_opt.host_model) {
        HostActs a = host_quantize(mm_act_kind(weight_type), x.data(), rows, n);
        gpu_codes = a.codes, gpu_scales = a.scales, gpu_bsums = a.bsums;
    } else {
        float *xd;
        int8_t *cd;
        float *sd;
        int16_t *bd;
        CK(cudaMalloc(&xd, x.size() * sizeof(float)));
        CK(cudaMalloc(&cd, gpu_codes.size()));
        CK(cudaMalloc(&sd, gpu_scales.size() * sizeof(float)));
        CK(cudaMalloc(&bd, gpu_bsums.size() * sizeof(int16_t)));
        CK(cudaMemcpy(xd, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
        CK(cudaMemset(cd, 0x55, gpu_codes.size()));
        CK(cudaMemset(sd, 0xff, gpu_scales.size() * sizeof(float)));
        CK(cudaMemset(bd, 0x55, gpu_bsums.size() * sizeof(int16_t)));
        CK(cuda_matmul_quantize_activations(0, weight_type, xd, rows, n, cd, sd, bd));
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(gpu_codes.data(), cd, gpu_codes.size(), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(gpu_scales.data(), sd, gpu_scales.size() * sizeof(float), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(gpu_bsums.data(), bd, gpu_bsums.size() * sizeof(int16_t), cudaMemcpyDeviceToHost));
        cudaFree(xd), cudaFree(cd), cudaFree(sd), cudaFree(bd);
    }
    for (size_t i = 0; i < cpu_codes.size(); i++)
        if (cpu_codes[i] != gpu_codes[i]) {
            fail("activations for %s, n %d: code %zu (row %zu) is %d, CPU %d", type_name(weight_type), n, i, i / n,
                 gpu_codes[i], cpu_codes[i]);
            break;
        }
    for (size_t i = 0; i < cpu_scales.size(); i++) {
        const bool both_nan = std::isnan(cpu_scales[i]) && std::isnan(gpu_scales[i]);
        if (!both_nan && memcmp(&cpu_scales[i], &gpu_scales[i], 4) != 0) {
            fail("activations for %s, n %d: scale %zu (row %zu) is %.9g, CPU %.9g", type_name(weight_type), n, i,
                 i / (n / unit), gpu_scales[i], cpu_scales[i]);
            break;
        }
    }
    if (unit == 256)
        for (size_t g = 0; g < gpu_bsums.size(); g++) {
            int sum = 0;
            for (int i = 0; i < 16; i++) sum += cpu_codes[16 * g + i];
            if (sum != gpu_bsums[g]) {
                fail("activations for %s, n %d: bsum %zu is %d, the CPU codes sum to %d", type_name(weight_type), n, g,
                     gpu_bsums[g], sum);
                break;
            }
        }
}

static const int32_t kTypes[] = {SPECLA_TYPE_F32,  SPECLA_TYPE_F16,  SPECLA_TYPE_BF16, SPECLA_TYPE_Q8_0, SPECLA_TYPE_Q4_0,
                                 SPECLA_TYPE_Q5_0, SPECLA_TYPE_Q4_K, SPECLA_TYPE_Q5_K, SPECLA_TYPE_Q6_K};

static void run_checks() {
    printf("check: oracle = specla_op_matmul (cpu_kernels %d), error bound 8 u sqrt(chain + 4) x sum|terms|, "
           "n_batch {1,2,3,4,5,8,16,23,32,64}\n",
           g_opt.oracle_kernels);
    const int rows_full[] = {1, 7, 33, 4101};
    const int rows_quick[] = {1, 7, 33, 100};
    uint64_t seed = 1;
    for (int32_t type : kTypes) {
        const int unit = mm_unit_elements(type);
        const int cols_full[] = {unit, 5120, 17408};
        const int cols_quick[] = {unit, 512, 1024};
        const int *cols = g_opt.quick ? cols_quick : cols_full;
        const int *rows = g_opt.quick ? rows_quick : rows_full;
        for (int ci = 0; ci < 3; ci++)
            for (int ri = 0; ri < 4; ri++) {
                const int ne0 = cols[ci], ne1 = rows[ri];
                /* the widest, tallest case only for the types real ffn_down weights have */
                if (!g_opt.quick && ne0 == 17408 && ne1 == 4101 && type != SPECLA_TYPE_Q4_K && type != SPECLA_TYPE_Q6_K)
                    continue;
                const int before = g_failures;
                const CaseResult r = check_case(type, ne0, ne1, seed++);
                const mm_plan p = mm_plan_for(type, ne0, ne1);
                char tc_note[64] = "";
                if (r.max_tc_diff >= 0) snprintf(tc_note, sizeof tc_note, "  vs tensor-core model %.3g", r.max_tc_diff);
                printf("  %-5s ne0 %6d ne1 %5d  chunks %3d x %3d blocks  max err %.3g (bound %.3g)%s  %s\n", type_name(type),
                       ne0, ne1, p.n_chunks, p.chunk_blocks, r.max_err, r.bound, tc_note, g_failures == before ? "ok" : "FAILED");
                fflush(stdout);
            }
        if (!g_opt.host_model) check_group(type, g_opt.quick ? 1024 : 5120, seed++);
    }
    if (!g_opt.host_model) {
        const int before = g_failures;
        check_pair_group(g_opt.quick ? 1024 : 5120, seed++);
        printf("  Q4_K + Q6_K group in one launch: %s\n", g_failures == before ? "the bits of separate launches" : "FAILED");
    }
    for (int32_t wt : {SPECLA_TYPE_Q8_0, SPECLA_TYPE_Q4_K})
        for (int n : {256, 5120, 17408}) {
            const int before = g_failures;
            check_activations(wt, n, seed++);
            printf("  activations for %s n %d: %s\n", type_name(wt), n, g_failures == before ? "bytes equal" : "FAILED");
        }
}

/* ---- benchmark ---------------------------------------------------------------------------------- */
struct BenchShape {
    const char *name;
    int32_t type;
    int ne0, ne1;
};
/* The Qwen3.6-27B trunk (E 5120, F 17408, C 10240, Hv*S 6144, nh 24, D 256, nkv 4) and its head,
 * types as llama.cpp's Q4_K_M mix puts them. */
static const BenchShape kBench[] = {
    {"attn_qkv", SPECLA_TYPE_Q6_K, 5120, 10240}, {"attn_gate", SPECLA_TYPE_Q4_K, 5120, 6144},
    {"ssm_alpha", SPECLA_TYPE_Q4_K, 5120, 48},   {"ssm_out", SPECLA_TYPE_Q4_K, 6144, 5120},
    {"attn_q", SPECLA_TYPE_Q4_K, 5120, 12288},   {"attn_k", SPECLA_TYPE_Q4_K, 5120, 1024},
    {"attn_v", SPECLA_TYPE_Q6_K, 5120, 1024},    {"attn_output", SPECLA_TYPE_Q4_K, 6144, 5120},
    {"ffn_up", SPECLA_TYPE_Q4_K, 5120, 17408},   {"ffn_down", SPECLA_TYPE_Q4_K, 17408, 5120},
    {"ffn_down", SPECLA_TYPE_Q6_K, 17408, 5120}, {"output", SPECLA_TYPE_Q6_K, 5120, 248320},
    /* the 27B target's DFlash draft (F16; 32 x 128 query heads, 8 KV heads, FFN 10240) */
    {"draft_q", SPECLA_TYPE_F16, 5120, 4096},    {"draft_kv", SPECLA_TYPE_F16, 5120, 1024},
    {"draft_o", SPECLA_TYPE_F16, 4096, 5120},    {"draft_up", SPECLA_TYPE_F16, 5120, 10240},
    {"draft_down", SPECLA_TYPE_F16, 10240, 5120},
};
static const int kBenchBatches[] = {1, 2, 4, 8, 16, 23, 32, 64};

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

/* The median over `timed` passes (after `warmup` more) of the microseconds per call of pass(), which
 * makes `calls` calls on the default stream. */
constexpr int kTimedPasses = 20; /* the benchmarks' default, recorded in their rows */
/* A diagnostic build times kernels that compute meaningless results, so it only benchmarks; its rows
 * name it ("diagnostic"). -DMM_LOAD_ONLY (matmul.cu, matmul_tile.cuh): the dp4a and bulk staged
 * kernels' loads without their arithmetic; -DMM_TILE_DIAG_ACT_ONCE (matmul_tile.cuh): the bulk staged
 * kernel without its per-block activation staging. */
#if defined(MM_LOAD_ONLY)
constexpr const char *kDiagnosticBuild = "load_only";
#elif defined(MM_TILE_DIAG_ACT_ONCE)
constexpr const char *kDiagnosticBuild = "act_once";
#else
constexpr const char *kDiagnosticBuild = nullptr;
#endif
template <class Pass> static double median_us_per_call(int calls, Pass pass, int timed = kTimedPasses, int warmup = 2) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<double> t;
    for (int i = 0; i < warmup + timed; i++) {
        CK(cudaEventRecord(e0));
        pass();
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= warmup) t.push_back(ms * 1e3 / calls);
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return median(t);
}

static double measure_copy_gbps() {
    const size_t bytes = (size_t)2 << 30;
    void *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 1, bytes));
    const double us = median_us_per_call(1, [&] { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); }, 5, 1);
    cudaFree(a), cudaFree(b);
    return 2.0 * bytes / (us * 1e-6) / 1e9; /* bytes read + written */
}

/* The reference a matmul launch is measured against: one launch that only reads `n16` 16-byte
 * words (grid-stride, 4 loads in flight per thread, every SM full), so its span is the copy rate
 * plus the ramp and tail any launch of that size pays. The fold keeps the loads. */
__global__ void read_probe_kernel(const uint4 *p, size_t n16, unsigned *sink) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    uint32_t acc = 0;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        const uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride),
                    d = __ldcs(p + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n16; i += stride) {
        const uint4 a = __ldcs(p + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (acc == 0x9e3779b9u) sink[0] = acc; /* data-dependent: the compiler keeps every load */
}

/* us per launch of read_probe_kernel over each of `copies` buffers of `bytes` (median of 20 passes). */
static double read_probe_us(const std::vector<void *> &dev, size_t bytes, const cudaDeviceProp &prop) {
    unsigned *sink;
    CK(cudaMalloc(&sink, sizeof(unsigned)));
    const size_t n16 = bytes / 16;
    const unsigned grid = (unsigned)prop.multiProcessorCount * 8;
    const double us = median_us_per_call((int)dev.size(), [&] {
        for (void *d : dev) read_probe_kernel<<<grid, 256>>>((const uint4 *)d, n16, sink);
        CK(cudaGetLastError());
    });
    cudaFree(sink);
    return us;
}

/* A GDN layer's input matrices (attn_qkv Q6_K, attn_gate, ssm_beta, ssm_alpha Q4_K) on one x: one
 * cuda_matmul_group call against four cuda_matmul calls, over enough copies of the set to defeat L2. */
static void bench_gdn_group(const cudaDeviceProp &prop, double copy_gbps, FILE *js) {
    const int n0 = 5120;
    const int32_t types[4] = {SPECLA_TYPE_Q6_K, SPECLA_TYPE_Q4_K, SPECLA_TYPE_Q4_K, SPECLA_TYPE_Q4_K};
    const int rows[4] = {10240, 6144, 48, 48};
    Rng r(777);
    double bytes = 0, prep = 0;
    std::vector<std::vector<uint8_t>> w(4);
    for (int i = 0; i < 4; i++) {
        w[i] = make_weight(types[i], n0, rows[i], r);
        bytes += (double)w[i].size();
        prep += (double)cuda_matmul_prepared_bytes(types[i], n0, rows[i]);
    }
    const int copies = (int)(3.0 * prop.l2CacheSize / prep) + 1;
    std::vector<specla_tensor> t((size_t)copies * 4);
    for (int c = 0; c < copies; c++)
        for (int i = 0; i < 4; i++) {
            specla_tensor &ti = t[(size_t)c * 4 + i];
            ti = host_tensor(w[i], types[i], n0, rows[i]);
            void *d;
            CK(cudaMalloc(&d, cuda_matmul_prepared_bytes(types[i], n0, rows[i])));
            CK(cuda_matmul_prepare_weight(&ti, d));
            ti.data = d;
        }
    const std::vector<float> x = make_activations(n0, r);
    float *xd;
    CK(cudaMalloc(&xd, x.size() * sizeof(float)));
    CK(cudaMemcpy(xd, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
    float *yd[4];
    for (int i = 0; i < 4; i++) CK(cudaMalloc(&yd[i], (size_t)MAX_BATCH * rows[i] * sizeof(float)));
    cuda_matmul_workspace ws;
    ws.bytes = cuda_matmul_workspace_bytes(MAX_BATCH, n0);
    CK(cudaMalloc(&ws.data, ws.bytes));
    printf("  GDN input group (attn_qkv Q6_K + attn_gate + ssm_beta + ssm_alpha Q4_K, %.1f MB):\n", bytes / 1e6);
    for (int n_batch : {1, 23}) {
        double us[2];
        for (int grouped = 0; grouped < 2; grouped++)
            us[grouped] = median_us_per_call(copies, [&] {
                for (int c = 0; c < copies; c++) {
                    const specla_tensor *tp[4] = {&t[(size_t)c * 4], &t[(size_t)c * 4 + 1], &t[(size_t)c * 4 + 2],
                                                  &t[(size_t)c * 4 + 3]};
                    if (grouped)
                        CK(cuda_matmul_group(0, 4, tp, xd, n_batch, yd, ws));
                    else
                        for (int i = 0; i < 4; i++) CK(cuda_matmul(0, tp[i], xd, n_batch, yd[i], ws));
                }
            });
        printf("    n_batch %2d: four calls %7.1f us (%5.0f GB/s), one group call %7.1f us (%5.0f GB/s)\n", n_batch, us[0],
               bytes / (us[0] * 1e-6) / 1e9, us[1], bytes / (us[1] * 1e-6) / 1e9);
        if (js)
            fprintf(js,
                    "{\"commit\": \"%s\", \"device\": \"%s\", \"matrix\": \"gdn_input_group\", \"n_batch\": %d, "
                    "\"weight_bytes\": %.0f, \"copies\": %d, \"separate_us\": %.3f, \"group_us\": %.3f, "
                    "\"group_gbps\": %.1f, \"copy_gbps\": %.1f, \"overlap\": %d}\n",
                    g_opt.commit.c_str(), prop.name, n_batch, bytes, copies, us[0], us[1], bytes / (us[1] * 1e-6) / 1e9,
                    copy_gbps, g_opt.overlap ? 1 : 0);
    }
    for (auto &ti : t) cudaFree((void *)ti.data);
    for (int i = 0; i < 4; i++) cudaFree(yd[i]);
    cudaFree(xd), cudaFree(ws.data);
}

#if defined(MM_TRACE)
extern "C" cudaError_t cuda_matmul_set_trace(mm_trace_record *records, int capacity);
#endif

/* With --trace (a -DMM_TRACE build): one more call of the benchmarked matrix, its launch timeline
 * recorded (matmul_launch.h: a record per warp unit, or per CTA of the staged kernel) and written as
 * one JSON line: the records' SM and times in ns from the earliest start. tools/device/
 * matmul_trace_report.py reads them. */
static void trace_call(FILE *tf, const char *name, const specla_tensor &w, const float *x, int n_batch, float *y,
                       cuda_matmul_workspace ws, const char *kernel) {
#if defined(MM_TRACE)
    /* a record per warp unit; the staged kernel's CTAs (two row groups each) are fewer */
    const mm_plan p = mm_plan_for(w.type, w.ne0, w.ne1);
    const int capacity = p.row_groups * p.n_chunks;
    mm_trace_record *rec;
    CK(cudaMalloc(&rec, sizeof(mm_trace_record) * capacity));
    CK(cudaMemset(rec, 0, sizeof(mm_trace_record) * capacity));
    CK(cuda_matmul_set_trace(rec, capacity));
    CK(cuda_matmul(0, &w, x, n_batch, y, ws));
    CK(cudaDeviceSynchronize());
    CK(cuda_matmul_set_trace(nullptr, 0));
    std::vector<mm_trace_record> h(capacity);
    CK(cudaMemcpy(h.data(), rec, sizeof(mm_trace_record) * capacity, cudaMemcpyDeviceToHost));
    cudaFree(rec);
    unsigned long long t0 = ~0ull;
    for (const mm_trace_record &r : h)
        if (r.t[MM_TRACE_START]) t0 = std::min(t0, (unsigned long long)r.t[MM_TRACE_START]);
    fprintf(tf, "{\"commit\": \"%s\", \"matrix\": \"%s\", \"type\": \"%s\", \"ne0\": %d, \"ne1\": %d, \"n_batch\": %d, "
                "\"kernel\": \"%s\", \"weight_bytes\": %zu, \"records\": [",
            g_opt.commit.c_str(), name, type_name(w.type), w.ne0, w.ne1, n_batch, kernel,
            cuda_matmul_prepared_bytes(w.type, w.ne0, w.ne1));
    int written = 0;
    for (const mm_trace_record &r : h) {
        if (!r.t[0] || !r.t[1] || !r.t[2] || !r.t[3]) continue; /* a CTA the staged kernel does not have */
        fprintf(tf, "%s[%u, %llu, %llu, %llu, %llu]", written++ ? ", " : "", r.sm, r.t[0] - t0, r.t[1] - t0,
                r.t[2] - t0, r.t[3] - t0);
    }
    fprintf(tf, "]}\n");
    fflush(tf);
#else
    (void)tf, (void)name, (void)w, (void)x, (void)n_batch, (void)y, (void)ws, (void)kernel;
#endif
}

static void run_bench() {
    cuda_matmul_set_tensor_cores(g_opt.tc_mode);
    printf("bench: cuda_matmul_set_tensor_cores(%d)\n", g_opt.tc_mode);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const double copy_gbps = measure_copy_gbps();
    printf("bench: %s, %d SMs, L2 %d MB; device-to-device copy %.0f GB/s (2 GiB, read + write)\n", prop.name,
           prop.multiProcessorCount, prop.l2CacheSize >> 20, copy_gbps);
    /* appended, as every benchmark of the project appends to its rows file (a device call runs the
     * checker once per matrix or variant into one $ROWS) */
    FILE *js = g_opt.json.empty() ? nullptr : fopen(g_opt.json.c_str(), "a");
    if (!g_opt.json.empty() && !js) {
        fprintf(stderr, "cuda_matmul_check: cannot write --json %s\n", g_opt.json.c_str());
        exit(2);
    }
    FILE *tf = g_opt.trace.empty() ? nullptr : fopen(g_opt.trace.c_str(), "w");
    if (!g_opt.trace.empty() && !tf) {
        fprintf(stderr, "cuda_matmul_check: cannot write --trace %s\n", g_opt.trace.c_str());
        exit(2);
    }
    if (kDiagnosticBuild)
        printf("bench: a diagnostic build (%s): timings only, results meaningless\n", kDiagnosticBuild);
    printf("  %-11s %-5s %6s %6s  %8s  %-14s", "matrix", "type", "ne0", "ne1", "MB", "read us (GB/s)");
    if (g_opt.batches.empty()) g_opt.batches.assign(std::begin(kBenchBatches), std::end(kBenchBatches));
    for (int n : g_opt.batches) printf("  n=%-2d us (GB/s)", n);
    printf("\n");
    Rng r(12345);
    for (const BenchShape &bs : kBench) {
        if (!g_opt.matrix.empty() && g_opt.matrix != bs.name) continue;
        const std::vector<uint8_t> w = make_weight(bs.type, bs.ne0, bs.ne1, r);
        const double weight_bytes = (double)w.size();
        const size_t prep_bytes = cuda_matmul_prepared_bytes(bs.type, bs.ne0, bs.ne1);
        const int copies = (int)std::max<size_t>(1, (size_t)(3.0 * prop.l2CacheSize / prep_bytes) + 1);
        std::vector<void *> dev(copies);
        const specla_tensor hw = host_tensor(w, bs.type, bs.ne0, bs.ne1);
        CK(cudaMalloc(&dev[0], prep_bytes));
        CK(cuda_matmul_prepare_weight(&hw, dev[0]));
        for (int c = 1; c < copies; c++) {
            CK(cudaMalloc(&dev[c], prep_bytes));
            CK(cudaMemcpy(dev[c], dev[0], prep_bytes, cudaMemcpyDeviceToDevice));
        }
        const std::vector<float> x = make_activations(bs.ne0, r);
        float *xd, *yd;
        CK(cudaMalloc(&xd, x.size() * sizeof(float)));
        CK(cudaMemcpy(xd, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
        CK(cudaMalloc(&yd, (size_t)MAX_BATCH * bs.ne1 * sizeof(float)));
        cuda_matmul_workspace ws;
        ws.bytes = cuda_matmul_workspace_bytes(MAX_BATCH, bs.ne0);
        CK(cudaMalloc(&ws.data, ws.bytes));
        printf("  %-11s %-5s %6d %6d  %8.1f", bs.name, type_name(bs.type), bs.ne0, bs.ne1, weight_bytes / 1e6);
        const double read_us = read_probe_us(dev, prep_bytes, prop);
        printf("  %7.1f (%5.0f)", read_us, prep_bytes / (read_us * 1e-6) / 1e9);
        double us1 = 0;
        for (int n_batch : g_opt.batches) {
            const double us = median_us_per_call(copies, [&] {
                for (int c = 0; c < copies; c++) {
                    specla_tensor dt = hw;
                    dt.data = dev[c];
                    CK(cuda_matmul(0, &dt, xd, n_batch, yd, ws));
                }
            });
            const double gbps = weight_bytes / (us * 1e-6) / 1e9;
            if (n_batch == 1) us1 = us;
            printf("  %7.1f (%5.0f)", us, gbps);
            const bool mma = (n_batch >= 2 || cuda_matmul_staged_decode(bs.type)) && mm_act_kind(bs.type) != MM_ACT_FLOAT &&
                             prop.major >= 8 && g_opt.tc_mode != CUDA_MATMUL_TC_OFF;
            const bool staged = g_opt.tc_mode == CUDA_MATMUL_TC_STAGED &&
                                (bs.type == SPECLA_TYPE_Q4_K || bs.type == SPECLA_TYPE_Q5_K || bs.type == SPECLA_TYPE_Q6_K ||
                                 bs.type == SPECLA_TYPE_Q8_0);
            const bool float_mma = float_tc_path(bs.type, g_opt.tc_mode) && prop.major >= 8;
            const char *kernel = float_mma ? "float-mma"
                                 : !mma    ? "dp4a"
                                 : staged  ? (cuda_matmul_staged_bulk() ? "int8-mma-bulk" : "int8-mma-staged")
                                           : "int8-mma";
            if (js)
                fprintf(js,
                        "{\"commit\": \"%s\", \"device\": \"%s\", \"matrix\": \"%s\", \"type\": \"%s\", \"ne0\": %d, "
                        "\"ne1\": %d, \"n_batch\": %d, \"kernel\": \"%s\", \"weight_bytes\": %.0f, \"copies\": %d, "
                        "\"passes\": %d, \"median_us\": %.3f, \"gbps\": %.1f, \"copy_gbps\": %.1f, "
                        "\"ratio_to_copy\": %.4f, \"time_vs_n1\": %.4f, \"overlap\": %d, \"tensor_cores\": %d, "
                        "\"target_units\": %d, \"read_probe_us\": %.3f, \"diagnostic\": \"%s\"}\n",
                        g_opt.commit.c_str(), prop.name, bs.name, type_name(bs.type), bs.ne0, bs.ne1, n_batch, kernel,
                        weight_bytes, copies, kTimedPasses, us, gbps, copy_gbps, gbps / copy_gbps,
                        us1 > 0 ? us / us1 : 0.0, g_opt.overlap ? 1 : 0, g_opt.tc_mode, mm_target_units(bs.type),
                        read_us, kDiagnosticBuild ? kDiagnosticBuild : "");
            if (tf) {
                specla_tensor dt = hw;
                dt.data = dev[0];
                trace_call(tf, bs.name, dt, xd, n_batch, yd, ws, kernel);
            }
        }
        printf("\n");
        fflush(stdout);
        for (void *p : dev) cudaFree(p);
        cudaFree(xd), cudaFree(yd), cudaFree(ws.data);
    }
    bench_gdn_group(prop, copy_gbps, js);
    if (js) fclose(js);
    if (tf) fclose(tf);
}

/* ---- main --------------------------------------------------------------------------------------- */
static void usage(const char *msg) {
    fprintf(stderr,
            "cuda_matmul_check: %s\nusage: cuda_matmul_check [--host-model] [--quick] [--no-check] [--no-bench] "
            "[--self-test] [--json PATH] [--commit HASH] [--oracle-kernels 0..3] [--no-overlap] [--tensor-cores 0|1|2] "
            "[--batches 1,2,..] [--matrix NAME] [--trace PATH (a -DMM_TRACE build)]\n",
            msg);
    exit(2);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if (a == "--host-model") g_opt.host_model = true;
        else if (a == "--quick") g_opt.quick = true;
        else if (a == "--no-check") g_opt.check = false;
        else if (a == "--no-bench") g_opt.bench = false;
        else if (a == "--self-test") g_opt.self_test = true;
        else if (a == "--no-overlap") g_opt.overlap = false;
        else if (a == "--json" && i + 1 < argc) g_opt.json = argv[++i];
        else if (a == "--commit" && i + 1 < argc) g_opt.commit = argv[++i];
        else if (a == "--matrix" && i + 1 < argc) {
            g_opt.matrix = argv[++i];
            bool known = false;
            for (const BenchShape &bs : kBench) known |= g_opt.matrix == bs.name;
            if (!known) usage(("--matrix: no benchmark shape named '" + g_opt.matrix + "'").c_str());
        }
        else if (a == "--trace" && i + 1 < argc) {
#if defined(MM_TRACE)
            g_opt.trace = argv[++i];
#else
            usage("--trace needs a checker built with -DMM_TRACE (EXTRA_NVCC_FLAGS=-DMM_TRACE tools/device/build_cuda_checks.sh)");
#endif
        }
        else if (a == "--batches" && i + 1 < argc) {
            g_opt.batches.clear();
            for (const char *c = argv[++i]; *c;) {
                char *end;
                const long v = strtol(c, &end, 10);
                if (end == c || v < 1 || v > MAX_BATCH) usage("--batches takes a comma-separated list of 1..64");
                g_opt.batches.push_back((int)v);
                c = *end == ',' ? end + 1 : end;
                if (*end && *end != ',') usage("--batches takes a comma-separated list of 1..64");
            }
        }
        else if (a == "--tensor-cores" && i + 1 < argc) {
            const std::string m = argv[++i];
            if (m != "0" && m != "1" && m != "2") usage("--tensor-cores takes 0 (dp4a), 1 (staged, the default) or 2 (per-warp)");
            g_opt.tc_mode = atoi(m.c_str());
        }
        else if (a == "--oracle-kernels" && i + 1 < argc) {
            g_opt.oracle_kernels = atoi(argv[++i]);
            if (g_opt.oracle_kernels < 0 || g_opt.oracle_kernels > 3) usage("--oracle-kernels takes 0..3");
        } else
            usage(("unknown or incomplete argument " + a).c_str());
    }
    if (g_opt.self_test && !g_opt.host_model) usage("--self-test runs with --host-model");
    if (kDiagnosticBuild && (g_opt.check || g_opt.host_model)) {
        fprintf(stderr, "cuda_matmul_check: this diagnostic build (%s) computes nothing; run it with --no-check on a GPU\n",
                kDiagnosticBuild);
        return 2;
    }
    if (!g_opt.host_model) {
        int devices = 0;
        if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
            usage("no CUDA device (run with --host-model to check the host model only)");
        cuda_set_launch_overlap(g_opt.overlap ? 1 : 0);
        printf("programmatic dependent launch (sm_90+): %s\n", g_opt.overlap ? "on" : "off (--no-overlap)");
    }
    if (g_opt.self_test) {
        /* every injected fault must be caught, on one small case */
        int caught = 0;
        for (int f = INJECT_UNWRITTEN; f <= INJECT_ERROR; f++) {
            g_inject = f;
            const int before = g_failures;
            check_case(SPECLA_TYPE_Q4_K, 512, 33, 99);
            const bool hit = g_failures > before;
            printf("self-test: fault %d %s\n", f, hit ? "caught" : "NOT CAUGHT");
            caught += hit;
        }
        g_inject = 0;
        for (int fault = 1; fault <= 2; fault++) {
            g_mma_fault = fault;
            const int before = g_failures;
            check_mma_emulation(true);
            const bool hit = g_failures > before;
            printf("self-test: fault %d (emulated m16n8k%d rows swapped) %s\n", 3 + fault, fault == 1 ? 16 : 32,
                   hit ? "caught" : "NOT CAUGHT");
            caught += hit;
            g_mma_fault = 0;
        }
        g_mma_fault = 3;
        {
            const int before = g_failures;
            check_ftc_emulation(true);
            const bool hit = g_failures > before;
            printf("self-test: fault 6 (emulated f16 m16n8k16 rows swapped) %s\n", hit ? "caught" : "NOT CAUGHT");
            caught += hit;
        }
        g_mma_fault = 0;
        {
            const int before = g_failures;
            check_finish_rows(true);
            const bool hit = g_failures > before;
            printf("self-test: fault 7 (split-K finish over chunks 0, 2, 1, 3, ...) %s\n", hit ? "caught" : "NOT CAUGHT");
            caught += hit;
        }
        g_failures = 0;
        if (caught != 7) {
            printf("self-test FAILED\n");
            return 1;
        }
    }
    if (g_opt.check) {
        run_checks();
        check_ftc_error_vs_float64();
        check_tile_stage_loads();
        check_finish_rows();
        if (g_opt.host_model) check_mma_emulation(), check_ftc_emulation();
    }
    if (g_opt.bench && !g_opt.host_model) run_bench();
    printf("%s: %d failure(s)\n", g_failures ? "FAILED" : "PASSED", g_failures);
    return g_failures ? 1 : 0;
}
