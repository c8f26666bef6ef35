"""Tiny qwen35 GGUF files written with gguf.GGUFWriter, for tests.

`write_minimal_qwen35(path, **overrides)` writes a seeded random F32 model of `n_layers` trunk
layers (default 4: layers 0-2 Gated DeltaNet, layer 3 full attention, by the interval rule) with
tiny dims, laid out exactly as the converter writes qwen35 (docs/qwen35.md §1-2), and lets a test
break one thing at a time: drop or retype a key, drop a tensor, change a shape or a tensor type,
add tensors, change the architecture. It returns a `Fixture` with the dims and the arrays it wrote.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gguf import GGUFWriter
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFEndian, GGUFValueType
from gguf.quants import quantize

QT = GGMLQuantizationType

DEFAULT_DIMS = dict(
    E=64,  # embedding_length
    F=96,  # feed_forward_length
    nh=2,  # attention heads
    nkv=1,  # KV heads
    D=32,  # head dim (key_length = value_length)
    rope_dims=16,
    S=16,  # ssm.state_size
    Hk=2,  # ssm.group_count
    Hv=6,  # ssm.time_step_rank (Hv / Hk = 3, the 27B ratio)
    K=4,  # ssm.conv_kernel
    V=40,  # vocabulary rows
    n_ctx=512,  # context_length
)
# Sections for 8 rotated pairs laid out like the real [11, 11, 10, 0] for 32 pairs.
DEFAULT_ROPE_SECTIONS = [3, 3, 2, 0]

DROP = object()
"""As a value in `kv=`: leave that key out of the file."""


@dataclass(frozen=True)
class Typed:
    """A metadata value with an explicit GGUF type (otherwise the type is inferred)."""

    value: Any
    vtype: GGUFValueType
    sub_type: GGUFValueType | None = None


@dataclass
class Fixture:
    path: str
    dims: dict[str, int]
    n_layers: int  # trunk
    nextn: int
    layer_is_recurrent: tuple[bool, ...]
    kv: dict[str, Any]  # key -> value as written (Typed unwrapped)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)  # float values before any retyping
    written: dict[str, tuple[tuple[int, ...], int]] = field(default_factory=dict)  # name -> (ne, type)

    @property
    def conv_channels(self) -> int:
        d = self.dims
        return 2 * d["Hk"] * d["S"] + d["Hv"] * d["S"]


def tensor_shapes(dims: dict[str, int], n_layers: int, layer_is_recurrent, tied: bool) -> dict[str, tuple[int, ...]]:
    """name -> ne (GGUF order) of every trunk tensor."""
    E, F, V = dims["E"], dims["F"], dims["V"]
    S, Hk, Hv, K = dims["S"], dims["Hk"], dims["Hv"], dims["K"]
    nh, nkv, D = dims["nh"], dims["nkv"], dims["D"]
    C = 2 * Hk * S + Hv * S
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (E, V), "output_norm.weight": (E,)}
    if not tied:
        shapes["output.weight"] = (E, V)
    for i in range(n_layers):
        p = f"blk.{i}."
        shapes[p + "attn_norm.weight"] = (E,)
        shapes[p + "post_attention_norm.weight"] = (E,)
        if layer_is_recurrent[i]:
            shapes[p + "attn_qkv.weight"] = (E, C)
            shapes[p + "attn_gate.weight"] = (E, Hv * S)
            shapes[p + "ssm_conv1d.weight"] = (K, C)
            shapes[p + "ssm_dt.bias"] = (Hv,)
            shapes[p + "ssm_a"] = (Hv,)
            shapes[p + "ssm_beta.weight"] = (E, Hv)
            shapes[p + "ssm_alpha.weight"] = (E, Hv)
            shapes[p + "ssm_norm.weight"] = (S,)
            shapes[p + "ssm_out.weight"] = (Hv * S, E)
        else:
            shapes[p + "attn_q.weight"] = (E, 2 * nh * D)
            shapes[p + "attn_k.weight"] = (E, nkv * D)
            shapes[p + "attn_v.weight"] = (E, nkv * D)
            shapes[p + "attn_output.weight"] = (nh * D, E)
            shapes[p + "attn_q_norm.weight"] = (D,)
            shapes[p + "attn_k_norm.weight"] = (D,)
        shapes[p + "ffn_gate.weight"] = (E, F)
        shapes[p + "ffn_up.weight"] = (E, F)
        shapes[p + "ffn_down.weight"] = (F, E)
    return shapes


def random_values(name: str, ne: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Float32 values shaped like the numpy view of a tensor of GGUF shape ne (reversed)."""
    shape = tuple(reversed(ne))
    if name.endswith("norm.weight") and len(ne) == 1:
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)  # converter stores 1 + w
    if name.endswith("ssm_a"):
        return (-np.exp(0.5 * rng.standard_normal(shape))).astype(np.float32)  # -exp(A_log)
    if name.endswith("ssm_dt.bias") or name.endswith("ssm_conv1d.weight"):
        return (0.5 * rng.standard_normal(shape)).astype(np.float32)
    if name == "token_embd.weight":
        return rng.standard_normal(shape).astype(np.float32)
    return (rng.standard_normal(shape) / np.sqrt(ne[0])).astype(np.float32)


