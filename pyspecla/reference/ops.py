"""Numpy oracles of the native ops, with the signatures and layouts of native/include/specla.h.

Every function is pure (inputs are never modified), computes in ``dtype`` (float64 by default, so
the oracle is more accurate than any float32 kernel it judges) and returns float32 arrays.

Layouts (fastest dimension last, as in specla.h):
  - weights: GGUF {n_in, n_out} = numpy (n_out, n_in); y = x @ W.T
  - Gated DeltaNet state: (Hv, S, S) as [head][value j][key i] (the transpose of the math's M[i][j])
  - conv state: (K-1, C), row 0 the oldest raw (pre-conv) input
  - KV cache of one attention layer: (n_kv, nkv, D)
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

__all__ = [
    "dequantize",
    "rms_norm",
    "l2_norm",
    "silu",
    "sigmoid",
    "softplus",
    "matmul",
    "quantize_activations",
    "activations_seen",
    "causal_conv",
    "gated_delta_rule",
    "rope_neox",
    "attention",
    "gather_rows",
]


def _out(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def dequantize(raw, w_type: int, ne0: int, ne1: int = 1) -> np.ndarray:
    """Weight bytes of any GGUF type → float32 array (ne1, ne0), via gguf.quants.dequantize.

    ``raw`` may be bytes, a uint8 array of the raw blocks (any shape), or an already typed array
    (float32 for F32, float16 for F16, as gguf.GGUFReader hands them out)."""
    qtype = GGMLQuantizationType(int(w_type))
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    if ne0 % block_elems != 0:
        raise ValueError(f"row length {ne0} is not a multiple of the {qtype.name} block ({block_elems})")
    if isinstance(raw, (bytes, bytearray, memoryview)):
        raw = np.frombuffer(raw, dtype=np.uint8)
    raw = np.asarray(raw)
    row_bytes = ne0 // block_elems * block_bytes
    if raw.nbytes != ne1 * row_bytes:
        raise ValueError(f"{qtype.name} tensor {ne0}x{ne1}: expected {ne1 * row_bytes} bytes, got {raw.nbytes}")
    as_bytes = np.ascontiguousarray(raw).reshape(-1).view(np.uint8).reshape(ne1, row_bytes)
    values = gguf_quants.dequantize(as_bytes, qtype)
    return np.asarray(values, dtype=np.float32).reshape(ne1, ne0)


def rms_norm(x, weight=None, eps: float = 1e-6, *, dtype=np.float64) -> np.ndarray:
    """y = x / sqrt(mean(x^2) + eps) * weight over the last axis. x (..., n), weight (n,) or None."""
    x = np.asarray(x, dtype=dtype)
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + dtype(eps))
    if weight is not None:
        y = y * np.asarray(weight, dtype=dtype)
    return _out(y)


def l2_norm(x, eps: float = 1e-6, *, dtype=np.float64) -> np.ndarray:
    """y = x / sqrt(sum(x^2) + eps) over the last axis."""
    x = np.asarray(x, dtype=dtype)
    return _out(x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + dtype(eps)))


def _sigmoid(x):
    # split by sign so large |x| never overflows exp
    out = np.empty_like(x)
    pos = x >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-x[pos]))
    e = np.exp(x[~pos])
    out[~pos] = e / (1.0 + e)
    return out


def _softplus(x):
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def sigmoid(x, *, dtype=np.float64) -> np.ndarray:
    return _out(_sigmoid(np.asarray(x, dtype=dtype)))


def silu(x, *, dtype=np.float64) -> np.ndarray:
    x = np.asarray(x, dtype=dtype)
    return _out(x * _sigmoid(x))


def softplus(x, *, dtype=np.float64) -> np.ndarray:
    """x if x > 20 else log(1 + exp(x))."""
    return _out(_softplus(np.asarray(x, dtype=dtype)))


# Weight types whose matmuls round the activations to 8-bit blocks first (llama.cpp's vec_dot
# types): Q8_0, Q4_0, Q5_0 -> blocks of 32 (Q8_0), Q4_K, Q6_K -> blocks of 256 (Q8_K).
_ACTIVATION_BLOCK = {
    GGMLQuantizationType.Q8_0: 32, GGMLQuantizationType.Q4_0: 32, GGMLQuantizationType.Q5_0: 32,
    GGMLQuantizationType.Q4_K: 256, GGMLQuantizationType.Q6_K: 256,
}


def quantize_activations(x, w_type: int) -> tuple[np.ndarray, np.ndarray]:
    """x (n_rows, n) -> (codes int8 (n_rows, n), scales float32 (n_rows, n / block)) as a matmul with
    weights of type w_type sees them (native/backends/cpu/activation_q8.h), in float32 arithmetic:
      blocks of 32:  amax = max |x|; scale = fp16(amax / 127); code = rint(x * (127 / amax))
      blocks of 256: max = the first element of largest magnitude; s = -127 / max;
                     code = min(127, rint(s * x)); scale = 1 / s
    (rint rounds half to even; an all-zero block, or one whose inverse scale overflows, has scale 0
    and codes 0; a block with a NaN or an infinity has scale NaN and codes 0)."""
    qtype = GGMLQuantizationType(int(w_type))
    if qtype not in _ACTIVATION_BLOCK:
        raise ValueError(f"{qtype.name} weights take float activations")
    block = _ACTIVATION_BLOCK[qtype]
    x = np.atleast_2d(np.asarray(x, dtype=np.float32))
    n_rows, n = x.shape
    if n % block:
        raise ValueError(f"row length {n} is not a multiple of {block}")
    xb = x.reshape(n_rows, n // block, block)
    finite = np.isfinite(xb).all(axis=-1)
    safe = np.where(finite[..., None], xb, np.float32(0))
    magnitude = np.abs(safe)
    amax = magnitude.max(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        if block == 32:
            scales = (amax / np.float32(127)).astype(np.float16).astype(np.float32)
            inverse = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
            tiny = ~np.isfinite(inverse)  # amax below ~1e-36: stored as zero
            inverse = np.where(tiny, np.float32(0), inverse)
            scales = np.where(tiny, np.float32(0), scales)
            codes = np.rint(safe * inverse[..., None])
        else:
            first = np.take_along_axis(safe, magnitude.argmax(axis=-1)[..., None], axis=-1)[..., 0]
            iscale = np.where(amax != 0, np.float32(-127) / first, np.float32(0)).astype(np.float32)
            iscale = np.where(np.isfinite(iscale), iscale, np.float32(0))  # amax below ~1e-36: zero
            codes = np.minimum(np.rint(iscale[..., None] * safe), 127)
            scales = np.where(iscale != 0, np.float32(1) / iscale, np.float32(0)).astype(np.float32)
    scales = np.where(finite, scales, np.float32(np.nan)).astype(np.float32)
    codes = np.where(finite[..., None], codes, 0).astype(np.int8)
    return codes.reshape(n_rows, n), scales


def matmul(w_raw, w_type: int, ne0: int, ne1: int, x, *, dtype=np.float64) -> np.ndarray:
    """y (..., ne1) = x (..., ne0) @ dequantize(W).T for a GGUF weight {ne0, ne1} of type w_type.
    For the types in _ACTIVATION_BLOCK, x is first replaced by its 8-bit blocks (code * scale), the
    values the native integer dot products multiply; the product itself is exact (float64)."""
    w = dequantize(w_raw, w_type, ne0, ne1).astype(dtype)
    x = np.asarray(x, dtype=dtype)
    if x.shape[-1] != ne0:
        raise ValueError(f"x has {x.shape[-1]} columns, the weight rows have {ne0}")
    return _out(activations_seen(x, w_type, dtype=dtype) @ w.T)


def activations_seen(x, w_type: int | None, *, dtype=np.float64) -> np.ndarray:
    """The activation values a matmul with weights of type w_type multiplies: x itself, or for the
    types in _ACTIVATION_BLOCK its 8-bit blocks (code * scale, quantized from float32 x). None
    means float activations (weights that did not come from a GGUF type)."""
    x = np.asarray(x)
    if w_type is None or GGMLQuantizationType(int(w_type)) not in _ACTIVATION_BLOCK:
        return x.astype(dtype, copy=False)
    rows = x.reshape(-1, x.shape[-1]).astype(np.float32)
    codes, scales = quantize_activations(rows, w_type)
    block = rows.shape[1] // scales.shape[1]
    seen = codes.reshape(len(rows), -1, block).astype(dtype) * scales.astype(dtype)[..., None]
    return seen.reshape(x.shape)


def causal_conv(x, weight, conv_state, *, dtype=np.float64) -> tuple[np.ndarray, np.ndarray]:
    """Causal depthwise conv + SiLU over T tokens.

    x (T, C) raw inputs; weight (C, K) with k = 0 the oldest sample (the numpy view of GGUF
    ssm_conv1d {K, C}); conv_state (K-1, C), row 0 the oldest raw input.
    Returns (y (T, C), new_conv_state (K-1, C) = the last K-1 raw inputs)."""
    x = np.asarray(x, dtype=dtype)
    weight = np.asarray(weight, dtype=dtype)
    conv_state = np.asarray(conv_state, dtype=dtype)
    T, C = x.shape
    Cw, K = weight.shape
    if Cw != C or conv_state.shape != (K - 1, C):
        raise ValueError(f"causal_conv: x {x.shape}, weight {weight.shape}, conv_state {conv_state.shape}")
    window = np.concatenate([conv_state, x], axis=0)  # (K-1+T, C)
    y = np.zeros((T, C), dtype=dtype)
    for k in range(K):
        y += window[k : k + T] * weight[:, k]
    y = y * _sigmoid(y)
    return _out(y), _out(window[T:])


def gated_delta_rule(q, k, v, g, beta, state, *, dtype=np.float64) -> tuple[np.ndarray, np.ndarray]:
    """Gated delta rule, token by token, for Hv value heads (value head h uses key head h % Hk).

    q, k (T, Hk, S) (already L2-normalised); v (T, Hv, S); g (T, Hv) log-decay <= 0; beta (T, Hv);
    state (Hv, S, S) laid out [head][value j][key i] (so M^T k == state[h] @ k).
    Per token and head: M <- exp(g) M; delta = beta (v - M^T k); M <- M + k (x) delta;
    o = M^T q / sqrt(S). Returns (out (T, Hv, S), new_state (Hv, S, S))."""
    q = np.asarray(q, dtype=dtype)
    k = np.asarray(k, dtype=dtype)
    v = np.asarray(v, dtype=dtype)
    g = np.asarray(g, dtype=dtype)
    beta = np.asarray(beta, dtype=dtype)
    st = np.array(state, dtype=dtype, copy=True)
    T, Hk, S = q.shape
    Hv = v.shape[1]
    if k.shape != (T, Hk, S) or v.shape != (T, Hv, S) or g.shape != (T, Hv) or beta.shape != (T, Hv):
        raise ValueError(f"gated_delta_rule: q {q.shape} k {k.shape} v {v.shape} g {g.shape} beta {beta.shape}")
    if st.shape != (Hv, S, S) or Hv % Hk != 0:
        raise ValueError(f"gated_delta_rule: state {st.shape}, Hv {Hv}, Hk {Hk}")
    key_head = np.arange(Hv) % Hk
    scale = 1.0 / np.sqrt(dtype(S))
    out = np.empty((T, Hv, S), dtype=dtype)
    for t in range(T):
        kt = k[t, key_head]  # (Hv, S)
        qt = q[t, key_head]
        st *= np.exp(g[t])[:, None, None]
        delta = beta[t][:, None] * (v[t] - np.einsum("hji,hi->hj", st, kt))
        st += delta[:, :, None] * kt[:, None, :]
        out[t] = np.einsum("hji,hi->hj", st, qt) * scale
    return _out(out), _out(st)


def rope_neox(x, positions, n_rot: int, freq_base: float, *, dtype=np.float64) -> np.ndarray:
    """NEOX RoPE on the first n_rot dims of each head: pairs (i, i + n_rot/2),
    theta_i = pos * base^(-2i/n_rot); dims >= n_rot untouched. x (T, n_heads, D), positions (T,).
    Returns the rotated copy (the native op works in place)."""
    x = np.asarray(x, dtype=dtype)
    positions = np.asarray(positions)
    T, _, D = x.shape
    if positions.shape != (T,) or n_rot % 2 or n_rot > D:
        raise ValueError(f"rope_neox: x {x.shape}, positions {positions.shape}, n_rot {n_rot}")
    half = n_rot // 2
    inv_freq = dtype(freq_base) ** (-2.0 * np.arange(half, dtype=dtype) / n_rot)
    theta = positions.astype(dtype)[:, None] * inv_freq[None, :]  # (T, half)
    cos = np.cos(theta)[:, None, :]
    sin = np.sin(theta)[:, None, :]
    y = x.copy()
    x0 = x[..., :half]
    x1 = x[..., half:n_rot]
    y[..., :half] = x0 * cos - x1 * sin
    y[..., half:n_rot] = x0 * sin + x1 * cos
    return _out(y)


def attention(q, k_cache, v_cache, positions, *, dtype=np.float64) -> np.ndarray:
    """Causal softmax attention with GQA, scale 1/sqrt(D).

    q (T, nh, D); k_cache, v_cache (n_kv, nkv, D); query t sees cache rows 0..positions[t];
    query head h uses kv head h // (nh // nkv). Returns out (T, nh, D)."""
    q = np.asarray(q, dtype=dtype)
    kc = np.asarray(k_cache, dtype=dtype)
    vc = np.asarray(v_cache, dtype=dtype)
    positions = np.asarray(positions)
    T, nh, D = q.shape
    n_kv, nkv, Dk = kc.shape
    if vc.shape != kc.shape or Dk != D or nh % nkv or positions.shape != (T,):
        raise ValueError(f"attention: q {q.shape}, k {kc.shape}, v {vc.shape}, positions {positions.shape}")
    if T and (positions.min() < 0 or positions.max() >= n_kv):
        raise ValueError(f"attention: positions must lie in [0, {n_kv})")
    kv_head = np.arange(nh) // (nh // nkv)
    k_h = kc[:, kv_head, :]  # (n_kv, nh, D)
    v_h = vc[:, kv_head, :]
    scores = np.einsum("thd,nhd->thn", q, k_h) / np.sqrt(dtype(D))
    visible = np.arange(n_kv)[None, :] <= positions[:, None]  # (T, n_kv)
    scores = np.where(visible[:, None, :], scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    return _out(np.einsum("thn,nhd->thd", p, v_h))


def gather_rows(src, src_block: int, dst_floats: int, dst_block: int, n_blocks: int, fields, rows) -> np.ndarray:
    """The row gather of specla_op_gather_rows: a NaN array of dst_floats in which, for block b, field
    (dst_offset, src_offset, width) and i, the `width` floats of source row rows[i] of the field
    become destination row i. Moved as 32-bit words, so every value keeps its bits."""
    words = np.ascontiguousarray(src, dtype=np.float32).reshape(-1).view(np.uint32)
    out = np.full(dst_floats, np.nan, dtype=np.float32)
    out_words = out.view(np.uint32)
    for b in range(n_blocks):
        for dst_offset, src_offset, width in fields:
            for i, row in enumerate(rows):
                at = b * dst_block + dst_offset + i * width
                start = b * src_block + src_offset + int(row) * width
                out_words[at:at + width] = words[start:start + width]
    return out

