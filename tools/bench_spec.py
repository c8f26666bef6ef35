#!/usr/bin/env python3
"""Speculative decoding speed, every mode against autoregressive, measured side by side in one
process. Writes one JSON row per (model, drafter, mode): tokens/s, mean tokens committed per step,
verify ms per step, the cost of one verify in decode steps, and whether the tokens equal AR.

    python tools/bench_spec.py TARGET.gguf --draft oracle:p=0.8 --draft oracle:p=0.9 -n 64 --out rows.jsonl

--draft takes a DFlash draft GGUF or oracle:p=P (a benchmark tool: the target's own greedy
continuation, each token replaced by a wrong one with probability 1 − P)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_cpu import cpu_name, git_commit  # noqa: E402

MODES = [  # (name, mode, specla)
    ("chain+specla", "chain", True),
    ("ddtree (specla off: dense checkpoints)", "ddtree", False),
    ("ddtree+specla", "ddtree", True),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--draft", action="append", required=True, help="drafter (repeatable)")
    ap.add_argument("-n", "--n-predict", type=int, default=64)
    ap.add_argument("--n-prompt", type=int, default=16)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--budget", type=int, default=22)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from pyspecla import Model
    from pyspecla.speculative.factory import make_drafter
    from pyspecla.speculative.loop import SpecConfig, generate

    import numpy as np

    model = Model.load(args.model, n_threads=args.threads)
    prompt = np.random.default_rng(0).integers(0, model.hparams.n_vocab, args.n_prompt).tolist()
    base = {"commit": git_commit(), "device": f"cpu: {cpu_name()} ({os.cpu_count()} cores)",
            "model": Path(args.model).name, "threads": args.threads, "n_predict": args.n_predict,
            "budget": args.budget}
    rows = []

    ar_stats, ctx = generate(model, prompt, args.n_predict, SpecConfig(mode="ar"))
    ctx.close()
    decode_step_ms = ar_stats.verify_ms / max(ar_stats.steps, 1)
    rows.append({**base, "drafter": None, "mode": "ar", "tokens_per_s": ar_stats.tokens_per_s,
                 "mean_accepted": 1.0, "verify_ms_per_step": decode_step_ms, "verify_in_decode_steps": 1.0,
                 "same_as_ar": True})
    for spec in args.draft:
        for name, mode, specla in MODES:
            drafter = make_drafter(model, spec, prompt, args.n_predict, len(prompt) + args.n_predict + 64)
            config = SpecConfig(mode=mode, specla=specla, budget=args.budget, tau=6.0 if specla else None,
                                top_k=4 if specla else 8, max_depth=getattr(drafter, "max_depth", 15))
            stats, ctx = generate(model, prompt, args.n_predict, config, drafter=drafter)
            ctx.close()
            verify_ms = stats.verify_ms / max(stats.steps, 1)
            rows.append({**base, "drafter": spec, "mode": name, "tokens_per_s": stats.tokens_per_s,
                         "speedup_vs_ar": stats.tokens_per_s / ar_stats.tokens_per_s,
                         "mean_accepted": stats.mean_accepted, "steps": stats.steps,
                         "mean_tree_nodes": float(np.mean(stats.tree_nodes_per_step)),
                         "verify_ms_per_step": verify_ms, "verify_in_decode_steps": verify_ms / decode_step_ms,
                         "draft_ms_per_step": stats.draft_ms / max(stats.steps, 1),
                         "same_as_ar": stats.tokens == ar_stats.tokens})
    for row in rows:
        print(json.dumps(row))
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
