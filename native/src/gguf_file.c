/* gguf_file: map a GGUF read-only and index its key/value and tensor tables (see gguf_file.h).
 * Every read goes through a cursor that checks the bytes exist first; counts are bounded by the
 * bytes left before anything is allocated for them. */
#include "gguf_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4 /* GGML_MAX_DIMS */

typedef struct cursor {
    const gguf_file *file;
    size_t at;
} cursor;

/* Fails with "<path>: <what> needs N bytes at offset O but the file has S bytes". */
static specla_status need(const cursor *c, uint64_t n, const char *what) {
    if (n > c->file->size || c->at > c->file->size - n)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                           "%s: %s needs %llu bytes at offset %zu but the file has %zu bytes (truncated or corrupt)",
                           c->file->path, what, (unsigned long long)n, c->at, c->file->size);
    return SPECLA_OK;
}

/* n bytes at the cursor into out (a little-endian scalar on the little-endian hosts we build for). */
static specla_status read_raw(cursor *c, void *out, size_t n, const char *what) {
    specla_status s = need(c, n, what);
    if (s) return s;
    memcpy(out, c->file->map + c->at, n);
    c->at += n;
    return SPECLA_OK;
}

static specla_status read_u32(cursor *c, uint32_t *out, const char *what) { return read_raw(c, out, 4, what); }
static specla_status read_u64(cursor *c, uint64_t *out, const char *what) { return read_raw(c, out, 8, what); }

/* A GGUF string (u64 length + bytes) copied into a NUL-terminated heap string; a NUL inside is
 * refused since it would cut the name short. */
static specla_status read_name(cursor *c, char **out, const char *what) {
    uint64_t len;
    specla_status s = read_u64(c, &len, what);
    if (s) return s;
    if ((s = need(c, len, what))) return s;
    const char *bytes = (const char *)c->file->map + c->at;
    if (memchr(bytes, '\0', (size_t)len))
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: %s contains a NUL byte", c->file->path, what);
    char *name = (char *)malloc((size_t)len + 1);
    if (!name) return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "%s: out of memory reading %s", c->file->path, what);
    memcpy(name, bytes, (size_t)len);
    name[len] = '\0';
    c->at += (size_t)len;
    *out = name;
    return SPECLA_OK;
}

/* The name of entry #index of a section (kind "key" or "tensor"), and `where`: how later messages
 * about that entry name it ("key 'general.name'"). */
#define GGUF_WHERE_BYTES 320
static specla_status read_entry_name(cursor *c, const char *kind, int64_t index, char **name,
                                     char where[GGUF_WHERE_BYTES]) {
    char what[96];
    snprintf(what, sizeof what, "%s #%lld", kind, (long long)index);
    specla_status s = read_name(c, name, what);
    if (s) return s;
    snprintf(where, GGUF_WHERE_BYTES, "%s '%.256s'", kind, *name);
    return SPECLA_OK;
}

const char *gguf_value_type_name(int32_t type) {
    static const char *names[] = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
                                  "bool", "string", "array", "uint64", "int64", "float64"};
    return type >= 0 && type < (int32_t)(sizeof names / sizeof names[0]) ? names[type] : "unknown";
}

size_t gguf_value_size(int32_t type) {
    switch (type) {
    case GGUF_VALUE_UINT8: case GGUF_VALUE_INT8: case GGUF_VALUE_BOOL: return 1;
    case GGUF_VALUE_UINT16: case GGUF_VALUE_INT16: return 2;
    case GGUF_VALUE_UINT32: case GGUF_VALUE_INT32: case GGUF_VALUE_FLOAT32: return 4;
    case GGUF_VALUE_UINT64: case GGUF_VALUE_INT64: case GGUF_VALUE_FLOAT64: return 8;
    default: return 0;
    }
}

/* Skips one STRING value, checking its bytes exist. */
static specla_status skip_string(cursor *c, const char *what) {
    uint64_t len;
    specla_status s = read_u64(c, &len, what);
    if (s) return s;
    if ((s = need(c, len, what))) return s;
    c->at += (size_t)len;
    return SPECLA_OK;
}

