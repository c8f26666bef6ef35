"""DDTree construction (pyspecla.speculative.tree) and the greedy accept walk (pyspecla.speculative.accept),
against the rules of docs/ddtree-dflash.md §2-3 checked directly.

The builder is compared node for node with `reference_paths`, which derives the expected insertion
order from nothing but the definitions of docs/ddtree-dflash.md §2: the rank-0 chain first (when seeded), then every
other in-window node sorted by (-score, depth, rank path), cut at the budget. That list is computed
by exhaustive enumeration of the nodes above a score threshold, not by a heap. Independent of that,
`check_tree` asserts the structural rules (root, topological, ancestor-closed, scores, tokens, ranks,
window, budget, best-first frontier), and small cases are checked for the maximal total score over
every ancestor-closed node set by brute force. Accept: hand-made trees (full, partial, side branch,
no match, duplicate siblings) and, on hypothesis trees, "speculative greedy == autoregressive greedy"
for a deterministic stand-in target."""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyspecla import _native
from pyspecla.errors import UsageError
from pyspecla.reference.ddtree import build_ddtree as reference_build_ddtree
from pyspecla.speculative.accept import emitted_tokens, greedy_accept
from pyspecla.speculative.tree import DraftTree, build_chain, build_ddtree

ROOT = 151_000


# ---------------------------------------------------------------------------------------------
# Inputs


