"""DDTree: the draft tree built from one DFlash block (docs/ddtree-dflash.md §2).

Input: the block's per-depth top-K, `top_tokens` / `top_logprobs` of shape (depths, K), row d-1 for
depth d, columns sorted by descending log-prob (rank 0 best), log-probs normalised over the whole
vocabulary (so <= 0). Every depth uses the same row whatever the parent (the method's approximation:
all depths are conditioned on the top-1 spine), so a node is identified by its path of ranks
(r1, ..., rd) and its score is the sum lp[0][r1] + ... + lp[d-1][rd], accumulated left to right in
float64 (parent score + own log-prob, so equal paths give bit-identical scores).

Enumeration. Seen as a left-child/right-sibling binary tree, every node (r1..rd) has exactly one
"pusher": its previous sibling (r1..rd-1) when rd > 0, else its parent (rank-0 child link). A
pusher never scores below what it pushes (log-probs are <= 0 and rows descend) and wins a tie under
the order used on the heap, key = (-score, depth, rank path). So popping a max-heap that starts
from the pushers' frontier and pushes each popped node's next sibling and rank-0 child visits every
node exactly once, in exactly that global order. Consequences the tests check:
- chain seed off, tau = inf: the tree is the first `budget` nodes of the K-ary tree (depth <=
  depths) in key order, hence the best-scoring `budget` nodes, and ancestor-closed;
- chain seed on: the rank-0 chain is inserted first (stopping at budget or at the first depth out
  of the tau window), its nodes' rank-1 siblings and the last chain node's rank-0 child seed the
  heap, and the rest are the best non-chain nodes in key order;
- tau window: q* = top_logprobs[0, 0] is the best score anywhere; pops come in key order, so the
  first pop with score < q* - tau ends expansion and the result is every node of the window up to
  the budget, still ancestor-closed (an ancestor never scores below its descendant).

Node order is insertion order (topological, not DFS); node 0 is the root (the last committed token)
with depth 0, score 0.0 and rank -1. A bad argument raises UsageError naming it.

The library builds the tree (specla_ddtree_build, native/src/ddtree.c): the loop does it every step
while the GPU waits for the verify, and in Python it took 1.5-2 % of a step (docs/perf.md,
thirty-fourth pass). pyspecla/reference/ddtree.py keeps the enumeration in Python as its oracle."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from .. import _native
from ..errors import UsageError

__all__ = ["DraftTree", "build_chain", "build_ddtree"]

_INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class DraftTree:
    """A draft tree in insertion order. All arrays are 1-D of length n_nodes and read-only.

    tokens:  int32, tokens[0] = the root (last committed token)
    parents: int32, parents[0] = -1, 0 <= parents[i] < i (topological)
    depths:  int32, depths[0] = 0, depths[i] = depths[parents[i]] + 1
    scores:  float64, scores[0] = 0.0, sum of the draft log-probs along the path
    ranks:   int32, ranks[0] = -1, the node's rank within its depth's top-K
    """

    tokens: np.ndarray
    parents: np.ndarray
    depths: np.ndarray
    scores: np.ndarray
    ranks: np.ndarray

    def __post_init__(self):
        fields = {"tokens": np.int32, "parents": np.int32, "depths": np.int32, "scores": np.float64,
                  "ranks": np.int32}
        arrays = {}
        for name, dtype in fields.items():
            value = np.asarray(getattr(self, name))
            if value.ndim != 1:
                raise UsageError(f"DraftTree: {name} must be 1-D, got shape {value.shape}")
            if dtype is np.int32 and value.size and not np.issubdtype(value.dtype, np.integer):
                raise UsageError(f"DraftTree: {name} must hold integers, got dtype {value.dtype}")
            array = np.array(value, dtype=dtype, copy=True)
            array.setflags(write=False)
            arrays[name] = array
            object.__setattr__(self, name, array)
        n_nodes = len(arrays["tokens"])
        if n_nodes < 1:
            raise UsageError("DraftTree: tokens must hold at least the root (node 0)")
        for name, array in arrays.items():
            if len(array) != n_nodes:
                raise UsageError(f"DraftTree: {name} has {len(array)} entries, tokens has {n_nodes}")
        parents, depths = arrays["parents"], arrays["depths"]
        if parents[0] != -1:
            raise UsageError(f"DraftTree: parents[0] = {parents[0]} must be -1 (node 0 is the root)")
        if depths[0] != 0:
            raise UsageError(f"DraftTree: depths[0] = {depths[0]} must be 0 (node 0 is the root)")
        index = np.arange(n_nodes)
        bad = np.flatnonzero((parents[1:] < 0) | (parents[1:] >= index[1:])) + 1
        if len(bad):
            t = int(bad[0])
            raise UsageError(f"DraftTree: parents[{t}] = {parents[t]} is not in [0, {t}) "
                             "(parents must be in topological order)")
        bad = np.flatnonzero(depths[1:] != depths[parents[1:]] + 1) + 1
        if len(bad):
            t = int(bad[0])
            raise UsageError(f"DraftTree: depths[{t}] = {depths[t]} must be depths[parents[{t}]] + 1 "
                             f"= {depths[parents[t]] + 1}")

    @property
    def n_nodes(self) -> int:
        """Nodes including the root."""
        return len(self.tokens)

    def visibility(self) -> np.ndarray:
        """bool [n, n]: [i, j] is True when node j is an ancestor of node i or i itself (the tree
        part of the verify attention mask; every row also sees the committed prefix)."""
        n_nodes = self.n_nodes
        visible = np.zeros((n_nodes, n_nodes), dtype=bool)
        visible[0, 0] = True
        for i in range(1, n_nodes):
            visible[i] = visible[self.parents[i]]  # parents come first: their row is complete
            visible[i, i] = True
        return visible

    def children(self) -> list[list[int]]:
        """children()[i] = the children of node i in increasing index order."""
        children: list[list[int]] = [[] for _ in range(self.n_nodes)]
        for i in range(1, self.n_nodes):
            children[self.parents[i]].append(i)
        return children

    def __eq__(self, other):
        if not isinstance(other, DraftTree):
            return NotImplemented
        return all(np.array_equal(getattr(self, name), getattr(other, name))
                   for name in ("tokens", "parents", "depths", "scores", "ranks"))

    def __hash__(self):
        return hash((self.tokens.tobytes(), self.parents.tobytes(), self.depths.tobytes(),
                     self.scores.tobytes(), self.ranks.tobytes()))


def _count(value, name: str, where: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise UsageError(f"{where}: {name} must be an integer, got {value!r}")
    value = int(value)
    if value < 0:
        raise UsageError(f"{where}: {name} must be >= 0, got {value}")
    return value


def _top_tables(root_token, top_tokens, top_logprobs, where: str) -> tuple[int, np.ndarray, np.ndarray]:
    """Validate the root token and the (depths, K) top-K tables; return them as int/int32/float64."""
    if isinstance(root_token, (bool, np.bool_)) or not isinstance(root_token, numbers.Integral) \
            or not 0 <= int(root_token) <= _INT32_MAX:
        raise UsageError(f"{where}: root_token must be a token id in [0, 2^31), got {root_token!r}")
    tokens = np.asarray(top_tokens)
    logprobs = np.asarray(top_logprobs)
    if tokens.ndim != 2:
        raise UsageError(f"{where}: top_tokens must be 2-D (depths, K), got shape {tokens.shape}")
    if logprobs.shape != tokens.shape:
        raise UsageError(f"{where}: top_logprobs has shape {logprobs.shape}, top_tokens has {tokens.shape}")
    n_depths, k = tokens.shape
    if n_depths < 1:
        raise UsageError(f"{where}: top_tokens must have at least one depth row, got shape {tokens.shape}")
    if k < 1:
        raise UsageError(f"{where}: top_tokens must have K >= 1 columns, got shape {tokens.shape}")
    if not np.issubdtype(tokens.dtype, np.integer):
        raise UsageError(f"{where}: top_tokens must hold integer token ids, got dtype {tokens.dtype}")
    if tokens.min() < 0 or tokens.max() > _INT32_MAX:
        row, col = np.argwhere((tokens < 0) | (tokens > _INT32_MAX))[0]
        raise UsageError(f"{where}: top_tokens[{row}, {col}] = {tokens[row, col]} is not a token id in [0, 2^31)")
    if not (np.issubdtype(logprobs.dtype, np.floating) or np.issubdtype(logprobs.dtype, np.integer)):
        raise UsageError(f"{where}: top_logprobs must hold real numbers, got dtype {logprobs.dtype}")
    logprobs = logprobs.astype(np.float64)
    if not np.all(np.isfinite(logprobs)):
        row, col = np.argwhere(~np.isfinite(logprobs))[0]
        raise UsageError(f"{where}: top_logprobs[{row}, {col}] = {logprobs[row, col]} is not finite")
    if np.any(logprobs > 0.0):
        row, col = np.argwhere(logprobs > 0.0)[0]
        raise UsageError(f"{where}: top_logprobs[{row}, {col}] = {logprobs[row, col]} is positive "
                         "(log-probs normalised over the vocabulary are <= 0)")
    rising = np.diff(logprobs, axis=1) > 0.0
    if np.any(rising):
        row, col = np.argwhere(rising)[0]
        raise UsageError(f"{where}: top_logprobs row {row} is not sorted descending "
                         f"([{row}, {col}] = {logprobs[row, col]} < [{row}, {col + 1}] = {logprobs[row, col + 1]})")
    return int(root_token), tokens.astype(np.int32), logprobs


def _tau_floor(tau, q_star: float) -> float:
    """The lowest score inside the window: q* - tau (tau None = off, negative tau clamped to 0)."""
    if tau is None:
        return -math.inf
    if isinstance(tau, (bool, np.bool_)) or not isinstance(tau, numbers.Real) or math.isnan(float(tau)):
        raise UsageError(f"build_ddtree: tau must be a real number or None, got {tau!r}")
    return q_star - max(float(tau), 0.0)


def build_ddtree(root_token: int, top_tokens: np.ndarray, top_logprobs: np.ndarray, budget: int,
                 tau: float | None = None, chain_seed: bool = True) -> DraftTree:
    """The DDTree of one draft block: at most `budget` nodes besides the root, chosen best-first by
    path score inside the window score >= top_logprobs[0, 0] - tau (see the module docstring),
    built by the library (specla_ddtree_build). The tables a drafter returns (int32 tokens, float
    log-probs) go to the library unchecked and it checks their values; anything else, and any table
    the library refuses, goes through _top_tables first, whose message names the entry at fault."""
    budget = _count(budget, "budget", "build_ddtree")
    if not isinstance(chain_seed, (bool, np.bool_)):
        raise UsageError(f"build_ddtree: chain_seed must be a bool, got {chain_seed!r}")
    tokens, logprobs = np.asarray(top_tokens), np.asarray(top_logprobs)
    fast = (tokens.dtype == np.int32 and logprobs.dtype in (np.float32, np.float64) and tokens.ndim == 2
            and logprobs.shape == tokens.shape and tokens.size > 0 and type(root_token) is int
            and 0 <= root_token <= _INT32_MAX)
    if not fast:
        root_token, tokens, logprobs = _top_tables(root_token, top_tokens, top_logprobs, "build_ddtree")
    # the library reads both tables row by row (a transposed or strided table is copied)
    tokens = np.ascontiguousarray(tokens, dtype=np.int32)
    logprobs = np.ascontiguousarray(logprobs, dtype=np.float64)
    n_depths, k = tokens.shape
    floor = _tau_floor(tau, float(logprobs[0, 0]))
    capacity = budget + 1
    # one int32 buffer for tokens, parents, depths, ranks and the node count (an address each is the
    # costly part of a ctypes call), the scores in another
    ints = np.empty(4 * capacity + 1, dtype=np.int32)
    scores = np.empty(capacity, dtype=np.float64)
    base, stride = ints.ctypes.data, 4 * capacity
    status = _native.lib.specla_ddtree_build(
        root_token, tokens.ctypes.data, logprobs.ctypes.data, n_depths, k, budget, floor, bool(chain_seed), base,
        base + stride, base + 2 * stride, scores.ctypes.data, base + 3 * stride, capacity, base + 4 * stride)
    if status != _native.OK:
        if fast:  # the library refused a value: _top_tables names it as the Python checks do
            _top_tables(root_token, tokens, logprobs, "build_ddtree")
        _native.check(status)
    n = int(ints[-1])
    ints.setflags(write=False)
    scores.setflags(write=False)
    return _tree(ints[:n], ints[capacity:capacity + n], ints[2 * capacity:2 * capacity + n], scores[:n],
                 ints[3 * capacity:3 * capacity + n])


def build_chain(root_token: int, top_tokens: np.ndarray, top_logprobs: np.ndarray, max_depth: int) -> DraftTree:
    """The top-1 chain only (mode --no-ddtree): root, then the rank-0 token of depths
    1..min(max_depth, depths), each the child of the previous node."""
    root_token, tokens, logprobs = _top_tables(root_token, top_tokens, top_logprobs, "build_chain")
    max_depth = _count(max_depth, "max_depth", "build_chain")
    length = min(max_depth, tokens.shape[0])
    scores = np.concatenate([[0.0], np.cumsum(logprobs[:length, 0])])
    return _tree([root_token, *tokens[:length, 0].tolist()], list(range(-1, length)), list(range(length + 1)),
                 scores, [-1] + [0] * length)


def _tree(tokens, parents, depths, scores, ranks) -> DraftTree:
    """A builder's tree, made without DraftTree's checks: the builders above produce a root, parents
    in topological order and consistent depths by construction (tests/test_ddtree.py checks them on
    every tree it builds), and on a GPU step the checks cost as much as the build itself. The arrays
    are read-only and the tree's own, as DraftTree's: lists and writeable arrays are copied, the
    library builder's read-only views of the buffers it filled for this tree are taken as they are."""
    tree = object.__new__(DraftTree)
    for name, values, dtype in (("tokens", tokens, np.int32), ("parents", parents, np.int32),
                                ("depths", depths, np.int32), ("scores", scores, np.float64),
                                ("ranks", ranks, np.int32)):
        if isinstance(values, np.ndarray) and values.dtype == dtype and not values.flags.writeable:
            array = values
        else:
            array = np.array(values, dtype=dtype)
            array.setflags(write=False)
        object.__setattr__(tree, name, array)
    return tree
