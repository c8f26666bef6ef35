"""The heavy-light (HLD) schedule: the native builder (pyspecla.speculative.hld -> specla_hld_build)
against the Python oracle (pyspecla.reference.hld), int for int, and both against the rules of
docs/specla.md §3 item 3 checked directly (check_schedule below derives nothing from either
builder). Covers the worked example of docs/specla.md §3 (whose packed array docs/hld-layout.md prints), the
shapes that break assumptions (one node, a pure chain, a star, a deep chain, 1000-node trees),
hypothesis-generated trees, padding to a larger capacity, and every invalid input."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyspecla import _native
from pyspecla.errors import UsageError
from pyspecla.reference import hld as reference
from pyspecla.speculative import hld
from pyspecla.speculative.hld import ScheduleView

WORKED_EXAMPLE = [-1, 0, 1, 1, 3, 0, 5, 5]
POISON = 0x7EADBEEF


def build_both(parents, capacity=None) -> ScheduleView:
    """Native and oracle schedules, asserted identical; the native one parsed."""
    native = hld.build_schedule(parents, capacity)
    oracle = reference.build_schedule(parents, capacity)
    assert native.dtype == np.int32 and oracle.dtype == np.int32
    assert native.shape == oracle.shape, (native.shape, oracle.shape)
    mismatch = np.flatnonzero(native != oracle)
    assert len(mismatch) == 0, (f"native and oracle differ at ints {mismatch[:10].tolist()}: "
                                f"{native[mismatch[:10]].tolist()} vs {oracle[mismatch[:10]].tolist()}, "
                                f"parents={list(parents)}")
    return ScheduleView(native)


def expected_offsets(capacity):
    at, offsets = 20, []
    for name in reference.ARRAY_NAMES:
        offsets.append(at)
        at += capacity + 1 if name == "chain_offsets" else capacity
    return offsets, at


def check_schedule(view: ScheduleView, parents) -> None:
    """Every rule of the schedule, checked from the parent array alone."""
    parents = [int(p) for p in parents]
    n = len(parents)
    capacity = view.capacity
    offsets, total = expected_offsets(capacity)
    assert view.magic == reference.MAGIC and view.version == reference.VERSION
    assert view.n_nodes == n and view.total == total == 20 + 10 * capacity + 1 == len(view.packed)
    assert view.header[10:].tolist() == offsets
    assert view.parents.tolist() == parents

    children = [[] for _ in range(n)]
    for t in range(1, n):
        children[parents[t]].append(t)
    size = [1] * n
    for t in range(n - 1, 0, -1):
        size[parents[t]] += size[t]
    depth = [0] * n
    for t in range(1, n):
        depth[t] = depth[parents[t]] + 1
    assert view.node_depth.tolist() == depth and view.max_depth == max(depth)

    # order: a permutation, node_position its inverse, node_chain consistent with chain_offsets
    assert sorted(view.order.tolist()) == list(range(n))
    assert all(view.order[view.node_position[v]] == v for v in range(n))
    offsets_c = view.chain_offsets.tolist()
    assert offsets_c[0] == 0 and offsets_c[-1] == n and all(a < b for a, b in zip(offsets_c, offsets_c[1:]))
    chains = view.chains
    assert len(chains) == view.n_chains
    for c, chain in enumerate(chains):
        assert all(view.node_chain[v] == c for v in chain)

    # chains follow heavy children (largest subtree, ties to the lowest index) down to a leaf
    def heavy(u):
        return min(children[u], key=lambda c: (-size[c], c)) if children[u] else None

    for chain in chains:
        for u, v in zip(chain, chain[1:]):
            assert parents[v] == u and heavy(u) == v, f"chain {chain}: {v} is not the heavy child of {u}"
        assert heavy(chain[-1]) is None, f"chain {chain} stops before a leaf"
    heads = [chain[0] for chain in chains]
    assert heads[0] == 0
    assert sorted(heads) == [0] + [t for t in range(1, n) if heavy(parents[t]) != t]

    # waves: root chain 0, others one more than the chain holding their parent node (so earlier)
    waves = view.chain_wave.tolist()
    for c, head in enumerate(heads):
        if c == 0:
            assert waves[0] == 0 and view.chain_parent_node[0] == -1 and view.chain_parent_boundary[0] == -1
            continue
        parent_chain = int(view.node_chain[parents[head]])
        assert waves[c] == waves[parent_chain] + 1 and parent_chain < c
        assert view.chain_parent_node[c] == parents[head]
    assert waves == sorted(waves)
    for w in range(view.n_waves):  # stable sort: within a wave, chains keep first-node order
        in_wave = [heads[c] for c in range(len(heads)) if waves[c] == w]
        assert in_wave == sorted(in_wave) and in_wave
    assert view.n_waves == max(waves) + 1
    assert view.max_chains_per_wave == max(waves.count(w) for w in range(view.n_waves))
    assert view.waves == [[c for c in range(len(waves)) if waves[c] == w] for w in range(view.n_waves)]
    # a light edge at most halves the subtree: waves grow like log2(n)
    assert view.n_waves - 1 <= math.floor(math.log2(n))

    # boundaries: exactly the distinct parents of non-root chain heads, slots by increasing node
    boundary_nodes = sorted({parents[h] for h in heads[1:]})
    assert view.n_boundaries == len(boundary_nodes)
    assert view.boundary_nodes.tolist() == boundary_nodes
    expected_node_boundary = [-1] * n
    for slot, node in enumerate(boundary_nodes):
        expected_node_boundary[node] = slot
    assert view.node_boundary.tolist() == expected_node_boundary
    for c in range(1, len(heads)):
        assert view.chain_parent_boundary[c] == expected_node_boundary[parents[heads[c]]]

    for name in reference.ARRAY_NAMES:
        assert (view.padding(name) == -1).all(), f"{name}: padding is not -1: {view.padding(name).tolist()}"


# ----------------------------------------------------------------------------------------------
# Known shapes


def test_worked_example_of_the_spec():
    view = build_both(WORKED_EXAMPLE)
    check_schedule(view, WORKED_EXAMPLE)
    assert view.chains == [[0, 1, 3, 4], [2], [5, 6], [7]]
    assert view.chain_wave.tolist() == [0, 1, 1, 2]
    assert view.chain_parent_node.tolist() == [-1, 1, 0, 5]
    assert (view.n_chains, view.n_waves, view.n_boundaries, view.max_chains_per_wave) == (4, 3, 3, 2)
    assert view.boundary_nodes.tolist() == [0, 1, 5]
    assert view.chain_parent_boundary.tolist() == [-1, 1, 0, 2]
    assert view.waves == [[0], [1, 2], [3]]
    assert sorted(view.order.tolist()) == list(range(8))
    # the exact packed array, as docs/hld-layout.md prints it
    expected = (
        [reference.MAGIC, 1, 8, 4, 3, 3, 2, 3, 8, 101, 20, 28, 36, 45, 53, 61, 69, 77, 85, 93]
        + [-1, 0, 1, 1, 3, 0, 5, 5]            # parents
        + [0, 1, 3, 4, 2, 5, 6, 7]             # order
        + [0, 4, 5, 7, 8, -1, -1, -1, -1]      # chain_offsets
        + [-1, 1, 0, 2, -1, -1, -1, -1]        # chain_parent_boundary
        + [0, 1, 1, 2, -1, -1, -1, -1]         # chain_wave
        + [0, 1, -1, -1, -1, 2, -1, -1]        # node_boundary
        + [0, 1, 2, 2, 3, 1, 2, 2]             # node_depth
        + [-1, 1, 0, 5, -1, -1, -1, -1]        # chain_parent_node
        + [0, 0, 1, 0, 0, 2, 2, 3]             # node_chain
        + [0, 1, 4, 2, 3, 5, 6, 7]             # node_position
    )
    assert view.packed.tolist() == expected
    assert hld.schedule_size(8) == reference.schedule_size(8) == 101


def test_constants_match_the_library():
    assert reference.MAGIC.to_bytes(4, "little") == b"DHLS"
    # the library's schedule sizes carry the oracle's header size and array count
    for capacity in (1, 2, 7, 8, 64, 1000, reference.MAX_CAPACITY):
        assert _native.lib.specla_hld_size(capacity) == reference.schedule_size(capacity) == 20 + 10 * capacity + 1
    for capacity in (0, -1, -(2**31), reference.MAX_CAPACITY + 1, 2**31 - 1):
        assert _native.lib.specla_hld_size(capacity) == -1 == reference.schedule_size(capacity)
    with pytest.raises(UsageError, match="capacity"):
        hld.schedule_size(0)


def test_single_node():
    view = build_both([-1])
    check_schedule(view, [-1])
    assert view.chains == [[0]]
    assert (view.n_chains, view.n_waves, view.n_boundaries, view.max_chains_per_wave, view.max_depth) == (1, 1, 0, 1, 0)
    assert len(view.packed) == 31


def test_pure_chain_of_16():
    parents = [-1] + list(range(15))
    view = build_both(parents)
    check_schedule(view, parents)
    assert view.chains == [list(range(16))]
    assert (view.n_chains, view.n_waves, view.n_boundaries, view.max_depth) == (1, 1, 0, 15)
    assert view.order.tolist() == list(range(16))


def test_star_heavy_child_is_the_lowest_index():
    parents = [-1] + [0] * 21
    view = build_both(parents)
    check_schedule(view, parents)
    assert view.chains == [[0, 1]] + [[t] for t in range(2, 22)]
    assert (view.n_chains, view.n_waves, view.n_boundaries, view.max_chains_per_wave) == (21, 2, 1, 20)
    assert view.chain_parent_boundary.tolist() == [-1] + [0] * 20


def test_deep_chain_of_200():
    parents = [-1] + list(range(199))
    view = build_both(parents)
    check_schedule(view, parents)
    assert view.n_chains == 1 and view.max_depth == 199


def test_ties_between_larger_subtrees_go_to_the_lowest_index():
    # node 0 has children 1 (subtree 2), 2 (subtree 3), 4 (subtree 3): heavy is 2, not 4 nor 1
    parents = [-1, 0, 0, 2, 0, 4, 1, 2, 4]
    view = build_both(parents)
    check_schedule(view, parents)
    assert view.chains[0] == [0, 2, 3]


def test_deep_trees_need_no_recursion():
    # a 3000-node caterpillar (a spine with one leaf per spine node) and a 3000-node chain
    caterpillar, spine = [-1], 0
    for _ in range(1500):
        caterpillar += [spine, spine]
        spine = len(caterpillar) - 2
    for parents in (caterpillar, [-1] + list(range(2999))):
        check_schedule(build_both(parents), parents)


def test_light_chains_can_make_log2_n_waves():
    # a complete binary tree of 2^k - 1 nodes in BFS order: every light chain one wave deeper
    k = 9
    n = 2**k - 1
    parents = [-1] + [(t - 1) // 2 for t in range(1, n)]
    view = build_both(parents)
    check_schedule(view, parents)
    assert view.n_waves == k and view.n_chains == 2 ** (k - 1)


# ----------------------------------------------------------------------------------------------
# Random trees


def random_tree(rng, n, shape):
    parents = [-1]
    for t in range(1, n):
        if shape == "uniform":
            parents.append(int(rng.integers(0, t)))
        elif shape == "recent":  # draft-tree-like: mostly extends one of the last few nodes
            parents.append(int(rng.integers(max(0, t - 3), t)))
        else:  # "bushy": a few hubs
            parents.append(int(rng.integers(0, min(t, 4))))
    return parents


@pytest.mark.parametrize("shape", ["uniform", "recent", "bushy"])
def test_random_trees_native_equals_oracle(shape, seed):
    rng = np.random.default_rng(seed)
    for _ in range(60):
        n = int(rng.integers(1, 65))
        parents = random_tree(rng, n, shape)
        for capacity in (None, 64, n + int(rng.integers(0, 5))):
            view = build_both(parents, capacity)
            check_schedule(view, parents)
    for _ in range(3):
        parents = random_tree(rng, 1000, shape)
        check_schedule(build_both(parents), parents)
        check_schedule(build_both(parents, 1024), parents)


@st.composite
def parent_arrays(draw, max_nodes=64):
    n = draw(st.integers(1, max_nodes))
    return [-1] + [draw(st.integers(0, t - 1)) for t in range(1, n)]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parent_arrays())
def test_schedule_rules_hold_for_any_tree(parents):
    view = build_both(parents)
    check_schedule(view, parents)
    # padded to a larger capacity: the same content, only padded
    padded = build_both(parents, 64)
    check_schedule(padded, parents)
    assert padded.capacity == 64 and len(padded.packed) == 20 + 10 * 64 + 1
    assert padded.header[:8].tolist() == view.header[:8].tolist()
    for name in reference.ARRAY_NAMES:
        assert getattr(padded, name).tolist() == getattr(view, name).tolist(), name


def test_deterministic_and_rebuilt_into_one_buffer():
    capacity = 64
    buffer = np.full(hld.schedule_size(capacity) + 7, POISON, dtype=np.int32)
    rng = np.random.default_rng(0)
    for n in (64, 5, 1, 33, 64, 2):
        parents = random_tree(rng, n, "uniform")
        out = hld.build_schedule_into(parents, buffer, capacity)
        assert out is buffer
        total = hld.schedule_size(capacity)
        # nothing stale from the previous (larger) tree, nothing written past the schedule
        assert buffer[:total].tolist() == reference.build_schedule(parents, capacity).tolist()
        assert (buffer[total:] == POISON).all()
        assert hld.build_schedule(parents, capacity).tolist() == buffer[:total].tolist()


def test_parents_may_alias_the_output_buffer():
    parents = [-1, 0, 1, 1, 3, 0, 5, 5]
    capacity = 8
    buffer = hld.build_schedule(parents, capacity)
    in_place = buffer[20:28]  # the schedule's own parents array
    assert np.shares_memory(in_place, buffer)
    hld.build_schedule_into(in_place, buffer, capacity)
    assert buffer.tolist() == reference.build_schedule(parents, capacity).tolist()


# ----------------------------------------------------------------------------------------------
# Invalid inputs: a UsageError naming the problem, from both builders, never a crash

INVALID = [
    # (parents, capacity, message)
    ([0, 0, 1], None, r"parents\[0\] = 0 must be -1"),
    ([3], None, r"parents\[0\] = 3 must be -1"),
    ([-1, 0, 2, 1], None, r"parents\[2\] = 2 is not in \[0, 2\) \(parents must be in topological order\)"),
    ([-1, 0, 1, 5], None, r"parents\[3\] = 5 is not in \[0, 3\)"),
    ([-1, 0, -1], None, r"parents\[2\] = -1 is not in \[0, 2\)"),
    ([-1, 0, -7, 1], None, r"parents\[2\] = -7 is not in \[0, 2\)"),
    ([-1, 0, 1], 2, r"n_nodes = 3 is not in \[1, capacity = 2\]"),
    ([], None, r"n_nodes = 0 is not in \[1, capacity = 1\]"),
    ([], 8, r"n_nodes = 0 is not in \[1, capacity = 8\]"),
    ([-1, 0], 0, r"capacity = 0 is not in \[1, "),
    ([-1, 0], -3, r"capacity = -3 is not in \[1, "),
]


@pytest.mark.parametrize("parents,capacity,message", INVALID)
def test_invalid_tree_raises_usage_error(parents, capacity, message):
    with pytest.raises(UsageError, match="^specla_hld_build: " + message):
        hld.build_schedule(parents, capacity)
    with pytest.raises(UsageError, match="^build_schedule: " + message):
        reference.build_schedule(parents, capacity)


def test_parent_beyond_int32_is_reported_not_wrapped():
    parents = np.array([-1, 0, 2**32 + 1], dtype=np.int64)  # would wrap to 1 as int32
    with pytest.raises(UsageError, match=re.escape(f"parents[2] = {2**32 + 1} is not in [0, 2)")):
        hld.build_schedule(parents)
    with pytest.raises(UsageError, match=re.escape(f"parents[2] = {2**32 + 1} is not in [0, 2)")):
        reference.build_schedule(parents)


def test_output_buffer_too_small():
    buffer = np.full(hld.schedule_size(8) - 1, POISON, dtype=np.int32)
    with pytest.raises(UsageError, match=r"schedule_ints = 100 is too small: capacity 8 needs specla_hld_size = 101"):
        hld.build_schedule_into(WORKED_EXAMPLE, buffer, 8)
    assert (buffer == POISON).all()
    with pytest.raises(UsageError, match="schedule_ints = 0"):
        hld.build_schedule_into(WORKED_EXAMPLE, np.zeros(0, dtype=np.int32), 8)


@pytest.mark.parametrize("buffer", [np.zeros(101, dtype=np.int64), np.zeros((101, 1), dtype=np.int32),
                                    np.zeros(202, dtype=np.int32)[::2], [0] * 101])
def test_output_buffer_of_the_wrong_kind(buffer):
    with pytest.raises(UsageError, match="writeable 1-D C-contiguous int32"):
        hld.build_schedule_into(WORKED_EXAMPLE, buffer, 8)


@pytest.mark.parametrize("parents,message", [([[-1, 0]], "1-D"), ([-1.0, 0.0], "integers"),
                                             (["-1", "0"], "integers")])
def test_parents_that_are_not_integers(parents, message):
    with pytest.raises(UsageError, match=message):
        hld.build_schedule(parents)
    with pytest.raises(UsageError, match=message):
        reference.build_schedule(parents)


def test_native_rejects_null_pointers():
    parents = np.array(WORKED_EXAMPLE, dtype=np.int32)
    out = np.zeros(101, dtype=np.int32)
    lib = _native.lib
    assert lib.specla_hld_build(None, 8, 8, _native.int32_ptr(out), 101) == _native.ERR_INVALID_ARGUMENT
    assert "parents is NULL" in _native.last_error()
    assert lib.specla_hld_build(_native.int32_ptr(parents), 8, 8, None, 101) == _native.ERR_INVALID_ARGUMENT
    assert "schedule is NULL" in _native.last_error()


def test_schedule_view_rejects_what_is_not_a_schedule():
    with pytest.raises(UsageError, match="int32"):
        ScheduleView(np.zeros(101, dtype=np.int64))
    with pytest.raises(UsageError, match="header"):
        ScheduleView(np.zeros(5, dtype=np.int32))
    with pytest.raises(UsageError, match="not an HLD schedule"):
        ScheduleView(np.zeros(101, dtype=np.int32))
    truncated = hld.build_schedule(WORKED_EXAMPLE)[:-1]
    with pytest.raises(UsageError, match="the array has 100 ints"):
        ScheduleView(truncated)
