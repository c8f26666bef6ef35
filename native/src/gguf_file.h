/* A read-only GGUF (v2/v3, little-endian) mapped into memory: the key/value table and the tensor
 * table, every offset and length checked against the file's size before it is read, so a truncated
 * or corrupt file is an error naming the path and the key or tensor at fault, never a crash.
 * Only what a model loader needs: look up a key (typed reads below) and a tensor (a view into the
 * mapping). The mapping lives until gguf_file_close. */
#ifndef SPECLA_GGUF_FILE_H
#define SPECLA_GGUF_FILE_H
#include <stddef.h>
#include <stdint.h>

#include "specla.h"

/* GGUF value types (gguf.h's enum gguf_type). */
enum {
    GGUF_VALUE_UINT8 = 0,
    GGUF_VALUE_INT8 = 1,
    GGUF_VALUE_UINT16 = 2,
    GGUF_VALUE_INT16 = 3,
    GGUF_VALUE_UINT32 = 4,
    GGUF_VALUE_INT32 = 5,
    GGUF_VALUE_FLOAT32 = 6,
    GGUF_VALUE_BOOL = 7,
    GGUF_VALUE_STRING = 8,
    GGUF_VALUE_ARRAY = 9,
    GGUF_VALUE_UINT64 = 10,
    GGUF_VALUE_INT64 = 11,
    GGUF_VALUE_FLOAT64 = 12,
};

typedef struct gguf_kv {
    const char *key;       /* NUL-terminated copy */
    int32_t type;          /* GGUF_VALUE_* */
    int32_t item_type;     /* element type of an ARRAY, else = type */
    uint64_t n_items;      /* ARRAY length, else 1 */
    const uint8_t *value;  /* scalar bytes, or the first element of a scalar array; for strings the
                              u64 length that precedes the first string's bytes */
} gguf_kv;

typedef struct gguf_tensor_info {
    const char *name;      /* NUL-terminated copy */
    int32_t n_dims;
    int32_t type;          /* GGML type id */
    int64_t ne[4];         /* unused dims are 1 */
    const void *data;      /* inside the mapping */
    int64_t nbytes;
} gguf_tensor_info;

typedef struct gguf_file {
    char *path;
    const uint8_t *map;
    size_t size;
    uint32_t version;
    int64_t n_kv, n_tensors;
    gguf_kv *kv;
    gguf_tensor_info *tensors;
} gguf_file;

/* Map and index `path`. On failure returns non-zero with a message "<path>: ..." for
 * specla_last_error and *out = NULL. */
specla_status gguf_file_open(const char *path, gguf_file **out);
void gguf_file_close(gguf_file *file);

const gguf_kv *gguf_find_kv(const gguf_file *file, const char *key);
const gguf_tensor_info *gguf_find_tensor(const gguf_file *file, const char *name);
/* Name of a GGUF value type ("string", "float32"). */
const char *gguf_value_type_name(int32_t type);
/* GGML name of a tensor type ("Q4_K"), "unknown" for an id GGUF does not define. */
const char *gguf_type_name(int32_t type);

/* Typed reads of one value. An integer value is any integer type (not BOOL); a number any integer
 * or float type. Return 0 when the value has another type (the caller names the key). */
int gguf_value_int(int32_t type, const uint8_t *value, int64_t *out);
int gguf_value_number(int32_t type, const uint8_t *value, double *out);
/* Element i of an array of a scalar type (integers, floats, BOOL) as it is stored. */
const uint8_t *gguf_array_item(const gguf_kv *kv, uint64_t i);
/* Bytes of one value of a scalar type; 0 for STRING / ARRAY / unknown. */
size_t gguf_value_size(int32_t type);
/* A STRING value: *out points into the mapping (not NUL-terminated), *len its bytes. */
int gguf_value_string(const gguf_kv *kv, const char **out, uint64_t *len);

#endif
