/*
 * specla_example: libspecla from C through specla.h alone, as a native host uses it.
 *
 *   specla_example MODEL.gguf TOKEN [TOKEN ...] [--draft T1,T2,...]
 *
 * Loads a qwen35 / qwen2 / qwen3 GGUF by path, runs the prompt's forward (token ids on the command
 * line; this example has no tokenizer), prints the greedy next token and the top-5 logits, then
 * verifies a chain [next token, T1, T2, ...] in one tree forward and commits the longest prefix
 * the model agrees with, as a speculative decoder's step does. Without --draft the guesses are the
 * prompt's first tokens (up to 3), a stand-in for a drafter. Exits 0; a bad argument or file
 * prints "specla_example: <why>" on stderr and exits 1.
 *
 * Output, one item per line (tests/test_c_example.py reads it):
 *   model: arch <qwen35|qwen2|qwen3>, <n> layers, n_vocab <V>, backend <cpu|cuda>
 *   argmax: <id>
 *   top5: <id>:<logit> x5       (highest first, ties to the lower id; logits as %.9g, exact floats)
 *   chain: <root> <guesses...>
 *   verify argmax: <id per node> (the model's next token after each node)
 *   accepted: <k> of <n> guesses
 *   emitted: <the k accepted guesses, then the model's token after the last of them>
 *   n_past: <tokens committed to the context>
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "specla.h"

#define MAX_GUESSES 15
#define DEFAULT_GUESSES 3
#define TOP_K 5

static int fail(const char *fmt, const char *detail) {
    fprintf(stderr, "specla_example: ");
    fprintf(stderr, fmt, detail);
    fprintf(stderr, "\n");
    return 1;
}

static int usage(void) {
    fprintf(stderr, "usage: specla_example MODEL.gguf TOKEN [TOKEN ...] [--draft T1,T2,...]\n"
                    "  TOKEN: a token id of the model's vocabulary; --draft: up to %d guessed ids to verify\n",
            MAX_GUESSES);
    return 1;
}

/* A token id in [0, 2^31): the whole text must be a decimal number. */
static int parse_token(const char *text, int32_t *out) {
    if (text[0] < '0' || text[0] > '9') return 0;
    char *end = NULL;
    errno = 0;
    const long value = strtol(text, &end, 10);
    if (errno != 0 || *end != '\0' || value > 2147483647L) return 0;
    *out = (int32_t)value;
    return 1;
}

/* "T1,T2,..." into guesses; the number parsed, or -1 (with the message printed) when bad. */
static int parse_draft(const char *text, int32_t *guesses) {
    char buffer[256];
    if (strlen(text) >= sizeof buffer) return fail("--draft list is too long: '%s'", text), -1;
    strcpy(buffer, text);
    int n = 0;
    for (char *item = strtok(buffer, ","); item; item = strtok(NULL, ",")) {
        if (n == MAX_GUESSES) return fail("--draft takes at most 15 guesses, got '%s'", text), -1;
        if (!parse_token(item, &guesses[n])) return fail("--draft: '%s' is not a token id", item), -1;
        n++;
    }
    if (n == 0) return fail("--draft needs at least one token id, got '%s'", text), -1;
    return n;
}

static const char *arch_name(int32_t arch) {
    switch (arch) {
    case SPECLA_ARCH_QWEN35: return "qwen35";
    case SPECLA_ARCH_QWEN2: return "qwen2";
    case SPECLA_ARCH_QWEN3: return "qwen3";
    default: return "unknown";
    }
}

/* Indices of the TOP_K largest logits, highest first, ties to the lower index. */
static void top_k(const float *logits, int32_t n, int32_t *best) {
    for (int k = 0; k < TOP_K; k++) best[k] = -1;
    for (int32_t i = 0; i < n; i++) {
        int at = TOP_K;
        while (at > 0 && (best[at - 1] < 0 || logits[i] > logits[best[at - 1]])) at--;
        if (at == TOP_K) continue;
        memmove(&best[at + 1], &best[at], sizeof *best * (size_t)(TOP_K - 1 - at));
        best[at] = i;
    }
}

