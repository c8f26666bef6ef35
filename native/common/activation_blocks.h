/* The 8-bit activation blocks a quantized matmul feeds its integer dot products: their layout and
 * which weight types take which. Shared by every backend so that all of them round activations
 * the same way (the scheme and why: native/backends/cpu/activation_q8.h). */
#ifndef SPECLA_ACTIVATION_BLOCKS_H
#define SPECLA_ACTIVATION_BLOCKS_H
#include <stdint.h>

#include "specla.h"

typedef struct act_q8_0 {
    float d;        /* the fp16-rounded scale, as a float */
    int8_t qs[32];
} act_q8_0;

typedef struct act_q8_k {
    float d;
    int8_t qs[256];
    int16_t bsums[16]; /* bsums[g] = qs[16g] + ... + qs[16g + 15] */
} act_q8_k;

/* Which activation blocks a weight type takes: 0 = float activations. */
enum { ACT_FLOAT = 0, ACT_Q8_0 = 1, ACT_Q8_K = 2 };
static inline int act_kind_for_weight(int32_t weight_type) {
    switch (weight_type) {
    case SPECLA_TYPE_Q8_0:
    case SPECLA_TYPE_Q4_0:
    case SPECLA_TYPE_Q5_0: return ACT_Q8_0;
    case SPECLA_TYPE_Q4_K:
    case SPECLA_TYPE_Q6_K: return ACT_Q8_K;
    default: return ACT_FLOAT;
    }
}

#endif
