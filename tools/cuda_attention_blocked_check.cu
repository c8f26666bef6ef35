// Host check of the register-blocked attention walk (native/backends/cuda/attention_blocked.cuh): its
// phases run for all ATB_THREADS thread indices of a block on the host (each phase is one barrier
// interval, so running the threads one after another is a valid schedule), against plain loops of the
// fp32 path's arithmetic (attention.cu's header), bit for bit:
//   - scores: lane sum L = the fmaf chain over dims L, L + 32, ...; the 32 lane sums meet in the xor
//     butterfly (16, 8, 4, 2, 1) as 32 lanes would add them; times scale;
//   - weighted V: acc * alpha, then fmaf(p_r, v_r[d], acc) over the tile's rows in order.
// It checks the staging (the transposed, swizzled K; V as stored), which thread owns which pairs,
// rows and dims, and the order of the tree fold, before any device run. The softmax between them is
// attention.cu's device code (softmax_tile_pair), shared with every other kernel.
//
//     nvcc -O2 -std=c++20 -Xcompiler -ffp-contract=off -Inative/backends/cuda \
//          tools/cuda_attention_blocked_check.cu -o att_blocked_check
//     ./att_blocked_check [--self-test]
//
// --self-test then plants faults and fails unless each is caught: K staged without the swizzle, the
// lane sums summed in lane order instead of the butterfly's tree, a V row read one row late. Needs nvcc
// (for the CUDA headers' vector types), no GPU.
#include "attention_blocked.cuh"
#include "host_check_values.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

static std::mt19937 rng(4321);
static int failures = 0;
static bool report(const char *what, long bad, long total, bool expect_bad = false) {
    const bool ok = expect_bad ? bad > 0 : bad == 0;
    printf("%s %s: %ld of %ld differ\n", ok ? " ok " : "FAIL", what, bad, total);
    if (!ok) failures++;
    return ok;
}

enum fault { NONE, UNSWIZZLED_K, LANE_ORDER_SUM, V_ROW_LATE };

// the fp32 path's dot of q and k (D dims): 32 lane sums, then the xor butterfly
static float butterfly_dot(const float *q, const float *k, int D, bool lane_order) {
    float lane[32];
    for (int L = 0; L < 32; L++) {
        float s = 0.0f;
        for (int d = L; d < D; d += 32) s = fmaf(q[d], k[d], s);
        lane[L] = s;
    }
    if (lane_order) { // the planted fault: another tree (a plain left-to-right sum)
        float s = lane[0];
        for (int L = 1; L < 32; L++) s = s + lane[L];
        return s;
    }
    for (int m = 16; m > 0; m >>= 1) {
        float next[32];
        for (int L = 0; L < 32; L++) next[L] = lane[L] + lane[L ^ m];
        memcpy(lane, next, sizeof lane);
    }
    return lane[0];
}

