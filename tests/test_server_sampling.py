"""Seeded sampling through the server equals plain sampling in the library with the same seed and
knobs, token for token — with and without a draft (n-gram, draft model) — and the server's defaults
are the documented ones (a request that names only a seed samples like SamplingParams with
llama-server's defaults and that seed)."""

from __future__ import annotations

import httpx
import pytest

from server_harness import RunningServer, module_fixtures

from pyspecla.sampling import SamplingParams
from pyspecla.server.prompts import DEFAULT_SAMPLING, PENALTY_LAST_N

N = 24
PROMPTS = ["def greedy_decode(model, prompt_ids):", "The cache keeps the most recent"]
KNOBS = [
    {},  # the server's defaults
    {"temperature": 1.0, "top_k": 0, "top_p": 0.9},
    {"temperature": 0.7, "min_p": 0.1, "repeat_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": 0.3},
]


model, _ = module_fixtures()


def plain_sampling(model, prompt, knobs, seed):
    params = SamplingParams(**{**DEFAULT_SAMPLING, **knobs}, penalty_last_n=PENALTY_LAST_N, seed=seed)
    return model.generate(model.tokenize(prompt), N, stop_at_eos=True, sampling=params)


@pytest.mark.parametrize("draft", [None, "ngram", "draft_model"])
def test_seeded_sampling_through_the_server_equals_plain_sampling(model, tiny_model_path, draft):
    spec = {None: None, "ngram": "ngram", "draft_model": tiny_model_path("q8_0")}[draft]
    with RunningServer(model, draft=spec) as running:
        differ = 0
        for k, knobs in enumerate(KNOBS):
            for i, prompt in enumerate(PROMPTS):
                seed = 100 * k + i
                expected = plain_sampling(model, prompt, knobs, seed)
                body = httpx.post(running.url + "/completion", json={"prompt": prompt, "n_predict": N, "seed": seed,
                                                                     "return_tokens": True, **knobs}, timeout=120).json()
                assert body["tokens"] == expected, (knobs, prompt)
                assert body["generation_settings"]["seed"] == seed
                differ += expected != model.generate(model.tokenize(prompt), N, stop_at_eos=True)
        assert differ >= len(KNOBS) * len(PROMPTS) - 1  # really sampled: (almost) never the greedy tokens


def test_the_same_seed_gives_the_same_chat_answer_and_another_seed_another(model):
    pytest.importorskip("openai")
    import openai

    with RunningServer(model) as running:
        c = openai.OpenAI(base_url=running.url + "/v1", api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": "Tell me a story."}]
        answers = [c.chat.completions.create(model="tiny", messages=messages, max_tokens=N, seed=seed,
                                             temperature=1.0).choices[0].message.content for seed in (3, 3, 4)]
        assert answers[0] == answers[1] and answers[0] != answers[2]


@pytest.mark.parametrize("draft", [None, "ngram"])
def test_server_text_equals_pyspecla_run_with_the_same_settings(model, tiny_model_path, draft, capsys):
    """The same prompt, knobs and seed through `/completion` and through `pyspecla run` give the same
    text, greedy and sampled, with and without a draft (both equal plain decoding by the test above)."""
    from pyspecla.cli import main

    path = tiny_model_path("f32")
    prompt = PROMPTS[0]
    settings = [
        ({"temperature": 0.0}, ["--temp", "0"]),
        ({"temperature": 0.7, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0, "seed": 11},
         ["--temp", "0.7", "--top-k", "40", "--top-p", "0.95", "--min-p", "0.05", "--seed", "11"]),
    ]
    with RunningServer(model, draft=draft) as running:
        for knobs, flags in settings:
            body = httpx.post(running.url + "/completion", json={"prompt": prompt, "n_predict": N, **knobs},
                              timeout=120).json()
            argv = ["run", path, "-p", prompt, "-n", str(N), *flags, *(["--draft", draft] if draft else [])]
            capsys.readouterr()
            assert main(argv) == 0
            assert body["content"], "an empty answer would make the comparison vacuous"
            assert capsys.readouterr().out == body["content"] + "\n", (knobs, draft)
