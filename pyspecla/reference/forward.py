"""The whole qwen35 trunk forward in numpy, written from the qwen35 contract (docs/qwen35.md),
and the qwen2 (Qwen2 / Qwen2.5) forward: attention-only layers with q/k/v biases, no q/k norms, no
output gate, NEOX RoPE over the whole head, pre-FFN norm named ffn_norm; qwen3 (Qwen3) is that
layer with per-head q/k RMSNorm before RoPE instead of the biases.

This is the oracle of the whole model: slow and plain. Weights are held dequantized as float32
numpy arrays under their GGUF names, in the numpy layout gguf.GGUFReader uses (GGUF ne reversed:
a weight {n_in, n_out} is an (n_out, n_in) array, so y = x @ W.T). Matmuls run in ``dtype``
(float64 by default); the single ops come from ops.py.

    model = ReferenceModel.from_gguf("tiny.gguf")
    state = model.new_state()
    logits = model.forward(state, tokens)          # (T, V), appends the batch to the state
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np

from ..arch import TARGET_ARCHS, qwen2, qwen35
from . import ops

__all__ = ["HParams", "ReferenceModel", "ReferenceState"]


@dataclass
class HParams:
    """Trunk hyper-parameters; field names follow specla_hparams in specla.h."""

    n_layer: int  # trunk depth = block_count - nextn_predict_layers
    n_embd: int  # E
    n_ff: int  # F
    n_vocab: int  # V
    n_head: int  # nh
    n_head_kv: int  # nkv
    head_dim: int  # D
    rope_dims: int
    rope_freq_base: float
    rms_eps: float
    ssm_conv_kernel: int  # K
    ssm_state_size: int  # S
    ssm_group_count: int  # Hk
    ssm_time_step_rank: int  # Hv
    n_ctx_train: int = 0
    layer_is_recurrent: list[bool] = field(default_factory=list)
    arch: str = qwen35.ARCH  # "qwen35", "qwen2" or "qwen3" (then the ssm fields are 0, every layer is attention)

    @property
    def conv_channels(self) -> int:
        return 2 * self.ssm_group_count * self.ssm_state_size + self.ssm_time_step_rank * self.ssm_state_size

    @staticmethod
    def recurrent_layers_from_interval(n_layer: int, interval: int = 4) -> list[bool]:
        """Layer i is recurrent iff (i + 1) % interval != 0."""
        return [(i + 1) % interval != 0 for i in range(n_layer)]


def _field_value(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


@dataclass
class ReferenceState:
    """All mutable state of one sequence, per trunk layer (None where a layer type has none).

    conv[i] (K-1, C) last K-1 raw conv inputs; gdn[i] (Hv, S, S) [head][value j][key i];
    k_cache[i], v_cache[i] (n_past, nkv, D)."""

    conv: list
    gdn: list
    k_cache: list
    v_cache: list
    n_past: int = 0

    def copy(self) -> "ReferenceState":
        return copy.deepcopy(self)


class ReferenceModel:
    def __init__(self, hparams: HParams, weights: dict[str, np.ndarray], *, dtype=np.float64,
                 weight_types: dict[str, int] | None = None):
        self.hp = hparams
        self.dtype = dtype
        self.w = {name: np.asarray(a, dtype=np.float32) for name, a in weights.items()}
        # GGUF type per weight: decides whether a matmul sees float or 8-bit activations (ops.matmul)
        self.weight_types = dict(weight_types or {})
        hp = hparams
        if len(hp.layer_is_recurrent) != hp.n_layer:
            raise ValueError(f"layer_is_recurrent has {len(hp.layer_is_recurrent)} entries, n_layer {hp.n_layer}")
        if hp.arch not in TARGET_ARCHS:
            raise ValueError(f"unknown arch {hp.arch!r}")
        if hp.arch != qwen35.ARCH and any(hp.layer_is_recurrent):
            raise ValueError(f"{hp.arch} has no recurrent layers")
        if hp.arch == qwen35.ARCH and hp.ssm_time_step_rank % hp.ssm_group_count:
            raise ValueError("Hv must be a multiple of Hk and nh a multiple of nkv")
        if hp.n_head % hp.n_head_kv:
            raise ValueError("Hv must be a multiple of Hk and nh a multiple of nkv")
        self._check_shapes()

    # --- loading ---------------------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, path, *, dtype=np.float64) -> "ReferenceModel":
        """Reads a qwen35, qwen2 or qwen3 GGUF with gguf.GGUFReader and dequantizes every trunk tensor."""
        import gguf

        reader = gguf.GGUFReader(str(path))
        arch = _field_value(reader, "general.architecture")
        if arch not in TARGET_ARCHS:
            raise ValueError(f"{path}: general.architecture is {arch!r}, expected 'qwen35', 'qwen2' or 'qwen3'")

        def key(name, default=None):
            return _field_value(reader, f"{arch}.{name}", default)

        block_count = int(key("block_count"))
        n_layer = block_count - int(key("nextn_predict_layers", 0))
        n_head = int(key("attention.head_count"))
        n_embd = int(key("embedding_length"))
        head_dim = int(key("attention.key_length", n_embd // n_head))
        if arch != qwen35.ARCH:
            layer_is_recurrent = [False] * n_layer
        else:
            recurrent = key("attention.recurrent_layers")
            if recurrent is not None:
                layer_is_recurrent = [bool(r) for r in recurrent][:n_layer]
            else:
                interval = int(key("full_attention_interval", 4))
                layer_is_recurrent = HParams.recurrent_layers_from_interval(n_layer, interval)

        weights, types = {}, {}
        for t in reader.tensors:
            if t.name.startswith("blk."):
                layer = int(t.name.split(".")[1])
                if layer >= n_layer:
                    continue  # MTP (NextN) blocks are not part of the trunk
            ne = [int(n) for n in t.shape]
            ne0 = ne[0]
            rows = int(np.prod(ne[1:])) if len(ne) > 1 else 1
            values = ops.dequantize(t.data, int(t.tensor_type), ne0, rows)
            weights[t.name] = values.reshape(tuple(reversed(ne)))
            types[t.name] = int(t.tensor_type)

        hp = HParams(
            n_layer=n_layer,
            n_embd=n_embd,
            n_ff=int(key("feed_forward_length")),
            n_vocab=int(weights["token_embd.weight"].shape[0]),
            n_head=n_head,
            n_head_kv=int(key("attention.head_count_kv", n_head)),
            head_dim=head_dim,
            rope_dims=int(key("rope.dimension_count", head_dim)),
            rope_freq_base=float(key("rope.freq_base", 10000.0)),
            rms_eps=float(key("attention.layer_norm_rms_epsilon")),
            ssm_conv_kernel=int(key("ssm.conv_kernel", 0)),
            ssm_state_size=int(key("ssm.state_size", 0)),
            ssm_group_count=int(key("ssm.group_count", 0)),
            ssm_time_step_rank=int(key("ssm.time_step_rank", 0)),
            n_ctx_train=int(key("context_length", 0)),
            layer_is_recurrent=layer_is_recurrent,
            arch=arch,
        )
        return cls(hp, weights, dtype=dtype, weight_types=types)

    def _check_shapes(self):
        """Every trunk tensor the architecture's table (pyspecla.arch) expects, in the numpy layout."""
        hp = self.hp
        expected = (qwen35 if hp.arch == qwen35.ARCH else qwen2).expected_tensors(hp)
        for name, spec in expected.items():
            if name not in self.w:
                if spec.required:
                    raise ValueError(f"missing tensor {name}")
                continue
            shape = tuple(reversed(spec.ne))
            if self.w[name].shape != shape:
                raise ValueError(f"tensor {name} has shape {self.w[name].shape}, expected {shape}")

    # --- state -----------------------------------------------------------------------------------

    def new_state(self) -> ReferenceState:
        hp = self.hp
        K, C = hp.ssm_conv_kernel, hp.conv_channels
        Hv, S = hp.ssm_time_step_rank, hp.ssm_state_size
        kv_shape = (0, hp.n_head_kv, hp.head_dim)
        conv, gdn, kc, vc = [], [], [], []
        for rec in hp.layer_is_recurrent:
            conv.append(np.zeros((K - 1, C), np.float32) if rec else None)
            gdn.append(np.zeros((Hv, S, S), np.float32) if rec else None)
            kc.append(None if rec else np.zeros(kv_shape, np.float32))
            vc.append(None if rec else np.zeros(kv_shape, np.float32))
        return ReferenceState(conv=conv, gdn=gdn, k_cache=kc, v_cache=vc, n_past=0)

    # --- forward ---------------------------------------------------------------------------------

    def _linear(self, x, name: str) -> np.ndarray:
        w = self.w[name].astype(self.dtype, copy=False)
        seen = ops.activations_seen(np.asarray(x, np.float32), self.weight_types.get(name), dtype=self.dtype)
        return (seen @ w.T).astype(np.float32)

    def _rms(self, x, name: str | None) -> np.ndarray:
        return ops.rms_norm(x, None if name is None else self.w[name], self.hp.rms_eps, dtype=self.dtype)

    def forward(self, state: ReferenceState, tokens, positions=None) -> np.ndarray:
        """Runs the batch `tokens` (T,) through the trunk, appends it to `state`, returns the
        logits (T, V) of every token. positions must continue the sequence: n_past + arange(T)."""
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        T = tokens.shape[0]
        expected = state.n_past + np.arange(T)
        positions = expected if positions is None else np.asarray(positions, dtype=np.int64)
        if not np.array_equal(positions, expected):
            raise ValueError(f"positions must be n_past + arange(T) = {expected.tolist()}")
        if T and (tokens.min() < 0 or tokens.max() >= self.hp.n_vocab):
            raise ValueError("token id out of range")

        h = self.w["token_embd.weight"][tokens].astype(np.float32)  # (T, E)
        attention_only = self.hp.arch != qwen35.ARCH  # qwen2, qwen3
        ffn_norm = "ffn_norm.weight" if attention_only else "post_attention_norm.weight"
        for i, rec in enumerate(self.hp.layer_is_recurrent):
            p = f"blk.{i}."
            x = self._rms(h, p + "attn_norm.weight")
            if attention_only:
                h = h + self._attention_plain(state, i, x, positions)
            elif rec:
                h = h + self._gated_delta_net(state, i, x)
            else:
                h = h + self._attention(state, i, x, positions)
            u = self._rms(h, p + ffn_norm)
            gate = ops.silu(self._linear(u, p + "ffn_gate.weight"), dtype=self.dtype)
            up = self._linear(u, p + "ffn_up.weight")
            h = h + self._linear(gate * up, p + "ffn_down.weight")
        state.n_past += T
        out_name = "output.weight" if "output.weight" in self.w else "token_embd.weight"  # tied head
        return self._linear(self._rms(h, "output_norm.weight"), out_name)

    def _gated_delta_net(self, state: ReferenceState, i: int, x) -> np.ndarray:
        hp = self.hp
        p = f"blk.{i}."
        T = x.shape[0]
        S, Hk, Hv = hp.ssm_state_size, hp.ssm_group_count, hp.ssm_time_step_rank
        qkv = self._linear(x, p + "attn_qkv.weight")  # (T, C)
        z = self._linear(x, p + "attn_gate.weight").reshape(T, Hv, S)
        b = self._linear(x, p + "ssm_beta.weight")  # (T, Hv)
        a = self._linear(x, p + "ssm_alpha.weight")

        beta = ops.sigmoid(b, dtype=self.dtype)
        # ssm_a holds -exp(A_log), so g is a log-decay <= 0
        g = ops.softplus(a + self.w[p + "ssm_dt.bias"], dtype=self.dtype) * self.w[p + "ssm_a"]

        conv_out, state.conv[i] = ops.causal_conv(qkv, self.w[p + "ssm_conv1d.weight"], state.conv[i], dtype=self.dtype)
        q = conv_out[:, : Hk * S].reshape(T, Hk, S)
        k = conv_out[:, Hk * S : 2 * Hk * S].reshape(T, Hk, S)
        v = conv_out[:, 2 * Hk * S :].reshape(T, Hv, S)
        q = ops.l2_norm(q, hp.rms_eps, dtype=self.dtype)
        k = ops.l2_norm(k, hp.rms_eps, dtype=self.dtype)

        o, state.gdn[i] = ops.gated_delta_rule(q, k, v, g, beta, state.gdn[i], dtype=self.dtype)
        # ssm_norm is stored without the +1 the other norms carry: it is a plain weight either way
        o = self._rms(o, p + "ssm_norm.weight") * ops.silu(z, dtype=self.dtype)
        return self._linear(o.reshape(T, Hv * S), p + "ssm_out.weight")

    def _attention(self, state: ReferenceState, i: int, x, positions) -> np.ndarray:
        hp = self.hp
        p = f"blk.{i}."
        T = x.shape[0]
        nh, nkv, D = hp.n_head, hp.n_head_kv, hp.head_dim
        qg = self._linear(x, p + "attn_q.weight").reshape(T, nh, 2 * D)  # per head [query | gate]
        q, gate = qg[..., :D], qg[..., D:]
        k = self._linear(x, p + "attn_k.weight").reshape(T, nkv, D)
        v = self._linear(x, p + "attn_v.weight").reshape(T, nkv, D)

        q = self._rms(q, p + "attn_q_norm.weight")
        k = self._rms(k, p + "attn_k_norm.weight")
        q = ops.rope_neox(q, positions, hp.rope_dims, hp.rope_freq_base, dtype=self.dtype)
        k = ops.rope_neox(k, positions, hp.rope_dims, hp.rope_freq_base, dtype=self.dtype)

        state.k_cache[i] = np.concatenate([state.k_cache[i], k], axis=0)
        state.v_cache[i] = np.concatenate([state.v_cache[i], v], axis=0)
        attn = ops.attention(q, state.k_cache[i], state.v_cache[i], positions, dtype=self.dtype)
        o = attn * ops.sigmoid(gate, dtype=self.dtype)
        return self._linear(o.reshape(T, nh * D), p + "attn_output.weight")

    def _attention_plain(self, state: ReferenceState, i: int, x, positions) -> np.ndarray:
        """qwen2 / qwen3 attention, no gate: qwen2 adds q/k/v biases, qwen3 RMS-normalises each q
        and k head (before RoPE); NEOX RoPE on all D dims, causal GQA."""
        hp = self.hp
        p = f"blk.{i}."
        T = x.shape[0]
        nh, nkv, D = hp.n_head, hp.n_head_kv, hp.head_dim
        q = self._linear(x, p + "attn_q.weight")
        k = self._linear(x, p + "attn_k.weight")
        v = self._linear(x, p + "attn_v.weight")
        if hp.arch == qwen2.ARCH_QWEN2:
            q, k, v = q + self.w[p + "attn_q.bias"], k + self.w[p + "attn_k.bias"], v + self.w[p + "attn_v.bias"]
        q, k, v = q.reshape(T, nh, D), k.reshape(T, nkv, D), v.reshape(T, nkv, D)
        if hp.arch == qwen2.ARCH_QWEN3:
            q = self._rms(q, p + "attn_q_norm.weight")
            k = self._rms(k, p + "attn_k_norm.weight")

        q = ops.rope_neox(q, positions, hp.rope_dims, hp.rope_freq_base, dtype=self.dtype)
        k = ops.rope_neox(k, positions, hp.rope_dims, hp.rope_freq_base, dtype=self.dtype)

        state.k_cache[i] = np.concatenate([state.k_cache[i], k], axis=0)
        state.v_cache[i] = np.concatenate([state.v_cache[i], v], axis=0)
        attn = ops.attention(q, state.k_cache[i], state.v_cache[i], positions, dtype=self.dtype)
        return self._linear(attn.reshape(T, nh * D), p + "attn_output.weight")
