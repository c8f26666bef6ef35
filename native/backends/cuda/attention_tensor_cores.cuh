/* The attention's scores and weighted V sums on the tensor cores, in 3xTF32 (attention.cu includes
 * this; opt-in with SPECLA_CUDA_ATTENTION_TC=1 on sm_80+, head_dim a multiple of 16 up to 256).
 *
 * Why. At depth the batch attention is latency- and instruction-bound: the fp32 fma path spends
 * about half its instructions on other things than fmas and issues 0.44 instructions a cycle per
 * scheduler (docs/perf.md). A tf32 mma.sync m16n8k8 does 1024 multiply-adds in one instruction.
 *
 * Precision. One TF32 product keeps 11 significant bits of each operand. Rounded once (1xTF32), it
 * would move the F32 test model's logits about 3e-5 from the float64 reference, against 1e-7 for an
 * fp32 attention (numpy emulation). So every operand x is split into hi = tf32(x) (round to
 * nearest, cvt.rna) and lo = tf32(x - hi) (x - hi is exact), and a product is lo.hi + hi.lo + hi.hi
 * (three MMAs into one accumulator, the small terms first). The dropped lo.lo term is below 2^-22 of
 * the product; the emulation puts the logits 1e-7 from float64, as the fp32 path.
 *
 * The arithmetic, which every attention kernel of a process shares when the switch is on (so a
 * query gives the same bits alone, in a batch, as a tree node, split or unsplit; nothing depends on
 * the block's other pairs or on where a pair or row sits in a fragment):
 *   - score(pair, row) = the MMA chain over head dims in k-steps of 8: k-step s = 2u + e covers dims
 *     16u + 4t + 2e + h for k-slot t + 4h (t = 0..3, h = 0, 1), so a lane loads dims 16u + 4t ..
 *     16u + 4t + 3 of its row as one 16-byte piece and uses them in two k-steps; per k-step lo.hi,
 *     hi.lo, hi.hi; then times scale (one fp32 multiply);
 *   - the softmax bookkeeping is attention.cu's (tile max, exp, tile sum by butterfly);
 *   - acc(pair, dim) = acc * alpha (one fp32 multiply), then the MMA chain over the tile's rows in
 *     k-steps of 8 (k-step s: rows 8s + t and 8s + t + 4 in k-slots t and t + 4), lo.hi, hi.lo,
 *     hi.hi, with p and v split as above;
 *   - the segments' merge and the division are attention.cu's.
 * What the hardware does inside one MMA (the order and rounding of its 8 products' sum) is its own;
 * it is the same for every element of every call, which is all the exactness across kernels needs.
 *
 * Fragments of mma.m16n8k8 .tf32 (lane = 4g + t): A a0 (row g, k t), a1 (row g + 8, k t), a2 (row g,
 * k t + 4), a3 (row g + 8, k t + 4); B b0 (k t, column g), b1 (k t + 4, column g); C c0, c1 (row g,
 * columns 2t, 2t + 1), c2, c3 (row g + 8, the same columns). The M rows are the block's (query, head)
 * pairs (up to 16). Scores: N columns are 8 tile rows, warp w takes tile rows 16w .. 16w + 15 (two
 * n-tiles). Weighted V: N columns are head dims, warp w takes dims 64w .. 64w + 63 as eight n-tiles,
 * n-tile j column n = dim 64w + 8n + j, so a lane's B fragments for all eight are one row's dims
 * 64w + 8g .. 64w + 8g + 7 (two 16-byte pieces) and its C element (pair, column c) is dim 64w + 8c + j.
 *
 * The per-lane code compiles for the host too: tools/cuda_attention_tc_check.cu runs it on 32 host
 * threads with an emulated MMA against a plain loop of the arithmetic above, bit for bit. */
#ifndef SPECLA_CUDA_ATTENTION_TENSOR_CORES_CUH
#define SPECLA_CUDA_ATTENTION_TENSOR_CORES_CUH

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define ATT_TC_HD __host__ __device__ __forceinline__
#else
#define ATT_TC_HD static inline
#endif

/* whether this compilation pass runs the tensor-core instructions (the device pass for sm_80+) */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(SPECLA_USE_HIP)
#define ATT_TC_DEVICE 1
#else
#define ATT_TC_DEVICE 0
#endif

#define ATT_TC_PAIRS 16    /* M rows of an MMA: the most (query, head) pairs a block holds */
#define ATT_TC_WARP_DIMS 64 /* head dims per warp in the weighted V sums */
#define ATT_TC_NTILES 8     /* n-tiles of 8 dims per warp */
#define ATT_TC_Q_PAD 16     /* floats past head_dim per pair row of the split query: a row stride of
                             * 16 mod 32 floats puts a quarter warp's 16-byte reads on distinct banks */

