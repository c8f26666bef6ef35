#!/usr/bin/env python3
"""Accepted tokens per step of exact speculative sampling against greedy, on the real pair.

For every prompt and temperature: a plain generation (no draft) and a speculative one per drafter
setting with the same SamplingParams and seed, through Model.generation (the API the server uses).
Each speculative row records whether its tokens equal the plain row's (`exact`: they must, at any
temperature), the tokens committed per verify step (`mean_accepted`: accepted draft tokens + the
bonus token) and tokens/s. Temperature 0 is greedy (the argmax path).

    python tools/bench_sampling.py --temps 0,0.7,1.0 --prompts humaneval:0-2 --tokens 64 \\
        --out results/bench-sampling-$(git rev-parse --short HEAD).jsonl

Models default to tools/fetch_models.py's Qwen2.5-Coder 1.5B target and 0.5B draft in
~/.cache/pyspecla/models; prompts come from tools/prompts_real.py."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_cpu import cpu_name, git_commit  # noqa: E402
from bench_real import DEFAULT_DRAFT, DEFAULT_TARGET, default_model_dir, git_dirty  # noqa: E402
from prompts_real import load_prompts, prompt_text  # noqa: E402

# setting: (draft kind, speculative options); "draft" is the draft model file
SETTINGS = {
    "draft-chain": ("draft", {"no_ddtree": True, "specla": True}),
    "draft-ddtree": ("draft", {"specla": True, "ddtree_budget": 22}),
    "ngram": ("ngram", {"specla": True}),
}


def run_one(model, prompt_ids, max_tokens: int, sampling, draft=None, options=None) -> dict:
    generation = model.generation(prompt_ids, max_tokens, sampling=sampling, draft=draft, stop_at_eos=True,
                                  **(options or {}))
    t0 = time.perf_counter()
    tokens = [t.id for t in generation]
    wall_s = time.perf_counter() - t0
    stats = generation.stats
    accepted = stats["accepted_per_step"]
    decode_s = stats["decode_ms"] / 1e3
    return {"tokens": tokens, "n_tokens": len(tokens), "steps": stats["steps"],
            "mean_accepted": sum(accepted) / len(accepted) if accepted else None,
            "tokens_per_s": (len(tokens) - 1) / decode_s if decode_s > 0 and len(tokens) > 1 else 0.0,
            "prefill_ms": stats["prefill_ms"], "decode_ms": stats["decode_ms"], "wall_s": wall_s,
            "finish_reason": generation.finish_reason, "seed": stats["seed"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default=None, help=f"target GGUF (default <cache>/{DEFAULT_TARGET})")
    ap.add_argument("--draft", default=None, help=f"draft GGUF (default <cache>/{DEFAULT_DRAFT})")
    ap.add_argument("--prompts", default="humaneval:0-2", help="prompt spec (tools/prompts_real.py)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per generation (default 64; stops at EOS)")
    ap.add_argument("--temps", default="0,0.7,1.0", help="temperatures (comma list; 0 = greedy)")
    ap.add_argument("--top-p", type=float, default=1.0, help="top-p of every sampled run (default 1: off)")
    ap.add_argument("--seed", type=int, default=1, help="sampling seed (default 1)")
    ap.add_argument("--settings", default="draft-chain", help=f"speculative settings (comma list of {list(SETTINGS)})")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="append JSON rows to this file")
    args = ap.parse_args(argv)

    from pyspecla import Model
    from pyspecla.sampling import SamplingParams

    settings = [s for s in args.settings.split(",") if s]
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown:
        ap.error(f"unknown settings {unknown}; choose from {list(SETTINGS)}")
    try:
        temps = [float(t) for t in args.temps.split(",") if t]
    except ValueError:
        ap.error(f"--temps {args.temps!r}: a comma list of numbers")
    model_path = Path(args.model) if args.model else default_model_dir() / DEFAULT_TARGET
    draft_path = Path(args.draft) if args.draft else default_model_dir() / DEFAULT_DRAFT
    for path in (model_path, draft_path):
        if not path.exists():
            ap.error(f"{path} absent (python tools/fetch_models.py qwen2.5-coder)")

    model = Model.load(str(model_path), n_threads=args.threads)
    prompts = load_prompts(args.prompts)
    base = {"commit": git_commit(), "dirty": git_dirty(),
            "device": f"cpu: {cpu_name()} ({os.cpu_count()} cores, {args.threads} threads)",
            "model": model_path.name, "max_tokens": args.tokens, "top_p": args.top_p}
    for prompt in prompts:
        ids = model.tokenize(prompt_text(prompt, model.tokenizer))
        for temp in temps:
            sampling = SamplingParams(temperature=temp, top_p=args.top_p, seed=args.seed if temp > 0 else None)
            rows = []
            plain = run_one(model, ids, args.tokens, sampling)
            rows.append({**base, "loadavg_start": os.getloadavg()[0], "prompt": prompt.id, "n_prompt_tokens": len(ids),
                         "temperature": temp, "setting": "plain", "draft": None, **plain})
            for setting in settings:
                kind, options = SETTINGS[setting]
                draft = str(draft_path) if kind == "draft" else "ngram"
                spec = run_one(model, ids, args.tokens, sampling, draft=draft, options=options)
                rows.append({**base, "loadavg_start": os.getloadavg()[0], "prompt": prompt.id,
                             "n_prompt_tokens": len(ids), "temperature": temp, "setting": setting,
                             "draft": Path(draft).name, "exact": spec["tokens"] == plain["tokens"], **spec})
            for row in rows:
                line = json.dumps({k: v for k, v in row.items() if k != "tokens"})
                print(line, flush=True)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(line + "\n")
                ratio = row["mean_accepted"]
                print(f"# {row['prompt']} T={temp:g} {row['setting']}: {row['n_tokens']} tokens, "
                      f"{row['steps']} steps, {ratio if ratio is None else round(ratio, 2)} tokens/step, "
                      f"{row['tokens_per_s']:.1f} tokens/s" + (f", exact={row['exact']}" if "exact" in row else ""),
                      file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
