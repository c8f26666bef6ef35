"""A draft's reduced vocabulary: a context that scores chosen rows of the LM head
(specla_context_set_logit_rows, Context.set_logit_rows) and the DraftVocabulary that picks them
(the first n ids, the control tokens, the generation's own tokens). Every logit must equal the
full head's logit of the same token bit for bit (a row's dot products do not depend on which other
rows are scored), and speculative output with a reduced draft vocabulary must still equal plain
greedy decoding."""

from __future__ import annotations

import numpy as np
import pytest

from pyspecla import Model
from pyspecla.errors import NativeError, UsageError
from pyspecla.speculative.drafters.vocabulary import DraftVocabulary
from pyspecla.speculative.drafters import ModelDrafter
from pyspecla.speculative.loop import SpecConfig, generate
from pyspecla.testing.models import write_test_model
from pyspecla.tokenizer import TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    base = tmp_path_factory.mktemp("draft_vocab")

    def load(name, **kwargs):
        path = str(base / name)
        write_test_model(path, preset="tiny", arch="qwen2", **kwargs)
        return Model.load(path)

    return {
        "tied_q8_0": load("tied-q8_0.gguf", quant="q8_0", seed=4),  # the head is token_embd
        "untied_f32": load("untied-f32.gguf", quant="f32", seed=4, tied_output=False),
        "target": load("target-f32.gguf", quant="f32", seed=4),
    }


def random_ids(rng, model, n):
    return rng.permutation(model.hparams.n_vocab)[:n].astype(np.int32)


@pytest.mark.parametrize("name", ["tied_q8_0", "untied_f32"])
def test_chosen_rows_score_exactly_what_the_full_head_scores(models, name):
    model = models[name]
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, model.hparams.n_vocab, 13).tolist()
    full_ctx = model.new_context(n_ctx=32, max_batch=8)
    full = full_ctx.eval(prompt, logits_all=True)
    for n in (1, 7, 300, model.hparams.n_vocab):
        ids = random_ids(rng, model, n)
        ctx = model.new_context(n_ctx=32, max_batch=8)
        ctx.set_logit_rows(ids)
        assert ctx.n_logits == n
        ours = ctx.eval(prompt, logits_all=True)
        assert ours.shape == (len(prompt), n)
        assert np.array_equal(ours, full[:, ids]), f"{n} rows"
        # argmax comes back as a token id: the best chosen row, the earliest row on ties
        ctx.truncate(len(prompt) - 1)
        token = ctx.eval_argmax(prompt[-1:])
        assert token == int(ids[np.argmax(full[-1, ids])])
        ctx.close()
    full_ctx.close()


def test_growing_shrinking_and_going_back_to_the_full_head(models):
    """The native side gathers only rows after the unchanged prefix of ids: a set that grows, one
    that changes in the middle and one that shrinks back must each score exactly their rows."""
    model = models["untied_f32"]
    ids = np.arange(50, 250, dtype=np.int32)
    ctx = model.new_context(n_ctx=16)
    ctx.set_logit_rows(ids[:60])
    ctx.set_logit_rows(ids[:120])  # grows: rows 60..119 gathered
    part = ctx.eval([3, 4, 5])
    changed = ids[:120].copy()
    changed[30] = 7  # a change inside the prefix: everything after it is gathered again
    ctx.set_logit_rows(changed)
    ctx.truncate(2)
    assert np.array_equal(ctx.eval([5])[31:], part[31:]) and ctx.logit_tokens[30] == 7
    ctx.set_logit_rows(ids[:40])  # shrinks back
    ctx.truncate(2)
    assert np.array_equal(ctx.eval([5]), part[:40])
    ctx.set_logit_rows(None)
    assert ctx.n_logits == model.hparams.n_vocab and ctx.logit_tokens is None
    ctx.truncate(2)
    whole = ctx.eval([5])
    assert np.array_equal(part, whole[50:170])


