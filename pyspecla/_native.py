"""Loads libspecla and declares its C ABI (native/include/specla.h) with ctypes.

This module is the only place that knows the ABI's struct layouts. Every call goes through
`check(status)`, which turns a non-zero status into a NativeError carrying the library's message.
The library is looked up at $SPECLA_LIBRARY first (a development build), then inside the
installed package."""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

import numpy as np

from .errors import NativeError

ABI_VERSION = 10

OK = 0
ERR_INVALID_ARGUMENT = 1
ERR_OUT_OF_MEMORY = 2
ERR_UNSUPPORTED = 3
ERR_STATE = 4

CPU_AUTO = 0
CPU_SCALAR = 1
CPU_AVX2 = 2
CPU_AVX512 = 3
CPU_KERNELS = {"auto": CPU_AUTO, "scalar": CPU_SCALAR, "avx2": CPU_AVX2, "avx512": CPU_AVX512}

# specla_backend_kind: where a context's state lives and its ops run
BACKEND_AUTO, BACKEND_CPU, BACKEND_CUDA = 0, 1, 2
BACKENDS = {"auto": BACKEND_AUTO, "cpu": BACKEND_CPU, "cuda": BACKEND_CUDA}
BACKEND_NAMES = {BACKEND_CPU: "cpu", BACKEND_CUDA: "cuda"}


def parse_device(device: str) -> tuple[int, int]:
    """'auto', 'cpu', 'cuda' or 'cuda:N' -> (specla_backend_kind, device index). ValueError with the
    accepted spellings otherwise. 'auto' follows the SPECLA_DEVICE environment variable when it is
    set (e.g. SPECLA_DEVICE=cpu keeps a GPU machine's runs on the CPU), else the library's choice
    (the first GPU where one is visible)."""
    if device == "auto" and os.environ.get("SPECLA_DEVICE", "auto") != "auto":
        device = os.environ["SPECLA_DEVICE"]
    if not isinstance(device, str):
        raise ValueError(f"device must be a string ('auto', 'cpu', 'cuda' or 'cuda:N'), got {device!r}")
    name, _, index = device.partition(":")
    if name not in BACKENDS or (index and (name != "cuda" or not index.isdigit())):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    return BACKENDS[name], int(index) if index else 0

c_float_p = ctypes.POINTER(ctypes.c_float)
c_int32_p = ctypes.POINTER(ctypes.c_int32)


class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("type", ctypes.c_int32),
        ("ne0", ctypes.c_int32),
        ("ne1", ctypes.c_int32),
        ("_pad", ctypes.c_int32),
        ("nbytes", ctypes.c_int64),
    ]


class HParams(ctypes.Structure):
    _fields_ = [
        ("n_layer", ctypes.c_int32),
        ("n_embd", ctypes.c_int32),
        ("n_ff", ctypes.c_int32),
        ("n_vocab", ctypes.c_int32),
        ("n_head", ctypes.c_int32),
        ("n_head_kv", ctypes.c_int32),
        ("head_dim", ctypes.c_int32),
        ("rope_dims", ctypes.c_int32),
        ("rope_freq_base", ctypes.c_float),
        ("rms_eps", ctypes.c_float),
        ("ssm_conv_kernel", ctypes.c_int32),
        ("ssm_state_size", ctypes.c_int32),
        ("ssm_group_count", ctypes.c_int32),
        ("ssm_time_step_rank", ctypes.c_int32),
        ("n_ctx_train", ctypes.c_int32),
        ("arch", ctypes.c_int32),
        ("layer_is_recurrent", ctypes.POINTER(ctypes.c_uint8)),
    ]


# specla_layer_weights, in struct order. Which GGUF tensor fills a field is the architecture's
# table (pyspecla.arch: LAYER_TENSORS); a field the architecture lacks stays empty.
LAYER_FIELDS = (
    "attn_norm",
    "post_attention_norm",
    "attn_qkv",
    "attn_gate",
    "ssm_conv1d",
    "ssm_dt_bias",
    "ssm_a",
    "ssm_beta",
    "ssm_alpha",
    "ssm_norm",
    "ssm_out",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "attn_q_norm",
    "attn_k_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
    "attn_q_bias",
    "attn_k_bias",
    "attn_v_bias",
)

