"""Tree verification through the whole target model: every node's logits equal those of decoding
its root path token by token (bit for bit), accept commits exactly the accepted tokens, and after
any sequence of speculative steps the context continues exactly like plain decoding."""

from __future__ import annotations

import numpy as np
import pytest

from pyspecla import Model
from pyspecla.errors import NativeError
from pyspecla.reference.specla import root_path

METHODS = [("hld_chains", "deferred_factors"), ("hld_chains", "factors_now"), ("root_to_leaf", "replay"),
           ("dense_checkpoints", "checkpoint_restore")]


def random_tree(rng, n):
    return [-1] + [int(rng.integers(0, t)) for t in range(1, n)]


def ar_logits(model, tokens):
    ctx = model.new_context(n_ctx=len(tokens) + 4, max_batch=1)
    return ctx.eval(tokens, logits_all=True)


@pytest.fixture(scope="module", params=[("tiny", "f32"), ("tiny8", "q4_k_m")], ids=lambda p: "-".join(p))
def model(request, tiny_model_path):
    preset, quant = request.param
    return Model.load(tiny_model_path(quant, preset=preset))


@pytest.mark.parametrize("methods", METHODS, ids=lambda m: "+".join(m))
def test_each_node_equals_decoding_its_root_path(model, methods):
    rng = np.random.default_rng(1)
    V = model.hparams.n_vocab
    prompt = rng.integers(0, V, 9).tolist()
    ctx = model.new_context(n_ctx=128, max_tree_nodes=24, verify_method=methods[0], commit_method=methods[1])
    ctx.eval(prompt)
    parents = random_tree(rng, 23)
    tokens = rng.integers(0, V, 23)
    argmax, logits = ctx.verify_tree(tokens, parents, want_logits=True)
    for t in range(len(parents)):
        path_tokens = prompt + [int(tokens[i]) for i in root_path(parents, t)]
        expected = ar_logits(model, path_tokens)[-1]
        assert np.array_equal(logits[t], expected), f"node {t}: tree logits differ from decoding its root path"
        assert argmax[t] == int(np.argmax(expected))


@pytest.mark.parametrize("methods", METHODS, ids=lambda m: "+".join(m))
def test_speculative_steps_continue_exactly_like_plain_decoding(model, methods):
    rng = np.random.default_rng(2)
    V = model.hparams.n_vocab
    committed = rng.integers(0, V, 7).tolist()
    ctx = model.new_context(n_ctx=256, max_tree_nodes=41, verify_method=methods[0], commit_method=methods[1])
    ctx.eval(committed)
    for step in range(8):
        n = int(rng.choice([1, 2, 9, 23, 41]))
        parents = random_tree(rng, n) if step % 2 else [-1] + list(range(n - 1))
        tokens = rng.integers(0, V, n)
        ctx.verify_tree(tokens, parents)
        leaf = int(rng.integers(0, n))
        path = root_path(parents, leaf)
        ctx.accept(path)
        committed += [int(tokens[i]) for i in path]
        assert ctx.n_past == len(committed)
    if step % 2:
        ctx.finish()
    ctx.finish()  # idempotent
    assert ctx.pending == 0
    probe = rng.integers(0, V, 5).tolist()
    continued = ctx.eval(probe, logits_all=True)
    expected = ar_logits(model, committed + probe)[-5:]
    assert np.array_equal(continued, expected)


def test_specla_verify_steps_each_node_once_per_recurrent_layer(model):
    """Through the whole model: a SpecLA verify of N nodes makes N node steps (value head 0) in each
    recurrent layer, the replay baseline more on a branching tree."""
    tokens, parents = [5, 6, 7, 8, 9, 10], [-1, 0, 1, 0, 3, 3]
    n_recurrent = sum(model.hparams.layer_is_recurrent)
    steps = {}
    for methods in (("hld_chains", "deferred_factors"), ("root_to_leaf", "deferred_factors")):
        ctx = model.new_context(n_ctx=64, max_tree_nodes=8, verify_method=methods[0], commit_method=methods[1])
        ctx.eval([1, 2, 3])
        ctx.verify_tree(tokens, parents)
        stats = ctx.tree_stats()
        assert stats["n_nodes"] == 6 and stats["n_layers"] == n_recurrent
        steps[methods[0]] = stats["node_steps"]
        ctx.close()
    assert steps["hld_chains"] == 6 * n_recurrent
    assert steps["root_to_leaf"] == (3 + 3 + 3) * n_recurrent  # leaves 2, 4, 5 at depth 2


