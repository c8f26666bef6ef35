/* specla_model_load_gguf: a qwen35 / qwen2 / qwen3 trunk straight from a GGUF path, for hosts that
 * have no GGUF reader of their own. The same rules as the Python loader (pyspecla/loader/target.py
 * with pyspecla/arch): the hyper-parameters read from the same keys with the same defaults and
 * checks, every expected tensor present with its shape, no unknown trunk tensor; the messages name
 * the file and the key or tensor at fault as the Python ones do. The weights stay in the file's
 * read-only mapping, which the model owns and unmaps in specla_model_free. */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "error.h"
#include "gguf_file.h"
#include "tensor_types.h"

#define INT32_LIMIT 2147483647LL

typedef struct keys {
    const gguf_file *file;
    const char *arch; /* prefix of the architecture's keys */
} keys;

static const gguf_kv *key_find(const keys *k, const char *name) {
    char full[256];
    snprintf(full, sizeof full, "%s.%s", k->arch, name);
    return gguf_find_kv(k->file, full);
}

/* "<path>: key '<arch>.<name>' <what>" */
static specla_status key_fail(const keys *k, const char *name, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static specla_status key_fail(const keys *k, const char *name, const char *fmt, ...) {
    char what[640];
    va_list args;
    va_start(args, fmt);
    vsnprintf(what, sizeof what, fmt, args);
    va_end(args);
    return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: key '%s.%s' %s", k->file->path, k->arch, name, what);
}

static specla_status key_missing(const keys *k, const char *name) {
    return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: missing required key '%s.%s'", k->file->path, k->arch,
                       name);
}

/* One integer value against [minimum, INT32_MAX]. */
static specla_status as_int(const keys *k, const char *name, int32_t type, const uint8_t *value, int64_t minimum,
                            int32_t *out) {
    int64_t v;
    if (!gguf_value_int(type, value, &v))
        return key_fail(k, name, "must be an integer, got a value of type %s", gguf_value_type_name(type));
    if (v < minimum) return key_fail(k, name, "must be >= %lld, got %lld", (long long)minimum, (long long)v);
    if (v > INT32_LIMIT) return key_fail(k, name, "is too large (%lld)", (long long)v);
    *out = (int32_t)v;
    return SPECLA_OK;
}

/* An integer key; when absent, `fallback` if has_default, else a missing-key error. */
static specla_status key_int(const keys *k, const char *name, int has_default, int32_t fallback, int64_t minimum,
                             int32_t *out) {
    const gguf_kv *kv = key_find(k, name);
    if (!kv) {
        if (!has_default) return key_missing(k, name);
        *out = fallback;
        return SPECLA_OK;
    }
    return as_int(k, name, kv->type, kv->value, minimum, out);
}

/* An integer that may also be a per-layer array (llama.cpp's get_key_or_arr); only one value over
 * the layers that use it (used[i] != 0) is supported. */
static specla_status key_per_layer_int(const keys *k, const char *name, const uint8_t *used, int n_layer_file,
                                       int has_default, int32_t fallback, int32_t *out) {
    const gguf_kv *kv = key_find(k, name);
    if (!kv || kv->type != GGUF_VALUE_ARRAY) return key_int(k, name, has_default, fallback, 1, out);
    if (kv->n_items != (uint64_t)n_layer_file)
        return key_fail(k, name, "has %llu entries, expected block_count = %d", (unsigned long long)kv->n_items,
                        n_layer_file);
    int found = 0;
    for (int i = 0; i < n_layer_file; i++) {
        if (!used[i]) continue;
        int32_t v;
        specla_status s = as_int(k, name, kv->item_type, gguf_array_item(kv, (uint64_t)i), 1, &v);
        if (s) return s;
        if (found && v != *out)
            return key_fail(k, name, "varies by layer (%d and %d): per-layer values are not supported", *out, v);
        *out = v;
        found = 1;
    }
    if (!found) return key_fail(k, name, "has no value for any layer that uses it");
    return SPECLA_OK;
}

/* A positive finite number. */
static specla_status key_float(const keys *k, const char *name, int has_default, float fallback, float *out) {
    const gguf_kv *kv = key_find(k, name);
    if (!kv) {
        if (!has_default) return key_missing(k, name);
        *out = fallback;
        return SPECLA_OK;
    }
    double v;
    if (kv->type == GGUF_VALUE_ARRAY || !gguf_value_number(kv->type, kv->value, &v))
        return key_fail(k, name, "must be a number, got a value of type %s", gguf_value_type_name(kv->type));
    if (!(v > 0.0) || v > 3.4e38) return key_fail(k, name, "must be a positive finite number, got %g", v);
    *out = (float)v;
    return SPECLA_OK;
}

