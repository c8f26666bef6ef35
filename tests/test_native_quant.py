"""Native dequantization and quantized matmul against independent oracles, on every CPU kernel set.

- dequantization == gguf.quants.dequantize BIT FOR BIT (both kernel sets), on random blocks and on
  blocks written by the project's encoder (pyspecla.testing.quant);
- 8-bit activation blocks (Q8_0 / Q4_0 / Q5_0 / Q4_K / Q6_K weights) == the numpy quantizer in
  pyspecla.reference.ops BIT FOR BIT (codes and scales), zero, NaN and infinite blocks included;
- matmul == float64 numpy (gguf-dequantized W times the activations the kernel sees: x itself, or
  its 8-bit blocks; Q5_K takes floats on the CPU and Q8_K blocks on the GPU) within 1e-5 of each
  element's sum |W||x|, outputs NaN-poisoned before every
  call (pyspecla.ops does that);
- batch invariance: row b of y is the same bits whatever n_batch (and the 64-row grouping) is, and
  whatever the thread count is;
- the scalar oracle and the AVX2 kernels agree bit for bit on the 8-bit-activation types (integer
  dot products, the same float operations) and within the tolerance on the others;
- bad arguments come back as an error status whose message names the op.
Inputs are fresh each run (seeded from entropy); the seed is in every assertion message."""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import seeded_rng
from llama_oracle import cpu_flags

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # noqa: E402
from gguf import quants as gguf_quants  # noqa: E402

from pyspecla import _native, ops  # noqa: E402
from pyspecla.reference import ops as ref_ops  # noqa: E402
from pyspecla._native import float_ptr, lib  # noqa: E402

T = GGMLQuantizationType
LEGACY_TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1]
ALL_TYPES = [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, *LEGACY_TYPES]
QUANT_TYPES = [T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, *LEGACY_TYPES]
# byte offsets of the f16 scale fields inside a block (kept finite in random blocks)
F16_FIELDS = {T.Q8_0: [0], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
              T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2]}
MATMUL_TOL = 1e-5
QK_K = 256


def fresh_rng():
    return seeded_rng()  # fresh each session, reproducible (conftest.seeded_rng)


# weight types the CUDA matmul does not take yet (their models are refused on the GPU by name)
CUDA_MATMUL_MISSING = {T.Q4_1, T.Q5_1}
# weight types whose activations the CUDA matmul rounds to Q8_K blocks where the CPU multiplies
# floats (native/backends/cuda/matmul_blocks.h, mm_act_kind): the oracle sees what each one sees
CUDA_Q8_K_ONLY = {T.Q5_K}


def skip_unsupported_on_backend(backend, qtype, n_in=None):
    if backend.device == "cuda" and qtype in CUDA_MATMUL_MISSING:
        pytest.skip(f"the CUDA matmul has no {qtype.name} kernel yet")
    if backend.device == "cuda" and n_in is not None and n_in % 32:
        # the GPU float kernels take rows in blocks of 32 (every model matrix has such rows)
        pytest.skip(f"the CUDA matmul takes {qtype.name} rows of a multiple of 32 elements, not {n_in}")


def skip_unless_available(cpu_kernels):
    cpu_kernels = getattr(cpu_kernels, "cpu_kernels", cpu_kernels)  # a Backend of the cross-backend axis
    best = _native.cpu_best_kernels()
    if cpu_kernels == "avx2" and best < _native.CPU_AVX2:
        pytest.skip("this CPU has no AVX2/FMA/F16C")
    if cpu_kernels == "avx512" and best < _native.CPU_AVX512:
        pytest.skip("this CPU has no AVX-512 F/BW/VL + VNNI")


def finite_halves(r, count, scale=None) -> np.ndarray:
    """count finite f16 values as uint8 pairs: any finite bit pattern (subnormals, 65504, ±0), or
    normal(0, scale) values when scale is given."""
    if scale is None:
        bits = r.integers(0, 1 << 16, count, dtype=np.uint16)
        bits = np.where((bits & 0x7C00) == 0x7C00, bits & 0x83FF, bits).astype(np.uint16)  # inf/nan -> finite
    else:
        bits = (r.standard_normal(count) * scale).astype(np.float16).view(np.uint16)
    return bits.view(np.uint8).reshape(count, 2)