ARCHS = {"qwen35": 0, "qwen2": 1, "qwen3": 2}


class LayerWeights(ctypes.Structure):
    _fields_ = [(field, Tensor) for field in LAYER_FIELDS]


class Weights(ctypes.Structure):
    _fields_ = [
        ("token_embd", Tensor),
        ("output_norm", Tensor),
        ("output", Tensor),
        ("layers", ctypes.POINTER(LayerWeights)),
    ]


class ContextParams(ctypes.Structure):
    _fields_ = [
        ("n_ctx", ctypes.c_int32),
        ("max_batch", ctypes.c_int32),
        ("n_threads", ctypes.c_int32),
        ("cpu_kernels", ctypes.c_int32),
        ("max_tree_nodes", ctypes.c_int32),
        ("verify_method", ctypes.c_int32),
        ("commit_method", ctypes.c_int32),
        ("n_capture_layers", ctypes.c_int32),
        ("capture_layers", c_int32_p),
        ("backend", ctypes.c_int32),
        ("device", ctypes.c_int32),
        ("no_recorded_steps", ctypes.c_int32),
        ("_pad", ctypes.c_int32),
    ]


class TreeBatch(ctypes.Structure):
    _fields_ = [
        ("tokens", c_int32_p),
        ("parents", c_int32_p),
        ("n_nodes", ctypes.c_int32),
        ("_pad", ctypes.c_int32),
        ("logits", c_float_p),
        ("argmax", c_int32_p),
    ]


class Batch(ctypes.Structure):
    _fields_ = [
        ("tokens", c_int32_p),
        ("positions", c_int32_p),
        ("n_tokens", ctypes.c_int32),
        ("logits_all", ctypes.c_int32),
        ("logits", c_float_p),
        ("argmax", c_int32_p),
    ]


class TreeStats(ctypes.Structure):
    """specla_tree_stats: what the last verify did in the recurrent layers (value head 0, summed
    over the layers); -1 where the backend does not count."""

    _fields_ = [
        ("n_nodes", ctypes.c_int32),
        ("n_layers", ctypes.c_int32),
        ("node_steps", ctypes.c_int64),
        ("state_copies", ctypes.c_int64),
    ]

    def as_dict(self) -> dict:
        return {name: int(getattr(self, name)) for name, _ in self._fields_}


class OpOptions(ctypes.Structure):
    _fields_ = [
        ("n_threads", ctypes.c_int32),
        ("cpu_kernels", ctypes.c_int32),
        ("backend", ctypes.c_int32),
        ("device", ctypes.c_int32),
    ]


VERIFY_METHODS = {"hld_chains": 0, "root_to_leaf": 1, "dense_checkpoints": 2}
COMMIT_METHODS = {"deferred_factors": 0, "factors_now": 1, "replay": 2, "checkpoint_restore": 3}


class RecurrentShape(ctypes.Structure):
    _fields_ = [
        ("n_layers", ctypes.c_int32),
        ("Hk", ctypes.c_int32),
        ("Hv", ctypes.c_int32),
        ("S", ctypes.c_int32),
        ("C", ctypes.c_int32),
        ("K", ctypes.c_int32),
        ("max_nodes", ctypes.c_int32),
        ("verify_method", ctypes.c_int32),
        ("commit_method", ctypes.c_int32),
    ]


class RecurrentInputs(ctypes.Structure):
    _fields_ = [(name, c_float_p) for name in
                ("q", "k", "v", "g", "beta", "x", "conv_weight", "gdn_state", "conv_state")]


class RecurrentStates(ctypes.Structure):
    _fields_ = [("gdn", ctypes.POINTER(c_float_p)), ("conv", ctypes.POINTER(c_float_p))]


class ConvTreeArgs(ctypes.Structure):
    _fields_ = [
        ("schedule", c_int32_p),
        ("layer", ctypes.c_int32),
        ("x", c_float_p),
        ("weight", c_float_p),
        ("conv_state", c_float_p),
        ("y", c_float_p),
    ]


