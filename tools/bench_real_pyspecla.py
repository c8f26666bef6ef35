"""The pyspecla side of tools/bench_real.py: its settings (plain decoding, n-gram and draft-model
drafters, chain or DDTree), one generation per setting and prompt, and the k-node verify cost."""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench_real_report import _describe, acceptance_figures, first_difference
from prompts_real import Prompt

PYSPECLA_SETTINGS = {  # name: (drafter kind, loop mode)
    "ar": (None, "ar"),
    "ngram-chain": ("ngram", "chain"),
    "ngram-ddtree": ("ngram", "ddtree"),
    "draft-chain": ("draft", "chain"),
    "draft-ddtree": ("draft", "ddtree"),
}


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


def run_plain(model, prompt_ids, max_tokens: int, eos_ids) -> dict:
    """Plain greedy decoding through the plain path (Context.eval_argmax of one token per step, as
    Model.stream does), not through the speculative loop, whose 1-node verify + accept per token is
    slower: this is the denominator every "vs our AR" ratio divides by. Timed like the loop: the
    prompt pass apart, decode from the first emitted token on."""
    eos = set(eos_ids)
    out: list[int] = []
    ctx = model.new_context(n_ctx=len(prompt_ids) + max_tokens + 1)
    try:
        t0 = time.perf_counter()
        token = ctx.eval_argmax(list(prompt_ids)) if max_tokens > 0 else None
        prompt_ms = (time.perf_counter() - t0) * 1e3
        t_decode = time.perf_counter()
        while token is not None:
            out.append(int(token))
            if token in eos or len(out) >= max_tokens:
                break
            token = ctx.eval_argmax([token])
        decode_s = time.perf_counter() - t_decode
    finally:
        ctx.close()
    steps = max(len(out) - 1, 0)
    figures = acceptance_figures([1] * steps, [0] * steps)
    return {"tokens": out, "tokens_per_s": steps / decode_s if decode_s > 0 else 0.0, "prompt_ms": prompt_ms,
            "decode_s": decode_s, "draft_ms": 0.0, "verify_ms": 0.0, "mean_tree_nodes": None, "drafter": None,
            "draft_max_depth": None, "draft_p_min": None, "draft_prompt_ms": None, "draft_vocab": None,
            "plain_path": True, **figures}


def run_pyspecla(model, setting: str, prompt_ids, max_tokens: int, eos_ids, options: SpecOptions) -> dict:
    """One generation. Returns figures + tokens, or {'skipped': True, 'error': ...} when a draft-model
    drafter cannot be built or run. The setting "ar" runs the plain path (run_plain)."""
    from pyspecla.speculative.factory import make_drafter
    from pyspecla.speculative.loop import SpecConfig, generate

    kind, mode, options = parse_setting(setting, options)
    if kind is None:
        return run_plain(model, prompt_ids, max_tokens, eos_ids)
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


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


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
