/* A reduced LM head named by row ids (specla_context_set_logit_rows and the draft's twin): the
 * chosen rows are gathered inside the backend's memory from the head the backend already holds (the
 * host view on the CPU, the device copy laid out for the matmul on a GPU: gather_weight_rows), so a
 * GPU never uploads head rows again, only the ids; a vocabulary that grows only gathers its new
 * rows. */
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "error.h"
#include "tensor_types.h"

void logit_rows_release(logit_row_set *set, const backend *be) {
    if (set->memory) be->ops->free(be, set->memory);
    if (set->ids_on_backend) be->ops->free(be, set->ids_on_backend);
    free(set->ids);
    memset(set, 0, sizeof *set);
}

/* Bytes of `rows` rows of head in backend memory, as the backend's matmul reads them. */
static size_t head_rows_bytes(const backend *be, const specla_tensor *head, int32_t rows) {
    if (be->ops->host_memory) return (size_t)type_row_bytes(head->type, head->ne0) * (size_t)rows;
    specla_tensor shape = *head;
    shape.data = NULL;
    shape.ne1 = rows;
    shape.nbytes = type_row_bytes(head->type, head->ne0) * rows;
    return be->ops->weight_bytes(be, &shape, WEIGHT_MATMUL);
}

specla_tensor logit_rows_scored_head(const logit_row_set *set, const specla_tensor *head, const int32_t **n_valid) {
    specla_tensor scored = *head;
    *n_valid = NULL;
    if (set->memory && head->data == set->memory) {
        scored.nbytes = type_row_bytes(head->type, head->ne0) * set->capacity;
        scored.ne1 = set->capacity;
        *n_valid = logit_rows_count(set);
    }
    return scored;
}

specla_status logit_head_set(const backend *be, const specla_tensor *head, const specla_tensor *full, int32_t n_embd,
                             int32_t n_vocab, specla_tensor *out_head, const char *op, const char *rows_op) {
    if (!head) {
        *out_head = *full;
        return SPECLA_OK;
    }
    SPECLA_TRY(logit_head_check(head, n_embd, n_vocab, op));
    if (!be->ops->host_memory)
        return specla_fail(SPECLA_ERR_UNSUPPORTED, "%s: host rows cannot feed a %s context; name the rows by id (%s)",
                           op, be->ops->name, rows_op);
    *out_head = *head;
    return SPECLA_OK;
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
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= n_vocab)
            return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: ids[%d] = %d is outside [0, %d)", op, i, ids[i],
                               n_vocab);
    const int64_t row_bytes = type_row_bytes(head->type, head->ne0);
    int32_t keep = 0; /* rows already in place: the unchanged prefix of ids */
    if (n > set->capacity) {
        /* Grow with headroom so that a growing vocabulary reallocates rarely (everything is then
         * re-gathered). The LM-head matmuls multiply all capacity rows (logit_rows_scored_head), so the
         * headroom is a small share of n: 1024 rows or n / 32. */
        const int32_t headroom = n / 32 > 1024 ? n / 32 : 1024;
        const int32_t capacity = n < n_vocab - headroom ? n + headroom : n_vocab;
        const size_t bytes = head_rows_bytes(be, head, capacity);
        if (bytes == 0)
            return specla_fail(SPECLA_ERR_UNSUPPORTED, "%s: backend %s cannot hold rows of this LM head's type", op,
                               be->ops->name);
        void *memory = be->ops->alloc(be, bytes);
        int32_t *ids_on_backend = (int32_t *)be->ops->alloc(be, sizeof(int32_t) * ((size_t)capacity + 1));
        int32_t *host_ids = (int32_t *)malloc(sizeof(int32_t) * (size_t)capacity);
        if (!memory || !ids_on_backend || !host_ids) {
            if (memory) be->ops->free(be, memory);
            if (ids_on_backend) be->ops->free(be, ids_on_backend);
            free(host_ids);
            return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "%s: out of memory for %d head rows", op, n);
        }
        logit_rows_release(set, be);
        set->memory = memory;
        set->ids_on_backend = ids_on_backend;
        set->ids = host_ids;
        set->capacity = capacity;
    } else {
        while (keep < n && keep < set->n && set->ids[keep] == ids[keep]) keep++;
    }
    memcpy(set->ids + keep, ids + keep, sizeof(int32_t) * (size_t)(n - keep));
    be->ops->upload(be, set->ids_on_backend + keep, set->ids + keep, sizeof(int32_t) * (size_t)(n - keep));
    be->ops->gather_weight_rows(be, head, set->ids_on_backend + keep, n - keep, set->memory, keep);
    set->n = n;
    be->ops->upload(be, set->ids_on_backend + set->capacity, &set->n, sizeof(int32_t)); /* logit_rows_count */
    *out_head = *head;
    out_head->data = set->memory;
    out_head->ne1 = n;
    out_head->nbytes = row_bytes * n;
    return SPECLA_OK;
}