/* A bool stored as BOOL or as an integer 0/1. */
static int as_flag(int32_t type, const uint8_t *value, int *out) {
    int64_t v;
    if (type == GGUF_VALUE_BOOL) v = *value;
    else if (!gguf_value_int(type, value, &v)) return 0;
    if (v != 0 && v != 1) return 0;
    *out = (int)v;
    return 1;
}

/* attention.recurrent_layers (one flag per block, MTP blocks included; a scalar fills them all)
 * wins over full_attention_interval (layer i recurrent iff (i + 1) % interval != 0, default 4). */
static specla_status layer_pattern(const keys *k, int n_layer, int n_layer_file, uint8_t *recurrent) {
    const char *name = "attention.recurrent_layers";
    const gguf_kv *kv = key_find(k, name);
    if (kv) {
        const int is_array = kv->type == GGUF_VALUE_ARRAY;
        if (is_array && kv->n_items != (uint64_t)n_layer_file)
            return key_fail(k, name, "has %llu entries, expected block_count = %d", (unsigned long long)kv->n_items,
                            n_layer_file);
        for (int i = 0; i < n_layer; i++) {
            const uint8_t *value = is_array ? gguf_array_item(kv, (uint64_t)i) : kv->value;
            int flag;
            if (!value || !as_flag(is_array ? kv->item_type : kv->type, value, &flag))
                return key_fail(k, name, "entry %d must be a bool, got a value of type %s", i,
                                gguf_value_type_name(is_array ? kv->item_type : kv->type));
            recurrent[i] = (uint8_t)flag;
        }
        return SPECLA_OK;
    }
    int32_t interval;
    specla_status s = key_int(k, "full_attention_interval", 1, 4, 1, &interval);
    if (s) return s;
    for (int i = 0; i < n_layer; i++) recurrent[i] = (i + 1) % interval != 0;
    return SPECLA_OK;
}

/* llama.cpp runs IMROPE with text positions [p, p, p, 0]; the native NEOX rotation equals it when
 * every rotated pair falls into one of the first three sections (pyspecla.arch.qwen35). */
static specla_status rope_sections(const keys *k, int rope_dims, int head_dim) {
    const char *name = "rope.dimension_sections";
    const gguf_kv *kv = key_find(k, name);
    if (!kv) return key_missing(k, name);
    int64_t sec[4];
    const int is_array = kv->type == GGUF_VALUE_ARRAY;
    if (is_array && kv->n_items != 4)
        return key_fail(k, name, "has %llu entries, expected 4", (unsigned long long)kv->n_items);
    for (int i = 0; i < 4; i++) {
        const uint8_t *value = is_array ? gguf_array_item(kv, (uint64_t)i) : kv->value;
        if (!value || !gguf_value_int(is_array ? kv->item_type : kv->type, value, &sec[i]))
            return key_fail(k, name, "must hold integers, got a value of type %s",
                            gguf_value_type_name(is_array ? kv->item_type : kv->type));
    }
    for (int i = 0; i < 4; i++)
        if (sec[i] < 0) return key_fail(k, name, "has a negative section: [%lld, %lld, %lld, %lld]",
                                        (long long)sec[0], (long long)sec[1], (long long)sec[2], (long long)sec[3]);
    const int64_t total = sec[0] + sec[1] + sec[2] + sec[3];
    if (sec[0] + sec[1] + sec[2] <= 0) return key_fail(k, name, "must have a positive section among the first three");
    if (total > head_dim)
        return key_fail(k, name, "sums to %lld, more than the head dim %d", (long long)total, head_dim);
    for (int pair = 0; pair < rope_dims / 2; pair++) {
        const int64_t sector = pair % total;
        if (!((sector % 3 == 0 && sector < 3 * sec[0]) || (sector % 3 == 1 && sector < 3 * sec[1]) ||
              (sector % 3 == 2 && sector < 3 * sec[2])))
            return key_fail(k, name,
                            "leaves rotated pair %d on the 4th position stream; for text llama.cpp would not rotate "
                            "it and plain NEOX RoPE cannot reproduce that",
                            pair);
    }
    return SPECLA_OK;
}