def test_rows_chosen_before_never_rank_after_a_shrink(models):
    """The head's memory keeps rows past the current set (rows chosen before), and the LM head is
    multiplied over all of them so that a recorded step does not depend on the row count: the argmax
    of a decode step and of a verify must still rank only the chosen rows. The set shrinks to the
    rows that score worst here, so every row left behind in memory scores better than any chosen one."""
    model = models["target"]
    prompt = [11, 12, 13, 14]
    tree_tokens, parents = [15, 16, 17], [-1, 0, 0]
    full = model.new_context(n_ctx=32, max_tree_nodes=3)
    want_logits = full.eval(prompt)
    _, tree_logits = full.verify_tree(tree_tokens, parents, want_logits=True)
    worst_first = np.argsort(want_logits, kind="stable").astype(np.int32)
    for n in (1, 5, 40):
        ctx = model.new_context(n_ctx=32, max_tree_nodes=3)
        ctx.set_logit_rows(worst_first)  # every row in memory
        ctx.set_logit_rows(worst_first[:n])  # the n worst remain chosen
        ctx.eval(prompt[:-1])
        chosen = worst_first[:n]
        assert ctx.eval_argmax(prompt[-1:]) == int(chosen[np.argmax(want_logits[chosen])]), f"{n} rows"
        got = ctx.verify_tree(tree_tokens, parents)
        assert got.tolist() == [int(chosen[np.argmax(row[chosen])]) for row in tree_logits], f"{n} rows"
        ctx.close()
    full.close()


def test_tree_verify_argmax_is_a_token_id(models):
    model = models["target"]
    ids = np.arange(900, 1024, dtype=np.int32)  # row i scores token 900 + i
    tree_tokens, parents = [7, 8, 9, 10], [-1, 0, 0, 2]
    plain = model.new_context(n_ctx=32, max_tree_nodes=4)
    plain.eval([1, 2, 3])
    want, logits = plain.verify_tree(tree_tokens, parents, want_logits=True)
    reduced = model.new_context(n_ctx=32, max_tree_nodes=4)
    reduced.set_logit_rows(ids)
    reduced.eval([1, 2, 3])
    got, sub_logits = reduced.verify_tree(tree_tokens, parents, want_logits=True)
    assert np.array_equal(sub_logits, logits[:, 900:])
    assert got.tolist() == [900 + int(np.argmax(row)) for row in logits[:, 900:]]
    assert want.tolist() == [int(np.argmax(row)) for row in logits]  # the full context: every id


def test_bad_rows_are_clear_errors(models):
    model = models["untied_f32"]
    ctx = model.new_context(n_ctx=16)
    with pytest.raises(UsageError, match=r"token ids must be in \[0, 1024\)"):
        ctx.set_logit_rows([3, 1024])
    with pytest.raises(UsageError, match=r"token ids must be in \[0, 1024\)"):
        ctx.set_logit_rows([-1])
    with pytest.raises(UsageError, match="non-empty 1-D list of integers"):
        ctx.set_logit_rows([])
    with pytest.raises(UsageError, match="non-empty 1-D list of integers"):
        ctx.set_logit_rows([[1, 2]])
    with pytest.raises(UsageError, match="non-empty 1-D list of integers"):
        ctx.set_logit_rows([1.5])
    # the native side checks what it gets too: more rows than the vocabulary
    with pytest.raises(NativeError, match=r"1025 rows, must be in \[0, n_vocab = 1024\]"):
        ctx.set_logit_rows(np.arange(1025) % 1024)
    assert ctx.n_logits == model.hparams.n_vocab  # a refused set changes nothing
    assert ctx.eval([1]).shape == (model.hparams.n_vocab,)


# --- DraftVocabulary ---------------------------------------------------------------------------------

def special_ids(model):
    types = np.asarray(model.file.metadata["tokenizer.ggml.token_type"])
    return set(np.flatnonzero((types == TOKEN_TYPE_CONTROL) | (types == TOKEN_TYPE_USER_DEFINED)).tolist())


