/* The DDTree of one draft block (specla.h, specla_ddtree_build; docs/ddtree-dflash.md §2): the
 * nodes of the K-ary tree of rank paths, best-first by path score, within a budget and a score
 * floor, the rank-0 chain first when seeded. It runs on the host every speculative step, between the
 * draft's read-back and the verify's launch, while the GPU waits: in Python it took 0.19-0.25 ms of
 * a 12 ms step on the H100 machine's host, through this function 0.07 ms, pyspecla's call included
 * (docs/perf.md, thirty-fourth pass). pyspecla/reference/ddtree.py is the oracle: the same
 * enumeration with Python's heapq, compared node for node by tests/test_ddtree.py.
 *
 * Enumeration (why it visits every node once, in key order, is in the reference's docstring): a heap
 * ordered by key = (-score, depth, rank path) starts from the frontier of what is inserted; each pop
 * is inserted and pushes its next-ranked sibling and its rank-0 child. A heap entry is a node not yet
 * inserted, named by its parent (an inserted node) and its own rank, so its rank path is the parent's
 * path plus one rank: two entries' paths are compared by walking both parent chains up to their
 * common ancestor (no path is stored). Scores are float64, parent score + own log-prob, exactly the
 * reference's additions, so ties fall the same way. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "error.h"
#include "specla.h"

typedef struct ddtree_entry {
    double score;   /* the node's path score */
    int32_t parent; /* inserted node the entry hangs off */
    int32_t rank;   /* its rank within its depth's top-K */
    int32_t depth;  /* parent's depth + 1 */
} ddtree_entry;

typedef struct ddtree_build {
    const int32_t *top_tokens; /* [n_depths][k] */
    const double *top_logprobs;
    int32_t n_depths, k;
    /* the tree so far (node 0 = the root) */
    int32_t *tokens, *parents, *depths, *ranks;
    double *scores;
    int32_t n_nodes;
    /* the min-heap by key */
    ddtree_entry *heap;
    int32_t heap_size;
} ddtree_build;

/* <0 when node path (a, rank_a) sorts before (b, rank_b) at the same depth, >0 after, 0 equal: the
 * lexicographic order of rank paths from the root. Walking both chains up in step, the last
 * difference met is the one nearest the root, which decides. */
static int path_order(const ddtree_build *t, int32_t a, int32_t rank_a, int32_t b, int32_t rank_b) {
    int order = rank_a < rank_b ? -1 : rank_a > rank_b ? 1 : 0;
    while (a != b) {
        const int32_t ra = t->ranks[a], rb = t->ranks[b];
        if (ra != rb) order = ra < rb ? -1 : 1;
        a = t->parents[a], b = t->parents[b];
    }
    return order;
}

/* whether entry x comes before entry y: higher score, then lower depth, then the smaller rank path */
static int entry_before(const ddtree_build *t, const ddtree_entry *x, const ddtree_entry *y) {
    if (x->score != y->score) return x->score > y->score;
    if (x->depth != y->depth) return x->depth < y->depth;
    return path_order(t, x->parent, x->rank, y->parent, y->rank) < 0;
}

/* the node of `rank` at `depth` under inserted node `parent`, unless past the table */
static void push(ddtree_build *t, int32_t parent, int32_t rank) {
    const int32_t depth = t->depths[parent] + 1;
    if (depth > t->n_depths || rank >= t->k) return;
    ddtree_entry e = {t->scores[parent] + t->top_logprobs[(int64_t)(depth - 1) * t->k + rank], parent, rank, depth};
    int32_t i = t->heap_size++;
    while (i > 0) {
        const int32_t up = (i - 1) / 2;
        if (!entry_before(t, &e, &t->heap[up])) break;
        t->heap[i] = t->heap[up];
        i = up;
    }
    t->heap[i] = e;
}

static ddtree_entry pop(ddtree_build *t) {
    const ddtree_entry top = t->heap[0], last = t->heap[--t->heap_size];
    int32_t i = 0;
    for (;;) {
        int32_t child = 2 * i + 1;
        if (child >= t->heap_size) break;
        if (child + 1 < t->heap_size && entry_before(t, &t->heap[child + 1], &t->heap[child])) child++;
        if (!entry_before(t, &t->heap[child], &last)) break;
        t->heap[i] = t->heap[child];
        i = child;
    }
    if (t->heap_size > 0) t->heap[i] = last;
    return top;
}

static int32_t insert(ddtree_build *t, int32_t parent, int32_t rank, double score) {
    const int32_t node = t->n_nodes++, depth = t->depths[parent] + 1;
    t->tokens[node] = t->top_tokens[(int64_t)(depth - 1) * t->k + rank];
    t->parents[node] = parent;
    t->depths[node] = depth;
    t->scores[node] = score;
    t->ranks[node] = rank;
    return node;
}