def realistic_tables(seed: int, n_depths: int, k: int, vocab: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Per-depth top-K of log_softmax over a random vocabulary (peaked, like a draft head)."""
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((n_depths, vocab)) * 3.0
    logits[:, rng.integers(0, vocab)] += 4.0
    logprobs = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) \
        - logits.max(1, keepdims=True)
    order = np.argsort(-logprobs, axis=1, kind="stable")[:, :k]
    top_logprobs = np.take_along_axis(logprobs, order, axis=1)
    top_logprobs = np.minimum(top_logprobs, 0.0)
    return order.astype(np.int32), top_logprobs


def tables_from_logprobs(top_logprobs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct token ids (depth*1000 + rank) for a given log-prob table."""
    n_depths, k = top_logprobs.shape
    tokens = (np.arange(n_depths)[:, None] * 1000 + np.arange(k)[None, :]).astype(np.int32)
    return tokens, np.asarray(top_logprobs, dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# The definitions of docs/ddtree-dflash.md §2, computed directly


def path_score(logprobs: np.ndarray, path: tuple[int, ...]) -> float:
    score = 0.0
    for depth, rank in enumerate(path):
        score = score + float(logprobs[depth, rank])  # left to right, as the definition's running sum
    return score


def tau_floor(logprobs: np.ndarray, tau) -> float:
    return -math.inf if tau is None else float(logprobs[0, 0]) - max(float(tau), 0.0)


def key(logprobs, path):
    return (-path_score(logprobs, path), len(path), path)


def nodes_above(logprobs: np.ndarray, threshold: float, limit: int = 500_000) -> list[tuple[int, ...]]:
    """Every rank path (depth >= 1) whose score is >= threshold, by exhaustive DFS (an ancestor never
    scores below its descendant, so a subtree below the threshold is skipped whole)."""
    n_depths, k = logprobs.shape
    found: list[tuple[int, ...]] = []
    stack = [((), 0.0)]
    while stack:
        path, score = stack.pop()
        if len(path) == n_depths:
            continue
        for rank in range(k):
            child_score = score + float(logprobs[len(path), rank])
            if child_score >= threshold:
                found.append(path + (rank,))
                stack.append((path + (rank,), child_score))
                assert len(found) <= limit, "reference enumeration too large for this table"
    return found


def all_nodes(n_depths: int, k: int) -> list[tuple[int, ...]]:
    return [path for depth in range(1, n_depths + 1) for path in itertools.product(range(k), repeat=depth)]


def reference_paths(logprobs: np.ndarray, budget: int, tau, chain_seed: bool) -> list[tuple[int, ...]]:
    """The expected insertion order (rank paths of nodes 1..n) from those definitions."""
    n_depths, _ = logprobs.shape
    floor = tau_floor(logprobs, tau)
    chain: list[tuple[int, ...]] = []
    if chain_seed:
        while len(chain) < min(n_depths, budget) and path_score(logprobs, (0,) * (len(chain) + 1)) >= floor:
            chain.append((0,) * (len(chain) + 1))
    wanted = budget - len(chain)
    if wanted <= 0:
        return chain
    chain_set = set(chain)
    q_star = float(logprobs[0, 0])
    lowest_score = float(logprobs.min(axis=1).sum())  # no node scores below this
    gap = 0.5
    while True:
        threshold = max(q_star - gap, floor)
        candidates = [p for p in nodes_above(logprobs, threshold) if p not in chain_set]
        # Enough nodes above the threshold, or every in-window node enumerated: any node left out
        # scores below every enumerated one, so the sorted prefix is exact.
        if len(candidates) >= wanted or threshold == floor or threshold <= lowest_score:
            candidates.sort(key=lambda p: key(logprobs, p))
            return chain + candidates[:wanted]
        gap *= 2.0


def tree_paths(tree: DraftTree) -> list[tuple[int, ...]]:
    paths: list[tuple[int, ...]] = [()]
    for i in range(1, tree.n_nodes):
        paths.append(paths[tree.parents[i]] + (int(tree.ranks[i]),))
    return paths[1:]


def check_tree(tree: DraftTree, root, tokens, logprobs, budget, tau, chain_seed) -> None:
    """The structural rules of §2, derived from the inputs only."""
    n_depths, k = logprobs.shape
    n = tree.n_nodes
    for name, dtype in (("tokens", np.int32), ("parents", np.int32), ("depths", np.int32),
                        ("scores", np.float64), ("ranks", np.int32)):
        array = getattr(tree, name)
        assert array.dtype == dtype and array.shape == (n,), (name, array.dtype, array.shape)
        assert not array.flags.writeable, name
    # the builders skip DraftTree's own checks (tree._tree); the same arrays pass them
    assert DraftTree(tokens=tree.tokens, parents=tree.parents, depths=tree.depths, scores=tree.scores,
                     ranks=tree.ranks) == tree
    assert tree.tokens[0] == root and tree.parents[0] == -1 and tree.depths[0] == 0
    assert tree.scores[0] == 0.0 and tree.ranks[0] == -1
    assert n - 1 <= budget
    floor = tau_floor(logprobs, tau)
    paths = [()] + tree_paths(tree)
    assert len(set(paths)) == n, "a node was inserted twice"
    for i in range(1, n):
        parent, depth, rank = int(tree.parents[i]), int(tree.depths[i]), int(tree.ranks[i])
        assert 0 <= parent < i, "not topological"  # so also ancestor-closed
        assert depth == tree.depths[parent] + 1 and 1 <= depth <= n_depths and 0 <= rank < k
        assert tree.tokens[i] == tokens[depth - 1, rank]
        assert tree.scores[i] == tree.scores[parent] + logprobs[depth - 1, rank]  # bit-exact
        assert tree.scores[i] >= floor, "node outside the tau window"
    chain_length = 0
    if chain_seed:
        while chain_length + 1 < n and paths[chain_length + 1] == (0,) * (chain_length + 1):
            chain_length += 1
        expected_chain = 0
        while expected_chain < min(n_depths, budget) and \
                path_score(logprobs, (0,) * (expected_chain + 1)) >= floor:
            expected_chain += 1
        assert chain_length == expected_chain, (chain_length, expected_chain)
    # Best-first: every node outside the tree descends from a frontier node (a non-member child of
    # a member) that beats it, so checking the frontier covers the whole K-ary tree.
    members = set(paths)
    chosen_keys = [key(logprobs, p) for p in paths[1 + chain_length:]]
    worst_chosen = max(chosen_keys) if chosen_keys else None
    for path in paths:
        if len(path) == n_depths:
            continue
        for rank in range(k):
            child = path + (rank,)
            if child in members:
                continue
            in_window = path_score(logprobs, child) >= floor
            if n - 1 < budget:
                assert not in_window, f"tree stopped short of the budget with {child} in the window"
            if in_window and worst_chosen is not None:
                assert key(logprobs, child) > worst_chosen, f"{child} beats a chosen node"


def build_and_check(root, tokens, logprobs, budget, tau, chain_seed) -> DraftTree:
    """The library's tree (build_ddtree) against the rules, the exhaustive enumeration and the
    Python heap builder it replaced (pyspecla.reference.ddtree), node for node and bit for bit."""
    tree = build_ddtree(root, tokens, logprobs, budget, tau=tau, chain_seed=chain_seed)
    check_tree(tree, root, tokens, logprobs, budget, tau, chain_seed)
    assert tree_paths(tree) == reference_paths(logprobs, budget, tau, chain_seed)
    assert reference_build_ddtree(root, tokens, logprobs, budget, tau=tau, chain_seed=chain_seed) == tree
    return tree


# ---------------------------------------------------------------------------------------------
# The grid of the brief: budget x tau x chain seed x K x depths


@pytest.mark.parametrize("n_depths", [1, 15])
@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("chain_seed", [True, False])
@pytest.mark.parametrize("tau", [None, 6.0, 0.0, -2.5])
@pytest.mark.parametrize("budget", [0, 1, 4, 16, 22, 40])
def test_grid(budget, tau, chain_seed, k, n_depths):
    for seed in range(3):
        tokens, logprobs = realistic_tables(seed * 31 + k + n_depths, n_depths, k)
        tree = build_and_check(ROOT, tokens, logprobs, budget, tau, chain_seed)
        total = sum(k**d for d in range(1, n_depths + 1))
        if tau is None:
            assert tree.n_nodes - 1 == min(budget, total)
        if tau is not None and tau <= 0:
            # the window is a single score: q*; the realistic tables have no zero log-probs past
            # rank 0 of depth 1, so only node (0,) (and any rank-0 chain of exact zeros) fits
            assert np.all(tree.scores[1:] == logprobs[0, 0])
        if chain_seed and tau is None:
            chain = min(n_depths, budget)
            assert list(tree.parents[1:chain + 1]) == list(range(chain))
            assert list(tree.ranks[1:chain + 1]) == [0] * chain
            assert list(tree.tokens[1:chain + 1]) == list(tokens[:chain, 0])


def test_budget_zero_is_root_only():
    tokens, logprobs = realistic_tables(0, 15, 4)
    for chain_seed in (True, False):
        tree = build_ddtree(7, tokens, logprobs, 0, tau=6.0, chain_seed=chain_seed)
        assert tree.n_nodes == 1 and list(tree.tokens) == [7] and list(tree.parents) == [-1]
        assert tree.visibility().tolist() == [[True]]


def test_tau_infinity_is_the_unpruned_tree():
    tokens, logprobs = realistic_tables(5, 15, 8)
    for chain_seed in (True, False):
        for budget in (1, 22, 40, 300):
            unpruned = build_ddtree(ROOT, tokens, logprobs, budget, tau=None, chain_seed=chain_seed)
            assert build_ddtree(ROOT, tokens, logprobs, budget, tau=math.inf, chain_seed=chain_seed) == unpruned
            assert build_ddtree(ROOT, tokens, logprobs, budget, tau=1e300, chain_seed=chain_seed) == unpruned
            assert tree_paths(unpruned) == reference_paths(logprobs, budget, None, chain_seed)


def test_negative_tau_is_clamped_to_zero():
    tokens, logprobs = realistic_tables(9, 15, 4)
    for chain_seed in (True, False):
        zero = build_ddtree(ROOT, tokens, logprobs, 22, tau=0.0, chain_seed=chain_seed)
        assert build_ddtree(ROOT, tokens, logprobs, 22, tau=-3.0, chain_seed=chain_seed) == zero
        assert build_ddtree(ROOT, tokens, logprobs, 22, tau=-math.inf, chain_seed=chain_seed) == zero


def test_tau_zero_keeps_exact_ties_of_the_best_score():
    # log-prob 0 at rank 0 of depths 1-3 and at rank 1 of depth 2: scores 0 are all in the window
    logprobs = np.array([[0.0, -1.0], [0.0, 0.0], [0.0, -2.0], [-0.5, -0.7]])
    tokens, logprobs = tables_from_logprobs(logprobs)
    for chain_seed in (True, False):
        tree = build_and_check(ROOT, tokens, logprobs, 10, 0.0, chain_seed)
        assert set(tree_paths(tree)) == {(0,), (0, 0), (0, 1), (0, 0, 0), (0, 1, 0)}
    # chain seed on: the chain goes in first even though (0, 1) ties with (0, 0, 0)
    assert tree_paths(build_ddtree(ROOT, tokens, logprobs, 10, tau=0.0)) == \
        [(0,), (0, 0), (0, 0, 0), (0, 1), (0, 1, 0)]
    # chain seed off: pure key order (-score, depth, rank path)
    assert tree_paths(build_ddtree(ROOT, tokens, logprobs, 10, tau=0.0, chain_seed=False)) == \
        [(0,), (0, 0), (0, 1), (0, 0, 0), (0, 1, 0)]


def test_tau_window_stops_the_chain_seed():
    logprobs = np.array([[-0.1, -3.0], [-0.2, -0.4], [-5.0, -6.0], [-0.1, -0.2]])
    tokens, logprobs = tables_from_logprobs(logprobs)
    tree = build_and_check(ROOT, tokens, logprobs, 22, 1.0, True)
    # depth 3 rank 0 scores -5.3 < -0.1 - 1: the chain stops at depth 2, nothing deeper fits
    assert tree_paths(tree) == [(0,), (0, 0), (0, 1)]
    assert tree.depths.max() == 2


def test_ties_are_broken_by_depth_then_rank_path():
    logprobs = np.full((3, 3), -1.0)  # every node of a depth ties
    tokens, logprobs = tables_from_logprobs(logprobs)
    tree = build_and_check(ROOT, tokens, logprobs, 7, None, False)
    assert tree_paths(tree) == [(0,), (1,), (2,), (0, 0), (0, 1), (0, 2), (1, 0)]
    tree = build_and_check(ROOT, tokens, logprobs, 7, None, True)
    assert tree_paths(tree) == [(0,), (0, 0), (0, 0, 0), (1,), (2,), (0, 1), (0, 2)]


def test_chain_seed_puts_the_rank0_chain_first():
    tokens, logprobs = realistic_tables(11, 15, 4)
    for budget in (1, 4, 15, 16, 22, 40):
        tree = build_ddtree(ROOT, tokens, logprobs, budget, tau=None, chain_seed=True)
        chain = min(15, budget)
        assert list(tree.depths[1:chain + 1]) == list(range(1, chain + 1))
        assert list(tree.parents[1:chain + 1]) == list(range(chain))
        assert list(tree.ranks[1:chain + 1]) == [0] * chain
        assert list(tree.tokens[1:chain + 1]) == list(tokens[:chain, 0])
        assert tree.n_nodes == budget + 1


def test_k1_is_the_chain():
    tokens, logprobs = realistic_tables(2, 15, 1)
    for budget in (0, 3, 15, 40):
        for chain_seed in (True, False):
            tree = build_ddtree(ROOT, tokens, logprobs, budget, chain_seed=chain_seed)
            assert tree == build_chain(ROOT, tokens, logprobs, budget)


def test_build_chain():
    tokens, logprobs = realistic_tables(3, 15, 8)
    for max_depth in (0, 1, 7, 15, 40):
        chain = build_chain(ROOT, tokens, logprobs, max_depth)
        length = min(max_depth, 15)
        assert chain.n_nodes == length + 1
        assert not any(getattr(chain, f).flags.writeable for f in ("tokens", "parents", "depths", "scores", "ranks"))
        assert DraftTree(tokens=chain.tokens, parents=chain.parents, depths=chain.depths, scores=chain.scores,
                         ranks=chain.ranks) == chain
        assert list(chain.tokens) == [ROOT] + list(tokens[:length, 0])
        assert list(chain.parents) == list(range(-1, length))
        assert list(chain.depths) == list(range(length + 1))
        assert list(chain.ranks) == [-1] + [0] * length
        assert list(chain.scores) == [path_score(logprobs, (0,) * d) for d in range(length + 1)]
        # and the chain is the seed of the tree with the same budget
        tree = build_ddtree(ROOT, tokens, logprobs, max_depth)
        assert list(tree.tokens[:length + 1]) == list(chain.tokens)
        assert list(tree.scores[:length + 1]) == list(chain.scores)


def test_deterministic_and_inputs_untouched():
    tokens, logprobs = realistic_tables(4, 15, 8)
    tokens_copy, logprobs_copy = tokens.copy(), logprobs.copy()
    first = build_ddtree(ROOT, tokens, logprobs, 40, tau=6.0)
    for _ in range(3):
        again = build_ddtree(ROOT, tokens.copy(), logprobs.copy(), 40, tau=6.0)
        assert again == first and hash(again) == hash(first)
        assert again.scores.tobytes() == first.scores.tobytes()
    assert np.array_equal(tokens, tokens_copy) and np.array_equal(logprobs, logprobs_copy)
    # lists and other integer/float dtypes give the same tree
    assert build_ddtree(ROOT, tokens.astype(np.int64).tolist(), logprobs.tolist(), 40, tau=6.0) == first
    with pytest.raises(ValueError):
        first.tokens[0] = 1  # read-only


def test_budget_larger_than_the_whole_tree():
    tokens, logprobs = realistic_tables(6, 3, 2)
    for chain_seed in (True, False):
        tree = build_and_check(ROOT, tokens, logprobs, 1000, None, chain_seed)
        assert tree.n_nodes == 1 + 2 + 4 + 8
        assert set(tree_paths(tree)) == set(all_nodes(3, 2))


# ---------------------------------------------------------------------------------------------
# Brute-force optimality: the maximal total score over ancestor-closed node sets


def best_closed_total(logprobs, size, floor, required: set) -> float:
    nodes = [p for p in all_nodes(*logprobs.shape) if path_score(logprobs, p) >= floor]
    best = -math.inf
    for subset in itertools.combinations(nodes, size):
        chosen = set(subset)
        if not required <= chosen or any(len(p) > 1 and p[:-1] not in chosen for p in subset):
            continue
        best = max(best, sum(path_score(logprobs, p) for p in subset))
    return best


@pytest.mark.parametrize("shape", [(3, 2), (2, 3), (4, 1), (1, 4), (2, 2)])
@pytest.mark.parametrize("tau", [None, 2.0])
@pytest.mark.parametrize("chain_seed", [False, True])
def test_brute_force_optimal(shape, tau, chain_seed):
    n_depths, k = shape
    total = sum(k**d for d in range(1, n_depths + 1))
    for seed in range(4):
        rng = np.random.default_rng(seed)
        raw = -np.sort(rng.exponential(1.0, size=shape), axis=1)
        if seed == 3:
            raw = np.round(raw * 2) / 2  # ties
        tokens, logprobs = tables_from_logprobs(raw)
        floor = tau_floor(logprobs, tau)
        for budget in range(0, total + 2):
            tree = build_and_check(ROOT, tokens, logprobs, budget, tau, chain_seed)
            paths = tree_paths(tree)
            chain_length = 0
            while chain_seed and chain_length < len(paths) and paths[chain_length] == (0,) * (chain_length + 1):
                chain_length += 1
            best = best_closed_total(logprobs, len(paths), floor, set(paths[:chain_length]))
            got = sum(path_score(logprobs, p) for p in paths)
            assert got == pytest.approx(best, abs=1e-9), (budget, paths)
            in_window = sum(1 for p in all_nodes(n_depths, k) if path_score(logprobs, p) >= floor)
            assert len(paths) == min(budget, in_window)


# ---------------------------------------------------------------------------------------------
# Hypothesis: random log-prob tables, including ties and zeros


@st.composite
def logprob_tables(draw, max_depths=5, max_k=6):
    n_depths = draw(st.integers(1, max_depths))
    k = draw(st.integers(1, max_k))
    values = draw(st.one_of(
        st.lists(st.floats(-12.0, 0.0, allow_nan=False), min_size=n_depths * k, max_size=n_depths * k),
        st.lists(st.sampled_from([0.0, -0.25, -0.5, -1.0, -3.0]), min_size=n_depths * k, max_size=n_depths * k),
    ))
    raw = -np.sort(-np.array(values, dtype=np.float64).reshape(n_depths, k), axis=1)
    raw[raw == 0.0] = 0.0  # no -0.0 surprises in the sort
    return raw


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=logprob_tables(), budget=st.integers(0, 45),
       tau=st.one_of(st.none(), st.floats(-3.0, 20.0, allow_nan=False)), chain_seed=st.booleans(),
       root=st.integers(0, 2**31 - 1))
def test_hypothesis_matches_reference(raw, budget, tau, chain_seed, root):
    tokens, logprobs = tables_from_logprobs(raw)
    tree = build_and_check(root, tokens, logprobs, budget, tau, chain_seed)
    assert build_ddtree(root, tokens, logprobs, budget, tau=tau, chain_seed=chain_seed) == tree
    visible = tree.visibility()
    for i in range(tree.n_nodes):
        ancestors = {i}
        j = i
        while tree.parents[j] >= 0:
            j = int(tree.parents[j])
            ancestors.add(j)
        assert set(np.flatnonzero(visible[i]).tolist()) == ancestors


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), k=st.sampled_from([1, 4, 8]), budget=st.integers(0, 60),
       tau=st.one_of(st.none(), st.floats(0.0, 12.0)), chain_seed=st.booleans())