class GdnTreeArgs(ctypes.Structure):
    _fields_ = [
        ("schedule", c_int32_p),
        ("layer", ctypes.c_int32),
        ("q", c_float_p),
        ("k", c_float_p),
        ("v", c_float_p),
        ("g", c_float_p),
        ("beta", c_float_p),
        ("state", c_float_p),
        ("out", c_float_p),
    ]


# --- DFlash block-diffusion draft (specla.h, "DFlash block-diffusion draft") ---


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


# specla_draft_layer_weights, in struct order (tensor names: pyspecla.arch.dflash.LAYER_TENSORS)
DRAFT_LAYER_FIELDS = (
    "attn_norm",
    "ffn_norm",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "attn_q_norm",
    "attn_k_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
)


class DraftLayerWeights(ctypes.Structure):
    _fields_ = [(field, Tensor) for field in DRAFT_LAYER_FIELDS]


class DraftWeights(ctypes.Structure):
    _fields_ = [
        ("fc", Tensor),
        ("hidden_norm", Tensor),
        ("output_norm", Tensor),
        ("aux_hidden_norm", ctypes.POINTER(Tensor)),
        ("layers", ctypes.POINTER(DraftLayerWeights)),
    ]


def _library_path() -> Path:
    env = os.environ.get("SPECLA_LIBRARY")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent
    names = ("libspecla.so", "libspecla.dylib", "specla.dll")
    for name in names:
        if (here / name).exists():
            return here / name
    # Running from a source checkout (e.g. `python -m pytest` in the repo root puts the source
    # tree first on sys.path): use the library of the installed package; the ABI version check
    # below refuses a mismatched one.
    for entry in sys.path:
        for name in names:
            candidate = Path(entry or ".") / "pyspecla" / name
            if candidate.exists():
                return candidate.resolve()
    raise NativeError(
        -1,
        f"libspecla not found in {here} (install the package with `pip install .`, "
        "or point SPECLA_LIBRARY at a development build)",
    )


