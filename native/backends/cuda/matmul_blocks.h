/* The per-block arithmetic of the CUDA matmul, written once for the device kernels and for the host
 * model of them that tools/cuda_matmul_check.cu runs without a GPU: the prepared weight layout, the
 * split of a row into chunks (a function of the shape only), the activation quantizers of one block
 * and the integer/float work of one weight block against one activation block. matmul.cu documents
 * the summation order these pieces implement.
 *
 * Every float operation is an explicit round-to-nearest intrinsic (mm_fma, mm_mul, mm_add), so no
 * compiler contraction can change a result; integer sums are exact, so dp4a, an int8 MMA or plain
 * C give the same integers. */
#ifndef SPECLA_CUDA_MATMUL_BLOCKS_H
#define SPECLA_CUDA_MATMUL_BLOCKS_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "element_types.h"

#if defined(__CUDACC__) || defined(__HIPCC__)
#define MM_HD __host__ __device__ __forceinline__
#if !defined(SPECLA_USE_HIP)
#include <cuda_fp16.h>
#endif
#else
#define MM_HD static inline
#endif

#if (defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__))
#define MM_DEVICE_CODE 1
#else
#define MM_DEVICE_CODE 0
#endif

/* ---- float primitives (one IEEE rounding each, on host and device) ------------------------------ */
MM_HD float mm_fma(float a, float b, float c) {
#if MM_DEVICE_CODE
    return __fmaf_rn(a, b, c);
#else
    return fmaf(a, b, c);
#endif
}
MM_HD float mm_mul(float a, float b) {
#if MM_DEVICE_CODE
    return __fmul_rn(a, b);
#else
    volatile float r = a * b; /* volatile: never fused with a following add by the host compiler */
    return r;
#endif
}
MM_HD float mm_add(float a, float b) {
#if MM_DEVICE_CODE
    return __fadd_rn(a, b);
#else
    volatile float r = a + b;
    return r;
#endif
}
MM_HD float mm_div(float a, float b) {
#if MM_DEVICE_CODE
    return __fdiv_rn(a, b);
#else
    volatile float r = a / b;
    return r;
#endif
}
MM_HD float mm_i2f(int32_t v) {
#if MM_DEVICE_CODE
    return __int2float_rn(v);
#else
    return (float)v;
#endif
}
/* round half to even, as lrintf in the default rounding mode */
MM_HD int32_t mm_rint(float v) {
#if MM_DEVICE_CODE
    return __float2int_rn(v);
#else
    return (int32_t)lrintf(v);
#endif
}
MM_HD float mm_half(uint16_t h) {
#if MM_DEVICE_CODE && !defined(SPECLA_USE_HIP)
    return __half2float(__ushort_as_half(h));
#else
    return half_to_float(h); /* exact either way */
#endif
}
/* amax / 127 rounded to fp16 (nearest even) and back: the Q8_0 activation scale */
MM_HD float mm_round_to_half(float v) {
#if MM_DEVICE_CODE && !defined(SPECLA_USE_HIP)
    return __half2float(__float2half_rn(v));
#else
    return half_to_float(float_to_half(v));
#endif
}
MM_HD int mm_isfinite(float v) {
#if MM_DEVICE_CODE
    return isfinite(v) ? 1 : 0;
#else
    return isfinite(v) ? 1 : 0;
#endif
}
MM_HD float mm_nan(void) {
    uint32_t bits = 0x7fc00000u; /* the quiet NaN C's NAN is */
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* sum_{i<4} a.byte[i] * b.byte[i] + c, bytes signed */
MM_HD int32_t mm_dot4(int32_t a, int32_t b, int32_t c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 610
    return __dp4a(a, b, c);
#else
    for (int i = 0; i < 4; i++) c += (int32_t)(int8_t)(a >> (8 * i)) * (int32_t)(int8_t)(b >> (8 * i));
    return c;
#endif
}

/* sum_{i<4} a.byte[i] * b.byte[i] + c, a's bytes unsigned and b's signed */
MM_HD int32_t mm_dot4_us(uint32_t a, int32_t b, int32_t c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 610 && !defined(SPECLA_USE_HIP)
    int32_t d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#else
    for (int i = 0; i < 4; i++) c += (int32_t)(uint8_t)(a >> (8 * i)) * (int32_t)(int8_t)(b >> (8 * i));
    return c;
#endif
}

/* ---- activation blocks -------------------------------------------------------------------------- */
/* Device layout of a call's activation blocks (the workspace), the same arrays the public ABI's
 * specla_op_quantize_activations returns: codes[n_batch][n] int8, scales[n_batch][n / block] float,
 * and for Q8_K bsums[n_batch][n / 16] int16 (sums of 16 consecutive codes). */

/* One Q8_0 activation block of 32 (activation_q8.c's act_quantize_q8_0, operation for operation). */
MM_HD void mm_quantize_q8_0_block(const float *x, int8_t *codes, float *scale) {
    float amax = 0.0f;
    int finite = 1;
    for (int i = 0; i < 32; i++) {
        finite &= mm_isfinite(x[i]);
        const float a = fabsf(x[i]);
        if (a > amax) amax = a;
    }
    if (!finite) {
        *scale = mm_nan();
        for (int i = 0; i < 32; i++) codes[i] = 0;
        return;
    }
    const float id = amax != 0.0f ? mm_div(127.0f, amax) : 0.0f;
    if (!mm_isfinite(id)) {
        *scale = 0.0f;
        for (int i = 0; i < 32; i++) codes[i] = 0;
        return;
    }
    *scale = mm_round_to_half(mm_div(amax, 127.0f));
    for (int i = 0; i < 32; i++) codes[i] = (int8_t)mm_rint(mm_mul(x[i], id));
}

/* One Q8_K activation block of 256 (act_quantize_q8_k, operation for operation). */
MM_HD void mm_quantize_q8_k_block(const float *x, int8_t *codes, float *scale, int16_t *bsums) {
    float amax = 0.0f, max = 0.0f;
    int finite = 1;
    for (int i = 0; i < 256; i++) {
        finite &= mm_isfinite(x[i]);
        const float a = fabsf(x[i]);
        if (a > amax) amax = a, max = x[i];
    }
    const float iscale = amax != 0.0f ? mm_div(-127.0f, max) : 0.0f;
    if (!finite || !mm_isfinite(iscale) || amax == 0.0f) {
        *scale = finite ? 0.0f : mm_nan();
        for (int i = 0; i < 256; i++) codes[i] = 0;
        for (int g = 0; g < 16; g++) bsums[g] = 0;
        return;
    }
    for (int i = 0; i < 256; i++) {
        const int32_t v = mm_rint(mm_mul(iscale, x[i]));
        codes[i] = (int8_t)(v < 127 ? v : 127);
    }
    for (int g = 0; g < 16; g++) {
        int32_t sum = 0;
        for (int i = 0; i < 16; i++) sum += codes[16 * g + i];
        bsums[g] = (int16_t)sum;
    }
    *scale = mm_div(1.0f, iscale);
}

/* ---- prepared weight layout --------------------------------------------------------------------- */
/* Rows are taken in groups of 32 (a warp, a lane per row; the last group is padded with zero rows).
 * Within a group, block k of the 32 rows is one "slot" of 32 * block_bytes bytes:
 *   pieces:  MM_PIECES(type) planes of 32 x 16 bytes; piece p of lane r = bytes 16p..16p+15 of the
 *            block's 16-byte-aligned part (below) of row 32g + r;
 *   side:    after the pieces, the block's remaining fields, each a plane of 32 lanes.
 * The 16-byte-aligned part and the side fields per type:
 *   Q4_K  the whole block (144 bytes: d, dmin, scales | qs), no side
 *   Q5_K  the whole block (176 bytes: d, dmin, scales | qh | qs), no side
 *   Q6_K  ql, qh, scales (208 bytes); side: d (2 bytes)
 *   Q8_0  qs (32 bytes); side: d
 *   Q4_0  qs (16 bytes); side: d
 *   Q5_0  qs (16 bytes); side: d (2 bytes) plane, then qh (4 bytes) plane
 *   F32 / F16 / BF16  32 elements (128 / 64 / 64 bytes), no side
 * Slot k of group g starts at (g * n_blocks + k) * 32 * block_bytes. */
#define MM_GROUP_ROWS 32
/* a float type's "block" for the chunking and the layout */
#define MM_FLOAT_BLOCK 32

MM_HD int mm_unit_elements(int32_t type) {
    switch (type) {
    case SPECLA_TYPE_F32:
    case SPECLA_TYPE_F16:
    case SPECLA_TYPE_BF16: return MM_FLOAT_BLOCK;
    case SPECLA_TYPE_Q8_0:
    case SPECLA_TYPE_Q4_0:
    case SPECLA_TYPE_Q5_0: return 32;
    case SPECLA_TYPE_Q4_K:
    case SPECLA_TYPE_Q5_K:
    case SPECLA_TYPE_Q6_K: return 256;
    default: return 0; /* not supported */
    }
}
MM_HD int mm_unit_bytes(int32_t type) {
    switch (type) {
    case SPECLA_TYPE_F32: return 128;
    case SPECLA_TYPE_F16:
    case SPECLA_TYPE_BF16: return 64;
    case SPECLA_TYPE_Q8_0: return 34;
    case SPECLA_TYPE_Q4_0: return 18;
    case SPECLA_TYPE_Q5_0: return 22;
    case SPECLA_TYPE_Q4_K: return 144;
    case SPECLA_TYPE_Q5_K: return 176;
    case SPECLA_TYPE_Q6_K: return 210;
    default: return 0;
    }
}
MM_HD int mm_pieces(int32_t type) {
    switch (type) {
    case SPECLA_TYPE_F32: return 8;
    case SPECLA_TYPE_F16:
    case SPECLA_TYPE_BF16: return 4;
    case SPECLA_TYPE_Q8_0: return 2;
    case SPECLA_TYPE_Q4_0:
    case SPECLA_TYPE_Q5_0: return 1;
    case SPECLA_TYPE_Q4_K: return 9;
    case SPECLA_TYPE_Q5_K: return 11;
    case SPECLA_TYPE_Q6_K: return 13;
    default: return 0;
    }
}
/* Which activation blocks a weight type takes: the CPU's act_kind_for_weight, but for Q5_K, which
 * takes Q8_K blocks here (llama.cpp's choice too: integer dot products, like Q4_K's) where the CPU
 * multiplies float activations, so a Q5_K matmul on the GPU rounds its activations where the CPU's
 * does not (docs/cuda-matmul.md). */
enum { MM_ACT_FLOAT = 0, MM_ACT_Q8_0 = 1, MM_ACT_Q8_K = 2 };
MM_HD int mm_act_kind(int32_t type) {
    switch (type) {
    case SPECLA_TYPE_Q8_0:
    case SPECLA_TYPE_Q4_0:
    case SPECLA_TYPE_Q5_0: return MM_ACT_Q8_0;
    case SPECLA_TYPE_Q4_K:
    case SPECLA_TYPE_Q5_K:
    case SPECLA_TYPE_Q6_K: return MM_ACT_Q8_K;
    default: return MM_ACT_FLOAT;
    }
}

/* ---- the split of a row into chunks: a function of (type, ne0, ne1) only -------------------------- */
/* Work units (one warp each) = row groups x chunks; the plan asks for about MM_TARGET_UNITS units so
 * that a matrix with few rows still spreads over every SM, and never splits a block. It never looks
 * at n_batch, the device or the group a matrix is launched with. */
#ifndef MM_TARGET_UNITS
#define MM_TARGET_UNITS 2048 /* the largest per-type target below; a build may try one value for every
                              * type (-DMM_TARGET_UNITS=4096): it changes the order */
#define MM_TARGET_UNITS_Q4_K 1024
#define MM_TARGET_UNITS_Q6_K 960
#ifndef MM_TARGET_UNITS_FLOAT
#define MM_TARGET_UNITS_FLOAT 768
#endif
#else
#define MM_TARGET_UNITS_Q4_K MM_TARGET_UNITS
#define MM_TARGET_UNITS_Q6_K MM_TARGET_UNITS
#ifndef MM_TARGET_UNITS_FLOAT
#define MM_TARGET_UNITS_FLOAT MM_TARGET_UNITS
#endif
#endif
/* The K-quant targets keep the 27B matrices within one wave of resident work on the H200's 132 SMs
 * (the units of a partial last wave start only as the first wave's end: the traces of docs/perf.md).
 * Q4_K asks for 1024: on the H200 (n = 1, tools/device/matmul_plan_sweep.sh) it ran ffn_up in 20.4 us
 * against 23.7 at 2048 (1088 units on the dp4a kernel's 1584 slots of 12 warps per SM, against 2176)
 * and attn_q in 15.9 against 18.5. Q6_K's dp4a kernel holds 8 warps per SM (1056 slots) and its
 * staged kernel 4 CTAs (528 pairs of row groups): 960 gives attn_qkv (320 row groups) 3 chunks, 960
 * units, and ffn_down (160) 6 chunks, 960 units, where 2048 gave 2240 and 1920 units, three and two
 * waves, and 1024 gave ffn_down 1120, two waves again (35.6 us against 29.8 at 2048). */
/* F16 / BF16 (the tensor-core kernel of matmul_float_tc.cuh: the DFlash draft's matrices, 16 rows a
 * proposal) ask for 768: fewer, longer units than at 2048 spend less on each unit's start and on the
 * split-K finish (3-23 chunks a row on the 27B draft, 7-54 at 2048); on 132 SMs, where the staged
 * kernel holds 2 CTAs of 4 units an SM, a draft layer's o and down launches fit one partial wave
 * (200 CTAs), its gate + up launch takes 1.8 waves and its k + v + q launch 2.1 (2.0, 4.2 and 5.2 at
 * 2048). The draft's proposal took 10 % less time than at 2048 on an H100; 1024 took 2 % less, 512
 * about 1 % more (docs/perf.md, thirty-ninth pass). -DMM_TARGET_UNITS_FLOAT=N tries another; it
 * changes these two types' order only. */
static_assert(MM_TARGET_UNITS_FLOAT <= MM_TARGET_UNITS, "MM_MAX_PARTIALS_PER_TOKEN and MM_MAX_COUNTERS assume the largest target");
MM_HD int mm_target_units(int32_t type) {
    if (type == SPECLA_TYPE_F16 || type == SPECLA_TYPE_BF16) return MM_TARGET_UNITS_FLOAT;
    return type == SPECLA_TYPE_Q4_K ? MM_TARGET_UNITS_Q4_K : type == SPECLA_TYPE_Q6_K ? MM_TARGET_UNITS_Q6_K : MM_TARGET_UNITS;
}
typedef struct mm_plan {
    int n_blocks;     /* blocks (units of mm_unit_elements) per row */
    int row_groups;   /* ceil(ne1 / 32) */
    int chunk_blocks; /* L: consecutive blocks per chunk */
    int n_chunks;     /* C = ceil(n_blocks / L) */
} mm_plan;

MM_HD mm_plan mm_plan_for(int32_t type, int32_t ne0, int32_t ne1) {
    mm_plan p;
    p.n_blocks = ne0 / mm_unit_elements(type);
    p.row_groups = (ne1 + MM_GROUP_ROWS - 1) / MM_GROUP_ROWS;
    int c = (mm_target_units(type) + p.row_groups - 1) / p.row_groups;
    if (c > p.n_blocks) c = p.n_blocks;
    if (c < 1) c = 1;
    p.chunk_blocks = (p.n_blocks + c - 1) / c;
    p.n_chunks = (p.n_blocks + p.chunk_blocks - 1) / p.chunk_blocks;
    return p;
}
/* Upper bound of n_chunks * 32 * row_groups over all shapes with n_chunks > 1 (the partial sums a
 * token needs): row_groups * n_chunks <= row_groups * (TARGET / row_groups + 1) <= 2 * TARGET, with
 * MM_TARGET_UNITS the largest per-type target. */
#define MM_MAX_PARTIALS_PER_TOKEN (2 * MM_TARGET_UNITS * MM_GROUP_ROWS)
/* counters: one per row group of a split matrix (row_groups < TARGET when n_chunks > 1) */
#define MM_MAX_COUNTERS MM_TARGET_UNITS

/* ---- one weight block of one lane against one activation block ------------------------------------ */
/* A lane's block in registers: the pieces as 32-bit words (little-endian bytes) and the side fields. */
#define MM_MAX_WORDS 52 /* Q6_K: 13 pieces */
typedef struct mm_side {
    uint16_t d;
    uint32_t qh; /* Q5_0 */
} mm_side;

/* Read-only loads of the weights (the non-coherent path on the device; the weights never change
 * while a kernel runs, so they may be issued before the grid dependency wait).
 * Every weight load and bulk copy is marked evict-first in L2 on sm_80+ CUDA (MM_WEIGHTS_EVICT_FIRST;
 * CMake -DSPECLA_CUDA_WEIGHTS_EVICT_FIRST=OFF builds the unmarked loads, for comparisons). Why: a
 * step streams every weight once, 16 GB on the 27B shape against a 50 MB L2, so unmarked the stream
 * evicts what the step reads again soon (the kernels' code, the norms' and small matrices' rows,
 * activations, KV rows). A mark changes where lines go, never a value; the batches gain most
 * (docs/perf.md, thirty-second pass). */
#ifndef SPECLA_CUDA_WEIGHTS_EVICT_FIRST
#define SPECLA_CUDA_WEIGHTS_EVICT_FIRST 1
#endif
#if SPECLA_CUDA_WEIGHTS_EVICT_FIRST && MM_DEVICE_CODE && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && \
    !defined(SPECLA_USE_HIP)
#define MM_WEIGHTS_EVICT_FIRST 1
/* the weight loads' L2 policy (a pure asm: the compiler computes it once per kernel) */
__device__ __forceinline__ uint64_t mm_weights_policy() {
    uint64_t policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}
#else
#define MM_WEIGHTS_EVICT_FIRST 0
#endif
MM_HD uint32_t mm_ld_u32(const void *p) {
#if MM_WEIGHTS_EVICT_FIRST
    uint32_t v;
    asm("ld.global.nc.L2::cache_hint.b32 %0, [%1], %2;" : "=r"(v) : "l"(p), "l"(mm_weights_policy()));
    return v;
#elif MM_DEVICE_CODE
    return __ldg((const unsigned *)p);
#else
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
#endif
}
MM_HD uint16_t mm_ld_u16(const void *p) {
#if MM_WEIGHTS_EVICT_FIRST
    uint16_t v;
    asm("ld.global.nc.L2::cache_hint.u16 %0, [%1], %2;" : "=h"(v) : "l"(p), "l"(mm_weights_policy()));
    return v;
#elif MM_DEVICE_CODE
    return __ldg((const unsigned short *)p);
#else
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
#endif
}

/* 16 bytes at p (16-byte aligned) as 4 little-endian words: one vector load on the device. */
MM_HD void mm_load16(const void *p, uint32_t out[4]) {
#if MM_WEIGHTS_EVICT_FIRST
    asm("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(out[0]), "=r"(out[1]), "=r"(out[2]), "=r"(out[3])
        : "l"(p), "l"(mm_weights_policy()));
#elif MM_DEVICE_CODE
    const uint4 v = __ldg((const uint4 *)p);
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
#else
    memcpy(out, p, 16);
#endif
}
/* Loads of what the previous kernel wrote (activation codes, bsums, F16/BF16 terms): plain loads,
 * never __ldg. A matmul launched with programmatic dependent launch (launch.h) reads them only after
 * griddepcontrol.wait, an asm volatile with a memory clobber that no ordinary load crosses. A
 * read-only load (ld.global.nc) is an invariant load to the compiler, free to be issued before the
 * wait: it happened on branch f16-ring (cuobjdump showed an activation LDG.CONSTANT ahead of
 * ACQBULK; the GPU check caught the previous call's values). On the host: memcpy. */
MM_HD void mm_load16_act(const void *p, uint32_t out[4]) {
#if MM_DEVICE_CODE
    const uint4 v = *(const uint4 *)p;
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
#else
    memcpy(out, p, 16);
#endif
}
MM_HD uint32_t mm_ld_act_u32(const void *p) {
#if MM_DEVICE_CODE
    return *(const uint32_t *)p;
#else
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
#endif
}
/* 32 activation codes (aligned) as 8 words */
MM_HD void mm_load32(const int8_t *a, uint32_t out[8]) {
    mm_load16_act(a, out);
    mm_load16_act(a + 16, out + 4);
}
/* bsums[2j] + bsums[2j + 1] of one Q8_K block for j = 0..7, from its 16 int16 (32-byte aligned) */
MM_HD void mm_bsum_pairs(const int16_t *bsums, int32_t out[8]) {
    uint32_t w[8];
    mm_load16_act(bsums, w);
    mm_load16_act(bsums + 8, w + 4);
    for (int j = 0; j < 8; j++) out[j] = (int32_t)(int16_t)(w[j] & 0xffffu) + (int32_t)(int16_t)(w[j] >> 16);
}

MM_HD float mm_block_q8_0(const uint32_t *w, mm_side side, const int8_t *a, float da, float acc) {
    uint32_t av[8];
    mm_load32(a, av);
    int32_t s = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) s = mm_dot4((int32_t)w[i], (int32_t)av[i], s);
    return mm_fma(mm_mul(mm_half(side.d), da), mm_i2f(s), acc);
}

