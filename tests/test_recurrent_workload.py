"""The recurrent workload (specla_recurrent_workload_*, RecurrentWorkload): the tree work of every
recurrent layer resident in one backend's memory, as tools/bench_specla.py times it on a GPU.
Checked BIT FOR BIT against the per-layer host ops (FactorBanks) on the CPU, every verify/commit
method pair agreeing bit for bit on every backend (the GPU included), and its bad inputs named."""

from __future__ import annotations

import numpy as np
import pytest

from pyspecla.errors import NativeError, UsageError
from pyspecla.speculative.hld import build_schedule
from pyspecla.speculative.recurrent import FactorBanks, RecurrentShape, RecurrentWorkload

SHAPE = RecurrentShape(n_layers=3, Hk=2, Hv=4, S=16, C=24, K=4, max_nodes=9)
# three steps: accepted paths through a side branch (gathered), down the middle of a tree, and the
# tree's first nodes in order (a bank swap; the replay baseline reads them in place)
TREE_1, PATH_1 = [-1, 0, 1, 2, 0, 4, 1, 6, 3], [0, 4, 5]
TREE_2, PATH_2 = [-1, 0, 1, 1, 2, 4, 0, 6], [0, 1, 2, 4]
TREE_3, PATH_3 = [-1, 0, 1, 2, 1, 0], [0, 1, 2, 3]
STEPS = ((TREE_1, PATH_1), (TREE_2, PATH_2), (TREE_3, PATH_3))
METHOD_PAIRS = [("hld_chains", "deferred_factors"), ("hld_chains", "factors_now"), ("root_to_leaf", "factors_now"),
                ("hld_chains", "replay"), ("dense_checkpoints", "checkpoint_restore")]


def make_inputs(seed: int = 0, shape: RecurrentShape = SHAPE) -> dict:
    rng = np.random.default_rng(seed)
    s, L, N = shape, shape.n_layers, shape.max_nodes

    def l2(a):
        return (a / np.sqrt((a * a).sum(-1, keepdims=True) + 1e-6)).astype(np.float32)

    return {"q": l2(rng.standard_normal((L, N, s.Hk, s.S))), "k": l2(rng.standard_normal((L, N, s.Hk, s.S))),
            "v": rng.standard_normal((L, N, s.Hv, s.S)).astype(np.float32),
            "g": (-np.abs(rng.standard_normal((L, N, s.Hv))) * 0.3).astype(np.float32),
            "beta": (1 / (1 + np.exp(-rng.standard_normal((L, N, s.Hv))))).astype(np.float32),
            "x": rng.standard_normal((L, N, s.C)).astype(np.float32),
            "conv_weight": (rng.standard_normal((L, s.C, s.K)) * 0.5).astype(np.float32),
            "gdn_state": (rng.standard_normal((L, s.Hv, s.S, s.S)) * 0.1).astype(np.float32),
            "conv_state": rng.standard_normal((L, s.K - 1, s.C)).astype(np.float32)}


def run_workload(inputs, verify_method, commit_method, shape: RecurrentShape = SHAPE, steps=STEPS,
                 **kw) -> list[np.ndarray]:
    """The steps and the finish; every verify output of every layer, then the final states."""
    w = RecurrentWorkload(shape, inputs, verify_method, commit_method, **kw)
    got = []
    for tree, path in steps:
        w.set_tree(tree)
        w.verify()
        got += [w.read(what, l) for l in range(shape.n_layers) for what in ("gdn_out", "conv_out")]
        w.accept(path)
    w.finish()
    got += [w.read(what, l) for l in range(shape.n_layers) for what in ("gdn_state", "conv_state")]
    w.close()
    return got