/* <arch>.vocab_size and tokenizer.ggml.tokens, when present, agree with the token_embd rows. */
static specla_status check_vocab(const keys *k, int n_vocab) {
    const gguf_kv *kv = key_find(k, "vocab_size");
    if (kv) {
        int64_t v;
        if (kv->type == GGUF_VALUE_ARRAY || !gguf_value_int(kv->type, kv->value, &v) || v != n_vocab)
            return key_fail(k, "vocab_size", "differs from the token_embd.weight rows %d", n_vocab);
    }
    const gguf_kv *tokens = gguf_find_kv(k->file, "tokenizer.ggml.tokens");
    if (tokens) {
        if (tokens->type != GGUF_VALUE_ARRAY)
            return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                               "%s: key 'tokenizer.ggml.tokens' must be an array of strings", k->file->path);
        if (tokens->n_items != (uint64_t)n_vocab)
            return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                               "%s: key 'tokenizer.ggml.tokens' has %llu entries but token_embd.weight has %d rows",
                               k->file->path, (unsigned long long)tokens->n_items, n_vocab);
    }
    return SPECLA_OK;
}

/* qwen35: pyspecla.arch.qwen35.read_hparams. recurrent[] has room for block_count entries. */
static specla_status read_qwen35(const keys *k, int n_vocab, specla_hparams *hp, uint8_t **recurrent,
                                 int *n_layer_file) {
    int32_t blocks, nextn;
    SPECLA_TRY(key_int(k, "block_count", 0, 0, 1, &blocks));
    SPECLA_TRY(key_int(k, "nextn_predict_layers", 1, 0, 0, &nextn));
    if (nextn >= blocks)
        return key_fail(k, "nextn_predict_layers", "= %d leaves no trunk layer (block_count = %d)", nextn, blocks);
    *n_layer_file = blocks;
    hp->n_layer = blocks - nextn;
    SPECLA_TRY(key_int(k, "context_length", 0, 0, 1, &hp->n_ctx_train));
    SPECLA_TRY(key_int(k, "embedding_length", 0, 0, 1, &hp->n_embd));
    uint8_t *flags = (uint8_t *)calloc((size_t)blocks, 1);
    uint8_t *used = (uint8_t *)calloc((size_t)blocks, 1);
    if (!flags || !used) {
        free(flags);
        free(used);
        return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "%s: out of memory", k->file->path);
    }
    *recurrent = flags; /* the caller frees it */
    specla_status s = layer_pattern(k, hp->n_layer, blocks, flags);
    int n_attention = 0;
    for (int i = 0; i < hp->n_layer; i++) n_attention += !flags[i];
    if (!s && n_attention == 0)
        s = specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                        "%s: every trunk layer is recurrent (see '%s.attention.recurrent_layers' / "
                        "'%s.full_attention_interval'); llama.cpp requires at least one attention layer",
                        k->file->path, k->arch, k->arch);
    for (int i = 0; i < hp->n_layer; i++) used[i] = 1;
    if (!s) s = key_per_layer_int(k, "feed_forward_length", used, blocks, 0, 0, &hp->n_ff);
    for (int i = 0; i < hp->n_layer; i++) used[i] = !flags[i];
    if (!s) s = key_per_layer_int(k, "attention.head_count", used, blocks, 0, 0, &hp->n_head);
    if (!s) s = key_per_layer_int(k, "attention.head_count_kv", used, blocks, 1, hp->n_head, &hp->n_head_kv);
    free(used);
    if (s) return s;
    if (hp->n_head % hp->n_head_kv != 0)
        return key_fail(k, "attention.head_count_kv", "= %d does not divide attention.head_count = %d",
                        hp->n_head_kv, hp->n_head);
    int32_t key_length, value_length;
    const int divides = hp->n_embd % hp->n_head == 0;
    SPECLA_TRY(key_int(k, "attention.key_length", divides, divides ? hp->n_embd / hp->n_head : 0, 1, &key_length));
    SPECLA_TRY(key_int(k, "attention.value_length", 1, key_length, 1, &value_length));
    if (key_length != value_length)
        return key_fail(k, "attention.value_length", "= %d differs from attention.key_length = %d", value_length,
                        key_length);
    hp->head_dim = key_length;
    SPECLA_TRY(key_int(k, "rope.dimension_count", 1, hp->head_dim, 1, &hp->rope_dims));
    if (hp->rope_dims % 2 != 0 || hp->rope_dims > hp->head_dim)
        return key_fail(k, "rope.dimension_count", "= %d must be even and at most the head dim %d", hp->rope_dims,
                        hp->head_dim);
    SPECLA_TRY(key_float(k, "rope.freq_base", 1, 10000.0f, &hp->rope_freq_base));
    SPECLA_TRY(rope_sections(k, hp->rope_dims, hp->head_dim));
    SPECLA_TRY(key_float(k, "attention.layer_norm_rms_epsilon", 0, 0.0f, &hp->rms_eps));
    int32_t inner_size;
    SPECLA_TRY(key_int(k, "ssm.conv_kernel", 0, 0, 1, &hp->ssm_conv_kernel));
    SPECLA_TRY(key_int(k, "ssm.state_size", 0, 0, 1, &hp->ssm_state_size));
    SPECLA_TRY(key_int(k, "ssm.group_count", 0, 0, 1, &hp->ssm_group_count));
    SPECLA_TRY(key_int(k, "ssm.time_step_rank", 0, 0, 1, &hp->ssm_time_step_rank));
    SPECLA_TRY(key_int(k, "ssm.inner_size", 0, 0, 1, &inner_size));
    if (hp->ssm_time_step_rank % hp->ssm_group_count != 0)
        return key_fail(k, "ssm.group_count", "= %d does not divide ssm.time_step_rank = %d", hp->ssm_group_count,
                        hp->ssm_time_step_rank);
    if ((int64_t)inner_size != (int64_t)hp->ssm_time_step_rank * hp->ssm_state_size)
        return key_fail(k, "ssm.inner_size", "= %d, expected ssm.time_step_rank * ssm.state_size = %lld", inner_size,
                        (long long)hp->ssm_time_step_rank * hp->ssm_state_size);
    SPECLA_TRY(check_vocab(k, n_vocab));
    const int64_t channels = 2LL * hp->ssm_group_count * hp->ssm_state_size +
                             (int64_t)hp->ssm_time_step_rank * hp->ssm_state_size;
    if (channels > INT32_LIMIT)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: conv channels %lld does not fit in int32", k->file->path,
                           (long long)channels);
    if (2LL * hp->n_head * hp->head_dim > INT32_LIMIT)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: attention width %lld does not fit in int32",
                           k->file->path, 2LL * hp->n_head * hp->head_dim);
    hp->arch = SPECLA_ARCH_QWEN35;
    return SPECLA_OK;
}

