"""Every native op against its numpy oracle (pyspecla.reference.ops), on fresh random inputs, on
every CPU kernel set; outputs are NaN-poisoned inside pyspecla.ops before each call. Quantized
matmul and dequantization have their own file (test_native_quant.py)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import seeded_rng

from pyspecla import ops
from pyspecla.errors import NativeError
from pyspecla.reference import ops as ref

RTOL = 2e-5


def rng(request_id: int = 0):
    # fresh inputs each session, reproducible (conftest.seeded_rng); the seed is in the assert text
    return seeded_rng()


def assert_close(actual, expected, tol, seed, what):
    assert np.isfinite(actual).all(), f"{what}: non-finite output (unwritten element?) seed={seed}"
    scale = max(np.abs(expected).max(), 1e-30)
    err = np.abs(actual.astype(np.float64) - expected).max() / scale
    assert err <= tol, f"{what}: max error {err:.3e} of scale {scale:.3e} > {tol}, seed={seed}"


# widths on both sides of the GPU kernel's thread groups (a warp per row up to 512 floats, a block
# per row beyond, registers up to 8192 floats, memory re-reads past that) and ragged quads
@pytest.mark.parametrize(
    "rows,n", [(1, 1), (1, 7), (5, 33), (3, 128), (24, 256), (9, 512), (2, 513), (64, 1024), (2, 5120), (1, 8195)]
)
def test_rms_norm(backend, rows, n):
    r, seed = rng()
    x = r.standard_normal((rows, n)).astype(np.float32) * 3
    w = r.standard_normal(n).astype(np.float32)
    assert_close(ops.rms_norm(x, w, 1e-6, **backend.kw), ref.rms_norm(x, w, 1e-6), RTOL, seed, "rms_norm")
    assert_close(ops.rms_norm(x, None, 1e-6, **backend.kw), ref.rms_norm(x, None, 1e-6), RTOL, seed,
                 "rms_norm without weight")


@pytest.mark.parametrize("rows,n", [(1, 1), (3, 33), (48, 128)])
def test_l2_norm(backend, rows, n):
    r, seed = rng()
    x = r.standard_normal((rows, n)).astype(np.float32)
    assert_close(ops.l2_norm(x, 1e-6, **backend.kw), ref.l2_norm(x, 1e-6), RTOL, seed, "l2_norm")


@pytest.mark.parametrize("T,C,K", [(1, 1, 4), (1, 96, 4), (33, 96, 4), (5, 10240, 4), (7, 65, 2), (3, 17, 6)])
def test_causal_conv(backend, T, C, K):
    r, seed = rng()
    x = r.standard_normal((T, C)).astype(np.float32)
    w = r.standard_normal((C, K)).astype(np.float32) * 0.5
    state = r.standard_normal((K - 1, C)).astype(np.float32)
    y, new_state = ops.causal_conv(x, w, state, **backend.kw)
    y_ref, state_ref = ref.causal_conv(x, w, state)
    assert_close(y, y_ref, RTOL, seed, "causal_conv output")
    # the state is a copy of raw inputs: exact
    assert np.array_equal(new_state, state_ref.astype(np.float32)), f"conv state, seed={seed}"


def _gdn_inputs(r, T, Hk, Hv, S):
    q = ref.l2_norm(r.standard_normal((T, Hk, S)), 1e-6).astype(np.float32)
    k = ref.l2_norm(r.standard_normal((T, Hk, S)), 1e-6).astype(np.float32)
    v = r.standard_normal((T, Hv, S)).astype(np.float32)
    g = -np.abs(r.standard_normal((T, Hv))).astype(np.float32) * 0.5
    beta = (1 / (1 + np.exp(-r.standard_normal((T, Hv))))).astype(np.float32)
    state = (r.standard_normal((Hv, S, S)) * 0.1).astype(np.float32)
    return q, k, v, g, beta, state


@pytest.mark.parametrize(
    "T,Hk,Hv,S",
    [(1, 1, 1, 16), (1, 2, 6, 32), (33, 2, 6, 32), (4, 16, 48, 128), (17, 3, 9, 8), (63, 1, 3, 64)],
)
def test_gated_delta_rule(backend, T, Hk, Hv, S):
    r, seed = rng()
    q, k, v, g, beta, state = _gdn_inputs(r, T, Hk, Hv, S)
    out, new_state = ops.gated_delta_rule(q, k, v, g, beta, state, **backend.kw)
    out_ref, state_ref = ref.gated_delta_rule(q, k, v, g, beta, state)
    assert_close(out, out_ref, 1e-4, seed, "gdn output")
    assert_close(new_state, state_ref, 1e-4, seed, "gdn state")


def test_gated_delta_rule_chunks_equal_whole(backend):
    """Running T tokens at once or in pieces gives the same bits: the state carries everything."""
    r, _ = rng()
    q, k, v, g, beta, state = _gdn_inputs(r, 20, 2, 6, 32)
    whole, s_whole = ops.gated_delta_rule(q, k, v, g, beta, state, **backend.kw)
    s = state
    parts = []
    for a, b in [(0, 1), (1, 8), (8, 20)]:
        o, s = ops.gated_delta_rule(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], s, **backend.kw)
        parts.append(o)
    assert np.array_equal(np.concatenate(parts), whole)
    assert np.array_equal(s, s_whole)


@pytest.mark.parametrize("T,n_heads,D,n_rot", [(1, 1, 2, 2), (5, 6, 32, 16), (3, 24, 256, 64), (7, 2, 64, 64)])
def test_rope_neox(backend, T, n_heads, D, n_rot):
    r, seed = rng()
    x = r.standard_normal((T, n_heads, D)).astype(np.float32)
    pos = r.integers(0, 100000, T).astype(np.int32)
    assert_close(ops.rope_neox(x, pos, n_rot, 1e7, **backend.kw), ref.rope_neox(x, pos, n_rot, 1e7),
                 1e-5, seed, "rope")


@pytest.mark.parametrize(
    "T,n_kv,nh,nkv,D",
    [(1, 1, 1, 1, 8), (1, 40, 6, 1, 32), (5, 33, 6, 1, 32), (4, 65, 24, 4, 256), (3, 20, 12, 4, 16)],
)
def test_attention(backend, T, n_kv, nh, nkv, D):
    """Causal GQA attention, including group ratio 6 (nh 6, nkv 1) and 27B's 24/4."""
    r, seed = rng()
    q = r.standard_normal((T, nh, D)).astype(np.float32)
    kc = r.standard_normal((n_kv, nkv, D)).astype(np.float32)
    vc = r.standard_normal((n_kv, nkv, D)).astype(np.float32)
    pos = np.sort(r.integers(0, n_kv, T)).astype(np.int32)
    assert_close(ops.attention(q, kc, vc, pos, **backend.kw), ref.attention(q, kc, vc, pos), 1e-5, seed,
                 "attention")