def _encode(values: np.ndarray, ne: tuple[int, ...], ggml_type: int, rng: np.random.Generator):
    """(array, raw_dtype) for GGUFWriter.add_tensor holding `values` in `ggml_type`.

    Block types whose rows are not a multiple of the block get a placeholder payload that declares
    the requested ne (the file is then invalid on purpose: that is what such a test checks)."""
    qtype = QT(ggml_type)
    if qtype == QT.F32:
        return values.astype(np.float32), None
    if qtype == QT.F16:
        return values.astype(np.float16), None
    if qtype in (QT.I8, QT.I16, QT.I32, QT.I64, QT.F64):
        dtype = {QT.I8: np.int8, QT.I16: np.int16, QT.I32: np.int32, QT.I64: np.int64, QT.F64: np.float64}[qtype]
        return np.clip(np.round(values * 10), -100, 100).astype(dtype), None
    block_elements, block_bytes = GGML_QUANT_SIZES[qtype]
    if ne[0] % block_elements != 0:
        return np.zeros(tuple(reversed(ne)), dtype=np.float32), qtype  # declares ne, payload is junk
    try:
        return quantize(values, qtype), qtype
    except NotImplementedError:
        pass
    # No encoder in gguf (K-quants, ...): random blocks with small finite f16 scales.
    n_blocks = values.size // block_elements
    blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
    if qtype in (QT.Q4_K, QT.Q5_K, QT.Q2_K):
        blocks[:, 0:2] = scale  # d
        blocks[:, 2:4] = scale  # dmin
    elif qtype in (QT.Q6_K, QT.Q3_K):
        blocks[:, -2:] = scale  # d is last
    byte_shape = (*tuple(reversed(ne))[:-1], ne[0] // block_elements * block_bytes)
    return blocks.reshape(byte_shape), qtype


def _infer_type(value: Any) -> tuple[GGUFValueType, GGUFValueType | None]:
    if isinstance(value, bool):
        return GGUFValueType.BOOL, None
    if isinstance(value, int):
        return (GGUFValueType.UINT32 if value >= 0 else GGUFValueType.INT32), None
    if isinstance(value, float):
        return GGUFValueType.FLOAT32, None
    if isinstance(value, str):
        return GGUFValueType.STRING, None
    if isinstance(value, (list, tuple)):
        first = value[0]
        if isinstance(first, bool):
            sub = GGUFValueType.BOOL
        elif isinstance(first, int):
            sub = GGUFValueType.INT32
        elif isinstance(first, float):
            sub = GGUFValueType.FLOAT32
        else:
            sub = GGUFValueType.STRING
        return GGUFValueType.ARRAY, sub
    raise TypeError(f"cannot infer a GGUF type for {value!r}")


def write_minimal_qwen35(
    path: str | os.PathLike[str],
    *,
    n_layers: int = 4,
    nextn: int = 0,
    arch: str = "qwen35",
    tied: bool = True,
    tokens: bool = True,
    recurrent_layers: list[bool] | None = None,
    full_attention_interval: int | None = 4,
    kv: dict[str, Any] | None = None,
    drop_tensors: tuple[str, ...] | list[str] = (),
    shapes: dict[str, tuple[int, ...]] | None = None,
    types: dict[str, int] | None = None,
    extra_tensors: dict[str, tuple[tuple[int, ...], int]] | None = None,
    big_endian: bool = False,
    seed: int = 0,
    **dims: int,
) -> Fixture:
    """Write a small valid qwen35 GGUF, or one broken in the ways asked for.

    n_layers: trunk depth; nextn: MTP blocks appended (block_count = n_layers + nextn, their tensors
    absent unless given in extra_tensors). recurrent_layers: written as attention.recurrent_layers
    (one entry per block); None derives the pattern from full_attention_interval (None: key absent,
    default 4). kv: full key -> value (python value, Typed, or DROP to omit the key). shapes: tensor
    -> ne to write instead. types: tensor -> GGML type to store it in. extra_tensors: name -> (ne,
    type). big_endian: write a big-endian GGUF. Other keyword arguments override DEFAULT_DIMS
    (E, F, nh, nkv, D, rope_dims, S, Hk, Hv, K, V, n_ctx)."""
    unknown = set(dims) - set(DEFAULT_DIMS)
    if unknown:
        raise TypeError(f"unknown overrides: {sorted(unknown)}")
    d = {**DEFAULT_DIMS, **dims}
    path = os.fspath(path)
    rng = np.random.default_rng(seed)
    n_blocks = n_layers + nextn

    # Which tensors each trunk layer gets: the array where it has an entry (a too-short array is a
    # test of the loader), else the interval rule.
    interval = full_attention_interval if full_attention_interval is not None else 4
    pattern = tuple((i + 1) % interval != 0 if interval > 0 else True for i in range(n_layers))
    if recurrent_layers is not None:
        pattern = tuple(bool(x) for x in recurrent_layers[:n_layers]) + pattern[len(recurrent_layers):]

    a = arch
    values: dict[str, Any] = {
        "general.name": "pyspecla-test-qwen35",
        f"{a}.block_count": n_blocks,
        f"{a}.context_length": d["n_ctx"],
        f"{a}.embedding_length": d["E"],
        f"{a}.feed_forward_length": d["F"],
        f"{a}.attention.head_count": d["nh"],
        f"{a}.attention.head_count_kv": d["nkv"],
        f"{a}.attention.key_length": d["D"],
        f"{a}.attention.value_length": d["D"],
        f"{a}.rope.dimension_count": d["rope_dims"],
        f"{a}.rope.freq_base": 10000000.0,
        f"{a}.rope.dimension_sections": Typed(list(DEFAULT_ROPE_SECTIONS), GGUFValueType.ARRAY, GGUFValueType.INT32),
        f"{a}.attention.layer_norm_rms_epsilon": 1e-6,
        f"{a}.ssm.conv_kernel": d["K"],
        f"{a}.ssm.state_size": d["S"],
        f"{a}.ssm.group_count": d["Hk"],
        f"{a}.ssm.time_step_rank": d["Hv"],
        f"{a}.ssm.inner_size": d["Hv"] * d["S"],
    }
    if full_attention_interval is not None:
        values[f"{a}.full_attention_interval"] = full_attention_interval
    if recurrent_layers is not None:
        values[f"{a}.attention.recurrent_layers"] = Typed(
            [bool(x) for x in recurrent_layers], GGUFValueType.ARRAY, GGUFValueType.BOOL
        )
    if nextn:
        values[f"{a}.nextn_predict_layers"] = nextn
    if tokens:
        values["tokenizer.ggml.model"] = "gpt2"
        values["tokenizer.ggml.tokens"] = [f"tok{i}" for i in range(d["V"])]
    for key, value in (kv or {}).items():
        if value is DROP:
            values.pop(key, None)
        else:
            values[key] = value

    writer = GGUFWriter(path, arch, endianess=GGUFEndian.BIG if big_endian else GGUFEndian.LITTLE)
    if "general.architecture" in (kv or {}):  # the writer adds it itself; let kv replace or drop it
        writer.kv_data[0].pop("general.architecture", None)
    for key, value in values.items():
        if isinstance(value, Typed):
            writer.add_key_value(key, value.value, value.vtype, value.sub_type)
        else:
            vtype, sub = _infer_type(value)
            writer.add_key_value(key, list(value) if isinstance(value, tuple) else value, vtype, sub)

    layout = tensor_shapes(d, n_layers, pattern, tied)
    for name in drop_tensors:
        layout.pop(name)
    for name, ne in (shapes or {}).items():
        layout[name] = tuple(ne)
    wanted_types = {name: QT.F32 for name in layout}
    wanted_types.update({name: QT(t) for name, t in (types or {}).items()})
    for name, (ne, t) in (extra_tensors or {}).items():
        layout[name] = tuple(ne)
        wanted_types[name] = QT(t)

    fixture = Fixture(
        path=path,
        dims=d,
        n_layers=n_layers,
        nextn=nextn,
        layer_is_recurrent=pattern,
        kv={k: (v.value if isinstance(v, Typed) else v) for k, v in values.items()},
    )
    for name, ne in layout.items():
        vals = random_values(name, ne, rng)
        array, raw_dtype = _encode(vals, ne, wanted_types[name], rng)
        if raw_dtype is None:
            writer.add_tensor(name, array)
        else:
            writer.add_tensor(name, array, raw_dtype=raw_dtype)
        fixture.arrays[name] = vals
        fixture.written[name] = (ne, int(wanted_types[name]))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return fixture


def copy_with_a_nan_weight(src: str, dst: str, tensor: str = "output_norm.weight", index: int = 5) -> str:
    """dst = the GGUF src with element `index` of an F32 tensor set to NaN (a file corrupted the way
    that makes every logit NaN: the final norm's weight). Returns dst."""
    import shutil

    from gguf import GGUFReader

    shutil.copy(src, dst)
    info = next(t for t in GGUFReader(dst).tensors if t.name == tensor)
    with open(dst, "r+b") as f:
        f.seek(int(info.data_offset) + 4 * index)
        f.write(np.float32(np.nan).tobytes())
    return dst
