"""The streaming generation API: `Model.generation(...)` returns a `Generation`, an iterator of
`GeneratedToken`s (or, from `Model.chat(stream=True)`, of text pieces) that can be cancelled from
any thread. Plain decoding (`plain_steps`) and speculative decoding (speculative/loop.py) yield the
same tokens for the same SamplingParams and seed (docs/sampling.md)."""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator, NamedTuple

from .errors import UsageError
from .sampling import SamplingParams, TokenSampler, random_seed
from .token_ids import token_id_array

__all__ = ["GeneratedToken", "Generation", "PlainStats", "plain_steps", "resolve_sampling", "start_generation"]


class GeneratedToken(NamedTuple):
    """One generated token.

    id            the token id.
    logprob       its log-probability under the processed target distribution (penalties,
                  filters, temperature; docs/sampling.md). Always given when sampling; when greedy
                  (taken at temperature 1) only with logprobs > 0 or token_logprobs=True, else None.
    top_logprobs  with logprobs = N > 0, the N most likely (id, logprob) of that distribution, best
                  first; else None.
    """

    id: int
    logprob: float | None
    top_logprobs: list[tuple[int, float]] | None


@dataclass
class PlainStats:
    """What plain_steps records (SpecStats' fields that apply to plain decoding)."""

    mode: str = "plain"
    steps: int = 0
    accepted_per_step: list = field(default_factory=list)
    prompt_ms: float = 0.0
    finish_reason: str = ""


def resolve_sampling(sampling: SamplingParams | None) -> SamplingParams:
    """A validated copy of sampling (None: greedy) whose seed is set when it samples (a fresh random
    one when it was None), so every part of one generation draws from the same stream."""
    params = replace(sampling) if sampling is not None else SamplingParams()
    if not isinstance(params, SamplingParams):
        raise UsageError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
    params.validate()
    if params.seed is None and not params.greedy:
        params.seed = random_seed()
    return params


def plain_steps(ctx, prompt_ids, max_tokens: int, stats, sampler: TokenSampler | None = None, eos_ids=(),
                n_top: int = 0, token_logprobs: bool = False, should_stop: Callable[[], bool] | None = None,
                on_prefill: Callable[[int, int], None] | None = None):
    """Plain decoding, one target forward per token, as a generator of one-record lists
    [(token, logprob, top_logprobs)] (the shape speculative_steps yields). Greedy without penalties
    or log-probabilities runs the native argmax and copies no logits. Sets stats.finish_reason
    ("length", "stop", "cancelled") before it ends; should_stop() is asked between prompt chunks
    and before every decode step."""
    sampler = sampler or TokenSampler(SamplingParams())
    want_logits = sampler.needs_logits or n_top > 0 or token_logprobs
    eos = set(eos_ids)
    stop = should_stop or (lambda: False)
    history = [int(t) for t in prompt_ids]
    if max_tokens == 0:
        stats.finish_reason = "length"
        return
    t0 = time.perf_counter()
    out = ctx.prefill(history, want_logits=want_logits, on_progress=on_prefill, should_stop=stop)
    stats.prompt_ms = (time.perf_counter() - t0) * 1e3
    if out is None:
        stats.finish_reason = "cancelled"
        return
    n_new = 0
    while True:
        if want_logits:
            record = sampler.pick(out, history, len(history), n_top=n_top, want_logprob=token_logprobs)
        else:
            record = (int(out), None, None)
        history.append(record[0])
        n_new += 1
        yield [record]
        if record[0] in eos:
            stats.finish_reason = "stop"
            return
        if n_new >= max_tokens:
            stats.finish_reason = "length"
            return
        if stop():
            stats.finish_reason = "cancelled"
            return
        out = ctx.eval([record[0]]) if want_logits else ctx.eval_argmax([record[0]])
        stats.steps += 1
        stats.accepted_per_step.append(1)


