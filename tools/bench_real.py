#!/usr/bin/env python3
"""Speculative decoding on real prompts and real weights, pyspecla against llama.cpp
(llama-cpp-python), greedy only, per prompt. Never run in CI (it downloads prompt packages and
needs the real GGUF files); tests import only its pure helpers and run its pyspecla part on tiny
synthetic models.

    python tools/fetch_models.py qwen2.5-coder
    python tools/bench_real.py --threads 2 --tokens 128 --llama \\
        --out results/bench-real-spec.jsonl --markdown results/bench-real-spec.md

Prompts (tools/prompts_real.py): HumanEval/0-9 as raw completions (the prompt text byte for byte,
final newline kept) and five MT-Bench first turns through the file's chat template
(--prompts humaneval:0-9,mtbench:5). Both runtimes get the same token ids (pyspecla's tokenizer;
the rows record whether llama.cpp's tokenizer gives the same ids).

Settings (--settings; one row per setting, prompt and EOS handling):
  ar            pyspecla plain greedy decoding (the reference of every `exact` field)
  ngram-chain   pyspecla, n-gram prompt lookup (--ngram, default `ngram`: n 3, at most 10 tokens),
                top-1 chain
  ngram-ddtree  the same drafter, DDTree (budget 22, tau 6, top-4)
  draft-chain   pyspecla, the autoregressive draft model (--draft, default the 0.5B file) through
                pyspecla.speculative.factory.make_drafter; a setting whose drafter cannot be built or run is
                recorded as skipped, with the error; --draft-max / --draft-p-min reach
                make_drafter only when given (else its defaults); the rows record what was used
  draft-ddtree  the same, DDTree
  A draft setting may carry its own draft options, so variants run side by side in one run:
  `draft-chain:vocab=0/max=6/p=0.6` (vocab = --draft-vocab, max = --draft-max, p = --draft-p-min);
  DDTree settings take budget and topk (`draft-ddtree:budget=6/topk=2`).
With --llama (--llama-settings, default ar,lookup,draft):
  llama-ar      llama.cpp greedy, one token per eval, argmax of the last logits
  llama-lookup  prompt lookup: llama_cpp.llama_speculative.LlamaPromptLookupDecoding's proposal
                function (--llama-lookup-ngram 3, --llama-lookup-tokens 10: the pyspecla ngram
                defaults) driven by the greedy verify loop below
  llama-draft:n=N,p=P  llama.cpp's draft-model scheme (common/speculative.cpp + the
                speculative-simple example): the 0.5B draft proposes greedily up to N tokens, stopping
                when its top-1 probability (softmax over its top-10 logits, as llama.cpp's draft
                sampler computes it) is below P; the target evaluates [last token + drafts] in one
                batch with logits for every row; the longest prefix where the target's argmax equals
                the draft is accepted, plus the target's next token; both KV caches drop the rest.
                --llama-n-max / --llama-p-min take comma lists (a sweep); default 4 and 0.75.
With --llama-speculative-bin PATH (llama.cpp's own llama-speculative-simple program, e.g. built from
the llama.cpp tree that llama-cpp-python's source package vendors):
  llama-bin-draft:n=N,p=P  that program with the 0.5B draft, greedy, per --llama-n-max x --llama-p-min,
                one process per prompt and setting (models loaded before its clock starts); figures are
                the ones it prints (decoded tokens / seconds, n_drafted, n_accept); stop at EOS only
                (it always stops there; it may run a few tokens past --tokens). `exact` compares its
                printed text with the AR tokens' text (equal, or starting with it when AR reached
                --tokens without EOS). It runs its own draft scheme (the draft model also evaluates
                each verify batch), so its speed can differ from llama-draft's.
EOS: --stop-at-eos (stop after an end-of-generation token, as a user would) and --past-eos (ignore
it, always --tokens tokens); neither flag = both. The EOS set is pyspecla's tokenizer's, for both
runtimes.

Row fields and summary rows: tools/bench_real_report.py.

Timing: time.perf_counter around the decode loop only (argmax, drafting and bookkeeping included;
the prompt pass excluded and reported as prompt_ms). A draft model reads the prompt before the
clock starts in both runtimes (draft_prompt_ms; pyspecla: prefill_draft, through the drafter's
history hook), as llama.cpp's server does; the ngram drafters index it inside the clock. One warm-up
generation per runtime/drafter precedes the timed runs. Settings run back to back per prompt so
machine noise hits all alike. On a shared machine use --threads 1 (see docs/perf.md)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_cpu import cpu_name, git_commit  # noqa: E402
from bench_real_llama import (  # noqa: E402
    LLAMA_SETTINGS,
    LlamaBaseline,
    bench_llama_binary_prompt,
    llama_binary_command,
    run_llama_binary,
    verify_cost_llama,
)
from bench_real_pyspecla import (  # noqa: E402
    PYSPECLA_SETTINGS,
    SpecOptions,
    _log,
    bench_pyspecla_prompt,
    parse_setting,
    run_pyspecla,
    verify_cost_pyspecla,
)
from bench_real_report import markdown_report, summarize  # noqa: E402
from prompts_real import load_prompts, prompt_text  # noqa: E402


def git_dirty() -> bool | None:
    """Whether tracked files differ from the commit (the rows' `commit` then does not name the code)."""
    try:
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True, cwd=Path(__file__).parent)
    except OSError:
        return None
    return bool(status.stdout.strip()) if status.returncode == 0 else None


