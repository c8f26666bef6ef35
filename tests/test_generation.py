"""Exact speculative sampling and the streaming API: for a fixed seed, speculative decoding (chain,
DDTree, SpecLA on and off; oracle, n-gram, DFlash and draft-model drafters) emits the tokens plain
sampling emits, token for token; Model.generation's Generation (cancel, stats, finish_reason,
logprobs), Model.stream / generate with sampling=, and Model.chat."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from pyspecla import Model, UsageError
from pyspecla.generation import GeneratedToken
from pyspecla.model import Context
from pyspecla.sampling import SamplingParams, TokenSampler
from pyspecla.speculative.drafters import OracleDrafter
from pyspecla.testing.models import write_test_model

N_TOKENS = 32

SAMPLINGS = {
    "t0.7": SamplingParams(temperature=0.7, seed=1),
    "t1-top_p0.9": SamplingParams(temperature=1.0, top_p=0.9, seed=2),
    # peaked: drafts are accepted often, so sampled paths of several nodes are walked
    "t0.3-top_k3-penalties": SamplingParams(temperature=0.3, top_k=3, min_p=0.05, repeat_penalty=1.2,
                                            presence_penalty=0.1, frequency_penalty=0.05, seed=3),
}

MODES = {"chain": {"no_ddtree": True}, "ddtree": {"ddtree_budget": 8}, "ddtree+specla": {"specla": True}}

# (model, prompt, sampling name) -> plain sampled tokens (N_TOKENS + 16: the oracle's continuation)
_PLAIN: dict = {}


def plain_sampled(model, prompt, name) -> list[int]:
    key = (id(model), tuple(prompt), name)
    if key not in _PLAIN:
        _PLAIN[key] = model.generate(prompt, N_TOKENS + 16, sampling=SAMPLINGS[name])
    return _PLAIN[key]


@pytest.fixture(scope="module")
def model(tiny_model_path):
    # one thread: the results are the same, and on a shared, busy machine two threads waiting for
    # each other at every op's barrier were measured 30x slower
    return Model.load(tiny_model_path("f32"), n_threads=1)


@pytest.fixture(scope="module")
def drafts(model, tmp_path_factory):
    from pyspecla.testing.drafts import write_test_draft

    base = tmp_path_factory.mktemp("sampling_drafts")
    dflash = str(base / "dflash.gguf")
    write_test_draft(dflash, model.file.path, seed=5)
    # a qwen2 language model with the target's token embedding (same seed) and vocabulary
    draft_model = str(base / "qwen2-draft.gguf")
    write_test_model(draft_model, preset="tiny", quant="f32", seed=0, arch="qwen2", vocab_pre="qwen35")
    return {"oracle": "oracle:p=0.8", "ngram": "ngram:n=2,max=6", "dflash": dflash, "model": draft_model}


def prompts(model, n=2, seed=0):
    rng = np.random.default_rng(seed)
    # repeated pieces give the n-gram drafter something to find
    out = []
    for _ in range(n):
        piece = rng.integers(0, model.hparams.n_vocab, 4).tolist()
        out.append(piece * 3 + rng.integers(0, model.hparams.n_vocab, 3).tolist())
    return out


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("drafter", ["oracle", "ngram", "dflash", "model"])
def test_speculative_sampling_equals_plain_sampling(model, drafts, drafter, mode):
    accepted_beyond_one = 0
    for name, sampling in SAMPLINGS.items():
        for i, prompt in enumerate(prompts(model, seed=7)):
            plain = plain_sampled(model, prompt, name)
            if drafter == "oracle":  # the plain sampled continuation, each token replaced w.p. 0.2
                draft = OracleDrafter(0.8, plain, model.hparams.n_vocab, seed=i)
            else:
                draft = drafts[drafter]
            generation = model.generation(prompt, N_TOKENS, sampling=sampling, draft=draft, stop_at_eos=False,
                                          **MODES[mode])
            assert [t.id for t in generation] == plain[:N_TOKENS], (drafter, mode, name, i)
            assert generation.finish_reason == "length"
            accepted = generation.stats["accepted_per_step"]
            accepted_beyond_one += sum(accepted) - len(accepted)
    if drafter in ("oracle", "model"):
        # both propose the target's likely tokens: some drafted token must have been accepted
        assert accepted_beyond_one > 0, "no step accepted a drafted token: the sampled walk was never exercised"


def test_greedy_generation_with_penalties_is_exact_under_speculation(model, drafts):
    sampling = SamplingParams(repeat_penalty=1.5, penalty_last_n=-1, presence_penalty=0.5)
    for prompt in prompts(model, seed=8):
        plain = model.generate(prompt, N_TOKENS, sampling=sampling)
        assert plain != model.generate(prompt, N_TOKENS), "the penalties changed nothing"
        for drafter in ("oracle", "model"):
            assert model.generate(prompt, N_TOKENS, sampling=sampling, draft=drafts[drafter], specla=True) == plain


def test_greedy_keeps_the_argmax_path_without_logit_copies(model, drafts, monkeypatch):
    seen = []
    verify, prefill = Context.verify_tree, Context.prefill

    def spy_verify(self, tokens, parents, want_logits=False):
        seen.append(("verify", want_logits))
        return verify(self, tokens, parents, want_logits)

    def spy_prefill(self, token_ids, want_logits=False, **kwargs):
        seen.append(("prefill", want_logits))
        return prefill(self, token_ids, want_logits, **kwargs)

    monkeypatch.setattr(Context, "verify_tree", spy_verify)
    monkeypatch.setattr(Context, "prefill", spy_prefill)
    monkeypatch.setattr(Context, "eval", lambda *a, **k: pytest.fail("greedy decoding copied logits"))
    prompt = prompts(model, 1, seed=9)[0]
    for draft in (None, drafts["oracle"]):
        seen.clear()
        tokens = [t for t in model.generation(prompt, 12, draft=draft, sampling=SamplingParams(top_p=0.5))]
        assert all(t.logprob is None and t.top_logprobs is None for t in tokens)
        assert seen and all(want is False for _, want in seen)
        assert (("verify", False) in seen) == (draft is not None)


def test_logprobs_are_those_of_the_processed_distribution_and_equal_under_speculation(model, drafts):
    prompt = prompts(model, 1, seed=10)[0]
    sampling = SamplingParams(temperature=0.8, top_k=20, repeat_penalty=1.1, seed=4)
    plain = list(model.generation(prompt, 16, sampling=sampling, logprobs=3))
    spec = list(model.generation(prompt, 16, sampling=sampling, logprobs=3, draft=drafts["oracle"], specla=True))
    assert spec == plain  # ids, logprobs and top lists, bit for bit
    rows = model.logits(prompt + [t.id for t in plain])[len(prompt) - 1:]
    sampler = TokenSampler(sampling)
    history = list(prompt)
    for token, row in zip(plain, rows):
        logprob, top = sampler.logprobs_of(row, history, token.id, 3)
        assert (token.logprob, token.top_logprobs) == (logprob, top)
        assert len(top) == 3 and token.logprob <= 0
        history.append(token.id)
    greedy = list(model.generation(prompt, 8, logprobs=2, draft=drafts["oracle"]))
    assert [t.id for t in greedy] == model.generate(prompt, 8)
    assert all(t.top_logprobs[0][0] == t.id and t.top_logprobs[0][1] == t.logprob for t in greedy)
    assert all(t.logprob is not None for t in model.generation(prompt, 4, token_logprobs=True))


def test_generation_reports_stats_and_finish_reasons(model, drafts):
    prompt = prompts(model, 1, seed=11)[0]
    sampling = SamplingParams(temperature=0.5, seed=9)
    plain = model.generation(prompt, 10, sampling=sampling)
    assert plain.finish_reason is None
    tokens = list(plain)
    assert all(isinstance(t, GeneratedToken) for t in tokens) and len(tokens) == 10
    assert plain.finish_reason == "length" and plain.token_ids == [t.id for t in tokens]
    stats = plain.stats
    assert stats["tokens"] == 10 and stats["steps"] == 9 and stats["accepted_per_step"] == [1] * 9
    assert stats["seed"] == 9 and stats["mode"] == "plain" and stats["prefill_ms"] > 0 and stats["decode_ms"] > 0
    spec = model.generation(prompt, 10, sampling=sampling, draft=drafts["oracle"])
    assert [t.id for t in spec] == plain.token_ids
    assert spec.stats["steps"] == len(spec.stats["accepted_per_step"]) and sum(spec.stats["accepted_per_step"]) >= 9
    assert isinstance(model.generation(prompt, 2, sampling=SamplingParams(temperature=1.0)).stats["seed"], int)
    # an end-of-generation token ends it with "stop", and is the last token yielded
    eos = plain.token_ids[4]
    saved = model.tokenizer.eos_ids
    try:
        model.tokenizer.eos_ids = {eos}
        for draft in (None, drafts["oracle"]):
            generation = model.generation(prompt, 10, sampling=sampling, draft=draft)
            assert [t.id for t in generation] == plain.token_ids[: plain.token_ids.index(eos) + 1]
            assert generation.finish_reason == "stop"
    finally:
        model.tokenizer.eos_ids = saved
    empty = model.generation(prompt, 0)
    assert list(empty) == [] and empty.finish_reason == "length"


@pytest.mark.parametrize("draft", [None, "oracle"])
def test_cancel_from_another_thread_stops_within_one_step_and_frees_the_context(model, drafts, draft):
    prompt = prompts(model, 1, seed=12)[0]
    generation = model.generation(prompt, 200, sampling=SamplingParams(temperature=0.7, seed=1),
                                  draft=drafts.get(draft), stop_at_eos=False)
    seen, cancelled_at = [], []
    second_token = threading.Event()
    cancel_done = threading.Event()

    def consume():
        for token in generation:
            seen.append(token.id)
            if len(seen) == 2:
                second_token.set()
                cancel_done.wait(10)

    thread = threading.Thread(target=consume)
    thread.start()
    assert second_token.wait(60)
    generation.cancel()
    cancelled_at.append(len(seen))
    cancel_done.set()
    thread.join(60)
    assert not thread.is_alive()
    assert generation.finish_reason == "cancelled"
    # tokens of the step already computed are dropped: nothing is yielded after cancel()
    assert len(seen) == cancelled_at[0] == 2
    assert generation._ctx is None  # freed
    generation.cancel()  # twice is fine
    assert list(generation) == []


def test_cancel_during_the_prompt_pass_stops_between_chunks(model):
    prompt = (prompts(model, 1, seed=13)[0] * 30)[:300]  # 5 chunks of at most 64 tokens
    chunks = []
    generation = None

    def on_prefill(done, total):
        chunks.append(done)
        if len(chunks) == 2:
            generation.cancel()  # (called from the iterating thread, inside a step)

    generation = model.generation(prompt, 8, on_prefill=on_prefill)
    assert list(generation) == []
    assert generation.finish_reason == "cancelled" and chunks == [64, 128]
    assert generation._ctx is None
    not_started = model.generation(prompt, 8)
    not_started.cancel()
    assert list(not_started) == [] and not_started.finish_reason == "cancelled"


def test_stream_and_generate_take_sampling(model):
    prompt = prompts(model, 1, seed=14)[0]
    sampling = SamplingParams(temperature=0.9, seed=21)
    expected = model.generate(prompt, 12, sampling=sampling)
    assert list(model.stream(prompt, 12, temperature=0.9, seed=21, stop_at_eos=False)) == expected
    assert list(model.stream(prompt, 12, sampling=sampling, stop_at_eos=False)) == expected
    assert list(model.stream(prompt, 12, stop_at_eos=False)) == model.generate(prompt, 12)
    with pytest.raises(UsageError, match="either sampling= or temperature/seed"):
        model.stream(prompt, 4, temperature=0.5, sampling=sampling)
    with pytest.raises(UsageError, match="temperature must be >= 0"):
        model.stream(prompt, 4, temperature=-1.0)


def test_chat_applies_the_template_and_streams_the_same_text(model, drafts):
    messages = [{"role": "user", "content": "Say something."}]
    ids = model.tokenize(model.tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    sampling = SamplingParams(temperature=0.9, seed=5)
    tokens = model.generate(ids, 12, sampling=sampling, stop_at_eos=True)
    shown = [t for t in tokens if t not in model.tokenizer.eos_ids]
    text = model.chat(messages, max_tokens=12, temperature=0.9, seed=5)
    assert text == model.detokenize(shown)
    streamed = model.chat(messages, stream=True, max_tokens=12, temperature=0.9, seed=5, draft=drafts["oracle"],
                          specla=True)
    pieces = list(streamed)
    assert all(isinstance(p, str) and p for p in pieces)
    assert "".join(pieces) == text and streamed.token_ids == tokens
    assert streamed.finish_reason in ("stop", "length")
    with pytest.raises(UsageError, match="unknown argument.*temprature"):
        model.chat(messages, temprature=0.5)
    with pytest.raises(UsageError, match="messages must be a list"):
        model.chat("hello")


@pytest.mark.parametrize("kwargs,needle", [
    ({"max_tokens": -1}, "max_tokens must be an integer >= 0"),
    ({"logprobs": -2}, "logprobs must be an integer >= 0"),
    ({"prompt_ids": [1, 10**6]}, "outside the vocabulary"),
    ({"prompt_ids": []}, "non-empty"),
    ({"sampling": SamplingParams(top_p=0.0)}, "top_p must be > 0"),
    ({"n_ctx": 4}, "cannot hold"),
    ({"specla": True}, "specla need a draft"),
    ({"draft": "ngram", "speculate": True}, "unknown option(s) speculate"),
    ({"draft": 3.5}, "draft must be None"),
])
def test_bad_generation_arguments_are_named(model, kwargs, needle):
    kwargs = {"prompt_ids": [1, 2, 3], "max_tokens": 4, **kwargs}
    with pytest.raises(UsageError) as info:
        model.generation(**kwargs)
    assert needle in str(info.value)
