"""The Python entry point for speculative decoding: Model.generate(ids, n, draft=...) returns the
tokens of plain greedy generation for every kind of draft (a DFlash draft file, ngram, oracle, a
drafter object) and names bad arguments."""

from __future__ import annotations

import numpy as np
import pytest

from pyspecla import Model, UsageError
from pyspecla.speculative.drafters import OracleDrafter

N_TOKENS = 40


@pytest.fixture(scope="module")
def model(tiny_model_path):
    return Model.load(tiny_model_path("f32"))


@pytest.fixture(scope="module")
def dflash_path(model, tmp_path_factory):
    from pyspecla.testing.drafts import write_test_draft

    path = str(tmp_path_factory.mktemp("api") / "draft.gguf")
    write_test_draft(path, model.file.path, seed=5)
    return path


def prompts(model, n=3, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, model.hparams.n_vocab, int(rng.integers(2, 10))).tolist() for _ in range(n)]


@pytest.mark.parametrize("options", [{}, {"specla": True}, {"no_ddtree": True}, {"ddtree_budget": 5, "ddtree_tau": 0.0}])
@pytest.mark.parametrize("draft", ["dflash", "ngram", "ngram:n=2,max=4", "oracle:p=0.8", "object"])
def test_generate_with_a_draft_equals_plain_generation(model, dflash_path, draft, options):
    for i, prompt in enumerate(prompts(model, seed=3)):
        plain = model.generate(prompt, N_TOKENS)
        assert len(plain) == N_TOKENS
        if draft == "dflash":
            given = dflash_path
        elif draft == "object":
            given = OracleDrafter(0.7, model.generate(prompt, N_TOKENS + 16), model.hparams.n_vocab, seed=i)
        else:
            given = draft
        assert model.generate(prompt, N_TOKENS, draft=given, **options) == plain, (draft, options, i)


def test_generate_with_a_draft_stops_at_eos_like_plain_generation(model):
    prompt = prompts(model, 1, seed=4)[0]
    plain = model.generate(prompt, N_TOKENS)
    eos = plain[N_TOKENS // 2]  # make a token the plain run emits an end-of-generation token
    tokenizer = model.tokenizer
    saved = tokenizer.eos_ids
    try:
        tokenizer.eos_ids = {eos}
        expected = model.generate(prompt, N_TOKENS, stop_at_eos=True)
        assert expected == plain[: plain.index(eos) + 1]
        assert model.generate(prompt, N_TOKENS, stop_at_eos=True, draft="oracle:p=0.9") == expected
    finally:
        tokenizer.eos_ids = saved


@pytest.mark.parametrize("kwargs,needle", [
    ({"specla": True}, "specla need a draft"),
    ({"draft": "ngram", "speculate": True}, "unknown option(s) speculate"),
    ({"draft": 3}, "draft must be None, a draft GGUF path"),
    ({"draft": "ngram", "ddtree_budget": 0}, "ddtree_budget must be a positive integer, got 0"),
    ({"draft": "ngram", "draft_max": 3}, "--draft-max applies to a draft language model"),
    ({"draft": "no/such/draft.gguf"}, "no/such/draft.gguf"),
])
def test_bad_generate_arguments_are_named(model, kwargs, needle):
    from pyspecla import SpeclaError

    with pytest.raises(SpeclaError) as info:
        model.generate([1, 2, 3], 4, **kwargs)
    assert needle in str(info.value), str(info.value)


def test_a_drafter_object_with_draft_model_options_is_refused(model):
    drafter = OracleDrafter(0.7, model.generate([1, 2], 8), model.hparams.n_vocab)
    with pytest.raises(UsageError, match="draft_vocab applies to a draft language model given by path"):
        model.generate([1, 2], 4, draft=drafter, draft_vocab=64)