/* The table's values as the enumeration needs them (the caller, pyspecla's build_ddtree, checks the
 * same things first and words them with the entry's value). */
static specla_status check_tables(const int32_t *top_tokens, const double *top_logprobs, int32_t n_depths,
                                  int32_t k) {
    for (int32_t d = 0; d < n_depths; d++)
        for (int32_t r = 0; r < k; r++) {
            const int64_t i = (int64_t)d * k + r;
            if (top_tokens[i] < 0)
                return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                                   "specla_ddtree_build: top_tokens[%d, %d] = %d is not a token id", d, r,
                                   top_tokens[i]);
            const double lp = top_logprobs[i];
            if (!isfinite(lp))
                return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_ddtree_build: top_logprobs[%d, %d] is not finite",
                                   d, r);
            if (lp > 0.0)
                return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                                   "specla_ddtree_build: top_logprobs[%d, %d] = %g is positive (log-probs are <= 0)", d,
                                   r, lp);
            if (r > 0 && lp > top_logprobs[i - 1])
                return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                                   "specla_ddtree_build: top_logprobs row %d is not sorted descending at column %d", d,
                                   r - 1);
        }
    return SPECLA_OK;
}

SPECLA_API specla_status specla_ddtree_build(int32_t root_token, const int32_t *top_tokens,
                                             const double *top_logprobs, int32_t n_depths, int32_t k, int32_t budget,
                                             double floor_score, int32_t chain_seed, int32_t *tokens,
                                             int32_t *parents, int32_t *depths, double *scores, int32_t *ranks,
                                             int32_t capacity, int32_t *n_nodes) {
    if (!n_nodes) return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_ddtree_build: n_nodes is NULL");
    *n_nodes = 0;
    if (root_token < 0)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_ddtree_build: root_token = %d is not a token id",
                           root_token);
    if (n_depths < 1 || k < 1)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                           "specla_ddtree_build: the top-K table is %d x %d (at least one depth row and K >= 1)",
                           n_depths, k);
    if (budget < 0 || budget == INT32_MAX)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_ddtree_build: budget = %d is out of range", budget);
    if (capacity < budget + 1)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT,
                           "specla_ddtree_build: capacity = %d cannot hold the root and a budget of %d nodes", capacity,
                           budget);
    if (isnan(floor_score))
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_ddtree_build: floor_score is NaN");
    if (!top_tokens || !top_logprobs || !tokens || !parents || !depths || !scores || !ranks)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "specla_ddtree_build: an array argument is NULL");
    specla_status st = check_tables(top_tokens, top_logprobs, n_depths, k);
    if (st != SPECLA_OK) return st;

    ddtree_build t = {top_tokens, top_logprobs, n_depths, k, tokens, parents, depths, ranks, scores, 0, NULL, 0};
    t.tokens[0] = root_token, t.parents[0] = -1, t.depths[0] = 0, t.scores[0] = 0.0, t.ranks[0] = -1;
    t.n_nodes = 1;
    if (budget > 0) {
        /* at most: the chain's rank-1 siblings and its last node's child, then two pushes per pop */
        const int64_t most = (int64_t)(n_depths < budget ? n_depths : budget) + 1 + 2 * (int64_t)budget;
        t.heap = (ddtree_entry *)malloc(sizeof(ddtree_entry) * (size_t)most);
        if (!t.heap) return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "specla_ddtree_build: out of memory");
        if (chain_seed) {
            int32_t node = 0;
            while (t.n_nodes - 1 < budget && t.depths[node] < n_depths) {
                const double score = t.scores[node] + top_logprobs[(int64_t)t.depths[node] * k];
                if (score < floor_score) break;
                node = insert(&t, node, 0, score);
            }
            /* the chain nodes' successors that are not chain nodes: each one's rank-1 sibling, and
             * the last one's rank-0 child (out of the window when the chain stopped at the floor) */
            for (int32_t c = 1; c < t.n_nodes; c++) push(&t, t.parents[c], 1);
            push(&t, node, 0);
        } else {
            push(&t, 0, 0);
        }
        while (t.heap_size > 0 && t.n_nodes - 1 < budget) {
            const ddtree_entry e = pop(&t);
            if (e.score < floor_score) break; /* pops come in descending score: nothing later is in */
            const int32_t node = insert(&t, e.parent, e.rank, e.score);
            push(&t, e.parent, e.rank + 1); /* the next-ranked sibling */
            push(&t, node, 0);              /* the rank-0 child */
        }
        free(t.heap);
    }
    *n_nodes = t.n_nodes;
    return SPECLA_OK;
}