def test_hypothesis_realistic_15_depths(seed, k, budget, tau, chain_seed):
    tokens, logprobs = realistic_tables(seed, 15, k)
    build_and_check(ROOT, tokens, logprobs, budget, tau, chain_seed)


# ---------------------------------------------------------------------------------------------
# Visibility


def test_visibility_hand_made():
    tree = DraftTree(tokens=[9, 1, 2, 3, 4, 5], parents=[-1, 0, 0, 1, 3, 2], depths=[0, 1, 1, 2, 3, 2],
                     scores=[0.0] * 6, ranks=[-1, 0, 1, 0, 0, 0])
    expected = np.array([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [1, 1, 0, 1, 0, 0],
        [1, 1, 0, 1, 1, 0],
        [1, 0, 1, 0, 0, 1],
    ], dtype=bool)
    visible = tree.visibility()
    assert visible.dtype == bool and np.array_equal(visible, expected)
    assert list(visible.sum(1)) == [d + 1 for d in tree.depths]


def test_visibility_of_built_tree_is_lower_triangular():
    tokens, logprobs = realistic_tables(8, 15, 4)
    tree = build_ddtree(ROOT, tokens, logprobs, 40, tau=6.0)
    visible = tree.visibility()
    assert np.array_equal(visible, np.tril(visible))  # topological: ancestors come first
    assert np.all(np.diag(visible)) and np.all(visible[:, 0])
    assert list(visible.sum(1)) == [d + 1 for d in tree.depths]


