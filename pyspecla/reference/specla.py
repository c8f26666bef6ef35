"""Numpy oracles for SpecLA tree verification of one Gated DeltaNet layer and its causal conv.

Everything here is float64 throughout and returns float64 arrays (unlike ``ops``, which rounds its
results to float32): these oracles judge each other to ~1e-12 and judge float32 kernels from above.

A draft tree is a parent array in topological order: ``parents[0] == -1`` (node 0, the root, is the
first new token) and ``0 <= parents[t] < t`` for t > 0. Node t's root path is [0, ..., parent(t), t].

Two independent formulations of the tree verify (docs/specla.md §2 and §3 item 2):

- :func:`tree_sequential` replays, for every node, the plain gated delta recurrence token by token
  along the node's root path (the obviously-correct oracle).
- :func:`tree_ut` solves all nodes at once from the durable state S0 with ancestor masks (the
  tree-masked UT/WY form). Derivation, in math layout M (key i × value j), per value head:

      M_t = exp(g_t)·M_parent(t) + k_t ⊗ δ_t,   δ_t = β_t·(v_t − (exp(g_t)·M_parent(t))ᵀ k_t)

  Unrolling along the root path with G_t = Σ_{u ∈ path(t)} g_u (the factor identity, §2):

      M_t = exp(G_t)·M_0 + Σ_{u ∈ path(t)} exp(G_t − G_u)·k_u ⊗ δ_u

  so, with D[u, t] = exp(G_t − G_u) on ancestor-or-self pairs (0 elsewhere),

      δ_t + Σ_{u ∈ anc(t), u ≠ t} β_t (k_u·k_t) D[u, t] δ_u = β_t v_t − β_t exp(G_t) M_0ᵀ k_t

  i.e. (I + A) δ = βv − β exp(G) M_0ᵀ k with A[t, u] = M_strict[u, t]·β_t (k_u·k_t)·D[u, t],
  strictly lower triangular because the order is topological; T = (I + A)⁻¹ is unit lower
  triangular (forward substitution here, no scipy). The outputs are
  o_t = (exp(G_t) M_0ᵀ q_t + Σ_{u ∈ path(t)} (k_u·q_t) D[u, t] δ_u) / √S.

State layout everywhere is the native one, (Hv, S, S) = [head][value j][key i] (the transpose of M),
so ``state[h] @ k == Mᵀ k`` and the rank-one update is ``state[h] += outer(δ, k)``. Value head h uses
key head h % Hk. Keys are passed per key head (N, Hk, S), as the native ops and factor banks hold them.
"""

from __future__ import annotations


import numpy as np

__all__ = [
    "validate_parents",
    "root_path",
    "ancestor_masks",
    "gdn_step",
    "tree_sequential",
    "tree_ut",
    "unit_lower_inverse",
    "fold_factors",
    "conv_tree",
    "conv_state_after_path",
    "conv_state_after_node",
    "fold_conv",
]

_F = np.float64


# --------------------------------------------------------------------------------------------
# tree topology


def validate_parents(parents) -> np.ndarray:
    """The parent array as int64, or ValueError unless parents[0] == -1 and 0 <= parents[t] < t."""
    p = np.asarray(parents)
    if p.ndim != 1:
        raise ValueError(f"parents must be 1-D, got shape {p.shape}")
    if p.size and not np.issubdtype(p.dtype, np.integer):
        if not np.all(np.asarray(p, dtype=_F) == np.round(np.asarray(p, dtype=_F))):
            raise ValueError("parents must be integers")
    p = p.astype(np.int64)
    if p.size == 0:
        return p
    if p[0] != -1:
        raise ValueError(f"parents[0] must be -1 (the root), got {p[0]}")
    for t in range(1, p.size):
        if not 0 <= p[t] < t:
            raise ValueError(f"parents[{t}] = {p[t]} is not in [0, {t}) (not topological order)")
    return p


def root_path(parents, t: int) -> list[int]:
    """Node t's root path [0, ..., parent(t), t]."""
    p = validate_parents(parents)
    if not 0 <= t < p.size:
        raise IndexError(f"node {t} not in a tree of {p.size} nodes")
    path = [int(t)]
    while p[path[-1]] >= 0:
        path.append(int(p[path[-1]]))
    return path[::-1]


