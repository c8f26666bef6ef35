"""The numpy oracles judged on their own: single ops against independent formulations and hand
cases, the whole-model reference against itself (batching must not matter), and the synthetic
test models (deterministic, loadable, quant types placed as llama-quantize places them)."""

from __future__ import annotations

import math

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from pyspecla.reference import ops
from pyspecla.reference.forward import ReferenceModel
from pyspecla.testing.models import PRESETS, tensor_plan, write_test_model


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    """model_path(quant, preset="tiny") -> a synthetic model written once per module (seed 0)."""
    directory = tmp_path_factory.mktemp("reference-models")
    cache = {}

    def get(quant: str = "f32", preset: str = "tiny") -> str:
        if (preset, quant) not in cache:
            cache[preset, quant] = str(write_test_model(directory / f"{preset}-{quant}.gguf", preset, quant, seed=0))
        return cache[preset, quant]

    return get

# --------------------------------------------------------------------------------------------
# single ops


def test_rms_l2_norm_and_activations():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 16)).astype(np.float32)
    w = rng.standard_normal(16).astype(np.float32)
    x64 = x.astype(np.float64)
    expect = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(ops.rms_norm(x, w, 1e-6), expect, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ops.rms_norm(x, None, 1e-6), expect / w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(ops.l2_norm(x, 1e-12), axis=-1), 1.0, rtol=1e-6)
    assert ops.rms_norm(x, w, 1e-6).dtype == np.float32

    v = np.array([-100.0, -30.0, -1.0, 0.0, 1.0, 19.9, 20.0, 20.5, 100.0])
    np.testing.assert_allclose(ops.softplus(v), np.where(v > 20, v, np.log1p(np.exp(v))), rtol=1e-6, atol=1e-30)
    assert ops.softplus(np.array([20.5]))[0] == np.float32(20.5)
    np.testing.assert_allclose(ops.sigmoid(v), 1 / (1 + np.exp(-v)), rtol=1e-6, atol=1e-30)
    np.testing.assert_allclose(ops.silu(v), v / (1 + np.exp(-v)), rtol=1e-6, atol=1e-30)


def test_ops_do_not_modify_inputs():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((3, 2, 8)).astype(np.float32)
    k = rng.standard_normal((3, 2, 8)).astype(np.float32)
    v = rng.standard_normal((3, 6, 8)).astype(np.float32)
    g = -rng.random((3, 6)).astype(np.float32)
    beta = rng.random((3, 6)).astype(np.float32)
    state = rng.standard_normal((6, 8, 8)).astype(np.float32)
    conv_state = rng.standard_normal((3, 12)).astype(np.float32)
    args = [a.copy() for a in (q, k, v, g, beta, state, conv_state)]
    ops.gated_delta_rule(q, k, v, g, beta, state)
    ops.causal_conv(rng.standard_normal((3, 12)), rng.standard_normal((12, 4)), conv_state)
    ops.rope_neox(q, np.arange(3), 4, 10000.0)
    for before, after in zip(args, (q, k, v, g, beta, state, conv_state)):
        np.testing.assert_array_equal(before, after)


@pytest.mark.parametrize("qtype", [QT.F32, QT.F16, QT.Q8_0])
def test_matmul_dequantizes_gguf_blocks(qtype):
    rng = np.random.default_rng(2)
    w = rng.standard_normal((5, 64)).astype(np.float32)
    raw = gguf.quants.quantize(w, qtype)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    w_deq = gguf.quants.dequantize(raw, qtype).astype(np.float64)
    seen = x.astype(np.float64)
    if qtype == QT.Q8_0:
        # Q8_0 weights meet 8-bit activation blocks; gguf's own Q8_0 quantizer, an independent
        # implementation of the same rounding, gives the same activation values on these rows
        seen = gguf.quants.dequantize(gguf.quants.quantize(x, QT.Q8_0), QT.Q8_0).astype(np.float64)
        assert not np.array_equal(seen, x.astype(np.float64))
    np.testing.assert_allclose(ops.matmul(raw.view(np.uint8), qtype, 64, 5, x), seen @ w_deq.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ops.matmul(raw.tobytes(), int(qtype), 64, 5, x[0]), seen[0] @ w_deq.T, rtol=1e-5,
                               atol=1e-5)


