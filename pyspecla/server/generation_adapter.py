"""A stand-in for `Model.generation(...)` (the streaming Generation API of the sampling work) over
what the model offers today, so that the server runs before that API lands. To be deleted once
`Model.generation` exists: the engine calls `model.generation` when the model has it.

What it gives, with the same names as the real API:
- plain decoding, greedy or sampled from softmax(logits / temperature) (no top-k/top-p/penalties:
  such requests are refused by the engine before they get here), logprobs of the chosen token and
  the top ones under that distribution;
- a draft (greedy only): the whole speculative generation runs at the first step and the tokens
  are then handed out one by one, so cancelling stops it only once it is done;
- cancel() from any thread: a flag read between prefill chunks and between steps; the thread
  that iterates frees the context when it sees it."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from ..errors import UsageError


@dataclass
class GeneratedToken:
    id: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None


try:
    from ..sampling import SamplingParams
except ImportError:  # before the sampling work: the same fields, checked here
    @dataclass
    class SamplingParams:
        temperature: float = 0.0
        top_k: int = 0
        top_p: float = 1.0
        min_p: float = 0.0
        repeat_penalty: float = 1.0
        presence_penalty: float = 0.0
        frequency_penalty: float = 0.0
        penalty_last_n: int = 64
        seed: int | None = None

        @property
        def greedy(self) -> bool:
            return self.temperature == 0.0

        def validate(self) -> None:
            import math

            if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)
                    and self.temperature >= 0):
                raise UsageError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
            defaults = SamplingParams(temperature=self.temperature, seed=self.seed)
            for name in ("top_k", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty"):
                if self.temperature > 0 and getattr(self, name) != getattr(defaults, name):
                    raise UsageError(f"{name} needs the sampling API (not merged yet)")


class _Cancelled(Exception):
    pass


class AdapterGeneration:
    def __init__(self, model, prompt_ids, max_tokens: int, sampling=None, draft=None, stop_at_eos: bool = True,
                 logprobs: int = 0, **speculative_options):
        self.model = model
        self.prompt = [int(t) for t in prompt_ids]
        self.max_tokens = int(max_tokens)
        self.temperature = float(getattr(sampling, "temperature", 0.0) or 0.0)
        self.seed = getattr(sampling, "seed", None)
        self.draft = draft
        self.options = speculative_options
        self.eos = model.tokenizer.eos_ids if stop_at_eos else set()
        self.logprobs = int(logprobs)
        if draft is not None and self.temperature > 0:
            raise UsageError("temperature > 0 with a draft needs the sampling API (not merged yet)")
        self.finish_reason: str | None = None
        self.stats = {"steps": 0, "tokens": 0, "accepted_per_step": [], "prefill_ms": 0.0, "decode_ms": 0.0}
        self._cancel = threading.Event()
        self._ctx = None
        self._pending: list[int] | None = None
        self._emitted = 0
        self._rng = np.random.default_rng(self.seed)
        self._spec_tokens: list[int] | None = None

    def cancel(self) -> None:
        self._cancel.set()

    def __iter__(self):
        return self

    def _close(self, reason: str) -> None:
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None
        if self.finish_reason is None:
            self.finish_reason = reason

    def _check_cancel(self, *_):
        if self._cancel.is_set():
            raise _Cancelled

    def _token_from_logits(self, ctx, logits) -> GeneratedToken:
        z = logits.astype(np.float64)
        if self.temperature > 0:
            z = z / self.temperature
        logp = z - z.max()
        logp -= np.log(np.exp(logp).sum())
        if self.temperature > 0:
            p = np.exp(logp)
            index = int(self._rng.choice(len(p), p=p / p.sum()))
        else:
            index = int(np.argmax(logp))
        top = None
        if self.logprobs > 0:
            order = np.argsort(-logp, kind="stable")[: self.logprobs]
            top = [(ctx.token_of(int(i)), float(logp[i])) for i in order]
        return GeneratedToken(ctx.token_of(index), float(logp[index]), top)

    def __next__(self) -> GeneratedToken:
        import time

        if self.finish_reason is not None:
            raise StopIteration
        try:
            self._check_cancel()
            if self._emitted >= self.max_tokens:
                self._close("length")
                raise StopIteration
            if self.draft is not None:
                return self._next_speculative()
            t0 = time.perf_counter()
            if self._ctx is None:
                self._ctx = self.model.new_context(n_ctx=len(self.prompt) + self.max_tokens + 1)
                pending = self.prompt
            else:
                pending = self._pending
            ctx = self._ctx
            if self.temperature == 0 and self.logprobs == 0:
                token = GeneratedToken(ctx.eval_argmax(pending, on_progress=self._check_cancel))
            else:
                if len(pending) > 1:  # prefill in chunks, the cancel flag read between them
                    ctx.eval_argmax(pending[:-1], on_progress=self._check_cancel)
                    self._check_cancel()
                token = self._token_from_logits(ctx, ctx.eval(pending[-1:]))
            elapsed = (time.perf_counter() - t0) * 1e3
            self.stats["prefill_ms" if self._emitted == 0 else "decode_ms"] += elapsed
            self.stats["steps"] += 1 if self._emitted else 0
            self._pending = [token.id]
            self._emitted += 1
            self.stats["tokens"] = self._emitted
            if self._emitted > 1:
                self.stats["accepted_per_step"].append(1)
            if token.id in self.eos:
                self._close("stop")
            return token
        except _Cancelled:
            self._close("cancelled")
            raise StopIteration from None

    def _next_speculative(self) -> GeneratedToken:
        if self._spec_tokens is None:
            self._spec_tokens = self.model.generate(self.prompt, self.max_tokens, stop_at_eos=bool(self.eos),
                                                    draft=self.draft, **self.options)
        if self._emitted >= len(self._spec_tokens):
            self._close("stop" if self._spec_tokens and self._spec_tokens[-1] in self.eos else "length")
            raise StopIteration
        token = self._spec_tokens[self._emitted]
        self._emitted += 1
        self.stats["tokens"] = self._emitted
        if token in self.eos or self._emitted >= self.max_tokens:
            self._close("stop" if token in self.eos else "length")
        return GeneratedToken(int(token))


def start_generation(model, prompt_ids, max_tokens, sampling=None, draft=None, stop_at_eos=True, logprobs=0,
                     **speculative_options):
    """model.generation(...) where the model has it, else the adapter above."""
    generation = getattr(model, "generation", None)
    if generation is not None:
        return generation(prompt_ids, max_tokens, sampling=sampling, draft=draft, stop_at_eos=stop_at_eos,
                          logprobs=logprobs, **speculative_options)
    return AdapterGeneration(model, prompt_ids, max_tokens, sampling=sampling, draft=draft, stop_at_eos=stop_at_eos,
                             logprobs=logprobs, **speculative_options)
