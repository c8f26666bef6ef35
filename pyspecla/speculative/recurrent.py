"""SpecLA for the recurrent layers, from Python: factor banks, the tree conv and the GDN tree
verify of one layer, accept and finish. Thin wrappers over the native ops (numpy in, numpy out);
the generation loop drives the same native calls from inside a context.

A step, per recurrent layer l:  y = banks.conv_tree(sched, l, x, w, conv_state[l])
                                 o = banks.verify_gdn(sched, l, q, k, v, g, beta, gdn_state[l])
then                             banks.accept(sched, path, states)
and at the end                   banks.finish(states)
The durable states are numpy arrays the native code updates in place (only when folding a pending
path, or at accept for the baseline commit methods)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from .. import _native
from .._native import check, float_ptr, int32_ptr, lib
from ..errors import UsageError

VERIFY_METHODS = tuple(_native.VERIFY_METHODS)
COMMIT_METHODS = tuple(_native.COMMIT_METHODS)


@dataclass(frozen=True)
class RecurrentShape:
    n_layers: int
    Hk: int
    Hv: int
    S: int
    C: int
    K: int
    max_nodes: int


def _f32(a) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32))


def _i32(a) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a, dtype=np.int32))


def _state_array(a: np.ndarray, shape, what: str) -> np.ndarray:
    if not isinstance(a, np.ndarray) or a.dtype != np.float32 or not a.flags.c_contiguous or a.shape != shape:
        raise UsageError(f"{what} must be a C-contiguous float32 array of shape {shape} (it is updated in place)")
    return a


class FactorBanks:
    """The two factor banks of a model's recurrent layers plus the pending accepted path."""

    def __init__(self, shape: RecurrentShape, verify_method: str = "hld_chains",
                 commit_method: str = "deferred_factors", n_threads: int = 0, cpu_kernels: str = "auto"):
        if verify_method not in _native.VERIFY_METHODS:
            raise UsageError(f"verify_method must be one of {VERIFY_METHODS}, got {verify_method!r}")
        if commit_method not in _native.COMMIT_METHODS:
            raise UsageError(f"commit_method must be one of {COMMIT_METHODS}, got {commit_method!r}")
        self.shape = shape
        self.verify_method, self.commit_method = verify_method, commit_method
        self._opts = _native.op_options(n_threads, cpu_kernels)
        s = _native.RecurrentShape(shape.n_layers, shape.Hk, shape.Hv, shape.S, shape.C, shape.K, shape.max_nodes,
                                   _native.VERIFY_METHODS[verify_method], _native.COMMIT_METHODS[commit_method])
        handle = ctypes.c_void_p()
        check(lib.specla_factor_banks_create(ctypes.byref(s), ctypes.byref(handle)))
        self._handle = handle

    def close(self) -> None:
        if getattr(self, "_handle", None):
            lib.specla_factor_banks_free(self._handle)
            self._handle = None

    def __del__(self):
        self.close()

    @property
    def pending(self) -> int:
        """Accepted tokens whose factors wait to be folded into the durable state."""
        return lib.specla_factor_banks_pending(self._handle)

    @property
    def nbytes(self) -> int:
        return lib.specla_factor_banks_bytes(self._handle)

    def stats(self) -> dict:
        """What the last verify did (specla_tree_stats): n_nodes, n_layers, node_steps and
        state_copies of value head 0, summed over the layers verified."""
        out = _native.TreeStats()
        check(lib.specla_factor_banks_stats(self._handle, ctypes.byref(out)))
        return out.as_dict()

    def read(self, bank: str, layer: int, field: str, n: int) -> np.ndarray:
        """Recorded factors: bank "pending" (path order) or "verify" (node order, before accept);
        field "k" (n, Hk, S), "delta" (n, Hv, S), "g" (n, Hv) or "x" (n, C)."""
        s = self.shape
        shapes = {"k": (n, s.Hk, s.S), "delta": (n, s.Hv, s.S), "g": (n, s.Hv), "x": (n, s.C)}
        if bank not in ("pending", "verify") or field not in shapes:
            raise UsageError(f"read: bank must be pending or verify and field one of {sorted(shapes)}")
        out = np.full(shapes[field], np.nan, dtype=np.float32)
        check(lib.specla_factor_banks_read(self._handle, 0 if bank == "pending" else 1, layer,
                                           ("k", "delta", "g", "x").index(field), n, float_ptr(out)))
        return out

    def conv_tree(self, schedule: np.ndarray, layer: int, x, weight, conv_state: np.ndarray) -> np.ndarray:
        s = self.shape
        x, weight, sched = _f32(x), _f32(weight), _i32(schedule)
        n = int(sched[2])
        if x.shape != (n, s.C) or weight.shape != (s.C, s.K):
            raise UsageError(f"conv_tree: x must be ({n}, {s.C}) and weight ({s.C}, {s.K})")
        _state_array(conv_state, (s.K - 1, s.C), "conv_state")
        y = np.full((n, s.C), np.nan, dtype=np.float32)
        args = _native.ConvTreeArgs(int32_ptr(sched), layer, float_ptr(x), float_ptr(weight), float_ptr(conv_state),
                                    float_ptr(y))
        check(lib.specla_op_conv_tree(self._opts, self._handle, ctypes.byref(args)))
        return y

    def verify_gdn(self, schedule: np.ndarray, layer: int, q, k, v, g, beta, state: np.ndarray) -> np.ndarray:
        s = self.shape
        sched = _i32(schedule)
        n = int(sched[2])
        q, k, v, g, beta = (_f32(a) for a in (q, k, v, g, beta))
        expected = {"q": (n, s.Hk, s.S), "k": (n, s.Hk, s.S), "v": (n, s.Hv, s.S), "g": (n, s.Hv), "beta": (n, s.Hv)}
        for name, arr in zip(expected, (q, k, v, g, beta)):
            if arr.shape != expected[name]:
                raise UsageError(f"verify_gdn: {name} has shape {arr.shape}, expected {expected[name]}")
        _state_array(state, (s.Hv, s.S, s.S), "state")
        out = np.full((n, s.Hv, s.S), np.nan, dtype=np.float32)
        args = _native.GdnTreeArgs(int32_ptr(sched), layer, float_ptr(q), float_ptr(k), float_ptr(v), float_ptr(g),
                                   float_ptr(beta), float_ptr(state), float_ptr(out))
        check(lib.specla_op_gdn_tree_verify(self._opts, self._handle, ctypes.byref(args)))
        return out

    def _states(self, gdn_states, conv_states):
        if gdn_states is None:
            return None
        s = self.shape
        if len(gdn_states) != s.n_layers or len(conv_states) != s.n_layers:
            raise UsageError(f"need {s.n_layers} GDN and conv states")
        for st in gdn_states:
            _state_array(st, (s.Hv, s.S, s.S), "GDN state")
        for st in conv_states:
            _state_array(st, (s.K - 1, s.C), "conv state")
        gdn = (_native.c_float_p * s.n_layers)(*[float_ptr(a) for a in gdn_states])
        conv = (_native.c_float_p * s.n_layers)(*[float_ptr(a) for a in conv_states])
        return _native.RecurrentStates(gdn, conv), (gdn, conv)

    def accept(self, schedule: np.ndarray, path, gdn_states=None, conv_states=None) -> None:
        """Accepted path: node ids from the root (path[0] = 0). The deferred commit needs no states."""
        sched, p = _i32(schedule), _i32(path)
        packed = self._states(gdn_states, conv_states)
        states_ptr = ctypes.byref(packed[0]) if packed else None
        check(lib.specla_factor_banks_accept(self._opts, self._handle, int32_ptr(sched), int32_ptr(p), len(p),
                                             states_ptr))

    def finish(self, gdn_states, conv_states) -> None:
        """finish_speculative_state: fold what is pending, exactly once (idempotent)."""
        packed = self._states(gdn_states, conv_states)
        check(lib.specla_finish_speculative_state(self._opts, self._handle, ctypes.byref(packed[0])))


