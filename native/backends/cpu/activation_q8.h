/* 8-bit activation blocks: how a float activation row meets a quantized weight row.
 *
 * For the weight types below, a matmul does not multiply float activations: each activation row is
 * first rounded to 8-bit blocks (once per row and matmul), and every weight block is then dotted
 * with its activation block in exact integer arithmetic. The scheme and its numbers are llama.cpp's
 * (its vec_dot types), so our logits see the same rounding as llama.cpp's CPU backend:
 *   Q8_0, Q4_0, Q5_0 weights  <-  act_q8_0 blocks of 32 (llama.cpp's Q8_0 as its AVX2 path makes
 *                                 them: d = amax / 127 stored as fp16, q = round-half-even(x * 127 / amax))
 *   Q4_K, Q6_K weights        <-  act_q8_k blocks of 256 (llama.cpp's Q8_K: the signed value of
 *                                 largest magnitude maps to -127, q = min(127, rint(x * -127 / max)),
 *                                 d = 1 / (-127 / max) in f32; bsums = sums of q over 16-element groups)
 * Other weight types (F32, F16, BF16, Q4_1, Q5_1, Q5_K) keep float activations.
 *
 * Why: an integer multiply-add handles 32 weight x activation products per AVX2 instruction, four
 * times the float FMA's 8, so one pass over the weights can serve many verify rows cheaply. Batch
 * invariance is untouched: a row's blocks depend on that row alone, integer sums are exact, and
 * the few float operations per block run in a fixed order (matmul_scalar.c documents it).
 *
 * A block holding a NaN or an infinity gets d = NaN, so the bad value shows in the output as it
 * would with float activations (instead of vanishing into a zero code). A block whose largest
 * magnitude is below ~1e-36 (127 / amax overflows) is stored as zero. As in llama.cpp, a Q8_0 scale
 * is fp16: blocks beyond its range (amax > ~8e6 gives an infinite scale, so the output shows it) or
 * far below it (amax < ~4e-6 rounds to zero) are not represented; real activations sit well inside.
 *
 * The quantizers are plain C shared by every kernel set, so all of them see identical codes. */
#ifndef SPECLA_ACTIVATION_Q8_H
#define SPECLA_ACTIVATION_Q8_H
#include <stdint.h>

#include "activation_blocks.h"
#include "specla.h"

/* n a multiple of 32 (q8_0) or 256 (q8_k); out has n / 32 or n / 256 blocks. */
void act_quantize_q8_0(const float *x, int64_t n, act_q8_0 *out);
void act_quantize_q8_k(const float *x, int64_t n, act_q8_k *out);

#endif