/* bytes minus a bias, byte by byte: levels 0..2 bias - 1 become the signed bytes -bias..bias - 1 */
MM_HD uint32_t mm_unbias(uint32_t v, uint32_t bias4) {
#if MM_DEVICE_CODE && !defined(SPECLA_USE_HIP)
    return __vsub4(v, bias4);
#else
    return ((v | 0x80808080u) - bias4) ^ 0x80808080u; /* no borrow crosses a byte: each is >= 0x80 */
#endif
}

/* spread bits 0..3 of b to bit 4 of bytes 0..3 */
MM_HD uint32_t mm_spread4_bit4(uint32_t b) {
    return ((b & 1u) | ((b & 2u) << 7) | ((b & 4u) << 14) | ((b & 8u) << 21)) << 4;
}

/* Q4_0 (bias 8) and Q5_0 (bias 16): element i < 16 is the low nibble of qs[i], i + 16 the high one. */
MM_HD float mm_block_q4_0_q5_0(const uint32_t *w, mm_side side, int is_q5, const int8_t *a, float da, float acc) {
    uint32_t av[8];
    mm_load32(a, av);
    int32_t dot = 0, suma = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint32_t lo = w[i] & 0x0F0F0F0Fu, hi = (w[i] >> 4) & 0x0F0F0F0Fu;
        if (is_q5) {
            lo |= mm_spread4_bit4((side.qh >> (4 * i)) & 15u);
            hi |= mm_spread4_bit4((side.qh >> (16 + 4 * i)) & 15u);
        }
        const int32_t a_lo = (int32_t)av[i], a_hi = (int32_t)av[4 + i];
        dot = mm_dot4((int32_t)lo, a_lo, dot);
        dot = mm_dot4((int32_t)hi, a_hi, dot);
        suma = mm_dot4(0x01010101, a_lo, suma);
        suma = mm_dot4(0x01010101, a_hi, suma);
    }
    const int32_t s = dot - (is_q5 ? 16 : 8) * suma;
    return mm_fma(mm_mul(mm_half(side.d), da), mm_i2f(s), acc);
}