def ancestor_masks(parents) -> tuple[np.ndarray, np.ndarray]:
    """(M_incl, M_strict), each (N, N) float64: M_incl[u, t] = 1 iff u is an ancestor of t or t itself;
    M_strict = M_incl without the diagonal. Both are upper triangular in topological order."""
    p = validate_parents(parents)
    n = p.size
    m_incl = np.zeros((n, n), dtype=_F)
    for t in range(n):
        m_incl[root_path(p, t), t] = 1.0
    m_strict = m_incl - np.eye(n, dtype=_F)
    return m_incl, m_strict


# --------------------------------------------------------------------------------------------
# input checking


def _check_gdn(q, k, v, g, beta, state0):
    q = np.asarray(q, dtype=_F)
    k = np.asarray(k, dtype=_F)
    v = np.asarray(v, dtype=_F)
    g = np.asarray(g, dtype=_F)
    beta = np.asarray(beta, dtype=_F)
    state0 = np.asarray(state0, dtype=_F)
    if q.ndim != 3 or v.ndim != 3:
        raise ValueError(f"q {q.shape} and v {v.shape} must be (N, heads, S)")
    n, hk, s = q.shape
    hv = v.shape[1]
    if k.shape != (n, hk, s) or v.shape != (n, hv, s) or g.shape != (n, hv) or beta.shape != (n, hv):
        raise ValueError(f"q {q.shape} k {k.shape} v {v.shape} g {g.shape} beta {beta.shape}")
    if state0.shape != (hv, s, s) or hk == 0 or hv % hk != 0:
        raise ValueError(f"state0 {state0.shape}, Hv {hv}, Hk {hk}, S {s}")
    return q, k, v, g, beta, state0


# --------------------------------------------------------------------------------------------
# sequential oracle


def gdn_step(state, q_t, k_t, v_t, g_t, beta_t):
    """One token of the gated delta rule, float64, from ``state`` (Hv, S, S) [head][value][key].

    q_t, k_t (Hk, S); v_t (Hv, S); g_t, beta_t (Hv,). Returns (out (Hv, S), new_state, delta (Hv, S)):
    M ← exp(g)·M; δ = β (v − Mᵀk); M ← M + k ⊗ δ; o = Mᵀq / √S."""
    state = np.asarray(state, dtype=_F)
    q_t = np.asarray(q_t, dtype=_F)
    k_t = np.asarray(k_t, dtype=_F)
    hv, s, _ = state.shape
    key_head = np.arange(hv) % q_t.shape[0]
    kh = k_t[key_head]
    qh = q_t[key_head]
    st = state * np.exp(np.asarray(g_t, dtype=_F))[:, None, None]
    delta = np.asarray(beta_t, dtype=_F)[:, None] * (np.asarray(v_t, dtype=_F) - np.einsum("hji,hi->hj", st, kh))
    st = st + delta[:, :, None] * kh[:, None, :]
    out = np.einsum("hji,hi->hj", st, qh) / np.sqrt(_F(s))
    return out, st, delta


def tree_sequential(parents, q, k, v, g, beta, state0):
    """Verify every node by decoding sequentially along its own root path from state0.

    Returns (out (N, Hv, S), states (N, Hv, S, S), deltas (N, Hv, S)), all float64: states[t] is the
    state after node t, deltas[t] the δ of node t (computed from its parent's state)."""
    p = validate_parents(parents)
    q, k, v, g, beta, state0 = _check_gdn(q, k, v, g, beta, state0)
    n, _, s = q.shape
    hv = v.shape[1]
    if p.size != n:
        raise ValueError(f"{p.size} parents for {n} tokens")
    out = np.empty((n, hv, s), dtype=_F)
    states = np.empty((n, hv, s, s), dtype=_F)
    deltas = np.empty((n, hv, s), dtype=_F)
    for t in range(n):
        st = state0
        for u in root_path(p, t):  # a fresh replay per node: no state shared between nodes
            o, st, d = gdn_step(st, q[u], k[u], v[u], g[u], beta[u])
        out[t], states[t], deltas[t] = o, st, d
    return out, states, deltas


# --------------------------------------------------------------------------------------------
# tree-masked UT / WY formulation


def unit_lower_inverse(a_strict: np.ndarray) -> np.ndarray:
    """T = (I + A)⁻¹ for strictly lower-triangular A (..., N, N), by forward substitution, float64.

    Row t of T: T[t] = e_t − Σ_{u<t} A[t, u]·T[u] (T is unit lower triangular)."""
    a = np.asarray(a_strict, dtype=_F)
    n = a.shape[-1]
    if a.shape[-2] != n:
        raise ValueError(f"A must be square, got {a.shape}")
    if n and np.any(np.triu(a) != 0):
        raise ValueError("A must be strictly lower triangular")
    t_inv = np.zeros_like(a)
    eye = np.eye(n, dtype=_F)
    for t in range(n):
        t_inv[..., t, :] = eye[t] - np.einsum("...u,...uj->...j", a[..., t, :t], t_inv[..., :t, :])
    return t_inv


