"""Native single ops with numpy in / numpy out, the same signatures as the oracles in
`pyspecla.reference.ops` (plus `n_threads`, `cpu_kernels` and `device`: 'cpu', or 'cuda' where
the build and machine have one — the arguments are copied to the GPU and the outputs back). Used by the tests and tools;
generation itself never calls ops one by one.

Every output buffer is poisoned with NaN before the native call, so an element a kernel forgets to
write fails the comparison loudly. Inputs are never modified (in/out states are copied)."""

from __future__ import annotations

import numpy as np

from . import _native
from ._native import check, float_ptr, int32_ptr, lib


def _f32(a) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32))


def _poisoned(shape) -> np.ndarray:
    return np.full(shape, np.nan, dtype=np.float32)


def _opts(n_threads, cpu_kernels, device="cpu"):
    return _native.op_options(n_threads, cpu_kernels, device)


def dequantize(raw: np.ndarray, ggml_type: int, n_elements: int, *, n_threads=0, cpu_kernels="auto", device="cpu") -> np.ndarray:
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    out = _poisoned(n_elements)
    check(lib.specla_op_dequantize(_opts(n_threads, cpu_kernels, device), int(ggml_type), raw.ctypes.data, n_elements,
                                   float_ptr(out)))
    return out


def matmul(w_raw: np.ndarray, w_type: int, ne0: int, ne1: int, x, *, n_threads=0, cpu_kernels="auto", device="cpu") -> np.ndarray:
    """x (n_batch, ne0) -> (n_batch, ne1) = x @ W^T."""
    w_raw = np.ascontiguousarray(w_raw, dtype=np.uint8)
    x = _f32(x)
    n_batch = x.shape[0]
    y = _poisoned((n_batch, ne1))
    t = _native.tensor_struct(w_raw, w_type, ne0, ne1)
    check(lib.specla_op_matmul(_opts(n_threads, cpu_kernels, device), t, float_ptr(x), n_batch, float_ptr(y)))
    return y


