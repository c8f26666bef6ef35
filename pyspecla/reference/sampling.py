"""The sampler's oracle: pyspecla.sampling.processed_logits written as the rules read, token by
token in plain Python floats, with full sorts. Slow; the fast version is tested against it."""

from __future__ import annotations

import math


def processed_logits(logits, history, params) -> list[float]:
    """Same signature and result as pyspecla.sampling.processed_logits (a list here)."""
    x = [float(v) for v in logits]
    V = len(x)
    # penalties over the window of the last penalty_last_n history tokens (-1: all, 0: none)
    if params.penalty_last_n != 0:
        window = list(history) if params.penalty_last_n < 0 else list(history)[-params.penalty_last_n:]
        counts: dict[int, int] = {}
        for t in window:
            counts[int(t)] = counts.get(int(t), 0) + 1
        for t, n in counts.items():
            v = x[t]
            if v > 0:
                v = v / params.repeat_penalty
            else:
                v = v * params.repeat_penalty
            x[t] = v - (n * params.frequency_penalty + params.presence_penalty)

    def order():  # ids by descending logit, ties to the lower id
        return sorted(range(V), key=lambda i: (-x[i], i))

    if 0 < params.top_k < V:
        keep = set(order()[: params.top_k])
        x = [v if i in keep else -math.inf for i, v in enumerate(x)]
    if params.top_p < 1.0:
        p = softmax(x)
        kept, total = set(), 0.0
        for i in sorted(range(V), key=lambda i: (-p[i], i)):
            kept.add(i)
            total += p[i]
            if total >= params.top_p:
                break
        x = [v if i in kept else -math.inf for i, v in enumerate(x)]
    if params.min_p > 0.0:
        threshold = max(x) + math.log(params.min_p)
        x = [v if v >= threshold else -math.inf for v in x]
    return x


def softmax(x) -> list[float]:
    m = max(x)
    e = [math.exp(v - m) for v in x]
    s = sum(e)
    return [v / s for v in e]


def probabilities(processed, temperature: float) -> list[float]:
    """The final distribution at temperature > 0, normalised by the correctly rounded sum
    (math.fsum): a running sum over a large vocabulary drifts by up to V rounding steps, which
    would make the oracle less exact than what it checks."""
    x = [v / temperature for v in processed]
    m = max(x)
    e = [math.exp(v - m) for v in x]
    total = math.fsum(e)
    return [v / total for v in e]
