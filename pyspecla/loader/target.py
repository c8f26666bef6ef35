"""Open a qwen35, qwen2 or qwen3 target GGUF: the container checks (pyspecla.loader.container), then
the architecture's rules (pyspecla.arch), then one check of every tensor against what the
architecture expects. A bad file becomes one `GGUFError` whose message starts with the file path and
names the key or tensor at fault, never a crash, a hang or a silently wrong model (docs/qwen35.md).

Tensors are handed out as zero-copy views of the mmap; no weight byte is ever copied here.
"""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np
from gguf import GGUFReader

from ..arch import ATTENTION_ONLY_ARCHS, LAYER_TENSORS, TARGET_ARCHS, qwen2, qwen35
from ..arch.dflash import DRAFT_ARCHS
from ..arch.qwen2 import ARCH_QWEN2, ARCH_QWEN3
from ..arch.qwen35 import ARCH, Qwen35HParams
from ..errors import GGUFError
from ..gguf_container import (
    SUPPORTED_TYPES,
    TensorView,
    check_tensor,
    open_validated,
    read_architecture,
    read_metadata,
    tensor_type_name,
    tensor_views,
)

__all__ = [
    "ARCHS",
    "SUPPORTED_TYPES",
    "ModelFile",
    "Qwen35HParams",
    "TensorView",
    "tensor_type_name",
]

ARCHS = TARGET_ARCHS  # general.architecture values ModelFile.open accepts


def _expected_tensors(hp: Qwen35HParams):
    return (qwen2 if hp.arch in ATTENTION_ONLY_ARCHS else qwen35).expected_tensors(hp)


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
        check_tensor(path, name, view, spec.ne, spec.kind, where)

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
        metadata = read_metadata(reader)

        arch = read_architecture(path, metadata)
        if arch == "qwen35moe":
            raise GGUFError(
                f"{path}: architecture 'qwen35moe' (the MoE sibling of qwen35) is not supported yet (expected qwen35)"
            )
        if arch not in ARCHS:
            if arch in DRAFT_ARCHS:
                raise GGUFError(f"{path}: is a DFlash draft (architecture '{arch}'), not a qwen35 target; "
                                "pass it with --draft")
            raise GGUFError(
                f"{path}: architecture '{arch}' is not supported (expected qwen35); supported architectures: "
                f"{', '.join(ARCHS)}"
            )

        tensors = tensor_views(path, reader)
        token_embd = tensors.get("token_embd.weight")
        if token_embd is None:
            raise GGUFError(f"{path}: missing tensor 'token_embd.weight'")
        if len(token_embd.ne) != 2:
            raise GGUFError(
                f"{path}: tensor 'token_embd.weight' has shape ne={list(token_embd.ne)}, expected ne=[n_embd, n_vocab]"
            )
        if arch == ARCH:
            hparams = qwen35.read_hparams(path, metadata, n_vocab=token_embd.ne[1])
        else:
            hparams = qwen2.read_hparams(path, metadata, token_embd.ne[1], arch)
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
        table = LAYER_TENSORS[self.arch]
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
