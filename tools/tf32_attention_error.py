"""How far would a tensor-core attention move a model's logits from float64? The float64 reference
model (pyspecla.reference.forward) with its attention replaced by an emulation of one arithmetic:

  fp32    scores and weighted V sums accumulated in fp32, one product at a time (the GPU's fp32 path)
  tf32    operands rounded to tf32 (cvt.rna: 10 explicit mantissa bits, ties away), the exact
          products of a k-step of 8 summed, then added to an fp32 accumulator (an MMA chain)
  3xtf32  each operand x split into hi = tf32(x), lo = tf32(x - hi); lo.hi + hi.lo + hi.hi as above
          (docs/cuda-attention.md; attention_tensor_cores.cuh)

The rest of the model stays float64, so the figure is the attention's own contribution. For each
prompt it prints the largest logit error over the largest |logit| against float64, and whether the
argmax agrees; then the same for the CPU backend's whole model for scale. No GPU needed.

    python tools/tf32_attention_error.py [--preset tiny8] [--positions 48] [--prompts 3]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyspecla import Model  # noqa: E402
from pyspecla.reference import ops  # noqa: E402
from pyspecla.reference.forward import ReferenceModel  # noqa: E402
from pyspecla.testing.models import write_test_model  # noqa: E402


def tf32(x: np.ndarray) -> np.ndarray:
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return (((bits + 0x1000) & 0xFFFFE000).astype(np.uint32)).view(np.float32)


def split(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, np.float32)
    hi = tf32(x)
    return hi, tf32((x - hi).astype(np.float32))


def chained_dot(a: np.ndarray, b: np.ndarray, kstep: int) -> np.ndarray:
    """a (..., K) . b (..., K): each k-step's products summed exactly (float64 holds them), then added
    to an fp32 accumulator, k-step after k-step."""
    acc = np.zeros(np.broadcast_shapes(a.shape[:-1], b.shape[:-1]), np.float32)
    for k0 in range(0, a.shape[-1], kstep):
        part = (a[..., k0:k0 + kstep].astype(np.float64) * b[..., k0:k0 + kstep].astype(np.float64)).sum(-1)
        acc = (acc.astype(np.float64) + part).astype(np.float32)
    return acc


def product(a: np.ndarray, b: np.ndarray, mode: str) -> np.ndarray:
    pad = -a.shape[-1] % 8  # whole k-steps: zero products past the end, as the kernels' masked rows
    if pad:
        a = np.concatenate([a, np.zeros(a.shape[:-1] + (pad,), a.dtype)], -1)
        b = np.concatenate([b, np.zeros(b.shape[:-1] + (pad,), b.dtype)], -1)
    if mode == "fp32":
        return chained_dot(a, b, 1)
    if mode == "tf32":
        return chained_dot(tf32(a), tf32(b), 8)
    ah, al = split(a)
    bh, bl = split(b)

    def per_kstep(x, y, z):  # k-step by k-step: its lo.hi, hi.lo, hi.hi MMAs in turn
        parts = [w.reshape(w.shape[:-1] + (w.shape[-1] // 8, 1, 8)) for w in (x, y, z)]
        joined = np.concatenate(parts, -2)
        return joined.reshape(joined.shape[:-3] + (-1,))

    return chained_dot(per_kstep(al, ah, ah), per_kstep(bh, bl, bh), 8)


def emulated_attention(mode: str):
    def attention(q, k_cache, v_cache, positions, *, dtype=np.float64):
        q = np.asarray(q, np.float32)
        kc = np.asarray(k_cache, np.float32)
        vc = np.asarray(v_cache, np.float32)
        T, nh, D = q.shape
        n_kv, nkv, _ = kc.shape
        kv_head = np.arange(nh) // (nh // nkv)
        k = kc[:, kv_head, :].transpose(1, 0, 2)[:, None, :, :]  # (nh, 1, n, D)
        v = vc[:, kv_head, :].transpose(1, 2, 0)[:, None, :, :]  # (nh, 1, D, n)
        s = product(q.transpose(1, 0, 2)[:, :, None, :], k, mode)  # (nh, T, n)
        s = (s * np.float32(1 / np.sqrt(D))).astype(np.float32).transpose(1, 0, 2)
        visible = np.arange(n_kv)[None, :] <= np.asarray(positions)[:, None]
        s = np.where(visible[:, None, :], s, -np.inf).astype(np.float32)
        p = np.exp((s - s.max(-1, keepdims=True)).astype(np.float32)).astype(np.float32)
        l = p.sum(-1, keepdims=True, dtype=np.float32)
        o = product(p.transpose(1, 0, 2)[:, :, None, :], v, mode).transpose(1, 0, 2) / l
        return o.astype(np.float64)
    return attention


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny8")
    ap.add_argument("--positions", type=int, default=48)
    ap.add_argument("--prompts", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = str(write_test_model(Path(tmp) / "m.gguf", args.preset, "f32", seed=3, arch="qwen35"))
        ref = ReferenceModel.from_gguf(path)
        exact = ops.attention
        cpu = Model.load(path, device="cpu")
        print(f"qwen35 {args.preset} F32, {args.positions} positions: max |logit error| / max |logit| against float64")
        for seed in range(5, 5 + args.prompts):
            tokens = np.random.default_rng(seed).integers(0, 100, args.positions).tolist()
            ops.attention = exact
            want = ref.forward(ref.new_state(), tokens)
            line = [f"prompt {seed}:"]
            for mode in ("fp32", "tf32", "3xtf32"):
                ops.attention = emulated_attention(mode)
                got = ref.forward(ref.new_state(), tokens)
                rel = np.abs(got - want).max() / np.abs(want).max()
                agree = int((got.argmax(-1) == want.argmax(-1)).sum())
                line.append(f"{mode} {rel:.2e} (argmax {agree}/{len(tokens)})")
            ops.attention = exact
            whole = cpu.logits(tokens)
            line.append(f"cpu backend {np.abs(whole - want).max() / np.abs(want).max():.2e}")
            print("  ".join(line), flush=True)
        cpu.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