def bank_fields(widths, n_nodes):
    """(offset, offset, width) of each field of a factor-bank layer block ([field][node][width]),
    and the block's floats: the gather of an accepted path from one bank into the other."""
    fields, offset = [], 0
    for w in widths:
        fields.append((offset, offset, w))
        offset += n_nodes * w
    return fields, offset


# name: (src_block, dst_floats, dst_block, n_blocks, fields, rows, src_floats)
def gather_cases():
    qwen_fields, qwen_block = bank_fields([16 * 128, 48 * 128, 48, 10240], 6)  # qwen35-27B heads, 48 layers
    small_fields, small_block = bank_fields([2 * 16, 4 * 16, 4, 24], 9)
    replay_src, replay_block = bank_fields([32, 64, 4, 24, 64, 4], 9)  # k, delta, g, x, v, beta
    n = 4  # scratch rows k | v | g | beta | x, each in path order
    replay = [(0, replay_src[0][1], 32), (n * 32, replay_src[4][1], 64), (n * 96, replay_src[2][1], 4),
              (n * 100, replay_src[5][1], 4), (n * 104, replay_src[3][1], 24)]
    return {
        # every layer and field of a side path [0, 4, 5, 8] in one call, the banks' layout
        "banks-side-path": (small_block, 3 * small_block, small_block, 3, small_fields, [0, 4, 5, 8], 3 * small_block),
        "banks-qwen35-27b": (qwen_block, 48 * qwen_block, qwen_block, 48, qwen_fields, [0, 1, 3, 4, 5], 48 * qwen_block),
        "replay-scratch": (replay_block, n * 128, 0, 1, replay, [0, 2, 6, 7], replay_block),
        # rows wider than a GPU block's chunk, odd widths and offsets (no 16-byte alignment), a row
        # taken twice, gaps left between blocks
        "wide-unaligned": (6000, 2 * 9000 + 5, 9000, 2, [(1, 7, 1029), (5147, 3, 3), (3 * 1029 + 2, 11, 1)],
                           [3, 0, 3], 2 * 6000 + 7 + 4 * 1029),
        "one-float": (0, 1, 0, 1, [(0, 0, 1)], [0], 1),
    }