# ---------------------------------------------------------------------------------------------
# Greedy accept

#        0 (root 100)
#       /          \
#   1 (tok 1)     2 (tok 2)
#    /     \          \
#  3 (3)   6 (6)     5 (5)
#   |
#  4 (4)
HAND_TREE = DraftTree(tokens=[100, 1, 2, 3, 4, 5, 6], parents=[-1, 0, 0, 1, 3, 2, 1],
                      depths=[0, 1, 1, 2, 3, 2, 2], scores=[0.0] * 7, ranks=[-1, 0, 1, 0, 0, 0, 1])


@pytest.mark.parametrize("posterior, path, bonus", [
    ([1, 3, 0, 4, 99, 0, 0], [0, 1, 3, 4], 99),      # full match down the spine, bonus from the leaf
    ([1, 3, 0, 7, 0, 0, 0], [0, 1, 3], 7),           # partial: node 3's posterior is no child
    ([2, 0, 5, 0, 0, 42, 0], [0, 2, 5], 42),         # side branch at depth 1
    ([1, 6, 0, 0, 0, 0, 17], [0, 1, 6], 17),         # side branch at depth 2
    ([42, 3, 5, 4, 4, 4, 4], [0], 42),               # no match: root only, bonus = posterior[0]
    ([100, 1, 2, 3, 4, 5, 6], [0], 100),             # the root's own token is not a child
])
def test_accept_hand_made(posterior, path, bonus):
    got_path, got_bonus = greedy_accept(HAND_TREE, np.array(posterior, dtype=np.int32))
    assert got_path == path and got_bonus == bonus
    assert isinstance(got_bonus, int) and all(isinstance(i, int) for i in got_path)
    assert emitted_tokens(HAND_TREE, got_path, got_bonus) == [int(HAND_TREE.tokens[i]) for i in path[1:]] + [bonus]


