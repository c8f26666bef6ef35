"""The architectures pyspecla runs, one module each: what a file's keys mean, the hyper-parameters
read from them and the one tensor-name table of the architecture. The loaders (pyspecla.loader),
the native binding (pyspecla.model, pyspecla.dflash_draft), the test-model writers
(pyspecla.testing) and the numpy reference (pyspecla.reference) all read them from here.

  qwen35   Qwen3.5 / Qwen3.6 hybrid trunk (Gated DeltaNet + full attention)
  qwen2    qwen2 (Qwen2.5) and qwen3 (Qwen3) attention-only trunks
  dflash   DFlash block-diffusion drafts, in their three spellings
"""

from __future__ import annotations

from . import qwen2, qwen35

TARGET_ARCHS = (qwen35.ARCH, qwen2.ARCH_QWEN2, qwen2.ARCH_QWEN3)  # general.architecture values a target may have
ATTENTION_ONLY_ARCHS = qwen2.ARCHS  # every layer full attention, RoPE over the whole head

# architecture -> {native specla_layer_weights field -> GGUF suffix after "blk.N." or None}
LAYER_TENSORS: dict[str, dict[str, str | None]] = {qwen35.ARCH: qwen35.LAYER_TENSORS, **qwen2.LAYER_TENSORS}
