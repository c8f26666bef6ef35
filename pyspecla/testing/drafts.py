"""Deterministic synthetic DFlash draft GGUFs that fit a given (synthetic) qwen35 target, in each of
the three spellings a loader must accept (docs/ddtree-dflash.md):

    write_test_draft("draft.gguf", "tiny.gguf", seed=0)

Tensors are generated and written the way pyspecla.testing.models writes a target's, each from its
own seeded generator, with names salted so a draft tensor never repeats a target tensor."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFWriter

from ..arch.dflash import DRAFT_ARCHS
from .models import _FILE_TYPE, QUANTS, RESIDUAL_RATIO, RESIDUAL_RATIO_TIED, TensorSpec, _stream_tensors, tensor_type

__all__ = ["DRAFT_ARCHS", "dflash_target_layer_ids", "write_test_draft"]




def dflash_target_layer_ids(n_layer: int, n_ids: int) -> list[int]:
    """z-lab's build_target_layer_ids: n_ids layers spread evenly over [1, n_layer - 3] (for a
    64-layer target and 5 ids: 1, 16, 31, 46, 61), widened to [1, n_layer - 1] when the narrow span
    cannot hold n_ids distinct layers (tiny test targets)."""
    if not 1 <= n_ids <= n_layer:
        raise ValueError(f"cannot pick {n_ids} distinct target layers out of {n_layer}")
    if n_ids == 1:
        return [n_layer // 2]
    start = 1 if n_ids <= n_layer - 1 else 0
    end = n_layer - 3
    if end - start < n_ids - 1:
        end = n_layer - 1
    ids = [int(round(start + k * (end - start) / (n_ids - 1))) for k in range(n_ids)]
    ids = [min(max(i, 0), n_layer - 1) for i in ids]
    if len(set(ids)) != n_ids:
        raise AssertionError(f"target layer ids {ids} are not distinct")
    return ids


def _draft_mask_token(tokens, n_vocab: int) -> int:
    """The first unused [PAD…] token of the target vocabulary (a reserved id that exists there, as
    Qwen's <|MASK|>-style reserved ids do), else the last id."""
    if isinstance(tokens, list):
        for i, token in enumerate(tokens):
            if isinstance(token, str) and token.startswith("[PAD"):
                return i
    return n_vocab - 1


def write_test_draft(path, target_path, seed: int = 0, quant: str = "f32", n_layer: int = 2,
                     arch: str = "qwen35-dflash-draft", *, n_target_layers: int | None = None,
                     sliding_window: int = 2048, context_kv_layer_norm: bool = False,
                     n_head: int = 4, n_head_kv: int = 2, head_dim: int = 64, block_size: int = 16) -> Path:
    """Write a synthetic DFlash draft that fits the qwen35 GGUF at `target_path`: E = the target's
    embedding length, FFN 2E, nh/nkv/D = n_head/n_head_kv/head_dim, block 16, the mask token a
    reserved id of the target vocabulary, target layers spread over the trunk
    (dflash_target_layer_ids; n_target_layers defaults to min(5, n_layer_target - 1)); layer types
    as the published Qwen3.6 draft: the last layer full attention, the others sliding-window
    (`sliding_window` rows). `arch` picks the spelling: 'qwen35-dflash-draft' / 'dflash-draft'
    (lucebox keys and tensor names) or 'dflash' (upstream llama.cpp keys, fc.weight,
    enc.output_norm.weight, no sliding window). Same arguments → identical bytes."""
    from ..loader.dflash import open_target
    from ..reference.ops import dequantize

    if arch not in DRAFT_ARCHS:
        raise ValueError(f"unknown draft arch {arch!r}; choose one of {', '.join(DRAFT_ARCHS)}")
    if quant not in QUANTS:
        raise ValueError(f"unknown quant {quant!r}; choose one of {', '.join(QUANTS)}")
    if n_layer < 1:
        raise ValueError(f"n_layer must be >= 1, got {n_layer}")
    upstream = arch == "dflash"
    with open_target(target_path, " (given as the target of a test draft)") as target:
        thp = target.hparams
        embd = target.tensor("token_embd.weight")
        rows = min(64, thp.n_vocab)
        row_bytes = embd.nbytes // thp.n_vocab
        sample = dequantize(embd.data[: rows * row_bytes], embd.ggml_type, thp.n_embd, rows)
        embd_rms = float(np.sqrt(np.mean(sample.astype(np.float64) ** 2)))
        mask_token_id = _draft_mask_token(target.metadata.get("tokenizer.ggml.tokens"), thp.n_vocab)
        n_ids = n_target_layers if n_target_layers is not None else min(5, max(1, thp.n_layer - 1))
        target_ids = dflash_target_layer_ids(thp.n_layer, n_ids)
        E, Et, V = thp.n_embd, thp.n_embd, thp.n_vocab
        target_tied = target.tied_output
        del sample, embd
    F, nh, nkv, D, N = 2 * E, n_head, n_head_kv, head_dim, len(target_ids)
    layer_is_swa = [False] * n_layer if upstream else [i < n_layer - 1 for i in range(n_layer)]
    path = Path(path)

    # Branch scales as in tensor_plan: all branches together add RESIDUAL_RATIO(_TIED) x the
    # embedding's rms, so the context (through attention) and the block token both shape the
    # output. With a tied target head the output norm is zero-mean for the reason tensor_plan gives
    # (otherwise the block's own token, the mask, wins every row).
    tied = target_tied
    branch = (RESIDUAL_RATIO_TIED if tied else RESIDUAL_RATIO) * embd_rms / math.sqrt(2 * n_layer)
    fc_name = "fc.weight" if upstream else "dflash.fc.weight"
    hidden_norm_name = "enc.output_norm.weight" if upstream else "dflash.hidden_norm.weight"
    specs = [
        TensorSpec(fc_name, (E, N * Et), "normal", {"std": 1.0 / math.sqrt(N * Et)}),
        TensorSpec(hidden_norm_name, (E,), "norm"),
        TensorSpec("output_norm.weight", (E,), "signed_norm" if tied else "norm"),
    ]
    if context_kv_layer_norm:
        if upstream:
            raise ValueError("the upstream 'dflash' spelling has no per-layer context norms")
        specs += [TensorSpec(f"dflash.aux_hidden_norm.{i}.weight", (Et,), "norm") for i in range(N)]
    for i in range(n_layer):
        b = f"blk.{i}."
        specs += [
            TensorSpec(b + "attn_norm.weight", (E,), "norm"),
            TensorSpec(b + "ffn_norm.weight", (E,), "norm"),
            TensorSpec(b + "attn_q.weight", (nh * D, E), "normal", {"std": 1.0 / math.sqrt(E)}),
            TensorSpec(b + "attn_k.weight", (nkv * D, E), "normal", {"std": 1.0 / math.sqrt(E)}),
            TensorSpec(b + "attn_v.weight", (nkv * D, E), "normal", {"std": 1.0 / math.sqrt(E)}),
            TensorSpec(b + "attn_output.weight", (E, nh * D), "normal", {"std": branch / math.sqrt(nh * D)}),
            # score std ~ gain^2: attention picks context rows instead of averaging them all into
            # one constant (the mask rows of a full layer would all draft the same token)
            TensorSpec(b + "attn_q_norm.weight", (D,), "scaled_norm", {"gain": 2.0}),
            TensorSpec(b + "attn_k_norm.weight", (D,), "scaled_norm", {"gain": 2.0}),
            TensorSpec(b + "ffn_gate.weight", (F, E), "normal", {"std": 1.0 / math.sqrt(E)}),
            TensorSpec(b + "ffn_up.weight", (F, E), "normal", {"std": 1.0 / math.sqrt(E)}),
            TensorSpec(b + "ffn_down.weight", (E, F), "normal", {"std": branch / math.sqrt(F)}),
        ]
    types = {s.name: tensor_type(s.name, len(s.shape), quant, n_layer) for s in specs}
    for spec in specs:
        block = GGML_QUANT_SIZES[types[spec.name]][0]
        if spec.shape[-1] % block:
            raise ValueError(f"{spec.name}: row length {spec.shape[-1]} is not a multiple of the "
                             f"{types[spec.name].name} block {block}; pick another shape or quant")

    writer = GGUFWriter(path, arch)
    try:
        writer.add_name(f"pyspecla-test-dflash-draft-{quant}")
        writer.add_context_length(thp.n_ctx_train)
        writer.add_embedding_length(E)
        writer.add_feed_forward_length(F)
        writer.add_block_count(n_layer)
        writer.add_head_count(nh)
        writer.add_head_count_kv(nkv)
        writer.add_key_length(D)
        writer.add_value_length(D)
        writer.add_layer_norm_rms_eps(1e-6)
        writer.add_rope_freq_base(thp.rope_freq_base)
        writer.add_file_type(int(_FILE_TYPE[quant]))
        if quant not in ("f32", "f16"):
            writer.add_quantization_version(2)
        if upstream:
            writer.add_array(f"{arch}.target_layers", target_ids)
            writer.add_uint32(f"{arch}.target_hidden_size", Et)
            writer.add_uint32(f"{arch}.block_size", block_size)
            writer.add_uint32(f"{arch}.mask_token_id", mask_token_id)
        else:
            writer.add_vocab_size(V)
            writer.add_uint32(f"{arch}.dflash.block_size", block_size)
            writer.add_uint32(f"{arch}.dflash.mask_token_id", mask_token_id)
            writer.add_array(f"{arch}.dflash.target_layer_ids", target_ids)
            writer.add_uint32(f"{arch}.dflash.n_target_layers", N)
            writer.add_bool(f"{arch}.dflash.context_kv_layer_norm", bool(context_kv_layer_norm))
            if any(layer_is_swa):
                writer.add_uint32(f"{arch}.attention.sliding_window", sliding_window)
                writer.add_array(f"{arch}.attention.sliding_window_pattern", layer_is_swa)
        # salted names: a draft tensor never repeats the target tensor of the same name and seed
        _stream_tensors(writer, specs, types, seed, salt="dflash-draft:")
    finally:
        writer.close()
    return path