def test_causal_conv_against_loops():
    rng = np.random.default_rng(3)
    T, C, K = 7, 5, 4
    x = rng.standard_normal((T, C))
    w = rng.standard_normal((C, K))
    state = rng.standard_normal((K - 1, C))
    y, new_state = ops.causal_conv(x, w, state)
    window = np.concatenate([state, x])
    for t in range(T):
        for c in range(C):
            s = sum(window[t + k, c] * w[c, k] for k in range(K))  # k = 0 the oldest sample
            assert y[t, c] == pytest.approx(s / (1 + math.exp(-s)), rel=1e-5, abs=1e-6)
    np.testing.assert_allclose(new_state, x[-(K - 1):], rtol=1e-6)
    # a batch equals the same tokens one at a time
    st = state
    for t in range(T):
        yt, st = ops.causal_conv(x[t : t + 1], w, st)
        np.testing.assert_allclose(yt[0], y[t], rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(st, new_state)


def _gdn_closed_form(q, k, v, g, beta, state_ji, Hk):
    """The gated delta rule in the math's layout M[i][j] (key i, value j) and in closed form:
    M_t = exp(G_t) M_0 + sum_u exp(G_t - G_u) k_u (x) delta_u, G_t = g_1 + ... + g_t, with
    delta_u = beta_u (v_u - M_{u-1}^T k_u) taken from that same closed form."""
    q, k, v, g, beta = (np.asarray(a, np.float64) for a in (q, k, v, g, beta))
    T, _, S = q.shape
    Hv = v.shape[1]
    out = np.zeros((T, Hv, S))
    final = np.zeros((Hv, S, S))
    for h in range(Hv):
        kh = h % Hk
        m0 = np.asarray(state_ji[h], np.float64).T  # [j][i] -> M[i][j]
        G = np.cumsum(g[:, h])
        deltas = []

        def m_at(t):  # state after token t (t = -1: initial)
            if t < 0:
                return m0
            m = math.exp(G[t]) * m0
            for u, d in enumerate(deltas[: t + 1]):
                m = m + math.exp(G[t] - G[u]) * np.outer(k[u, kh], d)
            return m

        for t in range(T):
            m_prev_decayed = math.exp(g[t, h]) * m_at(t - 1)
            deltas.append(beta[t, h] * (v[t, h] - m_prev_decayed.T @ k[t, kh]))
            out[t, h] = m_at(t).T @ q[t, kh] / math.sqrt(S)
        final[h] = m_at(T - 1).T  # back to [j][i]
    return out, final


@pytest.mark.parametrize("T,Hk,Hv,S", [(1, 1, 1, 4), (5, 2, 6, 8), (9, 3, 3, 16)])
def test_gated_delta_rule_against_closed_form(T, Hk, Hv, S):
    rng = np.random.default_rng(4)
    q = ops.l2_norm(rng.standard_normal((T, Hk, S)), 1e-6)
    k = ops.l2_norm(rng.standard_normal((T, Hk, S)), 1e-6)
    v = rng.standard_normal((T, Hv, S)).astype(np.float32)
    g = -rng.uniform(0.01, 1.0, (T, Hv)).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, (T, Hv)).astype(np.float32)
    state = (0.3 * rng.standard_normal((Hv, S, S))).astype(np.float32)
    out, new_state = ops.gated_delta_rule(q, k, v, g, beta, state)
    out_ref, state_ref = _gdn_closed_form(q, k, v, g, beta, state, Hk)
    np.testing.assert_allclose(out, out_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(new_state, state_ref, rtol=1e-5, atol=1e-6)
    # splitting the tokens across calls carries the state exactly
    if T > 1:
        o1, s1 = ops.gated_delta_rule(q[:2], k[:2], v[:2], g[:2], beta[:2], state)
        o2, s2 = ops.gated_delta_rule(q[2:], k[2:], v[2:], g[2:], beta[2:], s1)
        np.testing.assert_allclose(np.concatenate([o1, o2]), out, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(s2, new_state, rtol=1e-5, atol=1e-6)


def test_gated_delta_rule_single_step_by_hand():
    # S = 2, one head, zero state: M = k (x) beta v, o = M^T q / sqrt(2) = beta v (k . q) / sqrt(2)
    q = np.array([[[0.6, 0.8]]])
    k = np.array([[[1.0, 0.0]]])
    v = np.array([[[2.0, -1.0]]])
    out, state = ops.gated_delta_rule(q, k, v, np.array([[-0.5]]), np.array([[0.5]]), np.zeros((1, 2, 2)))
    np.testing.assert_allclose(out[0, 0], 0.5 * np.array([2.0, -1.0]) * 0.6 / math.sqrt(2), rtol=1e-6)
    # layout [head][value j][key i]: only key column i = 0 is written
    np.testing.assert_allclose(state[0], [[1.0, 0.0], [-0.5, 0.0]], rtol=1e-6)


def test_gated_delta_rule_long_horizon_drift_float32():
    """400 tokens computed in float32 stay within 1e-5 of the float64 oracle (no drift)."""
    rng = np.random.default_rng(5)
    T, Hk, Hv, S = 400, 2, 6, 32
    q = ops.l2_norm(rng.standard_normal((T, Hk, S)), 1e-6)
    k = ops.l2_norm(rng.standard_normal((T, Hk, S)), 1e-6)
    v = rng.standard_normal((T, Hv, S)).astype(np.float32)
    g = np.log(rng.uniform(0.9, 1.0, (T, Hv))).astype(np.float32)  # slow decay: long memory
    beta = rng.uniform(0.05, 0.95, (T, Hv)).astype(np.float32)
    state = np.zeros((Hv, S, S), np.float32)
    out64, st64 = ops.gated_delta_rule(q, k, v, g, beta, state, dtype=np.float64)
    out32, st32 = ops.gated_delta_rule(q, k, v, g, beta, state, dtype=np.float32)
    assert np.abs(out64).max() > 0.1  # the state did not simply decay away
    assert np.abs(out32 - out64).max() < 1e-5
    assert np.abs(st32 - st64).max() < 1e-5


def test_rope_neox_known_vector():
    D, n_rot, base = 8, 4, 10000.0
    x = np.zeros((2, 1, D))
    x[:, 0, 0] = 1.0  # pair (0, 2)
    x[:, 0, 3] = 1.0  # pair (1, 3), the second element
    x[:, 0, 4:] = [5.0, 6.0, 7.0, 8.0]  # beyond n_rot: untouched
    y = ops.rope_neox(x, np.array([0, 3]), n_rot, base)
    np.testing.assert_allclose(y[0], x[0], atol=1e-7)  # position 0: identity
    th0 = 3 * base ** (-0.0 / n_rot)
    th1 = 3 * base ** (-2.0 / n_rot)
    np.testing.assert_allclose(y[1, 0, [0, 2]], [math.cos(th0), math.sin(th0)], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(y[1, 0, [1, 3]], [-math.sin(th1), math.cos(th1)], rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(y[1, 0, 4:], [5.0, 6.0, 7.0, 8.0])
    # a rotation: norms kept; relative: <rope(a, p), rope(b, p + d)> depends on d only
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((2, 1, 1, 16))
    dots = [
        float(np.sum(ops.rope_neox(a, [p], 16, 1e4, dtype=np.float64) * ops.rope_neox(b, [p + 5], 16, 1e4)))
        for p in (0, 7, 100)
    ]
    np.testing.assert_allclose(dots, dots[0], rtol=1e-4)


def test_attention_hand_cases():
    D = 4
    # one visible row: the output is that row's value
    q = np.ones((1, 1, D))
    kc = np.array([[[1.0, 0, 0, 0]], [[0, 9.0, 0, 0]]])
    vc = np.array([[[1.0, 2, 3, 4]], [[50.0, 60, 70, 80]]])
    np.testing.assert_allclose(ops.attention(q, kc, vc, np.array([0]))[0, 0], [1, 2, 3, 4], rtol=1e-6)
    # two rows, scores 1/sqrt(D)*[1, 9] = [0.5, 4.5]
    p = np.exp([0.5, 4.5]) / np.exp([0.5, 4.5]).sum()
    np.testing.assert_allclose(ops.attention(q, kc, vc, np.array([1]))[0, 0], p @ vc[:, 0], rtol=1e-6)
    # GQA: 6 query heads over 2 kv heads, query head h reads kv head h // 3; equal keys average v
    q = np.zeros((2, 6, D))
    kc = np.zeros((3, 2, D))
    vc = np.arange(3 * 2 * D, dtype=np.float64).reshape(3, 2, D)
    out = ops.attention(q, kc, vc, np.array([1, 2]))
    for h in range(6):
        np.testing.assert_allclose(out[0, h], vc[:2, h // 3].mean(0), rtol=1e-6)
        np.testing.assert_allclose(out[1, h], vc[:3, h // 3].mean(0), rtol=1e-6)


# --------------------------------------------------------------------------------------------
# the whole-model reference


@pytest.fixture(scope="module", params=["tiny", "tiny8"])
def reference_model(request, model_path):
    return ReferenceModel.from_gguf(model_path("f32", preset=request.param))


PROMPT = [5, 900, 17, 256, 3, 3, 1000, 42, 7, 610, 88]


def test_reference_hparams_follow_the_file(reference_model):
    hp = reference_model.hp
    p = PRESETS["tiny" if hp.n_layer == 4 else "tiny8"]
    assert hp.layer_is_recurrent == p.layer_is_recurrent
    assert (hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim, hp.rope_dims) == (
        p.n_embd, p.n_head, p.n_head_kv, p.head_dim, p.rope_dims)
    assert hp.rope_freq_base == p.rope_freq_base
    assert ("output.weight" in reference_model.w) == (not p.tied_output)


def test_prefill_equals_token_by_token_decode(reference_model):
    m = reference_model
    full = m.forward(m.new_state(), PROMPT)
    state = m.new_state()
    steps = np.concatenate([m.forward(state, [t]) for t in PROMPT])
    assert state.n_past == len(PROMPT)
    np.testing.assert_allclose(steps, full, rtol=0, atol=1e-5)


def test_chunked_prefill_equals_full(reference_model):
    m = reference_model
    full_state = m.new_state()
    full = m.forward(full_state, PROMPT)
    state = m.new_state()
    chunks = [m.forward(state, PROMPT[a:b]) for a, b in ((0, 4), (4, 5), (5, 11))]
    np.testing.assert_allclose(np.concatenate(chunks), full, rtol=0, atol=1e-5)
    for i, rec in enumerate(m.hp.layer_is_recurrent):
        if rec:
            np.testing.assert_allclose(state.gdn[i], full_state.gdn[i], atol=1e-5)
            np.testing.assert_allclose(state.conv[i], full_state.conv[i], atol=1e-6)
        else:
            assert state.k_cache[i].shape == (len(PROMPT), m.hp.n_head_kv, m.hp.head_dim)


def test_state_copy_is_independent(reference_model):
    m = reference_model
    state = m.new_state()
    m.forward(state, PROMPT[:5])
    fork = state.copy()
    a = m.forward(state, PROMPT[5:])
    b = m.forward(fork, PROMPT[5:])
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError):
        m.forward(state, [1], positions=[0])


def test_greedy_decoding_is_not_degenerate(reference_model):
    """The synthetic weights give varied greedy tokens and clear top-1 / top-2 gaps."""
    m = reference_model
    state = m.new_state()
    logits = m.forward(state, PROMPT[:3])[-1]
    tokens, gaps = [], []
    for _ in range(32):
        top2 = np.sort(logits)[-2:]
        gaps.append(top2[1] - top2[0])
        tokens.append(int(np.argmax(logits)))
        logits = m.forward(state, [tokens[-1]])[0]
    assert len(set(tokens)) >= 8, tokens
    assert np.median(gaps) > 0.3, gaps
    assert 2.0 < np.std(logits) < 10.0


# --------------------------------------------------------------------------------------------
# synthetic test models


def test_test_model_is_deterministic_and_loadable(tmp_path):
    a = write_test_model(tmp_path / "a.gguf", "tiny", "f32", seed=0)
    b = write_test_model(tmp_path / "b.gguf", "tiny", "f32", seed=0)
    c = write_test_model(tmp_path / "c.gguf", "tiny", "f32", seed=1)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()

    reader = gguf.GGUFReader(str(a))
    p = PRESETS["tiny"]

    def val(key):
        return reader.fields[key].contents()

    assert val("general.architecture") == "qwen35"
    assert val("qwen35.block_count") == p.n_layer
    assert val("qwen35.embedding_length") == p.n_embd
    assert val("qwen35.attention.head_count_kv") == p.n_head_kv
    assert val("qwen35.attention.key_length") == val("qwen35.attention.value_length") == p.head_dim
    assert val("qwen35.rope.dimension_count") == p.rope_dims
    assert sum(val("qwen35.rope.dimension_sections")) == p.rope_dims // 2
    assert val("qwen35.ssm.inner_size") == p.ssm_time_step_rank * p.ssm_state_size
    assert val("qwen35.full_attention_interval") == 4
    assert val("tokenizer.ggml.model") == "gpt2"
    assert len(val("tokenizer.ggml.tokens")) == p.n_vocab
    assert val("general.file_type") == 0

    tensors = {t.name: t for t in reader.tensors}
    assert set(tensors) == {s.name for s in tensor_plan(p)}
    for spec in tensor_plan(p):
        assert tuple(int(n) for n in tensors[spec.name].shape) == tuple(reversed(spec.shape)), spec.name
    # converter conventions
    assert np.all(tensors["blk.0.ssm_a"].data < 0)
    assert np.all(np.abs(tensors["blk.0.ssm_a"].data) >= 1) and np.all(np.abs(tensors["blk.0.ssm_a"].data) <= 16)
    assert abs(float(np.mean(tensors["blk.0.attn_norm.weight"].data)) - 1.0) < 0.05
    assert tuple(int(n) for n in tensors["blk.0.ssm_conv1d.weight"].shape) == (p.ssm_conv_kernel, p.conv_channels)


def _expected_q4_k_m_type(name: str, n_dims: int, n_layer: int, tied: bool) -> QT:
    """llama-quantize's Q4_K_M choice for a qwen35 tensor (llama-quant.cpp, written out again)."""
    if n_dims == 1 or "ssm_conv1d" in name:
        return QT.F32
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return QT.Q6_K
    if name.endswith(("attn_v.weight", "attn_qkv.weight", "ffn_down.weight")):
        i, n = int(name.split(".")[1]), n_layer
        more_bits = i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2
        return QT.Q6_K if more_bits else QT.Q4_K
    return QT.Q4_K


@pytest.mark.parametrize("preset", ["tiny", "tiny8"])
def test_q4_k_m_placement(model_path, preset):
    p = PRESETS[preset]
    reader = gguf.GGUFReader(model_path("q4_k_m", preset=preset))
    seen = set()
    for t in reader.tensors:
        expect = _expected_q4_k_m_type(t.name, len(t.shape), p.n_layer, p.tied_output)
        assert t.tensor_type == expect, (t.name, t.tensor_type.name, expect.name)
        seen.add(t.tensor_type)
    assert seen == {QT.F32, QT.Q4_K, QT.Q6_K}
    assert reader.fields["general.file_type"].contents() == 15


@pytest.mark.parametrize("quant,types", [("q8_0", {QT.F32, QT.Q8_0}), ("f16", {QT.F32, QT.F16})])
def test_q8_0_and_f16_placement(model_path, quant, types):
    reader = gguf.GGUFReader(model_path(quant))
    for t in reader.tensors:
        two_d = len(t.shape) == 2 and "ssm_conv1d" not in t.name
        assert (t.tensor_type != QT.F32) == two_d, t.name
        assert t.tensor_type in types


def test_quantized_reference_stays_close_to_f32(model_path):
    """Quantization noise must not compound through the depth: q8_0 logits stay near f32."""
    f32 = ReferenceModel.from_gguf(model_path("f32", preset="tiny8"))
    q8 = ReferenceModel.from_gguf(model_path("q8_0", preset="tiny8"))
    a = f32.forward(f32.new_state(), PROMPT)
    b = q8.forward(q8.new_state(), PROMPT)
    assert np.sqrt(np.mean((a - b) ** 2)) < 0.15
    assert np.mean(a.argmax(1) == b.argmax(1)) >= 0.8


def test_from_gguf_honours_recurrent_layers_and_skips_mtp_blocks(tmp_path):
    from gguf_fixtures import write_minimal_qwen35

    # the array says layers 0, 2, 3 are recurrent (the interval rule would say 0, 1, 2); block 4
    # is an MTP block whose tensors the trunk must ignore
    fixture = write_minimal_qwen35(
        tmp_path / "m.gguf", n_layers=4, nextn=1, recurrent_layers=[True, False, True, True, False],
        extra_tensors={"blk.4.attn_norm.weight": ((64,), int(QT.F32))},
    )
    m = ReferenceModel.from_gguf(fixture.path)
    assert m.hp.n_layer == 4
    assert m.hp.layer_is_recurrent == [True, False, True, True]
    assert not any(name.startswith("blk.4.") for name in m.w)
    tokens = [1, 7, 30, 2, 2, 11]
    full = m.forward(m.new_state(), tokens)
    state = m.new_state()
    steps = np.concatenate([m.forward(state, [t]) for t in tokens])
    np.testing.assert_allclose(steps, full, rtol=0, atol=1e-5)
