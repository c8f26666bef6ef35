"""The rows of tools/bench_real.py turned into figures: acceptance per generation, the summary rows
(medians and paired ratios over prompts) and the markdown tables docs/perf.md quotes.

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
  the same for llama.cpp (a batch eval of k tokens, then the KV cache trimmed back)."""

from __future__ import annotations

import statistics

import numpy as np


def acceptance_figures(accepted_per_step, drafted_per_step) -> dict:
    """Per-generation acceptance (see this module's docstring). accepted_per_step: tokens committed by
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


def _describe(row: dict) -> str:
    if row.get("skipped"):
        return f"{row['prompt']} {row['setting']} [{row['eos']}]: skipped ({row['error']})"
    acc = row.get("acceptance_rate")
    return (f"{row['prompt']} {row['setting']} [{row['eos']}]: {row['n_generated']} tokens, "
            f"{row['tokens_per_s']:.2f} tokens/s, {row['mean_accepted']:.2f} tokens/step, acceptance "
            f"{'—' if acc is None else f'{acc:.2f}'}, exact {row.get('exact')}"
            + (f", = pyspecla AR {row['exact_vs_pyspecla_ar']}" if "exact_vs_pyspecla_ar" in row else ""))
