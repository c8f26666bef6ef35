"""How many tokens a run's context holds, and how many new tokens fit in it (-c/--ctx-size, -n).

The rules, as a llama.cpp user expects them:
- The context counts the prompt and the generated tokens. Without -c it is prompt + n_predict,
  capped by the model's trained context length (its `context_length` key).
- -c larger than the trained context is allowed, with a warning line: positions past it were
  never trained on and the output usually degrades.
- A prompt that fills the whole context is an error naming both lengths.
- When prompt + n_predict does not fit, generation stops at the end of the context (n_predict is
  capped, with a note), as llama.cpp stops when its context is full.

A speculative run gives the target's context room for one verify tree past these tokens; that room
is the loop's business (speculative/loop.py), not counted here."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from .errors import UsageError

# Positions are int32 on the native side and a context allocates its KV cache up front; no qwen35
# model is trained on anywhere near this, so a larger -c is a typo, not a request.
MAX_CTX_SIZE = 1 << 24

# A prompt at least this long prints prefill progress (one updating stderr line).
PROGRESS_MIN_TOKENS = 256


@dataclass(frozen=True)
class ContextPlan:
    n_ctx: int                  # tokens the context holds: the prompt and every generated token
    n_predict: int              # new tokens to generate: the asked number, or what still fits
    warnings: list[str] = field(default_factory=list)  # lines for stderr (already worded)


def plan_context(n_prompt: int, n_predict: int, ctx_size: int | None, n_ctx_train: int,
                 flag: str = "-c/--ctx-size") -> ContextPlan:
    """The context for a prompt of n_prompt tokens and n_predict new ones. ctx_size: the user's
    -c (None: prompt + n_predict, capped by n_ctx_train). Raises UsageError when the prompt leaves
    no room for a new token, or ctx_size is out of range."""
    warnings = []
    if ctx_size is not None:
        if ctx_size < 1 or ctx_size > MAX_CTX_SIZE:
            raise UsageError(f"{flag} must be in [1, {MAX_CTX_SIZE}], got {ctx_size}")
        n_ctx = ctx_size
        if ctx_size > n_ctx_train:
            warnings.append(f"warning: {flag} {ctx_size} is larger than the model's trained context "
                            f"({n_ctx_train} tokens); output past {n_ctx_train} tokens may degrade")
    else:
        n_ctx = min(n_prompt + n_predict, n_ctx_train)
    if n_prompt >= n_ctx:
        where = f"{flag} {ctx_size}" if ctx_size is not None else f"the model's trained context, {n_ctx_train}"
        raise UsageError(f"the prompt is {n_prompt} tokens but the context holds {n_ctx} ({where}): "
                         f"no room for a new token; shorten the prompt"
                         + (" or raise -c" if ctx_size is not None else " or give a larger -c"))
    if n_prompt + n_predict > n_ctx:
        fits = n_ctx - n_prompt
        warnings.append(f"note: the context holds {n_ctx} tokens and the prompt is {n_prompt}: generating at "
                        f"most {fits} new token{'s' if fits > 1 else ''}, not {n_predict}")
        n_predict = fits
    return ContextPlan(n_ctx, n_predict, warnings)


def plan_run_context(model, n_prompt: int, args):
    """args' -c/-n against the prompt and the model's trained context (context_size.py); prints
    its warning lines."""
    plan = plan_context(n_prompt, args.n_predict, args.ctx_size, model.hparams.n_ctx_train)
    for line in plan.warnings:
        print(f"pyspecla: {line}", file=sys.stderr)
    return plan


def prefill_progress(n_prompt: int, err=None):
    """For a long prompt, a callback(done, total) keeping one stderr line up to date during the
    prompt pass; None for a short one."""
    if n_prompt < PROGRESS_MIN_TOKENS:
        return None
    err = err or sys.stderr

    def show(done: int, total: int) -> None:
        err.write(f"\rprompt: {done}/{total} tokens" + ("\n" if done >= total else ""))
        err.flush()

    return show
