"""Numpy encoder for the GGML block formats pyspecla writes: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
Q5_K, Q6_K (+ F32/F16/BF16).

    quantize(data, qtype) -> uint8 (..., n // block * block_bytes), byte-exact GGML block layout
    dequantize(raw, qtype) -> float32 (..., n)                    (gguf.quants.dequantize)

The layouts are the ones in docs/qwen35.md §4; `gguf.quants.dequantize` is the
independent decoder the tests hold this encoder to. The algorithms follow llama.cpp's reference
quantizers (quantize_row_q8_0_ref, q4_K_ref / q5_K_ref with make_qkx2_quants, q6_K_ref with
make_qx_quants, which is what llama-quantize runs without an imatrix), computed in float32 like
the C code, but with coarser scale-search grids (see _Q4_K_SEARCH) for speed. With llama.cpp's
grids patched in, the bytes equal its reference block for block, except that a rare near-tie
falls the other way (summation order differs).
Q8_0, BF16 and the legacy Q4_0 / Q4_1 / Q5_0 / Q5_1 are delegated to gguf.quants, so those bytes
are exactly what gguf writes; gguf's legacy quantizers are vectorised transcriptions of llama.cpp's
quantize_row_q{4,5}_{0,1}_ref (the tests check them against a literal per-block transcription):
  Q4_0 / Q5_0  d = m / -8 (/ -16), m the element of largest |x| with its sign; q = trunc(x/d + 8.5)
               (+ 16.5) clamped to 15 (31)
  Q4_1 / Q5_1  d = (max - min) / 15 (/ 31), m = min; q = trunc((x - min)/d + 0.5) clamped to 15 (31)
  element l < 16 in the low nibble of qs[l], l + 16 in the high nibble; Q5_x bit 4 of element l is
  bit l of the little-endian 32-bit qh.

Speed: everything is vectorised over all blocks of a chunk. Sub-blocks are laid out as columns
(shape (sub_block_len, n_sub_blocks)) because numpy reduces along axis 0 of a C-contiguous array
several times faster than along a short last axis; the per-candidate error of the scale search
is evaluated in closed form from weighted sums, so no per-element error array is ever built.
Big inputs are processed in tiles of about _TILE_ELEMENTS so temporaries stay cache-sized.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

from ..errors import UsageError

__all__ = ["quantize", "dequantize", "SUPPORTED_TYPES", "block_size", "type_size"]

_TILE_ELEMENTS = 1 << 17  # elements per tile: big enough to amortise the per-call overhead of the
# many small per-sub-block numpy ops, small enough that the ~10 float32 temporaries stay near L2
_GROUP_MAX_EPS = 1e-15  # llama.cpp GROUP_MAX_EPS: below this a group counts as all-zero

# Scale-search grids. llama.cpp tries 21 iscales for Q4_K (nmax−1 … nmax+1 in steps of 0.1), 16
# for Q5_K and 18 for Q6_K; at ~2.5 ns/element per candidate here that is too slow for the
# test-model tool (Q4_K 15 M elements/s). The same ranges at a coarser pitch cost little: relative
# RMS error on Gaussian / Laplace / 1 %-outlier data, full grid → these grids: Q4_K 0.0715 →
# 0.0720, 0.0846 → 0.0852, 0.0775 → 0.0793; Q5_K +0.3–0.5 %; Q6_K unchanged (0.0177), for 2.5x
# the speed. The tests patch in the full grids to compare with a transcription of llama.cpp.
_Q4_K_SEARCH = (-1.0, 0.4, 5)  # (rmin, rdelta, nstep): iscale offsets −1.0, −0.6, … , +1.0
_Q5_K_SEARCH = (-0.5, 0.25, 6)  # offsets −0.5, −0.25, … , +1.0
_Q6_K_STEPS = (-9, -6, -3, 3, 6, 9)  # iscale = −(32 + 0.1·step)/max, beside the plain −32/max

_RAW_TYPES = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)


# ---------------------------------------------------------------------------------------------
# scale searches (sub-blocks are columns: x has shape (sub_block_len, n_sub_blocks))


def _fit_scale_min(x: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int):
    """make_qkx2_quants over every column of x at once: x ≈ scale·L + min, L in [0, nmax], min ≤ 0.

    Weights are llama.cpp's w = rms(x) + |x|. Candidates: the plain min/max fit, then nstep+1
    weighted least-squares refits of the levels rint((x − min)·iscale), iscale = (nmax + rmin +
    rdelta·i)/(max − min), where min is the best offset found so far (as in llama.cpp, each
    improvement re-centres the following candidates). The smallest weighted squared error wins.
    Returns (scale, -min), both float32 of shape (n_sub_blocks,), -min ≥ 0."""
    n = x.shape[0]
    sum_x2 = np.einsum("ij,ij->j", x, x)
    w = np.abs(x)
    w += np.sqrt(sum_x2 / n)
    wx = w * x
    sum_w = w.sum(axis=0)
    sum_wx = wx.sum(axis=0)
    sum_wx2 = np.einsum("ij,ij->j", wx, x)

    low_x = x.min(axis=0)
    hi = x.max(axis=0)
    best_min = np.minimum(low_x, 0)  # the offset never goes positive: it is stored as −dmin·m
    flat = hi == best_min  # constant non-positive column (or all zero): scale 0, min = value
    best_scale = (hi - best_min) / nmax

    level = np.empty_like(x)

    def weighted_sums(offset, iscale):
        np.subtract(x, offset, out=level)
        np.multiply(level, iscale, out=level)
        np.rint(level, out=level)
        np.clip(level, 0, nmax, out=level)
        return (np.einsum("ij,ij->j", w, level),  # Σ w·l
                np.einsum("ij,ij,ij->j", w, level, level),  # Σ w·l²
                np.einsum("ij,ij->j", wx, level))  # Σ w·x·l

    def error(scale, offset, sum_l, sum_l2, sum_xl):
        # Σ w·(scale·l + offset − x)², expanded so that only per-column sums are needed
        return (scale * scale * sum_l2 + 2 * scale * offset * sum_l + offset * offset * sum_w
                - 2 * scale * sum_xl - 2 * offset * sum_wx + sum_wx2)

    with np.errstate(divide="ignore", invalid="ignore"):
        best_err = error(best_scale, best_min, *weighted_sums(best_min, nmax / (hi - best_min)))
        for step in range(nstep + 1):
            offset = best_min
            iscale = (rmin + rdelta * step + nmax) / (hi - offset)
            sum_l, sum_l2, sum_xl = weighted_sums(offset, iscale)
            det = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_wx * sum_l) / det
            this_min = (sum_l2 * sum_wx - sum_l * sum_xl) / det
            # a positive offset is not representable: refit through 0
            this_scale = np.where(this_min > 0, sum_xl / sum_l2, this_scale)
            this_min = np.minimum(this_min, 0)
            this_err = error(this_scale, this_min, sum_l, sum_l2, sum_xl)
            # When every element lands on one level (a near-constant positive column) the refit is
            # underdetermined and det is float32 noise, so require a spread of levels. Levels are
            # monotone in x, so the spread follows from the column's extremes alone.
            spread = (np.clip(np.rint((hi - offset) * iscale), 0, nmax)
                      > np.clip(np.rint((low_x - offset) * iscale), 0, nmax))
            better = spread & (det > 0) & (this_err < best_err)
            best_scale = np.where(better, this_scale, best_scale)
            best_min = np.where(better, this_min, best_min)
            best_err = np.where(better, this_err, best_err)

    best_scale[flat] = 0
    return best_scale.astype(np.float32), (-best_min).astype(np.float32)


def _fit_symmetric_scale(x: np.ndarray, nmax: int):
    """make_qx_quants(rmse_type=1) over every column: x ≈ scale·l, l in [−nmax, nmax−1].

    The element of largest |x| maps to −nmax (the wider side of the range); neighbouring
    iscales (nmax + 0.1·i, i in _Q6_K_STEPS) are tried and the smallest x²-weighted error kept.
    Returns scale (float32, may be negative), 0 for an all-zero column."""
    hi = x.max(axis=0)
    lo = x.min(axis=0)
    signed_max = np.where(-lo > hi, lo, hi)
    zero = np.abs(signed_max) < _GROUP_MAX_EPS
    signed_max[zero] = 1

    w = x * x
    wx = w * x
    level = np.empty_like(x)

    def sums(scale_numerator):
        np.multiply(x, -scale_numerator / signed_max, out=level)
        np.rint(level, out=level)
        np.clip(level, -nmax, nmax - 1, out=level)
        return np.einsum("ij,ij->j", wx, level), np.einsum("ij,ij,ij->j", w, level, level)

    with np.errstate(divide="ignore", invalid="ignore"):
        sum_lx, sum_l2 = sums(np.float32(nmax))
        scale = np.where(sum_l2 > 0, sum_lx / sum_l2, np.float32(0))
        best = scale * sum_lx  # = (Σ w·x·l)² / Σ w·l², the error reduction to maximise
        for step in _Q6_K_STEPS:
            sum_lx, sum_l2 = sums(np.float32(nmax + 0.1 * step))
            better = (sum_l2 > 0) & (sum_lx * sum_lx > best * sum_l2)
            scale = np.where(better, sum_lx / sum_l2, scale)
            best = np.where(better, scale * sum_lx, best)
    scale[zero] = 0
    return scale.astype(np.float32)


class _ScaleOverflow(Exception):
    """A block scale does not fit float16; quantize() turns it into a UsageError naming the rows."""


def _to_f16(values: np.ndarray) -> np.ndarray:
    half = values.astype(np.float16)
    if not np.isfinite(half).all():
        raise _ScaleOverflow
    return half


def _reciprocal_or_zero(values: np.ndarray) -> np.ndarray:
    # a zero scale quantizes its elements to level 0 instead of producing inf/NaN
    with np.errstate(divide="ignore"):
        return np.where(values != 0, 1 / values, np.float32(0)).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# block encoders: float32 (n_blocks, block) → uint8 (n_blocks, block_bytes)


def _pack_scale_min_6bit(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """The 12-byte K-quant scale/min packing: bytes 0–3 sc0–3 (+ high bits of sc4–7 in bits 6–7),
    4–7 m0–3 (+ high bits of m4–7), 8–11 low nibbles of sc4–7 | low nibbles of m4–7 << 4."""
    packed = np.empty((ls.shape[0], 12), dtype=np.uint8)
    packed[:, 0:4] = ls[:, 0:4] | ((ls[:, 4:8] >> 4) << 6)
    packed[:, 4:8] = lm[:, 0:4] | ((lm[:, 4:8] >> 4) << 6)
    packed[:, 8:12] = (ls[:, 4:8] & 0x0F) | ((lm[:, 4:8] & 0x0F) << 4)
    return packed


def _encode_k_scale_min(blocks: np.ndarray, nmax: int, search: tuple[float, float, int]):
    """Shared part of Q4_K / Q5_K: returns (d f16, dmin f16, packed scales (nb,12), levels (nb,8,32))."""
    n_blocks = blocks.shape[0]
    cols = np.ascontiguousarray(blocks.reshape(n_blocks * 8, 32).T)  # (32, n_sub_blocks)
    scales, mins = _fit_scale_min(cols, nmax, *search)
    scales = scales.reshape(n_blocks, 8)
    mins = mins.reshape(n_blocks, 8)

    max_scale = scales.max(axis=1)
    max_min = mins.max(axis=1)
    ls = np.clip(np.rint(scales * _reciprocal_or_zero(max_scale / 63)[:, None]), 0, 63).astype(np.uint8)
    lm = np.clip(np.rint(mins * _reciprocal_or_zero(max_min / 63)[:, None]), 0, 63).astype(np.uint8)
    d = _to_f16(max_scale / 63)
    dmin = _to_f16(max_min / 63)

    # re-quantize every element against the scales as the decoder will see them (f16 · 6 bit)
    sub_scale = d.astype(np.float32)[:, None] * ls
    sub_offset = dmin.astype(np.float32)[:, None] * lm
    inv_scale = _reciprocal_or_zero(sub_scale)
    cols += sub_offset.reshape(1, -1)
    cols *= inv_scale.reshape(1, -1)
    np.rint(cols, out=cols)
    np.clip(cols, 0, nmax, out=cols)
    levels = cols.astype(np.uint8).T.reshape(n_blocks, 8, 32)
    return d, dmin, _pack_scale_min_6bit(ls, lm), levels


def _encode_q4_k(blocks: np.ndarray) -> np.ndarray:
    d, dmin, scales, levels = _encode_k_scale_min(blocks, 15, _Q4_K_SEARCH)
    # sub-blocks 2p and 2p+1 share 32 bytes: low nibble ← 2p, high nibble ← 2p+1
    nibbles = levels[:, 0::2, :] | (levels[:, 1::2, :] << 4)
    return np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2),
                           scales, nibbles.reshape(-1, 128)], axis=1)


_QH_BIT = (np.uint8(1) << np.arange(8, dtype=np.uint8)).reshape(1, 8, 1)


def _encode_q5_k(blocks: np.ndarray) -> np.ndarray:
    d, dmin, scales, levels = _encode_k_scale_min(blocks, 31, _Q5_K_SEARCH)
    low = levels & 0x0F
    nibbles = low[:, 0::2, :] | (low[:, 1::2, :] << 4)
    # bit j of qh[l] is bit 4 of sub-block j's element l (bits 2p / 2p+1 for pair p)
    qh = np.bitwise_or.reduce((levels >> 4) * _QH_BIT, axis=1)
    return np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2),
                           scales, qh, nibbles.reshape(-1, 128)], axis=1)


def _encode_q6_k(blocks: np.ndarray) -> np.ndarray:
    n_blocks = blocks.shape[0]
    cols = np.ascontiguousarray(blocks.reshape(n_blocks * 16, 16).T)  # (16, n_sub_blocks)
    scales = _fit_symmetric_scale(cols, 32).reshape(n_blocks, 16)

    # the sub-block scale of largest magnitude sets d so that it lands on −128 (int8's wide side)
    pick = np.abs(scales).argmax(axis=1)
    max_scale = np.take_along_axis(scales, pick[:, None], axis=1)[:, 0]
    zero_block = np.abs(max_scale) < _GROUP_MAX_EPS
    max_scale[zero_block] = 1
    iscale = np.float32(-128) / max_scale
    d = _to_f16(np.where(zero_block, np.float32(0), 1 / iscale))
    sc = np.clip(np.rint(iscale[:, None] * scales), -128, 127)
    sc[zero_block] = 0
    sc = sc.astype(np.int8)

    inv_scale = _reciprocal_or_zero(d.astype(np.float32)[:, None] * sc)
    cols *= inv_scale.reshape(1, -1)
    np.rint(cols, out=cols)
    np.clip(cols, -32, 31, out=cols)
    cols += 32
    cols[:, inv_scale.reshape(-1) == 0] = 0  # as llama.cpp: a zero-scale sub-block stores 0s
    levels = cols.astype(np.uint8).T.reshape(n_blocks, 2, 4, 32)  # (block, half, quarter, l)

    # per half: ql[l] = q(l) | q(l+64) << 4, ql[l+32] = q(l+32) | q(l+96) << 4 (low 4 bits each);
    # qh[l] = bits 4–5 of q(l), q(l+32), q(l+64), q(l+96) at bit offsets 0, 2, 4, 6
    ql = (levels[:, :, 0:2] & 0x0F) | ((levels[:, :, 2:4] & 0x0F) << 4)
    high = levels >> 4
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    return np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8),
                           d.view(np.uint8).reshape(-1, 2)], axis=1)


def _encode_with_gguf(qtype: GGMLQuantizationType) -> Callable[[np.ndarray], np.ndarray]:
    # gguf's Q8_0 is bit-exact with quantize_row_q8_0_ref and its BF16 with ggml's rounding
    def encode(blocks: np.ndarray) -> np.ndarray:
        # one long row: gguf loops in Python over groups of 16 rows, so many short rows are slow
        return gguf_quants.quantize(blocks.reshape(1, -1), qtype).reshape(blocks.shape[0], -1)
    return encode


def _encode_q8_0(blocks: np.ndarray) -> np.ndarray:
    encoded = _encode_with_gguf(GGMLQuantizationType.Q8_0)(blocks)
    if not np.isfinite(encoded[:, :2].copy().view(np.float16)).all():
        raise _ScaleOverflow  # gguf lets d overflow to inf
    return encoded


def _encode_legacy(qtype: GGMLQuantizationType, has_min: bool) -> Callable[[np.ndarray], np.ndarray]:
    encode_with_gguf = _encode_with_gguf(qtype)

    def encode(blocks: np.ndarray) -> np.ndarray:
        encoded = encode_with_gguf(blocks)
        # gguf lets d (and the stored min) overflow to inf in float16
        halves = encoded[:, :4 if has_min else 2].copy().view(np.float16)
        if not np.isfinite(halves).all():
            raise _ScaleOverflow
        return encoded
    return encode


def _encode_f16(blocks: np.ndarray) -> np.ndarray:
    half = blocks.astype(np.float16)
    overflow = np.isinf(half) & np.isfinite(blocks)
    if overflow.any():
        raise UsageError(f"value {blocks[overflow][0]} is out of the F16 range (±65504)")
    return half.view(np.uint8)


_ENCODERS: dict[GGMLQuantizationType, Callable[[np.ndarray], np.ndarray]] = {
    GGMLQuantizationType.F32: lambda blocks: blocks.view(np.uint8),
    GGMLQuantizationType.F16: _encode_f16,
    GGMLQuantizationType.BF16: _encode_with_gguf(GGMLQuantizationType.BF16),
    GGMLQuantizationType.Q8_0: _encode_q8_0,
    GGMLQuantizationType.Q4_0: _encode_legacy(GGMLQuantizationType.Q4_0, has_min=False),
    GGMLQuantizationType.Q4_1: _encode_legacy(GGMLQuantizationType.Q4_1, has_min=True),
    GGMLQuantizationType.Q5_0: _encode_legacy(GGMLQuantizationType.Q5_0, has_min=False),
    GGMLQuantizationType.Q5_1: _encode_legacy(GGMLQuantizationType.Q5_1, has_min=True),
    GGMLQuantizationType.Q4_K: _encode_q4_k,
    GGMLQuantizationType.Q5_K: _encode_q5_k,
    GGMLQuantizationType.Q6_K: _encode_q6_k,
}

SUPPORTED_TYPES = tuple(_ENCODERS)


# ---------------------------------------------------------------------------------------------
# public API


def _resolve_type(qtype) -> GGMLQuantizationType:
    try:
        if isinstance(qtype, str):
            resolved = GGMLQuantizationType[qtype.upper()]
        else:
            resolved = GGMLQuantizationType(int(qtype))
    except (KeyError, ValueError, TypeError):
        raise UsageError(f"unknown GGML quantization type {qtype!r}; supported: "
                         f"{', '.join(t.name for t in SUPPORTED_TYPES)}") from None
    if resolved not in _ENCODERS:
        raise UsageError(f"quantization type {resolved.name} is not supported by the pyspecla "
                         f"encoder; supported: {', '.join(t.name for t in SUPPORTED_TYPES)}")
    return resolved


def block_size(qtype) -> int:
    """Elements per block of qtype (1 for F32/F16/BF16)."""
    return GGML_QUANT_SIZES[_resolve_type(qtype)][0]


def type_size(qtype) -> int:
    """Bytes per block of qtype."""
    return GGML_QUANT_SIZES[_resolve_type(qtype)][1]


def quantize(data: np.ndarray, qtype) -> np.ndarray:
    """Encode float data (..., n) to GGML blocks of qtype: uint8 (..., n // block * block_bytes).

    qtype: a GGMLQuantizationType (or its int value or name) among Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
    Q4_K, Q5_K, Q6_K, F32, F16, BF16. n must be a multiple of the block size (32 for Q8_0 and the
    legacy Q4_0 … Q5_1, 256 for the K-quants).
    gguf.quants.dequantize(result, qtype) gives back an approximation of data, shape (..., n).
    Quantized types reject NaN/inf input and values whose f16 block scale would overflow."""
    qtype = _resolve_type(qtype)
    data = np.asarray(data)
    if data.ndim == 0:
        raise UsageError("quantize needs an array of at least one dimension (rows of n values)")
    if not (np.issubdtype(data.dtype, np.floating) or np.issubdtype(data.dtype, np.integer)):
        raise UsageError(f"quantize needs real numbers, got dtype {data.dtype}")
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    n = data.shape[-1]
    if n % block != 0:
        raise UsageError(f"row length {n} is not a multiple of the {qtype.name} block size "
                         f"{block}; shape {data.shape}")

    blocks_per_row = n // block
    rows = data.reshape(-1, n) if data.size else np.zeros((int(np.prod(data.shape[:-1])), n),
                                                          dtype=np.float32)
    out = np.empty((rows.shape[0], blocks_per_row * block_bytes), dtype=np.uint8)
    encode = _ENCODERS[qtype]
    check_finite = qtype not in _RAW_TYPES

    # Tiles of whole blocks: several rows at a time for short rows, a slice of one row for long
    # ones, so memory stays bounded whatever the shape (and a float16/strided input is converted
    # to float32 one tile at a time, never as a whole copy).
    blocks_per_tile = max(1, _TILE_ELEMENTS // block)
    if blocks_per_row:
        rows_per_tile = max(1, blocks_per_tile // blocks_per_row)
        cols_per_tile = min(blocks_per_row, blocks_per_tile) * block
        for r0 in range(0, rows.shape[0], rows_per_tile):
            r1 = min(r0 + rows_per_tile, rows.shape[0])
            for c0 in range(0, n, cols_per_tile):
                c1 = min(c0 + cols_per_tile, n)
                tile = np.ascontiguousarray(rows[r0:r1, c0:c1], dtype=np.float32)
                if check_finite and not np.isfinite(tile).all():
                    bad = np.argwhere(~np.isfinite(tile))[0]
                    raise UsageError(f"cannot quantize non-finite value {tile[tuple(bad)]} at "
                                     f"row {r0 + bad[0]}, column {c0 + bad[1]} to {qtype.name}")
                # huge inputs may overflow float32 sums; the f16 scale checks report those
                try:
                    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
                        encoded = encode(tile.reshape(-1, block))
                except _ScaleOverflow:
                    raise UsageError(f"values too large to quantize to {qtype.name}: a block scale "
                                     f"overflows float16 (largest |value| "
                                     f"{float(np.abs(tile).max()):.6g} in rows {r0}..{r1 - 1})"
                                     ) from None
                out[r0:r1, c0 // block * block_bytes:c1 // block * block_bytes] = \
                    encoded.reshape(r1 - r0, -1)
    return out.reshape(*data.shape[:-1], blocks_per_row * block_bytes)


def dequantize(raw: np.ndarray, qtype) -> np.ndarray:
    """Decode GGML blocks uint8 (..., n_bytes) of qtype to float32 (..., n) with gguf.quants.

    Any type gguf can decode is accepted, not only the ones quantize writes."""
    try:
        resolved = (GGMLQuantizationType[qtype.upper()] if isinstance(qtype, str)
                    else GGMLQuantizationType(int(qtype)))
    except (KeyError, ValueError, TypeError):
        raise UsageError(f"unknown GGML quantization type {qtype!r}") from None
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raise UsageError(f"dequantize needs the raw bytes as a uint8 array, got dtype {raw.dtype}")
    if raw.ndim == 0:
        raise UsageError("dequantize needs an array of at least one dimension (rows of bytes)")
    block_bytes = GGML_QUANT_SIZES[resolved][1]
    if raw.shape[-1] % block_bytes != 0:
        raise UsageError(f"row of {raw.shape[-1]} bytes is not a multiple of the {resolved.name} "
                         f"block size of {block_bytes} bytes; shape {raw.shape}")
    try:
        values = gguf_quants.dequantize(np.ascontiguousarray(raw), resolved)
    except NotImplementedError:
        raise UsageError(f"gguf cannot dequantize {resolved.name}") from None
    return np.asarray(values, dtype=np.float32)