#if defined(ATT_TC_HOST_EMULATION) && !ATT_TC_DEVICE
/* tools/cuda_attention_tc_check.cu defines it: lane `lane`'s share of the m16n8k8 tf32 product of the
 * 32 lanes' fragments, c += A . B, with the PTX fragment layout */
void att_tc_mma_emulated(float c[4], const uint32_t a[4], const uint32_t b[2], int lane);
#endif

/* x rounded to tf32 (10 explicit mantissa bits, to nearest, ties away from zero: cvt.rna's rounding)
 * as a float's bits, for finite x. Two integer operations: on sm_90 cvt.rna.tf32.f32 compiles to four
 * (an infinity test and a select besides these), and the splits are most of the path's non-MMA work. */
ATT_TC_HD uint32_t att_tf32(float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return (b + 0x1000u) & 0xffffe000u; /* the magnitude rounds half away from zero; the sign stays */
}

ATT_TC_HD float att_tc_float(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* x = hi + lo to 2^-22 of x: hi its tf32 rounding, lo the rounding of the (exact) rest */
ATT_TC_HD void att_tc_split(float x, uint32_t &hi, uint32_t &lo) {
    hi = att_tf32(x);
    lo = att_tf32(x - att_tc_float(hi));
}

/* c += A . B, one m16n8k8 tf32 MMA of the warp (every lane calls it together) */
ATT_TC_HD void att_tc_mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], int lane) {
#if ATT_TC_DEVICE
    (void)lane;
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(ATT_TC_HOST_EMULATION) && !defined(__CUDA_ARCH__)
    att_tc_mma_emulated(c, a, b, lane);
#else
    /* no tensor cores in this pass (HIP, sm < 80, the library's host pass): the host never picks
     * this code there (attention.cu, att_tensor_cores) */
    (void)c, (void)a, (void)b, (void)lane;
#endif
}

/* c += A . B in 3xTF32: lo.hi, hi.lo, hi.hi */
ATT_TC_HD void att_tc_mma3(float (&c)[4], const uint32_t (&a_hi)[4], const uint32_t (&a_lo)[4], const uint32_t (&b_hi)[2],
                           const uint32_t (&b_lo)[2], int lane) {
    att_tc_mma(c, a_lo, b_hi, lane);
    att_tc_mma(c, a_hi, b_lo, lane);
    att_tc_mma(c, a_hi, b_hi, lane);
}

/* four consecutive floats / words from 16-byte aligned memory */
ATT_TC_HD void att_tc_load4(float (&x)[4], const float *p) {
    const float4 v = *reinterpret_cast<const float4 *>(p);
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
}
ATT_TC_HD void att_tc_load_words(uint32_t (&x)[4], const uint32_t *p) {
    const uint4 v = *reinterpret_cast<const uint4 *>(p);
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
}

/* Rows past the data are read from valid memory instead of being tested for: an MMA's C row depends
 * only on its own A row and a C column only on its own B column, so a pair row past the block's
 * pairs or a score column past the tile's rows computes values nobody stores; and a V row past the
 * tile's rows meets a probability of exactly 0 (the softmax writes 0 there) times a finite value. The
 * callers pick which valid row is read, always the same one for the same logical rows. */

/* Scores of one warp's 16 tile rows for the block's pairs, before the scale. q_hi / q_lo: the split
 * queries, q_rows pair rows of q_stride words (row g + 8 past them reads row q_rows - 1: its scores
 * are not used); k_row[n]: this lane's K row of n-tile n (tile row 16w + 8n + g), its dims 0 .. D - 1.
 * s[n] gets n-tile n's C fragment: pairs g, g + 8 x tile rows 16w + 8n + 2t, + 1. D % 16 == 0; q_hi,
 * q_lo, q_stride and the K rows 16-byte aligned (whole pieces of four). */