def quantize_activations(x, weight_type: int, *, n_threads=0, cpu_kernels="auto", device="cpu") -> tuple[np.ndarray, np.ndarray]:
    """x (n_rows, n) -> (codes int8 (n_rows, n), scales float32 (n_rows, n / block)): the 8-bit
    activation blocks a matmul with this weight type computes with."""
    x = _f32(np.atleast_2d(x))
    n_rows, n = x.shape
    block = 256 if int(weight_type) in (12, 14) else 32
    codes = np.full((n_rows, n), -128, dtype=np.int8)  # -128 is never a code: a gap shows
    scales = _poisoned((n_rows, max(n // block, 1)))
    check(lib.specla_op_quantize_activations(_opts(n_threads, cpu_kernels, device), int(weight_type), float_ptr(x), n_rows, n,
                                             codes.ctypes.data, float_ptr(scales)))
    return codes, scales


def rms_norm(x, weight, eps: float, *, n_threads=0, cpu_kernels="auto", device="cpu") -> np.ndarray:
    x = _f32(x)
    n = x.shape[-1]
    w = _f32(weight) if weight is not None else None
    y = _poisoned(x.shape)
    check(lib.specla_op_rms_norm(_opts(n_threads, cpu_kernels, device), float_ptr(x), float_ptr(w) if w is not None else None,
                                 x.size // n, n, eps, float_ptr(y)))
    return y


def l2_norm(x, eps: float, *, n_threads=0, cpu_kernels="auto", device="cpu") -> np.ndarray:
    x = _f32(x)
    n = x.shape[-1]
    y = _poisoned(x.shape)
    check(lib.specla_op_l2_norm(_opts(n_threads, cpu_kernels, device), float_ptr(x), x.size // n, n, eps, float_ptr(y)))
    return y


def causal_conv(x, weight, conv_state, *, n_threads=0, cpu_kernels="auto", device="cpu"):
    """x (T, C), weight (C, K), conv_state (K-1, C) -> (y (T, C), new_state (K-1, C))."""
    x, weight = _f32(x), _f32(weight)
    state = _f32(conv_state).copy()
    T, C = x.shape
    K = weight.shape[1]
    y = _poisoned((T, C))
    check(lib.specla_op_causal_conv(_opts(n_threads, cpu_kernels, device), float_ptr(x), float_ptr(weight), T, C, K,
                                    float_ptr(state), float_ptr(y)))
    return y, state


def gated_delta_rule(q, k, v, g, beta, state, *, n_threads=0, cpu_kernels="auto", device="cpu"):
    """q, k (T, Hk, S); v (T, Hv, S); g, beta (T, Hv); state (Hv, S, S) [head][value][key]
    -> (out (T, Hv, S), new_state)."""
    q, k, v, g, beta = (_f32(a) for a in (q, k, v, g, beta))
    st = _f32(state).copy()
    T, Hk, S = q.shape
    Hv = v.shape[1]
    out = _poisoned((T, Hv, S))
    check(lib.specla_op_gated_delta_rule(_opts(n_threads, cpu_kernels, device), float_ptr(q), float_ptr(k), float_ptr(v),
                                         float_ptr(g), float_ptr(beta), T, Hk, Hv, S, float_ptr(st), float_ptr(out)))
    return out, st


def rope_neox(x, positions, n_rot: int, freq_base: float, *, n_threads=0, cpu_kernels="auto", device="cpu") -> np.ndarray:
    """x (T, n_heads, D) -> rotated copy."""
    y = _f32(x).copy()
    pos = np.ascontiguousarray(np.asarray(positions, dtype=np.int32))
    T, n_heads, D = y.shape
    check(lib.specla_op_rope_neox(_opts(n_threads, cpu_kernels, device), float_ptr(y), int32_ptr(pos), T, n_heads, D, n_rot,
                                  freq_base))
    return y


def attention(q, k_cache, v_cache, positions, *, n_threads=0, cpu_kernels="auto", device="cpu") -> np.ndarray:
    """q (T, nh, D); k_cache, v_cache (n_kv, nkv, D) -> (T, nh, D)."""
    q, kc, vc = _f32(q), _f32(k_cache), _f32(v_cache)
    pos = np.ascontiguousarray(np.asarray(positions, dtype=np.int32))
    T, nh, D = q.shape
    n_kv, nkv, _ = kc.shape
    out = _poisoned((T, nh, D))
    check(lib.specla_op_attention(_opts(n_threads, cpu_kernels, device), float_ptr(q), float_ptr(kc), float_ptr(vc),
                                  int32_ptr(pos), T, n_kv, nh, nkv, D, float_ptr(out)))
    return out


def gather_rows(src, src_block: int, dst_floats: int, dst_block: int, n_blocks: int, fields, rows, *, n_threads=0,
                cpu_kernels="auto", device="cpu") -> np.ndarray:
    """For block b, field (dst_offset, src_offset, width) and i: source row rows[i] of the field
    (at b * src_block + src_offset + rows[i] * width) becomes destination row i (at b * dst_block +
    dst_offset + i * width) of a NaN array of dst_floats; the floats no row reaches stay NaN."""
    src = _f32(src).reshape(-1)
    out = _poisoned(dst_floats)
    dst_offsets = np.ascontiguousarray([f[0] for f in fields], dtype=np.int64)
    src_offsets = np.ascontiguousarray([f[1] for f in fields], dtype=np.int64)
    widths = np.ascontiguousarray([f[2] for f in fields], dtype=np.int32)
    rows = np.ascontiguousarray(np.asarray(rows, dtype=np.int32))
    check(lib.specla_op_gather_rows(_opts(n_threads, cpu_kernels, device), float_ptr(out), dst_floats, dst_block,
                                    float_ptr(src), src.size, src_block, n_blocks, dst_offsets.ctypes.data,
                                    src_offsets.ctypes.data, int32_ptr(widths), len(fields), int32_ptr(rows), rows.size))
    return out

