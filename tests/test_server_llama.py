"""llama-server's endpoints through httpx: /health, /completion (its answer and streaming shapes,
tokens equal Model.generate, n_probs, stop words, ignore_eos), /tokenize, /detokenize, /props and
/metrics (Prometheus text whose counters follow the requests)."""

from __future__ import annotations

import json

import httpx
import numpy as np

from server_harness import RunningServer, module_fixtures

N = 20


model, server = module_fixtures(n_ctx=512)


def post(server, path, payload):
    return httpx.post(server.url + path, json=payload, timeout=60)


def sse_items(response) -> list[dict]:
    return [json.loads(line[len("data: "):]) for line in response.iter_lines() if line.startswith("data: ")]


def test_health(server):
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}


def test_completion_answers_in_llama_servers_shape(server, model):
    prompt = "class Cache:\n\tdef get(self, key"
    expected = model.generate(model.tokenize(prompt), N, stop_at_eos=True)
    body = post(server, "/completion", {"prompt": prompt, "n_predict": N, "temperature": 0, "seed": 5,
                                        "return_tokens": True}).json()
    assert body["tokens"] == expected
    assert body["content"] == model.tokenizer.decode([t for t in expected if t not in model.tokenizer.eos_ids],
                                                     skip_special=True)
    assert body["stop"] is True and body["stop_type"] == ("eos" if expected[-1] in model.tokenizer.eos_ids else "limit")
    assert body["tokens_predicted"] == len(expected) and body["tokens_evaluated"] == len(model.tokenize(prompt))
    assert body["generation_settings"]["seed"] == 5 and body["generation_settings"]["n_predict"] == N
    timings = body["timings"]
    assert timings["predicted_n"] == len(expected) - 1 and timings["predicted_ms"] > 0 and timings["prompt_ms"] > 0


def test_samplers_sent_at_their_off_values_are_served(server, model):
    """llama-server clients send every sampler with its default: mirostat 0, typical_p 1, DRY, XTC and
    dynamic temperature at 0 are off, so the request is served as without them (other values: 400,
    test_server_errors)."""
    prompt = "def add(a, b):"
    expected = model.generate(model.tokenize(prompt), N, stop_at_eos=True)
    body = post(server, "/completion", {"prompt": prompt, "n_predict": N, "temperature": 0, "return_tokens": True,
                                        "mirostat": 0, "typical_p": 1.0, "dry_multiplier": 0.0,
                                        "xtc_probability": 0.0, "dynatemp_range": 0.0}).json()
    assert body["tokens"] == expected


def test_streamed_completion_gives_the_same_tokens_then_a_final_item(server, model):
    prompt = "class Cache:\n\tdef get(self, key"
    whole = post(server, "/completion", {"prompt": prompt, "n_predict": N, "temperature": 0,
                                         "return_tokens": True}).json()
    with httpx.stream("POST", server.url + "/completion", json={"prompt": prompt, "n_predict": N, "temperature": 0,
                                                               "stream": True}, timeout=60) as response:
        items = sse_items(response)
    assert all(not item["stop"] for item in items[:-1]) and items[-1]["stop"] is True
    assert [t for item in items[:-1] for t in item["tokens"]] == whole["tokens"]
    assert "".join(item["content"] for item in items) == whole["content"]
    assert items[-1]["stop_type"] == whole["stop_type"] and items[-1]["tokens_predicted"] == len(whole["tokens"])


def test_stop_words_and_probabilities(server, model):
    prompt = "x = "
    tokens = model.generate(model.tokenize(prompt), N, stop_at_eos=True)
    text = model.tokenizer.decode(tokens, skip_special=True)
    word = text[5:8]
    body = post(server, "/completion", {"prompt": prompt, "n_predict": N, "temperature": 0, "stop": [word],
                                        "n_probs": 2}).json()
    assert body["content"] == text[: text.find(word)]
    assert body["stop_type"] == "word" and body["stopping_word"] == word
    probabilities = body["completion_probabilities"]
    assert [p["id"] for p in probabilities] == tokens[: len(probabilities)]
    for p in probabilities:  # greedy: the chosen token is the most likely one
        assert p["top_logprobs"][0]["id"] == p["id"] and len(p["top_logprobs"]) == 2
        assert p["top_logprobs"][0]["logprob"] >= p["top_logprobs"][1]["logprob"]
        assert np.isclose(p["logprob"], p["top_logprobs"][0]["logprob"])


