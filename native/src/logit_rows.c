/* A reduced LM head named by row ids (specla_context_set_logit_rows and the draft's twin): the
 * chosen rows are copied inside the backend's memory from the head the backend already holds, so a
 * GPU never uploads head rows again; a vocabulary that grows only gathers its new rows. */
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "error.h"
#include "tensor_types.h"

void logit_rows_release(logit_row_set *set, const backend *be) {
    if (set->memory) be->ops->free(be, set->memory);
    free(set->ids);
    memset(set, 0, sizeof *set);
}

specla_status logit_rows_select(logit_row_set *set, const backend *be, const specla_tensor *head, int32_t n_vocab,
                                const int32_t *ids, int32_t n, specla_tensor *out_head, const char *op) {
    if (n < 0 || n > n_vocab)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: %d rows, must be in [0, n_vocab = %d]", op, n, n_vocab);
    if (n == 0) {
        *out_head = *head;
        return SPECLA_OK;
    }
    if (!ids) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: ids is NULL", op);
    if (!be->ops->host_memory)
        /* a device LM head is laid out for the backend's matmul (rows interleaved), so rows are not
         * byte ranges there; gathering them needs the backend's own gather op (not written yet) */
        return specla_fail(SPECLA_ERR_UNSUPPORTED, "%s: not available on backend %s yet", op, be->ops->name);
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= n_vocab)
            return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: ids[%d] = %d is outside [0, %d)", op, i, ids[i],
                               n_vocab);
    const int64_t row_bytes = type_row_bytes(head->type, head->ne0);
    int32_t keep = 0; /* rows already in place: the unchanged prefix of ids */
    if (n > set->capacity) {
        /* grow with headroom so a growing vocabulary reallocates rarely; everything is re-gathered */
        int32_t capacity = n < n_vocab / 2 ? 2 * n : n_vocab;
        void *memory = be->ops->alloc(be, (size_t)(row_bytes * capacity));
        int32_t *host_ids = (int32_t *)malloc(sizeof(int32_t) * (size_t)capacity);
        if (!memory || !host_ids) {
            if (memory) be->ops->free(be, memory);
            free(host_ids);
            return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "%s: out of memory for %d head rows", op, n);
        }
        logit_rows_release(set, be);
        set->memory = memory;
        set->ids = host_ids;
        set->capacity = capacity;
    } else {
        while (keep < n && keep < set->n && set->ids[keep] == ids[keep]) keep++;
    }
    const uint8_t *from = (const uint8_t *)head->data;
    uint8_t *to = (uint8_t *)set->memory;
    for (int32_t i = keep; i < n; i++)
        be->ops->copy(be, to + (int64_t)i * row_bytes, from + (int64_t)ids[i] * row_bytes, (size_t)row_bytes);
    memcpy(set->ids + keep, ids + keep, sizeof(int32_t) * (size_t)(n - keep));
    set->n = n;
    *out_head = *head;
    out_head->data = set->memory;
    out_head->ne1 = n;
    out_head->nbytes = row_bytes * n;
    return SPECLA_OK;
}