def random_blocks(r, qtype, n_rows, n_cols, scale=None) -> np.ndarray:
    """Raw bytes (n_rows, row_bytes) of a random tensor: random block bytes, f16 fields finite.
    F32/F16/BF16 get finite values (normal * scale) when scale is given, any bit pattern otherwise."""
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    n_blocks = n_rows * n_cols // block
    if qtype in (T.F32, T.F16, T.BF16):
        if scale is None:
            return r.integers(0, 256, (n_rows, n_cols * block_bytes), dtype=np.uint8)
        values = (r.standard_normal((n_rows, n_cols)) * scale).astype(np.float32)
        if qtype == T.F16:
            return values.astype(np.float16).view(np.uint8)
        if qtype == T.BF16:
            return (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        return values.view(np.uint8)
    raw = r.integers(0, 256, (n_blocks, block_bytes), dtype=np.uint8)
    for offset in F16_FIELDS[qtype]:
        raw[:, offset:offset + 2] = finite_halves(r, n_blocks, scale)
    return raw.reshape(n_rows, -1)


def reference_dequantize(raw: np.ndarray, qtype) -> np.ndarray:
    return gguf_quants.dequantize(np.ascontiguousarray(raw), qtype)


def assert_same_bits(actual, expected, what):
    a = np.ascontiguousarray(actual, dtype=np.float32).reshape(-1).view(np.uint32)
    e = np.ascontiguousarray(expected, dtype=np.float32).reshape(-1).view(np.uint32)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
    bad = np.flatnonzero(a != e)
    assert bad.size == 0, (f"{what}: {bad.size} of {a.size} elements differ, first at {bad[0]}: "
                           f"{a[bad[0]]:#010x} != {e[bad[0]]:#010x}")


# --------------------------------------------------------------------------------------------------
# dequantization: bit-exact against gguf


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_dequantize_random_blocks_bit_exact(backend, qtype):
    skip_unless_available(backend)
    r, seed = fresh_rng()
    block = GGML_QUANT_SIZES[qtype][0]
    n = block * (37 if block > 1 else 4099)  # odd counts: no 8-lane alignment for F16/BF16/F32 tails
    raw = random_blocks(r, qtype, 1, n)
    out = ops.dequantize(raw, qtype, n, **backend.kw)
    assert_same_bits(out, reference_dequantize(raw, qtype).reshape(-1), f"{qtype.name} seed={seed}")


@pytest.mark.parametrize("qtype", [T.F16, T.BF16], ids=lambda t: t.name)
def test_dequantize_every_16_bit_pattern(backend, qtype):
    """All 65536 halves / bfloat16s, NaN payloads and subnormals included."""
    skip_unless_available(backend)
    raw = np.arange(1 << 16, dtype=np.uint16).view(np.uint8)
    out = ops.dequantize(raw, qtype, 1 << 16, **backend.kw)
    assert_same_bits(out, reference_dequantize(raw, qtype), qtype.name)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_dequantize_encoder_blocks_bit_exact(backend, qtype):
    skip_unless_available(backend)
    quant = pytest.importorskip("pyspecla.testing.quant")
    r, seed = fresh_rng()
    block = GGML_QUANT_SIZES[qtype][0]
    n = 16 * max(block, 32)
    data = r.standard_normal((4, n)).astype(np.float32) * np.array([1e-3, 0.1, 1.0, 30.0], np.float32)[:, None]
    data[1, : n // 2] = 0.0  # all-zero blocks
    data[2] += 0.5  # offsets: the K-quant mins at work
    raw = quant.quantize(data, qtype)
    out = ops.dequantize(raw, qtype, data.size, **backend.kw)
    assert_same_bits(out, reference_dequantize(raw, qtype).reshape(-1), f"{qtype.name} encoder seed={seed}")


# --------------------------------------------------------------------------------------------------
# matmul against float64 numpy


def row_length(qtype, kind: str) -> int:
    """'a' / 'b': two row lengths per type that exercise whole 256-element chunks plus a partial one."""
    block = GGML_QUANT_SIZES[qtype][0]
    if block == QK_K:
        return {"a": 512, "b": 768}[kind]
    if block == 32:
        return {"a": 96, "b": 288}[kind]  # Q8_0 / Q4_0 … Q5_1: 3 blocks; one 256 chunk + one block
    return {"a": 37, "b": 300}[kind]  # F32/F16/BF16: ragged tails of 5 and 44 elements


MATMUL_SHAPES = [  # (row kind, n_out, n_batch)
    ("a", 7, 1),
    ("b", 33, 1),
    ("b", 33, 3),
    ("a", 33, 33),
    ("b", 7, 64),
    ("a", 7, 65),
]


INT8_TYPES = [T.Q8_0, T.Q4_0, T.Q5_0, T.Q4_K, T.Q6_K]  # activations rounded to 8-bit blocks


def activations_seen(qtype, x, device="cpu"):
    """What the kernel multiplies: x, or for INT8_TYPES (and CUDA_Q8_K_ONLY on the GPU) its 8-bit
    blocks (code * scale) from the numpy quantizer."""
    x64 = x.astype(np.float64)
    if device == "cuda" and qtype in CUDA_Q8_K_ONLY:
        qtype = T.Q4_K  # the same Q8_K blocks
    if qtype not in INT8_TYPES:
        return x64
    codes, scales = ref_ops.quantize_activations(x, qtype)
    block = x.shape[1] // scales.shape[1]
    return (codes.reshape(len(x), -1, block) * scales.astype(np.float64)[..., None]).reshape(x.shape)


def matmul_oracle(raw, qtype, n_in, n_out, x, device="cpu"):
    w = reference_dequantize(raw, qtype).reshape(n_out, n_in).astype(np.float64)
    seen = activations_seen(qtype, x, device)
    return seen @ w.T, np.abs(seen) @ np.abs(w).T


def assert_matmul_close(y, expected, magnitude, what):
    assert np.isfinite(y).all(), f"{what}: non-finite output (unwritten element?)"
    err = np.abs(y.astype(np.float64) - expected)
    bound = MATMUL_TOL * magnitude + 1e-30
    worst = np.unravel_index(np.argmax(err / bound), err.shape)
    assert (err <= bound).all(), (f"{what}: error {err[worst]:.3e} at {worst} exceeds "
                                  f"{MATMUL_TOL} * sum|W||x| = {bound[worst]:.3e}")


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("kind,n_out,n_batch", MATMUL_SHAPES)
def test_matmul_matches_numpy(backend, qtype, kind, n_out, n_batch):
    skip_unless_available(backend)
    n_in = row_length(qtype, kind)
    skip_unsupported_on_backend(backend, qtype, n_in)
    r, seed = fresh_rng()
    raw = random_blocks(r, qtype, n_out, n_in, scale=0.05)
    x = r.standard_normal((n_batch, n_in)).astype(np.float32)
    y = ops.matmul(raw, qtype, n_in, n_out, x, **backend.kw)
    expected, magnitude = matmul_oracle(raw, qtype, n_in, n_out, x, backend.device)
    assert_matmul_close(y, expected, magnitude,
                        f"{qtype.name} {n_out}x{n_in} n_batch={n_batch} {backend.name} seed={seed}")


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_matmul_batch_invariant(backend, qtype):
    """Row b of y has the same bits for n_batch = 1, 17, 64 and 130 (three groups of <= 64), and for
    1 or 2 threads."""
    skip_unless_available(backend)
    skip_unsupported_on_backend(backend, qtype, row_length(qtype, "b"))
    r, seed = fresh_rng()
    n_in, n_out = row_length(qtype, "b"), 67  # big enough to run on both threads
    raw = random_blocks(r, qtype, n_out, n_in, scale=0.05)
    x = r.standard_normal((130, n_in)).astype(np.float32)

    def mm(rows, n_threads=2):
        return ops.matmul(raw, qtype, n_in, n_out, x[rows], n_threads=n_threads, **backend.kw)

    y130 = mm(slice(0, 130))
    y64, y17 = mm(slice(0, 64)), mm(slice(0, 17))
    for b in (0, 1, 16, 17, 63, 64, 65, 127, 129):
        y1 = mm(slice(b, b + 1), n_threads=1)
        what = f"{qtype.name} {backend.name} row {b} seed={seed}"
        assert_same_bits(y130[b], y1[0], f"{what}: n_batch=130 vs 1")
        if b < 64:
            assert_same_bits(y64[b], y1[0], f"{what}: n_batch=64 vs 1")
        if b < 17:
            assert_same_bits(y17[b], y1[0], f"{what}: n_batch=17 vs 1")
    assert_same_bits(mm(slice(0, 64), n_threads=1), y64, f"{qtype.name} {backend.name}: 1 vs 2 threads seed={seed}")


@pytest.mark.parametrize("simd", ["avx2", "avx512"])
@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_matmul_scalar_and_simd_agree(qtype, simd):
    skip_unless_available(simd)
    r, seed = fresh_rng()
    for n_in, n_batch in ((row_length(qtype, "b"), 5), (row_length(qtype, "a"), 1), (row_length(qtype, "b"), 70)):
        n_out = 45
        raw = random_blocks(r, qtype, n_out, n_in, scale=0.05)
        x = r.standard_normal((n_batch, n_in)).astype(np.float32)
        y_scalar = ops.matmul(raw, qtype, n_in, n_out, x, cpu_kernels="scalar")
        y_simd = ops.matmul(raw, qtype, n_in, n_out, x, cpu_kernels=simd)
        what = f"{qtype.name} {simd} vs scalar n_batch={n_batch} seed={seed}"
        if qtype in INT8_TYPES:  # the same integers and float operations: the same bits
            assert_same_bits(y_simd, y_scalar, what)
        elif simd == "avx512":  # float-activation types: the avx512 set runs the avx2 kernel
            assert_same_bits(y_simd, ops.matmul(raw, qtype, n_in, n_out, x, cpu_kernels="avx2"), what)
        _, magnitude = matmul_oracle(raw, qtype, n_in, n_out, x)
        assert_matmul_close(y_simd, y_scalar.astype(np.float64), magnitude, what)


def activation_rows(r, n):
    """Rows that stress the activation quantizer: normal, huge, tiny (subnormal products), a row
    whose largest magnitude is negative, exact ties (x * 127 / amax = k + 0.5), zero blocks, and
    blocks with a NaN / +inf / -inf."""
    rows = [r.standard_normal(n) * 3, r.standard_normal(n) * 1e30, r.standard_normal(n) * 1e-38,
            -np.abs(r.standard_normal(n)), np.zeros(n)]
    tie = np.full(n, 0.5 / 127 * 254)  # amax = 2: 1.0 * 127 / 2 = 63.5, a tie
    tie[::7] = 2.0
    tie[1::5] = -1.0
    rows.append(tie)
    rows.append(np.round(r.standard_normal(n) * 8) / 8)
    bad = r.standard_normal((3, n))
    bad[0, 5], bad[1, n - 1], bad[2, 40] = np.nan, np.inf, -np.inf
    bad[2, :32] = 0.0
    return np.vstack([np.array(rows), bad]).astype(np.float32)


@pytest.mark.parametrize("qtype", INT8_TYPES, ids=lambda t: t.name)
def test_activation_blocks_match_numpy(backend, qtype):
    skip_unless_available(backend)
    r, seed = fresh_rng()
    x = activation_rows(r, 512)
    codes, scales = ops.quantize_activations(x, qtype, **backend.kw)
    want_codes, want_scales = ref_ops.quantize_activations(x, qtype)
    what = f"{qtype.name} {backend.name} seed={seed}"
    assert np.array_equal(codes, want_codes), f"{what}: codes differ at {np.argwhere(codes != want_codes)[:5]}"
    assert_same_bits(scales, want_scales, f"{what}: scales")
    assert (np.abs(codes.astype(np.int32)) <= 127).all(), f"{what}: a code outside [-127, 127]"
    assert np.isnan(scales[-3:]).any(axis=1).all(), f"{what}: a non-finite block must get scale NaN"
    assert (scales[4] == 0).all() and (codes[4] == 0).all(), f"{what}: zero rows give scale 0, codes 0"
    # What the codes mean: code * scale is x within half a step (plus the fp16 rounding of a Q8_0
    # scale). Q8_0 scales are fp16 as in llama.cpp, so rows beyond its range (1e30: scale inf, 1e-38:
    # scale 0) only keep their codes' meaning for Q8_K; rows of ~1e-38 (the inverse scale overflows)
    # are stored as zero by both.
    rows = [0, 3, 4, 5, 6] if qtype in (T.Q8_0, T.Q4_0, T.Q5_0) else [0, 1, 3, 4, 5, 6]
    assert (codes[2] == 0).all() and (scales[2] == 0).all(), f"{what}: a ~1e-38 row is stored as zero"
    block = x.shape[1] // scales.shape[1]
    xr = x[rows].astype(np.float64).reshape(len(rows), -1, block)
    seen = codes[rows].reshape(xr.shape) * scales[rows].astype(np.float64)[..., None]
    step = np.abs(scales[rows]).astype(np.float64)[..., None]
    assert (np.abs(seen - xr) <= 0.5 * step + np.abs(xr) * 1e-3).all(), what
    if block == 32:
        assert np.isinf(scales[1]).any(), f"{what}: fp16 scale range"


def test_matmul_nonfinite_activation_propagates():
    """A NaN or an infinity in x must show in y (not vanish into a zero code)."""
    r, seed = fresh_rng()
    for qtype in INT8_TYPES:
        n_in = 256
        raw = random_blocks(r, qtype, 5, n_in, scale=0.05)
        x = r.standard_normal((3, n_in)).astype(np.float32)
        x[1, 17] = np.inf
        for kernels in ("scalar", "avx2", "avx512"):
            if _native.cpu_best_kernels() < _native.CPU_KERNELS[kernels]:
                continue
            y = ops.matmul(raw, qtype, n_in, 5, x, cpu_kernels=kernels)
            assert np.isfinite(y[[0, 2]]).all() and np.isnan(y[1]).all(), f"{qtype.name} {kernels} seed={seed}"


def test_matmul_wide_rows_q4_k_q6_k():
    """Model-sized rows (3584 inputs, 14 chunks) on the default kernels, n_batch 1 and 4."""
    r, seed = fresh_rng()
    for qtype in (T.Q4_K, T.Q6_K):
        n_in, n_out = 3584, 40
        raw = random_blocks(r, qtype, n_out, n_in, scale=0.02)
        for n_batch in (1, 4):
            x = r.standard_normal((n_batch, n_in)).astype(np.float32)
            y = ops.matmul(raw, qtype, n_in, n_out, x)
            expected, magnitude = matmul_oracle(raw, qtype, n_in, n_out, x)
            assert_matmul_close(y, expected, magnitude, f"{qtype.name} wide n_batch={n_batch} seed={seed}")


@pytest.mark.parametrize("qtype", LEGACY_TYPES, ids=lambda t: t.name)
def test_matmul_legacy_qwen_sized_rows(cpu_kernels, qtype):
    """Rows of the Qwen2.5 0.5B draft: 896 inputs (three 256 chunks + a 128-element one) and 4864
    (19 chunks); n_batch 1 and 5 give the same bits."""
    skip_unless_available(cpu_kernels)
    r, seed = fresh_rng()
    for n_in, n_out in ((896, 9), (4864, 3)):
        raw = random_blocks(r, qtype, n_out, n_in, scale=0.02)
        x = r.standard_normal((5, n_in)).astype(np.float32)
        y5 = ops.matmul(raw, qtype, n_in, n_out, x, cpu_kernels=cpu_kernels)
        y1 = ops.matmul(raw, qtype, n_in, n_out, x[3:4], cpu_kernels=cpu_kernels)
        expected, magnitude = matmul_oracle(raw, qtype, n_in, n_out, x)
        what = f"{qtype.name} {n_out}x{n_in} {cpu_kernels} seed={seed}"
        assert_matmul_close(y5, expected, magnitude, what)
        assert_same_bits(y1[0], y5[3], f"{what}: n_batch 1 vs 5")


# --------------------------------------------------------------------------------------------------
# bad arguments: a status and a message naming the op, never a crash


def options(cpu_kernels=0, n_threads=1):
    return ctypes.byref(_native.OpOptions(n_threads, cpu_kernels))


def expect_error(status, op, *fragments, code=_native.ERR_INVALID_ARGUMENT):
    message = _native.last_error()
    assert status == code, f"expected status {code}, got {status} ({message!r})"
    assert op in message, message
    for fragment in fragments:
        assert fragment in message, message


def test_dequantize_bad_arguments():
    src = np.zeros(1024, np.uint8)
    dst = np.zeros(256, np.float32)
    op = "specla_op_dequantize"
    expect_error(lib.specla_op_dequantize(options(), 10, src.ctypes.data, 256, float_ptr(dst)), op, "type 10",
                 code=_native.ERR_UNSUPPORTED)  # Q2_K: not supported
    expect_error(lib.specla_op_dequantize(options(), 999, src.ctypes.data, 32, float_ptr(dst)), op,
                 code=_native.ERR_UNSUPPORTED)
    expect_error(lib.specla_op_dequantize(options(), int(T.Q4_K), src.ctypes.data, 100, float_ptr(dst)), op, "100")
    expect_error(lib.specla_op_dequantize(options(), int(T.Q8_0), src.ctypes.data, 0, float_ptr(dst)), op)
    expect_error(lib.specla_op_dequantize(options(), int(T.Q8_0), None, 32, float_ptr(dst)), op, "src")
    expect_error(lib.specla_op_dequantize(options(), int(T.Q8_0), src.ctypes.data, 32, None), op, "dst")
    expect_error(lib.specla_op_dequantize(options(cpu_kernels=7), int(T.Q8_0), src.ctypes.data, 32,
                                          float_ptr(dst)), op, "7")
    for kernels, name in ((_native.CPU_AVX2, "AVX2"), (_native.CPU_AVX512, "AVX512")):
        if _native.cpu_best_kernels() < kernels:  # a kernel set this CPU lacks is refused, by name
            expect_error(lib.specla_op_dequantize(options(cpu_kernels=kernels), int(T.Q8_0), src.ctypes.data,
                                                  32, float_ptr(dst)), op, name, code=_native.ERR_UNSUPPORTED)
    # NULL options mean defaults
    assert lib.specla_op_dequantize(None, int(T.Q8_0), src.ctypes.data, 32, float_ptr(dst)) == _native.OK


def test_matmul_bad_arguments():
    raw = np.zeros((4, 144), np.uint8)  # four Q4_K rows of 256
    x = np.zeros((2, 256), np.float32)
    y = np.zeros((2, 4), np.float32)
    op = "specla_op_matmul"

    def call(w, n_batch=2, x_ptr=float_ptr(x), y_ptr=float_ptr(y), opts=None):
        return lib.specla_op_matmul(opts if opts is not None else options(), w, x_ptr, n_batch, y_ptr)

    good = _native.tensor_struct(raw, int(T.Q4_K), 256, 4)
    assert call(good) == _native.OK
    assert np.array_equal(y, np.zeros_like(y))
    expect_error(call(_native.Tensor(raw.ctypes.data, int(T.Q4_K), 256, 4, 0, 144 * 3)), op, "nbytes", "576")
    expect_error(call(_native.Tensor(raw.ctypes.data, int(T.Q4_K), 128, 4, 0, 144 * 4)), op, "ne0", "128")
    expect_error(call(_native.Tensor(raw.ctypes.data, int(T.Q4_K), 256, 0, 0, 0)), op, "ne1")
    expect_error(call(_native.Tensor(raw.ctypes.data, 11, 256, 4, 0, 144 * 4)), op, "type 11",
                 code=_native.ERR_UNSUPPORTED)  # Q3_K: not supported
    expect_error(call(_native.Tensor(None, int(T.Q4_K), 256, 4, 0, 144 * 4)), op, "data")
    expect_error(call(good, n_batch=0), op, "n_batch")
    expect_error(call(good, x_ptr=None), op, "x")
    expect_error(call(good, y_ptr=None), op, "y")
    expect_error(lib.specla_op_matmul(options(), None, float_ptr(x), 2, float_ptr(y)), op, "w")
    expect_error(call(good, opts=options(cpu_kernels=-1)), op, "-1")


def test_other_ops_bad_arguments():
    a = np.zeros(4096, np.float32)
    p = float_ptr(a)
    pos = np.array([0, 1, 5], np.int32)
    pos_p = _native.int32_ptr(pos)
    expect_error(lib.specla_op_rms_norm(options(), None, None, 1, 8, 1e-6, p), "specla_op_rms_norm", "x")
    expect_error(lib.specla_op_rms_norm(options(), p, None, 1, 0, 1e-6, p), "specla_op_rms_norm", "n")
    expect_error(lib.specla_op_rms_norm(options(), p, None, 1, 8, float("nan"), p), "specla_op_rms_norm", "eps")
    expect_error(lib.specla_op_l2_norm(options(), p, -1, 8, 1e-6, p), "specla_op_l2_norm", "n_rows")
    expect_error(lib.specla_op_causal_conv(options(), p, p, 1, 8, 4, None, p), "specla_op_causal_conv",
                 "conv_state")
    expect_error(lib.specla_op_causal_conv(options(), p, p, 1, 0, 4, p, p), "specla_op_causal_conv", "C")
    expect_error(lib.specla_op_gated_delta_rule(options(), p, p, p, p, p, 1, 2, 3, 8, p, p),
                 "specla_op_gated_delta_rule", "Hv = 3", "Hk = 2")
    expect_error(lib.specla_op_gated_delta_rule(options(), p, p, p, p, None, 1, 1, 1, 8, p, p),
                 "specla_op_gated_delta_rule", "beta")
    expect_error(lib.specla_op_rope_neox(options(), p, pos_p, 3, 2, 8, 5, 1e4), "specla_op_rope_neox", "n_rot = 5")
    expect_error(lib.specla_op_rope_neox(options(), p, pos_p, 3, 2, 8, 10, 1e4), "specla_op_rope_neox", "10")
    expect_error(lib.specla_op_rope_neox(options(), p, pos_p, 3, 2, 8, 8, 0.0), "specla_op_rope_neox", "freq_base")
    expect_error(lib.specla_op_attention(options(), p, p, p, pos_p, 3, 8, 6, 4, 8, p), "specla_op_attention",
                 "nh = 6", "nkv = 4")
    expect_error(lib.specla_op_attention(options(), p, p, p, pos_p, 3, 5, 4, 2, 8, p), "specla_op_attention",
                 "positions[2] = 5", "5)")
    expect_error(lib.specla_op_attention(options(), p, p, None, pos_p, 3, 8, 4, 2, 8, p), "specla_op_attention",
                 "v_cache")


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo") or platform.machine() != "x86_64",
                    reason="reads x86 flags from /proc/cpuinfo")
def test_cpu_best_kernels_follow_the_cpu_flags():
    flags = cpu_flags()
    avx2 = {"avx2", "fma", "f16c"} <= flags
    avx512 = avx2 and {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= flags
    expected = _native.CPU_AVX512 if avx512 else _native.CPU_AVX2 if avx2 else _native.CPU_SCALAR
    assert _native.cpu_best_kernels() == expected


def test_cuda_device_count_sees_no_device_when_none_is_visible():
    """With CUDA_VISIBLE_DEVICES empty the count must be 0 (a CPU-only build says 0 anyway); without
    it, at most the devices the driver lists."""
    code = "from pyspecla import _native; print(_native.cuda_device_count())"
    hidden = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert hidden.returncode == 0 and hidden.stdout.strip() == "0", hidden.stdout + hidden.stderr
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True) if shutil.which("nvidia-smi") else None
    n_listed = listed.stdout.count("GPU ") if listed is not None and listed.returncode == 0 else 0
    assert 0 <= _native.cuda_device_count() <= n_listed
