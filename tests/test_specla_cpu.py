"""SpecLA on the CPU backend: tree verify through the GDN and conv layers, factor banks, deferred
commit, finish — checked BIT FOR BIT against sequential decoding with the same backend's
sequential kernels, and within 1e-5 against the independent float64 UT oracle.

Terms: node 0 is the root (the first new token); a node's root path is the sequence of tokens a
plain decoder would have fed to reach it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyspecla import ops
from pyspecla.errors import NativeError, UsageError
from pyspecla.reference import specla as ut
from pyspecla.speculative.hld import build_schedule
from pyspecla.speculative.recurrent import COMMIT_METHODS, VERIFY_METHODS, FactorBanks, RecurrentShape


# --- trees and inputs ------------------------------------------------------------------------
def random_tree(rng, n):
    return [-1] + [int(rng.integers(0, t)) for t in range(1, n)]


def chain(n):
    return [-1] + list(range(n - 1))


def star(n):
    return [-1] + [0] * (n - 1)


root_path = ut.root_path


def random_leaf_path(rng, parents):
    """A random accepted path: from the root, descend to a random child while one exists, stop at
    a random depth."""
    children = {}
    for t, p in enumerate(parents):
        children.setdefault(p, []).append(t)
    path = [0]
    while children.get(path[-1]) and rng.random() < 0.8:
        path.append(int(rng.choice(children[path[-1]])))
    return path


class Layer:
    """Random inputs of one recurrent layer for a tree of n nodes."""

    def __init__(self, rng, n, Hk, Hv, S, C, K):
        l2 = lambda a: (a / np.sqrt((a.astype(np.float64) ** 2).sum(-1, keepdims=True) + 1e-6)).astype(np.float32)
        self.q = l2(rng.standard_normal((n, Hk, S)))
        self.k = l2(rng.standard_normal((n, Hk, S)))
        self.v = rng.standard_normal((n, Hv, S)).astype(np.float32)
        self.g = (-np.abs(rng.standard_normal((n, Hv))) * 0.3).astype(np.float32)
        self.beta = (1 / (1 + np.exp(-rng.standard_normal((n, Hv))))).astype(np.float32)
        self.x = rng.standard_normal((n, C)).astype(np.float32)

    def take(self, idx):
        sub = object.__new__(Layer)
        for name in ("q", "k", "v", "g", "beta", "x"):
            setattr(sub, name, getattr(self, name)[idx])
        return sub


def sequential(layer: Layer, idx, gdn_state, conv_state, conv_w, cpu_kernels="auto"):
    """Plain decoding of the tokens idx with the sequential native kernels of the same kernel set."""
    sub = layer.take(list(idx))
    out, new_state = ops.gated_delta_rule(sub.q, sub.k, sub.v, sub.g, sub.beta, gdn_state, n_threads=1,
                                          cpu_kernels=cpu_kernels)
    y, new_conv = ops.causal_conv(sub.x, conv_w, conv_state, n_threads=1, cpu_kernels=cpu_kernels)
    return out, new_state, y, new_conv


def fresh_states(rng, n_layers, Hv, S, C, K):
    gdn = [(rng.standard_normal((Hv, S, S)) * 0.1).astype(np.float32) for _ in range(n_layers)]
    conv = [rng.standard_normal((K - 1, C)).astype(np.float32) for _ in range(n_layers)]
    return gdn, conv


def same_bits(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


# --- one layer, one step ------------------------------------------------------------------------
SHAPES = {
    "small-odd": dict(Hk=1, Hv=3, S=16, C=96, K=4),
    "gqa3": dict(Hk=2, Hv=6, S=32, C=130, K=4),
    "27b-heads": dict(Hk=16, Hv=48, S=128, C=10240, K=4),
}


def verify_one_step(parents, dims, seed, verify_method="hld_chains", pending_tokens=0, cpu_kernels="auto"):
    rng = np.random.default_rng(seed)
    n = len(parents)
    Hk, Hv, S, C, K = (dims[k] for k in ("Hk", "Hv", "S", "C", "K"))
    shape = RecurrentShape(1, Hk, Hv, S, C, K, max(n, pending_tokens, 1))
    banks = FactorBanks(shape, verify_method=verify_method, cpu_kernels=cpu_kernels)
    gdn, conv = fresh_states(rng, 1, Hv, S, C, K)
    conv_w = (rng.standard_normal((C, K)) * 0.5).astype(np.float32)
    sched = build_schedule(parents)
    layer = Layer(rng, n, Hk, Hv, S, C, K)
    before = (gdn[0].copy(), conv[0].copy())
    y = banks.conv_tree(sched, 0, layer.x, conv_w, conv[0])
    out = banks.verify_gdn(sched, 0, layer.q, layer.k, layer.v, layer.g, layer.beta, gdn[0])
    return dict(banks=banks, gdn=gdn, conv=conv, conv_w=conv_w, sched=sched, layer=layer, y=y, out=out,
                before=before, rng=rng)


TREES = {
    "n1": [-1],
    "chain16": chain(16),
    "chain33": chain(33),
    "star22": star(22),
    "worked-example": [-1, 0, 1, 1, 3, 0, 5, 5],
    "deep-chain": chain(64),
    "random24": random_tree(np.random.default_rng(24), 24),
    "random64": random_tree(np.random.default_rng(64), 64),
}


@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("dims", ["small-odd", "gqa3"])
@pytest.mark.parametrize("verify_method", VERIFY_METHODS)
def test_every_node_equals_sequential_decoding_bit_for_bit(tree, dims, verify_method, cpu_kernels, seed):
    """Each kernel set (scalar oracle, AVX2, AVX-512: the cpu_kernels fixture) against its own
    sequential kernels."""
    parents = TREES[tree]
    r = verify_one_step(parents, SHAPES[dims], seed=seed, verify_method=verify_method, cpu_kernels=cpu_kernels)
    # nothing pending: the durable state is read, never written
    assert same_bits(r["gdn"][0], r["before"][0]) and same_bits(r["conv"][0], r["before"][1])
    for t in range(len(parents)):
        path = root_path(parents, t)
        out, _, y, _ = sequential(r["layer"], path, r["before"][0], r["before"][1], r["conv_w"], cpu_kernels)
        assert same_bits(r["out"][t], out[-1]), f"GDN output of node {t} differs from sequential decoding"
        assert same_bits(r["y"][t], y[-1]), f"conv output of node {t} differs from sequential decoding"


@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("verify_method", VERIFY_METHODS)
def test_work_counters_show_which_method_ran(tree, verify_method):
    """The kernels count their work (value head 0): SpecLA's chains step every node once and copy
    the state only into boundary slots; replay steps every root-to-leaf path and reloads per leaf;
    dense checkpoints copy a state per node. A verify that silently fell back would show here."""
    parents = TREES[tree]
    r = verify_one_step(parents, SHAPES["small-odd"], seed=7, verify_method=verify_method)
    stats = r["banks"].stats()
    n = len(parents)
    leaves = [t for t in range(n) if t not in set(parents[1:])]
    assert stats["n_nodes"] == n and stats["n_layers"] == 1
    if verify_method == "hld_chains":
        assert stats["node_steps"] == n
        assert stats["state_copies"] == int(r["sched"][5])  # the schedule's boundary count
    elif verify_method == "root_to_leaf":
        assert stats["node_steps"] == sum(len(root_path(parents, t)) for t in leaves)
        assert stats["state_copies"] == len(leaves)
    else:
        assert stats["node_steps"] == n and stats["state_copies"] == n


@pytest.mark.parametrize("tree", ["chain16", "random24"])
def test_recorded_factors_are_the_inputs_and_the_sequential_deltas(tree):
    """k, g and the raw conv inputs are captured bit-identical to the inputs; every delta equals
    the delta of sequential decoding; a side-branch path is gathered into path order."""
    parents = TREES[tree]
    r = verify_one_step(parents, SHAPES["gqa3"], seed=9)
    banks, L, n = r["banks"], r["layer"], len(parents)
    assert same_bits(banks.read("verify", 0, "k", n), L.k) and same_bits(banks.read("verify", 0, "g", n), L.g)
    assert same_bits(banks.read("verify", 0, "x", n), L.x)
    deltas = banks.read("verify", 0, "delta", n)
    ref = ut.tree_sequential(parents, L.q, L.k, L.v, L.g, L.beta, r["before"][0])[2]
    assert np.abs(deltas - ref).max() / np.abs(ref).max() < 1e-5
    path = root_path(parents, n - 1)
    banks.accept(r["sched"], path)
    assert same_bits(banks.read("pending", 0, "k", len(path)), L.k[path])
    assert same_bits(banks.read("pending", 0, "delta", len(path)), deltas[path])


@pytest.mark.parametrize("tree", ["chain16", "random24"])
def test_model_shapes_27b_heads(tree):
    """S = 128, Hk = 16, Hv = 48, C = 10240: the qwen35-27B recurrent layer."""
    parents = TREES[tree]
    r = verify_one_step(parents, SHAPES["27b-heads"], seed=7)
    assert same_bits(r["gdn"][0], r["before"][0])
    for t in [0, len(parents) // 2, len(parents) - 1]:
        out, _, y, _ = sequential(r["layer"], root_path(parents, t), r["before"][0], r["before"][1], r["conv_w"])
        assert same_bits(r["out"][t], out[-1]) and same_bits(r["y"][t], y[-1])


@pytest.mark.parametrize("tree", ["n1", "chain33", "star22", "random64"])
def test_against_float64_ut_oracle(tree, cpu_kernels):
    parents = TREES[tree]
    r = verify_one_step(parents, SHAPES["gqa3"], seed=3, cpu_kernels=cpu_kernels)
    L = r["layer"]
    ref = ut.tree_ut(parents, L.q, L.k, L.v, L.g, L.beta, r["before"][0])
    scale = np.abs(ref["out"]).max()
    assert np.abs(r["out"] - ref["out"]).max() / scale <= 1e-5
    y_ref, _ = ut.conv_tree(parents, L.x, r["conv_w"], r["before"][1])
    assert np.abs(r["y"] - y_ref).max() / np.abs(y_ref).max() <= 1e-5
    # the state at every possible accepted endpoint, reconstructed natively (accept + finish)
    for end in range(len(parents)):
        banks = FactorBanks(RecurrentShape(1, 2, 6, 32, 130, 4, len(parents)), cpu_kernels=cpu_kernels)
        gdn, conv = [r["before"][0].copy()], [r["before"][1].copy()]
        banks.conv_tree(r["sched"], 0, L.x, r["conv_w"], conv[0])
        banks.verify_gdn(r["sched"], 0, L.q, L.k, L.v, L.g, L.beta, gdn[0])
        banks.accept(r["sched"], root_path(parents, end))
        banks.finish(gdn, conv)
        expected = ut.tree_ut(parents, L.q, L.k, L.v, L.g, L.beta, r["before"][0], with_states=False)["state_at"](end)
        assert np.abs(gdn[0] - expected).max() / np.abs(expected).max() <= 1e-5


# --- multi-step loops: every method converges to the sequential state --------------------------
def run_loop(methods, dims, n_layers, steps, seed, tree_sizes=(1, 6, 22, 40), cpu_kernels="auto"):
    """Drive `steps` speculative steps over n_layers recurrent layers with random trees and random
    accepted paths; return the final states (after finish), all verify outputs, and the tokens
    accepted, so a sequential decode can be compared."""
    verify_method, commit_method = methods
    rng = np.random.default_rng(seed)
    Hk, Hv, S, C, K = (dims[k] for k in ("Hk", "Hv", "S", "C", "K"))
    max_nodes = max(tree_sizes)
    banks = FactorBanks(RecurrentShape(n_layers, Hk, Hv, S, C, K, max_nodes), verify_method, commit_method,
                        cpu_kernels=cpu_kernels)
    init_rng = np.random.default_rng(seed + 1)
    gdn, conv = fresh_states(init_rng, n_layers, Hv, S, C, K)
    initial = ([a.copy() for a in gdn], [a.copy() for a in conv])
    conv_w = [(init_rng.standard_normal((C, K)) * 0.5).astype(np.float32) for _ in range(n_layers)]
    accepted = [[] for _ in range(n_layers)]  # per layer: the accepted nodes' inputs
    outputs = []
    for step in range(steps):
        n = int(rng.choice(tree_sizes))
        parents = random_tree(rng, n) if step % 3 else chain(n)
        sched = build_schedule(parents)
        layers = [Layer(rng, n, Hk, Hv, S, C, K) for _ in range(n_layers)]
        step_out = []
        for l in range(n_layers):
            y = banks.conv_tree(sched, l, layers[l].x, conv_w[l], conv[l])
            o = banks.verify_gdn(sched, l, layers[l].q, layers[l].k, layers[l].v, layers[l].g, layers[l].beta, gdn[l])
            step_out.append((parents, y, o))
        path = list(range(int(rng.integers(1, n + 1)))) if parents == chain(n) else random_leaf_path(rng, parents)
        banks.accept(sched, path, gdn, conv)
        for l in range(n_layers):
            accepted[l].append((layers[l], path))
        outputs.append(step_out)
    banks.finish(gdn, conv)
    banks.finish(gdn, conv)  # idempotent
    assert banks.pending == 0
    return gdn, conv, initial, conv_w, accepted, outputs


def sequential_states(initial, conv_w, accepted, cpu_kernels="auto"):
    gdn, conv = [a.copy() for a in initial[0]], [a.copy() for a in initial[1]]
    for l in range(len(gdn)):
        for layer, path in accepted[l]:
            _, gdn[l], _, conv[l] = sequential(layer, path, gdn[l], conv[l], conv_w[l], cpu_kernels)
    return gdn, conv


METHOD_PAIRS = [(v, c) for v in VERIFY_METHODS for c in COMMIT_METHODS
                if not (c == "checkpoint_restore" and v != "dense_checkpoints")]


@pytest.mark.parametrize("methods", METHOD_PAIRS, ids=lambda m: f"{m[0]}+{m[1]}")
def test_loop_state_after_finish_equals_sequential_decoding(methods, cpu_kernels):
    dims = SHAPES["small-odd"]
    gdn, conv, initial, conv_w, accepted, outputs = run_loop(methods, dims, n_layers=2, steps=8, seed=11,
                                                             cpu_kernels=cpu_kernels)
    gdn_seq, conv_seq = sequential_states(initial, conv_w, accepted, cpu_kernels)
    for l in range(2):
        assert same_bits(gdn[l], gdn_seq[l]), f"layer {l} GDN state differs from sequential decoding"
        assert same_bits(conv[l], conv_seq[l]), f"layer {l} conv state differs from sequential decoding"


def test_every_method_gives_the_same_outputs():
    dims = SHAPES["gqa3"]
    reference = run_loop(METHOD_PAIRS[0], dims, n_layers=1, steps=5, seed=5)[5]
    for methods in METHOD_PAIRS[1:]:
        outputs = run_loop(methods, dims, n_layers=1, steps=5, seed=5)[5]
        for ref_step, step in zip(reference, outputs):
            assert same_bits(ref_step[0][1], step[0][1]) and same_bits(ref_step[0][2], step[0][2]), methods


def test_pending_by_next_verify_equals_finish_then_verify():
    """Deferred commit: the next verify folds the pending path itself; the result must equal
    folding it with finish first and verifying from the committed state."""
    dims = SHAPES["gqa3"]
    Hk, Hv, S, C, K = (dims[k] for k in ("Hk", "Hv", "S", "C", "K"))
    rng = np.random.default_rng(21)
    first, second = random_tree(rng, 16), random_tree(rng, 13)
    s1, s2 = build_schedule(first), build_schedule(second)
    L1, L2 = Layer(rng, 16, Hk, Hv, S, C, K), Layer(rng, 13, Hk, Hv, S, C, K)
    conv_w = (rng.standard_normal((C, K)) * 0.5).astype(np.float32)
    gdn0, conv0 = fresh_states(rng, 1, Hv, S, C, K)
    path = random_leaf_path(rng, first)
    results = []
    for finish_first in (False, True):
        banks = FactorBanks(RecurrentShape(1, Hk, Hv, S, C, K, 16))
        gdn, conv = [gdn0[0].copy()], [conv0[0].copy()]
        banks.conv_tree(s1, 0, L1.x, conv_w, conv[0])
        banks.verify_gdn(s1, 0, L1.q, L1.k, L1.v, L1.g, L1.beta, gdn[0])
        banks.accept(s1, path)
        assert banks.pending == len(path)
        if finish_first:
            banks.finish(gdn, conv)
            assert banks.pending == 0
        y = banks.conv_tree(s2, 0, L2.x, conv_w, conv[0])
        o = banks.verify_gdn(s2, 0, L2.q, L2.k, L2.v, L2.g, L2.beta, gdn[0])
        results.append((y, o, gdn[0].copy(), conv[0].copy()))
    for a, b in zip(*results):
        assert same_bits(a, b)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_property_random_trees_and_paths(data):
    n = data.draw(st.integers(1, 30))
    parents = [-1] + [data.draw(st.integers(0, t - 1)) for t in range(1, n)]
    seed = data.draw(st.integers(0, 2**31))
    r = verify_one_step(parents, SHAPES["small-odd"], seed=seed)
    path = random_leaf_path(np.random.default_rng(seed), parents)
    out, state, y, conv_state = sequential(r["layer"], path, r["before"][0], r["before"][1], r["conv_w"])
    assert all(same_bits(r["out"][t], out[i]) for i, t in enumerate(path))
    r["banks"].accept(r["sched"], path)
    r["banks"].finish(r["gdn"], r["conv"])
    assert same_bits(r["gdn"][0], state) and same_bits(r["conv"][0], conv_state)


# --- misuse is refused with a message -----------------------------------------------------------
def test_accept_lengths_and_bad_paths():
    parents = chain(5)
    for n_accept in (1, 5):
        r = verify_one_step(parents, SHAPES["small-odd"], seed=1)
        r["banks"].accept(r["sched"], list(range(n_accept)))
        assert r["banks"].pending == n_accept
    r = verify_one_step(parents, SHAPES["small-odd"], seed=1)
    with pytest.raises(NativeError, match="path length 6"):
        r["banks"].accept(r["sched"], list(range(6)))  # A = T + 1
    with pytest.raises(NativeError, match="must be the root"):
        r["banks"].accept(r["sched"], [1, 2])
    r = verify_one_step([-1, 0, 0, 1], SHAPES["small-odd"], seed=1)
    with pytest.raises(NativeError, match="not a child"):
        r["banks"].accept(r["sched"], [0, 2, 3])


def test_accept_needs_every_layer_verified_and_methods_are_checked():
    banks = FactorBanks(RecurrentShape(2, 1, 3, 16, 96, 4, 8))
    rng = np.random.default_rng(0)
    sched = build_schedule(chain(3))
    L = Layer(rng, 3, 1, 3, 16, 96, 4)
    gdn, conv = fresh_states(rng, 2, 3, 16, 96, 4)
    banks.conv_tree(sched, 0, L.x, np.ones((96, 4), np.float32), conv[0])
    banks.verify_gdn(sched, 0, L.q, L.k, L.v, L.g, L.beta, gdn[0])
    with pytest.raises(NativeError, match="layer 1 was not verified"):
        banks.accept(sched, [0, 1])
    with pytest.raises(NativeError, match="max_nodes"):
        banks.verify_gdn(build_schedule(chain(9)), 0, *(np.zeros((9,) + a.shape[1:], np.float32)
                                                         for a in (L.q, L.k, L.v, L.g, L.beta)), gdn[0])
    with pytest.raises(NativeError, match="needs verify_method DENSE_CHECKPOINTS"):
        FactorBanks(RecurrentShape(1, 1, 3, 16, 96, 4, 8), "hld_chains", "checkpoint_restore")
    with pytest.raises(UsageError, match="verify_method"):
        FactorBanks(RecurrentShape(1, 1, 3, 16, 96, 4, 8), "magic")


def test_bank_memory_is_factors_not_states():
    """SpecLA keeps factors per node (k per key head, delta and g per value head, raw conv input);
    dense checkpoints keep a whole state per node. 27B recurrent shape, 23-node trees."""
    Hk, Hv, S, C, K, N, L = 16, 48, 128, 10240, 4, 23, 48
    specla = FactorBanks(RecurrentShape(L, Hk, Hv, S, C, K, N)).nbytes
    assert specla == 2 * L * N * (Hk * S + Hv * S + Hv + C) * 4
    dense = FactorBanks(RecurrentShape(1, Hk, Hv, S, C, K, N), "dense_checkpoints", "checkpoint_restore").nbytes
    assert dense == 2 * N * (Hk * S + Hv * S + Hv + C) * 4 + N * (Hv * S * S + (K - 1) * C) * 4
    assert dense * L > 10 * specla


def test_two_chains_sharing_one_boundary_slot_are_refused():
    """A schedule whose node 1 stores its state in node 0's boundary slot (and whose chain from node
    0 reads that slot) would verify the chain [2] from node 1's state: silently wrong. The validator
    behind the public tree ops must refuse it (slots are numbered 0, 1, ... in node order)."""
    # header ints 13 and 15 hold the offsets of chain_parent_boundary and node_boundary (specla.h)
    parents = [-1, 0, 0, 1, 1]
    good = build_schedule(parents)
    chain_parent_boundary_at, node_boundary_at = int(good[13]), int(good[15])
    assert good[node_boundary_at:][:5].tolist() == [0, 1, -1, -1, -1]  # node 0 -> slot 0, node 1 -> slot 1
    bad = good.copy()
    bad[node_boundary_at + 1] = 0  # node 1 writes slot 0 too
    chains_from_slot_1 = np.flatnonzero(bad[chain_parent_boundary_at:][:3] == 1)
    assert len(chains_from_slot_1) == 1
    bad[chain_parent_boundary_at + chains_from_slot_1] = 0  # its chain now reads slot 0
    rng = np.random.default_rng(0)
    banks = FactorBanks(RecurrentShape(1, 1, 3, 16, 96, 4, 8))
    L = Layer(rng, 5, 1, 3, 16, 96, 4)
    gdn, conv = fresh_states(rng, 1, 3, 16, 96, 4)
    with pytest.raises(NativeError, match="boundary slot"):
        banks.conv_tree(bad, 0, L.x, np.ones((96, 4), np.float32), conv[0])
    with pytest.raises(NativeError, match="boundary slot"):
        banks.verify_gdn(bad, 0, L.q, L.k, L.v, L.g, L.beta, gdn[0])
    banks.conv_tree(good, 0, L.x, np.ones((96, 4), np.float32), conv[0])  # the builder's schedule passes
