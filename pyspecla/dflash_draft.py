"""The Python face of a DFlash draft: `DFlashDraft.load(path, target_model)` → `new_context()` →
`propose(target_ctx, root_token, n_depths, top_k)`.

The draft borrows the target model's embedding and LM head and reads the feature rows a target
context captures, so the target context must be created with
`target_model.new_context(..., capture_layers=draft.target_layer_ids)`. Weights stay in the GGUF's
memory map; the native library reads them in place on the CPU and uploads them once per device on a
GPU. A draft context runs where the target model's contexts run (the model's `device`): on a GPU it
reads the target's feature rows, embedding and LM head on the device, and a propose call reads back
only its top-k answer."""

from __future__ import annotations

import ctypes

import numpy as np

from . import _native
from .arch.dflash import LAYER_TENSORS
from .loader.dflash import DraftFile, check_against_target
from .errors import UsageError
from .logit_rows import apply_logit_rows


class DraftContext:
    """A draft's per-sequence state: the K/V of every target position it has ingested (grown
    incrementally; rebuilt from position 0 when the target context was reset, rolled back or
    swapped for another). Create with `DFlashDraft.new_context()`."""

    def __init__(self, draft: "DFlashDraft", n_ctx: int, max_batch: int, recorded_steps: bool = True):
        if n_ctx <= 0:
            raise UsageError(f"n_ctx must be positive, got {n_ctx}")
        self.draft = draft
        self.n_ctx = n_ctx
        backend, index = _native.parse_device(getattr(draft.target_model, "device", "auto"))
        params = _native.ContextParams(n_ctx=n_ctx, max_batch=max_batch, n_threads=draft.n_threads,
                                       cpu_kernels=_native.CPU_KERNELS[draft.cpu_kernels], backend=backend,
                                       device=index, no_recorded_steps=0 if recorded_steps else 1)
        handle = ctypes.c_void_p()
        _native.check(_native.lib.specla_draft_context_create(draft._handle, ctypes.byref(params),
                                                                    ctypes.byref(handle)))
        self._handle = handle
        self.logit_tokens: np.ndarray | None = None  # token ids of a chosen head's rows (None: all)

    def reset(self) -> None:
        _native.check(_native.lib.specla_draft_context_reset(self._handle))

    @property
    def device(self) -> str:
        """The backend this draft context resolved to: 'cpu' or 'cuda' (the target model's)."""
        return _native.BACKEND_NAMES[_native.lib.specla_draft_context_backend(self._handle)]

    def launch_counters(self) -> tuple[int, int]:
        """(kernel launches, host waits) of this draft context's backend since the last call, which
        resets them; (-1, -1) on the CPU. On a GPU a propose call waits once (its top-k read-back)."""
        launches, waits = ctypes.c_int64(), ctypes.c_int64()
        _native.check(_native.lib.specla_draft_context_launch_counters(self._handle, ctypes.byref(launches),
                                                                       ctypes.byref(waits)))
        return launches.value, waits.value

    def set_logit_rows(self, token_ids) -> None:
        """Score the block over the target LM head's rows of token_ids only (a reduced draft
        vocabulary, speculative/drafters/vocabulary.py); propose then returns token ids among those,
        log-softmax over them. None: the whole head again."""
        self.logit_tokens = apply_logit_rows(_native.lib.specla_draft_context_set_logit_rows, self._handle,
                                             self.draft.target_model.hparams.n_vocab, token_ids)

    def propose(self, target_ctx, root_token: int, n_depths: int, top_k: int) -> tuple[np.ndarray, np.ndarray]:
        """One draft block after target_ctx's committed tokens with `root_token` (the last committed
        token, not yet in target_ctx) at position target_ctx.n_past. Returns tokens int32
        (n_depths, top_k) and log-probs float32 (n_depths, top_k) of depths 1..n_depths, best first
        (log-softmax over the full vocabulary, or over a chosen head's rows; ties to the lower id,
        or the earlier row). target_ctx is not changed."""
        handle = getattr(target_ctx, "_handle", None)
        if not handle:
            raise UsageError("propose needs an open pyspecla.model.Context of the target model")
        captured = [int(i) for i in getattr(target_ctx, "capture_layers", [])]
        if captured and captured != self.draft.target_layer_ids:
            # the native side can only compare the counts; same count, other layers = wrong drafts
            raise UsageError(f"the target context captures layers {captured}, the draft reads "
                             f"{self.draft.target_layer_ids} (create it with capture_layers=draft.target_layer_ids)")
        n_depths, top_k = int(n_depths), int(top_k)
        # the native call validates the ranges (n_depths in [1, block_size - 1], top_k in [1, V])
        tokens = np.empty((max(n_depths, 1), max(top_k, 1)), dtype=np.int32)
        logprobs = np.empty((max(n_depths, 1), max(top_k, 1)), dtype=np.float32)
        _native.check(_native.lib.specla_draft_propose(
            self._handle, handle, int(root_token), n_depths, top_k, _native.int32_ptr(tokens),
            _native.float_ptr(logprobs)))
        if self.logit_tokens is not None:  # head rows -> token ids (-1: no finite logit, stays)
            tokens = np.where(tokens >= 0, self.logit_tokens[np.maximum(tokens, 0)], tokens).astype(np.int32)
        return tokens, logprobs

    # the free function is bound at definition time: __del__ may run at interpreter shutdown,
    # after the module globals are gone
    def close(self, _free=_native.lib.specla_draft_context_free) -> None:
        if getattr(self, "_handle", None):
            _free(self._handle)
            self._handle = None

    def __del__(self):
        self.close()


