"""The DFlash draft architecture: its keys in every spelling, its hyper-parameters and its tensor names.

A DFlash draft (docs/ddtree-dflash.md) is a small Qwen3-style decoder with no embedding and no LM
head of its own: it embeds with the target's `token_embd`, projects its rows with the target's LM
head, and is conditioned on feature rows the target captures at `target_layer_ids`.

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

from dataclasses import dataclass

from ..errors import GGUFError
from ..gguf_container import F32_ONLY, INT32_MAX, MATRIX, REQUIRED, MetadataKeys, TensorView
from .qwen2 import read_full_rope_head_dim
from .qwen35 import ARCH as QWEN35

# general.architecture values accepted as a DFlash draft
DRAFT_ARCHS = ("qwen35-dflash-draft", "dflash-draft", "dflash")
TARGET_ARCH = QWEN35  # the architecture a DFlash draft drafts for
# Rows of one draft block. Published DFlash drafts use 16; each row costs a draft forward row and a
# row of logits over the target's head (~1 MB for a 248k vocabulary), so a value far above this is
# a corrupt key, which would otherwise surface as an allocation failure ("out of memory").
MAX_BLOCK_SIZE = 256


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
KEY_NAMES = {
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
GLOBAL_ALIASES = {
    "dflash.fc.weight": ("dflash.fc.weight", "fc.weight", "dflash_fc.weight"),
    "dflash.hidden_norm.weight": (
        "dflash.hidden_norm.weight",
        "enc.output_norm.weight",
        "hidden_norm.weight",
        "dflash_hidden_norm.weight",
    ),
    "output_norm.weight": ("output_norm.weight",),
}
AUX_PREFIXES = ("dflash.aux_hidden_norm.", "aux_hidden_norm.")

# blk.N.ffn_norm.weight may be written under the name the Qwen3 converter uses for it.
FFN_NORM_FALLBACK = "post_attention_norm.weight"


def _spelling(arch: str) -> str:
    return "upstream" if arch == "dflash" else "lucebox"


class DraftKeys(MetadataKeys):
    """MetadataKeys with the spelling-dependent names resolved, so messages name the key the file uses."""

    def __init__(self, path: str, metadata: dict[str, object], arch: str):
        super().__init__(path, metadata, arch)
        self.names = KEY_NAMES[_spelling(arch)]

    def name(self, role: str) -> str:
        return self.names[role]


def _int_list(keys: DraftKeys, name: str) -> list[int]:
    value = keys.raw(name)
    if not isinstance(value, list):
        value = [value]
    if not value:
        raise keys.fail(name, "is empty: a draft needs at least one target layer")
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int):
            raise keys.fail(name, f"must hold integers, got {value!r}")
        if v < 0 or v > INT32_MAX:
            raise keys.fail(name, f"holds {v}, not a trunk layer index (must be >= 0)")
    if len(set(value)) != len(value):
        raise keys.fail(name, f"repeats a layer: {value}")
    return [int(v) for v in value]


def _flag(keys: DraftKeys, name: str) -> bool | None:
    if not keys.present(name):
        return None
    value = keys.raw(name)
    if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    raise keys.fail(name, f"must be a bool, got {value!r}")


def _swa_layers(keys: DraftKeys, n_layer: int) -> tuple[int, tuple[bool, ...]]:
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


def read_hparams(path: str, metadata: dict[str, object], arch: str, tensors: dict[str, TensorView],
                  fc_name: str) -> DraftHParams:
    keys = DraftKeys(path, metadata, arch)
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
    block_size = keys.int(keys.name("block_size"), 16 if upstream else REQUIRED, minimum=2)
    if block_size > MAX_BLOCK_SIZE:
        raise keys.fail(keys.name("block_size"), f"= {block_size} is out of range [2, {MAX_BLOCK_SIZE}] "
                                                 "(DFlash drafts use 16): the file is corrupt")

    mask_key = keys.name("mask_token_id")
    if upstream and not keys.present(mask_key) and "tokenizer.ggml.mask_token_id" in metadata:
        mask = metadata["tokenizer.ggml.mask_token_id"]
        if isinstance(mask, bool) or not isinstance(mask, int) or not 0 <= mask <= INT32_MAX:
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

    aux_present = [i for i in range(n_target_layers) if find_aux(tensors, i) is not None]
    declared_norm = None if upstream else _flag(keys, keys.name("context_kv_layer_norm"))
    if declared_norm is None:
        context_kv_layer_norm = bool(aux_present)
    else:
        context_kv_layer_norm = declared_norm
        if not declared_norm and aux_present:
            raise GGUFError(
                f"{path}: key '{keys.key(keys.name('context_kv_layer_norm'))}' is false but the file has "
                f"'{find_aux(tensors, aux_present[0])}': the per-layer norms would be ignored"
            )

    for label, value in (("fc input width", fc.ne[0]), ("attention width", n_head * head_dim)):
        if value > INT32_MAX:
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


def find_aux(tensors: dict[str, TensorView], i: int) -> str | None:
    for prefix in AUX_PREFIXES:
        name = f"{prefix}{i}.weight"
        if name in tensors:
            return name
    return None


# Native specla_draft_layer_weights field -> canonical GGUF name suffix after "blk.N." (a file may
# store ffn_norm as FFN_NORM_FALLBACK; DraftFile.tensor takes the canonical name either way).
LAYER_TENSORS: dict[str, str] = {
    "attn_norm": "attn_norm.weight",
    "ffn_norm": "ffn_norm.weight",
    "attn_q": "attn_q.weight",
    "attn_k": "attn_k.weight",
    "attn_v": "attn_v.weight",
    "attn_output": "attn_output.weight",
    "attn_q_norm": "attn_q_norm.weight",
    "attn_k_norm": "attn_k_norm.weight",
    "ffn_gate": "ffn_gate.weight",
    "ffn_up": "ffn_up.weight",
    "ffn_down": "ffn_down.weight",
}


def expected_layer_tensors(hp: DraftHParams) -> dict[str, tuple[tuple[int, ...], str]]:
    """canonical suffix -> (ne, kind) of every tensor of a draft layer."""
    E, F, D = hp.n_embd, hp.n_ff, hp.head_dim
    nh, nkv = hp.n_head, hp.n_head_kv
    shapes = {
        "attn_norm": ((E,), F32_ONLY),
        "ffn_norm": ((E,), F32_ONLY),
        "attn_q": ((E, nh * D), MATRIX),
        "attn_k": ((E, nkv * D), MATRIX),
        "attn_v": ((E, nkv * D), MATRIX),
        "attn_output": ((nh * D, E), MATRIX),
        "attn_q_norm": ((D,), F32_ONLY),
        "attn_k_norm": ((D,), F32_ONLY),
        "ffn_gate": ((E, F), MATRIX),
        "ffn_up": ((E, F), MATRIX),
        "ffn_down": ((F, E), MATRIX),
    }
    return {LAYER_TENSORS[field]: spec for field, spec in shapes.items()}