def test_accept_duplicate_sibling_tokens_takes_lowest_index():
    tree = DraftTree(tokens=[0, 7, 7, 8, 9], parents=[-1, 0, 0, 1, 2], depths=[0, 1, 1, 2, 2],
                     scores=[0.0] * 5, ranks=[-1, 0, 1, 0, 0])
    assert greedy_accept(tree, np.array([7, 8, 9, 1, 1])) == ([0, 1, 3], 1)
    assert greedy_accept(tree, np.array([7, 9, 8, 1, 1])) == ([0, 1], 9)


def test_accept_root_only_tree():
    tree = build_ddtree(5, *realistic_tables(0, 15, 4), 0)
    assert greedy_accept(tree, np.array([77])) == ([0], 77)


def test_accept_draft_equals_target_accepts_everything():
    tokens, logprobs = realistic_tables(12, 15, 4)
    chain = build_chain(ROOT, tokens, logprobs, 15)
    posterior = np.append(chain.tokens[1:], 4242)
    path, bonus = greedy_accept(chain, posterior)
    assert path == list(range(16)) and bonus == 4242
    assert emitted_tokens(chain, path, bonus) == list(tokens[:, 0]) + [4242]


def stand_in_target(prefix: tuple[int, ...], vocab: int) -> int:
    """A deterministic 'argmax of the target' after a token prefix."""
    return hash(prefix) % vocab


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), budget=st.integers(0, 40), vocab=st.integers(2, 6),
       tau=st.one_of(st.none(), st.floats(0.0, 10.0)), chain_seed=st.booleans())