class Generation:
    """A running generation: iterate it for GeneratedToken(id, logprob, top_logprobs) — or text
    pieces (str) when it comes from Model.chat(stream=True) — one at a time, as they are decided.
    Create it with Model.generation(...) (or Model.chat); nothing runs until the first next().

    cancel()       thread-safe: the generation stops within one target step (the prompt pass is
                   chunked and checks between chunks), its context is freed, finish_reason becomes
                   "cancelled" and iteration ends. Safe to call at any time, more than once.
    close()        the same without marking a finished generation cancelled; also `with`.
    finish_reason  None while running, then "stop" (an end-of-generation token; it is the last
                   token yielded, not part of chat text), "length" (max_tokens) or "cancelled"
                   (also when a step raised: the exception reaches the iterating caller, the
                   context is freed).
    stats          dict: steps (target passes after the prompt pass), tokens (generated so far),
                   accepted_per_step (tokens each step committed; 1 each when plain),
                   prefill_ms, decode_ms, seed (the sampling seed used; None when greedy), mode.
    token_ids      the ids generated so far (also in text mode).
    """

    def __init__(self, steps: Iterator[list], ctx, stats, seed: int | None, cancelled: threading.Event,
                 text_of=None, keep=()):
        """(Made by start_generation.) steps: the step generator, whose should_stop is
        cancelled.is_set; ctx: its context, finished and freed at the end."""
        self._steps = steps
        self._ctx = ctx
        self._stats = stats
        self._keep = list(keep)          # objects the steps use (a drafter), dropped when finished
        self._seed = seed
        self._buffer: deque = deque()
        self._lock = threading.Lock()    # held while a step runs and while finishing
        self._cancelled = cancelled
        self._text_of = text_of          # text mode: (decoder, hidden ids)
        self._text_tail_done = False
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self._t_first: float | None = None
        self._t_end: float | None = None

    # --- iteration -------------------------------------------------------------------------------
    def __iter__(self):
        return self

    def __next__(self):
        with self._lock:
            while True:
                record = self._next_record()
                if record is None:
                    if self._text_of is not None and not self._text_tail_done:
                        self._text_tail_done = True
                        tail = self._text_of[0].flush()
                        if tail:
                            return tail
                    raise StopIteration
                if self._text_of is None:
                    return GeneratedToken(int(record[0]), record[1], record[2])
                decoder, hidden = self._text_of
                if record[0] in hidden:
                    continue
                piece = decoder.push(record[0])
                if piece:
                    return piece

    def _next_record(self):
        """The next committed record, running a step when none is buffered; None when over."""
        if self.finish_reason is not None:
            return None
        if self._cancelled.is_set():
            self._finish("cancelled")
            return None
        while not self._buffer:
            try:
                records = next(self._steps)
            except StopIteration:
                self._finish(self._stats.finish_reason or "cancelled")
                return None
            except BaseException:
                self._finish("cancelled")
                raise
            if self._t_first is None:
                self._t_first = time.perf_counter()
            if self._cancelled.is_set():
                self._finish("cancelled")
                return None
            self._buffer.extend(records)
        record = self._buffer.popleft()
        self.token_ids.append(int(record[0]))
        return record

    # --- ending ----------------------------------------------------------------------------------
    def cancel(self) -> None:
        """Stop the generation (from any thread); see the class docstring."""
        self._cancelled.set()
        if self._lock.acquire(blocking=False):  # not inside a step: finish here and now
            try:
                if self.finish_reason is None:
                    self._finish("cancelled")
            finally:
                self._lock.release()
        # else the thread running the step sees the flag when the native call returns

    def close(self) -> None:
        """Free the context (a generation not yet over ends as cancelled)."""
        self.cancel()

    def __enter__(self) -> "Generation":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __del__(self):
        try:
            if self.finish_reason is None and not self._lock.locked():
                self._finish("cancelled")
        except Exception:
            pass

    def _finish(self, reason: str) -> None:
        if self.finish_reason is not None:
            return
        self.finish_reason = reason
        self._buffer.clear()
        self._t_end = time.perf_counter()
        self._steps.close()
        if self._ctx is not None:
            try:
                if self._ctx._handle:
                    self._ctx.finish()  # the durable state equals plain decoding of the committed tokens
            finally:
                self._ctx.close()
            self._ctx = None
        self._keep.clear()

    @property
    def stats(self) -> dict:
        s = self._stats
        end = self._t_end or time.perf_counter()
        return {
            "steps": s.steps,
            "tokens": len(self.token_ids),
            "accepted_per_step": list(s.accepted_per_step),
            "prefill_ms": s.prompt_ms,
            "decode_ms": (end - self._t_first) * 1e3 if self._t_first is not None else 0.0,
            "seed": self._seed,
            "mode": s.mode,
        }


# Keyword options of generation(draft=...): the `pyspecla run` flags of the same name.
SPECULATIVE_OPTIONS = ("specla", "no_ddtree", "ddtree_budget", "ddtree_tau", "specla_top_k", "no_chain_seed",
                       "draft_max", "draft_p_min", "draft_vocab")