def test_plain_decode_after_a_step_folds_the_pending_path_itself(model):
    rng = np.random.default_rng(3)
    V = model.hparams.n_vocab
    prompt = rng.integers(0, V, 5).tolist()
    ctx = model.new_context(n_ctx=64, max_tree_nodes=8)
    ctx.eval(prompt)
    tokens = rng.integers(0, V, 6)
    ctx.verify_tree(tokens, [-1, 0, 1, 2, 0, 4])
    ctx.accept([0, 4, 5])
    assert ctx.pending == 3
    nxt = ctx.eval([7])  # no explicit finish: the context folds first
    assert ctx.pending == 0
    assert np.array_equal(nxt, ar_logits(model, prompt + [int(tokens[0]), int(tokens[4]), int(tokens[5]), 7])[-1])


def test_a_tree_verified_again_before_accept_gives_the_same_bits(model):
    """A step whose tree is verified twice before accept: the first verify folds the pending path
    into every layer (how much each layer folds is read from the fold counts the banks upload per
    verify), the second finds it folded (counts 0) and must give the same logits, and the context
    then continues like one verified once."""
    rng = np.random.default_rng(8)
    V = model.hparams.n_vocab
    prompt = rng.integers(0, V, 6).tolist()
    once, twice = (model.new_context(n_ctx=64, max_tree_nodes=8) for _ in range(2))
    parents = [-1, 0, 1, 0, 3, 4]
    first, second = rng.integers(0, V, 6), rng.integers(0, V, 6)
    for ctx in (once, twice):
        ctx.eval(prompt)
        ctx.verify_tree(first, parents)
        ctx.accept([0, 3, 4])  # a side path: 3 pending tokens
        assert ctx.pending == 3
    _, want = once.verify_tree(second, parents, want_logits=True)
    _, got_first = twice.verify_tree(second, parents, want_logits=True)
    _, got_again = twice.verify_tree(second, parents, want_logits=True)
    assert np.array_equal(got_first.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(got_again.view(np.uint32), want.view(np.uint32)), "the second verify folded again"
    for ctx in (once, twice):
        ctx.accept([0, 1, 2])
        ctx.finish()
    assert np.array_equal(once.eval([7, 9], logits_all=True).view(np.uint32),
                          twice.eval([7, 9], logits_all=True).view(np.uint32))


def test_captured_features_follow_the_accepted_path(tiny_model_path):
    model = Model.load(tiny_model_path("f32"))
    rng = np.random.default_rng(4)
    V = model.hparams.n_vocab
    layers = [0, 2, 3]
    prompt = rng.integers(0, V, 6).tolist()
    spec = model.new_context(n_ctx=64, max_tree_nodes=8, capture_layers=layers)
    spec.eval(prompt)
    tokens = rng.integers(0, V, 7)
    spec.verify_tree(tokens, [-1, 0, 0, 2, 3, 1, 5])
    spec.accept([0, 2, 3, 4])
    plain = model.new_context(n_ctx=64, capture_layers=layers)
    plain.eval(prompt + [int(tokens[i]) for i in (0, 2, 3, 4)])
    assert np.array_equal(spec.read_features(0, spec.n_past), plain.read_features(0, plain.n_past))


def test_misuse_is_refused(model):
    ctx = model.new_context(n_ctx=32, max_tree_nodes=4)
    ctx.eval([1, 2])
    with pytest.raises(NativeError, match="no verified tree"):
        ctx.accept([0])
    with pytest.raises(NativeError, match="parents"):
        ctx.verify_tree([1, 2, 3], [-1, 2, 0])
    with pytest.raises(NativeError, match="takes 1 .. 4"):
        ctx.verify_tree([1] * 5, [-1, 0, 1, 2, 3])
    ctx.verify_tree([1, 2, 3], [-1, 0, 0])
    with pytest.raises(NativeError, match="not a child"):
        ctx.accept([0, 1, 2])
    plain = model.new_context(n_ctx=8)
    with pytest.raises(NativeError, match="max_tree_nodes = 0"):
        plain.verify_tree([1], [-1])
