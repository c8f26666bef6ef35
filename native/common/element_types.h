/* Tensor element types every backend shares: the quantization block layouts (byte-exact with
 * GGML's, checked by the static_asserts and, in tests, against gguf.quants.dequantize), their
 * sizes, and the fp16 / bf16 conversions. Header-only, plain C that C, C++ and CUDA/HIP host code
 * all compile, so a backend includes it without reaching into the core (native/src). */
#ifndef SPECLA_ELEMENT_TYPES_H
#define SPECLA_ELEMENT_TYPES_H
#include <stdint.h>
#include <string.h>

#include "specla.h"

/* The conversions and the type table serve host code and GPU kernels alike. */
#if defined(__CUDACC__) || defined(__HIPCC__) || defined(__HIP__)
#define SPECLA_HOST_DEVICE __host__ __device__
#else
#define SPECLA_HOST_DEVICE
#endif

#ifdef __cplusplus
#define SPECLA_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#include <assert.h>
#define SPECLA_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK_K 256
#define K_SCALE_SIZE 12

typedef uint16_t specla_half; /* IEEE binary16 bits */
typedef uint16_t specla_bf16; /* bfloat16 bits */

/* Q4_0: x = d * (q - 8); element l < 16 is the low nibble of qs[l], element l + 16 its high nibble */
typedef struct {
    specla_half d;
    uint8_t qs[QK4_0 / 2];
} block_q4_0;
SPECLA_STATIC_ASSERT(sizeof(block_q4_0) == 18, "block_q4_0 size");

/* Q4_1: x = d * q + m, nibbles as Q4_0 */
typedef struct {
    specla_half d;
    specla_half m;
    uint8_t qs[QK4_1 / 2];
} block_q4_1;
SPECLA_STATIC_ASSERT(sizeof(block_q4_1) == 20, "block_q4_1 size");

/* Q5_0: x = d * (q - 16); low 4 bits as Q4_0, bit 4 of element l is bit l of qh (little-endian u32) */
typedef struct {
    specla_half d;
    uint8_t qh[4];
    uint8_t qs[QK5_0 / 2];
} block_q5_0;
SPECLA_STATIC_ASSERT(sizeof(block_q5_0) == 22, "block_q5_0 size");

/* Q5_1: x = d * q + m, bits as Q5_0 */
typedef struct {
    specla_half d;
    specla_half m;
    uint8_t qh[4];
    uint8_t qs[QK5_1 / 2];
} block_q5_1;
SPECLA_STATIC_ASSERT(sizeof(block_q5_1) == 24, "block_q5_1 size");

/* Q8_0: x = d * q */
typedef struct {
    specla_half d;
    int8_t qs[QK8_0];
} block_q8_0;
SPECLA_STATIC_ASSERT(sizeof(block_q8_0) == 34, "block_q8_0 size");

/* Q4_K: x = d * sc * q - dmin * m, 8 sub-blocks of 32 with 6-bit scales/mins packed in 12 bytes */
typedef struct {
    specla_half d;
    specla_half dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qs[QK_K / 2];
} block_q4_K;
SPECLA_STATIC_ASSERT(sizeof(block_q4_K) == 144, "block_q4_K size");

/* 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block's 12 packed bytes. */
static inline SPECLA_HOST_DEVICE void k_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Q5_K: Q4_K plus one high bit per element in qh */
typedef struct {
    specla_half d;
    specla_half dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
} block_q5_K;
SPECLA_STATIC_ASSERT(sizeof(block_q5_K) == 176, "block_q5_K size");

/* Q6_K: x = d * sc * (q - 32), 16 int8 scales, d stored last */
typedef struct {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    specla_half d;
} block_q6_K;
SPECLA_STATIC_ASSERT(sizeof(block_q6_K) == 210, "block_q6_K size");

/* Elements per block and bytes per block; 0 when the type is not supported. */
static inline SPECLA_HOST_DEVICE int type_block_elements(int32_t type) {
    switch (type) {
    case SPECLA_TYPE_F32:
    case SPECLA_TYPE_F16:
    case SPECLA_TYPE_BF16: return 1;
    case SPECLA_TYPE_Q4_0: return QK4_0;
    case SPECLA_TYPE_Q4_1: return QK4_1;
    case SPECLA_TYPE_Q5_0: return QK5_0;
    case SPECLA_TYPE_Q5_1: return QK5_1;
    case SPECLA_TYPE_Q8_0: return QK8_0;
    case SPECLA_TYPE_Q4_K:
    case SPECLA_TYPE_Q5_K:
    case SPECLA_TYPE_Q6_K: return QK_K;
    default: return 0;
    }
}