def tree_ut(parents, q, k, v, g, beta, state0, *, with_states: bool = True) -> dict:
    """All nodes of the tree at once from state0 with ancestor masks (docs/specla.md §3 item 2), float64.

    Returns a dict:
      "out"       (N, Hv, S)      outputs o_t
      "G"         (N, Hv)         cumulative log-decay, G = M_inclᵀ g
      "delta"     (N, Hv, S)      δ (= the serial recurrence's δ), from (I + A) δ = βv − β exp(G) S0ᵀk
      "M_incl", "M_strict" (N, N) ancestor masks ([u, t] = u is an ancestor(-or-self) of t)
      "D"         (Hv, N, N)      D[h, u, t] = exp(G_t − G_u) on ancestor-or-self pairs, else 0
      "A"         (Hv, N, N)      A[h, t, u] = M_strict[u, t]·β_t (k_u·k_t)·D[u, t] (strictly lower)
      "T"         (Hv, N, N)      (I + A)⁻¹ by forward substitution
      "state_at"  callable t -> (Hv, S, S): the state after node t by the factor identity
                  S_t = exp(G_t)·S0 + Σ_{u ∈ path(t)} exp(G_t − G_u)·k_u ⊗ δ_u ([head][value][key])
      "states"    (N, Hv, S, S)   state_at for every node (only when with_states)."""
    p = validate_parents(parents)
    q, k, v, g, beta, state0 = _check_gdn(q, k, v, g, beta, state0)
    n, hk, s = q.shape
    hv = v.shape[1]
    if p.size != n:
        raise ValueError(f"{p.size} parents for {n} tokens")
    key_head = np.arange(hv) % hk
    kv = k[:, key_head, :].transpose(1, 0, 2)  # (Hv, N, S) keys per value head
    qv = q[:, key_head, :].transpose(1, 0, 2)
    vh = v.transpose(1, 0, 2)  # (Hv, N, S)
    gh = g.T  # (Hv, N)
    bh = beta.T

    m_incl, m_strict = ancestor_masks(p)
    big_g = gh @ m_incl  # (Hv, N): G[h, t] = Σ_u M_incl[u, t] g[h, u]
    diff = big_g[:, None, :] - big_g[:, :, None]  # diff[h, u, t] = G_t − G_u
    on = m_incl[None, :, :] > 0
    dmat = np.where(on, np.exp(np.where(on, diff, 0.0)), 0.0)  # no overflow off the ancestor pairs

    kk = np.einsum("htd,hud->htu", kv, kv)  # kk[h, t, u] = k_t·k_u
    a = m_strict.T[None] * bh[:, :, None] * kk * dmat.transpose(0, 2, 1)  # A[h, t, u]
    t_inv = unit_lower_inverse(a)

    s0_k = np.einsum("hji,hti->htj", state0, kv)  # S0ᵀ k_t (math layout) per head and node
    s0_q = np.einsum("hji,hti->htj", state0, qv)
    eg = np.exp(big_g)  # (Hv, N)
    rhs = bh[:, :, None] * (vh - eg[:, :, None] * s0_k)
    delta = np.einsum("htu,huj->htj", t_inv, rhs)  # (Hv, N, S)

    kq = np.einsum("hud,htd->hut", kv, qv)  # kq[h, u, t] = k_u·q_t
    w = kq * dmat  # zero off ancestor-or-self pairs
    out = (eg[:, :, None] * s0_q + np.einsum("hut,huj->htj", w, delta)) / np.sqrt(_F(s))

    def state_at(t: int) -> np.ndarray:
        if not 0 <= t < n:
            raise IndexError(f"node {t} not in a tree of {n} nodes")
        coef = dmat[:, :, t]  # (Hv, N): exp(G_t − G_u) on path(t), else 0
        return eg[:, t, None, None] * state0 + np.einsum("hu,huj,hui->hji", coef, delta, kv)

    result = {
        "out": np.ascontiguousarray(out.transpose(1, 0, 2)),
        "G": np.ascontiguousarray(big_g.T),
        "delta": np.ascontiguousarray(delta.transpose(1, 0, 2)),
        "M_incl": m_incl,
        "M_strict": m_strict,
        "D": dmat,
        "A": a,
        "T": t_inv,
        "state_at": state_at,
    }
    if with_states:
        result["states"] = np.stack([state_at(t) for t in range(n)]) if n else np.empty((0, hv, s, s), dtype=_F)
    return result


