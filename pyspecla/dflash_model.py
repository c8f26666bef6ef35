"""Read and validate a DFlash block-diffusion draft GGUF; check it against the qwen35 target it drafts for.

A DFlash draft (docs: shared/spec/ddtree-dflash.md §1) is a small Qwen3-style decoder with no
embedding and no LM head of its own: it embeds with the target's `token_embd`, projects its rows
with the target's LM head, and is conditioned on feature rows the target captures at
`target_layer_ids`. The file is memory-mapped through the same bounded reader as the target
(pyspecla.gguf_model); no weight byte is copied, and every problem becomes one GGUFError that starts
with the file path and names the key or tensor at fault.

Three spellings of the format are accepted and mapped onto one DraftHParams:

  `qwen35-dflash-draft`, `dflash-draft` (lucebox): keys `<arch>.dflash.block_size`,
      `<arch>.dflash.mask_token_id`, `<arch>.dflash.target_layer_ids`, `<arch>.dflash.n_target_layers`,
      `<arch>.dflash.context_kv_layer_norm`, `<arch>.vocab_size`; tensors `dflash.fc.weight`,
      `dflash.hidden_norm.weight`, optional `dflash.aux_hidden_norm.<i>.weight`.
  `dflash` (upstream llama.cpp): keys `dflash.target_layers`, optional `dflash.target_hidden_size`,
      `dflash.block_size` (default 16), `dflash.mask_token_id` or `tokenizer.ggml.mask_token_id`;
      tensors `fc.weight` and `enc.output_norm.weight` (the hidden norm).

The global tensors are looked up under every known alias (`dflash.fc`, `fc`, `dflash_fc`; ...);
a file holding two aliases of one tensor is refused as ambiguous. Target layer ids mean the same in
every spelling: 0-based trunk layers whose output residual stream is captured (the z-lab
`target_layer_ids`, which the upstream converter copies unchanged).

Shapes are GGUF `ne` order (fastest first): a weight {n_in, n_out} has ne = (n_in, n_out).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from gguf import GGUFReader
from gguf.constants import GGMLQuantizationType

from .errors import GGUFError
from .gguf_model import (
    open_validated,
    read_full_rope_head_dim,
    _INT32_MAX,
    _REQUIRED,
    SUPPORTED_TYPES,
    ModelFile,
    TensorView,
    _Keys,
    _open_reader,
    _read_metadata,
    _same_shape,
    _tensor_views,
    tensor_type_name,
)

__all__ = [
    "DRAFT_ARCHS", "DraftFile", "DraftHParams", "check_against_target", "file_architecture", "open_draft_and_target",
    "open_target",
]

# general.architecture values accepted as a DFlash draft
DRAFT_ARCHS = ("qwen35-dflash-draft", "dflash-draft", "dflash")
TARGET_ARCH = "qwen35"


@dataclass(frozen=True)
class DraftHParams:
    """Hyper-parameters of a DFlash draft, cross-checked against each other and the tensors.
    Field names follow specla_draft_hparams in specla.h where they overlap."""

    arch: str  # the file's general.architecture
    n_layer: int
    n_ctx_train: int  # context_length (0 when absent)
    n_embd: int  # E (= the target's embedding length)
    n_ff: int  # F
    n_head: int  # nh
    n_head_kv: int  # nkv
    head_dim: int  # D (key_length == value_length); RoPE rotates all D dims
    n_vocab: int | None  # vocab_size key, None when the file has none (upstream drafts)
    rms_eps: float
    rope_freq_base: float
    block_size: int  # rows of one draft block: [root, MASK x (block_size - 1)]
    mask_token_id: int
    target_layer_ids: tuple[int, ...]  # 0-based target trunk layers whose output rows are captured
    n_target_layers: int  # = len(target_layer_ids)
    target_n_embd: int  # E_t, width of one captured slice (fc ne0 / n_target_layers)
    sliding_window: int  # rows of context a sliding-window layer sees (0 = no such layer)
    layer_is_swa: tuple[bool, ...]  # [n_layer]
    context_kv_layer_norm: bool  # each target slice is RMS-normed with aux_hidden_norm.<i> first


# Where each spelling keeps its keys, relative to the architecture prefix.
_KEY_NAMES = {
    "lucebox": {
        "block_size": "dflash.block_size",
        "mask_token_id": "dflash.mask_token_id",
        "target_layer_ids": "dflash.target_layer_ids",
        "n_target_layers": "dflash.n_target_layers",
        "context_kv_layer_norm": "dflash.context_kv_layer_norm",
    },
    "upstream": {
        "block_size": "block_size",
        "mask_token_id": "mask_token_id",
        "target_layer_ids": "target_layers",
        "target_hidden_size": "target_hidden_size",
    },
}

# Global tensors: canonical name -> every spelling seen in converters (first = canonical).
_GLOBAL_ALIASES = {
    "dflash.fc.weight": ("dflash.fc.weight", "fc.weight", "dflash_fc.weight"),
    "dflash.hidden_norm.weight": (
        "dflash.hidden_norm.weight",
        "enc.output_norm.weight",
        "hidden_norm.weight",
        "dflash_hidden_norm.weight",
    ),
    "output_norm.weight": ("output_norm.weight",),
}
_AUX_PREFIXES = ("dflash.aux_hidden_norm.", "aux_hidden_norm.")

_MATRIX = "matrix"
_F32_ONLY = "f32"

# blk.N.ffn_norm.weight may be written under the name the Qwen3 converter uses for it.
FFN_NORM_FALLBACK = "post_attention_norm.weight"


def _spelling(arch: str) -> str:
    return "upstream" if arch == "dflash" else "lucebox"


class _DraftKeys(_Keys):
    """_Keys with the spelling-dependent names resolved, so messages name the key the file uses."""

    def __init__(self, path: str, metadata: dict[str, object], arch: str):
        super().__init__(path, metadata, arch)
        self.names = _KEY_NAMES[_spelling(arch)]

    def name(self, role: str) -> str:
        return self.names[role]


def _int_list(keys: _DraftKeys, name: str) -> list[int]:
    value = keys.raw(name)
    if not isinstance(value, list):
        value = [value]
    if not value:
        raise keys.fail(name, "is empty: a draft needs at least one target layer")
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int):
            raise keys.fail(name, f"must hold integers, got {value!r}")
        if v < 0 or v > _INT32_MAX:
            raise keys.fail(name, f"holds {v}, not a trunk layer index (must be >= 0)")
    if len(set(value)) != len(value):
        raise keys.fail(name, f"repeats a layer: {value}")
    return [int(v) for v in value]


def _flag(keys: _DraftKeys, name: str) -> bool | None:
    if not keys.present(name):
        return None
    value = keys.raw(name)
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    raise keys.fail(name, f"must be a bool, got {value!r}")


def _swa_layers(keys: _DraftKeys, n_layer: int) -> tuple[int, tuple[bool, ...]]:
    """attention.sliding_window_pattern: one bool per layer (True = sliding window), or an integer
    period n as llama.cpp's set_swa_pattern reads it (layer i slides iff i % n < n - 1). Without a
    pattern no layer slides, whatever attention.sliding_window says."""
    window = keys.int("attention.sliding_window", 0, minimum=0)
    pattern_name = "attention.sliding_window_pattern"
    if not keys.present(pattern_name):
        return window, (False,) * n_layer
    pattern = keys.raw(pattern_name)
    if isinstance(pattern, list):
        if len(pattern) != n_layer:
            raise keys.fail(pattern_name, f"has {len(pattern)} entries, expected block_count = {n_layer}")
        for i, flag in enumerate(pattern):
            if not (isinstance(flag, bool) or (isinstance(flag, int) and flag in (0, 1))):
                raise keys.fail(pattern_name, f"entry {i} must be a bool, got {flag!r}")
        flags = tuple(bool(f) for f in pattern)
    elif isinstance(pattern, int) and not isinstance(pattern, bool) and pattern >= 1:
        flags = tuple(i % pattern < pattern - 1 for i in range(n_layer))
    else:
        raise keys.fail(pattern_name, f"must be a bool per layer or a positive period, got {pattern!r}")
    if any(flags) and window <= 0:
        raise GGUFError(
            f"{keys.path}: key '{keys.key(pattern_name)}' marks sliding-window layers but "
            f"'{keys.key('attention.sliding_window')}' is missing or 0"
        )
    return window, flags


def _read_hparams(path: str, metadata: dict[str, object], arch: str, tensors: dict[str, TensorView],
                  fc_name: str) -> DraftHParams:
    keys = _DraftKeys(path, metadata, arch)
    upstream = _spelling(arch) == "upstream"

    n_layer = keys.int("block_count")
    n_ctx_train = keys.int("context_length", 0, minimum=0)
    n_embd = keys.int("embedding_length")
    n_ff = keys.int("feed_forward_length")
    n_head = keys.int("attention.head_count")
    n_head_kv = keys.int("attention.head_count_kv", n_head)
    if n_head % n_head_kv != 0:
        raise keys.fail("attention.head_count_kv", f"= {n_head_kv} does not divide attention.head_count = {n_head}")
    head_dim = read_full_rope_head_dim(keys, n_embd, n_head,
                                       "a DFlash draft rotates all head dims (partial RoPE is not supported)")
    rms_eps = keys.float("attention.layer_norm_rms_epsilon")
    rope_freq_base = keys.float("rope.freq_base", 10000.0)

    vocab_size = keys.int("vocab_size", None)
    if vocab_size is None and upstream:
        tokens = metadata.get("tokenizer.ggml.tokens")
        vocab_size = len(tokens) if isinstance(tokens, list) and tokens else None

    # upstream converters write block_size, but its loader defaults it to 16
    block_size = keys.int(keys.name("block_size"), 16 if upstream else _REQUIRED, minimum=2)

    mask_key = keys.name("mask_token_id")
    if upstream and not keys.present(mask_key) and "tokenizer.ggml.mask_token_id" in metadata:
        mask = metadata["tokenizer.ggml.mask_token_id"]
        if isinstance(mask, bool) or not isinstance(mask, int) or not 0 <= mask <= _INT32_MAX:
            raise GGUFError(f"{path}: key 'tokenizer.ggml.mask_token_id' must be a token id, got {mask!r}")
        mask_token_id = int(mask)
        mask_label = "tokenizer.ggml.mask_token_id"
    else:
        mask_token_id = keys.int(mask_key, minimum=0)
        mask_label = keys.key(mask_key)
    if vocab_size is not None and mask_token_id >= vocab_size:
        raise GGUFError(f"{path}: key '{mask_label}' = {mask_token_id} is outside the vocabulary ({vocab_size} tokens)")

    ids_key = keys.name("target_layer_ids")
    target_layer_ids = tuple(_int_list(keys, ids_key))
    n_target_layers = len(target_layer_ids)
    if not upstream and keys.present(keys.name("n_target_layers")):
        declared = keys.int(keys.name("n_target_layers"))
        if declared != n_target_layers:
            raise keys.fail(
                keys.name("n_target_layers"),
                f"= {declared} but '{keys.key(ids_key)}' lists {n_target_layers} layers",
            )

    fc = tensors[fc_name]
    if len(fc.ne) != 2 or fc.ne[0] % n_target_layers != 0:
        raise GGUFError(
            f"{path}: tensor '{fc_name}' has shape ne={list(fc.ne)}, expected ne=[{n_target_layers} * "
            f"target embedding length, {n_embd}] ({n_target_layers} target layers in '{keys.key(ids_key)}')"
        )
    target_n_embd = fc.ne[0] // n_target_layers
    if upstream and keys.present(keys.name("target_hidden_size")):
        declared = keys.int(keys.name("target_hidden_size"))
        if declared != target_n_embd:
            raise keys.fail(
                keys.name("target_hidden_size"),
                f"= {declared} but tensor '{fc_name}' has ne0 = {fc.ne[0]} = {n_target_layers} x {target_n_embd}",
            )

    sliding_window, layer_is_swa = _swa_layers(keys, n_layer)

    aux_present = [i for i in range(n_target_layers) if _find_aux(tensors, i) is not None]
    declared_norm = None if upstream else _flag(keys, keys.name("context_kv_layer_norm"))
    if declared_norm is None:
        context_kv_layer_norm = bool(aux_present)
    else:
        context_kv_layer_norm = declared_norm
        if not declared_norm and aux_present:
            raise GGUFError(
                f"{path}: key '{keys.key(keys.name('context_kv_layer_norm'))}' is false but the file has "
                f"'{_find_aux(tensors, aux_present[0])}': the per-layer norms would be ignored"
            )

    for label, value in (("fc input width", fc.ne[0]), ("attention width", n_head * head_dim)):
        if value > _INT32_MAX:
            raise GGUFError(f"{path}: {label} {value} does not fit in int32")

    return DraftHParams(
        arch=arch,
        n_layer=n_layer,
        n_ctx_train=n_ctx_train,
        n_embd=n_embd,
        n_ff=n_ff,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        n_vocab=vocab_size,
        rms_eps=rms_eps,
        rope_freq_base=rope_freq_base,
        block_size=block_size,
        mask_token_id=mask_token_id,
        target_layer_ids=target_layer_ids,
        n_target_layers=n_target_layers,
        target_n_embd=target_n_embd,
        sliding_window=sliding_window,
        layer_is_swa=layer_is_swa,
        context_kv_layer_norm=context_kv_layer_norm,
    )


def _find_aux(tensors: dict[str, TensorView], i: int) -> str | None:
    for prefix in _AUX_PREFIXES:
        name = f"{prefix}{i}.weight"
        if name in tensors:
            return name
    return None


def _resolve_globals(path: str, tensors: dict[str, TensorView]) -> dict[str, str]:
    """canonical name -> the name the file uses, for the three global tensors."""
    found = {}
    for canonical, aliases in _GLOBAL_ALIASES.items():
        present = [a for a in aliases if a in tensors]
        if not present:
            also = f" (or {', '.join(repr(a) for a in aliases[1:])})" if len(aliases) > 1 else ""
            raise GGUFError(f"{path}: missing tensor '{canonical}'{also}")
        if len(present) > 1:
            listed = ", ".join(repr(a) for a in present)
            raise GGUFError(f"{path}: tensors {listed} are the same tensor under two names")
        found[canonical] = present[0]
    return found


def _check_view(path: str, name: str, view: TensorView, ne: tuple[int, ...], kind: str, where: str = "") -> None:
    if not _same_shape(view.ne, ne):
        raise GGUFError(f"{path}: tensor '{name}'{where} has shape ne={list(view.ne)}, expected ne={list(ne)}")
    if kind == _F32_ONLY and view.ggml_type != GGMLQuantizationType.F32:
        raise GGUFError(f"{path}: tensor '{name}' has type {view.type_name}; it must be F32")
    if view.ggml_type not in SUPPORTED_TYPES:
        supported = ", ".join(tensor_type_name(t) for t in sorted(SUPPORTED_TYPES))
        raise GGUFError(f"{path}: tensor '{name}' has unsupported type {view.type_name} (supported: {supported})")
    for dim in view.ne:
        if dim > _INT32_MAX:
            raise GGUFError(f"{path}: tensor '{name}' dimension {dim} does not fit in int32")


def _check_tensors(path: str, hp: DraftHParams, tensors: dict[str, TensorView],
                   global_names: dict[str, str]) -> dict[str, str]:
    """Checks every tensor; returns the per-layer ffn_norm names actually used (blk.N.ffn_norm.weight
    -> the file's name) and the aux norm names, in one map of canonical -> file name."""
    E, F, D, Et = hp.n_embd, hp.n_ff, hp.head_dim, hp.target_n_embd
    nh, nkv, N = hp.n_head, hp.n_head_kv, hp.n_target_layers
    names = dict(global_names)
    _check_view(path, global_names["dflash.fc.weight"], tensors[global_names["dflash.fc.weight"]], (N * Et, E), _MATRIX)
    for canonical in ("dflash.hidden_norm.weight", "output_norm.weight"):
        _check_view(path, global_names[canonical], tensors[global_names[canonical]], (E,), _F32_ONLY)
    for i in range(N):
        aux = _find_aux(tensors, i)
        if aux is None:
            if hp.context_kv_layer_norm:
                raise GGUFError(
                    f"{path}: missing tensor 'dflash.aux_hidden_norm.{i}.weight' (context_kv_layer_norm is set: "
                    f"one norm per target layer)"
                )
            continue
        _check_view(path, aux, tensors[aux], (Et,), _F32_ONLY)
        names[f"dflash.aux_hidden_norm.{i}.weight"] = aux

    layer_shapes = {
        "attn_norm.weight": ((E,), _F32_ONLY),
        "ffn_norm.weight": ((E,), _F32_ONLY),
        "attn_q.weight": ((E, nh * D), _MATRIX),
        "attn_k.weight": ((E, nkv * D), _MATRIX),
        "attn_v.weight": ((E, nkv * D), _MATRIX),
        "attn_output.weight": ((nh * D, E), _MATRIX),
        "attn_q_norm.weight": ((D,), _F32_ONLY),
        "attn_k_norm.weight": ((D,), _F32_ONLY),
        "ffn_gate.weight": ((E, F), _MATRIX),
        "ffn_up.weight": ((E, F), _MATRIX),
        "ffn_down.weight": ((F, E), _MATRIX),
    }
    for il in range(hp.n_layer):
        where = f" (draft layer {il})"
        for suffix, (ne, kind) in layer_shapes.items():
            name = f"blk.{il}.{suffix}"
            actual = name
            if suffix == "ffn_norm.weight":
                fallback = f"blk.{il}.{FFN_NORM_FALLBACK}"
                if name in tensors and fallback in tensors:
                    raise GGUFError(
                        f"{path}: tensors '{name}' and '{fallback}' are both present: which is the FFN norm?"
                    )
                if name not in tensors and fallback in tensors:
                    actual = fallback
            if actual not in tensors:
                also = f" (or '{FFN_NORM_FALLBACK}')" if suffix == "ffn_norm.weight" else ""
                raise GGUFError(f"{path}: missing tensor '{name}'{also}{where}")
            _check_view(path, actual, tensors[actual], ne, kind, where)
            names[name] = actual

    used = set(names.values())
    for name in tensors:
        if name in used:
            continue
        if name in ("token_embd.weight", "output.weight"):
            raise GGUFError(
                f"{path}: unexpected tensor '{name}': a DFlash draft uses the target's embedding and LM head "
                "and has none of its own"
            )
        if name.endswith(".bias"):
            raise GGUFError(
                f"{path}: unexpected tensor '{name}': DFlash drafts have no biases and pyspecla does not support them"
            )
        raise GGUFError(f"{path}: unexpected tensor '{name}': not part of a DFlash draft of {hp.n_layer} layers")
    return names


class DraftFile:
    """A validated DFlash draft GGUF, memory-mapped.

    Attributes: path, arch, hparams (DraftHParams), metadata, tensors (zero-copy TensorViews under
    the file's own names). `tensor(canonical)` looks a tensor up by its canonical name
    ('dflash.fc.weight', 'dflash.hidden_norm.weight', 'output_norm.weight',
    'dflash.aux_hidden_norm.<i>.weight', 'blk.N.ffn_norm.weight', ...) whatever the file calls it."""

    path: str
    arch: str
    hparams: DraftHParams
    metadata: dict[str, object]
    tensors: dict[str, TensorView]

    def __init__(self, path: str, reader: GGUFReader, metadata: dict[str, object], hparams: DraftHParams,
                 tensors: dict[str, TensorView], names: dict[str, str]):
        self.path = path
        self.arch = hparams.arch
        self.hparams = hparams
        self.metadata = metadata
        self.tensors = tensors
        self._names = names
        self._reader: GGUFReader | None = reader

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> "DraftFile":
        """Map and validate a DFlash draft GGUF. Raises GGUFError (message starts with the path)."""
        return open_validated(path, cls._validate)

    @classmethod
    def _validate(cls, path: str, reader: GGUFReader) -> "DraftFile":
        metadata = _read_metadata(reader)
        arch = metadata.get("general.architecture")
        if arch is None:
            raise GGUFError(f"{path}: missing required key 'general.architecture'")
        if not isinstance(arch, str):
            raise GGUFError(f"{path}: key 'general.architecture' must be a string, got {arch!r}")
        if arch == TARGET_ARCH:
            raise GGUFError(f"{path}: is a qwen35 target model, not a DFlash draft (architecture 'qwen35')")
        if arch not in DRAFT_ARCHS:
            raise GGUFError(
                f"{path}: architecture '{arch}' is not a DFlash draft (expected one of {', '.join(DRAFT_ARCHS)})"
            )
        tensors = _tensor_views(path, reader)
        global_names = _resolve_globals(path, tensors)
        hparams = _read_hparams(path, metadata, arch, tensors, global_names["dflash.fc.weight"])
        names = _check_tensors(path, hparams, tensors, global_names)
        return cls(path, reader, metadata, hparams, tensors, names)

    def tensor(self, canonical: str) -> TensorView:
        view = self.optional_tensor(canonical)
        if view is None:
            raise GGUFError(f"{self.path}: missing tensor '{canonical}'")
        return view

    def optional_tensor(self, canonical: str) -> TensorView | None:
        if self._reader is None:
            raise GGUFError(f"{self.path}: file is closed (asked for tensor '{canonical}')")
        name = self._names.get(canonical)
        return None if name is None else self.tensors.get(name)

    def file_name(self, canonical: str) -> str | None:
        """The name the file stores a canonical tensor under (None if absent)."""
        return self._names.get(canonical)

    @property
    def closed(self) -> bool:
        return self._reader is None

    def close(self) -> None:
        """Drop this object's references to the mmap (free the native draft model first)."""
        self.tensors = {}
        self._reader = None

    def __enter__(self) -> "DraftFile":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self.tensors)} tensors"
        return f"DraftFile({self.path!r}, {self.arch}, n_layer={self.hparams.n_layer}, {state})"