static inline SPECLA_HOST_DEVICE int type_block_bytes(int32_t type) {
    switch (type) {
    case SPECLA_TYPE_F32: return 4;
    case SPECLA_TYPE_F16:
    case SPECLA_TYPE_BF16: return 2;
    case SPECLA_TYPE_Q4_0: return (int)sizeof(block_q4_0);
    case SPECLA_TYPE_Q4_1: return (int)sizeof(block_q4_1);
    case SPECLA_TYPE_Q5_0: return (int)sizeof(block_q5_0);
    case SPECLA_TYPE_Q5_1: return (int)sizeof(block_q5_1);
    case SPECLA_TYPE_Q8_0: return (int)sizeof(block_q8_0);
    case SPECLA_TYPE_Q4_K: return (int)sizeof(block_q4_K);
    case SPECLA_TYPE_Q5_K: return (int)sizeof(block_q5_K);
    case SPECLA_TYPE_Q6_K: return (int)sizeof(block_q6_K);
    default: return 0;
    }
}

static inline const char *type_name(int32_t type) {
    switch (type) {
    case SPECLA_TYPE_F32: return "F32";
    case SPECLA_TYPE_F16: return "F16";
    case SPECLA_TYPE_BF16: return "BF16";
    case SPECLA_TYPE_Q4_0: return "Q4_0";
    case SPECLA_TYPE_Q4_1: return "Q4_1";
    case SPECLA_TYPE_Q5_0: return "Q5_0";
    case SPECLA_TYPE_Q5_1: return "Q5_1";
    case SPECLA_TYPE_Q8_0: return "Q8_0";
    case SPECLA_TYPE_Q4_K: return "Q4_K";
    case SPECLA_TYPE_Q5_K: return "Q5_K";
    case SPECLA_TYPE_Q6_K: return "Q6_K";
    default: return "unsupported";
    }
}

/* Bytes of one row of n elements (n a multiple of the block); -1 when not representable. */
static inline SPECLA_HOST_DEVICE int64_t type_row_bytes(int32_t type, int64_t n) {
    int be = type_block_elements(type);
    if (be == 0 || n % be != 0) return -1;
    return n / be * type_block_bytes(type);
}

/* Exact binary16 -> binary32 conversion, subnormals and inf/nan included. */
static inline SPECLA_HOST_DEVICE float half_to_float(specla_half h) {
    /* Exact binary16 -> binary32 conversion, subnormals and inf/nan included. */
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                mant <<= 1;
            } while ((mant & 0x400) == 0);
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((mant & 0x3ff) << 13);
        }
    } else if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* binary32 -> binary16, round to nearest even (what F16C's vcvtps2ph with mode 0 does). */
static inline SPECLA_HOST_DEVICE specla_half float_to_half(float f) {
    /* binary32 -> binary16, round to nearest even (what F16C's vcvtps2ph with mode 0 does). */
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) return (specla_half)(sign | 0x7e00u); /* NaN */
    if (x >= 0x47800000u) return (specla_half)(sign | 0x7c00u); /* >= 65536 (or inf): inf */
    if (x < 0x38800000u) { /* below the smallest normal half, 2^-14: a subnormal or zero */
        if (x < 0x33000000u) return (specla_half)sign; /* <= 2^-25 rounds to (even) zero */
        const uint32_t m = (x & 0x7fffffu) | 0x800000u;
        const int shift = 126 - (int)(x >> 23); /* f / 2^-24 = m >> shift, in 1 .. 24 */
        uint32_t q = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (specla_half)(sign | q);
    }
    uint32_t h = (x - 0x38000000u) >> 13; /* rebias 127 -> 15, keep 10 mantissa bits */
    const uint32_t rem = x & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++; /* a carry into the exponent is right */
    return (specla_half)(sign | h);
}

static inline SPECLA_HOST_DEVICE float bf16_to_float(specla_bf16 h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

#endif