static specla_status read_kv(cursor *c, int64_t index, gguf_kv *kv) {
    char where[GGUF_WHERE_BYTES];
    specla_status s = read_entry_name(c, "key", index, (char **)&kv->key, where);
    if (s) return s;
    uint32_t type;
    if ((s = read_u32(c, &type, where))) return s;
    kv->type = (int32_t)type;
    kv->item_type = (int32_t)type;
    kv->n_items = 1;
    if (type == GGUF_VALUE_STRING) {
        kv->value = c->file->map + c->at;
        return skip_string(c, where);
    }
    if (type != GGUF_VALUE_ARRAY) {
        const size_t size = gguf_value_size((int32_t)type);
        if (size == 0)
            return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: %s has unknown value type %u", c->file->path, where,
                               type);
        if ((s = need(c, size, where))) return s;
        kv->value = c->file->map + c->at;
        c->at += size;
        return SPECLA_OK;
    }
    uint32_t item_type;
    uint64_t n;
    if ((s = read_u32(c, &item_type, where)) || (s = read_u64(c, &n, where))) return s;
    kv->item_type = (int32_t)item_type;
    kv->n_items = n;
    kv->value = c->file->map + c->at;
    if (item_type == GGUF_VALUE_STRING) {
        if ((s = need(c, n > UINT64_MAX / 8 ? UINT64_MAX : n * 8, where))) return s; /* bounds the loop */
        for (uint64_t i = 0; i < n; i++)
            if ((s = skip_string(c, where))) return s;
        return SPECLA_OK;
    }
    if (item_type == GGUF_VALUE_ARRAY)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: %s is a nested array (not supported, as in llama.cpp)",
                           c->file->path, where);
    const size_t size = gguf_value_size((int32_t)item_type);
    if (size == 0)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: %s is an array of unknown value type %u", c->file->path,
                           where, item_type);
    if ((s = need(c, n > UINT64_MAX / size ? UINT64_MAX : n * size, where))) return s;
    c->at += (size_t)(n * size);
    return SPECLA_OK;
}

/* Name, dims, type and relative offset of one tensor; data is resolved once the data section's
 * start is known. */
static specla_status read_tensor_info(cursor *c, int64_t index, gguf_tensor_info *t, uint64_t *offset) {
    char where[GGUF_WHERE_BYTES];
    specla_status s = read_entry_name(c, "tensor", index, (char **)&t->name, where);
    if (s) return s;
    uint32_t n_dims, type;
    if ((s = read_u32(c, &n_dims, where))) return s;
    if (n_dims > GGUF_MAX_DIMS)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: %s has %u dimensions (at most %d)", c->file->path, where,
                           n_dims, GGUF_MAX_DIMS);
    t->n_dims = (int32_t)n_dims;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        uint64_t ne;
        if ((s = read_u64(c, &ne, where))) return s;
        if (ne > (uint64_t)INT64_MAX / 2)
            return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: %s dimension %u is %llu (corrupt)", c->file->path,
                               where, d, (unsigned long long)ne);
        t->ne[d] = (int64_t)ne;
    }
    if ((s = read_u32(c, &type, where)) || (s = read_u64(c, offset, where))) return s;
    t->type = (int32_t)type;
    return SPECLA_OK;
}

/* Block size of every GGML type a GGUF may hold (ggml's type traits), so that the bytes of a tensor
 * libspecla does not compute with (an MTP block's, say) are still bounds-checked; whether a type
 * can be computed with is the loader's question (type_block_elements). */
typedef struct ggml_block {
    int32_t type;
    int32_t elements, bytes;
    const char *name;
} ggml_block;
static const ggml_block GGML_BLOCKS[] = {
    {0, 1, 4, "F32"},        {1, 1, 2, "F16"},          {2, 32, 18, "Q4_0"},     {3, 32, 20, "Q4_1"},
    {6, 32, 22, "Q5_0"},     {7, 32, 24, "Q5_1"},       {8, 32, 34, "Q8_0"},     {9, 32, 40, "Q8_1"},
    {10, 256, 84, "Q2_K"},   {11, 256, 110, "Q3_K"},    {12, 256, 144, "Q4_K"},  {13, 256, 176, "Q5_K"},
    {14, 256, 210, "Q6_K"},  {15, 256, 292, "Q8_K"},    {16, 256, 66, "IQ2_XXS"}, {17, 256, 74, "IQ2_XS"},
    {18, 256, 98, "IQ3_XXS"}, {19, 256, 50, "IQ1_S"},   {20, 32, 18, "IQ4_NL"},  {21, 256, 110, "IQ3_S"},
    {22, 256, 82, "IQ2_S"},  {23, 256, 136, "IQ4_XS"},  {24, 1, 1, "I8"},        {25, 1, 2, "I16"},
    {26, 1, 4, "I32"},       {27, 1, 8, "I64"},         {28, 1, 8, "F64"},       {29, 256, 56, "IQ1_M"},
    {30, 1, 2, "BF16"},      {34, 256, 54, "TQ1_0"},    {35, 256, 66, "TQ2_0"},  {39, 32, 17, "MXFP4"},
    {40, 64, 36, "NVFP4"},   {41, 128, 18, "Q1_0"},
};

