/* Quantization block layouts, shared by every backend. Byte-exact with GGML's (checked by the
 * static_asserts and, in tests, by comparing dequantization with gguf.quants.dequantize). */
#ifndef SPECLA_TENSOR_TYPES_H
#define SPECLA_TENSOR_TYPES_H
#include <assert.h>
#include <stdint.h>

#include "specla.h"

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
static_assert(sizeof(block_q4_0) == 18, "block_q4_0 size");

/* Q4_1: x = d * q + m, nibbles as Q4_0 */
typedef struct {
    specla_half d;
    specla_half m;
    uint8_t qs[QK4_1 / 2];
} block_q4_1;
static_assert(sizeof(block_q4_1) == 20, "block_q4_1 size");

/* Q5_0: x = d * (q - 16); low 4 bits as Q4_0, bit 4 of element l is bit l of qh (little-endian u32) */
typedef struct {
    specla_half d;
    uint8_t qh[4];
    uint8_t qs[QK5_0 / 2];
} block_q5_0;
static_assert(sizeof(block_q5_0) == 22, "block_q5_0 size");

/* Q5_1: x = d * q + m, bits as Q5_0 */
typedef struct {
    specla_half d;
    specla_half m;
    uint8_t qh[4];
    uint8_t qs[QK5_1 / 2];
} block_q5_1;
static_assert(sizeof(block_q5_1) == 24, "block_q5_1 size");

/* Q8_0: x = d * q */
typedef struct {
    specla_half d;
    int8_t qs[QK8_0];
} block_q8_0;
static_assert(sizeof(block_q8_0) == 34, "block_q8_0 size");

/* Q4_K: x = d * sc * q - dmin * m, 8 sub-blocks of 32 with 6-bit scales/mins packed in 12 bytes */
typedef struct {
    specla_half d;
    specla_half dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qs[QK_K / 2];
} block_q4_K;
static_assert(sizeof(block_q4_K) == 144, "block_q4_K size");

/* 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block's 12 packed bytes. */
static inline void k_scale_min(const uint8_t *s, int j, int *sc, int *m) {
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
static_assert(sizeof(block_q5_K) == 176, "block_q5_K size");

/* Q6_K: x = d * sc * (q - 32), 16 int8 scales, d stored last */
typedef struct {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    specla_half d;
} block_q6_K;
static_assert(sizeof(block_q6_K) == 210, "block_q6_K size");

/* Elements per block and bytes per block; 0 when the type is not supported. */
int type_block_elements(int32_t type);
int type_block_bytes(int32_t type);
const char *type_name(int32_t type);
/* Bytes of one row of n elements (n a multiple of the block); -1 when not representable. */
int64_t type_row_bytes(int32_t type, int64_t n);

/* Shape, type and byte-count check of one weight view handed in through the ABI. The tensor is
 * named "<kind> blk.<layer>.<what>" (layer < 0: "<kind> <what>") in the message. */
specla_status tensor_check(const specla_tensor *t, const char *kind, const char *what, int layer, int64_t ne0,
                           int64_t ne1, int must_be_f32);
/* A chosen LM head handed to a set_logit_head call ({n_embd, n} rows, 1 <= n <= n_vocab); op names
 * the call in the message. */
specla_status logit_head_check(const specla_tensor *head, int32_t n_embd, int32_t n_vocab, const char *op);

float half_to_float(specla_half h);
specla_half float_to_half(float f);
float bf16_to_float(specla_bf16 h);

#endif
