#include "tensor_types.h"

#include <stdio.h>
#include <string.h>

#include "error.h"

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