static const ggml_block *ggml_block_of(int32_t type) {
    for (size_t i = 0; i < sizeof GGML_BLOCKS / sizeof GGML_BLOCKS[0]; i++)
        if (GGML_BLOCKS[i].type == type) return &GGML_BLOCKS[i];
    return NULL;
}

const char *gguf_type_name(int32_t type) {
    const ggml_block *b = ggml_block_of(type);
    return b ? b->name : "unknown";
}

/* Bytes of a tensor, or -1 (with the error set) for an unknown type, a row that is not whole
 * blocks, or a size that overflows. */
static int64_t tensor_bytes(const gguf_file *f, const gguf_tensor_info *t) {
    const ggml_block *b = ggml_block_of(t->type);
    if (!b) {
        specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: tensor '%s' has unknown type id %d", f->path, t->name, t->type);
        return -1;
    }
    if (t->ne[0] % b->elements != 0) {
        specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                    "%s: tensor '%s' of type %s has rows of %lld elements, not a multiple of its block size %d",
                    f->path, t->name, b->name, (long long)t->ne[0], b->elements);
        return -1;
    }
    int64_t bytes = t->ne[0] / b->elements * b->bytes;
    for (int d = 1; d < GGUF_MAX_DIMS; d++) {
        if (t->ne[d] != 0 && bytes > INT64_MAX / t->ne[d]) {
            specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: tensor '%s' is larger than 2^63 bytes (corrupt shape)",
                        f->path, t->name);
            return -1;
        }
        bytes *= t->ne[d];
    }
    return bytes;
}

static int by_data(const void *a, const void *b) {
    const gguf_tensor_info *x = *(const gguf_tensor_info *const *)a, *y = *(const gguf_tensor_info *const *)b;
    const uintptr_t px = (uintptr_t)x->data, py = (uintptr_t)y->data;
    return px < py ? -1 : px > py;
}

/* No two tensors may share a byte: a shifted offset or a widened type would otherwise compute on
 * another tensor's bytes. */
static specla_status check_disjoint(const gguf_file *f) {
    const gguf_tensor_info **sorted = (const gguf_tensor_info **)malloc(sizeof *sorted * (size_t)(f->n_tensors + 1));
    if (!sorted) return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "%s: out of memory", f->path);
    int64_t n = 0;
    for (int64_t i = 0; i < f->n_tensors; i++)
        if (f->tensors[i].nbytes > 0) sorted[n++] = &f->tensors[i];
    qsort(sorted, (size_t)n, sizeof *sorted, by_data);
    specla_status s = SPECLA_OK;
    const gguf_tensor_info *furthest = NULL;
    for (int64_t i = 0; i < n && s == SPECLA_OK; i++) {
        const uint8_t *begin = (const uint8_t *)sorted[i]->data;
        if (furthest && begin < (const uint8_t *)furthest->data + furthest->nbytes)
            s = specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                            "%s: tensors '%s' and '%s' overlap in the file: their offsets or types are corrupt",
                            f->path, furthest->name, sorted[i]->name);
        if (!furthest || begin + sorted[i]->nbytes > (const uint8_t *)furthest->data + furthest->nbytes)
            furthest = sorted[i];
    }
    free(sorted);
    return s;
}

