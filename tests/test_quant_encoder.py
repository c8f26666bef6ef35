"""pyspecla.testing.quant encoder: layout against gguf's decoder, error bounds, a literal llama.cpp oracle.

Three independent witnesses: gguf.quants.dequantize (the decoder everyone else uses), a scalar
packer written line by line from docs/qwen35.md §4 for hand-built blocks, and a slow per-block
transcription of llama.cpp's quantize_row_q{4,5,6}_K_ref that the fast encoder must match."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gguf_quants

from pyspecla.testing import quant
from pyspecla.errors import UsageError

LEGACY_TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1]
QUANT_TYPES = [T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, *LEGACY_TYPES]
BLOCK = {T.Q8_0: (32, 34), T.Q4_K: (256, 144), T.Q5_K: (256, 176), T.Q6_K: (256, 210),
         T.Q4_0: (32, 18), T.Q4_1: (32, 20), T.Q5_0: (32, 22), T.Q5_1: (32, 24)}

# Relative RMS error bounds, per distribution. Measured maxima over 5 seeds × the shapes below:
# Q8_0 .0062/.0041/.0131, Q4_K .084/.058/.100, Q5_K .039/.030/.053, Q6_K .019/.014/.039
# (gaussian/uniform/outliers); llama.cpp's own quantizers land within ~2 % of these. The legacy
# types are llama.cpp's (gguf's) quantizers exactly: Q4_0 .093/.068/.149, Q4_1 .084/.065/.181,
# Q5_0 .046/.033/.094, Q5_1 .040/.032/.076.
ERROR_BOUND = {
    "gaussian": {T.Q8_0: 0.01, T.Q4_K: 0.12, T.Q5_K: 0.06, T.Q6_K: 0.03,
                 T.Q4_0: 0.12, T.Q4_1: 0.11, T.Q5_0: 0.06, T.Q5_1: 0.055},
    "uniform": {T.Q8_0: 0.01, T.Q4_K: 0.12, T.Q5_K: 0.06, T.Q6_K: 0.03,
                T.Q4_0: 0.09, T.Q4_1: 0.09, T.Q5_0: 0.045, T.Q5_1: 0.045},
    "outliers": {T.Q8_0: 0.02, T.Q4_K: 0.14, T.Q5_K: 0.08, T.Q6_K: 0.06,
                 T.Q4_0: 0.19, T.Q4_1: 0.23, T.Q5_0: 0.12, T.Q5_1: 0.10},
}


def relative_rms(approx, exact):
    return float(np.sqrt(np.mean((approx - exact) ** 2) / np.mean(exact ** 2)))


def sample(distribution, shape, rng):
    if distribution == "gaussian":
        x = rng.standard_normal(shape)
    elif distribution == "uniform":
        x = rng.uniform(-1, 1, shape)
    else:  # 1% of elements 50x larger, the shape that makes per-block scales matter
        x = rng.standard_normal(shape)
        x[rng.random(shape) < 0.01] *= 50
    return (x * rng.uniform(0.01, 10)).astype(np.float32)


def round_trip(x, qtype):
    raw = quant.quantize(x, qtype)
    block, block_bytes = BLOCK[qtype]
    assert raw.dtype == np.uint8
    assert raw.shape == (*x.shape[:-1], x.shape[-1] // block * block_bytes)
    y = gguf_quants.dequantize(raw, qtype)
    assert y.shape == x.shape
    assert np.isfinite(y).all()
    return raw, y


# --------------------------------------------------------------------------------------------
# error bounds on fresh random data


@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("distribution", ["gaussian", "uniform", "outliers"])
@pytest.mark.parametrize("shape", [(1, 256), (7, 512), (3, 2816)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_error_bound(qtype, distribution, shape, seed):
    rng = np.random.default_rng([seed, QUANT_TYPES.index(qtype), shape[1]])
    x = sample(distribution, shape, rng)
    _, y = round_trip(x, qtype)
    for row in range(shape[0]):
        assert relative_rms(y[row], x[row]) < ERROR_BOUND[distribution][qtype], (row, qtype.name)


# Tighter bounds on a large sample guard the scale search itself: the plain min/max fit alone
# gives Q4_K 0.078 / Q5_K 0.038; the default grids 0.0719 / 0.0362 / 0.0177 (Q6_K);
# llama.cpp's full search ≈ 0.0715 / 0.0361 / 0.0177.
# Legacy types (measured 0.0859 / 0.0782 / 0.0427 / 0.0379): one scale per 32 elements.
@pytest.mark.parametrize("qtype,bound", [(T.Q4_K, 0.0735), (T.Q5_K, 0.0370), (T.Q6_K, 0.0182),
                                         (T.Q8_0, 0.0056), (T.Q4_0, 0.0870), (T.Q4_1, 0.0795),
                                         (T.Q5_0, 0.0435), (T.Q5_1, 0.0385)],
                         ids=lambda v: getattr(v, "name", v))
def test_error_on_large_gaussian_sample(qtype, bound):
    x = np.random.default_rng(7).standard_normal((64, 4096)).astype(np.float32)
    _, y = round_trip(x, qtype)
    assert relative_rms(y, x) < bound


@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_zero_and_constant_rows(qtype):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 512)).astype(np.float32)
    x[0] = 0
    x[1] = 0.75
    x[2] = -3.5
    x[3, :256] = 1e-3  # one constant block next to a random one
    x[4, 256:] = 0
    x[5] = 1.0 + np.linspace(0, 1e-4, 512, dtype=np.float32)  # all elements on one level
    x[6] = 1e-30  # below every scale's f16 range: decodes to 0, never to NaN/inf
    _, y = round_trip(x, qtype)
    assert (y[0] == 0).all()
    assert (y[4, 256:] == 0).all()
    for row, value in [(1, 0.75), (2, -3.5), (5, 1.0)]:
        np.testing.assert_allclose(y[row], x[row], rtol=2e-3, err_msg=f"row {row}")
    np.testing.assert_allclose(y[3, :256], 1e-3, rtol=0.06)  # the f16 scale is subnormal here
    assert np.abs(y[6]).max() <= 1e-30
    assert relative_rms(y[7], x[7]) < ERROR_BOUND["gaussian"][qtype]


# --------------------------------------------------------------------------------------------
# shapes, dtypes, tiling


@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_layout_independent_of_shape_dtype_and_tiling(qtype, monkeypatch):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((5, 768)).astype(np.float32)
    expected = quant.quantize(x, qtype)

    one_d = quant.quantize(x.reshape(-1), qtype)
    assert one_d.shape == (expected.size,)
    assert np.array_equal(one_d, expected.reshape(-1))
    assert np.array_equal(quant.quantize(x.reshape(5, 1, 768), qtype), expected.reshape(5, 1, -1))
    assert np.array_equal(quant.quantize(np.asfortranarray(x), qtype), expected)
    assert np.array_equal(quant.quantize(x.astype(np.float64), qtype), expected)
    wide = np.zeros((5, 2 * 768), np.float32)
    wide[:, ::2] = x
    assert np.array_equal(quant.quantize(wide[:, ::2], qtype), expected)  # strided view

    # tiles smaller than a row (a row split across tiles) and spanning several rows
    for tile in (256, 1024, 4096):
        monkeypatch.setattr(quant, "_TILE_ELEMENTS", tile)
        assert np.array_equal(quant.quantize(x, qtype), expected), tile


def test_empty_input():
    assert quant.quantize(np.zeros((0, 256), np.float32), T.Q4_K).shape == (0, 144)
    assert quant.quantize(np.zeros((3, 0), np.float32), T.Q6_K).shape == (3, 0)


def test_q8_0_bit_equal_to_gguf():
    rng = np.random.default_rng(5)
    for shape in [(1, 32), (9, 96), (4, 2816)]:
        x = (rng.standard_normal(shape) * rng.uniform(0.01, 100)).astype(np.float32)
        x[0, :32] = 0
        assert np.array_equal(quant.quantize(x, T.Q8_0), gguf_quants.quantize(x, T.Q8_0))


@pytest.mark.parametrize("qtype", LEGACY_TYPES, ids=lambda t: t.name)
def test_legacy_bit_equal_to_gguf(qtype):
    rng = np.random.default_rng([5, int(qtype)])
    for shape in [(1, 32), (9, 96), (4, 2816)]:
        x = (rng.standard_normal(shape) * rng.uniform(0.01, 100)).astype(np.float32)
        x[0, :32] = 0
        if shape[0] > 1:
            x[1, 32:64] = 0.25  # constant block: Q4_1 / Q5_1 d = 0
            x[1, 0] = -x[1, 1]  # a ±tie for the signed maximum of Q4_0 / Q5_0
            x[1, 1] = np.abs(x[1]).max()
        assert np.array_equal(quant.quantize(x, qtype), gguf_quants.quantize(x, qtype)), shape


def test_raw_types_round_trip():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 40)).astype(np.float32)
    f32 = quant.quantize(x, T.F32)
    assert f32.shape == (3, 160) and f32.dtype == np.uint8
    assert np.array_equal(quant.dequantize(f32, T.F32), x)
    f16 = quant.quantize(x, T.F16)
    assert f16.shape == (3, 80)
    assert np.array_equal(f16.view(np.float16), x.astype(np.float16))
    assert np.array_equal(quant.dequantize(f16, T.F16), x.astype(np.float16).astype(np.float32))
    bf16 = quant.quantize(x, T.BF16)
    assert bf16.shape == (3, 80)
    assert np.array_equal(bf16, gguf_quants.quantize(x, T.BF16))
    # round to nearest even on the f32 bits, then back: error below half a bf16 ulp
    back = quant.dequantize(bf16, T.BF16)
    assert back.dtype == np.float32
    assert np.all(np.abs(back - x) <= np.abs(x) * 2.0 ** -8)
    tie = np.array([1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8], np.float32)  # exact ties: to even
    np.testing.assert_array_equal(quant.dequantize(quant.quantize(tie, T.BF16), T.BF16),
                                  [1.0, 1.0 + 2 * 2.0 ** -7])


def test_type_spellings():
    x = np.ones((1, 256), np.float32)
    expected = quant.quantize(x, T.Q4_K)
    assert np.array_equal(quant.quantize(x, int(T.Q4_K)), expected)
    assert np.array_equal(quant.quantize(x, "q4_k"), expected)
    assert quant.block_size(T.Q6_K) == 256 and quant.type_size("Q6_K") == 210


# --------------------------------------------------------------------------------------------
# hand-built blocks: a scalar packer transcribed from docs/qwen35.md §4, decoded by gguf


def f16_bytes(value):
    return list(np.array([value], np.float16).view(np.uint8))


def pack_scale_min(sc, m):
    s = [0] * 12
    for j in range(8):
        if j < 4:
            s[j] |= sc[j]
            s[j + 4] |= m[j]
        else:
            s[j + 4] = (sc[j] & 15) | ((m[j] & 15) << 4)
            s[j - 4] |= (sc[j] >> 4) << 6
            s[j] |= (m[j] >> 4) << 6
    return s


def pack_q4_k(d, dmin, sc, m, q):
    qs = [0] * 128
    for p in range(4):
        for l in range(32):
            qs[32 * p + l] = q[64 * p + l] | (q[64 * p + 32 + l] << 4)
    return np.array(f16_bytes(d) + f16_bytes(dmin) + pack_scale_min(sc, m) + qs, np.uint8)


def pack_q5_k(d, dmin, sc, m, q):
    qs = [0] * 128
    qh = [0] * 32
    for p in range(4):
        for l in range(32):
            low, high = q[64 * p + l], q[64 * p + 32 + l]
            qs[32 * p + l] = (low & 15) | ((high & 15) << 4)
            qh[l] |= ((low >> 4) << (2 * p)) | ((high >> 4) << (2 * p + 1))
    return np.array(f16_bytes(d) + f16_bytes(dmin) + pack_scale_min(sc, m) + qh + qs, np.uint8)


def pack_q6_k(d, sc, q):
    ql = [0] * 128
    qh = [0] * 64
    for half in range(2):
        base = 128 * half
        for l in range(32):
            q1, q2, q3, q4 = (q[base + l + 32 * k] for k in range(4))
            ql[64 * half + l] = (q1 & 15) | ((q3 & 15) << 4)
            ql[64 * half + l + 32] = (q2 & 15) | ((q4 & 15) << 4)
            qh[32 * half + l] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6)
    scales = list(np.array(sc, np.int8).view(np.uint8))
    return np.array(ql + qh + scales + f16_bytes(d), np.uint8)


def k_block_values(d, dmin, sc, m, q):
    sub = np.repeat(np.arange(8), 32)
    return (np.float32(d) * np.float32(sc)[sub] * np.float32(q)
            - np.float32(dmin) * np.float32(m)[sub]).astype(np.float32)


def exactly_representable_k_block(rng, q_max):
    """d, dmin powers of two; sc and m reaching 63 (so the 6-bit rescale is lossless) and every
    sub-block holding a 0 and a q_max level (so its min/max fit is exact)."""
    d, dmin = 2.0 ** -8, 2.0 ** -9
    sc = rng.integers(1, 64, 8)
    m = rng.integers(0, 64, 8)
    sc[rng.integers(8)] = 63
    top_min, zero_min = rng.permutation(8)[:2]
    m[top_min] = 63
    m[zero_min] = 0
    q = rng.integers(0, q_max + 1, 256)
    q[0::32] = 0
    q[1::32] = q_max
    return d, dmin, [int(v) for v in sc], [int(v) for v in m], [int(v) for v in q]


@pytest.mark.parametrize("seed", range(3))
def test_q4_k_hand_built_block(seed):
    rng = np.random.default_rng(seed)
    d, dmin, sc, m, q = exactly_representable_k_block(rng, 15)
    block = pack_q4_k(d, dmin, sc, m, q)
    values = k_block_values(d, dmin, sc, m, q)
    np.testing.assert_array_equal(gguf_quants.dequantize(block, T.Q4_K), values)
    assert np.array_equal(quant.quantize(values, T.Q4_K), block)


@pytest.mark.parametrize("seed", range(3))
def test_q5_k_hand_built_block(seed):
    rng = np.random.default_rng(seed)
    d, dmin, sc, m, q = exactly_representable_k_block(rng, 31)
    block = pack_q5_k(d, dmin, sc, m, q)
    values = k_block_values(d, dmin, sc, m, q)
    np.testing.assert_array_equal(gguf_quants.dequantize(block, T.Q5_K), values)
    assert np.array_equal(quant.quantize(values, T.Q5_K), block)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("d", [2.0 ** -10, -(2.0 ** -6)])
def test_q6_k_hand_built_block(seed, d):
    """Power-of-two scales keep every product and weighted sum of the search exact in float32,
    so the encoder must land on the very same bytes."""
    rng = np.random.default_rng(seed)
    sc = [int(v) for v in rng.choice([-1, 1], 16) * 2 ** rng.integers(0, 7, 16)]  # |sc| ≤ 64
    sc[rng.integers(16)] = -128  # the largest sub-block scale is always stored as −128
    zero_sub_block = int(rng.integers(16))
    sc[zero_sub_block] = 0
    q = rng.integers(0, 64, 256)
    q[0::16] = 0  # level −32: each sub-block's largest magnitude, as the encoder maps it
    q[16 * zero_sub_block:16 * zero_sub_block + 16] = 0
    q = [int(v) for v in q]
    block = pack_q6_k(d, sc, q)
    values = (np.float32(d) * np.float32(sc)[np.repeat(np.arange(16), 16)]
              * (np.float32(q) - 32)).astype(np.float32)
    np.testing.assert_array_equal(gguf_quants.dequantize(block, T.Q6_K), values)
    assert np.array_equal(quant.quantize(values, T.Q6_K), block)


def test_q6_k_layout_element_by_element():
    """One level per position: decoding each element back identifies its ql/qh/scale slots."""
    q = [(7 * i + 3) % 64 for i in range(256)]
    sc = [i - 8 for i in range(16)]
    block = pack_q6_k(0.5, sc, q)
    decoded = gguf_quants.dequantize(block, T.Q6_K)
    expected = [0.5 * sc[i // 16] * (q[i] - 32) for i in range(256)]
    np.testing.assert_array_equal(decoded, np.array(expected, np.float32))


# --------------------------------------------------------------------------------------------
# slow oracle: llama.cpp's reference quantizers, one block at a time (ggml-quants.c)


def nearest_int(v):
    return np.rint(np.float32(v)).astype(np.int64)


def make_qkx2_quants(x, nmax, rmin, rdelta, nstep):
    weights = np.float32(np.sqrt(np.mean(x * x))) + np.abs(x)
    lo, hi = min(x.min(), np.float32(0)), x.max()
    if hi == lo:
        return np.float32(0), -lo
    sum_w, sum_x = weights.sum(), (weights * x).sum()
    iscale = np.float32(nmax) / (hi - lo)
    scale = 1 / iscale
    levels = np.clip(nearest_int(iscale * (x - lo)), 0, nmax)
    best_error = (weights * (scale * levels + lo - x) ** 2).sum()
    for step in range(nstep + 1):
        iscale = np.float32(rmin + rdelta * step + nmax) / (hi - lo)
        levels = np.clip(nearest_int(iscale * (x - lo)), 0, nmax).astype(np.float32)
        sum_l, sum_l2 = (weights * levels).sum(), (weights * levels * levels).sum()
        sum_xl = (weights * levels * x).sum()
        det = sum_w * sum_l2 - sum_l * sum_l
        if det > 0:
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
            if this_min > 0:
                this_min, this_scale = np.float32(0), sum_xl / sum_l2
            error = (weights * (this_scale * levels + this_min - x) ** 2).sum()
            if error < best_error:
                best_error, scale, lo = error, this_scale, this_min
    return np.float32(scale), np.float32(-lo)


def reference_q45_k_block(x, nmax):
    rmin, nstep = (-1.0, 20) if nmax == 15 else (-0.5, 15)
    fits = [make_qkx2_quants(x[32 * j:32 * j + 32], nmax, rmin, 0.1, nstep) for j in range(8)]
    scales = np.array([s for s, _ in fits], np.float32)
    mins = np.array([m for _, m in fits], np.float32)
    max_scale, max_min = scales.max(), mins.max()
    inv_scale = np.float32(63) / max_scale if max_scale > 0 else np.float32(0)
    inv_min = np.float32(63) / max_min if max_min > 0 else np.float32(0)
    sc = [min(63, max(0, int(nearest_int(inv_scale * s)))) for s in scales]
    m = [min(63, max(0, int(nearest_int(inv_min * v)))) for v in mins]
    d = np.float16(max_scale / 63)
    dmin = np.float16(max_min / 63)
    q = []
    for j in range(8):
        step = np.float32(d) * sc[j]
        offset = np.float32(dmin) * m[j]
        sub = x[32 * j:32 * j + 32]
        q += [0] * 32 if step == 0 else list(np.clip(nearest_int((sub + offset) / step), 0, nmax))
    pack = pack_q4_k if nmax == 15 else pack_q5_k
    return pack(d, dmin, sc, m, [int(v) for v in q])


def make_qx_quants(x, nmax):
    amax_index = int(np.argmax(np.abs(x)))
    peak = x[amax_index]
    if abs(peak) < 1e-15:
        return np.float32(0)
    w = x * x

    def fit(iscale):
        levels = np.clip(nearest_int(iscale * x), -nmax, nmax - 1).astype(np.float32)
        return (w * x * levels).sum(), (w * levels * levels).sum()

    sum_lx, sum_l2 = fit(np.float32(-nmax) / peak)
    scale = sum_lx / sum_l2 if sum_l2 else np.float32(0)
    best = scale * sum_lx
    for step in range(-9, 10):
        if step == 0:
            continue
        sum_lx, sum_l2 = fit(np.float32(-(nmax + 0.1 * step)) / peak)
        if sum_l2 > 0 and sum_lx * sum_lx > best * sum_l2:
            scale = sum_lx / sum_l2
            best = scale * sum_lx
    return np.float32(scale)


def reference_q6_k_block(x):
    scales = np.array([make_qx_quants(x[16 * j:16 * j + 16], 32) for j in range(16)], np.float32)
    max_scale = scales[int(np.argmax(np.abs(scales)))]
    if abs(max_scale) < 1e-15:
        return np.zeros(210, np.uint8)
    iscale = np.float32(-128) / max_scale
    d = np.float16(1 / iscale)
    sc = [min(127, int(nearest_int(iscale * s))) for s in scales]
    q = []
    for j in range(16):
        step = np.float32(d) * sc[j]
        sub = x[16 * j:16 * j + 16]
        q += [0] * 16 if step == 0 else list(np.clip(nearest_int(sub / step), -32, 31) + 32)
    return pack_q6_k(d, sc, [int(v) for v in q])


REFERENCE = {T.Q4_K: lambda x: reference_q45_k_block(x, 15),
             T.Q5_K: lambda x: reference_q45_k_block(x, 31),
             T.Q6_K: reference_q6_k_block}
FULL_SEARCH = {T.Q4_K: ("_Q4_K_SEARCH", (-1.0, 0.1, 20)),
               T.Q5_K: ("_Q5_K_SEARCH", (-0.5, 0.1, 15)),
               T.Q6_K: ("_Q6_K_STEPS", tuple(s for s in range(-9, 10) if s))}


def block_errors(raw, x, qtype):
    y = gguf_quants.dequantize(raw, qtype)
    return np.sqrt(np.mean((y - x) ** 2, axis=1) / np.mean(x ** 2, axis=1))


def oracle_blocks(rng, n_blocks):
    x = rng.standard_normal((n_blocks, 256)).astype(np.float32)
    x[1] = rng.laplace(size=256)
    x[2, :100] = 0
    x[3] = np.abs(x[3]) + 2  # all positive: exercises the min ≤ 0 clamp
    x[4] = -np.abs(x[4])
    x[5, rng.integers(256)] = 40  # an outlier dominating its super-block
    return x


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q5_K, T.Q6_K], ids=lambda t: t.name)
def test_matches_llama_reference_with_full_search(qtype, monkeypatch):
    """With llama.cpp's full search grid the encoder reproduces its reference quantizer's bytes
    (float32 summation order differs, so a rare block may round a tie the other way)."""
    monkeypatch.setattr(quant, *FULL_SEARCH[qtype])
    x = oracle_blocks(np.random.default_rng(11), 12)
    ours = quant.quantize(x, qtype)
    reference = np.stack([REFERENCE[qtype](row) for row in x])
    same_blocks = sum(np.array_equal(a, b) for a, b in zip(ours, reference))
    assert same_blocks >= 9, f"{same_blocks}/12 blocks equal"  # 11, 12, 11 seen
    # where a near-tie went the other way, the result is as good
    np.testing.assert_allclose(block_errors(ours, x, qtype), block_errors(reference, x, qtype),
                               rtol=0.01)


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q5_K, T.Q6_K], ids=lambda t: t.name)
def test_default_search_error_close_to_llama_reference(qtype):
    """The default (coarser) search grid costs at most a few percent of error per block
    (seen: mean +0.1–1.2 %, worst block +4 %)."""
    x = oracle_blocks(np.random.default_rng(12), 16)
    ours = block_errors(quant.quantize(x, qtype), x, qtype)
    reference = block_errors(np.stack([REFERENCE[qtype](row) for row in x]), x, qtype)
    assert ours.mean() < reference.mean() * 1.025, (ours.mean(), reference.mean())
    assert np.all(ours < reference * 1.08), ours / reference


# --------------------------------------------------------------------------------------------
# errors


def test_bad_row_length():
    with pytest.raises(UsageError, match=r"row length 300 is not a multiple of the Q4_K block size 256"):
        quant.quantize(np.zeros((2, 300), np.float32), T.Q4_K)
    with pytest.raises(UsageError, match="Q8_0 block size 32"):
        quant.quantize(np.zeros(40, np.float32), T.Q8_0)


@pytest.mark.parametrize("qtype", [T.Q3_K, T.IQ4_NL, T.Q2_K])
def test_unsupported_type(qtype):
    with pytest.raises(UsageError, match=f"{qtype.name} is not supported"):
        quant.quantize(np.zeros((1, 256), np.float32), qtype)


@pytest.mark.parametrize("qtype", ["Q9_Z", 12345, None])
def test_unknown_type(qtype):
    with pytest.raises(UsageError, match="unknown GGML quantization type"):
        quant.quantize(np.zeros((1, 256), np.float32), qtype)


def test_bad_values():
    x = np.zeros((2, 256), np.float32)
    x[1, 7] = np.nan
    with pytest.raises(UsageError, match="non-finite value nan at row 1, column 7"):
        quant.quantize(x, T.Q4_K)
    for qtype, big in [(T.Q8_0, 1e7), (T.Q4_K, 1e8), (T.Q5_K, 1e9), (T.Q6_K, 1e9), (T.Q6_K, 1e20),
                       (T.Q4_0, 1e6), (T.Q5_0, 2e6), (T.Q4_1, 1e6), (T.Q5_1, 3e6),
                       (T.Q4_1, -7e4), (T.Q5_1, -7e4)]:  # the last two: the stored min overflows
        x = np.ones((2, 256), np.float32)
        x[1, 3] = big
        with pytest.raises(UsageError, match=f"too large to quantize to {qtype.name}.*rows 0..1"):
            quant.quantize(x, qtype)
    with pytest.raises(UsageError, match="out of the F16 range"):
        quant.quantize(np.full(4, 7e4, np.float32), T.F16)
    with pytest.raises(UsageError, match="at least one dimension"):
        quant.quantize(np.float32(1), T.F32)
    with pytest.raises(UsageError, match="real numbers"):
        quant.quantize(np.zeros(32, np.complex64), T.Q8_0)


def test_dequantize_wrapper():
    raw = quant.quantize(np.ones((2, 512), np.float32), T.Q5_K)
    values = quant.dequantize(raw, T.Q5_K)
    assert values.dtype == np.float32 and values.shape == (2, 512)
    with pytest.raises(UsageError, match="not a multiple of the Q5_K block size of 176 bytes"):
        quant.dequantize(raw[:, :-1], T.Q5_K)
    with pytest.raises(UsageError, match="uint8"):
        quant.dequantize(raw.view(np.int8), T.Q5_K)


# --------------------------------------------------------------------------------------------
# legacy Q4_0 / Q4_1 / Q5_0 / Q5_1: a literal transcription of llama.cpp's quantize_row_*_ref and
# a packer written from the layout, both independent of gguf


def _f32(v):
    return np.float32(v)


def reference_legacy_block(x, qtype):
    """quantize_row_q{4,5}_{0,1}_ref for one block of 32 float32 values, statement by statement."""
    bits = 5 if qtype in (T.Q5_0, T.Q5_1) else 4
    has_min = qtype in (T.Q4_1, T.Q5_1)
    if has_min:
        lo, hi = _f32(np.finfo(np.float32).max), _f32(-np.finfo(np.float32).max)
        for v in x:
            lo = v if v < lo else lo
            hi = v if v > hi else hi
        d = (hi - lo) / _f32((1 << bits) - 1)
    else:
        amax, signed_max = _f32(0), _f32(0)
        for v in x:
            if amax < abs(v):
                amax, signed_max = abs(v), v
        d = signed_max / _f32(-(1 << (bits - 1)))
    inv = _f32(1) / d if d else _f32(0)
    levels = []
    for v in x:
        if has_min:
            level = int(np.trunc((v - lo) * inv + _f32(0.5)))  # (uint8_t)(x0 + 0.5f)
        else:
            level = int(np.trunc(v * inv + _f32((1 << (bits - 1)) + 0.5)))  # (int8_t)(x0 + 8.5f)
        levels.append(min((1 << bits) - 1, level))
    return pack_legacy(qtype, d, lo if has_min else None, levels)


def pack_legacy(qtype, d, m, levels):
    """The block layout, byte by byte: f16 d [, f16 m] [, u32 qh (Q5_x)], 16 bytes of nibbles with
    element j in the low nibble of qs[j] and element j + 16 in its high nibble."""
    out = bytearray(f16_bytes(d))
    if m is not None:
        out.extend(f16_bytes(m))
    if qtype in (T.Q5_0, T.Q5_1):
        qh = sum(((q >> 4) & 1) << j for j, q in enumerate(levels))
        out += int(qh).to_bytes(4, "little")
    out += bytes((levels[j] & 15) | ((levels[j + 16] & 15) << 4) for j in range(16))
    assert len(out) == BLOCK[qtype][1]
    return np.frombuffer(bytes(out), np.uint8)


@pytest.mark.parametrize("qtype", LEGACY_TYPES, ids=lambda t: t.name)
def test_legacy_matches_llama_reference(qtype):
    rng = np.random.default_rng([11, int(qtype)])
    x = (rng.standard_normal((48, 32)) * rng.uniform(0.001, 50, (48, 1))).astype(np.float32)
    x[0] = 0
    x[1] = -2.5
    x[2, 5] = np.abs(x[2]).max() * 2  # a ±tie for the signed maximum: the first one wins
    x[2, 9] = -x[2, 5]
    x[3] += 4  # all positive
    expected = np.stack([reference_legacy_block(block, qtype) for block in x])
    got = quant.quantize(x.reshape(1, -1), qtype).reshape(48, -1)
    mismatched = [i for i in range(48) if not np.array_equal(got[i], expected[i])]
    assert not mismatched, mismatched


@pytest.mark.parametrize("qtype", LEGACY_TYPES, ids=lambda t: t.name)
def test_legacy_layout_element_by_element(qtype):
    """Every level at every position, decoded by gguf: x = d * (q - 8 or 16), or d * q + m."""
    bits = 5 if qtype in (T.Q5_0, T.Q5_1) else 4
    has_min = qtype in (T.Q4_1, T.Q5_1)
    d, m = 2.0 ** -4, -1.75
    for shift in range(1 << bits):
        levels = [(j + shift) % (1 << bits) for j in range(32)]
        raw = pack_legacy(qtype, d, m if has_min else None, levels)
        values = gguf_quants.dequantize(raw, qtype)
        q = np.array(levels, np.float64)
        expected = d * q + m if has_min else d * (q - (1 << (bits - 1)))
        np.testing.assert_array_equal(values, expected.astype(np.float32), err_msg=f"shift {shift}")


def test_qwen35_file_with_q5_0_and_other_legacy_matrices_loads(tmp_path):
    """2-D weights may be Q4_0 / Q4_1 / Q5_0 / Q5_1 (the Qwen2.5 0.5B draft is mostly Q5_0); a
    1-D tensor in one of them is still refused (it must be F32)."""
    from gguf_fixtures import write_minimal_qwen35
    from pyspecla.errors import GGUFError
    from pyspecla.loader.target import ModelFile

    types = {"blk.0.ffn_up.weight": T.Q5_0, "blk.0.ffn_gate.weight": T.Q4_0,
             "blk.0.ffn_down.weight": T.Q5_1, "blk.3.attn_v.weight": T.Q4_1, "token_embd.weight": T.Q5_0}
    path = str(tmp_path / "legacy.gguf")
    write_minimal_qwen35(path, types=types)
    with ModelFile.open(path) as model:
        for name, t in types.items():
            view = model.tensor(name)
            assert view.ggml_type == t and view.type_name == t.name
            block, block_bytes = BLOCK[t]
            assert view.nbytes == view.data.nbytes == int(np.prod(view.ne)) // block * block_bytes
        up = model.tensor("blk.0.ffn_up.weight")
        n_in, n_out = up.ne[0], up.ne[1]
        values = gguf_quants.dequantize(np.asarray(up.data), T.Q5_0).reshape(n_out, n_in)
        assert values.shape == (n_out, n_in)

    bad = str(tmp_path / "bad.gguf")
    write_minimal_qwen35(bad, types={"blk.0.attn_norm.weight": T.Q5_0})
    with pytest.raises(GGUFError, match=r"'blk\.0\.attn_norm\.weight' has type Q5_0; it must be F32"):
        ModelFile.open(bad)
