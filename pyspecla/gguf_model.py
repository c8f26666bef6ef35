"""Read and validate a qwen35 (or qwen2 / qwen3) GGUF file; hand its tensors out as zero-copy views of the mmap.

The file is memory-mapped through `gguf.GGUFReader`; no weight byte is ever copied here. Everything
the native model will rely on is checked at this boundary (docs: /work/shared/spec/qwen35-contract.md
sections 1 and 2), so that a bad file becomes one `GGUFError` whose message starts with the file
path and names the key or tensor at fault, never a crash, a hang or a silently wrong model.

Shapes are GGUF `ne` order throughout (fastest dimension first): a weight `{n_in, n_out}` has
ne = (n_in, n_out) and is stored as n_out rows of n_in elements.
"""

from __future__ import annotations

import math
import os
import re
import struct
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGUFReader
from gguf.gguf_reader import ReaderField
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from .errors import GGUFError

__all__ = [
    "ARCHS",
    "SUPPORTED_TYPES",
    "ModelFile",
    "Qwen35HParams",
    "TensorView",
    "tensor_type_name",
]

ARCH = "qwen35"
ARCH_QWEN2 = "qwen2"
ARCH_QWEN3 = "qwen3"
ARCHS = (ARCH, ARCH_QWEN2, ARCH_QWEN3)  # general.architecture values ModelFile.open accepts
ATTENTION_ONLY_ARCHS = (ARCH_QWEN2, ARCH_QWEN3)  # every layer full attention, RoPE over the whole head

# (native specla_layer_weights field, GGUF name suffix after "blk.N." or None) per architecture.
# The field order is that of pyspecla._native.LAYER_TENSOR_FIELDS (+ the qwen2 biases).
_LAYER_TENSOR_SUFFIXES: dict[str, dict[str, str | None]] = {
    ARCH: {
        "attn_norm": "attn_norm.weight",
        "post_attention_norm": "post_attention_norm.weight",
        "attn_qkv": "attn_qkv.weight",
        "attn_gate": "attn_gate.weight",
        "ssm_conv1d": "ssm_conv1d.weight",
        "ssm_dt_bias": "ssm_dt.bias",
        "ssm_a": "ssm_a",
        "ssm_beta": "ssm_beta.weight",
        "ssm_alpha": "ssm_alpha.weight",
        "ssm_norm": "ssm_norm.weight",
        "ssm_out": "ssm_out.weight",
        "attn_q": "attn_q.weight",
        "attn_k": "attn_k.weight",
        "attn_v": "attn_v.weight",
        "attn_output": "attn_output.weight",
        "attn_q_norm": "attn_q_norm.weight",
        "attn_k_norm": "attn_k_norm.weight",
        "ffn_gate": "ffn_gate.weight",
        "ffn_up": "ffn_up.weight",
        "ffn_down": "ffn_down.weight",
        "attn_q_bias": None,
        "attn_k_bias": None,
        "attn_v_bias": None,
    },
    ARCH_QWEN2: {
        "attn_norm": "attn_norm.weight",
        "post_attention_norm": "ffn_norm.weight",
        "attn_qkv": None,
        "attn_gate": None,
        "ssm_conv1d": None,
        "ssm_dt_bias": None,
        "ssm_a": None,
        "ssm_beta": None,
        "ssm_alpha": None,
        "ssm_norm": None,
        "ssm_out": None,
        "attn_q": "attn_q.weight",
        "attn_k": "attn_k.weight",
        "attn_v": "attn_v.weight",
        "attn_output": "attn_output.weight",
        "attn_q_norm": None,
        "attn_k_norm": None,
        "ffn_gate": "ffn_gate.weight",
        "ffn_up": "ffn_up.weight",
        "ffn_down": "ffn_down.weight",
        "attn_q_bias": "attn_q.bias",
        "attn_k_bias": "attn_k.bias",
        "attn_v_bias": "attn_v.bias",
    },
}
# qwen3: the qwen2 layer with per-head q/k norms instead of the q/k/v biases
_LAYER_TENSOR_SUFFIXES[ARCH_QWEN3] = {
    **_LAYER_TENSOR_SUFFIXES[ARCH_QWEN2],
    "attn_q_norm": "attn_q_norm.weight",
    "attn_k_norm": "attn_k_norm.weight",
    "attn_q_bias": None,
    "attn_k_bias": None,
    "attn_v_bias": None,
}

# Tensor types the native matmul / get_rows kernels handle (the GGML ids, as in specla.h). Only
# 2-D weights may use anything but F32: 1-D tensors and ssm_conv1d are checked to be F32 below.
SUPPORTED_TYPES: frozenset[int] = frozenset(
    {
        GGMLQuantizationType.F32,
        GGMLQuantizationType.F16,
        GGMLQuantizationType.BF16,
        GGMLQuantizationType.Q4_0,
        GGMLQuantizationType.Q4_1,
        GGMLQuantizationType.Q5_0,
        GGMLQuantizationType.Q5_1,
        GGMLQuantizationType.Q8_0,
        GGMLQuantizationType.Q4_K,
        GGMLQuantizationType.Q5_K,
        GGMLQuantizationType.Q6_K,
    }
)

_GGUF_MAGIC = b"GGUF"
_MAX_DIMS = 4  # GGML_MAX_DIMS; gguf.cpp rejects more
_INT32_MAX = 2**31 - 1

# struct formats of the scalar GGUF value types (also the element types of numeric arrays)
_SCALAR_FORMATS = {
    GGUFValueType.UINT8: "B",
    GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I",
    GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d",
}