/* qwen2 / qwen3: pyspecla.arch.qwen2.read_hparams (attention only, RoPE over the whole head). */
static specla_status read_attention_only(const keys *k, int arch, int n_vocab, specla_hparams *hp,
                                         uint8_t **recurrent, int *n_layer_file) {
    SPECLA_TRY(key_int(k, "block_count", 0, 0, 1, &hp->n_layer));
    *n_layer_file = hp->n_layer;
    SPECLA_TRY(key_int(k, "context_length", 0, 0, 1, &hp->n_ctx_train));
    SPECLA_TRY(key_int(k, "embedding_length", 0, 0, 1, &hp->n_embd));
    uint8_t *used = (uint8_t *)malloc((size_t)hp->n_layer);
    *recurrent = (uint8_t *)calloc((size_t)hp->n_layer, 1);
    if (!used || !*recurrent) {
        free(used);
        return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "%s: out of memory", k->file->path);
    }
    memset(used, 1, (size_t)hp->n_layer);
    specla_status s = key_per_layer_int(k, "feed_forward_length", used, hp->n_layer, 0, 0, &hp->n_ff);
    if (!s) s = key_per_layer_int(k, "attention.head_count", used, hp->n_layer, 0, 0, &hp->n_head);
    if (!s) s = key_per_layer_int(k, "attention.head_count_kv", used, hp->n_layer, 1, hp->n_head, &hp->n_head_kv);
    free(used);
    if (s) return s;
    if (hp->n_head % hp->n_head_kv != 0)
        return key_fail(k, "attention.head_count_kv", "= %d does not divide attention.head_count = %d",
                        hp->n_head_kv, hp->n_head);
    const int divides = hp->n_embd % hp->n_head == 0;
    int32_t key_length, value_length;
    SPECLA_TRY(key_int(k, "attention.key_length", divides, divides ? hp->n_embd / hp->n_head : 0, 1, &key_length));
    SPECLA_TRY(key_int(k, "attention.value_length", 1, key_length, 1, &value_length));
    if (key_length != value_length)
        return key_fail(k, "attention.value_length", "= %d differs from attention.key_length = %d", value_length,
                        key_length);
    if (key_length % 2 != 0)
        return key_fail(k, "attention.key_length", "= %d: the head dim must be even (RoPE rotates pairs)", key_length);
    SPECLA_TRY(key_int(k, "rope.dimension_count", 1, key_length, 1, &hp->rope_dims));
    if (hp->rope_dims != key_length)
        return key_fail(k, "rope.dimension_count", "= %d differs from the head dim %d: %s rotates the whole head",
                        hp->rope_dims, key_length, k->arch);
    hp->head_dim = key_length;
    SPECLA_TRY(key_float(k, "rope.freq_base", 1, 10000.0f, &hp->rope_freq_base));
    SPECLA_TRY(key_float(k, "attention.layer_norm_rms_epsilon", 0, 0.0f, &hp->rms_eps));
    SPECLA_TRY(check_vocab(k, n_vocab));
    if (2LL * hp->n_head * hp->head_dim > INT32_LIMIT)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: attention width %lld does not fit in int32",
                           k->file->path, 2LL * hp->n_head * hp->head_dim);
    hp->arch = arch;
    return SPECLA_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Tensors: the one name table of pyspecla.arch (LAYER_TENSORS), with the shapes its
 * expected_tensors gives each.
 * ------------------------------------------------------------------------------------------- */