// One case: np pairs, head_dim D, a tile whose rows are row_stride floats apart.
static void check_case(int np, int D, enum fault f, bool expect_bad) {
    const int row_stride = 3 * D + 4, kv_offset = D; // the tile sits at a KV head past the first
    const float scale = 1.0f / sqrtf((float)D);
    std::vector<float> q = random_normals(rng, (size_t)np * D), k = random_normals(rng, (size_t)ATB_ROWS * row_stride),
                       v = random_normals(rng, (size_t)ATB_ROWS * row_stride);
    auto sh = std::make_unique<atb_shared>();
    memset(sh.get(), 0xff, sizeof *sh); // NaN everywhere the phases do not write
    // q as [T][nh][D] with pair i = (query i / ngh, head i % ngh): ngh = 1 here, so pair i is query i
    for (int tid = 0; tid < ATB_THREADS; tid++) atb_stage_q(*sh, q.data(), 1, D, 0, 0, 1, np, tid);
    const int nj = D / ATB_LEAVES;
    for (int tid = 0; tid < ATB_THREADS; tid++) {
        if (D == ATB_MAX_D)
            atb_stage_k<ATB_MAX_D / ATB_LEAVES>(*sh, k.data() + kv_offset, row_stride, nj, tid);
        else
            atb_stage_k<0>(*sh, k.data() + kv_offset, row_stride, nj, tid);
    }
    if (f == UNSWIZZLED_K) // the planted fault: a plain transpose
        for (int row = 0; row < ATB_ROWS; row++)
            for (int d = 0; d < D; d++) sh->kv[d * ATB_ROWS + row] = k[(size_t)row * row_stride + kv_offset + d];
    for (int tid = 0; tid < ATB_THREADS; tid++) {
        if (D == ATB_MAX_D)
            atb_scores<ATB_MAX_D / ATB_LEAVES>(*sh, nj, scale, tid);
        else
            atb_scores<0>(*sh, nj, scale, tid);
    }
    long bad = 0;
    for (int pair = 0; pair < np; pair++)
        for (int row = 0; row < ATB_ROWS; row++) {
            const float want =
                butterfly_dot(&q[(size_t)pair * D], &k[(size_t)row * row_stride + kv_offset], D, f == LANE_ORDER_SUM) * scale;
            if (!same_bits(sh->p[pair * ATB_P_STRIDE + row], want)) bad++;
        }
    char name[160];
    snprintf(name, sizeof name, "scores  pairs %2d head_dim %3d%s", np, D, f == NONE ? "" : " (planted fault)");
    if (f == UNSWIZZLED_K || f == LANE_ORDER_SUM) { // faults of the scores: the V phase is not theirs
        report(name, bad, (long)np * ATB_ROWS, expect_bad);
        return;
    }
    if (f == NONE) report(name, bad, (long)np * ATB_ROWS, false);

    // weighted V: probabilities and alphas as a softmax leaves them, accumulators from a previous tile
    std::vector<float> p = random_normals(rng, (size_t)ATB_PAIRS * ATB_ROWS), alpha = random_normals(rng, ATB_PAIRS),
                       acc0 = random_normals(rng, (size_t)ATB_PAIRS * D);
    for (auto &x : p) x = fabsf(x);
    for (int pair = 0; pair < ATB_PAIRS; pair++) {
        for (int row = 0; row < ATB_ROWS; row++) sh->p[pair * ATB_P_STRIDE + row] = p[(size_t)pair * ATB_ROWS + row];
        sh->alpha[pair] = fabsf(alpha[pair]);
    }
    for (int tid = 0; tid < ATB_THREADS; tid++) atb_copy_v(*sh, v.data() + kv_offset, row_stride, D, tid);
    if (f == V_ROW_LATE) // the planted fault: row 1 holds row 2's values
        for (int d = 0; d < D; d++) sh->kv[1 * ATB_MAX_D + d] = v[(size_t)2 * row_stride + kv_offset + d];
    std::vector<float> got((size_t)ATB_PAIRS * D, NAN);
    for (int tid = 0; tid < ATB_THREADS; tid++) {
        const int pair0 = atb_value_pair0(tid), dim0 = atb_value_dim0(tid);
        float acc[8][4];
        for (int a = 0; a < 8; a++)
            for (int e = 0; e < 4; e++) acc[a][e] = dim0 < D ? acc0[(size_t)(pair0 + a) * D + dim0 + e] : 0.0f;
        atb_values(*sh, acc, D, tid);
        if (dim0 >= D) continue;
        for (int a = 0; a < 8; a++)
            for (int e = 0; e < 4; e++) got[(size_t)(pair0 + a) * D + dim0 + e] = acc[a][e];
    }
    bad = 0;
    for (int pair = 0; pair < ATB_PAIRS; pair++)
        for (int d = 0; d < D; d++) {
            float want = acc0[(size_t)pair * D + d] * fabsf(alpha[pair]);
            for (int row = 0; row < ATB_ROWS; row++)
                want = fmaf(p[(size_t)pair * ATB_ROWS + row], v[(size_t)row * row_stride + kv_offset + d], want);
            if (!same_bits(got[(size_t)pair * D + d], want)) bad++;
        }
    snprintf(name, sizeof name, "values  pairs %2d head_dim %3d%s", ATB_PAIRS, D, f == NONE ? "" : " (planted fault)");
    report(name, bad, (long)ATB_PAIRS * D, expect_bad);
}

int main(int argc, char **argv) {
    const bool self_test = argc > 1 && !strcmp(argv[1], "--self-test");
    const int dims[] = {256, 128, 64, 32}, pairs[] = {1, 6, 30, 32};
    for (int D : dims)
        for (int np : pairs) check_case(np, D, NONE, false);
    if (self_test) {
        printf("-- planted faults (each must be caught)\n");
        check_case(30, 256, UNSWIZZLED_K, true);
        check_case(30, 128, UNSWIZZLED_K, true);
        check_case(30, 256, LANE_ORDER_SUM, true);
        check_case(6, 64, LANE_ORDER_SUM, true);
        check_case(30, 256, V_ROW_LATE, true);
    }
    if (failures) {
        printf("FAILED: %d failure(s)\n", failures);
        return 1;
    }
    printf(self_test ? "PASSED: 0 failure(s), every planted fault caught\n" : "PASSED: 0 failure(s)\n");
    return 0;
}
