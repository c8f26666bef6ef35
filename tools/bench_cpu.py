#!/usr/bin/env python3
"""Decode speed on the CPU, pyspecla against llama.cpp (llama-cpp-python) on the same GGUF file
and the same thread count, measured side by side in one process: the runs alternate
(ours, theirs, ours, ...) so machine noise hits both alike. Writes one JSON row per
(model, runtime) with the median tokens/s, and one row with the ratio.

    python tools/bench_cpu.py MODEL.gguf [MODEL2.gguf ...] --threads 2 --out bench.jsonl

Greedy decoding of --n-decode tokens after a --n-prompt-token prompt; the timed part is the
decode loop only (one forward of one token per step, argmax included)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def append_rows(rows: list[dict], out: str | None) -> None:
    """Append JSON rows, one per line, to `out` when given."""
    if out:
        with open(out, "a") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)


def emit_rows(rows: list[dict], out: str | None) -> None:
    """Print JSON rows, one per line, and append them to `out` when given."""
    for row in rows:
        print(json.dumps(row))
    append_rows(rows, out)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown cpu"


def bench_ours(model, prompt, n_decode) -> tuple[float, list[int]]:
    ctx = model.new_context(n_ctx=len(prompt) + n_decode + 1)
    token = ctx.eval_argmax(prompt)
    out = [token]
    t0 = time.perf_counter()
    for _ in range(n_decode):
        token = ctx.eval_argmax([token])
        out.append(token)
    dt = time.perf_counter() - t0
    ctx.close()
    return n_decode / dt, out


def llama_last_logits(llm) -> np.ndarray:
    """The last evaluated row's logits. (Without logits_all, llama-cpp-python 0.3.36 does not fill
    llm.scores: read them from the context.)"""
    import llama_cpp

    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),))


def bench_llama(llm, prompt, n_decode) -> tuple[float, list[int]]:
    llm.reset()
    llm.eval(prompt)
    token = int(np.argmax(llama_last_logits(llm)))
    out = [token]
    t0 = time.perf_counter()
    for _ in range(n_decode):
        llm.eval([token])
        token = int(np.argmax(llama_last_logits(llm)))
        out.append(token)
    dt = time.perf_counter() - t0
    return n_decode / dt, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="qwen35 GGUF files")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for both runtimes")
    ap.add_argument("--n-prompt", type=int, default=16, help="prompt tokens (default 16)")
    ap.add_argument("--n-decode", type=int, default=32, help="decode steps timed per run (default 32)")
    ap.add_argument("--repeats", type=int, default=3, help="alternating runs per runtime (default 3)")
    ap.add_argument("--no-llama", action="store_true", help="only pyspecla")
    ap.add_argument("--out", default=None, help="append JSON rows to this file (default: stdout only)")
    args = ap.parse_args()

    from pyspecla import Model

    commit, device = git_commit(), f"cpu: {cpu_name()} ({os.cpu_count()} cores)"
    rows = []
    for path in args.models:
        model = Model.load(path, n_threads=args.threads)
        prompt = np.random.default_rng(0).integers(0, model.hparams.n_vocab, args.n_prompt).tolist()
        llm = None
        if not args.no_llama:
            import llama_cpp

            llm = llama_cpp.Llama(model_path=path, n_ctx=args.n_prompt + args.n_decode + 8, n_threads=args.threads,
                                  n_threads_batch=args.threads, flash_attn=False, verbose=False)
        ours, theirs = [], []
        same_tokens = None
        for _ in range(args.repeats):
            speed, our_tokens = bench_ours(model, prompt, args.n_decode)
            ours.append(speed)
            if llm is not None:
                speed, llama_tokens = bench_llama(llm, prompt, args.n_decode)
                theirs.append(speed)
                same_tokens = our_tokens == llama_tokens
        name = Path(path).name
        base = {"commit": commit, "device": device, "model": name, "threads": args.threads,
                "n_prompt": args.n_prompt, "n_decode": args.n_decode, "repeats": args.repeats}
        rows.append({**base, "runtime": "pyspecla", "mode": "decode", "tokens_per_s": statistics.median(ours),
                     "runs": ours})
        if llm is not None:
            rows.append({**base, "runtime": "llama.cpp", "mode": "decode", "tokens_per_s": statistics.median(theirs),
                         "runs": theirs, "llama_cpp_python": llama_cpp.__version__})
            rows.append({**base, "runtime": "ratio", "mode": "decode",
                         "pyspecla_over_llama_cpp": statistics.median(ours) / statistics.median(theirs),
                         "same_greedy_tokens": same_tokens})
            llm.close()
        model.close()
    for row in rows:
        line = json.dumps(row)
        print(line)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