/* 6-bit scale and min of sub-block j of a Q4_K block, from its 12 packed scale bytes held as three
 * little-endian words sw[0..2] (element_types.h's k_scale_min on bytes, without a byte array). */
MM_HD uint32_t mm_byte(const uint32_t *sw, int i) { return (sw[i >> 2] >> (8 * (i & 3))) & 0xffu; }

/* bytes of the pair (x, y) picked by `sel` as __byte_perm does (selector nibble i: the source byte of
 * result byte i, 0..3 from x, 4..7 from y) */
MM_HD uint32_t mm_byte_perm(uint32_t x, uint32_t y, uint32_t sel) {
#if MM_DEVICE_CODE && !defined(SPECLA_USE_HIP)
    return __byte_perm(x, y, sel);
#else
    const uint64_t both = (uint64_t)x | ((uint64_t)y << 32);
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) r |= (uint32_t)((both >> (8 * ((sel >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
    return r;
#endif
}

/* byte i (0..3, a constant after unrolling) of w, zero-extended: one PRMT on the device, where the
 * shift and mask the compiler would emit are two instructions */
MM_HD uint32_t mm_byte_of(uint32_t w, int i) { return mm_byte_perm(w, 0u, 0x4440u | (uint32_t)i); }
MM_HD void mm_scale_min(const uint32_t *sw, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = (int)(mm_byte(sw, j) & 63);
        *m = (int)(mm_byte(sw, j + 4) & 63);
    } else {
        *sc = (int)((mm_byte(sw, j + 4) & 15) | ((mm_byte(sw, j - 4) >> 6) << 4));
        *m = (int)((mm_byte(sw, j + 4) >> 4) | ((mm_byte(sw, j) >> 6) << 4));
    }
}

/* Q4_K: s = sum_j sc_j dot_j (integer), t = sum_j m_j (bsum_2j + bsum_2j+1) (integer);
 * acc = fma(da * d, s, acc); acc = fma(-(da * dmin), t, acc). `pairs` holds the eight bsum pairs;
 * the block's 256 codes are read at `a`, in global memory or where a caller staged them in shared
 * memory (matmul_ring.cuh): the same operations either way.
 * Q5_K (FIVE): the same integers and float step with 5-bit levels: the level of element l of
 * sub-block j is its Q4_K nibble plus 16 x bit j of qh[l]. Words: w[0] d | dmin, w[1..3] the scales,
 * then Q5_K's w[4..11] qh, and qs (w[4..35] for Q4_K, w[12..43] for Q5_K); qh word i holds the fifth
 * bits of elements 4i..4i+3 of every sub-block, bit j of each byte for sub-block j, so one shift and
 * mask put them at bit 4 of the dp4a operand's bytes. */
template <bool FIVE>
MM_HD float mm_block_k_pairs(const uint32_t *w, const int8_t *a, const int32_t *pairs, float da, float acc) {
    const uint32_t *qs = w + (FIVE ? 12 : 4), *qh = w + 4;
    int32_t s = 0, s16 = 0, t = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int sc, m;
        mm_scale_min(w + 1, j, &sc, &m);
        const int p = j / 2, shift = 4 * (j % 2);
        uint32_t av[8];
        mm_load32(a + 32 * j, av);
        int32_t dot = 0;
        if (!FIVE && j % 2) {
            /* Q4_K's high nibbles where they lie, as the unsigned bytes 16 x level: one mask a word
             * instead of a shift and a mask, and 16 x the sub-block's dot, exact (|16 dot| <= 16 x 32
             * x 15 x 128 < 2^20; the four odd sub-blocks' sc x 16 dot < 2^28) */
#pragma unroll
            for (int i = 0; i < 8; i++) dot = mm_dot4_us(qs[8 * p + i] & 0xF0F0F0F0u, (int32_t)av[i], dot);
            s16 += sc * dot;
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) {
                uint32_t q = (qs[8 * p + i] >> shift) & 0x0F0F0F0Fu;
                if (FIVE) q |= ((qh[i] >> j) & 0x01010101u) << 4;
                dot = mm_dot4((int32_t)q, (int32_t)av[i], dot);
            }
            s += sc * dot;
        }
        t += m * pairs[j];
    }
    s += s16 >> 4; /* a multiple of 16: the shift divides exactly, so s is the integer the oracle defines */
    const float d = mm_half((uint16_t)(w[0] & 0xffffu)), dmin = mm_half((uint16_t)(w[0] >> 16));
    acc = mm_fma(mm_mul(da, d), mm_i2f(s), acc);
    return mm_fma(-mm_mul(da, dmin), mm_i2f(t), acc);
}
MM_HD float mm_block_q4_k_pairs(const uint32_t *w, const int8_t *a, const int32_t *pairs, float da, float acc) {
    return mm_block_k_pairs<false>(w, a, pairs, da, acc);
}
MM_HD float mm_block_q4_k(const uint32_t *w, const int8_t *a, float da, const int16_t *bsums, float acc) {
    int32_t pairs[8];
    mm_bsum_pairs(bsums, pairs);
    return mm_block_k_pairs<false>(w, a, pairs, da, acc);
}
MM_HD float mm_block_q5_k(const uint32_t *w, const int8_t *a, float da, const int16_t *bsums, float acc) {
    int32_t pairs[8];
    mm_bsum_pairs(bsums, pairs);
    return mm_block_k_pairs<true>(w, a, pairs, da, acc);
}

/* Q6_K: s = sum_g sc_g sum_{i in group g} (q_i - 32) a_i over the 16 groups of 16 (integer; the
 * CPU's sc_g (dot_g - 32 bsum_g), computed so: the 6-bit levels q_i stay unsigned bytes (an unsigned
 * x signed dp4a) and the group's activation sum bs[g] takes the offset, one multiply-add per group
 * where subtracting 32 from every byte cost instructions per 4 weights); acc = fma(da * d, s, acc). */
MM_HD int32_t mm_q6_scale(const uint32_t *w, int g) { return (int8_t)(w[48 + g / 4] >> (8 * (g % 4))); }
MM_HD int32_t mm_q6_bsum(const uint32_t *bw, int g) { return (int16_t)(bw[g / 2] >> (16 * (g % 2))); }
MM_HD float mm_block_q6_k(const uint32_t *w, mm_side side, const int8_t *a, const int16_t *bs, float da, float acc) {
    const uint32_t *ql = w, *qh = w + 32;
    uint32_t bw[8]; /* the 16 group sums as 8 words of two int16 (32-byte aligned: 16 per block) */
    mm_load16_act(bs, bw), mm_load16_act(bs + 8, bw + 4);
    int32_t s = 0;
#pragma unroll
    for (int h = 0; h < 2; h++) {
#pragma unroll
        for (int jj = 0; jj < 2; jj++) { /* words 4jj..4jj+3 of each 32-byte run: one group of 16 */
            /* the codes of elements 128h + 32m + 16jj .. + 15, m = 0..3 */
            uint32_t a0[4], a1[4], a2[4], a3[4];
            const int8_t *ah = a + 128 * h + 16 * jj;
            mm_load16_act(ah, a0), mm_load16_act(ah + 32, a1), mm_load16_act(ah + 64, a2), mm_load16_act(ah + 96, a3);
            int32_t dot0 = 0, dot1 = 0, dot2 = 0, dot3 = 0;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int j = 4 * jj + i;
                const uint32_t qa = ql[16 * h + j], qb = ql[16 * h + 8 + j], qhw = qh[8 * h + j];
                const uint32_t q0 = (qa & 0x0F0F0F0Fu) | ((qhw << 4) & 0x30303030u);
                const uint32_t q1 = (qb & 0x0F0F0F0Fu) | ((qhw << 2) & 0x30303030u);
                const uint32_t q2 = ((qa >> 4) & 0x0F0F0F0Fu) | (qhw & 0x30303030u);
                const uint32_t q3 = ((qb >> 4) & 0x0F0F0F0Fu) | ((qhw >> 2) & 0x30303030u);
                dot0 = mm_dot4_us(q0, (int32_t)a0[i], dot0);
                dot1 = mm_dot4_us(q1, (int32_t)a1[i], dot1);
                dot2 = mm_dot4_us(q2, (int32_t)a2[i], dot2);
                dot3 = mm_dot4_us(q3, (int32_t)a3[i], dot3);
            }
            /* element 128h + 32m + 4j lies in group 8h + 2m + jj */
            const int g = 8 * h + jj;
            s += mm_q6_scale(w, g) * (dot0 - 32 * mm_q6_bsum(bw, g));
            s += mm_q6_scale(w, g + 2) * (dot1 - 32 * mm_q6_bsum(bw, g + 2));
            s += mm_q6_scale(w, g + 4) * (dot2 - 32 * mm_q6_bsum(bw, g + 4));
            s += mm_q6_scale(w, g + 6) * (dot3 - 32 * mm_q6_bsum(bw, g + 6));
        }
    }
    return mm_fma(mm_mul(da, mm_half(side.d)), mm_i2f(s), acc);
}

