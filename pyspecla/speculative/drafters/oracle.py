"""OracleDrafter: a benchmark tool that proposes the target's own greedy continuation, corrupted
at a chosen rate."""

from __future__ import annotations

import re

import numpy as np

from ...errors import UsageError


class OracleDrafter:
    """Proposes continuation[g + d − 1] at depth d, where g tokens were generated so far; each
    proposal is replaced by a different random token with probability 1 − p, independently per
    depth and step. Ranks ≥ 1 are random tokens that are never the true continuation, so the
    expected tokens committed per step with a chain of depth D is 1 + Σ_{i=1..D} p^i."""

    capture_layers: list[int] = []

    def __init__(self, p: float, continuation: list[int], n_vocab: int, seed: int = 0):
        if not 0.0 <= p <= 1.0:
            raise UsageError(f"oracle drafter: p must be in [0, 1], got {p}")
        self.p = p
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
            avoid = {true}
            first = true if (true >= 0 and self.rng.random() < self.p) else self._other_token(avoid)
            avoid.add(first)
            tokens[d - 1, 0] = first
            for r in range(1, top_k):
                tokens[d - 1, r] = self._other_token(avoid)
                avoid.add(int(tokens[d - 1, r]))
        return tokens, logprobs

    def expected_tokens_per_step(self, depth: int) -> float:
        return 1.0 + sum(self.p ** i for i in range(1, depth + 1))