def tensor_type_name(t: int) -> str:
    """GGML type name of a type id ('Q4_K'), or 'unknown(<id>)' for an id gguf does not know."""
    try:
        return GGMLQuantizationType(int(t)).name
    except ValueError:
        return f"unknown({int(t)})"


def _block_size(t: int) -> tuple[int, int]:
    """(elements per block, bytes per block) of a known type."""
    return GGML_QUANT_SIZES[GGMLQuantizationType(int(t))]


@dataclass(frozen=True)
class TensorView:
    """One tensor of the file, viewed in place.

    data is a flat read-only np.uint8 view into the mmap (no copy); it keeps the mapping alive for
    as long as it is referenced. ne is GGUF order, fastest dimension first."""

    name: str
    ggml_type: int
    ne: tuple[int, ...]
    data: np.ndarray
    nbytes: int

    @property
    def type_name(self) -> str:
        return tensor_type_name(self.ggml_type)

    def __repr__(self) -> str:  # the default would print the whole byte array
        return f"TensorView({self.name!r}, {self.type_name}, ne={self.ne}, nbytes={self.nbytes})"


@dataclass(frozen=True)
class Qwen35HParams:
    """Hyper-parameters of the trunk, already cross-checked against each other and the tensors.

    Also used for qwen2 and qwen3 files (arch "qwen2" / "qwen3"): attention-only layers,
    rope_dims = head_dim, rope_sections (0, 0, 0, 0), every ssm field and conv_channels 0, no
    recurrent layer."""

    n_layer: int  # trunk depth = block_count - nextn_predict_layers
    n_layer_file: int  # block_count (trunk + appended MTP blocks)
    nextn_predict_layers: int
    n_ctx_train: int
    n_embd: int  # E
    n_ff: int  # F
    n_vocab: int  # V = token_embd ne[1]
    n_head: int  # nh
    n_head_kv: int  # nkv
    head_dim: int  # D = key_length = value_length
    rope_dims: int  # rotated dims, NEOX pairs (i, i + rope_dims/2)
    rope_freq_base: float
    rope_sections: tuple  # 4 ints (IMROPE sections; for text they reduce to plain NEOX)
    rms_eps: float
    ssm_conv_kernel: int  # K
    ssm_state_size: int  # S
    ssm_group_count: int  # Hk
    ssm_time_step_rank: int  # Hv
    ssm_inner_size: int  # Hv * S
    layer_is_recurrent: tuple[bool, ...]  # [n_layer]
    conv_channels: int  # C = 2*Hk*S + Hv*S
    arch: str = ARCH  # general.architecture: "qwen35", "qwen2" or "qwen3"


# --------------------------------------------------------------------------------------------
# Reading the container
# --------------------------------------------------------------------------------------------


class _FormatError(Exception):
    """A structural problem found while parsing; ModelFile.open prefixes the path."""


