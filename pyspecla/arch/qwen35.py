"""The qwen35 architecture (Qwen3.5 / Qwen3.6: hybrid Gated DeltaNet + full attention): what its
GGUF keys mean, the hyper-parameters read from them, its one tensor-name table and the tensors a
file must hold. The rules are those of llama.cpp's qwen35 loader and of convert_hf_to_gguf.py's
output (docs/qwen35.md). The record `Qwen35HParams` also carries the attention-only qwen2 / qwen3
trunks (pyspecla.arch.qwen2), which the native forward runs as the same model without recurrent
layers."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import GGUFError
from ..gguf_container import F32_ONLY, INT32_MAX, MATRIX, REQUIRED, ExpectedTensor, MetadataKeys

ARCH = "qwen35"

# Native specla_layer_weights field -> GGUF name suffix after "blk.N." (None: no such tensor in a
# qwen35 layer). The field order is that of pyspecla._native.LAYER_TENSOR_FIELDS.
LAYER_TENSORS: dict[str, str | None] = {
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
}


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



def _layer_pattern(keys: MetadataKeys, n_layer: int, n_layer_file: int) -> tuple[bool, ...]:
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


def _check_rope_sections(keys: MetadataKeys, sections: tuple[int, ...], rope_dims: int, head_dim: int) -> None:
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


def check_vocab(keys: MetadataKeys, n_vocab: int) -> None:
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


def read_hparams(path: str, metadata: dict[str, object], n_vocab: int) -> Qwen35HParams:
    keys = MetadataKeys(path, metadata, ARCH)

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

    default_head_dim = n_embd // n_head if n_embd % n_head == 0 else REQUIRED
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

    check_vocab(keys, n_vocab)

    for label, value in (("conv channels", conv_channels), ("attention width", 2 * n_head * head_dim)):
        if value > INT32_MAX:
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


def expected_tensors(hp: Qwen35HParams) -> dict[str, ExpectedTensor]:
    """Every trunk tensor a qwen35 file must (or may) hold, with its shape and kind."""
    E, F, V = hp.n_embd, hp.n_ff, hp.n_vocab
    S, Hv, K, C = hp.ssm_state_size, hp.ssm_time_step_rank, hp.ssm_conv_kernel, hp.conv_channels
    nh, nkv, D = hp.n_head, hp.n_head_kv, hp.head_dim
    expected = {
        "token_embd.weight": ExpectedTensor((E, V), MATRIX),
        "output_norm.weight": ExpectedTensor((E,), F32_ONLY),
        "output.weight": ExpectedTensor((E, V), MATRIX, required=False),
    }
    for i in range(hp.n_layer):
        layer = {
            "attn_norm.weight": ExpectedTensor((E,), F32_ONLY),
            "post_attention_norm.weight": ExpectedTensor((E,), F32_ONLY),
            "ffn_gate.weight": ExpectedTensor((E, F), MATRIX),
            "ffn_up.weight": ExpectedTensor((E, F), MATRIX),
            "ffn_down.weight": ExpectedTensor((F, E), MATRIX),
        }
        if hp.layer_is_recurrent[i]:
            layer.update(
                {
                    "attn_qkv.weight": ExpectedTensor((E, C), MATRIX),
                    "attn_gate.weight": ExpectedTensor((E, Hv * S), MATRIX),
                    "ssm_conv1d.weight": ExpectedTensor((K, C), F32_ONLY),
                    "ssm_dt.bias": ExpectedTensor((Hv,), F32_ONLY),
                    "ssm_a": ExpectedTensor((Hv,), F32_ONLY),
                    "ssm_beta.weight": ExpectedTensor((E, Hv), MATRIX),
                    "ssm_alpha.weight": ExpectedTensor((E, Hv), MATRIX),
                    "ssm_norm.weight": ExpectedTensor((S,), F32_ONLY),
                    "ssm_out.weight": ExpectedTensor((Hv * S, E), MATRIX),
                }
            )
        else:
            layer.update(
                {
                    "attn_q.weight": ExpectedTensor((E, 2 * nh * D), MATRIX),
                    "attn_k.weight": ExpectedTensor((E, nkv * D), MATRIX),
                    "attn_v.weight": ExpectedTensor((E, nkv * D), MATRIX),
                    "attn_output.weight": ExpectedTensor((nh * D, E), MATRIX),
                    "attn_q_norm.weight": ExpectedTensor((D,), F32_ONLY),
                    "attn_k_norm.weight": ExpectedTensor((D,), F32_ONLY),
                }
            )
        expected.update({f"blk.{i}.{suffix}": spec for suffix, spec in layer.items()})
    return expected