_i32, _i64, _p, _f32 = ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
_SIGNATURES = {
    # name: (restype, argtypes)
    "specla_abi_version": (ctypes.c_int, []),
    "specla_last_error": (ctypes.c_char_p, []),
    "specla_cpu_best_kernels": (ctypes.c_int, []),
    "specla_cuda_device_count": (ctypes.c_int, []),
    "specla_type_block_elements": (ctypes.c_int, [_i32]),
    "specla_type_block_bytes": (ctypes.c_int, [_i32]),
    "specla_model_create": (ctypes.c_int, [ctypes.POINTER(HParams), ctypes.POINTER(Weights), ctypes.POINTER(_p)]),
    "specla_model_load_gguf": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(_p)]),
    "specla_model_hparams": (ctypes.c_int, [_p, ctypes.POINTER(HParams)]),
    "specla_model_free": (None, [_p]),
    "specla_context_create": (ctypes.c_int, [_p, ctypes.POINTER(ContextParams), ctypes.POINTER(_p)]),
    "specla_context_free": (None, [_p]),
    "specla_context_reset": (ctypes.c_int, [_p]),
    "specla_context_n_past": (_i32, [_p]),
    "specla_context_truncate": (ctypes.c_int, [_p, _i32]),
    "specla_context_set_logit_head": (ctypes.c_int, [_p, ctypes.POINTER(Tensor)]),
    "specla_context_set_logit_rows": (ctypes.c_int, [_p, c_int32_p, ctypes.c_int32]),
    "specla_context_backend": (ctypes.c_int32, [_p]),
    "specla_context_sync": (ctypes.c_int, [_p]),
    "specla_context_launch_counters": (ctypes.c_int, [_p, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64)]),
    "specla_context_step_counters": (ctypes.c_int, [_p, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64),
                                                    ctypes.POINTER(ctypes.c_int64)]),
    "specla_context_save_state": (ctypes.c_int, [_p]),
    "specla_forward": (ctypes.c_int, [_p, ctypes.POINTER(Batch)]),
    "specla_verify_tree": (ctypes.c_int, [_p, ctypes.POINTER(TreeBatch)]),
    "specla_accept_path": (ctypes.c_int, [_p, c_int32_p, _i32]),
    "specla_context_finish_speculative_state": (ctypes.c_int, [_p]),
    "specla_context_pending": (_i32, [_p]),
    "specla_context_tree_stats": (ctypes.c_int, [_p, ctypes.POINTER(TreeStats)]),
    "specla_context_read_features": (ctypes.c_int, [_p, _i32, _i32, c_float_p]),
    "specla_op_dequantize": (ctypes.c_int, [ctypes.POINTER(OpOptions), _i32, _p, _i64, c_float_p]),
    "specla_op_matmul": (ctypes.c_int, [ctypes.POINTER(OpOptions), ctypes.POINTER(Tensor), c_float_p, _i32, c_float_p]),
    "specla_op_quantize_activations": (ctypes.c_int, [ctypes.POINTER(OpOptions), _i32, c_float_p, _i32, _i32, _p,
                                                      c_float_p]),
    "specla_op_rms_norm": (ctypes.c_int, [ctypes.POINTER(OpOptions), c_float_p, c_float_p, _i32, _i32, _f32, c_float_p]),
    "specla_op_l2_norm": (ctypes.c_int, [ctypes.POINTER(OpOptions), c_float_p, _i32, _i32, _f32, c_float_p]),
    "specla_op_causal_conv": (
        ctypes.c_int,
        [ctypes.POINTER(OpOptions), c_float_p, c_float_p, _i32, _i32, _i32, c_float_p, c_float_p],
    ),
    "specla_op_gated_delta_rule": (
        ctypes.c_int,
        [ctypes.POINTER(OpOptions), c_float_p, c_float_p, c_float_p, c_float_p, c_float_p,
         _i32, _i32, _i32, _i32, c_float_p, c_float_p],
    ),
    "specla_op_rope_neox": (
        ctypes.c_int,
        [ctypes.POINTER(OpOptions), c_float_p, c_int32_p, _i32, _i32, _i32, _i32, _f32],
    ),
    "specla_op_attention": (
        ctypes.c_int,
        [ctypes.POINTER(OpOptions), c_float_p, c_float_p, c_float_p, c_int32_p, _i32, _i32, _i32, _i32, _i32, c_float_p],
    ),
    "specla_op_gather_rows": (
        ctypes.c_int,
        [ctypes.POINTER(OpOptions), c_float_p, _i64, _i64, c_float_p, _i64, _i64, _i32, _p, _p, c_int32_p, _i32,
         c_int32_p, _i32],
    ),
    "specla_ddtree_build": (
        ctypes.c_int,
        [_i32, _p, _p, _i32, _i32, _i32, ctypes.c_double, _i32, _p, _p, _p, _p, _p, _i32, _p],
    ),
    "specla_hld_size": (_i32, [_i32]),
    "specla_hld_build": (ctypes.c_int, [c_int32_p, _i32, _i32, c_int32_p, _i32]),
    "specla_factor_banks_create": (ctypes.c_int, [ctypes.POINTER(RecurrentShape), ctypes.POINTER(_p)]),
    "specla_factor_banks_free": (None, [_p]),
    "specla_factor_banks_pending": (_i32, [_p]),
    "specla_factor_banks_bytes": (_i64, [_p]),
    "specla_factor_banks_stats": (ctypes.c_int, [_p, ctypes.POINTER(TreeStats)]),
    "specla_factor_banks_read": (ctypes.c_int, [_p, _i32, _i32, _i32, _i32, c_float_p]),
    "specla_op_conv_tree": (ctypes.c_int, [ctypes.POINTER(OpOptions), _p, ctypes.POINTER(ConvTreeArgs)]),
    "specla_op_gdn_tree_verify": (ctypes.c_int, [ctypes.POINTER(OpOptions), _p, ctypes.POINTER(GdnTreeArgs)]),
    "specla_factor_banks_accept": (
        ctypes.c_int,
        [ctypes.POINTER(OpOptions), _p, c_int32_p, c_int32_p, _i32, ctypes.POINTER(RecurrentStates)],
    ),
    "specla_finish_speculative_state": (
        ctypes.c_int,
        [ctypes.POINTER(OpOptions), _p, ctypes.POINTER(RecurrentStates)],
    ),
    "specla_recurrent_workload_create": (
        ctypes.c_int,
        [ctypes.POINTER(OpOptions), ctypes.POINTER(RecurrentShape), ctypes.POINTER(RecurrentInputs), ctypes.POINTER(_p)],
    ),
    "specla_recurrent_workload_free": (None, [_p]),
    "specla_recurrent_workload_set_tree": (ctypes.c_int, [_p, c_int32_p, _i32]),
    "specla_recurrent_workload_verify": (ctypes.c_int, [_p]),
    "specla_recurrent_workload_accept": (ctypes.c_int, [_p, c_int32_p, _i32]),
    "specla_recurrent_workload_finish": (ctypes.c_int, [_p]),
    "specla_recurrent_workload_sync": (ctypes.c_int, [_p]),
    "specla_recurrent_workload_read": (ctypes.c_int, [_p, _i32, _i32, c_float_p]),
    "specla_draft_model_create": (
        ctypes.c_int,
        [ctypes.POINTER(DraftHParams), ctypes.POINTER(DraftWeights), _p, ctypes.POINTER(_p)],
    ),
    "specla_draft_model_free": (None, [_p]),
    "specla_draft_context_create": (ctypes.c_int, [_p, ctypes.POINTER(ContextParams), ctypes.POINTER(_p)]),
    "specla_draft_context_free": (None, [_p]),
    "specla_draft_context_reset": (ctypes.c_int, [_p]),
    "specla_draft_context_backend": (ctypes.c_int32, [_p]),
    "specla_draft_context_launch_counters": (ctypes.c_int, [_p, ctypes.POINTER(ctypes.c_int64),
                                                            ctypes.POINTER(ctypes.c_int64)]),
    "specla_draft_context_set_logit_head": (ctypes.c_int, [_p, ctypes.POINTER(Tensor)]),
    "specla_draft_context_set_logit_rows": (ctypes.c_int, [_p, c_int32_p, ctypes.c_int32]),
    "specla_draft_propose": (ctypes.c_int, [_p, _p, _i32, _i32, _i32, c_int32_p, c_float_p]),
}