ATT_TC_HD void att_tc_scores(float (&s)[2][4], const uint32_t *q_hi, const uint32_t *q_lo, int q_stride, int q_rows,
                             const float *const (&k_row)[2], int D, int lane) {
    const int g = lane >> 2, t = lane & 3;
    const int row0 = g < q_rows ? g : q_rows - 1, row1 = g + 8 < q_rows ? g + 8 : q_rows - 1;
    const uint32_t *qh0 = q_hi + row0 * q_stride, *ql0 = q_lo + row0 * q_stride;
    const uint32_t *qh1 = q_hi + row1 * q_stride, *ql1 = q_lo + row1 * q_stride;
#pragma unroll
    for (int n = 0; n < 2; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) s[n][i] = 0.0f;
#pragma unroll 2
    for (int d0 = 4 * t; d0 < D; d0 += 16) {
        /* this lane's 16-byte pieces: K of both rows, the query rows g and g + 8 (hi, lo) */
        float kx[2][4];
#pragma unroll
        for (int n = 0; n < 2; n++) att_tc_load4(kx[n], k_row[n] + d0);
        uint32_t qh[2][4], ql[2][4];
        att_tc_load_words(qh[0], qh0 + d0);
        att_tc_load_words(ql[0], ql0 + d0);
        att_tc_load_words(qh[1], qh1 + d0);
        att_tc_load_words(ql[1], ql1 + d0);
        uint32_t kh[2][4], kl[2][4];
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) att_tc_split(kx[n][i], kh[n][i], kl[n][i]);
#pragma unroll
        for (int e = 0; e < 2; e++) { /* k-step 2u + e: dims d0 + 2e (k-slot t), d0 + 2e + 1 (k-slot t + 4) */
            const uint32_t a_hi[4] = {qh[0][2 * e], qh[1][2 * e], qh[0][2 * e + 1], qh[1][2 * e + 1]};
            const uint32_t a_lo[4] = {ql[0][2 * e], ql[1][2 * e], ql[0][2 * e + 1], ql[1][2 * e + 1]};
#pragma unroll
            for (int n = 0; n < 2; n++) {
                const uint32_t b_hi[2] = {kh[n][2 * e], kh[n][2 * e + 1]}, b_lo[2] = {kl[n][2 * e], kl[n][2 * e + 1]};
                att_tc_mma3(s[n], a_hi, a_lo, b_hi, b_lo, lane);
            }
        }
    }
}

/* The weighted V sums of one tile into a warp's accumulators: acc[j] is n-tile j's C fragment (pairs
 * g, g + 8 x dims dim0 + 16t + j, dim0 + 16t + 8 + j), to which this adds P . V over the tile's rows
 * 0 .. 63. p: the tile's probabilities, p_rows pair rows of p_stride floats (row g + 8 past them
 * reads row p_rows - 1); v_row(i): tile row i's V, its dims 0 .. D - 1 (a valid row for every i < 64;
 * past the tile's rows p is 0). dim0 = 64w < D; a lane whose dims pass D reads dims D - 8 .. D - 1
 * (its columns are not stored). */
template <class VRow>
ATT_TC_HD void att_tc_values(float (&acc)[ATT_TC_NTILES][4], const float *p, int p_stride, int p_rows, VRow v_row,
                             int dim0, int D, int lane) {
    const int g = lane >> 2, t = lane & 3;
    const float *p0 = p + (g < p_rows ? g : p_rows - 1) * p_stride;
    const float *p1 = p + (g + 8 < p_rows ? g + 8 : p_rows - 1) * p_stride;
    const int dims = dim0 + 8 * g < D ? dim0 + 8 * g : D - 8; /* D % 16 == 0: 8 dims all in or all out */
#pragma unroll 2
    for (int s = 0; s < 8; s++) {
        const int r0 = 8 * s + t, r1 = r0 + 4;
        /* rows r0 (k-slot t) and r1 (k-slot t + 4), dims + 0 .. 3 and + 4 .. 7 */
        const float *v0 = v_row(r0) + dims, *v1 = v_row(r1) + dims;
        float v0a[4], v0b[4], v1a[4], v1b[4];
        att_tc_load4(v0a, v0);
        att_tc_load4(v0b, v0 + 4);
        att_tc_load4(v1a, v1);
        att_tc_load4(v1b, v1 + 4);
        const float pa[4] = {p0[r0], p1[r0], p0[r1], p1[r1]};
        uint32_t a_hi[4], a_lo[4];
#pragma unroll
        for (int i = 0; i < 4; i++) att_tc_split(pa[i], a_hi[i], a_lo[i]);
#pragma unroll
        for (int j = 0; j < ATT_TC_NTILES; j++) {
            uint32_t b_hi[2], b_lo[2];
            att_tc_split(j < 4 ? v0a[j] : v0b[j - 4], b_hi[0], b_lo[0]);
            att_tc_split(j < 4 ? v1a[j] : v1b[j - 4], b_hi[1], b_lo[1]);
            att_tc_mma3(acc[j], a_hi, a_lo, b_hi, b_lo, lane);
        }
    }
}

/* The dims of lane (g, t)'s accumulator element c of n-tile j in a warp starting at dim0 */
ATT_TC_HD int att_tc_acc_dim(int dim0, int lane, int j, int c) { return dim0 + 16 * (lane & 3) + 8 * (c & 1) + j; }
/* and its pair */
ATT_TC_HD int att_tc_acc_pair(int lane, int c) { return (lane >> 2) + 8 * (c >> 1); }

#endif
