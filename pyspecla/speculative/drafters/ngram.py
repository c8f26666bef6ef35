"""NgramDrafter: prompt lookup over the token history, no draft model."""

from __future__ import annotations

import math
import re

import numpy as np

from ...errors import UsageError


class NgramDrafter:
    """Prompt lookup: propose what followed the most recent earlier occurrence of the history's
    longest suffix n-gram (n = max_n, backing off to 1). No model, no target features: the
    proposal is a few dict look-ups, so it is free to compute, and a miss (no earlier occurrence
    of even the root token) returns zero depths — arrays of shape (0, top_k) — which the loop
    verifies as the root alone, a 1-node tree: exactly a plain decode step, nothing more.

    History. The loop sets `self.history` (a list: the prompt, then every emitted token, so its
    last entry is the step's root) and appends to that same list as it emits; propose() indexes
    only the entries added since its last call: an index per n = 1..max_n from n-gram to the end
    positions (exclusive) of its occurrences, in increasing order. Each emitted token costs max_n
    dict appends; a proposal never rescans the history. A new list object (a new generation)
    resets the index.

    Proposal at depths 1..min(n_depths, max_tokens): the tokens after the most recent earlier
    occurrence (end position e < len(history)) of the longest matching suffix n-gram. Where that
    continuation runs into the end of the history it continues periodically with period
    len(history) − e (the copy keeps copying), so a match always yields the full depth.
    Alternatives (ranks 1..): distinct tokens at the same offset after the other occurrences of
    the matched n-gram (the most recent OCCURRENCE_CAP) whose continuations agree with the
    proposal up to that depth (the DDTree convention: every depth conditioned on the top-1 spine),
    by count; then, to fill up to top_k, tokens that followed the previous spine token (the root
    at depth 1) anywhere in the history (a bigram back-off), by count. Log-probs, from counts: at
    a depth with N agreeing occurrences, token counts c, the spine token's count raised by
    b = max(0, best other count − its own) (recency wins ties with frequency) and D = N + b + 1,
    a matched token gets log(c / D); the back-off shares the reserved 1 / D in proportion to its
    counts. The width is the longest row (≤ top_k): one column, a plain chain, where no depth has
    an alternative. Shorter rows are padded with unrelated tokens at the row's lowest log-prob − 30
    (a tau window drops them; without one a DDTree fills its budget with them as with any draft).
    Everything is finite, ≤ 0 and descending, and deterministic."""

    capture_layers: tuple[int, ...] = ()  # no target features
    guarded = True  # guesses cost verifies: the loop's LossGuard sizes (or skips) each proposal
    OCCURRENCE_CAP = 32  # occurrences (most recent first) looked at for alternatives and back-off
    PAD_LOGPROB = -30.0  # padding: this far below the row's lowest real candidate

    def __init__(self, max_n: int = 3, max_tokens: int = 10):
        for name, value, top in (("n", max_n, 64), ("max", max_tokens, 1024)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise UsageError(f"n-gram drafter: {name} must be an integer in [1, {top}], got {value!r}")
        self.max_n = max_n
        self.max_depth = max_tokens  # the loop's SpecConfig.max_depth (factory.spec_config_from_args)
        self.history: list[int] = []  # set by the loop; see the class docstring
        self._indexed: list[int] | None = None
        self._n_indexed = 0
        self._index: list[dict[tuple[int, ...], list[int]]] = []

    USAGE = ("the n-gram drafter is written ngram or ngram:n=N,max=M (N in [1, 64]: the longest n-gram "
             "matched, default 3; M in [1, 1024]: the most tokens proposed, default 10)")

    @staticmethod
    def parse(spec: str) -> tuple[int, int]:
        """'ngram' -> (3, 10); 'ngram:n=4,max=8' (either key, any order) -> (4, 8); a clear error
        naming --draft for anything else."""
        values = {"n": 3, "max": 10}
        if spec == "ngram":
            return values["n"], values["max"]
        if not spec.startswith("ngram:"):
            raise UsageError(f"--draft {spec!r}: {NgramDrafter.USAGE}")
        seen = set()
        for item in spec[len("ngram:"):].split(","):
            m = re.fullmatch(r"(n|max)=([0-9]+)", item)
            if not m:
                raise UsageError(f"--draft {spec!r}: bad item {item!r}; {NgramDrafter.USAGE}")
            key, value = m.group(1), int(m.group(2))
            if key in seen:
                raise UsageError(f"--draft {spec!r}: {key} is given twice; {NgramDrafter.USAGE}")
            seen.add(key)
            if not 1 <= value <= (64 if key == "n" else 1024):
                raise UsageError(f"--draft {spec!r}: {key}={value} is out of range; {NgramDrafter.USAGE}")
            values[key] = value
        return values["n"], values["max"]

    def _catch_up(self) -> list[int]:
        """Index the history entries added since the last call (all of them for a new list)."""
        h = self.history
        if h is not self._indexed or len(h) < self._n_indexed:
            self._indexed, self._n_indexed = h, 0
            self._index = [{} for _ in range(self.max_n)]
        for i in range(self._n_indexed, len(h)):
            end = i + 1
            for m in range(1, min(self.max_n, end) + 1):
                self._index[m - 1].setdefault(tuple(h[end - m:end]), []).append(end)
        self._n_indexed = len(h)
        return h

    def propose(self, target_ctx, root_token: int, n_depths: int, top_k: int):
        h = self._catch_up()
        L = len(h)
        if L == 0 or h[-1] != root_token:
            raise UsageError("n-gram drafter: the history must end with the root token (the speculative loop "
                             "keeps drafter.history)")
        n_depths = min(n_depths, self.max_depth)
        empty = np.empty((0, top_k), np.int32), np.empty((0, top_k), np.float32)
        if n_depths <= 0 or top_k < 1:
            return empty
        ends = None
        for m in range(min(self.max_n, L), 0, -1):
            ends = self._index[m - 1].get(tuple(h[L - m:]))
            if ends is not None and len(ends) >= 2:  # ends[-1] == L: the suffix itself
                break
        else:
            return empty  # no earlier occurrence: verify the root alone
        cap = self.OCCURRENCE_CAP
        occurrences = ends[-2:-2 - cap:-1]  # earlier occurrences, most recent first
        e0 = occurrences[0]
        spine: list[int] = []
        for j in range(n_depths):
            i = e0 + j
            spine.append(h[i] if i < L else spine[i - L])

        rows: list[tuple[list[int], list[float]]] = []
        alive = occurrences
        for j in range(n_depths):
            s = spine[j]
            counts: dict[int, int] = {}
            agreeing = []
            for e in alive:  # most recent first, so dict order breaks count ties by recency
                if e == e0:
                    t = s
                elif e + j < L:
                    t = h[e + j]
                else:
                    continue  # its continuation is not in the history yet: no evidence
                counts[t] = counts.get(t, 0) + 1
                if t == s:
                    agreeing.append(e)
            others = sorted((t for t in counts if t != s), key=lambda t: -counts[t])[:top_k - 1]
            best_other = counts[others[0]] if others else 0
            boost = max(0, best_other - counts[s])
            denom = sum(counts.values()) + boost + 1
            tokens = [s] + others
            logprobs = [math.log((counts[s] + boost) / denom)] + [math.log(counts[t] / denom) for t in others]
            if len(tokens) < top_k:  # bigram back-off after the previous spine token
                prev = root_token if j == 0 else spine[j - 1]
                follows = self._index[0].get((prev,), [])
                backoff: dict[int, int] = {}
                considered = 0
                for e in reversed(follows):  # stops after `cap`: never a scan of the whole list
                    if e >= L:
                        continue  # the root's own entry: nothing follows it yet
                    considered += 1
                    backoff[h[e]] = backoff.get(h[e], 0) + 1
                    if considered >= cap:
                        break
                extra = sorted((t for t in backoff if t not in counts), key=lambda t: -backoff[t])
                for t in extra[:top_k - len(tokens)]:
                    tokens.append(t)
                    logprobs.append(math.log(backoff[t] / (considered * denom)))
            rows.append((tokens, logprobs))
            alive = agreeing

        width = max(len(tokens) for tokens, _ in rows)
        out_tokens = np.empty((n_depths, width), np.int32)
        out_logprobs = np.empty((n_depths, width), np.float32)
        for j, (tokens, logprobs) in enumerate(rows):
            pad_lp = logprobs[-1] + self.PAD_LOGPROB
            pad_token = 0
            while len(tokens) < width:
                while pad_token in tokens:
                    pad_token += 1
                tokens.append(pad_token)
                logprobs.append(pad_lp)
            out_tokens[j] = tokens
            out_logprobs[j] = logprobs
        return out_tokens, out_logprobs