# --------------------------------------------------------------------------------------------
# deferred commit of an accepted path


def fold_factors(state, k, delta, g, Hk: int | None = None) -> np.ndarray:
    """Apply an accepted path's factors in order: S ← exp(g)·S + k ⊗ δ per token and value head.

    state (Hv, S, S) [head][value][key]; k (T, Hk, S) per key head (value head h uses key head
    h % Hk) — or (T, Hv, S) already per value head; delta (T, Hv, S); g (T, Hv).
    ``Hk`` defaults to k.shape[1]. Returns the new state, float64 (the input is not modified)."""
    st = np.array(state, dtype=_F, copy=True)
    k = np.asarray(k, dtype=_F)
    delta = np.asarray(delta, dtype=_F)
    g = np.asarray(g, dtype=_F)
    hv, s, _ = st.shape
    n = delta.shape[0]
    hk = k.shape[1] if Hk is None else int(Hk)
    if k.ndim != 3 or k.shape[0] != n or k.shape[2] != s or k.shape[1] not in (hk, hv):
        raise ValueError(f"fold_factors: k {k.shape}, Hk {hk}, Hv {hv}, S {s}")
    if delta.shape != (n, hv, s) or g.shape != (n, hv) or hk == 0 or hv % hk:
        raise ValueError(f"fold_factors: delta {delta.shape}, g {g.shape}, state {st.shape}, Hk {hk}")
    key_head = np.arange(hv) % hk if k.shape[1] == hk else np.arange(hv)
    for t in range(n):
        kh = k[t, key_head]  # (Hv, S)
        st *= np.exp(g[t])[:, None, None]
        st += delta[t][:, :, None] * kh[:, None, :]
    return st


# --------------------------------------------------------------------------------------------
# tree-aware causal conv


def _silu(x):
    return x * np.where(x >= 0, 1.0 / (1.0 + np.exp(-np.abs(x))), np.exp(-np.abs(x)) / (1.0 + np.exp(-np.abs(x))))


def fold_conv(conv_state, x_path) -> np.ndarray:
    """New conv state after the raw inputs x_path (T, C): the last K−1 rows of [conv_state; x_path]."""
    conv_state = np.asarray(conv_state, dtype=_F)
    x_path = np.asarray(x_path, dtype=_F).reshape(-1, conv_state.shape[1])
    km1 = conv_state.shape[0]
    hist = np.concatenate([conv_state, x_path], axis=0)
    return np.ascontiguousarray(hist[hist.shape[0] - km1 :])


conv_state_after_path = fold_conv


def conv_state_after_node(parents, x, conv_state, t: int) -> np.ndarray:
    """Conv state after accepting the root path of node t (the raw inputs x along that path)."""
    return fold_conv(conv_state, np.asarray(x, dtype=_F)[root_path(parents, t)])


def conv_tree(parents, x, weight, conv_state) -> tuple[np.ndarray, np.ndarray]:
    """Tree-aware causal depthwise conv + SiLU.

    x (N, C) raw inputs per node; weight (C, K), k = 0 the oldest sample; conv_state (K−1, C), row 0
    the oldest. Node t's window (K, C) = the last K−1 raw inputs of its root-path history (starting
    from conv_state, never a sibling's input) followed by x_t; y_t = silu(Σ_k window[k]·weight[:, k]).
    Returns (y (N, C), windows (N, K, C)), float64."""
    p = validate_parents(parents)
    x = np.asarray(x, dtype=_F)
    weight = np.asarray(weight, dtype=_F)
    conv_state = np.asarray(conv_state, dtype=_F)
    n, c = x.shape
    cw, kk = weight.shape
    if p.size != n or cw != c or conv_state.shape != (kk - 1, c):
        raise ValueError(f"conv_tree: {p.size} parents, x {x.shape}, weight {weight.shape}, conv_state {conv_state.shape}")
    windows = np.empty((n, kk, c), dtype=_F)
    for t in range(n):
        path = root_path(p, t)
        hist = np.concatenate([conv_state, x[path[:-1]]], axis=0)
        windows[t, : kk - 1] = hist[hist.shape[0] - (kk - 1) :]
        windows[t, kk - 1] = x[t]
    pre = np.einsum("tkc,ck->tc", windows, weight)
    return _silu(pre), windows
