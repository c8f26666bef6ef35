#include "tensor_types.h"

#include <stdio.h>
#include <string.h>

#include "error.h"

int type_block_elements(int32_t type) {
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

int type_block_bytes(int32_t type) {
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

const char *type_name(int32_t type) {
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

int64_t type_row_bytes(int32_t type, int64_t n) {
    int be = type_block_elements(type);
    if (be == 0 || n % be != 0) return -1;
    return n / be * type_block_bytes(type);
}

float half_to_float(specla_half h) {
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

specla_half float_to_half(float f) {
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

float bf16_to_float(specla_bf16 h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

SPECLA_API int specla_type_block_elements(int32_t type) { return type_block_elements(type); }
SPECLA_API int specla_type_block_bytes(int32_t type) { return type_block_bytes(type); }

specla_status tensor_check(const specla_tensor *t, const char *kind, const char *what, int layer, int64_t ne0,
                           int64_t ne1, int must_be_f32) {
    char name[128];
    if (layer >= 0)
        snprintf(name, sizeof name, "%s blk.%d.%s", kind, layer, what);
    else
        snprintf(name, sizeof name, "%s %s", kind, what);
    if (t->data == NULL) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: missing (data is NULL)", name);
    if (type_block_elements(t->type) == 0)
        return specla_fail(SPECLA_ERR_UNSUPPORTED, "%s: unsupported type id %d", name, t->type);
    if (must_be_f32 && t->type != SPECLA_TYPE_F32)
        return specla_fail(SPECLA_ERR_UNSUPPORTED, "%s: must be F32, got %s", name, type_name(t->type));
    if (t->ne0 != ne0 || t->ne1 != ne1)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: shape {%d, %d}, expected {%lld, %lld}", name, t->ne0,
                           t->ne1, (long long)ne0, (long long)ne1);
    const int64_t row = type_row_bytes(t->type, t->ne0);
    if (row < 0)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: row length %d is not a multiple of the %s block", name,
                           t->ne0, type_name(t->type));
    if (row * t->ne1 != t->nbytes)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: %lld bytes, expected %lld", name, (long long)t->nbytes,
                           (long long)(row * t->ne1));
    return SPECLA_OK;
}

specla_status logit_head_check(const specla_tensor *head, int32_t n_embd, int32_t n_vocab, const char *op) {
    if (head->ne1 < 1 || head->ne1 > n_vocab)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: %lld rows, must be in [1, n_vocab = %d]", op,
                           (long long)head->ne1, n_vocab);
    return tensor_check(head, "logit head", "rows", -1, n_embd, head->ne1, 0);
}
