"""Deterministic synthetic qwen35 (and qwen2 / qwen3) GGUF files that llama.cpp loads: test fixtures at any shape.

    write_test_model("tiny.gguf", preset="tiny", quant="f32", seed=0)
    write_test_model("tiny-qwen2.gguf", preset="tiny", quant="f32", seed=0, arch="qwen2")

qwen2 files (QWEN2_PRESETS) follow convert_hf_to_gguf.py's Qwen2 output: attention-only layers with
q/k/v biases (F32), ffn_norm as the pre-FFN norm, no key_length / rope.dimension_count keys unless
the head dim differs from n_embd / n_head, tokenizer pre "qwen2". qwen3 files (QWEN3_PRESETS) are
the same with per-head attn_q_norm / attn_k_norm instead of the biases and a head dim that is not
n_embd / n_head (so key_length / value_length are written).

The file follows the qwen35 format (docs/qwen35.md) the way
convert_hf_to_gguf.py + llama-quantize write a real Qwen3.5 model: every qwen35.* key, a full
tokenizer (pyspecla.testing.vocab), norm weights stored as (1 + w), ssm_a = -exp(A_log),
ssm_conv1d F32 {K, C}, and the llama-quantize type placement for each `quant`.

Weights are random, scaled so that activations stay O(1) through the depth and the logits are
neither flat nor one-hot: greedy decoding moves between many tokens, top-1/top-2 gaps are mostly
well above quantization noise, and quantization noise does not compound with depth (see
LOGIT_STD, RESIDUAL_RATIO). Each tensor draws from its own generator,
np.random.default_rng([seed, crc32(name)]), so the bytes do not depend on the tensor order, and
tensors are generated, quantized and written one at a time (a 27B file never sits in memory).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, LlamaFileType

from ..arch import ATTENTION_ONLY_ARCHS, TARGET_ARCHS
from ..arch.qwen2 import ARCH_QWEN2, ARCH_QWEN3
from ..arch.qwen35 import ARCH
from . import quant as _quant

__all__ = [
    "Preset", "PRESETS", "QWEN2_PRESETS", "QWEN3_PRESETS", "ARCHS", "presets_for", "QUANTS", "tensor_plan", "tensor_type", "use_more_bits", "write_test_model",
]

ARCHS = TARGET_ARCHS
QUANTS = ("f32", "f16", "q8_0", "q4_k_m", "q5_k_m")

_FILE_TYPE = {
    "f32": LlamaFileType.ALL_F32,
    "f16": LlamaFileType.MOSTLY_F16,
    "q8_0": LlamaFileType.MOSTLY_Q8_0,
    "q4_k_m": LlamaFileType.MOSTLY_Q4_K_M,
    "q5_k_m": LlamaFileType.MOSTLY_Q5_K_M,
}

Q = GGMLQuantizationType


@dataclass(frozen=True)
class Preset:
    name: str
    n_layer: int
    n_embd: int  # E
    n_ff: int  # F
    n_head: int  # nh
    n_head_kv: int  # nkv
    head_dim: int  # D
    rope_dims: int
    ssm_state_size: int  # S
    ssm_group_count: int  # Hk
    ssm_time_step_rank: int  # Hv
    n_vocab: int
    tied_output: bool
    ssm_conv_kernel: int = 4  # K
    full_attention_interval: int = 4
    context_length: int = 262144
    rope_freq_base: float = 1e7
    rms_eps: float = 1e-6
    arch: str = ARCH  # "qwen35", or "qwen2" / "qwen3" (then the ssm fields are unused, every layer is attention)

    @property
    def conv_channels(self) -> int:
        return (2 * self.ssm_group_count + self.ssm_time_step_rank) * self.ssm_state_size

    @property
    def layer_is_recurrent(self) -> list[bool]:
        if self.arch in ATTENTION_ONLY_ARCHS:
            return [False] * self.n_layer
        return [(i + 1) % self.full_attention_interval != 0 for i in range(self.n_layer)]

    @property
    def rope_sections(self) -> list[int]:
        """[t, h, w, 0] with t + h + w = rope_dims / 2, scaled from Qwen3.5's [11, 11, 10, 0].

        llama.cpp's IMROPE sends rotary pair i to section i % 3 while i < 3 * section; these
        sizes make every pair land in t, h or w (never the 4th, zero-position section), so for
        text (positions [p, p, p, 0]) the rotation is plain NEOX RoPE over rope_dims."""
        m = self.rope_dims // 2
        t = (m + 2) // 3
        h = (m + 1) // 3
        return [t, h, m - t - h, 0]


# tiny: K-quant rows need n_in % 256 == 0, hence E = 256, F = 512, nh*D = 768 and Hv*S = 768.
# GQA ratio 6 (nh 6, nkv 1) and Hv/Hk = 3 (the 27B ratio) are the shapes that break assumptions.
PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("tiny", n_layer=4, n_embd=256, n_ff=512, n_head=6, n_head_kv=1, head_dim=128, rope_dims=32,
               ssm_state_size=128, ssm_group_count=2, ssm_time_step_rank=6, n_vocab=1024, tied_output=True,
               context_length=4096),
        Preset("tiny8", n_layer=8, n_embd=256, n_ff=512, n_head=6, n_head_kv=1, head_dim=128, rope_dims=32,
               ssm_state_size=128, ssm_group_count=2, ssm_time_step_rank=6, n_vocab=1024, tied_output=False,
               context_length=4096),
        Preset("0.8b", n_layer=24, n_embd=1024, n_ff=3584, n_head=8, n_head_kv=2, head_dim=256, rope_dims=64,
               ssm_state_size=128, ssm_group_count=16, ssm_time_step_rank=16, n_vocab=248320, tied_output=True),
        Preset("9b", n_layer=32, n_embd=4096, n_ff=12288, n_head=16, n_head_kv=4, head_dim=256, rope_dims=64,
               ssm_state_size=128, ssm_group_count=16, ssm_time_step_rank=32, n_vocab=248320, tied_output=False),
        Preset("27b", n_layer=64, n_embd=5120, n_ff=17408, n_head=24, n_head_kv=4, head_dim=256, rope_dims=64,
               ssm_state_size=128, ssm_group_count=16, ssm_time_step_rank=48, n_vocab=248320, tied_output=False),
    )
}

# qwen2 (Qwen2.5-style): nh*D = E = 256 so K-quant rows fit; GQA ratio 4 as in Qwen2.5-7B.
QWEN2_PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("tiny", n_layer=4, n_embd=256, n_ff=512, n_head=8, n_head_kv=2, head_dim=32, rope_dims=32,
               ssm_state_size=0, ssm_group_count=0, ssm_time_step_rank=0, n_vocab=1024, tied_output=True,
               ssm_conv_kernel=0, full_attention_interval=1, context_length=4096, rope_freq_base=1e6,
               rms_eps=1e-6, arch=ARCH_QWEN2),
        Preset("tiny8", n_layer=8, n_embd=256, n_ff=512, n_head=8, n_head_kv=2, head_dim=32, rope_dims=32,
               ssm_state_size=0, ssm_group_count=0, ssm_time_step_rank=0, n_vocab=1024, tied_output=False,
               ssm_conv_kernel=0, full_attention_interval=1, context_length=4096, rope_freq_base=1e6,
               rms_eps=1e-6, arch=ARCH_QWEN2),
    )
}


# qwen3 (Qwen3-style): the qwen2 shapes with a head dim that is not E / n_head (Qwen3-0.6B: E 1024,
# 16 heads of 128), so the file carries attention.key_length; nh*D = 512 keeps K-quant rows whole.
QWEN3_PRESETS: dict[str, Preset] = {
    name: replace(p, head_dim=64, rope_dims=64, arch=ARCH_QWEN3) for name, p in QWEN2_PRESETS.items()
}


def presets_for(arch: str) -> dict[str, Preset]:
    """The preset table of an architecture ("qwen35" → PRESETS, "qwen2" → QWEN2_PRESETS, "qwen3" →
    QWEN3_PRESETS)."""
    if arch == ARCH:
        return PRESETS
    if arch == ARCH_QWEN2:
        return QWEN2_PRESETS
    if arch == ARCH_QWEN3:
        return QWEN3_PRESETS
    raise ValueError(f"unknown arch {arch!r}; choose one of {', '.join(ARCHS)}")


# ---------------------------------------------------------------------------------------------
# tensor list and type placement

LOGIT_STD = 5.0  # spread of the logits over the vocabulary, roughly
# The branches (GDN / attention / FFN outputs) together add RESIDUAL_RATIO x the embedding's rms to
# the residual stream. Random branches amplify relative errors (~1.5-2x per branch); keeping the
# embedding a large part of the stream stops quantization noise from compounding with depth, so
# files of different quant types stay close and argmax comparisons stay meaningful.
RESIDUAL_RATIO = 1.0
# A tied head turns the embedding's direct path into a symmetric bilinear form (the logit of b
# after a equals the logit of a after b), and greedy decoding falls into 2-cycles (seen at
# V = 248320) unless the branches weigh more.
RESIDUAL_RATIO_TIED = 2.0


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # numpy order (GGUF ne reversed): (n_out, n_in) for a weight
    init: str  # how it is filled: normal (params["std"]), bias (params["std"], 1-D), norm, signed_norm, ssm_a, dt_bias
    params: dict = field(default_factory=dict, compare=False, hash=False)


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama-quant.cpp's use_more_bits (integer division as in C for non-negative values)."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def tensor_type(name: str, n_dims: int, quant: str, n_layer_all: int, tied_output: bool = False) -> GGMLQuantizationType:
    """The GGML type llama-quantize gives tensor `name` (of n_dims dimensions) for `quant`.

    f16 / q8_0: every 2-D weight in that type except ssm_conv1d. q4_k_m follows llama-quant.cpp
    (the vendored llama.cpp): output Q6_K, and token_embd too when the head is tied (it is
    quantized as the output); attn_v / attn_qkv (one per layer, counted in layer order, so the
    index is the layer) and ffn_down Q6_K on use_more_bits(layer, n_layer_all) layers, Q4_K on
    the others; every other 2-D weight Q4_K. q5_k_m is the same rule with Q5_K in place of Q4_K
    (llama-quant.cpp gives both mixes the same Q6_K placements). ssm_conv1d and every 1-D tensor stay
    F32. (n_layer_all = block_count, MTP blocks included.) Both checked against llama_model_quantize
    (tests/test_llama_parity_reference.py)."""
    if n_dims < 2 or "ssm_conv1d" in name or quant == "f32":
        return Q.F32
    if quant == "f16":
        return Q.F16
    if quant == "q8_0":
        return Q.Q8_0
    if quant not in ("q4_k_m", "q5_k_m"):
        raise ValueError(f"unknown quant {quant!r}; choose one of {', '.join(QUANTS)}")
    base = Q.Q4_K if quant == "q4_k_m" else Q.Q5_K
    if name == "output.weight" or (tied_output and name == "token_embd.weight"):
        return Q.Q6_K
    if name.startswith("blk.") and (name.endswith(".attn_v.weight") or name.endswith(".attn_qkv.weight")
                                    or name.endswith(".ffn_down.weight")):
        layer = int(name.split(".")[1])
        return Q.Q6_K if use_more_bits(layer, n_layer_all) else base
    return base


def tensor_plan(preset: Preset) -> list[TensorSpec]:
    """Every tensor of the file in the order written (convert_hf_to_gguf order: globals first)."""
    p = preset
    E, F, V = p.n_embd, p.n_ff, p.n_vocab
    S, Hk, Hv, K, C = p.ssm_state_size, p.ssm_group_count, p.ssm_time_step_rank, p.ssm_conv_kernel, p.conv_channels
    D, nh, nkv = p.head_dim, p.n_head, p.n_head_kv
    # Scales (see RESIDUAL_RATIO): all branches together add about RESIDUAL_RATIO x the embedding
    # rms to the residual stream, whatever the depth.
    embd_std = LOGIT_STD / math.sqrt(E) if p.tied_output else 1.0
    ratio = RESIDUAL_RATIO_TIED if p.tied_output else RESIDUAL_RATIO
    branch = ratio * embd_std / math.sqrt(2 * p.n_layer)
    specs = [
        TensorSpec("token_embd.weight", (V, E), "normal", {"std": embd_std}),
        # tied head: a zero-mean output norm so a token's own embedding row gets no systematic
        # bonus (e . (e * w) averages 0); otherwise greedy decoding just repeats the input token
        TensorSpec("output_norm.weight", (E,), "signed_norm" if p.tied_output else "norm"),
    ]
    if not p.tied_output:
        specs.append(TensorSpec("output.weight", (V, E), "normal", {"std": LOGIT_STD / math.sqrt(E)}))
    if p.arch in ATTENTION_ONLY_ARCHS:
        qwen2 = p.arch == ARCH_QWEN2
        for i in range(p.n_layer):
            b = f"blk.{i}."
            # qwen2: q/k/v biases; qwen3: per-head q/k norms instead
            q_extra = ([TensorSpec(b + "attn_q.bias", (nh * D,), "bias", {"std": 0.5})] if qwen2 else
                       [TensorSpec(b + "attn_q_norm.weight", (D,), "norm")])
            k_extra = ([TensorSpec(b + "attn_k.bias", (nkv * D,), "bias", {"std": 0.5})] if qwen2 else
                       [TensorSpec(b + "attn_k_norm.weight", (D,), "norm")])
            v_extra = [TensorSpec(b + "attn_v.bias", (nkv * D,), "bias", {"std": 0.1})] if qwen2 else []
            specs += [
                TensorSpec(b + "attn_norm.weight", (E,), "norm"),
                TensorSpec(b + "attn_q.weight", (nh * D, E), "normal", {"std": 1.0 / math.sqrt(E)}),
                *q_extra,
                TensorSpec(b + "attn_k.weight", (nkv * D, E), "normal", {"std": 1.0 / math.sqrt(E)}),
                *k_extra,
                TensorSpec(b + "attn_v.weight", (nkv * D, E), "normal", {"std": 1.0 / math.sqrt(E)}),
                *v_extra,
                TensorSpec(b + "attn_output.weight", (E, nh * D), "normal", {"std": branch / math.sqrt(nh * D)}),
                TensorSpec(b + "ffn_norm.weight", (E,), "norm"),
                TensorSpec(b + "ffn_gate.weight", (F, E), "normal", {"std": 1.0 / math.sqrt(E)}),
                TensorSpec(b + "ffn_up.weight", (F, E), "normal", {"std": 1.0 / math.sqrt(E)}),
                TensorSpec(b + "ffn_down.weight", (E, F), "normal", {"std": branch / math.sqrt(F)}),
            ]
        return specs
    for i, recurrent in enumerate(p.layer_is_recurrent):
        b = f"blk.{i}."
        specs += [
            TensorSpec(b + "attn_norm.weight", (E,), "norm"),
            TensorSpec(b + "post_attention_norm.weight", (E,), "norm"),
        ]
        if recurrent:
            specs += [
                TensorSpec(b + "attn_qkv.weight", (C, E), "normal", {"std": 1.0 / math.sqrt(E)}),
                TensorSpec(b + "attn_gate.weight", (Hv * S, E), "normal", {"std": 1.0 / math.sqrt(E)}),
                TensorSpec(b + "ssm_conv1d.weight", (C, K), "normal", {"std": 1.0 / math.sqrt(K)}),
                TensorSpec(b + "ssm_dt.bias", (Hv,), "dt_bias"),
                TensorSpec(b + "ssm_a", (Hv,), "ssm_a"),
                TensorSpec(b + "ssm_beta.weight", (Hv, E), "normal", {"std": 1.0 / math.sqrt(E)}),
                TensorSpec(b + "ssm_alpha.weight", (Hv, E), "normal", {"std": 0.5 / math.sqrt(E)}),
                TensorSpec(b + "ssm_norm.weight", (S,), "norm"),
                TensorSpec(b + "ssm_out.weight", (E, Hv * S), "normal", {"std": branch / math.sqrt(Hv * S)}),
            ]
        else:
            specs += [
                TensorSpec(b + "attn_q.weight", (2 * nh * D, E), "normal", {"std": 1.0 / math.sqrt(E)}),
                TensorSpec(b + "attn_k.weight", (nkv * D, E), "normal", {"std": 1.0 / math.sqrt(E)}),
                TensorSpec(b + "attn_v.weight", (nkv * D, E), "normal", {"std": 1.0 / math.sqrt(E)}),
                TensorSpec(b + "attn_output.weight", (E, nh * D), "normal", {"std": branch / math.sqrt(nh * D)}),
                TensorSpec(b + "attn_q_norm.weight", (D,), "norm"),
                TensorSpec(b + "attn_k_norm.weight", (D,), "norm"),
            ]
        specs += [
            TensorSpec(b + "ffn_gate.weight", (F, E), "normal", {"std": 1.0 / math.sqrt(E)}),
            TensorSpec(b + "ffn_up.weight", (F, E), "normal", {"std": 1.0 / math.sqrt(E)}),
            TensorSpec(b + "ffn_down.weight", (E, F), "normal", {"std": branch / math.sqrt(F)}),
        ]
    return specs


def _tensor_types(preset: Preset, quant: str) -> dict[str, GGMLQuantizationType]:
    return {
        s.name: tensor_type(s.name, len(s.shape), quant, preset.n_layer, preset.tied_output)
        for s in tensor_plan(preset)
    }


# ---------------------------------------------------------------------------------------------
# generation


_ROWS_ELEMENTS = 1 << 22  # elements generated and quantized per chunk


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(name.encode())])


def _generate_small(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    n = spec.shape[0]
    if spec.init == "norm":
        # converter convention: the file holds (1 + w); small w
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)
    if spec.init == "scaled_norm":
        # (1 + w) times a gain: sharper attention where it scales the per-head q / k norms
        return (spec.params["gain"] * (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32))).astype(np.float32)
    if spec.init == "bias":
        return (spec.params["std"] * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)
    if spec.init == "signed_norm":
        # the stored (1 + w) with w ~ N(-1, 1): weights of either sign
        return rng.standard_normal(n, dtype=np.float32)
    if spec.init == "ssm_a":
        # A_log ~ log U(1, 16); the file holds -exp(A_log)
        a_log = np.log(rng.uniform(1.0, 16.0, n))
        return (-np.exp(a_log)).astype(np.float32)
    if spec.init == "dt_bias":
        # Mamba-style: dt ~ log-uniform in [1e-3, 1e-1], bias = softplus^-1(dt)
        dt = np.exp(rng.uniform(math.log(1e-3), math.log(1e-1), n))
        return (dt + np.log(-np.expm1(-dt))).astype(np.float32)
    raise ValueError(spec.init)


def _encoded_chunks(spec: TensorSpec, qtype: GGMLQuantizationType, seed: int):
    """Yields the tensor's encoded bytes, a block of rows at a time (uint8 (rows, row_bytes))."""
    rng = _rng(seed, spec.name)
    if spec.init != "normal":
        yield _quant.quantize(_generate_small(spec, rng).reshape(1, -1), qtype)
        return
    rows, n = spec.shape
    std = np.float32(spec.params["std"])
    rows_per_chunk = max(1, _ROWS_ELEMENTS // n)
    for r0 in range(0, rows, rows_per_chunk):
        r1 = min(rows, r0 + rows_per_chunk)
        chunk = rng.standard_normal((r1 - r0, n), dtype=np.float32)
        chunk *= std
        yield _quant.quantize(chunk, qtype)


def _tensor_nbytes(shape: tuple[int, ...], qtype: GGMLQuantizationType) -> int:
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    return rows * (shape[-1] // block) * block_bytes


def _add_metadata_attention_only(writer: GGUFWriter, p: Preset, quant: str) -> None:
    """qwen2 / qwen3 keys (the same set; the writer's architecture prefixes them)."""
    writer.add_name(f"pyspecla-test-{p.arch}-{p.name}-{quant}")
    writer.add_block_count(p.n_layer)
    writer.add_context_length(p.context_length)
    writer.add_embedding_length(p.n_embd)
    writer.add_feed_forward_length(p.n_ff)
    writer.add_head_count(p.n_head)
    writer.add_head_count_kv(p.n_head_kv)
    if p.head_dim * p.n_head != p.n_embd:
        writer.add_key_length(p.head_dim)
        writer.add_value_length(p.head_dim)
    writer.add_rope_freq_base(p.rope_freq_base)
    writer.add_layer_norm_rms_eps(p.rms_eps)
    writer.add_file_type(int(_FILE_TYPE[quant]))
    if quant not in ("f32", "f16"):
        writer.add_quantization_version(2)


def _add_metadata(writer: GGUFWriter, p: Preset, quant: str) -> None:
    writer.add_name(f"pyspecla-test-{p.name}-{quant}")
    writer.add_context_length(p.context_length)
    writer.add_embedding_length(p.n_embd)
    writer.add_feed_forward_length(p.n_ff)
    writer.add_block_count(p.n_layer)
    writer.add_head_count(p.n_head)
    writer.add_head_count_kv(p.n_head_kv)
    writer.add_key_length(p.head_dim)
    writer.add_value_length(p.head_dim)
    writer.add_rope_dimension_count(p.rope_dims)
    writer.add_rope_freq_base(p.rope_freq_base)
    writer.add_rope_dimension_sections(p.rope_sections)
    writer.add_layer_norm_rms_eps(p.rms_eps)
    writer.add_ssm_conv_kernel(p.ssm_conv_kernel)
    writer.add_ssm_state_size(p.ssm_state_size)
    writer.add_ssm_group_count(p.ssm_group_count)
    writer.add_ssm_time_step_rank(p.ssm_time_step_rank)
    writer.add_ssm_inner_size(p.ssm_time_step_rank * p.ssm_state_size)
    writer.add_full_attention_interval(p.full_attention_interval)
    writer.add_file_type(int(_FILE_TYPE[quant]))
    if quant not in ("f32", "f16"):
        writer.add_quantization_version(2)


def _add_tokenizer(writer: GGUFWriter, n_vocab: int, pre: str = "qwen35") -> None:
    from .vocab import build_vocab, write_tokenizer_metadata

    write_tokenizer_metadata(writer, build_vocab(n_vocab, pre=pre))


def write_test_model(path, preset: str | Preset = "tiny", quant: str = "f32", seed: int = 0, *,
                     arch: str | None = None, vocab_pre: str | None = None, **overrides) -> Path:
    """Write a synthetic qwen35, qwen2 or qwen3 GGUF. `preset` is a preset name of `arch` (default
    qwen35: PRESETS; qwen2: QWEN2_PRESETS; qwen3: QWEN3_PRESETS) or a Preset (its own arch field decides; `arch`, if given, must
    agree); keyword overrides replace Preset fields (e.g. n_layer=8). `vocab_pre` picks the synthetic
    vocabulary's pre-tokenizer (default: the architecture's own; the merges, hence the token list,
    depend on it), so a qwen2 draft can share a qwen35 target's vocabulary. Same arguments →
    identical bytes. Returns the path."""
    if isinstance(preset, str):
        table = presets_for(ARCH if arch is None else arch)
        if preset not in table:
            raise ValueError(f"unknown {arch or ARCH} preset {preset!r}; choose one of {', '.join(table)}")
        p = table[preset]
    else:
        p = preset
        if arch is not None and p.arch != arch:
            raise ValueError(f"preset {p.name!r} is a {p.arch} preset, not {arch}")
    if overrides:
        p = replace(p, **overrides)
    if p.arch not in ARCHS:
        raise ValueError(f"unknown arch {p.arch!r}; choose one of {', '.join(ARCHS)}")
    if quant not in QUANTS:
        raise ValueError(f"unknown quant {quant!r}; choose one of {', '.join(QUANTS)}")
    if p.arch in ATTENTION_ONLY_ARCHS and (p.rope_dims != p.head_dim or p.n_head % p.n_head_kv):
        raise ValueError(f"{p.arch} needs rope_dims == head_dim and n_head a multiple of n_head_kv")
    if not any(not r for r in p.layer_is_recurrent):
        raise ValueError("llama.cpp needs at least one full-attention layer (n_layer >= full_attention_interval)")
    path = Path(path)

    plan = tensor_plan(p)
    types = _tensor_types(p, quant)
    for spec in plan:
        block = GGML_QUANT_SIZES[types[spec.name]][0]
        if spec.shape[-1] % block:
            raise ValueError(f"{spec.name}: row length {spec.shape[-1]} is not a multiple of the "
                             f"{types[spec.name].name} block {block}; pick another shape or quant")

    writer = GGUFWriter(path, p.arch)
    try:
        if p.arch in ATTENTION_ONLY_ARCHS:
            _add_metadata_attention_only(writer, p, quant)
        else:
            _add_metadata(writer, p, quant)
        # Qwen3 files carry the Qwen2 pre-tokenizer, as convert_hf_to_gguf.py writes them
        _add_tokenizer(writer, p.n_vocab, pre=vocab_pre or ("qwen35" if p.arch == ARCH else "qwen2"))
        _stream_tensors(writer, plan, types, seed)
    finally:
        writer.close()
    return path


def _stream_tensors(writer, specs, types, seed: int, salt: str = "") -> None:
    """Declare every tensor, write header, metadata and tensor infos, then generate and write the
    tensors one by one in chunks (peak memory stays one chunk, whatever the model size)."""
    for spec in specs:
        qtype = types[spec.name]
        nbytes = _tensor_nbytes(spec.shape, qtype)
        byte_shape = (*spec.shape[:-1], nbytes // max(1, int(np.prod(spec.shape[:-1]))))
        writer.add_tensor_info(spec.name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    fout = writer.fout[0]
    for spec in specs:
        qtype = types[spec.name]
        expected = _tensor_nbytes(spec.shape, qtype)
        writer.write_padding(fout, fout.tell())
        written = 0
        source = replace(spec, name=salt + spec.name) if salt else spec
        for chunk in _encoded_chunks(source, qtype, seed):
            chunk.tofile(fout)
            written += chunk.nbytes
        if written != expected:
            raise AssertionError(f"{spec.name}: wrote {written} bytes, expected {expected}")
        writer.write_padding(fout, written)
    writer.flush()