enum layer_kind { ANY_LAYER, RECURRENT_LAYER, ATTENTION_LAYER };
enum dim { DIM_1, DIM_E, DIM_F, DIM_C, DIM_K, DIM_HV, DIM_HVS, DIM_S, DIM_Q, DIM_NHD, DIM_NKVD, DIM_D };

typedef struct layer_tensor {
    size_t offset;            /* of the specla_tensor in specla_layer_weights */
    enum layer_kind kind;     /* which layers hold it */
    const char *suffix[3];    /* GGUF name after "blk.N." by specla_arch (NULL: not in that architecture) */
    enum dim ne0, ne1;
    int f32;                  /* must be F32 */
} layer_tensor;

#define FIELD(f) offsetof(specla_layer_weights, f)
static const layer_tensor LAYER_TENSORS[] = {
    {FIELD(attn_norm), ANY_LAYER, {"attn_norm.weight", "attn_norm.weight", "attn_norm.weight"}, DIM_E, DIM_1, 1},
    {FIELD(post_attention_norm), ANY_LAYER, {"post_attention_norm.weight", "ffn_norm.weight", "ffn_norm.weight"},
     DIM_E, DIM_1, 1},
    {FIELD(attn_qkv), RECURRENT_LAYER, {"attn_qkv.weight", NULL, NULL}, DIM_E, DIM_C, 0},
    {FIELD(attn_gate), RECURRENT_LAYER, {"attn_gate.weight", NULL, NULL}, DIM_E, DIM_HVS, 0},
    {FIELD(ssm_conv1d), RECURRENT_LAYER, {"ssm_conv1d.weight", NULL, NULL}, DIM_K, DIM_C, 1},
    {FIELD(ssm_dt_bias), RECURRENT_LAYER, {"ssm_dt.bias", NULL, NULL}, DIM_HV, DIM_1, 1},
    {FIELD(ssm_a), RECURRENT_LAYER, {"ssm_a", NULL, NULL}, DIM_HV, DIM_1, 1},
    {FIELD(ssm_beta), RECURRENT_LAYER, {"ssm_beta.weight", NULL, NULL}, DIM_E, DIM_HV, 0},
    {FIELD(ssm_alpha), RECURRENT_LAYER, {"ssm_alpha.weight", NULL, NULL}, DIM_E, DIM_HV, 0},
    {FIELD(ssm_norm), RECURRENT_LAYER, {"ssm_norm.weight", NULL, NULL}, DIM_S, DIM_1, 1},
    {FIELD(ssm_out), RECURRENT_LAYER, {"ssm_out.weight", NULL, NULL}, DIM_HVS, DIM_E, 0},
    {FIELD(attn_q), ATTENTION_LAYER, {"attn_q.weight", "attn_q.weight", "attn_q.weight"}, DIM_E, DIM_Q, 0},
    {FIELD(attn_k), ATTENTION_LAYER, {"attn_k.weight", "attn_k.weight", "attn_k.weight"}, DIM_E, DIM_NKVD, 0},
    {FIELD(attn_v), ATTENTION_LAYER, {"attn_v.weight", "attn_v.weight", "attn_v.weight"}, DIM_E, DIM_NKVD, 0},
    {FIELD(attn_output), ATTENTION_LAYER, {"attn_output.weight", "attn_output.weight", "attn_output.weight"},
     DIM_NHD, DIM_E, 0},
    {FIELD(attn_q_norm), ATTENTION_LAYER, {"attn_q_norm.weight", NULL, "attn_q_norm.weight"}, DIM_D, DIM_1, 1},
    {FIELD(attn_k_norm), ATTENTION_LAYER, {"attn_k_norm.weight", NULL, "attn_k_norm.weight"}, DIM_D, DIM_1, 1},
    {FIELD(ffn_gate), ANY_LAYER, {"ffn_gate.weight", "ffn_gate.weight", "ffn_gate.weight"}, DIM_E, DIM_F, 0},
    {FIELD(ffn_up), ANY_LAYER, {"ffn_up.weight", "ffn_up.weight", "ffn_up.weight"}, DIM_E, DIM_F, 0},
    {FIELD(ffn_down), ANY_LAYER, {"ffn_down.weight", "ffn_down.weight", "ffn_down.weight"}, DIM_F, DIM_E, 0},
    {FIELD(attn_q_bias), ATTENTION_LAYER, {NULL, "attn_q.bias", NULL}, DIM_NHD, DIM_1, 1},
    {FIELD(attn_k_bias), ATTENTION_LAYER, {NULL, "attn_k.bias", NULL}, DIM_NKVD, DIM_1, 1},
    {FIELD(attn_v_bias), ATTENTION_LAYER, {NULL, "attn_v.bias", NULL}, DIM_NKVD, DIM_1, 1},
};
#undef FIELD
#define N_LAYER_TENSORS (sizeof LAYER_TENSORS / sizeof LAYER_TENSORS[0])

