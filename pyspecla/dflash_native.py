"""ctypes declarations of the DFlash draft part of the C ABI (native/include/specla.h, "DFlash
block-diffusion draft"). Kept apart from _native.py, which declares the rest of the ABI and owns
the library handle; this module adds the draft structs and sets the draft functions' signatures
on the same `lib`."""

from __future__ import annotations

import ctypes

from ._native import ContextParams, Tensor, c_float_p, c_int32_p, check, lib

__all__ = ["DraftHParams", "DraftLayerWeights", "DraftWeights", "DRAFT_LAYER_TENSOR_FIELDS", "ContextParams",
           "Tensor", "check", "lib"]


class DraftHParams(ctypes.Structure):
    _fields_ = [
        ("n_layer", ctypes.c_int32),
        ("n_embd", ctypes.c_int32),
        ("n_ff", ctypes.c_int32),
        ("n_head", ctypes.c_int32),
        ("n_head_kv", ctypes.c_int32),
        ("head_dim", ctypes.c_int32),
        ("rms_eps", ctypes.c_float),
        ("rope_freq_base", ctypes.c_float),
        ("block_size", ctypes.c_int32),
        ("mask_token_id", ctypes.c_int32),
        ("n_target_layers", ctypes.c_int32),
        ("sliding_window", ctypes.c_int32),
        ("layer_is_swa", ctypes.POINTER(ctypes.c_uint8)),
        ("context_kv_layer_norm", ctypes.c_int32),
        ("_pad", ctypes.c_int32),
    ]


DRAFT_LAYER_TENSOR_FIELDS = (
    # (struct field, canonical GGUF name suffix after "blk.N.")
    ("attn_norm", "attn_norm.weight"),
    ("ffn_norm", "ffn_norm.weight"),
    ("attn_q", "attn_q.weight"),
    ("attn_k", "attn_k.weight"),
    ("attn_v", "attn_v.weight"),
    ("attn_output", "attn_output.weight"),
    ("attn_q_norm", "attn_q_norm.weight"),
    ("attn_k_norm", "attn_k_norm.weight"),
    ("ffn_gate", "ffn_gate.weight"),
    ("ffn_up", "ffn_up.weight"),
    ("ffn_down", "ffn_down.weight"),
)


class DraftLayerWeights(ctypes.Structure):
    _fields_ = [(field, Tensor) for field, _ in DRAFT_LAYER_TENSOR_FIELDS]


class DraftWeights(ctypes.Structure):
    _fields_ = [
        ("fc", Tensor),
        ("hidden_norm", Tensor),
        ("output_norm", Tensor),
        ("aux_hidden_norm", ctypes.POINTER(Tensor)),
        ("layers", ctypes.POINTER(DraftLayerWeights)),
    ]


_i32, _p = ctypes.c_int32, ctypes.c_void_p
_SIGNATURES = {
    "specla_draft_model_create": (
        ctypes.c_int,
        [ctypes.POINTER(DraftHParams), ctypes.POINTER(DraftWeights), _p, ctypes.POINTER(_p)],
    ),
    "specla_draft_model_free": (None, [_p]),
    "specla_draft_context_create": (ctypes.c_int, [_p, ctypes.POINTER(ContextParams), ctypes.POINTER(_p)]),
    "specla_draft_context_free": (None, [_p]),
    "specla_draft_context_reset": (ctypes.c_int, [_p]),
    "specla_draft_context_set_logit_head": (ctypes.c_int, [_p, ctypes.POINTER(Tensor)]),
    "specla_draft_propose": (ctypes.c_int, [_p, _p, _i32, _i32, _i32, c_int32_p, c_float_p]),
}

for _name, (_restype, _argtypes) in _SIGNATURES.items():
    _fn = getattr(lib, _name)
    _fn.restype = _restype
    _fn.argtypes = _argtypes
