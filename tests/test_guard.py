"""The loss guard (pyspecla/speculative/guard.py) on simulated step costs: a drafter that is always wrong
costs at most one failed smallest verify (one extra node) plus the regain allowance; one that is
always right grows to the largest trees within a few steps; the loss bound holds for mixed luck."""

from __future__ import annotations

import numpy as np
import pytest

from pyspecla.speculative.guard import LossGuard

PLAIN = 1.0    # seconds of a plain step (simulated)
PER_NODE = 0.4  # extra seconds per extra verified node


def step_cost(n_nodes: int) -> float:
    return PLAIN + PER_NODE * (n_nodes - 1)


def simulate(guard: LossGuard, accept, n_tokens: int):
    """Run until n_tokens are committed; accept(n_nodes) -> tokens committed (>= 1).
    Returns (speculative time, plain-decoding time of the same tokens, nodes per step)."""
    spent, committed, nodes = 0.0, 0, []
    while committed < n_tokens:
        n = guard.allowed_nodes()
        c = accept(n)
        assert 1 <= c <= n
        guard.record(n, c, step_cost(n))
        spent += step_cost(n)
        committed += c
        nodes.append(n)
    return spent, committed * PLAIN, nodes


def test_first_step_is_plain():
    assert LossGuard(16).allowed_nodes() == 1


@pytest.mark.parametrize("max_nodes", [2, 11, 23])
def test_always_wrong_costs_at_most_one_failed_verify_plus_regain(max_nodes):
    guard = LossGuard(max_nodes)
    spent, plain, nodes = simulate(guard, lambda n: 1, 400)
    bound = PER_NODE * LossGuard.ALLOWANCE_NODES + LossGuard.REGAIN * plain
    assert spent - plain <= bound + 1e-9, (spent - plain, bound)
    assert max(nodes) > 1, "the guard never tried the drafter"
    assert sum(n > 1 for n in nodes) < 0.2 * len(nodes), "a drafter that always misses must be mostly skipped"


def test_always_right_gets_the_largest_trees():
    guard = LossGuard(11)
    spent, plain, nodes = simulate(guard, lambda n: n, 400)
    assert nodes[0] == 1 and nodes[1] == 2  # plain, then the smallest speculative step
    assert nodes.index(11) <= 5, nodes[:10]  # the slow start is quick for a drafter that is right
    assert np.mean([n == 11 for n in nodes[2:]]) > 0.9, nodes[:20]
    assert spent < 0.5 * plain


@pytest.mark.parametrize("seed", range(5))
def test_mixed_luck_keeps_the_bound(seed):
    rng = np.random.default_rng(seed)
    guard = LossGuard(16)
    p = rng.uniform(0.0, 0.6)  # per-token acceptance: often not worth speculating

    def accept(n):
        a = 0
        while a < n - 1 and rng.random() < p:
            a += 1
        return a + 1

    spent, plain, _ = simulate(guard, accept, 500)
    assert spent - plain <= PER_NODE * LossGuard.ALLOWANCE_NODES + LossGuard.REGAIN * plain + 1e-9


class WrongDrafter:
    """Always proposes a chain of tokens the target never picks (a worst case for the guard)."""

    guarded = True
    capture_layers = ()
    max_depth = 10

    def __init__(self, never: int):
        self.never = never
        self.proposals = 0

    def propose(self, target_ctx, root_token, n_depths, top_k):
        self.proposals += 1
        tokens = np.full((n_depths, top_k), self.never, np.int32)
        tokens += np.arange(top_k, dtype=np.int32)[None, :]
        logprobs = np.tile(-np.arange(top_k, dtype=np.float32) - 0.1, (n_depths, 1))
        return tokens, logprobs


class SimulatedGuard(LossGuard):
    """The real guard fed the simulated step costs instead of this (shared, noisy) machine's clock,
    so the loop's use of it is tested deterministically."""

    def record(self, n_nodes, n_committed, seconds):
        super().record(n_nodes, n_committed, step_cost(n_nodes))


def test_loop_skips_a_drafter_that_is_always_wrong(tiny_model_path, monkeypatch):
    """Through the real loop: the output stays exact and most steps are plain decode steps."""
    from pyspecla.model import Model
    from pyspecla.speculative import loop
    from pyspecla.speculative.loop import SpecConfig, generate

    monkeypatch.setattr(loop, "LossGuard", SimulatedGuard)

    model = Model.load(tiny_model_path("f32"))
    prompt = [3, 1, 4, 1, 5]
    expected = model.generate(prompt, 48)
    never = max(set(range(model.hparams.n_vocab - 8)) - set(expected))  # never the greedy token
    drafter = WrongDrafter(never)
    stats, _ = generate(model, prompt, 48, SpecConfig(mode="chain", max_depth=10, budget=10), drafter=drafter)
    assert stats.tokens == expected
    assert stats.tree_nodes_per_step[0] == 1  # the first step is plain: it measures a plain step
    assert drafter.proposals < 0.5 * stats.steps, (drafter.proposals, stats.steps)