static int64_t dim_value(enum dim d, const specla_hparams *hp) {
    const int64_t S = hp->ssm_state_size, Hv = hp->ssm_time_step_rank, Hk = hp->ssm_group_count;
    switch (d) {
    case DIM_E: return hp->n_embd;
    case DIM_F: return hp->n_ff;
    case DIM_C: return 2 * Hk * S + Hv * S;
    case DIM_K: return hp->ssm_conv_kernel;
    case DIM_HV: return Hv;
    case DIM_HVS: return Hv * S;
    case DIM_S: return S;
    case DIM_Q: return (int64_t)(hp->arch == SPECLA_ARCH_QWEN35 ? 2 : 1) * hp->n_head * hp->head_dim;
    case DIM_NHD: return (int64_t)hp->n_head * hp->head_dim;
    case DIM_NKVD: return (int64_t)hp->n_head_kv * hp->head_dim;
    case DIM_D: return hp->head_dim;
    case DIM_1: default: return 1;
    }
}

static int layer_holds(const layer_tensor *lt, const specla_hparams *hp, int il) {
    if (lt->suffix[hp->arch] == NULL) return 0;
    if (lt->kind == ANY_LAYER) return 1;
    return (lt->kind == RECURRENT_LAYER) == (hp->layer_is_recurrent[il] != 0);
}

static void layer_label(const specla_hparams *hp, int il, char *out, size_t size) {
    if (hp->arch != SPECLA_ARCH_QWEN35)
        snprintf(out, size, " (layer %d)", il);
    else
        snprintf(out, size, " (%s layer %d)", hp->layer_is_recurrent[il] ? "recurrent" : "attention", il);
}

/* A tensor the architecture expects: present, shaped {ne0, ne1} (GGUF order, up to trailing 1s),
 * F32 where f32; *out becomes its view. */
static specla_status expected_tensor(const gguf_file *f, const char *name, const char *where, int64_t ne0,
                                     int64_t ne1, int f32, int required, specla_tensor *out) {
    const gguf_tensor_info *t = gguf_find_tensor(f, name);
    if (!t) {
        if (!required) return SPECLA_OK;
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: missing tensor '%s'%s", f->path, name, where);
    }
    int64_t rows = 1;
    for (int d = 1; d < 4; d++) rows *= t->ne[d];
    const int want_vector = ne1 == 1;
    const int shape_ok = t->ne[0] == ne0 && t->ne[1] == ne1 && rows == ne1; /* trailing 1s ignored */
    if (!shape_ok) {
        char shape[96];
        int n_dims = t->n_dims;
        while (n_dims > 1 && t->ne[n_dims - 1] == 1) n_dims--;
        int at = snprintf(shape, sizeof shape, "[%lld", (long long)t->ne[0]);
        for (int d = 1; d < n_dims; d++)
            at += snprintf(shape + at, sizeof shape - (size_t)at, ", %lld", (long long)t->ne[d]);
        snprintf(shape + at, sizeof shape - (size_t)at, "]");
        if (want_vector)
            return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: tensor '%s'%s has shape ne=%s, expected ne=[%lld]",
                               f->path, name, where, shape, (long long)ne0);
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: tensor '%s'%s has shape ne=%s, expected ne=[%lld, %lld]",
                           f->path, name, where, shape, (long long)ne0, (long long)ne1);
    }
    if (f32 && t->type != SPECLA_TYPE_F32)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: tensor '%s' has type %s; it must be F32", f->path, name,
                           gguf_type_name(t->type));
    if (type_block_elements(t->type) == 0)
        return specla_fail(SPECLA_ERR_UNSUPPORTED,
                           "%s: tensor '%s' has unsupported type %s (supported: F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, "
                           "Q8_0, Q4_K, Q5_K, Q6_K, BF16)",
                           f->path, name, gguf_type_name(t->type));
    if (ne0 > INT32_LIMIT || ne1 > INT32_LIMIT)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: tensor '%s' dimension does not fit in int32", f->path,
                           name);
    out->data = t->data;
    out->type = t->type;
    out->ne0 = (int32_t)ne0;
    out->ne1 = (int32_t)ne1;
    out->nbytes = t->nbytes;
    return SPECLA_OK;
}