def test_accept_equals_autoregressive_greedy(seed, budget, vocab, tau, chain_seed):
    rng = np.random.default_rng(seed)
    raw = -np.sort(rng.exponential(1.0, size=(6, 3)), axis=1)
    tokens = np.stack([rng.permutation(vocab)[:3] if vocab >= 3 else rng.integers(0, vocab, 3)
                       for _ in range(6)]).astype(np.int32)
    tree = build_ddtree(0, tokens, raw, budget, tau=tau, chain_seed=chain_seed)
    prefixes = [(int(tree.tokens[0]),)]
    for i in range(1, tree.n_nodes):
        prefixes.append(prefixes[tree.parents[i]] + (int(tree.tokens[i]),))
    posterior = np.array([stand_in_target(p, vocab) for p in prefixes], dtype=np.int64)
    path, bonus = greedy_accept(tree, posterior)
    emitted = emitted_tokens(tree, path, bonus)
    # autoregressive greedy from the root
    prefix = (0,)
    expected = []
    for _ in range(len(emitted)):
        expected.append(stand_in_target(prefix, vocab))
        prefix += (expected[-1],)
    assert emitted == expected
    assert path[0] == 0 and all(tree.parents[b] == a for a, b in zip(path, path[1:]))
    # maximal: no child of the last accepted node carries the bonus token
    last = path[-1]
    assert not any(tree.parents[i] == last and tree.tokens[i] == bonus for i in range(1, tree.n_nodes))


# ---------------------------------------------------------------------------------------------
# Errors


GOOD_TOKENS, GOOD_LOGPROBS = realistic_tables(0, 4, 3)