static specla_status index_file(gguf_file *f) {
    cursor c = {f, 0};
    if (f->size < 4 || memcmp(f->map, "GGUF", 4) != 0) {
        if (f->size == 0) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: not a GGUF file (empty file)", f->path);
        if (f->size < 4)
            return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: not a GGUF file (only %zu bytes long)", f->path,
                               f->size);
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: not a GGUF file (does not start with 'GGUF')", f->path);
    }
    c.at = 4;
    specla_status s;
    uint64_t n_tensors, n_kv;
    if ((s = read_u32(&c, &f->version, "the version"))) return s;
    if (f->version > 0xffff)
        return specla_fail(SPECLA_ERR_UNSUPPORTED, "%s: big-endian (byte-swapped) GGUF files are not supported",
                           f->path);
    if (f->version != 2 && f->version != 3)
        return specla_fail(SPECLA_ERR_UNSUPPORTED, "%s: GGUF version %u is not supported (2 or 3)", f->path,
                           f->version);
    if ((s = read_u64(&c, &n_tensors, "the tensor count")) || (s = read_u64(&c, &n_kv, "the key count"))) return s;
    /* a key takes at least 12 bytes and a tensor info at least 24: larger counts cannot fit */
    if (n_kv > f->size / 12 || n_tensors > f->size / 24)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                           "%s: header claims %llu keys and %llu tensors, more than a %zu-byte file can hold (truncated or "
                           "corrupt)",
                           f->path, (unsigned long long)n_kv, (unsigned long long)n_tensors, f->size);
    f->kv = (gguf_kv *)calloc((size_t)n_kv + 1, sizeof *f->kv);
    f->tensors = (gguf_tensor_info *)calloc((size_t)n_tensors + 1, sizeof *f->tensors);
    uint64_t *offsets = (uint64_t *)calloc((size_t)n_tensors + 1, sizeof *offsets);
    if (!f->kv || !f->tensors || !offsets) {
        free(offsets);
        return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "%s: out of memory indexing the file", f->path);
    }
    for (uint64_t i = 0; i < n_kv; i++) {
        f->n_kv = (int64_t)i + 1; /* before the read: gguf_file_close frees a key read before a failure */
        if ((s = read_kv(&c, (int64_t)i, &f->kv[i]))) break;
        for (uint64_t j = 0; j < i; j++)
            if (strcmp(f->kv[j].key, f->kv[i].key) == 0) {
                s = specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: duplicate key '%s'", f->path, f->kv[i].key);
                break;
            }
        if (s) break;
    }
    for (uint64_t i = 0; s == SPECLA_OK && i < n_tensors; i++) {
        s = read_tensor_info(&c, (int64_t)i, &f->tensors[i], &offsets[i]);
        if (f->tensors[i].name) f->n_tensors = (int64_t)i + 1;
        for (uint64_t j = 0; s == SPECLA_OK && j < i; j++)
            if (strcmp(f->tensors[j].name, f->tensors[i].name) == 0)
                s = specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: duplicate tensor '%s'", f->path,
                                f->tensors[i].name);
    }
    uint64_t alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *align_kv = s == SPECLA_OK ? gguf_find_kv(f, "general.alignment") : NULL;
    if (align_kv) {
        int64_t value = 0;
        if (align_kv->type != GGUF_VALUE_UINT32 || !gguf_value_int(align_kv->type, align_kv->value, &value) ||
            value <= 0 || (value & (value - 1)) != 0)
            s = specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                            "%s: key 'general.alignment' must be a power of two stored as uint32", f->path);
        alignment = (uint64_t)value;
    }
    const uint64_t data_start = (c.at + alignment - 1) / alignment * alignment;
    for (int64_t i = 0; s == SPECLA_OK && i < f->n_tensors; i++) {
        gguf_tensor_info *t = &f->tensors[i];
        const int64_t nbytes = tensor_bytes(f, t);
        if (nbytes < 0) {
            s = SPECLA_ERR_INVALID_ARGUMENT;
            break;
        }
        if (offsets[i] % alignment != 0) {
            s = specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                            "%s: tensor '%s' data offset %llu is not a multiple of the alignment %llu", f->path,
                            t->name, (unsigned long long)offsets[i], (unsigned long long)alignment);
            break;
        }
        if (offsets[i] > f->size || data_start > f->size - offsets[i] ||
            (uint64_t)nbytes > f->size - data_start - offsets[i]) {
            s = specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                            "%s: tensor '%s' data [%llu, %llu) lies outside the file (%zu bytes): file is truncated "
                            "or corrupt",
                            f->path, t->name, (unsigned long long)(data_start + offsets[i]),
                            (unsigned long long)(data_start + offsets[i] + (uint64_t)nbytes), f->size);
            break;
        }
        t->data = f->map + data_start + offsets[i];
        t->nbytes = nbytes;
    }
    free(offsets);
    if (s == SPECLA_OK) s = check_disjoint(f);
    return s;
}

