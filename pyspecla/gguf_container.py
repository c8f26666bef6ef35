"""The GGUF container, whatever the architecture: map a file through a bounded reader that never
reads past its end or hangs on a corrupt length, decode every metadata value, view every tensor in
place, and check a tensor's shape and type the way the native kernels need them.

Every problem becomes one `GGUFError` whose message starts with the file path and names the key or
tensor at fault. The architecture rules (which keys and tensors a qwen35, qwen2/qwen3 or DFlash file
must have) live in `pyspecla.arch`; the loaders in `pyspecla.loader` put the two together.

Shapes are GGUF `ne` order throughout (fastest dimension first): a weight `{n_in, n_out}` has
ne = (n_in, n_out) and is stored as n_out rows of n_in elements.
"""

from __future__ import annotations

import math
import os
import struct
import sys
from dataclasses import dataclass

import numpy as np
from gguf import GGUFReader
from gguf.gguf_reader import ReaderField
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from .errors import GGUFError

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
INT32_MAX = 2**31 - 1

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



# Where a value is NaN or infinite, by its bit pattern (all exponent bits set): (element dtype,
# exponent mask). Quantized blocks store their float scales as F16 at fixed byte offsets (ggml's
# block layouts); their other fields are small integers, finite by construction.
_FLOAT_EXPONENT = {
    GGMLQuantizationType.F32: (np.uint32, 0x7F800000),
    GGMLQuantizationType.F16: (np.uint16, 0x7C00),
    GGMLQuantizationType.BF16: (np.uint16, 0x7F80),
}
_F16_SCALE_OFFSETS = {
    GGMLQuantizationType.Q4_0: (0,),
    GGMLQuantizationType.Q4_1: (0, 2),
    GGMLQuantizationType.Q5_0: (0,),
    GGMLQuantizationType.Q5_1: (0, 2),
    GGMLQuantizationType.Q8_0: (0,),
    GGMLQuantizationType.Q4_K: (0, 2),
    GGMLQuantizationType.Q5_K: (0, 2),
    GGMLQuantizationType.Q6_K: (208,),
}
_FINITE_CHUNK = 1 << 24  # elements or blocks examined at a time (bounds the temporaries)


def first_nonfinite(view: "TensorView") -> str | None:
    """Where a tensor holds a NaN or an infinity: 'element i' (F32/F16/BF16) or 'block i' (a
    quantized block whose scale is not finite); None when every value is finite or the type is
    not one of those."""
    t = GGMLQuantizationType(int(view.ggml_type))
    if t in _FLOAT_EXPONENT:
        dtype, mask = _FLOAT_EXPONENT[t]
        bits = view.data[: view.nbytes].view(dtype)
        for start in range(0, bits.size, _FINITE_CHUNK):
            bad = np.flatnonzero((bits[start : start + _FINITE_CHUNK] & mask) == mask)
            if bad.size:
                return f"element {start + int(bad[0])}"
        return None
    if t in _F16_SCALE_OFFSETS:
        _, block_bytes = _block_size(t)
        blocks = view.data[: view.nbytes].reshape(-1, block_bytes)
        for start in range(0, len(blocks), _FINITE_CHUNK):
            chunk = blocks[start : start + _FINITE_CHUNK]
            for offset in _F16_SCALE_OFFSETS[t]:
                scale_bits = chunk[:, offset : offset + 2].copy().view(np.uint16)[:, 0]
                bad = np.flatnonzero((scale_bits & 0x7C00) == 0x7C00)
                if bad.size:
                    return f"block {start + int(bad[0])}"
        return None
    return None


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
        regions: list[tuple[int, int, str, str]] = []  # (begin, end, name, type name) of each tensor
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
            regions.append((begin, begin + nbytes, name, tensor_type_name(type_id)))
        _check_disjoint(regions)
        super()._build_tensors(start_offs, fields)


def _check_disjoint(regions: list[tuple[int, int, str, str]]) -> None:
    """Tensor data regions must not share a byte: an offset moved into a neighbour, or a tensor
    retyped to a wider type, would otherwise load and compute on another tensor's bytes.
    Empty tensors own no bytes and cannot overlap anything."""
    furthest: tuple[int, int, str, str] | None = None  # the region reaching furthest so far
    for region in sorted((r for r in regions if r[1] > r[0]), key=lambda r: (r[0], r[1])):
        if furthest is not None and region[0] < furthest[1]:
            begin, end, name, type_name = region
            other_begin, other_end, other_name, other_type = furthest
            raise _FormatError(
                f"tensors '{other_name}' ({other_type}, data [{other_begin}, {other_end})) and "
                f"'{name}' ({type_name}, data [{begin}, {end})) overlap: their offsets or types are corrupt"
            )
        if furthest is None or region[1] > furthest[1]:
            furthest = region