def run_factor_banks(inputs, verify_method, commit_method, cpu_kernels) -> list[np.ndarray]:
    """The same work through the per-layer host ops."""
    banks = FactorBanks(SHAPE, verify_method, commit_method, cpu_kernels=cpu_kernels)
    gdn = [a.copy() for a in inputs["gdn_state"]]
    conv = [a.copy() for a in inputs["conv_state"]]
    got = []
    for tree, path in STEPS:
        sched, n = build_schedule(tree, SHAPE.max_nodes), len(tree)
        for l in range(SHAPE.n_layers):
            y = banks.conv_tree(sched, l, inputs["x"][l, :n], inputs["conv_weight"][l], conv[l])
            out = banks.verify_gdn(sched, l, *(inputs[f][l, :n] for f in ("q", "k", "v", "g", "beta")), gdn[l])
            got += [out, y]
        banks.accept(sched, path, gdn, conv)
    banks.finish(gdn, conv)
    for l in range(SHAPE.n_layers):
        got += [gdn[l], conv[l]]
    banks.close()
    return got


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("verify_method,commit_method", METHOD_PAIRS)
def test_workload_equals_the_host_ops_bit_for_bit_on_the_cpu(verify_method, commit_method, cpu_kernels):
    inputs = make_inputs(1)
    got = run_workload(inputs, verify_method, commit_method, device="cpu", cpu_kernels=cpu_kernels)
    want = run_factor_banks(inputs, verify_method, commit_method, cpu_kernels)
    assert len(got) == len(want)
    assert not any(np.isnan(a).any() for a in got)  # read() poisons its output: every element was written
    bad = [i for i, (a, b) in enumerate(zip(got, want)) if not same_bits(a, b)]
    assert not bad, f"arrays {bad} differ"


def test_every_method_pair_gives_the_same_bits(backend):
    """SpecLA and its baselines compute the same thing: outputs and durable states equal bit for bit
    on one backend (what bench_specla's same_outputs / same_state report on the device)."""
    inputs = make_inputs(2)
    assert_the_same_bits({pair: run_workload(inputs, *pair, **backend.kw) for pair in METHOD_PAIRS})


def assert_the_same_bits(runs: dict) -> None:
    """Every run's arrays equal the first run's bit for bit, and the first holds no NaN (read()
    poisons its output: every element was written)."""
    first_key, first = next(iter(runs.items()))
    assert not any(np.isnan(a).any() for a in first)
    for key, got in runs.items():
        bad = [i for i, (a, b) in enumerate(zip(got, first)) if not same_bits(a, b)]
        assert not bad, f"{key} differs from {first_key} in arrays {bad}"