def start_generation(model, prompt_ids, max_tokens: int, sampling: SamplingParams | None = None, draft=None,
                     stop_at_eos: bool = True, logprobs: int = 0, options: dict | None = None,
                     token_logprobs: bool = False, n_ctx: int | None = None,
                     on_prefill: Callable[[int, int], None] | None = None, text: bool = False) -> Generation:
    """Model.generation's body: checks every argument, loads the drafter and creates the context
    before returning (so a bad argument raises here, not at the first next())."""
    options = dict(options or {})
    if model.closed:
        raise UsageError(f"model {model.file.path} is closed")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise UsageError(f"max_tokens must be an integer >= 0, got {max_tokens!r}")
    if isinstance(logprobs, bool) or not isinstance(logprobs, int) or logprobs < 0:
        raise UsageError(f"logprobs must be an integer >= 0 (the top alternatives to list), got {logprobs!r}")
    prompt = token_id_array(prompt_ids, "the prompt's token ids")
    n_vocab = model.hparams.n_vocab
    if int(prompt.max()) >= n_vocab:
        raise UsageError(f"the prompt's token ids: id {int(prompt.max())} is outside the vocabulary (0..{n_vocab - 1})")
    prompt = prompt.tolist()
    params = resolve_sampling(sampling)
    if n_ctx is not None and (isinstance(n_ctx, bool) or not isinstance(n_ctx, int)
                              or n_ctx < len(prompt) + max_tokens):
        raise UsageError(f"n_ctx {n_ctx!r} cannot hold the {len(prompt)}-token prompt and {max_tokens} new tokens")
    sampler = TokenSampler(params)
    eos = model.tokenizer.eos_ids if stop_at_eos else ()
    cancelled = threading.Event()
    text_of = None
    if text:
        from .tokenizer import StreamingDetokenizer

        text_of = (StreamingDetokenizer(model.tokenizer), set(eos))
    if draft is None:
        if options:
            raise UsageError(f"generation: {', '.join(sorted(options))} need a draft (draft=...)")
        stats = PlainStats()
        ctx = model.new_context(n_ctx=n_ctx or len(prompt) + max_tokens + 1)
        steps = plain_steps(ctx, prompt, max_tokens, stats, sampler=sampler, eos_ids=eos, n_top=logprobs,
                            token_logprobs=token_logprobs, should_stop=cancelled.is_set, on_prefill=on_prefill)
        generation = Generation(steps, ctx, stats, params.seed, cancelled, text_of=text_of)
    else:
        from .speculative.loop import SpecStats, make_context, speculative_steps

        drafter, config = _speculative_setup(model, prompt, max_tokens, draft, options, params)
        ctx = make_context(model, prompt, max_tokens, config, drafter, n_ctx)
        stats = SpecStats(mode=config.mode + ("+specla" if config.specla and config.mode != "ar" else ""),
                          specla=config.specla)
        steps = speculative_steps(model, ctx, prompt, max_tokens, config, stats, drafter=drafter, sampler=sampler,
                                  eos_ids=eos, n_top=logprobs, token_logprobs=token_logprobs,
                                  should_stop=cancelled.is_set, on_prefill=on_prefill)
        generation = Generation(steps, ctx, stats, params.seed, cancelled, text_of=text_of, keep=[drafter])
    return generation


def _speculative_setup(model, prompt: list[int], max_tokens: int, draft, options: dict, params: SamplingParams):
    """(drafter, SpecConfig) for generation(draft=..., **options); names every bad argument."""
    from .speculative.factory import DDTREE_BUDGET, make_drafter, spec_config_from_args

    unknown = sorted(set(options) - set(SPECULATIVE_OPTIONS))
    if unknown:
        raise UsageError(f"generation: unknown option(s) {', '.join(unknown)} (known: {', '.join(SPECULATIVE_OPTIONS)})")
    for name in ("ddtree_budget", "specla_top_k", "draft_max"):  # (their flags refuse these when parsed)
        value = options.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise UsageError(f"generation: {name} must be a positive integer, got {value!r}")
    args = argparse.Namespace(specla=False, no_ddtree=False, ddtree_budget=None, ddtree_tau=None,
                              specla_top_k=None, no_chain_seed=False, draft_max=None, draft_p_min=None,
                              draft_vocab=None)
    vars(args).update(options)
    if isinstance(draft, (str, os.PathLike)):
        args.draft = os.fspath(draft)
        n_ctx = len(prompt) + max_tokens + (args.ddtree_budget or DDTREE_BUDGET) + 64
        drafter = make_drafter(model, args.draft, prompt, max_tokens, n_ctx, draft_max=args.draft_max,
                               draft_p_min=args.draft_p_min, draft_vocab=args.draft_vocab, sampling=params)
    elif callable(getattr(draft, "propose", None)):
        args.draft, drafter = "drafter", draft
        for name in ("draft_max", "draft_p_min", "draft_vocab"):
            if options.get(name) is not None:
                raise UsageError(f"generation: {name} applies to a draft language model given by path, "
                                 f"not to a drafter object")
    else:
        raise UsageError(f"generation: draft must be None, a draft GGUF path, 'ngram[:n=N,max=M]', "
                         f"'oracle:p=P' or a drafter with a propose() method, got {type(draft).__name__}")
    config = spec_config_from_args(args, max_depth=getattr(drafter, "max_depth", 15), drafter=drafter)
    return drafter, config