def test_ignore_eos_generates_past_the_end_of_generation_token(server, model):
    eos = model.tokenizer.eos_id
    body = post(server, "/completion", {"prompt": [1, 2, 3], "n_predict": 6, "temperature": 0, "ignore_eos": True,
                                        "return_tokens": True}).json()
    assert body["tokens"] == model.generate([1, 2, 3], 6)  # (stop_at_eos off, the library's default)
    assert body["stop_type"] == "limit" and isinstance(eos, int)


def test_tokenize_and_detokenize_round_trip(server, model):
    text = "<|im_start|>user\nhello, 世界<|im_end|>"
    tokens = post(server, "/tokenize", {"content": text}).json()["tokens"]
    assert tokens == model.tokenize(text)
    assert model.tokenizer.token_id("<|im_start|>") in tokens
    plain = post(server, "/tokenize", {"content": text, "parse_special": False}).json()["tokens"]
    assert model.tokenizer.token_id("<|im_start|>") not in plain
    pieces = post(server, "/tokenize", {"content": "hello", "with_pieces": True}).json()["tokens"]
    assert "".join(p["piece"] for p in pieces) == "hello" and [p["id"] for p in pieces] == model.tokenize("hello")
    assert post(server, "/detokenize", {"tokens": tokens}).json() == {"content": text}


def test_props(server, model):
    props = httpx.get(server.url + "/props").json()
    assert props["total_slots"] == 1 and props["n_ctx"] == 512 and props["active_slots"] == 0
    assert props["chat_template"] == model.tokenizer.chat_template
    assert props["model_path"] == model.file.path
    assert props["eos_tokens"] == ["<|endoftext|>", "<|im_end|>"]  # the synthetic vocabulary's end tokens


def read_metrics(server) -> dict[str, float]:
    text = httpx.get(server.url + "/metrics").text
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.split()
            values[name] = float(value)
    return values


def test_metrics_follow_the_requests(server, model):
    before = read_metrics(server)
    post(server, "/completion", {"prompt": [5, 6, 7], "n_predict": 10, "temperature": 0, "ignore_eos": True})
    after = read_metrics(server)
    assert after["pyspecla_requests_total"] == before["pyspecla_requests_total"] + 1
    assert after["pyspecla_tokens_generated_total"] == before["pyspecla_tokens_generated_total"] + 10
    assert after["pyspecla_prompt_tokens_total"] == before["pyspecla_prompt_tokens_total"] + 3
    assert after["pyspecla_queue_depth"] == 0 and after["pyspecla_active_generations"] == 0
    assert after["pyspecla_decode_tokens_per_second"] > 0
    assert after["pyspecla_accepted_tokens_per_step"] == 1.0  # plain decoding: one token per step


def test_metrics_count_accepted_tokens_per_step_with_a_draft(model):
    """With the n-gram drafter on a repetitive prompt, steps commit more than one token. The n-gram
    drafter runs under the loss guard (speculative/guard.py), which sizes proposals from measured step
    times: one slow speculative step (in a loaded full-suite run, once) can hold a 40-token generation
    to plain steps. The gauge covers every finished generation, so the same request runs twice and a
    single stalled generation does not decide the test; one whose drafts never pay still fails it."""
    with RunningServer(model, draft="ngram") as running:
        prompt = "the cache the cache the cache the cache the cache"
        for _ in range(2):
            post(running, "/completion", {"prompt": prompt, "n_predict": 40, "temperature": 0, "ignore_eos": True})
        values = read_metrics(running)
    assert values["pyspecla_tokens_generated_total"] == 80
    # measured 1.34 for one generation (47 tokens committed in 35 steps); plain decoding commits exactly 1.0
    assert values["pyspecla_accepted_tokens_per_step"] > 1.0