def _target_file(target) -> ModelFile | DraftFile:
    """Accept a ModelFile, or anything carrying one as `.file` (pyspecla.Model)."""
    if isinstance(target, (ModelFile, DraftFile)):
        return target
    file = getattr(target, "file", None)
    if isinstance(file, (ModelFile, DraftFile)):
        return file
    raise TypeError(f"expected a ModelFile or a Model, got {type(target).__name__}")


def check_against_target(draft: DraftFile, target) -> None:
    """Raise GGUFError, naming both files, unless `draft` can draft for `target`: same hidden size,
    its vocabulary is the target's, its mask token exists there, its target layers lie in the
    target's trunk. `target` is a ModelFile or a pyspecla.Model; either argument may be the wrong
    kind of file (a draft passed as the target, a target passed as the draft)."""
    target = _target_file(target)
    if isinstance(draft, ModelFile):
        raise GGUFError(f"{draft.path}: is a qwen35 target, not a DFlash draft (given as the draft for {target.path})")
    if isinstance(target, DraftFile):
        raise GGUFError(f"{target.path}: is a DFlash draft, not a qwen35 target (given as the target of {draft.path})")
    if not isinstance(draft, DraftFile):
        raise TypeError(f"expected a DraftFile, got {type(draft).__name__}")
    if getattr(target.hparams, "arch", "qwen35") != "qwen35":
        raise GGUFError(f"{draft.path}: a DFlash draft drafts for qwen35 targets; {target.path} is "
                        f"{target.hparams.arch}")
    hp, thp = draft.hparams, target.hparams
    keys = _DraftKeys(draft.path, draft.metadata, draft.arch)
    pair = f"the target {target.path}"

    if hp.n_embd != thp.n_embd:
        raise GGUFError(
            f"{draft.path}: key '{keys.key('embedding_length')}' = {hp.n_embd} does not match {pair} "
            f"('{TARGET_ARCH}.embedding_length' = {thp.n_embd}): hidden size mismatch"
        )
    if hp.target_n_embd != thp.n_embd:
        fc = draft.file_name("dflash.fc.weight")
        raise GGUFError(
            f"{draft.path}: tensor '{fc}' reads {hp.n_target_layers} target slices of {hp.target_n_embd} but "
            f"{pair} has embedding_length {thp.n_embd}: hidden size mismatch"
        )
    if hp.n_vocab is not None and hp.n_vocab != thp.n_vocab:
        raise GGUFError(
            f"{draft.path}: key '{keys.key('vocab_size')}' = {hp.n_vocab} does not match the {thp.n_vocab} tokens "
            f"of {pair}: vocabulary mismatch"
        )
    if hp.mask_token_id >= thp.n_vocab:
        mask_key = keys.key(keys.name("mask_token_id"))
        if mask_key not in draft.metadata and "tokenizer.ggml.mask_token_id" in draft.metadata:
            mask_key = "tokenizer.ggml.mask_token_id"
        raise GGUFError(
            f"{draft.path}: key '{mask_key}' = {hp.mask_token_id} is not a token of "
            f"{pair} ({thp.n_vocab} tokens): vocabulary mismatch"
        )
    bad = [i for i in hp.target_layer_ids if i >= thp.n_layer]
    if bad:
        raise GGUFError(
            f"{draft.path}: key '{keys.key(keys.name('target_layer_ids'))}' = {list(hp.target_layer_ids)} names "
            f"layer {bad[0]}, outside the {thp.n_layer} trunk layers of {pair}"
        )