class _BoundedReader(GGUFReader):
    """GGUFReader that never reads past the end of the file and parses metadata fast.

    The stock reader slices the memmap, so a read beyond the end silently returns a short (often
    empty) array: a truncated numeric array then loops over its declared length without advancing,
    which for a corrupt length is a hang. Bounding every read makes each parse step either consume
    bytes or fail, so parsing always ends.

    The stock key/value parser also builds two numpy views per array element, which takes tens of
    seconds on a real qwen35 vocabulary (~250k tokens, ~250k merges). `_build_fields` is replaced by
    a struct-based parser that decodes every value straight into `self.kv_values` (plain python).
    Its ReaderFields keep the stock layout for scalars and strings; a numeric array is one part
    holding all elements, and an array of strings carries no per-element parts (read kv_values).

    Tensor infos are checked before the reader maps their data so that an error names the tensor."""

    kv_values: dict[str, object]

    def _get(self, offset, dtype, count=1, *args, **kwargs):
        count = int(count)
        need = np.dtype(dtype).itemsize * count
        size = int(self.data.size)
        if offset < 0 or count < 0 or offset + need > size:
            raise _FormatError(
                f"file is truncated or corrupt: needs bytes [{offset}, {offset + need}) "
                f"but the file has {size} bytes"
            )
        return super()._get(offset, dtype, count, *args, **kwargs)

    def _build_fields(self, offs, count):
        self.kv_values = {}
        buf = memoryview(self.data).cast("B")
        size = len(buf)
        host = "<" if sys.byteorder == "little" else ">"
        endian = host if self.byte_order == "I" else {"<": ">", ">": "<"}[host]  # "S": swapped

        def need(at: int, n: int, what: str) -> None:
            if n < 0 or at + n > size:
                raise _FormatError(
                    f"file is truncated or corrupt: {what} needs bytes [{at}, {at + n}) "
                    f"but the file has {size} bytes"
                )

        def unpack(fmt: str, at: int, what: str):
            n = struct.calcsize(fmt)
            need(at, n, what)
            return struct.unpack_from(endian + fmt, buf, at)[0], at + n

        def string(at: int, what: str) -> tuple[str, int]:
            length, at = unpack("Q", at, what)
            need(at, length, what)
            raw = bytes(buf[at : at + length])
            try:
                return raw.decode("utf-8"), at + length
            except UnicodeDecodeError as e:
                raise _FormatError(f"{what} is not valid UTF-8 ({e})") from None

        for index in range(int(count)):
            field_offset = offs
            key, offs = string(offs, f"key #{index}")
            if key in self.kv_values:
                raise _FormatError(f"duplicate key '{key}'")
            raw_type, offs = unpack("I", offs, f"key '{key}'")
            value_offset = offs
            if raw_type in _SCALAR_FORMATS:
                value, offs = unpack(_SCALAR_FORMATS[raw_type], offs, f"key '{key}'")
                parts = [self._get(value_offset, np.dtype(_SCALAR_FORMATS[raw_type]))]  # _get swaps
                types = [GGUFValueType(raw_type)]
            elif raw_type == GGUFValueType.STRING:
                value, offs = string(offs, f"key '{key}'")
                parts = [
                    self._get(value_offset, np.uint64),
                    self._get(value_offset + 8, np.uint8, offs - value_offset - 8),
                ]
                types = [GGUFValueType.STRING]
            elif raw_type == GGUFValueType.ARRAY:
                item_type, offs = unpack("I", offs, f"key '{key}'")
                length, offs = unpack("Q", offs, f"key '{key}'")
                parts = [self._get(value_offset, np.uint32), self._get(value_offset + 4, np.uint64)]
                if item_type in _SCALAR_FORMATS:
                    dtype = np.dtype(_SCALAR_FORMATS[item_type])  # native; _get applies the file's order
                    need(offs, length * dtype.itemsize, f"key '{key}' ({length} elements)")
                    items = self._get(offs, dtype, length)
                    value = items.tolist()
                    parts.append(items)
                    offs += length * dtype.itemsize
                elif item_type == GGUFValueType.STRING:
                    need(offs, length * 8, f"key '{key}' ({length} strings)")  # bounds the loop
                    value = []
                    for i in range(length):
                        item, offs = string(offs, f"key '{key}' element {i}")
                        value.append(item)
                elif item_type == GGUFValueType.ARRAY:
                    raise _FormatError(f"key '{key}' is a nested array (not supported, as in llama.cpp)")
                else:
                    raise _FormatError(f"key '{key}' is an array of unknown value type {item_type}")
                types = [GGUFValueType.ARRAY] if length == 0 else [GGUFValueType.ARRAY, GGUFValueType(item_type)]
            else:
                raise _FormatError(f"key '{key}' has unknown value type {raw_type}")
            self.kv_values[key] = value
            # Same leading parts as the stock reader: key length, key bytes, value type.
            all_parts = [
                self._get(field_offset, np.uint64),
                self._get(field_offset + 8, np.uint8, value_offset - 4 - field_offset - 8),
                self._get(value_offset - 4, np.uint32),
                *parts,
            ]
            string_array = raw_type == GGUFValueType.ARRAY and len(parts) == 2
            data = [] if string_array else [len(all_parts) - 1]
            self._push_field(ReaderField(field_offset, key, all_parts, data, types), skip_sum=True)
        return offs

    def _build_tensors(self, start_offs, fields):
        file_size = int(self.data.size)
        alignment = int(self.alignment)
        for field in fields:
            _name_len, name_data, _n_dims, dims, raw_dtype, offset_tensor = field.parts
            name = bytes(name_data).decode("utf-8", errors="replace")
            type_id = int(raw_dtype[0])
            ne = tuple(int(d) for d in dims)
            if len(ne) > _MAX_DIMS:
                raise _FormatError(f"tensor '{name}' has {len(ne)} dimensions (at most {_MAX_DIMS})")
            try:
                block_elements, block_bytes = _block_size(type_id)
            except (ValueError, KeyError):
                raise _FormatError(f"tensor '{name}' has unknown type id {type_id}") from None
            if ne and ne[0] % block_elements != 0:
                raise _FormatError(
                    f"tensor '{name}' of type {tensor_type_name(type_id)} has rows of {ne[0]} elements, "
                    f"not a multiple of its block size {block_elements}"
                )
            n_elements = math.prod(ne)
            nbytes = n_elements // block_elements * block_bytes
            relative = int(offset_tensor[0])
            if relative % alignment != 0:
                raise _FormatError(
                    f"tensor '{name}' data offset {relative} is not a multiple of the alignment {alignment}"
                )
            begin = int(start_offs) + relative
            if begin + nbytes > file_size:
                raise _FormatError(
                    f"tensor '{name}' data [{begin}, {begin + nbytes}) lies outside the file "
                    f"({file_size} bytes): file is truncated or corrupt"
                )
        super()._build_tensors(start_offs, fields)


def _open_reader(path: str) -> GGUFReader:
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise GGUFError(f"{path}: cannot open file ({e.strerror or e})") from None
    if magic != _GGUF_MAGIC:
        if not magic:
            found = "empty file"
        elif len(magic) < len(_GGUF_MAGIC):
            found = f"only {len(magic)} bytes long"
        else:
            found = f"starts with {magic!r}, expected {_GGUF_MAGIC!r}"
        raise GGUFError(f"{path}: not a GGUF file ({found})")

    failure = None
    try:
        reader = _BoundedReader(path, "r")
    except _FormatError as e:
        failure = str(e)
    except Exception as e:  # the reader raises ValueError, IndexError, KeyError, OSError, ...
        failure = f"cannot parse GGUF ({type(e).__name__}: {e})"
    if failure is not None:
        # Raised outside the except block so no traceback keeps the half-built reader (and its
        # mmap) alive.
        raise GGUFError(f"{path}: {failure}")
    if reader.byte_order != "I":
        raise GGUFError(f"{path}: big-endian (byte-swapped) GGUF files are not supported")
    return reader


# --------------------------------------------------------------------------------------------
# Metadata
# --------------------------------------------------------------------------------------------


def open_validated(path, validate):
    """Map a GGUF and hand it to validate(path, reader), which returns the loaded file object or
    raises GGUFError. The error is re-raised outside the except block: the first traceback's frames
    would otherwise keep the reader, and so the mmap, alive as long as the caller holds it."""
    path = os.fspath(path)
    reader = _open_reader(path)
    message = None
    try:
        return validate(path, reader)
    except GGUFError as e:
        message = str(e)
    del reader
    raise GGUFError(message)


