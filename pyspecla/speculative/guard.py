"""Loss guard: keeps a drafter that guesses from keeping generation slower than plain decoding.

A speculative step that verifies N nodes costs more than a plain decode step and pays off only
through accepted tokens. A drafter with no model (prompt lookup) proposes whenever it finds a
match, right or wrong; on text that does not repeat, every miss would cost a verify for one token.
The guard measures what steps cost on this machine and lets a proposal through only while the run
can afford it:

- credit (seconds): for every speculative step, (tokens it committed) x (a plain step's time) −
  (the step's draft + verify time). Positive credit is time speculation has saved so far.
- allowance: the loss of one failed verify of the smallest speculative step (root + one drafted
  token), beta * ALLOWANCE_NODES, where beta is the measured extra cost per extra node.
- A step may verify N nodes only if, should none be accepted, credit stays above −allowance:
  credit − beta * (N − 1) >= −allowance. N shrinks to what fits; below 2 the step is plain.
  So a drafter starts small and its trees grow only as fast as its accepted tokens pay for them
  (a slow start: two right guesses in a row already allow several nodes), while a wrong one never
  gets past the smallest step.
- Plain steps earn a little credit back (REGAIN of a plain step's time each), so a drafter that
  failed early is tried again later (text often starts repeating mid-generation); this bounds the
  loss to one failed smallest verify plus REGAIN of the plain decoding time.

Why the smallest step and not the largest tree: on the CPU a large tree's verify costs several
plain steps, so allowing one failed largest tree costs a short generation a lot up front
(docs/perf.md has the measurement).

The first step is always plain, which gives the first measurement of a plain step. Costs are
exponential moving averages of measured wall times. Exactness is untouched: the guard only decides
how many nodes a step verifies, and every verify is exact."""

from __future__ import annotations


class LossGuard:
    REGAIN = 0.02  # fraction of a plain step's time credited back per plain step
    EMA = 0.3      # weight of a new measurement
    ALLOWANCE_NODES = 1  # the loss allowed up front: one failed verify of this many extra nodes

    def __init__(self, max_nodes: int):
        self.max_nodes = max(1, int(max_nodes))
        self.plain_s: float | None = None  # one plain (1-node) step
        self.beta_s: float | None = None   # extra time per extra node of a speculative step
        self.credit_s = 0.0

    def _ema(self, old, new):
        return new if old is None else (1 - self.EMA) * old + self.EMA * new

    def _beta(self) -> float:
        # before any speculative step has been timed, assume an extra node costs half a plain step
        return self.beta_s if self.beta_s is not None else 0.5 * self.plain_s

    def allowed_nodes(self) -> int:
        """Most tree nodes (root included) the next step may verify; 1 = a plain step."""
        if self.plain_s is None:
            return 1
        beta = self._beta()
        allowance = beta * min(self.ALLOWANCE_NODES, self.max_nodes - 1)
        extra = int((self.credit_s + allowance) / beta) if beta > 0 else self.max_nodes - 1
        return max(1, min(self.max_nodes, 1 + extra))

    def record(self, n_nodes: int, n_committed: int, seconds: float) -> None:
        """A step verified n_nodes, committed n_committed tokens, and took `seconds` (draft + verify)."""
        if n_nodes <= 1:
            self.plain_s = self._ema(self.plain_s, seconds)
            self.credit_s += self.REGAIN * self.plain_s
            return
        self.beta_s = self._ema(self.beta_s, max(seconds - self.plain_s, 0.0) / (n_nodes - 1))
        self.credit_s += n_committed * self.plain_s - seconds
