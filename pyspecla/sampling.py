"""Sampling settings and the sampler that stays exact under speculative decoding (docs/sampling.md).

Two pieces make a speculative run emit the very tokens a plain run emits with the same seed:

- The random number for the token at absolute sequence position p (prompt tokens count; the first
  generated token sits at position len(prompt)) is `keyed_uniform(seed, p)`, a pure function of
  (seed, p): the p-th output of SplitMix64 started from a state derived from the seed. No generator
  is advanced per call, so it does not matter how many candidates a speculative step looked at.
- The token is the inverse CDF, in token-id order, of the processed distribution at that position
  (`processed_logits` then `probabilities`, all in float64), read at that uniform. The processing
  depends only on the logits and on the token history, both of which a verified tree node has bit
  for bit as plain decoding has them.

Processing order (llama.cpp's default sampler chain): repetition / frequency / presence penalties
over the last `penalty_last_n` tokens of the history (prompt included) → top-k → top-p → min-p →
temperature → softmax. top-p and min-p look at the distribution at temperature 1, as llama.cpp's
do. Temperature 0 is greedy: the argmax of the penalised logits (ties to the lowest id, like the
native argmax), no random number drawn.
"""

from __future__ import annotations

import math
import numbers
from collections import Counter
from dataclasses import dataclass, fields
from typing import Sequence

import numpy as np

from .errors import UsageError
from .ranking import largest_ids

__all__ = ["SamplingParams", "TokenSampler", "keyed_uniform", "processed_logits", "probabilities",
           "inverse_cdf", "random_seed"]

_MASK64 = (1 << 64) - 1
_GOLDEN_GAMMA = 0x9E3779B97F4A7C15
SEED_LIMIT = 1 << 64  # seeds are integers in [0, 2**64)