def open_reader(path: str) -> GGUFReader:
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
    reader = open_reader(path)
    message = None
    try:
        return validate(path, reader)
    except GGUFError as e:
        message = str(e)
    del reader
    raise GGUFError(message)


def read_metadata(reader: _BoundedReader) -> dict[str, object]:
    """Every key -> plain python value (str, int, float, bool, or a list of one of those)."""
    return dict(reader.kv_values)


REQUIRED = object()


class MetadataKeys:
    """Typed access to the metadata with messages that name the full key."""

    def __init__(self, path: str, metadata: dict[str, object], arch: str):
        self.path = path
        self.metadata = metadata
        self.arch = arch

    def key(self, name: str) -> str:
        return f"{self.arch}.{name}"

    def fail(self, name: str, what: str) -> GGUFError:
        return GGUFError(f"{self.path}: key '{self.key(name)}' {what}")

    def raw(self, name: str, default: object = REQUIRED) -> object:
        full = self.key(name)
        if full not in self.metadata:
            if default is REQUIRED:
                raise GGUFError(f"{self.path}: missing required key '{full}'")
            return default
        return self.metadata[full]

    def _as_int(self, name: str, value: object, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(name, f"must be an integer, got {value!r}")
        if value < minimum:
            raise self.fail(name, f"must be >= {minimum}, got {value}")
        if value > INT32_MAX:
            raise self.fail(name, f"is too large ({value})")
        return value

    def present(self, name: str) -> bool:
        return self.key(name) in self.metadata

    def int(self, name: str, default: object = REQUIRED, minimum: int = 1) -> int:
        if default is not REQUIRED and not self.present(name):
            return default  # type: ignore[return-value]
        return self._as_int(name, self.raw(name), minimum)

    def per_layer_int(self, name: str, layers: list[int], n_layer_file: int, default: object = REQUIRED) -> int:
        """An integer that llama.cpp also accepts as a per-layer array; only uniform values are
        supported, judged on `layers` (the trunk layers that use it)."""
        if default is not REQUIRED and not self.present(name):
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

    def float(self, name: str, default: object = REQUIRED) -> float:
        if default is not REQUIRED and not self.present(name):
            return default  # type: ignore[return-value]
        value = self.raw(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(name, f"must be a number, got {value!r}")
        value = float(value)
        if not math.isfinite(value) or value <= 0.0:
            raise self.fail(name, f"must be a positive finite number, got {value}")
        return value



MATRIX = "matrix"  # any supported type
F32_ONLY = "f32"  # 1-D tensors and ssm_conv1d: what the converter writes and ggml's ops require


@dataclass(frozen=True)
class ExpectedTensor:
    ne: tuple[int, ...]
    kind: str
    required: bool = True

def same_shape(actual: tuple[int, ...], expected: tuple[int, ...]) -> bool:
    """Equal up to trailing 1s, as llama.cpp's check_tensor_dims compares."""
    def strip(ne: tuple[int, ...]) -> tuple[int, ...]:
        ne = list(ne)
        while ne and ne[-1] == 1:
            ne.pop()
        return tuple(ne)

    return strip(actual) == strip(expected)


def check_tensor(path: str, name: str, view: TensorView, ne: tuple[int, ...], kind: str, where: str = "") -> None:
    """GGUFError unless `view` has shape ne (up to trailing 1s), is F32 where kind is F32_ONLY, has a
    type the native kernels handle and dimensions that fit in int32. `where` follows the tensor's
    name in the shape message (" (recurrent layer 3)")."""
    if not same_shape(view.ne, ne):
        raise GGUFError(f"{path}: tensor '{name}'{where} has shape ne={list(view.ne)}, expected ne={list(ne)}")
    if kind == F32_ONLY and view.ggml_type != GGMLQuantizationType.F32:
        raise GGUFError(f"{path}: tensor '{name}' has type {view.type_name}; it must be F32")
    if view.ggml_type not in SUPPORTED_TYPES:
        supported = ", ".join(tensor_type_name(t) for t in sorted(SUPPORTED_TYPES))
        raise GGUFError(f"{path}: tensor '{name}' has unsupported type {view.type_name} (supported: {supported})")
    for dim in view.ne:
        if dim > INT32_MAX:
            raise GGUFError(f"{path}: tensor '{name}' dimension {dim} does not fit in int32")


def tensor_views(path: str, reader: GGUFReader) -> dict[str, TensorView]:
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


def read_architecture(path: str, metadata: dict[str, object]) -> str:
    """general.architecture of a file's metadata; GGUFError naming the file when it is missing or
    not a string."""
    arch = metadata.get("general.architecture")
    if arch is None:
        raise GGUFError(f"{path}: missing required key 'general.architecture'")
    if not isinstance(arch, str):
        raise GGUFError(f"{path}: key 'general.architecture' must be a string, got {arch!r}")
    return arch