@pytest.mark.parametrize("case", list(gather_cases()))
def test_gather_rows(backend, case):
    """Bit for bit on every backend, against the numpy oracle and the CPU backend (the oracle op):
    the sources are random 32-bit words (NaN payloads, infinities, subnormals, -0 among them), the
    destination starts NaN-poisoned and must keep NaN wherever no row lands."""
    src_block, dst_floats, dst_block, n_blocks, fields, rows, src_floats = gather_cases()[case]
    r, seed = rng()
    src = r.integers(0, 2**32, src_floats, dtype=np.uint32).view(np.float32)
    args = (src, src_block, dst_floats, dst_block, n_blocks, fields, rows)
    got = ops.gather_rows(*args, **backend.kw)
    want = ref.gather_rows(*args)
    written = ~np.isnan(ref.gather_rows(np.zeros_like(src), *args[1:]))
    assert written.any() and (~written).sum() == dst_floats - n_blocks * len(rows) * sum(f[2] for f in fields)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"{case}: differs from the oracle, seed={seed}"
    on_cpu = ops.gather_rows(*args, device="cpu", cpu_kernels="scalar")
    assert np.array_equal(got.view(np.uint32), on_cpu.view(np.uint32)), f"{case}: differs from the CPU, seed={seed}"


def test_gather_rows_refuses_bad_segments():
    src = np.zeros(64, np.float32)
    with pytest.raises(NativeError, match="destination segments overlap at dst\\[8\\]"):
        ops.gather_rows(src, 0, 64, 0, 1, [(0, 0, 4), (8, 0, 4)], [0, 1, 2])  # rows 0..12 and 8..20
    with pytest.raises(NativeError, match="destination segments overlap"):
        ops.gather_rows(src, 16, 64, 4, 2, [(0, 0, 8)], [0])  # block 0's row 0..8 meets block 1's at 4
    with pytest.raises(NativeError, match="passes the end of src"):
        ops.gather_rows(src, 0, 64, 0, 1, [(0, 0, 8)], [8])  # row 8 of 8 floats ends at 72 > 64
    with pytest.raises(NativeError, match="pass the end of dst"):
        ops.gather_rows(src, 0, 16, 0, 1, [(0, 0, 8)], [0, 1, 2])
    with pytest.raises(NativeError, match="rows\\[1\\] = -1 is negative"):
        ops.gather_rows(src, 0, 16, 0, 1, [(0, 0, 4)], [0, -1])
    with pytest.raises(NativeError, match="n_fields = 9 > 8"):
        ops.gather_rows(src, 0, 64, 0, 1, [(i, 0, 1) for i in range(9)], [0])
    with pytest.raises(NativeError, match="widths\\[0\\] = 0 must be > 0"):
        ops.gather_rows(src, 0, 16, 0, 1, [(0, 0, 0)], [0])


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(NativeError, match="gated_delta_rule"):
        x = np.zeros((1, 2, 8), np.float32)
        ops.gated_delta_rule(x, x, np.zeros((1, 3, 8), np.float32), np.zeros((1, 3), np.float32),
                             np.zeros((1, 3), np.float32), np.zeros((3, 8, 8), np.float32))  # Hv 3 % Hk 2 != 0
    with pytest.raises(NativeError, match="attention"):
        q = np.zeros((1, 4, 8), np.float32)
        c = np.zeros((2, 1, 8), np.float32)
        ops.attention(q, c, c, [5])  # position beyond the cache
    with pytest.raises(NativeError, match="rope"):
        ops.rope_neox(np.zeros((1, 1, 8), np.float32), [0], 3, 1e4)  # odd rotated dims
