"""The speculative loop end to end on the CPU: every mode emits exactly the autoregressive greedy
tokens (lossless), the oracle drafter's acceptance matches its expectation, the context ends in
the state plain decoding would leave, cancellation leaves it usable."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import plain_tokens

from pyspecla import Model
from pyspecla.errors import UsageError
from pyspecla.speculative.drafters import OracleDrafter
from pyspecla.speculative.loop import SpecConfig, generate

N_TOKENS = 128


@pytest.fixture(scope="module", params=["f32", "q4_k_m"])
def model(request, tiny_model_path):
    return Model.load(tiny_model_path(request.param))


def prompts(n, n_vocab, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, n_vocab, int(rng.integers(1, 12))).tolist() for _ in range(n)]


def ar_tokens(model, prompt, n=N_TOKENS + 20):
    return plain_tokens(model, prompt, n)


def test_plain_reference_cache_dies_with_its_model(tiny_model_path):
    """Cached plain outputs are keyed by the model object, weakly: once a model is gone nothing of
    it is left for a later model to read. (Keyed by id(model), test_ngram failed 12 cases when the
    q4_k_m model was given the id of the freed f32 model and read the f32 model's tokens.)"""
    import gc

    import conftest

    model = Model.load(tiny_model_path("f32"))
    tokens = plain_tokens(model, [1, 2, 3], 4)
    assert tokens == model.generate([1, 2, 3], 4) and model in conftest._PLAIN_TOKENS
    held = len(conftest._PLAIN_TOKENS)
    del model
    gc.collect()
    assert len(conftest._PLAIN_TOKENS) == held - 1


def oracle(model, prompt, p, seed=0):
    return OracleDrafter(p, ar_tokens(model, prompt), model.hparams.n_vocab, seed=seed)


MODES = [("chain", False), ("chain", True), ("ddtree", False), ("ddtree", True)]


@pytest.mark.parametrize("mode,specla", MODES, ids=lambda x: str(x))
def test_every_mode_is_lossless_on_20_prompts(model, mode, specla):
    for i, prompt in enumerate(prompts(20, model.hparams.n_vocab, seed=1)):
        config = SpecConfig(mode=mode, specla=specla, tau=6.0 if specla else None, top_k=4 if specla else 8)
        stats, _ = generate(model, prompt, N_TOKENS, config, drafter=oracle(model, prompt, 0.8, seed=i))
        assert stats.tokens == ar_tokens(model, prompt)[:N_TOKENS], f"prompt {i}: speculative output differs from AR"


SIDE_BRANCHES = {"rank1": (1,), "ranks0-3": (0, 1, 2, 3)}


@pytest.mark.parametrize("specla", [False, True], ids=["specla-off", "specla"])
@pytest.mark.parametrize("ranks", list(SIDE_BRANCHES))
def test_side_branch_acceptance_with_compaction_is_lossless(model, ranks, specla):
    """The true token at ranks >= 1: the tree's accepted paths leave the first-choice spine, so
    accept compacts KV rows and captured features (the context captures two layers, as for a
    DFlash draft). Tokens, the features of every committed position and the state after finish
    must equal plain decoding's."""
    n_layer = model.hparams.n_layer
    side_steps = compacted = 0
    for i, prompt in enumerate(prompts(2, model.hparams.n_vocab, seed=40)):
        drafter = OracleDrafter(0.9, ar_tokens(model, prompt), model.hparams.n_vocab, seed=i,
                                true_ranks=SIDE_BRANCHES[ranks], capture_layers=[0, n_layer - 1])
        config = SpecConfig(mode="ddtree", specla=specla, budget=22, tau=6.0 if specla else None, top_k=4)
        stats, ctx = generate(model, prompt, 40, config, drafter=drafter)
        assert stats.tokens == ar_tokens(model, prompt)[:40], f"prompt {i}: speculative output differs from AR"
        side_steps += stats.side_branch_steps
        compacted += stats.compacted_steps
        committed = prompt + ar_tokens(model, prompt)[:ctx.n_past - len(prompt)]
        plain = model.new_context(n_ctx=256, capture_layers=[0, n_layer - 1])
        plain.eval(committed)
        assert np.array_equal(ctx.read_features(0, ctx.n_past), plain.read_features(0, plain.n_past)), \
            f"prompt {i}: captured features differ from plain decoding"
        probe = [3, 5, 7]
        assert np.array_equal(ctx.eval(probe, logits_all=True), plain.eval(probe, logits_all=True))
    print(f"{ranks}: {side_steps} steps accepted a side branch, {compacted} compacted")
    assert side_steps >= 8, f"only {side_steps} steps accepted a side branch"  # 13-36 measured
    assert compacted >= 8, f"only {compacted} steps compacted"


def test_oracle_true_ranks_place_the_true_token():
    continuation = list(range(100, 140))
    drafter = OracleDrafter(1.0, continuation, 1000, seed=3, true_ranks=(2,))
    tokens, _ = drafter.propose(None, 0, 6, 4)
    assert tokens[:, 2].tolist() == continuation[:6]
    assert not np.isin(tokens[:, [0, 1, 3]], continuation[:6]).any()
    beyond = OracleDrafter(1.0, continuation, 1000, seed=3, true_ranks=(5,)).propose(None, 0, 6, 4)[0]
    assert not np.isin(beyond, continuation[:6]).any(), "a rank >= top_k is a miss"
    with pytest.raises(UsageError, match="true_ranks"):
        OracleDrafter(1.0, continuation, 1000, true_ranks=())


def test_ar_mode_is_the_reference(model):
    prompt = prompts(1, model.hparams.n_vocab, seed=2)[0]
    stats, _ = generate(model, prompt, N_TOKENS, SpecConfig(mode="ar"))
    assert stats.tokens == ar_tokens(model, prompt)[:N_TOKENS]
    assert stats.accepted_per_step == [1] * (N_TOKENS - 1)


@pytest.mark.parametrize("budget", [1, 4, 16, 22, 40])
@pytest.mark.parametrize("tau", [None, 6.0, 0.0])
@pytest.mark.parametrize("chain_seed", [True, False])
def test_budget_tau_chain_seed_grid_is_lossless(model, budget, tau, chain_seed):
    for i, prompt in enumerate(prompts(1, model.hparams.n_vocab, seed=3 + budget)):
        config = SpecConfig(mode="ddtree", specla=True, budget=budget, tau=tau, chain_seed=chain_seed)
        stats, _ = generate(model, prompt, N_TOKENS, config, drafter=oracle(model, prompt, 0.7, seed=i))
        assert stats.tokens == ar_tokens(model, prompt)[:N_TOKENS]
        assert max(stats.tree_nodes_per_step) <= budget + 1


@pytest.mark.parametrize("budget", [1, 4, 16, 22, 40])
@pytest.mark.parametrize("tau", [None, 6.0, 0.0])
def test_budget_tau_grid_is_lossless_with_specla_off(model, budget, tau):
    prompt = prompts(1, model.hparams.n_vocab, seed=30 + budget)[0]
    config = SpecConfig(mode="ddtree", specla=False, budget=budget, tau=tau, top_k=8)
    stats, _ = generate(model, prompt, N_TOKENS, config, drafter=oracle(model, prompt, 0.7))
    assert stats.tokens == ar_tokens(model, prompt)[:N_TOKENS]


def test_oracle_p1_accepts_the_full_depth_every_step(model):
    prompt = prompts(1, model.hparams.n_vocab, seed=4)[0]
    stats, _ = generate(model, prompt, N_TOKENS, SpecConfig(mode="ddtree", budget=22),
                        drafter=oracle(model, prompt, 1.0))
    assert stats.tokens == ar_tokens(model, prompt)[:N_TOKENS]
    # every step but the last (cut by max_tokens) commits depth 15 + the bonus token
    assert set(stats.accepted_per_step[:-1]) == {16}


@pytest.mark.parametrize("p", [0.6, 0.8, 0.9])
def test_oracle_acceptance_matches_expectation(tiny_model_path, p):
    model = Model.load(tiny_model_path("f32"))
    prompt = prompts(1, model.hparams.n_vocab, seed=5)[0]
    n = 600
    drafter = OracleDrafter(p, model.generate(prompt, n + 20), model.hparams.n_vocab, seed=7)
    stats, _ = generate(model, prompt, n, SpecConfig(mode="ddtree", budget=22), drafter=drafter)
    per_step = np.array(stats.accepted_per_step[:-1], dtype=np.float64)
    expected = drafter.expected_tokens_per_step(15)
    sem = per_step.std(ddof=1) / np.sqrt(len(per_step))
    assert abs(per_step.mean() - expected) <= 4 * sem + 1e-9, (per_step.mean(), expected, sem)


def test_state_after_finish_equals_plain_decoding(model):
    prompt = prompts(1, model.hparams.n_vocab, seed=6)[0]
    stats, ctx = generate(model, prompt, 50, SpecConfig(mode="ddtree"), drafter=oracle(model, prompt, 0.8))
    assert ctx.pending == 0
    # committed = the prompt and the AR continuation up to n_past (a step cut short by max_tokens
    # still committed its whole accepted path, which is AR's continuation too)
    committed = prompt + ar_tokens(model, prompt)[:ctx.n_past - len(prompt)]
    assert stats.tokens == ar_tokens(model, prompt)[:len(stats.tokens)]
    probe = [3, 5, 7]
    plain = model.new_context(n_ctx=256)
    plain.eval(committed)
    assert np.array_equal(ctx.eval(probe, logits_all=True), plain.eval(probe, logits_all=True))


def test_cancelled_run_leaves_the_context_usable(model):
    prompt = prompts(1, model.hparams.n_vocab, seed=8)[0]
    calls = []

    def interrupt_after_three(tokens):
        calls.append(tokens)
        if len(calls) == 3:
            raise KeyboardInterrupt

    stats, ctx = generate(model, prompt, N_TOKENS, SpecConfig(mode="ddtree"), drafter=oracle(model, prompt, 0.8),
                          on_tokens=interrupt_after_three)
    assert stats.cancelled and ctx.pending == 0
    committed = prompt + ar_tokens(model, prompt)[:ctx.n_past - len(prompt)]
    plain = model.new_context(n_ctx=256)
    plain.eval(committed)
    assert np.array_equal(ctx.eval([1]), plain.eval([1]))


def test_stops_at_eos_like_plain_decoding(model):
    prompt = prompts(1, model.hparams.n_vocab, seed=9)[0]
    reference = ar_tokens(model, prompt)
    eos = reference[40]  # pretend this token ends generation
    expected = reference[:reference.index(eos) + 1]
    stats, _ = generate(model, prompt, N_TOKENS, SpecConfig(mode="ddtree"), drafter=oracle(model, prompt, 0.9),
                        eos_ids={eos})
    assert stats.tokens == expected


class NonFiniteDrafter:
    """An oracle whose proposals go bad the way a draft with NaN numbers does: step by step, a NaN
    or infinite log-prob, or the token id -1, somewhere in a depth row (row 0 included)."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = 0

    @property
    def generated(self):
        return self.inner.generated

    @generated.setter
    def generated(self, value):
        self.inner.generated = value

    def propose(self, ctx, root, n_depths, top_k):
        tokens, logprobs = self.inner.propose(ctx, root, n_depths, top_k)
        tokens, logprobs = np.array(tokens), np.array(logprobs, dtype=np.float32)
        row = self.calls % n_depths
        kind = self.calls % 4
        if kind == 0:
            logprobs[row, -1] = np.nan
        elif kind == 1:
            logprobs[row, 0] = -np.inf
        elif kind == 2:
            tokens[row, top_k // 2] = -1
        self.calls += 1
        return tokens, logprobs


@pytest.mark.parametrize("mode,specla", MODES, ids=lambda x: str(x))
def test_nonfinite_proposals_are_treated_as_absent(model, mode, specla):
    prompt = prompts(1, model.hparams.n_vocab, seed=21)[0]
    drafter = NonFiniteDrafter(oracle(model, prompt, 1.0))
    config = SpecConfig(mode=mode, specla=specla, tau=6.0 if specla else None, top_k=4 if specla else 8)
    stats, _ = generate(model, prompt, N_TOKENS, config, drafter=drafter)
    assert stats.tokens == ar_tokens(model, prompt)[:N_TOKENS]
    assert drafter.calls == stats.steps
    # a step whose proposal broke at depth row r accepts at most r drafted tokens (+ the bonus)
    for step, accepted in enumerate(stats.accepted_per_step):
        if step % 4 != 3:
            assert accepted - 1 <= step % config.max_depth, (step, accepted)


@pytest.fixture(scope="module")
def dflash(model, tiny_model_path, tmp_path_factory):
    from pyspecla.dflash_draft import DFlashDraft
    from pyspecla.testing.drafts import write_test_draft

    path = str(tmp_path_factory.mktemp("dflash") / "draft.gguf")
    write_test_draft(path, model.file.path, seed=5)
    return DFlashDraft.load(path, model)


@pytest.mark.parametrize("mode,specla", MODES, ids=lambda x: str(x))
def test_dflash_draft_modes_are_lossless(model, dflash, mode, specla):
    from pyspecla.speculative.drafters import DFlashDrafter

    for prompt in prompts(3, model.hparams.n_vocab, seed=11):
        drafter = DFlashDrafter(dflash, n_ctx=len(prompt) + N_TOKENS + 64)
        config = SpecConfig(mode=mode, specla=specla, max_depth=drafter.max_depth)
        stats, ctx = generate(model, prompt, N_TOKENS, config, drafter=drafter)
        assert stats.tokens == ar_tokens(model, prompt)[:N_TOKENS]
        assert ctx.pending == 0


@pytest.mark.parametrize("mode,specla", [("chain", False), ("ddtree", True)], ids=lambda x: str(x))
def test_dflash_draft_with_a_reduced_vocabulary_is_lossless(model, dflash, mode, specla):
    """--draft-vocab for a DFlash draft: the block is scored over a subset of the target's head
    (the first ids + control tokens + the generation's own tokens); the output stays AR's, and
    every proposed token lies in the subset."""
    from pyspecla.speculative.drafters import DFlashDrafter
    from pyspecla.tokenizer import TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED

    n_frequent = model.hparams.n_vocab // 8
    for prompt in prompts(2, model.hparams.n_vocab, seed=12):
        drafter = DFlashDrafter(dflash, n_ctx=len(prompt) + N_TOKENS + 64, vocab=n_frequent)
        proposed = []
        propose = drafter.propose

        def recording(*args, **kwargs):
            tokens, logprobs = propose(*args, **kwargs)
            proposed.append(tokens.copy())
            return tokens, logprobs

        drafter.propose = recording
        config = SpecConfig(mode=mode, specla=specla, max_depth=drafter.max_depth)
        stats, _ = generate(model, prompt, N_TOKENS, config, drafter=drafter)
        assert stats.tokens == ar_tokens(model, prompt)[:N_TOKENS]
        types = np.asarray(model.file.metadata["tokenizer.ggml.token_type"])
        special = set(np.flatnonzero((types == TOKEN_TYPE_CONTROL) | (types == TOKEN_TYPE_USER_DEFINED)).tolist())
        allowed = set(range(n_frequent)) | special | set(prompt) | set(stats.tokens)
        seen = set(np.concatenate([t.ravel() for t in proposed]).tolist())
        assert seen <= allowed and len(drafter.vocabulary) < model.hparams.n_vocab