def _read_metadata(reader: _BoundedReader) -> dict[str, object]:
    """Every key -> plain python value (str, int, float, bool, or a list of one of those)."""
    return dict(reader.kv_values)


_REQUIRED = object()


class _Keys:
    """Typed access to the metadata with messages that name the full key."""

    def __init__(self, path: str, metadata: dict[str, object], arch: str):
        self.path = path
        self.metadata = metadata
        self.arch = arch

    def key(self, name: str) -> str:
        return f"{self.arch}.{name}"

    def fail(self, name: str, what: str) -> GGUFError:
        return GGUFError(f"{self.path}: key '{self.key(name)}' {what}")

    def raw(self, name: str, default: object = _REQUIRED) -> object:
        full = self.key(name)
        if full not in self.metadata:
            if default is _REQUIRED:
                raise GGUFError(f"{self.path}: missing required key '{full}'")
            return default
        return self.metadata[full]

    def _as_int(self, name: str, value: object, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(name, f"must be an integer, got {value!r}")
        if value < minimum:
            raise self.fail(name, f"must be >= {minimum}, got {value}")
        if value > _INT32_MAX:
            raise self.fail(name, f"is too large ({value})")
        return value

    def present(self, name: str) -> bool:
        return self.key(name) in self.metadata

    def int(self, name: str, default: object = _REQUIRED, minimum: int = 1) -> int:
        if default is not _REQUIRED and not self.present(name):
            return default  # type: ignore[return-value]
        return self._as_int(name, self.raw(name), minimum)

    def per_layer_int(self, name: str, layers: list[int], n_layer_file: int, default: object = _REQUIRED) -> int:
        """An integer that llama.cpp also accepts as a per-layer array; only uniform values are
        supported, judged on `layers` (the trunk layers that use it)."""
        if default is not _REQUIRED and not self.present(name):
            return default  # type: ignore[return-value]
        value = self.raw(name)
        if not isinstance(value, list):
            return self._as_int(name, value, 1)
        if len(value) != n_layer_file:
            raise self.fail(name, f"has {len(value)} entries, expected block_count = {n_layer_file}")
        used = {self._as_int(name, value[i], 1) for i in layers}
        if len(used) > 1:
            raise self.fail(name, f"varies by layer ({sorted(used)}): per-layer values are not supported")
        if not used:
            raise self.fail(name, "has no value for any layer that uses it")
        return used.pop()

    def float(self, name: str, default: object = _REQUIRED) -> float:
        if default is not _REQUIRED and not self.present(name):
            return default  # type: ignore[return-value]
        value = self.raw(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(name, f"must be a number, got {value!r}")
        value = float(value)
        if not math.isfinite(value) or value <= 0.0:
            raise self.fail(name, f"must be a positive finite number, got {value}")
        return value


def read_full_rope_head_dim(keys: _Keys, n_embd: int, n_head: int, why: str) -> int:
    """Head dim of an architecture whose RoPE turns the whole head (qwen2, DFlash drafts):
    key_length (default E / n_head) == value_length, even, and rope.dimension_count (if present)
    equal to it; `why` ends the message when it is not."""
    default_head_dim = n_embd // n_head if n_embd % n_head == 0 else _REQUIRED
    key_length = keys.int("attention.key_length", default_head_dim)
    value_length = keys.int("attention.value_length", key_length)
    if key_length != value_length:
        raise keys.fail("attention.value_length", f"= {value_length} differs from attention.key_length = {key_length}")
    if key_length % 2 != 0:
        raise keys.fail("attention.key_length", f"= {key_length}: the head dim must be even (RoPE rotates pairs)")
    rope_dims = keys.int("rope.dimension_count", key_length)
    if rope_dims != key_length:
        raise keys.fail("rope.dimension_count", f"= {rope_dims} differs from the head dim {key_length}: {why}")
    return key_length


def _layer_pattern(keys: _Keys, n_layer: int, n_layer_file: int) -> tuple[bool, ...]:
    """attention.recurrent_layers (one bool per block, MTP blocks included) wins over
    full_attention_interval (layer i recurrent iff (i + 1) % interval != 0)."""
    name = "attention.recurrent_layers"
    flags = keys.raw(name, None)
    if flags is not None:
        if not isinstance(flags, list):
            flags = [flags] * n_layer_file  # llama.cpp's get_key_or_arr fills from a scalar
        if len(flags) != n_layer_file:
            raise keys.fail(name, f"has {len(flags)} entries, expected block_count = {n_layer_file}")
        for i, flag in enumerate(flags[:n_layer]):
            if not (isinstance(flag, bool) or (isinstance(flag, int) and flag in (0, 1))):
                raise keys.fail(name, f"entry {i} must be a bool, got {flag!r}")
        return tuple(bool(f) for f in flags[:n_layer])
    interval = keys.int("full_attention_interval", 4)
    return tuple((i + 1) % interval != 0 for i in range(n_layer))


def _check_rope_sections(keys: _Keys, sections: tuple[int, ...], rope_dims: int, head_dim: int) -> None:
    """llama.cpp runs IMROPE with text positions [p, p, p, 0]. The native side implements the plain
    NEOX rotation that this reduces to when every rotated pair falls into one of the first three
    sections; a pair mapped to the 4th (position 0) section would stay unrotated in llama.cpp."""
    name = "rope.dimension_sections"
    if any(s < 0 for s in sections):
        raise keys.fail(name, f"has a negative section: {list(sections)}")
    total = sum(sections)
    if sections[0] + sections[1] + sections[2] <= 0:
        raise keys.fail(name, f"must have a positive section among the first three: {list(sections)}")
    if total > head_dim:
        raise keys.fail(name, f"sums to {total}, more than the head dim {head_dim}")
    for pair in range(rope_dims // 2):
        sector = pair % total
        if not (
            (sector % 3 == 0 and sector < 3 * sections[0])
            or (sector % 3 == 1 and sector < 3 * sections[1])
            or (sector % 3 == 2 and sector < 3 * sections[2])
        ):
            raise keys.fail(
                name,
                f"= {list(sections)} leaves rotated pair {pair} on the 4th position stream; for text "
                "llama.cpp would not rotate it and plain NEOX RoPE cannot reproduce that",
            )


def _check_vocab(keys: _Keys, n_vocab: int) -> None:
    path, metadata = keys.path, keys.metadata
    vocab_size = keys.raw("vocab_size", None)
    if vocab_size is not None and vocab_size != n_vocab:
        raise keys.fail("vocab_size", f"= {vocab_size} differs from the token_embd.weight rows {n_vocab}")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if tokens is not None:
        if not isinstance(tokens, list):
            raise GGUFError(f"{path}: key 'tokenizer.ggml.tokens' must be an array of strings")
        if len(tokens) != n_vocab:
            raise GGUFError(
                f"{path}: key 'tokenizer.ggml.tokens' has {len(tokens)} entries but token_embd.weight "
                f"has {n_vocab} rows"
            )


def _read_hparams_attention_only(path: str, metadata: dict[str, object], n_vocab: int,
                                 arch: str = ARCH_QWEN2) -> Qwen35HParams:
    """qwen2 (Qwen2 / Qwen2.5) and qwen3 (Qwen3): attention-only, NEOX RoPE over the whole head
    (same keys; the layers differ in tensors only)."""
    keys = _Keys(path, metadata, arch)

    n_layer = keys.int("block_count")
    all_layers = list(range(n_layer))
    n_ctx_train = keys.int("context_length")
    n_embd = keys.int("embedding_length")
    n_ff = keys.per_layer_int("feed_forward_length", all_layers, n_layer)
    n_head = keys.per_layer_int("attention.head_count", all_layers, n_layer)
    n_head_kv = keys.per_layer_int("attention.head_count_kv", all_layers, n_layer, n_head)
    if n_head % n_head_kv != 0:
        raise keys.fail("attention.head_count_kv", f"= {n_head_kv} does not divide attention.head_count = {n_head}")

    head_dim = read_full_rope_head_dim(keys, n_embd, n_head, f"{arch} rotates the whole head")
    rope_freq_base = keys.float("rope.freq_base", 10000.0)
    rms_eps = keys.float("attention.layer_norm_rms_epsilon")

    _check_vocab(keys, n_vocab)
    if 2 * n_head * head_dim > _INT32_MAX:
        raise GGUFError(f"{path}: attention width {2 * n_head * head_dim} does not fit in int32")

    return Qwen35HParams(
        n_layer=n_layer,
        n_layer_file=n_layer,
        nextn_predict_layers=0,
        n_ctx_train=n_ctx_train,
        n_embd=n_embd,
        n_ff=n_ff,
        n_vocab=n_vocab,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        rope_dims=head_dim,
        rope_freq_base=rope_freq_base,
        rope_sections=(0, 0, 0, 0),
        rms_eps=rms_eps,
        ssm_conv_kernel=0,
        ssm_state_size=0,
        ssm_group_count=0,
        ssm_time_step_rank=0,
        ssm_inner_size=0,
        layer_is_recurrent=(False,) * n_layer,
        conv_channels=0,
        arch=arch,
    )


def _read_hparams(path: str, metadata: dict[str, object], n_vocab: int) -> Qwen35HParams:
    keys = _Keys(path, metadata, ARCH)

    n_layer_file = keys.int("block_count")
    nextn = keys.int("nextn_predict_layers", 0, minimum=0)
    if nextn >= n_layer_file:
        raise keys.fail(
            "nextn_predict_layers", f"= {nextn} leaves no trunk layer (block_count = {n_layer_file})"
        )
    n_layer = n_layer_file - nextn
    n_ctx_train = keys.int("context_length")
    n_embd = keys.int("embedding_length")

    layer_is_recurrent = _layer_pattern(keys, n_layer, n_layer_file)
    attention_layers = [i for i in range(n_layer) if not layer_is_recurrent[i]]
    if not attention_layers:
        raise GGUFError(
            f"{path}: every trunk layer is recurrent (see '{keys.key('attention.recurrent_layers')}' / "
            f"'{keys.key('full_attention_interval')}'); llama.cpp requires at least one attention layer"
        )

    n_ff = keys.per_layer_int("feed_forward_length", list(range(n_layer)), n_layer_file)
    n_head = keys.per_layer_int("attention.head_count", attention_layers, n_layer_file)
    n_head_kv = keys.per_layer_int("attention.head_count_kv", attention_layers, n_layer_file, n_head)
    if n_head % n_head_kv != 0:
        raise keys.fail("attention.head_count_kv", f"= {n_head_kv} does not divide attention.head_count = {n_head}")

    default_head_dim = n_embd // n_head if n_embd % n_head == 0 else _REQUIRED
    key_length = keys.int("attention.key_length", default_head_dim)
    value_length = keys.int("attention.value_length", key_length)
    if key_length != value_length:
        raise keys.fail("attention.value_length", f"= {value_length} differs from attention.key_length = {key_length}")
    head_dim = key_length

    rope_dims = keys.int("rope.dimension_count", head_dim)
    if rope_dims % 2 != 0 or rope_dims > head_dim:
        raise keys.fail("rope.dimension_count", f"= {rope_dims} must be even and at most the head dim {head_dim}")
    rope_freq_base = keys.float("rope.freq_base", 10000.0)

    sections_value = keys.raw("rope.dimension_sections")
    if not isinstance(sections_value, list):
        sections_value = [sections_value] * 4  # llama.cpp's get_key_or_arr fills from a scalar
    if len(sections_value) != 4:
        raise keys.fail("rope.dimension_sections", f"has {len(sections_value)} entries, expected 4")
    for s in sections_value:
        if isinstance(s, bool) or not isinstance(s, int):
            raise keys.fail("rope.dimension_sections", f"must hold integers, got {sections_value!r}")
    rope_sections = tuple(int(s) for s in sections_value)
    _check_rope_sections(keys, rope_sections, rope_dims, head_dim)

    rms_eps = keys.float("attention.layer_norm_rms_epsilon")

    conv_kernel = keys.int("ssm.conv_kernel")
    state_size = keys.int("ssm.state_size")
    group_count = keys.int("ssm.group_count")
    time_step_rank = keys.int("ssm.time_step_rank")
    inner_size = keys.int("ssm.inner_size")
    if time_step_rank % group_count != 0:
        raise keys.fail(
            "ssm.group_count", f"= {group_count} does not divide ssm.time_step_rank = {time_step_rank}"
        )
    if inner_size != time_step_rank * state_size:
        raise keys.fail(
            "ssm.inner_size",
            f"= {inner_size}, expected ssm.time_step_rank * ssm.state_size = {time_step_rank * state_size}",
        )
    conv_channels = 2 * group_count * state_size + time_step_rank * state_size

    _check_vocab(keys, n_vocab)

    for label, value in (("conv channels", conv_channels), ("attention width", 2 * n_head * head_dim)):
        if value > _INT32_MAX:
            raise GGUFError(f"{path}: {label} {value} does not fit in int32")

    return Qwen35HParams(
        n_layer=n_layer,
        n_layer_file=n_layer_file,
        nextn_predict_layers=nextn,
        n_ctx_train=n_ctx_train,
        n_embd=n_embd,
        n_ff=n_ff,
        n_vocab=n_vocab,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        rope_dims=rope_dims,
        rope_freq_base=rope_freq_base,
        rope_sections=rope_sections,
        rms_eps=rms_eps,
        ssm_conv_kernel=conv_kernel,
        ssm_state_size=state_size,
        ssm_group_count=group_count,
        ssm_time_step_rank=time_step_rank,
        ssm_inner_size=inner_size,
        layer_is_recurrent=layer_is_recurrent,
        conv_channels=conv_channels,
        arch=ARCH,
    )


# --------------------------------------------------------------------------------------------
# Tensors
# --------------------------------------------------------------------------------------------

_MATRIX = "matrix"  # any supported type
_F32_ONLY = "f32"  # 1-D tensors and ssm_conv1d: what the converter writes and ggml's ops require


@dataclass(frozen=True)
class _Expected:
    ne: tuple[int, ...]
    kind: str
    required: bool = True


def _expected_tensors(hp: Qwen35HParams) -> dict[str, _Expected]:
    E, F, V = hp.n_embd, hp.n_ff, hp.n_vocab
    S, Hk, Hv, K, C = hp.ssm_state_size, hp.ssm_group_count, hp.ssm_time_step_rank, hp.ssm_conv_kernel, hp.conv_channels
    nh, nkv, D = hp.n_head, hp.n_head_kv, hp.head_dim
    expected = {
        "token_embd.weight": _Expected((E, V), _MATRIX),
        "output_norm.weight": _Expected((E,), _F32_ONLY),
        "output.weight": _Expected((E, V), _MATRIX, required=False),
    }
    if hp.arch in ATTENTION_ONLY_ARCHS:
        if hp.arch == ARCH_QWEN2:
            extra = {"attn_q.bias": _Expected((nh * D,), _F32_ONLY), "attn_k.bias": _Expected((nkv * D,), _F32_ONLY),
                     "attn_v.bias": _Expected((nkv * D,), _F32_ONLY)}
        else:
            extra = {"attn_q_norm.weight": _Expected((D,), _F32_ONLY), "attn_k_norm.weight": _Expected((D,), _F32_ONLY)}
        for i in range(hp.n_layer):
            layer = {
                "attn_norm.weight": _Expected((E,), _F32_ONLY),
                "attn_q.weight": _Expected((E, nh * D), _MATRIX),
                "attn_k.weight": _Expected((E, nkv * D), _MATRIX),
                "attn_v.weight": _Expected((E, nkv * D), _MATRIX),
                **extra,
                "attn_output.weight": _Expected((nh * D, E), _MATRIX),
                "ffn_norm.weight": _Expected((E,), _F32_ONLY),
                "ffn_gate.weight": _Expected((E, F), _MATRIX),
                "ffn_up.weight": _Expected((E, F), _MATRIX),
                "ffn_down.weight": _Expected((F, E), _MATRIX),
            }
            expected.update({f"blk.{i}.{suffix}": spec for suffix, spec in layer.items()})
        return expected
    for i in range(hp.n_layer):
        layer = {
            "attn_norm.weight": _Expected((E,), _F32_ONLY),
            "post_attention_norm.weight": _Expected((E,), _F32_ONLY),
            "ffn_gate.weight": _Expected((E, F), _MATRIX),
            "ffn_up.weight": _Expected((E, F), _MATRIX),
            "ffn_down.weight": _Expected((F, E), _MATRIX),
        }
        if hp.layer_is_recurrent[i]:
            layer.update(
                {
                    "attn_qkv.weight": _Expected((E, C), _MATRIX),
                    "attn_gate.weight": _Expected((E, Hv * S), _MATRIX),
                    "ssm_conv1d.weight": _Expected((K, C), _F32_ONLY),
                    "ssm_dt.bias": _Expected((Hv,), _F32_ONLY),
                    "ssm_a": _Expected((Hv,), _F32_ONLY),
                    "ssm_beta.weight": _Expected((E, Hv), _MATRIX),
                    "ssm_alpha.weight": _Expected((E, Hv), _MATRIX),
                    "ssm_norm.weight": _Expected((S,), _F32_ONLY),
                    "ssm_out.weight": _Expected((Hv * S, E), _MATRIX),
                }
            )
        else:
            layer.update(
                {
                    "attn_q.weight": _Expected((E, 2 * nh * D), _MATRIX),
                    "attn_k.weight": _Expected((E, nkv * D), _MATRIX),
                    "attn_v.weight": _Expected((E, nkv * D), _MATRIX),
                    "attn_output.weight": _Expected((nh * D, E), _MATRIX),
                    "attn_q_norm.weight": _Expected((D,), _F32_ONLY),
                    "attn_k_norm.weight": _Expected((D,), _F32_ONLY),
                }
            )
        expected.update({f"blk.{i}.{suffix}": spec for suffix, spec in layer.items()})
    return expected


def _same_shape(actual: tuple[int, ...], expected: tuple[int, ...]) -> bool:
    """Equal up to trailing 1s, as llama.cpp's check_tensor_dims compares."""
    def strip(ne: tuple[int, ...]) -> tuple[int, ...]:
        ne = list(ne)
        while ne and ne[-1] == 1:
            ne.pop()
        return tuple(ne)

    return strip(actual) == strip(expected)


def _layer_label(hp: Qwen35HParams, i: int) -> str:
    if hp.arch in ATTENTION_ONLY_ARCHS:
        return f"layer {i}"
    return f"recurrent layer {i}" if hp.layer_is_recurrent[i] else f"attention layer {i}"


_BLOCK_NAME = re.compile(r"blk\.(\d+)\.")


def _check_tensors(path: str, hp: Qwen35HParams, tensors: dict[str, TensorView]) -> None:
    # Files converted with --fuse-qkv reuse the recurrent layers' name for a fused Q/K/V.
    for i in range(hp.n_layer):
        name = f"blk.{i}.attn_qkv.weight"
        if hp.arch == ARCH and not hp.layer_is_recurrent[i] and name in tensors:
            raise GGUFError(
                f"{path}: tensor '{name}' is a fused Q/K/V in attention layer {i} (converted with "
                "--fuse-qkv): not supported yet; convert without --fuse-qkv"
            )

    expected = _expected_tensors(hp)
    for name, spec in expected.items():
        view = tensors.get(name)
        match = _BLOCK_NAME.match(name)
        where = f" ({_layer_label(hp, int(match.group(1)))})" if match else ""
        if view is None:
            if spec.required:
                raise GGUFError(f"{path}: missing tensor '{name}'{where}")
            continue
        if not _same_shape(view.ne, spec.ne):
            raise GGUFError(
                f"{path}: tensor '{name}'{where} has shape ne={list(view.ne)}, expected ne={list(spec.ne)}"
            )
        if spec.kind == _F32_ONLY and view.ggml_type != GGMLQuantizationType.F32:
            raise GGUFError(f"{path}: tensor '{name}' has type {view.type_name}; it must be F32")
        if view.ggml_type not in SUPPORTED_TYPES:
            supported = ", ".join(tensor_type_name(t) for t in sorted(SUPPORTED_TYPES))
            raise GGUFError(
                f"{path}: tensor '{name}' has unsupported type {view.type_name} (supported: {supported})"
            )
        for dim in view.ne:
            if dim > _INT32_MAX:
                raise GGUFError(f"{path}: tensor '{name}' dimension {dim} does not fit in int32")

    # llama.cpp refuses a file with tensors it did not load; here an unknown trunk tensor (a bias,
    # say) would otherwise be silently ignored and change the results. MTP blocks are not checked.
    for name in tensors:
        if name in expected:
            continue
        match = _BLOCK_NAME.match(name)
        if match:
            i = int(match.group(1))
            if hp.n_layer <= i < hp.n_layer_file:
                continue
            if hp.arch == ARCH_QWEN2 and i < hp.n_layer:
                raise GGUFError(
                    f"{path}: unexpected tensor '{name}' in layer {i}: not part of a qwen2 layer "
                    "(only attn_q/attn_k/attn_v carry biases) and pyspecla does not support it"
                )
            if hp.arch == ARCH_QWEN3 and i < hp.n_layer:
                raise GGUFError(
                    f"{path}: unexpected tensor '{name}' in layer {i}: not part of a qwen3 layer "
                    "(no biases; q/k norms only) and pyspecla does not support it"
                )
            if i < hp.n_layer and name.endswith(".bias"):
                raise GGUFError(
                    f"{path}: unexpected tensor '{name}' in {_layer_label(hp, i)}: qwen35 has no biases "
                    "there and pyspecla does not support them"
                )
            if i < hp.n_layer:
                raise GGUFError(
                    f"{path}: unexpected tensor '{name}' in {_layer_label(hp, i)}: not part of a qwen35 "
                    "trunk layer of that type (check attention.recurrent_layers / full_attention_interval)"
                )
            raise GGUFError(f"{path}: unexpected tensor '{name}': block index {i} >= block_count {hp.n_layer_file}")
        raise GGUFError(f"{path}: unexpected tensor '{name}': not part of a {hp.arch} model")


def _tensor_views(path: str, reader: GGUFReader) -> dict[str, TensorView]:
    views: dict[str, TensorView] = {}
    for t in reader.tensors:
        data = np.asarray(t.data).reshape(-1).view(np.uint8)
        if data.size != int(t.n_bytes) or not np.shares_memory(data, reader.data):
            raise GGUFError(f"{path}: tensor '{t.name}' could not be mapped in place")
        views[t.name] = TensorView(
            name=t.name,
            ggml_type=int(t.tensor_type),
            ne=tuple(int(d) for d in t.shape),
            data=data,
            nbytes=int(t.n_bytes),
        )
    return views


# --------------------------------------------------------------------------------------------
# The public object
# --------------------------------------------------------------------------------------------


class ModelFile:
    """A validated qwen35, qwen2 or qwen3 GGUF, memory-mapped.

    Attributes: path, arch ("qwen35", "qwen2" or "qwen3", = hparams.arch), hparams, metadata (every key -> plain python value), tensors (every
    tensor of the file, MTP blocks included, as zero-copy TensorViews), tied_output (no output.weight:
    the LM head is token_embd), gguf_version."""

    path: str
    arch: str
    hparams: Qwen35HParams
    metadata: dict[str, object]
    tensors: dict[str, TensorView]
    tied_output: bool
    gguf_version: int

    def __init__(self, path: str, reader: GGUFReader, metadata: dict[str, object], hparams: Qwen35HParams,
                 tensors: dict[str, TensorView]):
        self.path = path
        self.arch = hparams.arch
        self.hparams = hparams
        self.metadata = metadata
        self.tensors = tensors
        self.tied_output = "output.weight" not in tensors
        version = reader.fields.get("GGUF.version")
        self.gguf_version = int(version.parts[0][0]) if version is not None else 0
        self._reader: GGUFReader | None = reader

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> "ModelFile":
        """Map and validate a qwen35, qwen2 or qwen3 GGUF. Raises GGUFError (message starts with the path)."""
        return open_validated(path, cls._validate)

    @classmethod
    def _validate(cls, path: str, reader: GGUFReader) -> "ModelFile":
        metadata = _read_metadata(reader)

        arch = metadata.get("general.architecture")
        if arch is None:
            raise GGUFError(f"{path}: missing required key 'general.architecture'")
        if not isinstance(arch, str):
            raise GGUFError(f"{path}: key 'general.architecture' must be a string, got {arch!r}")
        if arch == "qwen35moe":
            raise GGUFError(
                f"{path}: architecture 'qwen35moe' (the MoE sibling of qwen35) is not supported yet (expected qwen35)"
            )
        if arch not in ARCHS:
            if arch in ("qwen35-dflash-draft", "dflash-draft", "dflash"):
                raise GGUFError(f"{path}: is a DFlash draft (architecture '{arch}'), not a qwen35 target; "
                                "pass it with --draft")
            raise GGUFError(
                f"{path}: architecture '{arch}' is not supported (expected qwen35); supported architectures: "
                f"{', '.join(ARCHS)}"
            )

        tensors = _tensor_views(path, reader)
        token_embd = tensors.get("token_embd.weight")
        if token_embd is None:
            raise GGUFError(f"{path}: missing tensor 'token_embd.weight'")
        if len(token_embd.ne) != 2:
            raise GGUFError(
                f"{path}: tensor 'token_embd.weight' has shape ne={list(token_embd.ne)}, expected ne=[n_embd, n_vocab]"
            )
        if arch == ARCH:
            hparams = _read_hparams(path, metadata, n_vocab=token_embd.ne[1])
        else:
            hparams = _read_hparams_attention_only(path, metadata, token_embd.ne[1], arch)
        _check_tensors(path, hparams, tensors)
        return cls(path, reader, metadata, hparams, tensors)

    def layer_tensor_name(self, il: int, field: str) -> str | None:
        """GGUF name of trunk layer il's tensor for the native specla_layer_weights field `field`
        (the names of pyspecla._native.LAYER_TENSOR_FIELDS plus attn_q_bias / attn_k_bias /
        attn_v_bias), or None where this file's architecture has no such tensor (qwen35: the
        biases; qwen2: the ssm tensors, attn_qkv, attn_gate, the q/k norms; qwen3: as qwen2 but
        with the q/k norms and without the biases). The name depends only
        on the architecture, not on whether layer il is recurrent. ValueError for an unknown field
        or a layer index outside [0, n_layer)."""
        table = _LAYER_TENSOR_SUFFIXES[self.arch]
        if field not in table:
            raise ValueError(f"unknown layer tensor field {field!r}; known: {', '.join(table)}")
        if isinstance(il, bool) or not isinstance(il, (int, np.integer)) or not 0 <= il < self.hparams.n_layer:
            raise ValueError(f"layer index {il!r} outside [0, {self.hparams.n_layer})")
        suffix = table[field]
        return None if suffix is None else f"blk.{int(il)}.{suffix}"

    def tensor(self, name: str) -> TensorView:
        view = self.optional_tensor(name)
        if view is None:
            raise GGUFError(f"{self.path}: missing tensor '{name}'")
        return view

    def optional_tensor(self, name: str) -> TensorView | None:
        if self._reader is None:
            raise GGUFError(f"{self.path}: file is closed (asked for tensor '{name}')")
        return self.tensors.get(name)

    @property
    def closed(self) -> bool:
        return self._reader is None

    def close(self) -> None:
        """Drop this object's references to the mmap. Free the native model first: the mapping is
        released once no TensorView.data handed out is referenced any more (numpy keeps it alive
        while a view exists, so closing can never leave a dangling pointer on the Python side)."""
        self.tensors = {}
        self._reader = None

    def __enter__(self) -> "ModelFile":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self.tensors)} tensors"
        return f"ModelFile({self.path!r}, {self.arch}, n_layer={self.hparams.n_layer}, {state})"