def test_the_vocabulary_is_frequent_ids_control_tokens_and_the_generations_tokens(models):
    model = models["target"]
    specials = special_ids(model)
    assert specials, "the synthetic vocabulary should have control tokens"
    ctx = model.new_context(n_ctx=64)
    vocab = DraftVocabulary(model, ctx, 100, spare_rows=4)
    fixed = set(range(100)) | specials
    assert set(ctx.logit_tokens.tolist()) == fixed and len(vocab) == len(fixed)

    history = [5, 600, 601, 5, 700]
    vocab.follow(history)
    assert set(ctx.logit_tokens.tolist()) == fixed | {600, 601, 700}
    history += [800, 801, 802, 803, 804, 600]  # more than the spare rows: the buffer grows
    vocab.follow(history)
    want = fixed | {600, 601, 700, 800, 801, 802, 803, 804}
    assert set(ctx.logit_tokens.tolist()) == want and len(ctx.logit_tokens) == len(want)
    logits = ctx.eval(history)
    full = model.new_context(n_ctx=64).eval(history)
    assert np.array_equal(logits, full[ctx.logit_tokens])

    vocab.follow([900, 901])  # a new generation starts from the fixed part again
    assert set(ctx.logit_tokens.tolist()) == fixed | {900, 901}
    vocab.follow(history)
    assert set(ctx.logit_tokens.tolist()) == want


def test_bad_vocabulary_sizes_are_refused(models):
    model = models["target"]
    for bad in (0, -3, 2.5, True):
        with pytest.raises(UsageError, match="--draft-vocab"):
            DraftVocabulary(model, model.new_context(n_ctx=8), bad)
    with pytest.raises(UsageError, match="--draft-vocab must be an integer >= 0"):
        ModelDrafter(models["tied_q8_0"], model, n_ctx=32, vocab=-1)
    # as large as the vocabulary: nothing to reduce
    assert ModelDrafter(models["tied_q8_0"], model, n_ctx=32, vocab=5000).vocabulary is None


@pytest.mark.parametrize("mode", ["chain", "ddtree"])
@pytest.mark.parametrize("n_frequent", [1, 64, 600])
def test_speculative_output_with_a_reduced_draft_vocabulary_equals_autoregressive(models, mode, n_frequent):
    target, draft = models["target"], models["tied_q8_0"]
    config = SpecConfig(mode=mode, specla=True, budget=8, top_k=3, max_depth=5)
    for prompt in ([1, 2, 3, 4, 5], [900, 17, 901, 17, 902]):
        drafter = ModelDrafter(draft, target, n_ctx=128, max_depth=5, p_min=0.0, vocab=n_frequent)
        stats, ctx = generate(target, prompt, 40, config, drafter=drafter)
        ctx.close()
        assert stats.tokens == target.generate(prompt, 40)
        scored = set(drafter.context.logit_tokens.tolist())
        assert set(prompt) <= scored and set(stats.tokens[:-1]) <= scored


def test_proposals_come_from_the_reduced_vocabulary_and_rank_as_the_full_head(models):
    target, draft = models["target"], models["tied_q8_0"]
    full = ModelDrafter(draft, target, n_ctx=64, max_depth=4, p_min=0.0)
    reduced = ModelDrafter(draft, target, n_ctx=64, max_depth=4, p_min=0.0, vocab=300)
    history = [400, 5, 401, 6]
    full.history = reduced.history = history
    tokens_full, _ = full.propose(None, history[-1], 1, 1024)
    tokens, logprobs = reduced.propose(None, history[-1], 1, 8)
    scored = set(reduced.context.logit_tokens.tolist())
    assert set(tokens[0].tolist()) <= scored
    # the full ranking restricted to the scored tokens is the reduced ranking
    restricted = [t for t in tokens_full[0].tolist() if t in scored][:8]
    assert tokens[0].tolist() == restricted
    assert np.all(np.diff(logprobs[0]) <= 0) and np.all(logprobs <= 0)
