"""Read and validate a DFlash block-diffusion draft GGUF; check it against the qwen35 target it drafts for.

The file is memory-mapped through the same bounded reader as a target (pyspecla.loader.container);
its keys and tensor names, in all three spellings, are the rules of pyspecla.arch.dflash
(docs/ddtree-dflash.md). No weight byte is copied, and every problem becomes one GGUFError that
starts with the file path and names the key or tensor at fault.
"""

from __future__ import annotations

import os
from typing import Any

from gguf import GGUFReader

from ..arch.dflash import (
    DRAFT_ARCHS,
    FFN_NORM_FALLBACK,
    GLOBAL_ALIASES,
    TARGET_ARCH,
    DraftHParams,
    DraftKeys,
    find_aux,
    expected_layer_tensors,
    read_hparams,
)
from ..errors import GGUFError
from ..gguf_container import (
    F32_ONLY,
    MATRIX,
    TensorView,
    check_tensor,
    first_nonfinite,
    open_reader,
    open_validated,
    read_architecture,
    read_metadata,
    tensor_views,
)
from .target import ModelFile

__all__ = [
    "DRAFT_ARCHS", "DraftFile", "DraftHParams", "check_against_target", "file_architecture", "open_draft_and_target",
    "open_target",
]


def _resolve_globals(path: str, tensors: dict[str, TensorView]) -> dict[str, str]:
    """canonical name -> the name the file uses, for the three global tensors."""
    found = {}
    for canonical, aliases in GLOBAL_ALIASES.items():
        present = [a for a in aliases if a in tensors]
        if not present:
            also = f" (or {', '.join(repr(a) for a in aliases[1:])})" if len(aliases) > 1 else ""
            raise GGUFError(f"{path}: missing tensor '{canonical}'{also}")
        if len(present) > 1:
            listed = ", ".join(repr(a) for a in present)
            raise GGUFError(f"{path}: tensors {listed} are the same tensor under two names")
        found[canonical] = present[0]
    return found


def _check_tensors(path: str, hp: DraftHParams, tensors: dict[str, TensorView],
                   global_names: dict[str, str]) -> dict[str, str]:
    """Checks every tensor; returns the per-layer ffn_norm names actually used (blk.N.ffn_norm.weight
    -> the file's name) and the aux norm names, in one map of canonical -> file name."""
    E, Et, N = hp.n_embd, hp.target_n_embd, hp.n_target_layers
    names = dict(global_names)
    check_tensor(path, global_names["dflash.fc.weight"], tensors[global_names["dflash.fc.weight"]], (N * Et, E), MATRIX)
    for canonical in ("dflash.hidden_norm.weight", "output_norm.weight"):
        check_tensor(path, global_names[canonical], tensors[global_names[canonical]], (E,), F32_ONLY)
    for i in range(N):
        aux = find_aux(tensors, i)
        if aux is None:
            if hp.context_kv_layer_norm:
                raise GGUFError(
                    f"{path}: missing tensor 'dflash.aux_hidden_norm.{i}.weight' (context_kv_layer_norm is set: "
                    f"one norm per target layer)"
                )
            continue
        check_tensor(path, aux, tensors[aux], (Et,), F32_ONLY)
        names[f"dflash.aux_hidden_norm.{i}.weight"] = aux

    layer_shapes = expected_layer_tensors(hp)
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
            check_tensor(path, actual, tensors[actual], ne, kind, where)
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
        metadata = read_metadata(reader)
        arch = read_architecture(path, metadata)
        if arch == TARGET_ARCH:
            raise GGUFError(f"{path}: is a qwen35 target model, not a DFlash draft (architecture 'qwen35')")
        if arch not in DRAFT_ARCHS:
            raise GGUFError(
                f"{path}: architecture '{arch}' is not a DFlash draft (expected one of {', '.join(DRAFT_ARCHS)})"
            )
        tensors = tensor_views(path, reader)
        global_names = _resolve_globals(path, tensors)
        hparams = read_hparams(path, metadata, arch, tensors, global_names["dflash.fc.weight"])
        names = _check_tensors(path, hparams, tensors, global_names)
        # A NaN in a draft's weights would make every proposal NaN: refuse the file, naming the
        # tensor (one pass over the weights; a quantized tensor's scales only).
        for name, view in tensors.items():
            where = first_nonfinite(view)
            if where is not None:
                raise GGUFError(f"{path}: tensor '{name}' ({view.type_name}) holds a NaN or infinite value "
                                f"({where}): the file is corrupt")
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
    if getattr(target.hparams, "arch", TARGET_ARCH) != TARGET_ARCH:
        raise GGUFError(f"{draft.path}: a DFlash draft drafts for qwen35 targets; {target.path} is "
                        f"{target.hparams.arch}")
    hp, thp = draft.hparams, target.hparams
    keys = DraftKeys(draft.path, draft.metadata, draft.arch)
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
    reader = open_reader(os.fspath(path))
    try:
        return read_metadata(reader).get("general.architecture")
    finally:
        del reader
