"""Speculative decoding on the GPU at the scale issue 14 asks for: 20 prompts x 256 tokens on a
qwen35 test model, every mode (chain / DDTree x SpecLA on / off) and two drafters (the oracle with
the true token at ranks 0-3, so DDTree steps accept side branches and compact KV rows and
features; the n-gram drafter), each run's tokens equal to greedy plain decoding on the same GPU,
and the context after finish in the state plain decoding leaves (the captured features of every
committed position and the logits of three more tokens, bit for bit). Marked gpu: skipped with a
reason where no device is visible."""

from __future__ import annotations

import numpy as np
import pytest

from pyspecla import Model
from pyspecla.speculative.drafters import NgramDrafter, OracleDrafter
from pyspecla.speculative.loop import SpecConfig, generate
from pyspecla.testing.models import write_test_model

pytestmark = pytest.mark.gpu

N_PROMPTS, N_TOKENS = 20, 256
MODES = [("chain", False), ("chain", True), ("ddtree", False), ("ddtree", True)]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_test_model(tmp_path_factory.mktemp("gpu-spec") / "tiny8-qwen35-q4_k_m.gguf", "tiny8", "q4_k_m",
                            seed=5, arch="qwen35")
    m = Model.load(str(path), device="cuda")
    yield m
    m.close()


@pytest.fixture(scope="module")
def prompts_and_plain(model):
    rng = np.random.default_rng(2026)
    V = model.hparams.n_vocab
    prompts = [rng.integers(0, V, int(rng.integers(1, 24))).tolist() for _ in range(N_PROMPTS)]
    return [(p, model.generate(p, N_TOKENS + 24)) for p in prompts]


def check_durable_state(model, ctx, prompt, plain, what):
    layers = model.hparams.n_layer
    committed = prompt + plain[:ctx.n_past - len(prompt)]
    reference = model.new_context(n_ctx=len(committed) + 8, capture_layers=[0, layers - 1])
    reference.eval(committed)
    assert np.array_equal(ctx.read_features(0, ctx.n_past), reference.read_features(0, reference.n_past)), \
        f"{what}: captured features differ from plain decoding"
    probe = [3, 5, 7]
    got, want = ctx.eval(probe, logits_all=True), reference.eval(probe, logits_all=True)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"{what}: state after finish differs"
    reference.close()


@pytest.mark.parametrize("mode,specla", MODES, ids=lambda x: str(x))
def test_every_mode_equals_plain_greedy_on_20_prompts_of_256_tokens(model, prompts_and_plain, mode, specla):
    V, layers = model.hparams.n_vocab, model.hparams.n_layer
    side_steps = 0
    for i, (prompt, plain) in enumerate(prompts_and_plain):
        config = SpecConfig(mode=mode, specla=specla, tau=6.0 if specla else None, top_k=4 if specla else 8)
        drafter = OracleDrafter(0.85, plain, V, seed=i, true_ranks=(0, 1, 2, 3), capture_layers=[0, layers - 1])
        stats, ctx = generate(model, prompt, N_TOKENS, config, drafter=drafter)
        assert ctx.device == "cuda"
        assert stats.tokens == plain[:N_TOKENS], f"prompt {i}: oracle drafter, {mode} specla={specla}"
        side_steps += stats.side_branch_steps
        if i < 4:  # the state check costs a second context per prompt
            check_durable_state(model, ctx, prompt, plain, f"prompt {i}, {mode} specla={specla}")
        ctx.close()
        stats, ctx = generate(model, prompt, N_TOKENS, SpecConfig(mode=mode, specla=specla), drafter=NgramDrafter())
        assert stats.tokens == plain[:N_TOKENS], f"prompt {i}: n-gram drafter, {mode} specla={specla}"
        ctx.close()
    print(f"{mode} specla={specla}: {side_steps} oracle steps accepted a side branch")
    if mode == "ddtree":
        assert side_steps >= 20, f"only {side_steps} steps accepted a side branch"