/* Trunk layer index of a "blk.N." name, or -1. */
static long block_index(const char *name, const char **suffix) {
    if (strncmp(name, "blk.", 4) != 0) return -1;
    const char *p = name + 4;
    if (*p < '0' || *p > '9') return -1;
    long n = 0;
    while (*p >= '0' && *p <= '9') {
        if (n > INT32_LIMIT) return -1;
        n = n * 10 + (*p++ - '0');
    }
    if (*p != '.') return -1;
    *suffix = p + 1;
    return n;
}

static const char *ARCH_NAMES[3] = {"qwen35", "qwen2", "qwen3"};

/* llama.cpp refuses a file with tensors it did not load; an unknown trunk tensor (a bias, say)
 * would otherwise be ignored and change the results. MTP blocks (n_layer <= N < block_count) are
 * not checked. */
static specla_status check_no_unexpected(const gguf_file *f, const specla_hparams *hp, int n_layer_file) {
    for (int64_t i = 0; i < f->n_tensors; i++) {
        const char *name = f->tensors[i].name, *suffix = NULL;
        if (!strcmp(name, "token_embd.weight") || !strcmp(name, "output_norm.weight") || !strcmp(name, "output.weight"))
            continue;
        const long il = block_index(name, &suffix);
        if (il < 0)
            return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: unexpected tensor '%s': not part of a %s model",
                               f->path, name, ARCH_NAMES[hp->arch]);
        if (il >= hp->n_layer && il < n_layer_file) continue;
        if (il >= n_layer_file)
            return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                               "%s: unexpected tensor '%s': block index %ld >= block_count %d", f->path, name, il,
                               n_layer_file);
        int known = 0;
        for (size_t t = 0; t < N_LAYER_TENSORS && !known; t++)
            known = layer_holds(&LAYER_TENSORS[t], hp, (int)il) && !strcmp(LAYER_TENSORS[t].suffix[hp->arch], suffix);
        if (known) continue;
        char label[64];
        layer_label(hp, (int)il, label, sizeof label);
        const size_t n = strlen(name);
        if (hp->arch == SPECLA_ARCH_QWEN35 && n > 5 && !strcmp(name + n - 5, ".bias"))
            return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                               "%s: unexpected tensor '%s'%s: qwen35 has no biases there and libspecla does not "
                               "support them",
                               f->path, name, label);
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                           "%s: unexpected tensor '%s'%s: not part of a %s layer%s and libspecla does not support it",
                           f->path, name, label, ARCH_NAMES[hp->arch],
                           hp->arch == SPECLA_ARCH_QWEN35
                               ? " of that type (check attention.recurrent_layers / full_attention_interval)"
                               : "");
    }
    return SPECLA_OK;
}

static specla_status read_weights(const gguf_file *f, const specla_hparams *hp, specla_layer_weights *layers,
                                  specla_weights *w) {
    /* converted with --fuse-qkv: a fused Q/K/V in an attention layer, under the recurrent name */
    for (int il = 0; il < hp->n_layer && hp->arch == SPECLA_ARCH_QWEN35; il++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.attn_qkv.weight", il);
        if (!hp->layer_is_recurrent[il] && gguf_find_tensor(f, name))
            return specla_fail(SPECLA_ERR_UNSUPPORTED,
                               "%s: tensor '%s' is a fused Q/K/V in attention layer %d (converted with --fuse-qkv): "
                               "not supported yet; convert without --fuse-qkv",
                               f->path, name, il);
    }
    const int64_t E = hp->n_embd, V = hp->n_vocab;
    memset(w, 0, sizeof *w);
    SPECLA_TRY(expected_tensor(f, "token_embd.weight", "", E, V, 0, 1, &w->token_embd));
    SPECLA_TRY(expected_tensor(f, "output_norm.weight", "", E, 1, 1, 1, &w->output_norm));
    SPECLA_TRY(expected_tensor(f, "output.weight", "", E, V, 0, 0, &w->output)); /* absent: tied to token_embd */
    for (int il = 0; il < hp->n_layer; il++) {
        char label[64];
        layer_label(hp, il, label, sizeof label);
        for (size_t t = 0; t < N_LAYER_TENSORS; t++) {
            const layer_tensor *lt = &LAYER_TENSORS[t];
            if (!layer_holds(lt, hp, il)) continue;
            char name[96];
            snprintf(name, sizeof name, "blk.%d.%s", il, lt->suffix[hp->arch]);
            specla_tensor *field = (specla_tensor *)((char *)&layers[il] + lt->offset);
            SPECLA_TRY(
                expected_tensor(f, name, label, dim_value(lt->ne0, hp), dim_value(lt->ne1, hp), lt->f32, 1, field));
        }
    }
    w->layers = layers;
    return SPECLA_OK;
}