@pytest.mark.parametrize("kwargs, match", [
    (dict(top_tokens=GOOD_TOKENS[0]), "top_tokens must be 2-D"),
    (dict(top_logprobs=GOOD_LOGPROBS[:, :2]), "top_logprobs has shape"),
    (dict(top_tokens=GOOD_TOKENS[:0], top_logprobs=GOOD_LOGPROBS[:0]), "at least one depth row"),
    (dict(top_tokens=GOOD_TOKENS[:, :0], top_logprobs=GOOD_LOGPROBS[:, :0]), "K >= 1"),
    (dict(top_tokens=GOOD_TOKENS.astype(np.float32)), "top_tokens must hold integer"),
    (dict(top_tokens=GOOD_TOKENS - 64), r"top_tokens\[0, 0\] = -\d+ is not a token id"),
    (dict(top_tokens=GOOD_TOKENS.astype(np.int64) + 2**31), "top_tokens.*not a token id"),
    (dict(top_logprobs=np.where(GOOD_LOGPROBS == GOOD_LOGPROBS[2, 1], np.nan, GOOD_LOGPROBS)),
     r"top_logprobs\[2, 1\] = nan is not finite"),
    (dict(top_logprobs=np.where(GOOD_LOGPROBS == GOOD_LOGPROBS[3, 2], -np.inf, GOOD_LOGPROBS)),
     r"top_logprobs\[3, 2\] = -inf is not finite"),
    (dict(top_logprobs=GOOD_LOGPROBS + 100.0), "is positive"),
    (dict(top_logprobs=GOOD_LOGPROBS[:, ::-1]), "top_logprobs row 0 is not sorted descending"),
    (dict(top_logprobs=np.array([["a"] * 3] * 4)), "top_logprobs must hold real numbers"),
    (dict(budget=-1), "budget must be >= 0"),
    (dict(budget=2.5), "budget must be an integer"),
    (dict(budget=True), "budget must be an integer"),
    (dict(budget=None), "budget must be an integer"),
    (dict(tau=float("nan")), "tau must be a real number"),
    (dict(tau="6"), "tau must be a real number"),
    (dict(chain_seed=1), "chain_seed must be a bool"),
    (dict(root_token=-1), "root_token"),
    (dict(root_token=1.0), "root_token"),
    (dict(root_token=2**31), "root_token"),
])
def test_build_ddtree_errors(kwargs, match):
    arguments = dict(root_token=ROOT, top_tokens=GOOD_TOKENS, top_logprobs=GOOD_LOGPROBS, budget=4,
                     tau=6.0, chain_seed=True)
    arguments.update(kwargs)
    with pytest.raises(UsageError, match=match) as error:
        build_ddtree(**arguments)
    assert str(error.value).startswith("build_ddtree: ")


def library_build(tokens, logprobs, budget=4, capacity=None, floor=-math.inf, root=ROOT):
    """specla_ddtree_build called as a C program would: (status, message, node count, the int arrays
    tokens / parents / depths / ranks, the scores)."""
    tokens = np.ascontiguousarray(tokens, dtype=np.int32)
    logprobs = np.ascontiguousarray(logprobs, dtype=np.float64)
    capacity = budget + 1 if capacity is None else capacity
    ints = np.zeros((5, max(capacity, 1)), dtype=np.int32)
    scores = np.zeros(max(capacity, 1), dtype=np.float64)
    status = _native.lib.specla_ddtree_build(root, tokens.ctypes.data, logprobs.ctypes.data, tokens.shape[0],
                                             tokens.shape[1], budget, floor, 1, ints[0].ctypes.data,
                                             ints[1].ctypes.data, ints[2].ctypes.data, scores.ctypes.data,
                                             ints[3].ctypes.data, capacity, ints[4].ctypes.data)
    return status, _native.last_error() if status else "", int(ints[4, 0]), ints[:4], scores


@pytest.mark.parametrize("change, match", [
    (dict(tokens=GOOD_TOKENS - 64), r"top_tokens\[0, 0\] = -\d+ is not a token id"),
    (dict(logprobs=np.where(GOOD_LOGPROBS == GOOD_LOGPROBS[2, 1], np.nan, GOOD_LOGPROBS)),
     r"top_logprobs\[2, 1\] is not finite"),
    (dict(logprobs=GOOD_LOGPROBS + 100.0), r"top_logprobs\[0, 0\] = .* is positive"),
    (dict(logprobs=GOOD_LOGPROBS[:, ::-1]), "top_logprobs row 0 is not sorted descending"),
    (dict(budget=-1), "budget = -1 is out of range"),
    (dict(capacity=4), "capacity = 4 cannot hold the root and a budget of 4 nodes"),
    (dict(floor=math.nan), "floor_score is NaN"),
    (dict(root=-3), "root_token = -3 is not a token id"),
    (dict(tokens=GOOD_TOKENS[:0], logprobs=GOOD_LOGPROBS[:0]), "the top-K table is 0 x 3"),
])
def test_library_builder_refuses_bad_arguments(change, match):
    """The C entry point checks what the enumeration relies on (a program linking libspecla calls it
    without pyspecla's checks): a refusal names the argument and writes no tree."""
    arguments = dict(tokens=GOOD_TOKENS, logprobs=GOOD_LOGPROBS)
    arguments.update(change)
    status, message, n_nodes, _, _ = library_build(**arguments)
    assert status == _native.ERR_INVALID_ARGUMENT
    assert re.search(match, message), message
    assert message.startswith("specla_ddtree_build: ") and n_nodes == 0