def _splitmix64_finalize(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def keyed_uniform(seed: int, position: int) -> float:
    """A uniform number in [0, 1) that depends on (seed, position) only.

    SplitMix64 (Steele, Lea & Flood 2014) started at state s0 = finalize(seed + gamma) gives as its
    p-th output (p = 0, 1, ...) finalize(s0 + (p + 1) * gamma mod 2**64); this is that output's top
    53 bits over 2**53. Random access into one well-tested stream per seed, in plain integer
    arithmetic, so any implementation (C, a GPU kernel) can reproduce it."""
    state = _splitmix64_finalize((seed + _GOLDEN_GAMMA) & _MASK64)
    word = _splitmix64_finalize((state + (position + 1) * _GOLDEN_GAMMA) & _MASK64)
    return (word >> 11) * (1.0 / (1 << 53))


def random_seed() -> int:
    """A fresh seed for a generation that was given none (recorded in its stats)."""
    import secrets

    return secrets.randbits(63)


@dataclass
class SamplingParams:
    """How the next token is chosen from the target's logits. The defaults are greedy decoding.

    temperature        0 = greedy (argmax); > 0 divides the logits before the softmax.
    top_k              keep the k most likely tokens (0 = all).
    top_p              keep the smallest set of most likely tokens whose probability reaches top_p
                       (1.0 = all).
    min_p              keep tokens at least min_p times as likely as the most likely one (0 = all).
    repeat_penalty     a logit of a token in the penalty window is divided by it when positive,
                       multiplied when negative (1.0 = off).
    presence_penalty   subtracted once from a token present in the window (0 = off).
    frequency_penalty  subtracted once per occurrence in the window (0 = off).
    penalty_last_n     the window: the last N tokens of prompt + output (0 = no penalties, -1 = all).
    seed               the random stream's key, an integer in [0, 2**64); None = a fresh random one
                       per generation (reported in its stats).

    The filters keep at least one token; ties at a top-k or top-p boundary keep the lower ids.
    `validate()` raises UsageError naming the bad field; `greedy` is temperature == 0.
    """

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
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Whether any penalty changes the logits."""
        return self.penalty_last_n != 0 and (self.repeat_penalty != 1.0 or self.presence_penalty != 0.0
                                             or self.frequency_penalty != 0.0)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def validate(self) -> "SamplingParams":
        """Raise UsageError naming the first bad field; returns self."""
        def number(name, low=None, high=None, low_open=False):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise UsageError(f"sampling: {name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise UsageError(f"sampling: {name} must be finite, got {value!r}")
            if low is not None and (value <= low if low_open else value < low):
                raise UsageError(f"sampling: {name} must be {'>' if low_open else '>='} {low:g}, got {value!r}")
            if high is not None and value > high:
                raise UsageError(f"sampling: {name} must be <= {high:g}, got {value!r}")

        def integer(name, low):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise UsageError(f"sampling: {name} must be an integer, got {value!r}")
            if value < low:
                raise UsageError(f"sampling: {name} must be >= {low}, got {value!r}")

        number("temperature", 0.0)
        integer("top_k", 0)
        number("top_p", 0.0, 1.0, low_open=True)
        number("min_p", 0.0, 1.0)
        number("repeat_penalty", 0.0, low_open=True)
        number("presence_penalty")
        number("frequency_penalty")
        integer("penalty_last_n", -1)
        if self.seed is not None:
            integer("seed", 0)
            if self.seed >= SEED_LIMIT:
                raise UsageError(f"sampling: seed must be < 2**64, got {self.seed!r}")
        return self


def penalty_window(history: Sequence[int], penalty_last_n: int) -> Sequence[int]:
    if penalty_last_n < 0:
        return history
    return history[len(history) - penalty_last_n:] if penalty_last_n < len(history) else history


def processed_logits(logits: np.ndarray, history: Sequence[int], params: SamplingParams) -> np.ndarray:
    """float64 logits after penalties, top-k, top-p and min-p (removed tokens are -inf), before the
    temperature. `logits`: one row over the whole vocabulary, in id order."""
    x = np.array(logits, dtype=np.float64)  # a copy: the caller's row stays as it was
    if params.penalized:
        counts = Counter(int(t) for t in penalty_window(history, params.penalty_last_n))
        if counts:
            ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
            n = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
            v = x[ids]
            if params.repeat_penalty != 1.0:
                v = np.where(v > 0, v / params.repeat_penalty, v * params.repeat_penalty)
            x[ids] = v - (n * params.frequency_penalty + params.presence_penalty)
    V = len(x)
    if 0 < params.top_k < V:
        _keep_only(x, largest_ids(x, params.top_k))
    if params.top_p < 1.0:
        _top_p(x, params.top_p)
    if params.min_p > 0.0:
        best = x.max()
        x[x < best + math.log(params.min_p)] = -np.inf
    return x


def _keep_only(x: np.ndarray, keep: np.ndarray) -> None:
    mask = np.ones(len(x), dtype=bool)
    mask[keep] = False
    x[mask] = -np.inf


# The top-p cut sorts only the most likely tokens when they already hold top_p of the mass.
_TOP_P_CANDIDATES = 1024


def _top_p(x: np.ndarray, top_p: float) -> None:
    p = _softmax(x)
    V = len(x)
    order = None
    if V > _TOP_P_CANDIDATES:
        # every token with p above the candidates' smallest sorts before every other token; when
        # those already reach top_p, the cut falls among them and the rest need no sorting
        part = np.argpartition(p, V - _TOP_P_CANDIDATES)[V - _TOP_P_CANDIDATES:]
        floor = p[part].min()
        above = part[p[part] > floor]
        candidates = above[np.lexsort((above, -p[above]))]
        cumulative = np.cumsum(p[candidates])  # the same sums as the full order's first entries
        if len(candidates) and cumulative[-1] >= top_p:
            order = candidates
    if order is None:
        order = np.lexsort((np.arange(V), -p))
        cumulative = np.cumsum(p[order])
    n_keep = int(np.searchsorted(cumulative, top_p, side="left")) + 1  # first prefix reaching top_p
    _keep_only(x, order[:min(n_keep, V)])


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def probabilities(processed: np.ndarray, temperature: float) -> np.ndarray:
    """The final distribution (float64, sums to 1) from processed logits at temperature > 0: the
    probabilities TokenSampler.pick draws from."""
    return np.exp(_log_softmax(processed / temperature))


def inverse_cdf(p: np.ndarray, u: float) -> int:
    """The token whose cumulative-probability interval, in id order, holds u * total; never a
    token of probability 0."""
    cumulative = np.cumsum(p)
    index = int(np.searchsorted(cumulative, u * cumulative[-1], side="right"))
    if index >= len(p):  # u * total rounded up to the total: the last token that can be drawn
        index = int(np.flatnonzero(p)[-1])
    return index


class TokenSampler:
    """Chooses tokens for one generation: `params` with the seed resolved (`seed`).

    pick(logits, history, position, n_top, want_logprob) -> (token, logprob, top): history is every
    token before the one chosen (prompt + output so far), position its absolute index (len(history)).
    logprob is the chosen token's log-probability under the processed distribution: always when
    sampling; when greedy (where it is taken at temperature 1) only with want_logprob or n_top > 0,
    else None. top lists the n_top most likely (id, logprob), best first, ties to the lower id, or
    is None when n_top is 0."""

    def __init__(self, params: SamplingParams):
        params.validate()
        self.params = params
        self.seed = params.seed if params.seed is not None else (None if params.greedy else random_seed())

    @property
    def needs_logits(self) -> bool:
        """False when the native argmax alone decides (greedy without penalties)."""
        return not self.params.greedy or self.params.penalized

    def pick(self, logits: np.ndarray, history: Sequence[int], position: int, n_top: int = 0,
             want_logprob: bool = False) -> tuple[int, float | None, list[tuple[int, float]] | None]:
        x = processed_logits(logits, history, self.params)
        if self.params.greedy:
            token = int(np.argmax(x))
            if not want_logprob and n_top == 0:
                return token, None, None
            logp = _log_softmax(x)
        else:
            logp = _log_softmax(x / self.params.temperature)
            token = inverse_cdf(np.exp(logp), keyed_uniform(self.seed, position))
        return token, float(logp[token]), top_logprobs(logp, n_top) if n_top > 0 else None

    def logprobs_of(self, logits: np.ndarray, history: Sequence[int], token: int,
                    n_top: int = 0) -> tuple[float, list[tuple[int, float]] | None]:
        """The log-probability of an already chosen token (and the top list) under the processed
        distribution, as pick() reports them."""
        x = processed_logits(logits, history, self.params)
        logp = _log_softmax(x if self.params.greedy else x / self.params.temperature)
        return float(logp[token]), top_logprobs(logp, n_top) if n_top > 0 else None


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max()
    return shifted - math.log(np.exp(shifted).sum())


def top_logprobs(logp: np.ndarray, n: int) -> list[tuple[int, float]]:
    """The n most likely (id, logprob), best first, ties to the lower id; -inf entries left out."""
    ids = largest_ids(logp, min(n, len(logp)))
    return [(int(i), float(logp[i])) for i in ids if logp[i] > -np.inf]