/* Runs the example on a loaded model; returns the exit status. */
static int run(specla_model *model, const int32_t *prompt, int32_t n_prompt, const int32_t *guesses, int n_guesses) {
    specla_hparams hp;
    if (specla_model_hparams(model, &hp) != SPECLA_OK) return fail("%s", specla_last_error());
    for (int32_t i = 0; i < n_prompt; i++)
        if (prompt[i] >= hp.n_vocab) {
            fprintf(stderr, "specla_example: token %d is outside the vocabulary [0, %d)\n", prompt[i], hp.n_vocab);
            return 1;
        }
    for (int i = 0; i < n_guesses; i++)
        if (guesses[i] >= hp.n_vocab) {
            fprintf(stderr, "specla_example: --draft token %d is outside the vocabulary [0, %d)\n", guesses[i],
                    hp.n_vocab);
            return 1;
        }

    const int32_t n_nodes = 1 + n_guesses;
    specla_context_params params;
    memset(&params, 0, sizeof params); /* zero: defaults (all cores, best CPU kernels, SpecLA methods) */
    params.n_ctx = n_prompt + n_nodes + 1;
    params.max_batch = n_prompt > n_nodes ? n_prompt : n_nodes;
    params.max_tree_nodes = n_nodes;
    params.backend = SPECLA_BACKEND_AUTO;
    specla_context *context = NULL;
    if (specla_context_create(model, &params, &context) != SPECLA_OK) return fail("%s", specla_last_error());

    int status = 1;
    float *logits = (float *)malloc(sizeof *logits * (size_t)hp.n_vocab);
    int32_t *positions = (int32_t *)malloc(sizeof *positions * (size_t)n_prompt);
    if (!logits || !positions) {
        fail("%s", "out of memory");
        goto done;
    }
    printf("model: arch %s, %d layers, n_vocab %d, backend %s\n", arch_name(hp.arch), hp.n_layer, hp.n_vocab,
           specla_context_backend(context) == SPECLA_BACKEND_CUDA ? "cuda" : "cpu");

    /* The prompt: one forward, logits and argmax of its last token. */
    for (int32_t i = 0; i < n_prompt; i++) positions[i] = i;
    int32_t next = -1;
    specla_batch batch = {prompt, positions, n_prompt, 0, logits, &next};
    if (specla_forward(context, &batch) != SPECLA_OK) {
        fail("%s", specla_last_error());
        goto done;
    }
    int32_t best[TOP_K];
    top_k(logits, hp.n_vocab, best);
    printf("argmax: %d\ntop5:", next);
    for (int k = 0; k < TOP_K && best[k] >= 0; k++) printf(" %d:%.9g", best[k], (double)logits[best[k]]);
    printf("\n");

    /* One speculative step: verify the chain [next, guesses...] (node i's parent is i - 1), keep
     * the guesses the model agrees with, commit them. */
    int32_t tokens[1 + MAX_GUESSES], parents[1 + MAX_GUESSES], verified[1 + MAX_GUESSES], path[1 + MAX_GUESSES];
    tokens[0] = next;
    parents[0] = -1;
    for (int i = 0; i < n_guesses; i++) {
        tokens[1 + i] = guesses[i];
        parents[1 + i] = i;
    }
    specla_tree_batch tree = {tokens, parents, n_nodes, 0, NULL, verified};
    if (specla_verify_tree(context, &tree) != SPECLA_OK) {
        fail("%s", specla_last_error());
        goto done;
    }
    int32_t n_path = 1; /* the root is committed whatever the guesses */
    while (n_path < n_nodes && tokens[n_path] == verified[n_path - 1]) n_path++;
    for (int32_t i = 0; i < n_path; i++) path[i] = i;
    if (specla_accept_path(context, path, n_path) != SPECLA_OK) {
        fail("%s", specla_last_error());
        goto done;
    }
    printf("chain:");
    for (int32_t i = 0; i < n_nodes; i++) printf(" %d", tokens[i]);
    printf("\nverify argmax:");
    for (int32_t i = 0; i < n_nodes; i++) printf(" %d", verified[i]);
    printf("\naccepted: %d of %d guesses\nemitted:", n_path - 1, n_guesses);
    for (int32_t i = 1; i < n_path; i++) printf(" %d", tokens[i]);
    printf(" %d\nn_past: %d\n", verified[n_path - 1], specla_context_n_past(context));
    status = 0;
done:
    free(logits);
    free(positions);
    specla_context_free(context);
    return status;
}

int main(int argc, char **argv) {
    const char *model_path = NULL;
    int32_t prompt[4096], guesses[MAX_GUESSES];
    int32_t n_prompt = 0;
    int n_guesses = -1; /* -1: the default guesses */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--draft") == 0) {
            if (i + 1 >= argc) return fail("%s needs a comma-separated list of token ids", argv[i]);
            if ((n_guesses = parse_draft(argv[++i], guesses)) < 0) return 1;
        } else if (strncmp(argv[i], "--", 2) == 0) {
            fail("unknown option '%s'", argv[i]);
            return usage();
        } else if (!model_path) {
            model_path = argv[i];
        } else {
            if (n_prompt == (int32_t)(sizeof prompt / sizeof prompt[0])) return fail("%s", "more than 4096 tokens");
            if (!parse_token(argv[i], &prompt[n_prompt])) return fail("token '%s' is not a token id", argv[i]);
            n_prompt++;
        }
    }
    if (!model_path || n_prompt == 0) return usage();
    if (n_guesses < 0) { /* the prompt's first tokens, a stand-in for a drafter's guesses */
        n_guesses = n_prompt < DEFAULT_GUESSES ? n_prompt : DEFAULT_GUESSES;
        memcpy(guesses, prompt, sizeof *guesses * (size_t)n_guesses);
    }
    if (specla_abi_version() != SPECLA_ABI_VERSION) {
        fprintf(stderr, "specla_example: libspecla has ABI %d, this program was built for %d\n", specla_abi_version(),
                SPECLA_ABI_VERSION);
        return 1;
    }

    specla_model *model = NULL;
    if (specla_model_load_gguf(model_path, &model) != SPECLA_OK) return fail("%s", specla_last_error());
    const int status = run(model, prompt, n_prompt, guesses, n_guesses);
    specla_model_free(model);
    return status;
}
