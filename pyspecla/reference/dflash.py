"""The DFlash draft forward in numpy (docs/ddtree-dflash.md §1): the oracle of
specla_draft_propose. Slow and plain; matmuls in ``dtype`` (float64 by default).

Weights are dequantized float32 arrays in the numpy layout (GGUF ne reversed: a weight {n_in, n_out}
is an (n_out, n_in) array, y = x @ W.T), under the canonical names DraftFile.tensor() takes.

    ref = DFlashReference.from_gguf("draft.gguf", "target.gguf")
    logits = ref.block_logits(features, root_token)      # (block_size, V)
    tokens, logprobs = topk(logits, n_depths, k)          # rows 1..n_depths

`features` holds the target's captured rows of every committed position, (n_past, n_target_layers,
E_t): row i is position i, slice l the residual stream after target layer target_layer_ids[l].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import ops

__all__ = ["DFlashReference", "DraftRefHParams", "topk", "log_softmax"]


@dataclass
class DraftRefHParams:
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rms_eps: float
    rope_freq_base: float
    block_size: int
    mask_token_id: int
    n_target_layers: int
    sliding_window: int
    layer_is_swa: list[bool]
    context_kv_layer_norm: bool


def _dequantized(view) -> np.ndarray:
    ne = [int(n) for n in view.ne]
    rows = int(np.prod(ne[1:])) if len(ne) > 1 else 1
    return ops.dequantize(view.data, view.ggml_type, ne[0], rows).reshape(tuple(reversed(ne)))


class DFlashReference:
    def __init__(self, hp: DraftRefHParams, weights: dict[str, np.ndarray], token_embd: np.ndarray,
                 lm_head: np.ndarray, *, dtype=np.float64, weight_types: dict[str, int] | None = None):
        self.hp = hp
        # GGUF type per weight ("lm_head" for the target's LM head): float or 8-bit activations
        self.weight_types = dict(weight_types or {})
        self.w = {k: np.asarray(v, np.float32) for k, v in weights.items()}
        self.token_embd = np.asarray(token_embd, np.float32)  # (V, E) the target's
        self.lm_head = np.asarray(lm_head, np.float32)  # (V, E) the target's output (or token_embd, tied)
        self.dtype = dtype

    @classmethod
    def from_gguf(cls, draft_path, target_path, *, dtype=np.float64) -> "DFlashReference":
        from ..loader.dflash import DraftFile
        from ..loader.target import ModelFile

        draft = DraftFile.open(draft_path)
        target = ModelFile.open(target_path)
        dh = draft.hparams
        hp = DraftRefHParams(
            n_layer=dh.n_layer, n_embd=dh.n_embd, n_ff=dh.n_ff, n_head=dh.n_head, n_head_kv=dh.n_head_kv,
            head_dim=dh.head_dim, rms_eps=dh.rms_eps, rope_freq_base=dh.rope_freq_base,
            block_size=dh.block_size, mask_token_id=dh.mask_token_id, n_target_layers=dh.n_target_layers,
            sliding_window=dh.sliding_window, layer_is_swa=list(dh.layer_is_swa),
            context_kv_layer_norm=dh.context_kv_layer_norm,
        )
        names = ["dflash.fc.weight", "dflash.hidden_norm.weight", "output_norm.weight"]
        if dh.context_kv_layer_norm:
            names += [f"dflash.aux_hidden_norm.{i}.weight" for i in range(dh.n_target_layers)]
        for il in range(dh.n_layer):
            names += [f"blk.{il}.{s}.weight" for s in (
                "attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm",
                "attn_k_norm", "ffn_gate", "ffn_up", "ffn_down")]
        weights = {name: _dequantized(draft.tensor(name)) for name in names}
        types = {name: int(draft.tensor(name).ggml_type) for name in names}
        token_embd = _dequantized(target.tensor("token_embd.weight"))
        output = target.optional_tensor("output.weight")
        lm_head = token_embd if output is None else _dequantized(output)
        types["lm_head"] = int((output if output is not None else target.tensor("token_embd.weight")).ggml_type)
        return cls(hp, weights, token_embd, lm_head, dtype=dtype, weight_types=types)

    # --- pieces ------------------------------------------------------------------------------

    def _linear(self, x, name: str) -> np.ndarray:
        seen = ops.activations_seen(np.asarray(x, np.float32), self.weight_types.get(name), dtype=self.dtype)
        return (seen @ self.w[name].astype(self.dtype).T).astype(np.float32)

    def _rms(self, x, name: str | None) -> np.ndarray:
        return ops.rms_norm(x, None if name is None else self.w[name], self.hp.rms_eps, dtype=self.dtype)

    def context_rows(self, features) -> np.ndarray:
        """(n_ctx, N, E_t) captured rows -> (n_ctx, E) = hidden_norm(fc · concat(slices)), each slice
        first RMS-normed with aux_hidden_norm.<i> when context_kv_layer_norm is set."""
        hp = self.hp
        f = np.asarray(features, np.float32)
        if f.ndim != 3 or f.shape[1] != hp.n_target_layers:
            raise ValueError(f"features must be (n_ctx, {hp.n_target_layers}, E_t), got {f.shape}")
        if hp.context_kv_layer_norm:
            f = np.stack([self._rms(f[:, i], f"dflash.aux_hidden_norm.{i}.weight") for i in range(f.shape[1])], axis=1)
        concat = f.reshape(f.shape[0], f.shape[1] * f.shape[2])
        return self._rms(self._linear(concat, "dflash.fc.weight"), "dflash.hidden_norm.weight")

    def _heads(self, x, n_heads: int) -> np.ndarray:
        return x.reshape(x.shape[0], n_heads, self.hp.head_dim)

    def _attention(self, q, k, v, visible) -> np.ndarray:
        """q (T, nh, D); k, v (n, nkv, D); visible (T, n) bool -> (T, nh, D). GQA: head h uses kv
        head h // (nh / nkv); scale 1/sqrt(D)."""
        dt = self.dtype
        nh, nkv, D = self.hp.n_head, self.hp.n_head_kv, self.hp.head_dim
        kv_head = np.arange(nh) // (nh // nkv)
        qd, kd, vd = (np.asarray(a, dt) for a in (q, k[:, kv_head], v[:, kv_head]))
        scores = np.einsum("thd,nhd->thn", qd, kd) / np.sqrt(dt(D))
        scores = np.where(visible[:, None, :], scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(axis=-1, keepdims=True)
        return np.einsum("thn,nhd->thd", p, vd).astype(np.float32)

    # --- the block ---------------------------------------------------------------------------

    def block_hidden(self, features, root_token: int) -> np.ndarray:
        """Final rows (block_size, E) = rms(h, output_norm) of the block [root, MASK x (B-1)] placed
        at positions n_past .. n_past + B - 1 (n_past = len(features))."""
        hp = self.hp
        B, D, nh, nkv = hp.block_size, hp.head_dim, hp.n_head, hp.n_head_kv
        n_ctx = int(np.asarray(features).shape[0])
        ctx = self.context_rows(features)  # (n_ctx, E)
        tokens = np.array([root_token] + [hp.mask_token_id] * (B - 1))
        h = self.token_embd[tokens].astype(np.float32)
        # RoPE with absolute positions: context row i at i, block row j at n_past + j. RoPE scores
        # depend on position differences only, so this equals positions relative to any window start.
        ctx_pos = np.arange(n_ctx)
        blk_pos = n_ctx + np.arange(B)
        for il in range(hp.n_layer):
            p = f"blk.{il}."
            hn = self._rms(h, p + "attn_norm.weight")
            q = self._rms(self._heads(self._linear(hn, p + "attn_q.weight"), nh), p + "attn_q_norm.weight")
            q = ops.rope_neox(q, blk_pos, D, hp.rope_freq_base, dtype=self.dtype)
            # KV injection: the same wk / wv over the context rows and the block rows
            src = np.concatenate([ctx, hn], axis=0)
            k = self._rms(self._heads(self._linear(src, p + "attn_k.weight"), nkv), p + "attn_k_norm.weight")
            k = ops.rope_neox(k, np.concatenate([ctx_pos, blk_pos]), D, hp.rope_freq_base, dtype=self.dtype)
            v = self._heads(self._linear(src, p + "attn_v.weight"), nkv)
            if hp.layer_is_swa[il]:
                # the last sliding_window context rows, causal inside the block
                first = max(0, n_ctx - hp.sliding_window)
                ctx_visible = np.broadcast_to(ctx_pos >= first, (B, n_ctx))
                blk_visible = np.tril(np.ones((B, B), bool))
            else:
                ctx_visible = np.ones((B, n_ctx), bool)
                blk_visible = np.ones((B, B), bool)
            visible = np.concatenate([ctx_visible, blk_visible], axis=1)
            attn = self._attention(q, k, v, visible).reshape(B, nh * D)
            h = (h + self._linear(attn, p + "attn_output.weight")).astype(np.float32)
            u = self._rms(h, p + "ffn_norm.weight")
            gate = self._linear(u, p + "ffn_gate.weight")
            up = self._linear(u, p + "ffn_up.weight")
            act = (ops.silu(gate, dtype=self.dtype).astype(self.dtype) * np.asarray(up, self.dtype)).astype(np.float32)
            h = (h + self._linear(act, p + "ffn_down.weight")).astype(np.float32)
        return self._rms(h, "output_norm.weight")

    def block_logits(self, features, root_token: int) -> np.ndarray:
        """(block_size, V) logits of the block. The rows go through the draft's own output_norm and
        then the target's LM head matrix only: the target's output_norm is NOT applied on top (the
        draft's final norm takes its place, as upstream llama.cpp's DFlash graph does)."""
        rows = self.block_hidden(features, root_token)
        seen = ops.activations_seen(np.asarray(rows, np.float32), self.weight_types.get("lm_head"), dtype=self.dtype)
        return (seen @ self.lm_head.astype(self.dtype).T).astype(np.float32)


def log_softmax(logits) -> np.ndarray:
    x = np.asarray(logits, np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


def topk(logits, n_depths: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows 1..n_depths of block logits -> (tokens int32 (n_depths, k), log-probs float32
    (n_depths, k)): log-softmax over the full vocabulary, best first, ties to the lower token id."""
    logits = np.asarray(logits)
    if not 1 <= n_depths < logits.shape[0] or not 1 <= k <= logits.shape[1]:
        raise ValueError(f"n_depths {n_depths} / k {k} out of range for logits {logits.shape}")
    lp = log_softmax(logits[1 : n_depths + 1])
    # lexsort: last key primary -> descending log-prob, then ascending id
    tokens = np.empty((n_depths, k), np.int32)
    values = np.empty((n_depths, k), np.float32)
    ids = np.arange(lp.shape[1])
    for r in range(n_depths):
        order = np.lexsort((ids, -lp[r]))[:k]
        tokens[r] = order
        values[r] = lp[r, order]
    return tokens, values