def _load():
    path = _library_path()
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise NativeError(-1, f"{path}: cannot load libspecla ({exc})") from None
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    if lib.specla_abi_version() != ABI_VERSION:
        raise NativeError(-1, f"{path}: ABI version {lib.specla_abi_version()}, this package expects {ABI_VERSION}")
    return lib


lib = _load()


def last_error() -> str:
    msg = lib.specla_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def check(status: int) -> None:
    """Raise NativeError with the library's message when a call failed."""
    if status != OK:
        raise NativeError(status, last_error() or f"libspecla call failed with status {status}")


def op_options(n_threads: int = 0, cpu_kernels: str | int = "auto", device: str = "cpu") -> OpOptions:
    kernels = CPU_KERNELS[cpu_kernels] if isinstance(cpu_kernels, str) else int(cpu_kernels)
    backend, index = parse_device(device)
    return OpOptions(n_threads, kernels, backend, index)


def float_ptr(a: np.ndarray):
    """Pointer to a C-contiguous float32 array (asserted: a silent copy would lose outputs)."""
    if a.dtype != np.float32 or not a.flags.c_contiguous:
        raise TypeError("expected a C-contiguous float32 array")
    return a.ctypes.data_as(c_float_p)


def int32_ptr(a: np.ndarray):
    if a.dtype != np.int32 or not a.flags.c_contiguous:
        raise TypeError("expected a C-contiguous int32 array")
    return a.ctypes.data_as(c_int32_p)


def tensor_struct(data: np.ndarray, ggml_type: int, ne0: int, ne1: int) -> Tensor:
    """A Tensor view of raw bytes (the caller keeps `data` alive)."""
    return Tensor(data.ctypes.data, int(ggml_type), int(ne0), int(ne1), 0, int(data.nbytes))


def cpu_best_kernels() -> int:
    return lib.specla_cpu_best_kernels()


def cuda_device_count() -> int:
    return lib.specla_cuda_device_count()