def default_model_dir() -> Path:
    return Path(os.environ.get("PYSPECLA_MODELS", Path.home() / ".cache" / "pyspecla" / "models"))


DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def _parse_list(text: str, cast=str) -> list:
    return [cast(x.strip()) for x in text.split(",") if x.strip()]


def eos_modes(args) -> list[str]:
    modes = [m for m, on in (("stop", args.stop_at_eos), ("past", args.past_eos)) if on]
    return modes or ["stop", "past"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default=None, help=f"target GGUF (default <cache>/{DEFAULT_TARGET})")
    ap.add_argument("--draft", default=None,
                    help=f"draft GGUF for draft-* and llama-draft (default <cache>/{DEFAULT_DRAFT})")
    ap.add_argument("--prompts", default="humaneval:0-9,mtbench:5", help="prompt spec (tools/prompts_real.py)")
    ap.add_argument("--tokens", type=int, default=128, help="tokens to generate per prompt (default 128)")
    ap.add_argument("--threads", type=int, default=2, help="threads for both runtimes (default 2)")
    ap.add_argument("--settings", default=",".join(PYSPECLA_SETTINGS),
                    help="pyspecla settings (comma list); ar always runs: it is the reference of `exact`")
    ap.add_argument("--ngram", default="ngram", help="the n-gram drafter spec (default ngram: n 3, max 10)")
    ap.add_argument("--draft-max", type=int, default=None,
                    help="draft-*: most tokens the draft model proposes per step (default: make_drafter's)")
    ap.add_argument("--draft-p-min", type=float, default=None,
                    help="draft-*: the draft model stops below this top-1 probability (default: make_drafter's)")
    ap.add_argument("--draft-vocab", type=int, default=None,
                    help="draft-*: the draft model scores this many frequent ids + the context's (0 = all; "
                         "default: make_drafter's)")
    ap.add_argument("--budget", type=int, default=22, help="tree nodes besides the root (default 22)")
    ap.add_argument("--tau", type=float, default=6.0, help="DDTree confidence window (default 6; negative = off)")
    ap.add_argument("--top-k", type=int, default=4, help="DDTree candidates per depth (default 4)")
    ap.add_argument("--stop-at-eos", action="store_true", help="stop at an end-of-generation token")
    ap.add_argument("--past-eos", action="store_true", help="ignore EOS, always --tokens tokens")
    ap.add_argument("--llama", action="store_true", help="also run llama.cpp (llama-cpp-python)")
    ap.add_argument("--llama-settings", default=",".join(LLAMA_SETTINGS), help="with --llama: ar,lookup,draft")
    ap.add_argument("--llama-n-max", default="4", help="llama-draft: most draft tokens per step (comma list)")
    ap.add_argument("--llama-p-min", default="0.75", help="llama-draft: least draft top-1 probability (comma list)")
    ap.add_argument("--llama-speculative-bin", default=None, metavar="PATH",
                    help="llama.cpp's llama-speculative-simple program: adds llama-bin-draft rows (stop at EOS "
                         "only; one per --llama-n-max x --llama-p-min)")
    ap.add_argument("--llama-lookup-ngram", type=int, default=3)
    ap.add_argument("--llama-lookup-tokens", type=int, default=10)
    ap.add_argument("--no-verify-cost", action="store_true", help="skip the k-node verify timing")
    ap.add_argument("--verify-k", default="1,2,4,5,8,16")
    ap.add_argument("--verify-repeats", type=int, default=7)
    ap.add_argument("--out", default=None, help="append JSON rows to this file")
    ap.add_argument("--markdown", default=None, help="write the markdown tables to this file")
    args = ap.parse_args(argv)

    settings = _parse_list(args.settings)
    unknown = []
    for s_ in settings:
        try:
            parse_setting(s_, SpecOptions())
        except ValueError as exc:
            unknown.append(str(exc))
    llama_settings = _parse_list(args.llama_settings) if args.llama else []
    llama_settings = sorted(set(llama_settings), key=lambda s: LLAMA_SETTINGS.index(s) if s in LLAMA_SETTINGS else 9)
    unknown += [f"llama:{s}" for s in llama_settings if s not in LLAMA_SETTINGS]
    if unknown:
        ap.error(f"unknown settings {unknown}; pyspecla: {list(PYSPECLA_SETTINGS)}, llama: {list(LLAMA_SETTINGS)}")
    model_path = Path(args.model) if args.model else default_model_dir() / DEFAULT_TARGET
    draft_path = Path(args.draft) if args.draft else default_model_dir() / DEFAULT_DRAFT
    binary = Path(args.llama_speculative_bin) if args.llama_speculative_bin else None
    if binary is not None and not os.access(binary, os.X_OK):
        ap.error(f"--llama-speculative-bin {binary}: not an executable file")
    for path, needed in ((model_path, True), (draft_path, "draft" in llama_settings or binary is not None)):
        if needed and not path.exists():
            ap.error(f"{path} absent (python tools/fetch_models.py qwen2.5-coder)")

    from pyspecla import Model

    prompts = load_prompts(args.prompts)
    model = Model.load(str(model_path), n_threads=args.threads)
    prompt_ids = {p.id: model.tokenize(prompt_text(p, model.tokenizer)) for p in prompts}
    options = SpecOptions(budget=args.budget, tau=args.tau if args.tau >= 0 else None, top_k=args.top_k,
                          ngram=args.ngram, draft=str(draft_path), draft_max=args.draft_max,
                          draft_p_min=args.draft_p_min, draft_vocab=args.draft_vocab)
    base = {"commit": git_commit(), "dirty": git_dirty(), "device": f"cpu: {cpu_name()} ({os.cpu_count()} cores, {args.threads} threads)",
            "threads": args.threads, "loadavg_start": os.getloadavg()[0], "model": model_path.name,
            "max_tokens": args.tokens}
    rows: list[dict] = []

    def record(new_rows):
        for row in new_rows:
            rows.append(row)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")

    # warm-up (page in the weights, first-call costs), not recorded
    first_ids = prompt_ids[prompts[0].id]
    for setting in dict.fromkeys(["ar"] + settings):
        run_pyspecla(model, setting, first_ids, 4, set(), options)

    n_max_list = _parse_list(args.llama_n_max, int)
    p_min_list = _parse_list(args.llama_p_min, float)
    llama = None
    if llama_settings:
        llama = LlamaBaseline(model_path, draft_path, llama_settings, args.threads,
                              max(len(ids) for ids in prompt_ids.values()) + args.tokens, n_max_list, p_min_list,
                              args.llama_lookup_ngram, args.llama_lookup_tokens)
        llama.check_tokenizer({p.id: prompt_text(p, model.tokenizer) for p in prompts}, prompt_ids)
        llama.warm_up(first_ids)
        base["llama_cpp_python"] = llama.version

    n_ctx_binary = max(len(ids) for ids in prompt_ids.values()) + args.tokens + max(n_max_list) + 16
    prompt_text_by_id = {p.id: prompt_text(p, model.tokenizer) for p in prompts}

    def binary_command(prompt_id, n_predict, n_max, p_min):
        return llama_binary_command(binary, model_path, draft_path, prompt_text_by_id[prompt_id], n_predict,
                                    args.threads, n_max, p_min, n_ctx_binary)

    if binary is not None:  # warm-up, not recorded
        run_llama_binary(binary_command(prompts[0].id, 4, n_max_list[0], p_min_list[0]),
                         model.tokenizer.decode_bytes(prompt_ids[prompts[0].id]))
        base["llama_binary"] = binary.name

    for eos in eos_modes(args):
        for p in prompts:
            ids = prompt_ids[p.id]
            py_rows = bench_pyspecla_prompt(model, p, ids, settings, args.tokens, eos, options, base)
            record(py_rows)
            py_ar = next(r["tokens"] for r in py_rows if r["setting"] == "ar")
            eos_ids = model.tokenizer.eos_ids if eos == "stop" else set()
            llama_ar = None
            if llama is not None:
                llama_ar = llama.bench_prompt(p, ids, args.tokens, eos, eos_ids, py_ar, base, record)
            if binary is not None and eos == "stop":
                record(bench_llama_binary_prompt(p, ids, model.tokenizer, binary_command, n_max_list, p_min_list,
                                                 args.tokens, eos_ids, py_ar, llama_ar, base, draft_path.name))

    if not args.no_verify_cost:
        p = prompts[0]
        past = [r for r in rows if r["prompt"] == p.id and r["setting"] == "ar" and r["runtime"] == "pyspecla"]
        continuation = max((r["tokens"] for r in past), key=len)
        ks = _parse_list(args.verify_k, int)
        cost = verify_cost_pyspecla(model, prompt_ids[p.id], continuation, ks, args.verify_repeats)
        if llama is not None:
            cost += verify_cost_llama(llama.llm, prompt_ids[p.id], continuation, ks, args.verify_repeats)
        cost = [{**base, "prompt": p.id, **r} for r in cost]
        record(cost)
        for r in cost:
            _log(f"verify cost {r['runtime']} k={r['k']}: {r['verify_ms']:.1f} ms = "
                 f"{r['verify_in_decode_steps']:.2f} decode steps ({r['decode_step_ms']:.1f} ms)")

    summary = summarize(rows)
    record(summary)
    for row in rows:
        print(json.dumps(row))
    report = markdown_report(rows, summary)
    if args.markdown:
        Path(args.markdown).write_text(report)
    print(report, file=sys.stderr)
    if llama is not None:
        llama.close()
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