def open_target(path, role: str = "") -> ModelFile:
    """ModelFile.open, but a DFlash draft given where the target belongs is named as such."""
    path = os.fspath(path)
    if file_architecture(path) in DRAFT_ARCHS:
        raise GGUFError(f"{path}: is a DFlash draft, not a qwen35 target{role}")
    return ModelFile.open(path)


def open_draft_and_target(draft_path, target_path) -> tuple[DraftFile, ModelFile]:
    """Open both files, telling a swapped or wrong-kind pair apart from a broken file, and check
    that they belong together. Raises GGUFError naming the file at fault."""
    draft_path, target_path = os.fspath(draft_path), os.fspath(target_path)
    if file_architecture(target_path) in DRAFT_ARCHS:
        raise GGUFError(f"{target_path}: is a DFlash draft, not a qwen35 target (given as the target of {draft_path})")
    if file_architecture(draft_path) == TARGET_ARCH:
        raise GGUFError(f"{draft_path}: is a qwen35 target, not a DFlash draft (given as the draft for {target_path})")
    draft = DraftFile.open(draft_path)
    target = ModelFile.open(target_path)
    check_against_target(draft, target)
    return draft, target


def file_architecture(path) -> object:
    """general.architecture of a GGUF (None when absent); GGUFError if it is no GGUF at all."""
    reader = _open_reader(os.fspath(path))
    try:
        return _read_metadata(reader).get("general.architecture")
    finally:
        del reader
