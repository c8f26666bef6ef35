"""The SpecLA tree-verify oracles (pyspecla.reference.specla) judged against each other and against
the single-op oracles: the tree-masked UT formulation against per-node sequential replay, the factor
identity at every accepted endpoint, the deferred (pending) commit, and the tree-aware conv.
Pure numpy; needs no native library."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyspecla.reference import ops
from pyspecla.reference import specla

REL = 1e-10


def rel_err(a, b) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    if a.size == 0:
        return 0.0
    scale = max(np.max(np.abs(b)), 1e-300)
    return float(np.max(np.abs(a - b)) / scale)


# --------------------------------------------------------------------------------------------
# inputs


def random_parents(n: int, rng) -> np.ndarray:
    return np.array([-1] + [int(rng.integers(0, t)) for t in range(1, n)], dtype=np.int64)


def chain_parents(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64) - 1


def star_parents(children: int) -> np.ndarray:
    return np.array([-1] + [0] * children, dtype=np.int64)


def gdn_inputs(n: int, hk: int, hv: int, s: int, seed: int):
    """q, k L2-normalised (N, Hk, S); v (N, Hv, S); g ≤ 0 (some exactly 0, some strongly negative);
    beta in (0, 1); a random nonzero state0 (Hv, S, S)."""
    rng = np.random.default_rng(seed)

    def l2(x):
        return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)

    q = l2(rng.standard_normal((n, hk, s)))
    k = l2(rng.standard_normal((n, hk, s)))
    v = rng.standard_normal((n, hv, s))
    g = -rng.exponential(0.3, size=(n, hv))
    g[rng.random((n, hv)) < 0.1] = 0.0
    g[rng.random((n, hv)) < 0.05] = -8.0
    beta = 1.0 / (1.0 + np.exp(-rng.standard_normal((n, hv))))
    state0 = rng.standard_normal((hv, s, s)) * 0.5
    return q, k, v, g, beta, state0


def check_ut_vs_sequential(parents, inputs, *, check_all_states: bool = True):
    out_s, states_s, deltas_s = specla.tree_sequential(parents, *inputs)
    ut = specla.tree_ut(parents, *inputs, with_states=check_all_states)
    assert rel_err(ut["out"], out_s) < REL
    assert rel_err(ut["delta"], deltas_s) < REL
    n = len(parents)
    if check_all_states:
        assert rel_err(ut["states"], states_s) < REL
    else:
        for t in range(n):
            assert rel_err(ut["state_at"](t), states_s[t]) < REL
    # cumulative gates against explicit path sums
    g = inputs[3]
    for t in range(n):
        np.testing.assert_allclose(ut["G"][t], g[specla.root_path(parents, t)].sum(axis=0), rtol=1e-13, atol=1e-13)
    return ut, (out_s, states_s, deltas_s)


# --------------------------------------------------------------------------------------------
# topology


def test_root_path_and_validation():
    parents = [-1, 0, 1, 1, 3, 0, 5, 5]
    assert specla.root_path(parents, 0) == [0]
    assert specla.root_path(parents, 4) == [0, 1, 3, 4]
    assert specla.root_path(parents, 7) == [0, 5, 7]
    m_incl, m_strict = specla.ancestor_masks(parents)
    assert m_incl[1, 4] == 1 and m_incl[4, 4] == 1 and m_incl[2, 4] == 0 and m_strict[4, 4] == 0
    assert np.all(np.tril(m_incl, -1) == 0)
    for bad in ([0, 0], [-1, 1], [-1, 0, 2], [-1, -1], [[-1, 0]]):
        with pytest.raises(ValueError):
            specla.validate_parents(bad)
    with pytest.raises(IndexError):
        specla.root_path(parents, 8)


def test_unit_lower_inverse():
    rng = np.random.default_rng(3)
    a = np.tril(rng.standard_normal((2, 9, 9)), -1) * 0.3
    t = specla.unit_lower_inverse(a)
    eye = np.eye(9)
    np.testing.assert_allclose(t @ (eye + a), np.broadcast_to(eye, a.shape), atol=1e-12)
    with pytest.raises(ValueError):
        specla.unit_lower_inverse(np.eye(3))


# --------------------------------------------------------------------------------------------
# UT == sequential


@pytest.mark.parametrize(
    "name,parents",
    [
        ("chain16", chain_parents(16)),
        ("n1", chain_parents(1)),
        ("chain33", chain_parents(33)),
        ("star21", star_parents(21)),
        ("worked_example", np.array([-1, 0, 1, 1, 3, 0, 5, 5])),
    ],
)
def test_ut_matches_sequential_shapes(name, parents):
    check_ut_vs_sequential(parents, gdn_inputs(len(parents), 2, 4, 16, seed=len(parents)))


@pytest.mark.parametrize("n", [24, 64])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ut_matches_sequential_random_trees(n, seed):
    rng = np.random.default_rng(100 + seed)
    parents = random_parents(n, rng)
    check_ut_vs_sequential(parents, gdn_inputs(n, 2, 6, 16, seed=seed))


def test_ut_matches_sequential_qwen35_27b_heads():
    rng = np.random.default_rng(27)
    parents = random_parents(22, rng)
    inputs = gdn_inputs(22, 16, 48, 128, seed=27)
    check_ut_vs_sequential(parents, inputs, check_all_states=False)


def test_ut_matrices_structure():
    rng = np.random.default_rng(5)
    parents = random_parents(12, rng)
    inputs = gdn_inputs(12, 1, 2, 8, seed=5)
    ut = specla.tree_ut(parents, *inputs, with_states=False)
    assert np.all(np.triu(ut["A"]) == 0)  # strictly lower triangular in topological order
    assert np.all(ut["D"][:, ut["M_incl"] == 0] == 0)
    assert np.all(np.diagonal(ut["D"], axis1=1, axis2=2) == 1)
    eye = np.eye(12)
    np.testing.assert_allclose(ut["T"] @ (eye + ut["A"]), np.broadcast_to(eye, ut["A"].shape), atol=1e-12)
    assert "states" not in ut


# --------------------------------------------------------------------------------------------
# against the single-op oracle, accepted endpoints, fold


def test_tree_sequential_chain_equals_gated_delta_rule():
    n = 16
    inputs = gdn_inputs(n, 2, 4, 32, seed=11)
    out_s, states_s, _ = specla.tree_sequential(chain_parents(n), *inputs)
    out_o, state_o = ops.gated_delta_rule(*inputs)  # float64 inside, rounded to float32
    assert rel_err(out_s, out_o) < 1e-6
    assert rel_err(states_s[-1], state_o) < 1e-6
    # and every prefix of the chain
    for t in (0, 5, 10):
        out_p, state_p = ops.gated_delta_rule(*(x[: t + 1] for x in inputs[:5]), inputs[5])
        assert rel_err(out_s[: t + 1], out_p) < 1e-6
        assert rel_err(states_s[t], state_p) < 1e-6


def test_state_reconstruction_at_every_endpoint_and_fold():
    rng = np.random.default_rng(7)
    n = 24
    parents = random_parents(n, rng)
    q, k, v, g, beta, state0 = gdn_inputs(n, 2, 4, 16, seed=7)
    ut = specla.tree_ut(parents, q, k, v, g, beta, state0)
    for t in range(n):
        path = specla.root_path(parents, t)
        # sequential decode of exactly the accepted path (as a chain)
        _, seq_state = _decode_chain(q[path], k[path], v[path], g[path], beta[path], state0)
        assert rel_err(ut["state_at"](t), seq_state) < REL
        assert rel_err(ut["states"][t], seq_state) < REL
        # deferred commit: fold the path's factors (k per key head, δ, g) into state0
        folded = specla.fold_factors(state0, k[path], ut["delta"][path], g[path], Hk=2)
        assert rel_err(folded, seq_state) < REL
        # keys already per value head are accepted too
        k_v = k[path][:, np.arange(4) % 2]
        assert rel_err(specla.fold_factors(state0, k_v, ut["delta"][path], g[path], Hk=2), seq_state) < REL
    # fold of nothing is the identity, and the input is never modified
    before = state0.copy()
    np.testing.assert_array_equal(specla.fold_factors(state0, k[:0], ut["delta"][:0], g[:0]), state0)
    np.testing.assert_array_equal(state0, before)


def _decode_chain(q, k, v, g, beta, state0):
    st_ = np.asarray(state0, dtype=np.float64)
    outs = []
    for t in range(q.shape[0]):
        o, st_, _ = specla.gdn_step(st_, q[t], k[t], v[t], g[t], beta[t])
        outs.append(o)
    return np.stack(outs), st_


def test_delayed_pending_commit():
    """3 pending tokens folded from their factors, then a 13-node tree verified from the folded
    state == the same tree verified from the state obtained by decoding the 3 tokens."""
    rng = np.random.default_rng(13)
    hk, hv, s = 2, 6, 32
    pend = gdn_inputs(3, hk, hv, s, seed=130)
    q, k, v, g, beta, _ = gdn_inputs(13, hk, hv, s, seed=131)
    state0 = pend[5]
    parents = random_parents(13, rng)
    # the pending path's factors, as the previous verify recorded them
    prev = specla.tree_ut(chain_parents(3), *pend, with_states=False)
    folded = specla.fold_factors(state0, pend[1], prev["delta"], pend[3])
    _, decoded = _decode_chain(*pend)
    assert rel_err(folded, decoded) < REL
    ut_f = specla.tree_ut(parents, q, k, v, g, beta, folded)
    out_d, states_d, deltas_d = specla.tree_sequential(parents, q, k, v, g, beta, decoded)
    assert rel_err(ut_f["out"], out_d) < REL
    assert rel_err(ut_f["delta"], deltas_d) < REL
    assert rel_err(ut_f["states"], states_d) < REL
    # and equally: the whole thing as one tree (pending chain then the 13 nodes under it)
    whole_parents = np.concatenate([chain_parents(3), np.where(parents < 0, 2, parents + 3)])
    whole = [np.concatenate([a, b]) for a, b in zip(pend[:5], (q, k, v, g, beta))]
    ut_w = specla.tree_ut(whole_parents, *whole, state0)
    assert rel_err(ut_w["out"][3:], out_d) < REL
    assert rel_err(ut_w["states"][3:], states_d) < REL


# --------------------------------------------------------------------------------------------
# conv


def conv_inputs(n: int, c: int, kk: int, seed: int):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, c)), rng.standard_normal((c, kk)) * 0.5, rng.standard_normal((kk - 1, c))


def test_conv_tree_chain_equals_causal_conv():
    x, w, cs = conv_inputs(10, 24, 4, seed=1)
    y, windows = specla.conv_tree(chain_parents(10), x, w, cs)
    y_o, cs_o = ops.causal_conv(x, w, cs)
    assert rel_err(y, y_o) < 1e-6
    assert windows.shape == (10, 4, 24)
    np.testing.assert_array_equal(windows[:, -1], x)
    np.testing.assert_array_equal(specla.fold_conv(cs, x), np.concatenate([cs, x])[-3:])
    assert rel_err(specla.conv_state_after_path(cs, x), cs_o) < 1e-6


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n", [13, 24])
def test_conv_tree_random_trees_c96(seed, n):
    c, kk = 96, 4
    rng = np.random.default_rng(200 + seed)
    parents = random_parents(n, rng)
    x, w, cs = conv_inputs(n, c, kk, seed=seed)
    y, windows = specla.conv_tree(parents, x, w, cs)
    for t in range(n):
        path = specla.root_path(parents, t)
        y_o, cs_o = ops.causal_conv(x[path], w, cs)
        assert rel_err(y[t], y_o[-1]) < 1e-6
        hist = np.concatenate([cs, x[path]])
        np.testing.assert_array_equal(windows[t], hist[-kk:])  # exact: the window is a copy
        np.testing.assert_array_equal(specla.conv_state_after_node(parents, x, cs, t), hist[-(kk - 1) :])
        assert rel_err(specla.conv_state_after_path(cs, x[path]), cs_o) < 1e-6


def test_conv_delayed_pending():
    c, kk = 96, 4
    rng = np.random.default_rng(9)
    x_pend, w, cs = conv_inputs(3, c, kk, seed=90)
    x = rng.standard_normal((13, c))
    parents = random_parents(13, rng)
    folded = specla.fold_conv(cs, x_pend)
    y_f, win_f = specla.conv_tree(parents, x, w, folded)
    whole_parents = np.concatenate([chain_parents(3), np.where(parents < 0, 2, parents + 3)])
    y_w, win_w = specla.conv_tree(whole_parents, np.concatenate([x_pend, x]), w, cs)
    np.testing.assert_array_equal(y_f, y_w[3:])
    np.testing.assert_array_equal(win_f, win_w[3:])


def test_conv_tree_k1_and_short_state():
    x, w, cs = conv_inputs(5, 8, 1, seed=4)
    y, windows = specla.conv_tree(star_parents(4), x, w, cs)
    pre = x * w[:, 0]
    np.testing.assert_allclose(y, pre / (1 + np.exp(-pre)), rtol=1e-14)
    assert specla.fold_conv(cs, x).shape == (0, 8)


# --------------------------------------------------------------------------------------------
# property test over random parent arrays


@st.composite
def parent_arrays(draw, max_nodes: int = 12):
    n = draw(st.integers(1, max_nodes))
    return np.array([-1] + [draw(st.integers(0, t - 1)) for t in range(1, n)], dtype=np.int64)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parents=parent_arrays(), seed=st.integers(0, 2**16), hk=st.sampled_from([1, 2]), mult=st.sampled_from([1, 3]))
def test_property_ut_equals_sequential(parents, seed, hk, mult):
    n = len(parents)
    inputs = gdn_inputs(n, hk, hk * mult, 8, seed=seed)
    ut, (_, states_s, _) = check_ut_vs_sequential(parents, inputs)
    q, k, v, g, beta, state0 = inputs
    t = n - 1
    path = specla.root_path(parents, t)
    folded = specla.fold_factors(state0, k[path], ut["delta"][path], g[path])
    assert rel_err(folded, states_s[t]) < REL
    # conv on the same topology
    x, w, cs = conv_inputs(n, 5, 3, seed=seed)
    y, _ = specla.conv_tree(parents, x, w, cs)
    y_o, _ = ops.causal_conv(x[path], w, cs)
    assert rel_err(y[t], y_o[-1]) < 1e-6