class DFlashDraft:
    """A DFlash draft bound to the qwen35 target model it drafts for; its contexts run on the target
    model's device."""

    def __init__(self, file: DraftFile, target_model, n_threads: int = 0, cpu_kernels: str | None = None):
        check_against_target(file, target_model)
        self.file = file
        self.hparams = file.hparams
        self.target_model = target_model  # keeps the target's weights (embedding, LM head) alive
        self.n_threads = n_threads
        self.cpu_kernels = cpu_kernels if cpu_kernels is not None else target_model.cpu_kernels
        if self.cpu_kernels not in _native.CPU_KERNELS:
            raise UsageError(f"cpu_kernels must be one of {sorted(_native.CPU_KERNELS)}, got {self.cpu_kernels!r}")
        hp = file.hparams
        self._swa = (ctypes.c_uint8 * hp.n_layer)(*[1 if s else 0 for s in hp.layer_is_swa])
        self._hparams_struct = _native.DraftHParams(
            hp.n_layer, hp.n_embd, hp.n_ff, hp.n_head, hp.n_head_kv, hp.head_dim, hp.rms_eps, hp.rope_freq_base,
            hp.block_size, hp.mask_token_id, hp.n_target_layers, hp.sliding_window, self._swa,
            1 if hp.context_kv_layer_norm else 0, 0,
        )
        layers = (_native.DraftLayerWeights * hp.n_layer)()
        for il in range(hp.n_layer):
            for field in _native.DRAFT_LAYER_FIELDS:
                setattr(layers[il], field, _tensor(file.tensor(f"blk.{il}.{LAYER_TENSORS[field]}")))
        self._layers = layers
        self._aux = None
        if hp.context_kv_layer_norm:
            self._aux = (_native.Tensor * hp.n_target_layers)(
                *[_tensor(file.tensor(f"dflash.aux_hidden_norm.{i}.weight")) for i in range(hp.n_target_layers)])
        self._weights = _native.DraftWeights(
            _tensor(file.tensor("dflash.fc.weight")),
            _tensor(file.tensor("dflash.hidden_norm.weight")),
            _tensor(file.tensor("output_norm.weight")),
            self._aux,
            layers,
        )
        handle = ctypes.c_void_p()
        _native.check(_native.lib.specla_draft_model_create(
            ctypes.byref(self._hparams_struct), ctypes.byref(self._weights), target_model._handle,
            ctypes.byref(handle)))
        self._handle = handle

    @classmethod
    def load(cls, path, target_model, n_threads: int = 0, cpu_kernels: str | None = None) -> "DFlashDraft":
        """Open and validate a DFlash draft GGUF for `target_model` (a pyspecla.Model). Raises
        GGUFError naming both files when they do not belong together."""
        return cls(DraftFile.open(path), target_model, n_threads=n_threads, cpu_kernels=cpu_kernels)

    @property
    def target_layer_ids(self) -> list[int]:
        """The target layers whose output rows the draft reads: pass as the target context's
        capture_layers."""
        return list(self.hparams.target_layer_ids)

    def new_context(self, n_ctx: int = 4096, max_batch: int = 64, recorded_steps: bool = True) -> DraftContext:
        """n_ctx: the most target positions the draft follows (as the target context's n_ctx). On a
        GPU a proposal (all but the ingestion of new feature rows) is recorded once per depths, top-k
        and LM head and replayed (recorded_steps=False runs every op eagerly; the same results)."""
        return DraftContext(self, n_ctx, max_batch, recorded_steps)

    def close(self, _free=_native.lib.specla_draft_model_free) -> None:
        if getattr(self, "_handle", None):
            _free(self._handle)
            self._handle = None

    def __del__(self):
        self.close()


def _tensor(view) -> _native.Tensor:
    ne0 = int(view.ne[0])
    ne1 = int(np.prod(view.ne[1:])) if len(view.ne) > 1 else 1
    return _native.tensor_struct(view.data, view.ggml_type, ne0, ne1)