static specla_status read_architecture(const gguf_file *f, int *arch, const char **arch_name) {
    const gguf_kv *kv = gguf_find_kv(f, "general.architecture");
    if (!kv)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: missing required key 'general.architecture'", f->path);
    const char *value;
    uint64_t len;
    if (!gguf_value_string(kv, &value, &len))
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: key 'general.architecture' must be a string", f->path);
    for (int a = 0; a < 3; a++)
        if (len == strlen(ARCH_NAMES[a]) && !memcmp(value, ARCH_NAMES[a], len)) {
            *arch = a;
            *arch_name = ARCH_NAMES[a];
            return SPECLA_OK;
        }
    const int shown = len > 64 ? 64 : (int)len;
    if (len == 9 && !memcmp(value, "qwen35moe", 9))
        return specla_fail(SPECLA_ERR_UNSUPPORTED,
                           "%s: architecture 'qwen35moe' (the MoE sibling of qwen35) is not supported yet (expected "
                           "qwen35)",
                           f->path);
    static const char *drafts[] = {"qwen35-dflash-draft", "dflash-draft", "dflash"};
    for (int d = 0; d < 3; d++)
        if (len == strlen(drafts[d]) && !memcmp(value, drafts[d], len))
            return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                               "%s: is a DFlash draft (architecture '%s'), not a qwen35 target", f->path, drafts[d]);
    return specla_fail(SPECLA_ERR_UNSUPPORTED,
                       "%s: architecture '%.*s' is not supported (expected qwen35); supported architectures: qwen35, "
                       "qwen2, qwen3",
                       f->path, shown, value);
}

/* hparams, weights and the specla_model_create gate, with the mapping kept by the model. */
static specla_status load(gguf_file *f, uint8_t **recurrent, specla_layer_weights **layers, specla_model **out) {
    int arch = SPECLA_ARCH_QWEN35;
    const char *arch_name = ARCH_NAMES[arch];
    SPECLA_TRY(read_architecture(f, &arch, &arch_name));
    const gguf_tensor_info *embd = gguf_find_tensor(f, "token_embd.weight");
    if (!embd) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "%s: missing tensor 'token_embd.weight'", f->path);
    if (embd->n_dims != 2)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                           "%s: tensor 'token_embd.weight' has %d dimensions, expected ne=[n_embd, n_vocab]", f->path,
                           embd->n_dims);
    if (embd->ne[1] > INT32_LIMIT)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                           "%s: tensor 'token_embd.weight' dimension does not fit in int32", f->path);
    const keys k = {f, arch_name};
    specla_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.n_vocab = (int32_t)embd->ne[1];
    int n_layer_file = 0;
    if (arch == SPECLA_ARCH_QWEN35)
        SPECLA_TRY(read_qwen35(&k, hp.n_vocab, &hp, recurrent, &n_layer_file));
    else
        SPECLA_TRY(read_attention_only(&k, arch, hp.n_vocab, &hp, recurrent, &n_layer_file));
    hp.layer_is_recurrent = *recurrent;
    *layers = (specla_layer_weights *)calloc((size_t)hp.n_layer, sizeof **layers);
    if (!*layers) return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "%s: out of memory", f->path);
    specla_weights w;
    SPECLA_TRY(read_weights(f, &hp, *layers, &w));
    SPECLA_TRY(check_no_unexpected(f, &hp, n_layer_file));
    specla_status s = specla_model_create(&hp, &w, out);
    if (s != SPECLA_OK) {
        char message[512];
        snprintf(message, sizeof message, "%s", specla_last_error());
        return specla_fail(s, "%s: %s", f->path, message);
    }
    (*out)->source_file = f;
    return SPECLA_OK;
}

SPECLA_API specla_status specla_model_load_gguf(const char *path, specla_model **out_model) {
    if (!path || !out_model) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_model_load_gguf: NULL argument");
    *out_model = NULL;
    gguf_file *f = NULL;
    SPECLA_TRY(gguf_file_open(path, &f));
    uint8_t *recurrent = NULL;
    specla_layer_weights *layers = NULL;
    const specla_status s = load(f, &recurrent, &layers, out_model);
    free(recurrent); /* specla_model_create copied both */
    free(layers);
    if (s != SPECLA_OK) gguf_file_close(f);
    return s;
}
