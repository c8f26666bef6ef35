#!/usr/bin/env python3
"""Teacher-forced top-1 agreement between pyspecla's backends on the synthetic test models, with
the CPU's own two kernel sets as the control.

    python tools/top1_agreement_backends.py --out rows.jsonl [--prompts 25] [--tokens 40]
        [--pairs cuda:cpu,scalar:cpu] [--models qwen35:q4_k_m,qwen35:q8_0,qwen2:q8_0,qwen3:q4_k_m]

Runtimes: `cpu` (the CPU backend, the fastest kernel set this CPU has), `scalar` (the CPU backend's
reference kernels), `cuda` (the GPU backend). For each model (make_test_model's preset, seed 3, as
tests/test_gpu_model.py writes them) every runtime named in --pairs computes the logits of the same
prompts (random token ids, seeds 20, 21, ...), each prompt one teacher-forced batch. One JSON row per
pair and model: positions, agreement, the second runtime's top-2 margin at each mismatch (how near
a tie it was), the median top-2 margin over all positions (the scale those margins are read
against) and the largest logit difference relative to the largest logit.

Why the control: the CPU's scalar and vector kernels add the recurrent layers' products in
different orders (the 8-lane AVX2 state walk), so scalar against cpu shows how often a change of
float summation order alone flips the argmax of these random models. The GPU differs from the CPU
in the same way (float orders upstream of the activation codes), so its figure is read against
that one. On a machine without a GPU the cuda pairs are skipped with a message (the CI test runs
the CPU pairs)."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS.parent))
sys.path.insert(0, str(TOOLS))

from bench_cpu import emit_rows  # noqa: E402
from bench_gpu import device_name  # noqa: E402
from top1_agreement import top2_margin  # noqa: E402

RUNTIMES = {"cpu": ("cpu", "auto"), "scalar": ("cpu", "scalar"), "cuda": ("cuda", "auto")}
DEFAULT_MODELS = "qwen35:q4_k_m,qwen35:q8_0,qwen2:q8_0,qwen3:q4_k_m"


def parse_pairs(text: str) -> list[tuple[str, str]]:
    pairs = []
    for item in text.split(","):
        parts = item.strip().split(":")
        if len(parts) != 2 or any(p not in RUNTIMES for p in parts):
            raise SystemExit(f"--pairs: {item!r} is not A:B with A and B among {', '.join(RUNTIMES)}")
        pairs.append((parts[0], parts[1]))
    return pairs


def parse_models(text: str, preset: str) -> list[tuple[str, str]]:
    from pyspecla.testing.models import ARCHS, QUANTS, presets_for

    models = []
    for item in text.split(","):
        parts = item.strip().split(":")
        if len(parts) != 2 or parts[0] not in ARCHS or parts[1] not in QUANTS:
            raise SystemExit(f"--models: {item!r} is not ARCH:QUANT (arch one of {', '.join(ARCHS)}, "
                             f"quant one of {', '.join(QUANTS)})")
        if preset not in presets_for(parts[0]):
            raise SystemExit(f"--preset: {preset!r} is not a {parts[0]} preset "
                             f"(one of {', '.join(presets_for(parts[0]))})")
        models.append((parts[0], parts[1]))
    return models


def runtime_logits(path: str, runtime: str, prompts: list[list[int]]) -> np.ndarray:
    from pyspecla import Model

    device, kernels = RUNTIMES[runtime]
    model = Model.load(path, device=device, cpu_kernels=kernels)
    try:
        return np.concatenate([model.logits(tokens) for tokens in prompts])
    finally:
        model.close()


def pair_row(a: np.ndarray, b: np.ndarray) -> dict:
    """b is the reference side: its margins say how near a tie each mismatch was."""
    agree = a.argmax(1) == b.argmax(1)
    margins = top2_margin(b)
    return {"positions": int(agree.size), "agree": int(agree.sum()),
            "top1_agreement": round(float(agree.mean()), 4),
            "b_margins_at_mismatches": [round(float(m), 4) for m in margins[~agree]],
            "b_margin_median": round(float(np.median(margins)), 4),
            "max_rel_logit_diff": float(np.abs(a - b).max() / np.abs(b).max())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=DEFAULT_MODELS, help=f"ARCH:QUANT list (default {DEFAULT_MODELS})")
    ap.add_argument("--preset", default="tiny8", help="make_test_model preset (default tiny8)")
    ap.add_argument("--seed", type=int, default=3, help="weights seed (default 3, tests/test_gpu_model.py's)")
    ap.add_argument("--pairs", default="cuda:cpu,scalar:cpu", help="A:B list of runtimes cpu, scalar, cuda")
    ap.add_argument("--prompts", type=int, default=25, help="prompts per model (default 25)")
    ap.add_argument("--tokens", type=int, default=40, help="tokens per prompt (default 40)")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", help="append JSON rows here")
    args = ap.parse_args(argv)
    if args.prompts < 1 or args.tokens < 1:
        raise SystemExit("--prompts and --tokens must be at least 1")
    pairs, models = parse_pairs(args.pairs), parse_models(args.models, args.preset)
    from pyspecla import _native
    from pyspecla.testing.models import presets_for, write_test_model

    if any("cuda" in pair for pair in pairs) and _native.cuda_device_count() == 0:
        print("top1_agreement_backends: no CUDA device visible to this build: the pairs with cuda are skipped",
              file=sys.stderr)
        pairs = [pair for pair in pairs if "cuda" not in pair]
    if not pairs:
        raise SystemExit("top1_agreement_backends: no pair left to run")

    device = device_name() if any("cuda" in pair for pair in pairs) else "cpu"
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for arch, quant in models:
            path = str(write_test_model(Path(folder) / f"{args.preset}-{arch}-{quant}.gguf", args.preset, quant,
                                        seed=args.seed, arch=arch))
            n_vocab = presets_for(arch)[args.preset].n_vocab
            prompts = [np.random.default_rng(20 + s).integers(0, n_vocab, args.tokens).tolist()
                       for s in range(args.prompts)]
            logits = {name: runtime_logits(path, name, prompts) for name in {n for pair in pairs for n in pair}}
            for a, b in pairs:
                rows.append({"commit": args.commit, "device": device, "mode": "top1-agreement-backends",
                             "model": f"{args.preset}-{arch}-{quant}-seed{args.seed}", "a": a, "b": b,
                             "prompts": args.prompts, "tokens_per_prompt": args.tokens,
                             **pair_row(logits[a], logits[b])})
    emit_rows(rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
