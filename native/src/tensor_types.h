/* Checks of tensor views handed in through the ABI (the core's side of tensor types; the type
 * table and block layouts every backend shares are in native/common/tensor_types.h). */
#ifndef SPECLA_TENSOR_TYPES_H
#define SPECLA_TENSOR_TYPES_H
#include "specla.h"
#include "element_types.h"

/* Shape, type and byte-count check of one weight view handed in through the ABI. The tensor is
 * named "<kind> blk.<layer>.<what>" (layer < 0: "<kind> <what>") in the message. */
specla_status tensor_check(const specla_tensor *t, const char *kind, const char *what, int layer, int64_t ne0,
                           int64_t ne1, int must_be_f32);
/* A chosen LM head handed to a set_logit_head call ({n_embd, n} rows, 1 <= n <= n_vocab); op names
 * the call in the message. */
specla_status logit_head_check(const specla_tensor *head, int32_t n_embd, int32_t n_vocab, const char *op);

#endif
