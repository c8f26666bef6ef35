"""OracleDrafter: a benchmark tool that proposes the target's own greedy continuation, corrupted
at a chosen rate."""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from ...errors import UsageError


class OracleDrafter:
    """Proposes continuation[g + d − 1] at depth d, where g tokens were generated so far: with
    probability p (independently per depth and step) the true token is proposed, at a rank drawn
    uniformly from `true_ranks` (a rank ≥ top_k is not proposed at all); every other entry is a
    random token that is not the true continuation. With the default true_ranks (0,) the true token
    is always the first choice, so the expected tokens committed per step with a chain of depth D
    is 1 + Σ_{i=1..D} p^i; other ranks make a tree accept side branches (the loop's KV and feature
    compaction). `capture_layers` makes the target context capture those layers' features, as a
    DFlash draft's context does."""

    def __init__(self, p: float, continuation: list[int], n_vocab: int, seed: int = 0,
                 true_ranks: Sequence[int] = (0,), capture_layers: Sequence[int] = ()):
        if not 0.0 <= p <= 1.0:
            raise UsageError(f"oracle drafter: p must be in [0, 1], got {p}")
        if len(true_ranks) == 0 or any(int(r) < 0 for r in true_ranks):
            raise UsageError(f"oracle drafter: true_ranks must be ranks >= 0, got {list(true_ranks)}")
        self.p = p
        self.true_ranks = [int(r) for r in true_ranks]
        self.capture_layers = [int(layer) for layer in capture_layers]
        self.continuation = list(continuation)
        self.n_vocab = n_vocab
        self.rng = np.random.default_rng(seed)
        self.generated = 0  # set by the loop before each proposal

    @staticmethod
    def parse(spec: str) -> float:
        """'oracle:p=0.8' -> 0.8 (a clear error for anything else)."""
        m = re.fullmatch(r"oracle:p=([0-9]*\.?[0-9]+)", spec)
        if not m:
            raise UsageError(f"--draft {spec!r}: the oracle drafter is written oracle:p=P with P in [0, 1]")
        p = float(m.group(1))
        if not 0.0 <= p <= 1.0:
            raise UsageError(f"--draft {spec!r}: p must be in [0, 1]")
        return p

    def _other_token(self, avoid: set[int]) -> int:
        while True:
            t = int(self.rng.integers(0, self.n_vocab))
            if t not in avoid:
                return t

    def propose(self, target_ctx, root_token: int, n_depths: int, top_k: int):
        tokens = np.empty((n_depths, top_k), dtype=np.int32)
        # log-probs: the proposal is confident, the alternatives fall off by rank
        logprobs = np.tile(-np.arange(top_k, dtype=np.float32) * 2.0 - 0.05, (n_depths, 1))
        for d in range(1, n_depths + 1):
            index = self.generated + d - 1
            true = self.continuation[index] if index < len(self.continuation) else -1
            hit = true >= 0 and self.rng.random() < self.p
            true_rank = -1
            if hit:  # one rank needs no draw (the default keeps the random stream it always had)
                choice = int(self.rng.integers(0, len(self.true_ranks))) if len(self.true_ranks) > 1 else 0
                true_rank = self.true_ranks[choice]
            avoid = {true}
            for r in range(top_k):
                tokens[d - 1, r] = true if r == true_rank else self._other_token(avoid)
                avoid.add(int(tokens[d - 1, r]))
        return tokens, logprobs

    def expected_tokens_per_step(self, depth: int) -> float:
        """For a chain of the first choices, with the default true_ranks (0,)."""
        if self.true_ranks != [0]:
            raise UsageError("oracle drafter: expected_tokens_per_step holds for true_ranks (0,) only")
        return 1.0 + sum(self.p ** i for i in range(1, depth + 1))