class RecurrentWorkload:
    """The recurrent layers' tree work resident in one backend's memory (specla.h, "Recurrent
    workload"): every layer's inputs uploaded once, durable states, outputs and factor banks kept on
    the backend, one call per step's work over all layers. For benchmarks on a GPU, where the
    per-layer ops of FactorBanks would copy host arrays in and out on every call. Calls may return
    before the device is done: `sync()` waits, so time [sync, calls, sync].

    inputs: q, k (L, N, Hk, S); v (L, N, Hv, S); g, beta (L, N, Hv); x (L, N, C) with N =
    shape.max_nodes; conv_weight (L, C, K); gdn_state (L, Hv, S, S); conv_state (L, K-1, C)."""

    READS = {"gdn_out": 0, "conv_out": 1, "gdn_state": 2, "conv_state": 3}

    def __init__(self, shape: RecurrentShape, inputs: dict, verify_method: str = "hld_chains",
                 commit_method: str = "deferred_factors", device: str = "cpu", n_threads: int = 0,
                 cpu_kernels: str = "auto"):
        if verify_method not in _native.VERIFY_METHODS:
            raise UsageError(f"verify_method must be one of {VERIFY_METHODS}, got {verify_method!r}")
        if commit_method not in _native.COMMIT_METHODS:
            raise UsageError(f"commit_method must be one of {COMMIT_METHODS}, got {commit_method!r}")
        s = self.shape = shape
        L, N = s.n_layers, s.max_nodes
        expected = {"q": (L, N, s.Hk, s.S), "k": (L, N, s.Hk, s.S), "v": (L, N, s.Hv, s.S), "g": (L, N, s.Hv),
                    "beta": (L, N, s.Hv), "x": (L, N, s.C), "conv_weight": (L, s.C, s.K),
                    "gdn_state": (L, s.Hv, s.S, s.S), "conv_state": (L, s.K - 1, s.C)}
        arrays = {}
        for name, want in expected.items():
            if name not in inputs:
                raise UsageError(f"RecurrentWorkload: inputs lack {name!r}")
            a = _f32(inputs[name])
            if a.shape != want:
                raise UsageError(f"RecurrentWorkload: inputs[{name!r}] has shape {a.shape}, expected {want}")
            arrays[name] = a
        try:
            opts = _native.op_options(n_threads, cpu_kernels, device)
        except (KeyError, ValueError) as e:
            raise UsageError(f"RecurrentWorkload: {e}") from None
        native_shape = _native.RecurrentShape(L, s.Hk, s.Hv, s.S, s.C, s.K, N, _native.VERIFY_METHODS[verify_method],
                                              _native.COMMIT_METHODS[commit_method])
        packed = _native.RecurrentInputs(*(float_ptr(arrays[name]) for name in expected))
        handle = ctypes.c_void_p()
        check(lib.specla_recurrent_workload_create(ctypes.byref(opts), ctypes.byref(native_shape), ctypes.byref(packed),
                                                   ctypes.byref(handle)))  # the inputs are uploaded here
        self._handle = handle
        self.n_nodes = 0

    def close(self) -> None:
        if getattr(self, "_handle", None):
            lib.specla_recurrent_workload_free(self._handle)
            self._handle = None

    def __del__(self):
        self.close()

    def set_tree(self, parents) -> None:
        """The tree of the next verifies; its schedule is built and uploaded here (not timed)."""
        p = _i32(parents)
        check(lib.specla_recurrent_workload_set_tree(self._handle, int32_ptr(p), len(p)))
        self.n_nodes = len(p)

    def verify(self) -> None:
        check(lib.specla_recurrent_workload_verify(self._handle))

    def accept(self, path) -> None:
        p = _i32(path)
        check(lib.specla_recurrent_workload_accept(self._handle, int32_ptr(p), len(p)))

    def finish(self) -> None:
        check(lib.specla_recurrent_workload_finish(self._handle))

    def sync(self) -> None:
        check(lib.specla_recurrent_workload_sync(self._handle))

    def read(self, what: str, layer: int) -> np.ndarray:
        """A copy on the host: "gdn_out" (n, Hv, S) / "conv_out" (n, C) of the last verify (n = the
        tree's nodes), or a layer's durable "gdn_state" (Hv, S, S) / "conv_state" (K-1, C)."""
        s = self.shape
        shapes = {"gdn_out": (self.n_nodes, s.Hv, s.S), "conv_out": (self.n_nodes, s.C),
                  "gdn_state": (s.Hv, s.S, s.S), "conv_state": (s.K - 1, s.C)}
        if what not in shapes:
            raise UsageError(f"RecurrentWorkload.read: what must be one of {sorted(shapes)}, got {what!r}")
        out = np.full(shapes[what], np.nan, dtype=np.float32)
        check(lib.specla_recurrent_workload_read(self._handle, self.READS[what], layer, float_ptr(out)))
        return out
