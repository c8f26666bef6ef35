"""The qwen2 (Qwen2 / Qwen2.5) and qwen3 (Qwen3) architectures: attention-only trunks with NEOX
RoPE over the whole head. qwen2 layers carry q/k/v biases; qwen3 layers carry per-head q/k RMS
norms instead. Same keys, one tensor-name table each; the hyper-parameters fill the shared
`Qwen35HParams` record with no recurrent layer."""

from __future__ import annotations

from ..errors import GGUFError
from ..gguf_container import F32_ONLY, INT32_MAX, MATRIX, REQUIRED, ExpectedTensor, MetadataKeys
from .qwen35 import Qwen35HParams, check_vocab

ARCH_QWEN2 = "qwen2"
ARCH_QWEN3 = "qwen3"
ARCHS = (ARCH_QWEN2, ARCH_QWEN3)

# Native specla_layer_weights field -> GGUF name suffix after "blk.N." (None: no such tensor).
# qwen2: ffn_norm is the pre-FFN norm the native side calls post_attention_norm.
QWEN2_LAYER_TENSORS: dict[str, str | None] = {
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
}
# qwen3: the qwen2 layer with per-head q/k norms instead of the q/k/v biases
QWEN3_LAYER_TENSORS: dict[str, str | None] = {
    **QWEN2_LAYER_TENSORS,
    "attn_q_norm": "attn_q_norm.weight",
    "attn_k_norm": "attn_k_norm.weight",
    "attn_q_bias": None,
    "attn_k_bias": None,
    "attn_v_bias": None,
}
LAYER_TENSORS = {ARCH_QWEN2: QWEN2_LAYER_TENSORS, ARCH_QWEN3: QWEN3_LAYER_TENSORS}


def read_full_rope_head_dim(keys: MetadataKeys, n_embd: int, n_head: int, why: str) -> int:
    """Head dim of an architecture whose RoPE turns the whole head (qwen2, DFlash drafts):
    key_length (default E / n_head) == value_length, even, and rope.dimension_count (if present)
    equal to it; `why` ends the message when it is not."""
    default_head_dim = n_embd // n_head if n_embd % n_head == 0 else REQUIRED
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


def read_hparams(path: str, metadata: dict[str, object], n_vocab: int,
                                 arch: str = ARCH_QWEN2) -> Qwen35HParams:
    """qwen2 (Qwen2 / Qwen2.5) and qwen3 (Qwen3): attention-only, NEOX RoPE over the whole head
    (same keys; the layers differ in tensors only)."""
    keys = MetadataKeys(path, metadata, arch)

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

    check_vocab(keys, n_vocab)
    if 2 * n_head * head_dim > INT32_MAX:
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


def expected_tensors(hp: Qwen35HParams) -> dict[str, ExpectedTensor]:
    """Every trunk tensor a qwen2 / qwen3 file must (or may) hold, with its shape and kind."""
    E, F, V = hp.n_embd, hp.n_ff, hp.n_vocab
    nh, nkv, D = hp.n_head, hp.n_head_kv, hp.head_dim
    expected = {
        "token_embd.weight": ExpectedTensor((E, V), MATRIX),
        "output_norm.weight": ExpectedTensor((E,), F32_ONLY),
        "output.weight": ExpectedTensor((E, V), MATRIX, required=False),
    }
    if hp.arch == ARCH_QWEN2:
        extra = {"attn_q.bias": ExpectedTensor((nh * D,), F32_ONLY), "attn_k.bias": ExpectedTensor((nkv * D,), F32_ONLY),
                 "attn_v.bias": ExpectedTensor((nkv * D,), F32_ONLY)}
    else:
        extra = {"attn_q_norm.weight": ExpectedTensor((D,), F32_ONLY), "attn_k_norm.weight": ExpectedTensor((D,), F32_ONLY)}
    for i in range(hp.n_layer):
        layer = {
            "attn_norm.weight": ExpectedTensor((E,), F32_ONLY),
            "attn_q.weight": ExpectedTensor((E, nh * D), MATRIX),
            "attn_k.weight": ExpectedTensor((E, nkv * D), MATRIX),
            "attn_v.weight": ExpectedTensor((E, nkv * D), MATRIX),
            **extra,
            "attn_output.weight": ExpectedTensor((nh * D, E), MATRIX),
            "ffn_norm.weight": ExpectedTensor((E,), F32_ONLY),
            "ffn_gate.weight": ExpectedTensor((E, F), MATRIX),
            "ffn_up.weight": ExpectedTensor((E, F), MATRIX),
            "ffn_down.weight": ExpectedTensor((F, E), MATRIX),
        }
        expected.update({f"blk.{i}.{suffix}": spec for suffix, spec in layer.items()})
    return expected