specla_status gguf_file_open(const char *path, gguf_file **out) {
    if (!out) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "gguf_file_open: NULL argument");
    *out = NULL;
    if (!path) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "gguf_file_open: path is NULL");
    gguf_file *f = (gguf_file *)calloc(1, sizeof *f);
    if (f) f->path = strdup(path);
    if (!f || !f->path) {
        free(f);
        return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    const int fd = open(path, O_RDONLY);
    if (fd < 0) {
        specla_status s = specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: cannot open file (%s)", path, strerror(errno));
        gguf_file_close(f);
        return s;
    }
    struct stat st;
    specla_status s = SPECLA_OK;
    if (fstat(fd, &st) != 0)
        s = specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: cannot stat file (%s)", path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        s = specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: not a regular file", path);
    else if (st.st_size > 0) {
        void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED)
            s = specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: cannot map file (%s)", path, strerror(errno));
        else {
            f->map = (const uint8_t *)map;
            f->size = (size_t)st.st_size;
        }
    }
    close(fd);
    if (s == SPECLA_OK) s = index_file(f);
    if (s != SPECLA_OK) {
        gguf_file_close(f);
        return s;
    }
    *out = f;
    return SPECLA_OK;
}

void gguf_file_close(gguf_file *f) {
    if (!f) return;
    for (int64_t i = 0; f->kv && i < f->n_kv; i++) free((void *)f->kv[i].key);
    for (int64_t i = 0; f->tensors && i < f->n_tensors; i++) free((void *)f->tensors[i].name);
    free(f->kv);
    free(f->tensors);
    if (f->map) munmap((void *)f->map, f->size);
    free(f->path);
    free(f);
}

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key) {
    for (int64_t i = 0; i < f->n_kv; i++)
        if (strcmp(f->kv[i].key, key) == 0) return &f->kv[i];
    return NULL;
}

const gguf_tensor_info *gguf_find_tensor(const gguf_file *f, const char *name) {
    for (int64_t i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

int gguf_value_int(int32_t type, const uint8_t *v, int64_t *out) {
    switch (type) {
    case GGUF_VALUE_UINT8: *out = *v; return 1;
    case GGUF_VALUE_INT8: *out = (int8_t)*v; return 1;
    case GGUF_VALUE_UINT16: { uint16_t x; memcpy(&x, v, 2); *out = x; return 1; }
    case GGUF_VALUE_INT16: { int16_t x; memcpy(&x, v, 2); *out = x; return 1; }
    case GGUF_VALUE_UINT32: { uint32_t x; memcpy(&x, v, 4); *out = x; return 1; }
    case GGUF_VALUE_INT32: { int32_t x; memcpy(&x, v, 4); *out = x; return 1; }
    case GGUF_VALUE_UINT64: {
        uint64_t x;
        memcpy(&x, v, 8);
        *out = x > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)x; /* callers bound values far lower */
        return 1;
    }
    case GGUF_VALUE_INT64: { int64_t x; memcpy(&x, v, 8); *out = x; return 1; }
    default: return 0;
    }
}

int gguf_value_number(int32_t type, const uint8_t *v, double *out) {
    int64_t i;
    if (gguf_value_int(type, v, &i)) {
        *out = (double)i;
        return 1;
    }
    if (type == GGUF_VALUE_FLOAT32) {
        float x;
        memcpy(&x, v, 4);
        *out = x;
        return 1;
    }
    if (type == GGUF_VALUE_FLOAT64) {
        memcpy(out, v, 8);
        return 1;
    }
    return 0;
}

const uint8_t *gguf_array_item(const gguf_kv *kv, uint64_t i) {
    const size_t size = gguf_value_size(kv->item_type);
    if (size == 0 || i >= kv->n_items) return NULL;
    return kv->value + i * size;
}

int gguf_value_string(const gguf_kv *kv, const char **out, uint64_t *len) {
    if (kv->type != GGUF_VALUE_STRING) return 0;
    memcpy(len, kv->value, 8);
    *out = (const char *)kv->value + 8;
    return 1;
}