/* Float weights, a block of 32 elements: acc = fma(w_i, x_i, acc) for i = 0..31 in order. */
MM_HD float mm_weight_float(int32_t type, const uint32_t *w, int i) {
    if (type == SPECLA_TYPE_F32) {
        float f;
        memcpy(&f, w + i, 4);
        return f;
    }
    const uint16_t h = (uint16_t)(w[i / 2] >> (16 * (i % 2)));
    if (type == SPECLA_TYPE_F16) return mm_half(h);
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
MM_HD float mm_block_float(int32_t type, const uint32_t *w, const float *x, float acc) {
#pragma unroll
    for (int i = 0; i < 32; i++) acc = mm_fma(mm_weight_float(type, w, i), x[i], acc);
    return acc;
}

/* The activation operands of token b, block k. */
typedef struct mm_acts {
    const float *x;       /* float activations [n_batch][n] */
    const int8_t *codes;  /* [n_batch][n] */
    const float *scales;  /* [n_batch][n / unit] */
    const int16_t *bsums; /* Q8_K: [n_batch][n / 16] */
    const uint8_t *minops; /* Q8_K: [n_batch][n / 256][16], mm_min_operands of each block (the staged
                              tensor-core kernel's min-term operands; NULL where no kernel reads them) */
    const uint16_t *split;   /* F16/BF16 tensor-core path (matmul_float_tc.cuh): term j of token b at
                                split + (j * n_batch + b) * n, 16-bit f16/bf16 patterns */
    const float *inv_scale;  /* its F16 tokens' 2^-e, [n_batch] */
} mm_acts;

/* The min-term operands of one Q8_K activation block, for the staged tensor-core kernel
 * (matmul_tile.cuh), which computes a Q4_K block's t = sum_j m_j pair_j (pair_j = bsums[2j] +
 * bsums[2j + 1], |pair_j| <= 4064) with int8 MMAs: pair_j = 128 hi_j + lo_j exactly, lo_j = pair_j & 127
 * (0..127) and hi_j = pair_j >> 7 (arithmetic, -32..31), both int8. Bytes 0..7 hold lo_0..lo_7, bytes
 * 8..15 hi_0..hi_7. */
MM_HD void mm_min_operands(const int16_t *bsums, uint8_t out[16]) {
    for (int j = 0; j < 8; j++) {
        const int32_t pair = (int32_t)bsums[2 * j] + (int32_t)bsums[2 * j + 1];
        out[j] = (uint8_t)(pair & 127);
        out[8 + j] = (uint8_t)(int8_t)(pair >> 7);
    }
}

/* acc after block k of token b (a weight block `w`, `side` in registers): the whole per-block step. */
template <int TYPE>
MM_HD float mm_block_step(const uint32_t *w, mm_side side, const mm_acts &act, int64_t n, int b, int k, float acc) {
    const int64_t e = (int64_t)b * n + (int64_t)k * mm_unit_elements(TYPE);
    if (TYPE == SPECLA_TYPE_F32 || TYPE == SPECLA_TYPE_F16 || TYPE == SPECLA_TYPE_BF16)
        return mm_block_float(TYPE, w, act.x + e, acc);
    const float da = act.scales[(int64_t)b * (n / mm_unit_elements(TYPE)) + k];
    if (TYPE == SPECLA_TYPE_Q8_0) return mm_block_q8_0(w, side, act.codes + e, da, acc);
    if (TYPE == SPECLA_TYPE_Q4_0) return mm_block_q4_0_q5_0(w, side, 0, act.codes + e, da, acc);
    if (TYPE == SPECLA_TYPE_Q5_0) return mm_block_q4_0_q5_0(w, side, 1, act.codes + e, da, acc);
    const int16_t *bs = act.bsums + (int64_t)b * (n / 16) + (int64_t)k * 16;
    if (TYPE == SPECLA_TYPE_Q4_K) return mm_block_q4_k(w, act.codes + e, da, bs, acc);
    if (TYPE == SPECLA_TYPE_Q5_K) return mm_block_q5_k(w, act.codes + e, da, bs, acc);
    return mm_block_q6_k(w, side, act.codes + e, bs, da, acc);
}

/* Byte offset of the side fields of a slot, and of the slot of (group g, block k). */
MM_HD int64_t mm_slot_offset(int32_t type, int n_blocks, int64_t g, int k) {
    return (g * n_blocks + k) * MM_GROUP_ROWS * (int64_t)mm_unit_bytes(type);
}

/* The lane's side fields of a slot (host and device; plain loads). */
MM_HD mm_side mm_load_side(int32_t type, const uint8_t *slot, int lane) {
    mm_side s;
    s.d = 0;
    s.qh = 0;
    const uint8_t *side = slot + mm_pieces(type) * 16 * MM_GROUP_ROWS;
    if (type == SPECLA_TYPE_Q8_0 || type == SPECLA_TYPE_Q4_0 || type == SPECLA_TYPE_Q5_0 || type == SPECLA_TYPE_Q6_K)
        s.d = *(const uint16_t *)(side + 2 * lane);
    if (type == SPECLA_TYPE_Q5_0) s.qh = *(const uint32_t *)(side + 2 * MM_GROUP_ROWS + 4 * lane);
    return s;
}

#endif