def test_tables_in_any_memory_layout_give_the_same_tree():
    """Transposed (Fortran-ordered), strided and list tables reach the library row by row."""
    tokens, logprobs = realistic_tables(3, 15, 4, vocab=5000)
    logprobs = logprobs.astype(np.float32).astype(np.float64)  # the same numbers as float32 or float64
    want = build_ddtree(ROOT, tokens, logprobs, 22, tau=6.0)
    assert want.n_nodes == 23
    for t, lp in ((np.asfortranarray(tokens), np.asfortranarray(logprobs)),
                  (np.asfortranarray(tokens.astype(np.int64)), np.asfortranarray(logprobs.astype(np.float32))),
                  (np.asfortranarray(tokens), np.asfortranarray(logprobs.astype(np.float32))),
                  (np.repeat(tokens, 2, axis=1)[:, ::2], np.repeat(logprobs, 2, axis=1)[:, ::2]),
                  (tokens.tolist(), logprobs.tolist())):
        assert build_ddtree(ROOT, t, lp, 22, tau=6.0) == want


def test_library_builder_refuses_null_pointers():
    tokens = np.ascontiguousarray(GOOD_TOKENS)
    logprobs = np.ascontiguousarray(GOOD_LOGPROBS, dtype=np.float64)
    ints, scores = np.zeros((5, 5), dtype=np.int32), np.zeros(5)
    outputs = [ints[0].ctypes.data, ints[1].ctypes.data, ints[2].ctypes.data, scores.ctypes.data, ints[3].ctypes.data]
    lib = _native.lib
    status = lib.specla_ddtree_build(ROOT, None, logprobs.ctypes.data, 4, 3, 4, -math.inf, 1, *outputs, 5,
                                     ints[4].ctypes.data)
    assert status == _native.ERR_INVALID_ARGUMENT and "an array argument is NULL" in _native.last_error()
    status = lib.specla_ddtree_build(ROOT, tokens.ctypes.data, logprobs.ctypes.data, 4, 3, 4, -math.inf, 1,
                                     *outputs, 5, None)
    assert status == _native.ERR_INVALID_ARGUMENT and "n_nodes is NULL" in _native.last_error()


def test_library_builder_takes_the_tables_as_given():
    """Called directly with good tables, the library gives the Python builder's tree."""
    status, _, n, ints, scores = library_build(GOOD_TOKENS, GOOD_LOGPROBS, budget=7)
    assert status == _native.OK
    want = reference_build_ddtree(ROOT, GOOD_TOKENS, GOOD_LOGPROBS, 7, tau=None)
    assert n == want.n_nodes == 8
    for i, name in enumerate(("tokens", "parents", "depths", "ranks")):
        assert np.array_equal(ints[i, :n], getattr(want, name)), name
    assert np.array_equal(scores[:n].view(np.uint64), want.scores.view(np.uint64))


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_depth=-1), "max_depth must be >= 0"),
    (dict(max_depth=1.5), "max_depth must be an integer"),
    (dict(top_logprobs=GOOD_LOGPROBS[:, ::-1]), "not sorted descending"),
    (dict(top_tokens=GOOD_TOKENS[0]), "top_tokens must be 2-D"),
])
def test_build_chain_errors(kwargs, match):
    arguments = dict(root_token=ROOT, top_tokens=GOOD_TOKENS, top_logprobs=GOOD_LOGPROBS, max_depth=4)
    arguments.update(kwargs)
    with pytest.raises(UsageError, match=match) as error:
        build_chain(**arguments)
    assert str(error.value).startswith("build_chain: ")


@pytest.mark.parametrize("fields, match", [
    (dict(parents=[0, 0, 1]), r"parents\[0\] = 0 must be -1"),
    (dict(parents=[-1, 0, 2]), r"parents\[2\] = 2 is not in \[0, 2\)"),
    (dict(depths=[1, 1, 2]), r"depths\[0\] = 1 must be 0"),
    (dict(depths=[0, 1, 1]), r"depths\[2\] = 1 must be depths\[parents\[2\]\] \+ 1"),
    (dict(ranks=[-1, 0]), "ranks has 2 entries, tokens has 3"),
    (dict(tokens=[[1, 2, 3]]), "tokens must be 1-D"),
    (dict(tokens=[1.5, 2, 3]), "tokens must hold integers"),
    (dict(tokens=[], parents=[], depths=[], scores=[], ranks=[]), "at least the root"),
])
def test_draft_tree_errors(fields, match):
    arguments = dict(tokens=[1, 2, 3], parents=[-1, 0, 1], depths=[0, 1, 2], scores=[0.0, -1.0, -2.0],
                     ranks=[-1, 0, 0])
    arguments.update(fields)
    with pytest.raises(UsageError, match=match):
        DraftTree(**arguments)


def test_greedy_accept_errors():
    with pytest.raises(UsageError, match="posterior must have shape \\(7,\\)"):
        greedy_accept(HAND_TREE, np.zeros(6, dtype=np.int32))
    with pytest.raises(UsageError, match="posterior must have shape"):
        greedy_accept(HAND_TREE, np.zeros((7, 1), dtype=np.int32))
    with pytest.raises(UsageError, match="posterior must hold integer"):
        greedy_accept(HAND_TREE, np.zeros(7, dtype=np.float32))
    with pytest.raises(UsageError, match="tree must be a DraftTree"):
        greedy_accept([0, 1], np.zeros(2, dtype=np.int32))