# The 27B's recurrent heads (Hk 16, Hv 48, S 128: 768 blocks of 8 rows per layer), two layers, and
# trees with many chains: a 4-ary tree of 33 nodes (25 chains, 8 boundary nodes) and a 16-node spine
# with a leaf off every spine node (a DDTree's shape: 16 chains, 15 boundary nodes). Both have more
# boundary states than the chain kernel parks in shared memory at S = 128 (3 or 4, by device and rows
# per block), so the rest go through the workspace. Accepted paths end on a side branch, then down the spine.
SHAPE_27B = RecurrentShape(n_layers=2, Hk=16, Hv=48, S=128, C=2 * 16 * 128 + 48 * 128, K=4, max_nodes=33)
FOUR_ARY = [-1] + [(i - 1) // 4 for i in range(1, 33)]
SPINE = [-1] + list(range(15)) + list(range(16))
STEPS_27B = ((FOUR_ARY, [0, 1, 5, 21]), (SPINE, [0, 1, 2, 3, 4, 5, 6, 22]), (FOUR_ARY, [0, 2, 9]),
             (SPINE, list(range(16))))


@pytest.mark.gpu
def test_wide_trees_at_the_27b_head_shape_give_the_same_bits_on_the_gpu():
    """SpecLA's chain verify against root-to-leaf replay and dense checkpoints, outputs and durable
    states bit for bit, at the head shape and tree widths of the benchmarks."""
    inputs = make_inputs(4, SHAPE_27B)
    pairs = [("hld_chains", "deferred_factors"), ("root_to_leaf", "replay"), ("dense_checkpoints", "checkpoint_restore")]
    assert_the_same_bits({pair: run_workload(inputs, *pair, shape=SHAPE_27B, steps=STEPS_27B, device="cuda")
                          for pair in pairs})


def test_workload_names_bad_input():
    inputs = make_inputs(3)
    with pytest.raises(UsageError, match=r"inputs\['beta'\] has shape"):
        RecurrentWorkload(SHAPE, {**inputs, "beta": inputs["beta"][:, :2]})
    with pytest.raises(UsageError, match="inputs lack 'x'"):
        RecurrentWorkload(SHAPE, {k: v for k, v in inputs.items() if k != "x"})
    w = RecurrentWorkload(SHAPE, inputs, device="cpu")
    with pytest.raises(NativeError, match="no tree yet"):
        w.verify()
    with pytest.raises(NativeError, match=r"parents\[2\] = 5"):
        w.set_tree([-1, 0, 5])
    with pytest.raises(NativeError, match="the workload takes 1 .. 9"):
        w.set_tree(list(range(-1, 10)))
    w.set_tree(TREE_1)
    with pytest.raises(NativeError, match="no verify awaits accept"):
        w.accept([0])
    w.verify()
    with pytest.raises(NativeError, match="awaits accept"):
        w.set_tree(TREE_2)
    with pytest.raises(NativeError, match="path"):
        w.accept([0, 2])  # node 2 is not a child of the root
    with pytest.raises(NativeError, match="layer 3 outside"):
        w.read("gdn_state", 3)
    with pytest.raises(UsageError, match="what must be one of"):
        w.read("delta", 0)
    w.close()


def _gdn_op_inputs(T, Hk, Hv, S, seed=7):
    rng = np.random.default_rng(seed)

    def l2(a):
        return (a / np.sqrt((a * a).sum(-1, keepdims=True) + 1e-6)).astype(np.float32)

    return (l2(rng.standard_normal((T, Hk, S))), l2(rng.standard_normal((T, Hk, S))),
            rng.standard_normal((T, Hv, S)).astype(np.float32),
            (-np.abs(rng.standard_normal((T, Hv))) * 0.3).astype(np.float32),
            (1 / (1 + np.exp(-rng.standard_normal((T, Hv))))).astype(np.float32),
            (rng.standard_normal((Hv, S, S)) * 0.1).astype(np.float32))


@pytest.mark.gpu
def test_deferred_gdn_step_gives_the_same_bits(monkeypatch):
    """SPECLA_CUDA_GDN_DEFER=1 (each token's M^T q reduction deferred into the next token's step, also
    what an unset switch gives) against 0 (gdn_step), array for array, bit for bit:
    the sequential op over 1, 8, 23 and 17 tokens (one chunk, a full one, three with a partial last; S
    = 128, 32 and 24), then the 27B-shaped workload's three verify methods over the wide trees (chain
    starts from parked and workspace boundary slots, the pending fold, root-to-leaf paths, checkpoint
    loads). The switch is read when a backend opens, which every op call and workload does. Equal bits
    are what the deferred form must give; that it ran is not observable from here: the device A/B's
    timings per setting are what show it took effect."""
    from pyspecla import ops

    inputs = make_inputs(5, SHAPE_27B)
    runs = {}
    for setting in ("0", "1"):
        monkeypatch.setenv("SPECLA_CUDA_GDN_DEFER", setting)
        rows = []
        for T, Hk, Hv, S in ((1, 16, 48, 128), (8, 16, 48, 128), (23, 16, 48, 128), (23, 2, 6, 32), (17, 3, 9, 24)):
            rows += list(ops.gated_delta_rule(*_gdn_op_inputs(T, Hk, Hv, S), device="cuda"))
        for pair in (("hld_chains", "deferred_factors"), ("root_to_leaf", "replay"),
                     ("dense_checkpoints", "checkpoint_restore")):
            rows += run_workload(inputs, *pair, shape=SHAPE_27B, steps=STEPS_27B, device="cuda")
        runs[setting] = rows
    assert len(runs["0"]) == len(runs["1"]) > 10
    assert not any(np.isnan(a).any() for a in runs["0"])
    bad = [i for i, (a, b) in enumerate(zip(runs["0"], runs["1"])) if not same_bits(a, b)]
    assert not bad, f"the deferred step differs in arrays {bad}"
