"""What the server answers to bad or unlucky requests: 400 in OpenAI's error shape naming the field
(malformed JSON, invalid values, n > 1, a prompt over the context, unsupported options), 401 without
the API key, 429 with Retry-After when the queue is full, and a client that gives up during the
prompt pass stops it within a chunk; never a 500 or a stuck worker."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from server_harness import ContextCounter, RunningServer, module_fixtures

from pyspecla import UsageError


model, server = module_fixtures(n_ctx=256)


def post(server, path, **kwargs):
    return httpx.post(server.url + path, timeout=30, **kwargs)


def assert_openai_error(response, status, param=None, needle=""):
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["param"] == param, body
    assert needle in body["error"]["message"], body
    return body["error"]


CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}


@pytest.mark.parametrize("path,payload,param,needle", [
    ("/v1/chat/completions", {**CHAT, "n": 2}, "n", "only n=1"),
    ("/v1/chat/completions", {**CHAT, "temperature": "hot"}, "temperature", "valid number"),
    ("/v1/chat/completions", {**CHAT, "temperature": -0.5}, "temperature", "greater than or equal to 0"),
    ("/v1/chat/completions", {**CHAT, "top_p": 1.5}, "top_p", "less than or equal to 1"),
    ("/v1/chat/completions", {**CHAT, "top_p": 0}, "top_p", "greater than 0"),
    ("/v1/chat/completions", {**CHAT, "seed": 2**64}, "seed", "less than 18446744073709551616"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 50}, "top_logprobs", "less than or equal to 20"),
    ("/v1/chat/completions", {**CHAT, "messages": []}, "messages", "at least 1"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "robot", "content": "x"}]}, "messages.0.role", "user"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages.0.content", "only text parts"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_object"}}, "response_format",
     "not supported"),
    ("/v1/chat/completions", {**CHAT, "tool_choice": "required"}, "tool_choice", "only 'auto' and 'none'"),
    ("/v1/chat/completions", {**CHAT, "chat_template_kwargs": {"enable_thinking": "false"}},
     "chat_template_kwargs.enable_thinking", 'must be true or false, got "false"'),
    ("/v1/chat/completions", {"max_tokens": 4}, "messages", "Field required"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "word " * 400}]}, "messages",
     "context holds 256"),
    ("/v1/completions", {"prompt": ["a", "b"], "max_tokens": 2}, "prompt", "one prompt per request"),
    ("/v1/completions", {"prompt": [5, 999999], "max_tokens": 2}, "prompt", "outside the vocabulary"),
    ("/v1/completions", {"prompt": "", "max_tokens": 2}, "prompt", "empty"),
    ("/v1/completions", {"prompt": "x", "stop": 3}, "stop", ""),
    ("/completion", {"prompt": "x", "n_predict": -2}, "n_predict", "greater than or equal to -1"),
    ("/completion", {"prompt": "x", "grammar": 'root ::= "a"'}, "grammar", "not supported"),
    ("/completion", {"prompt": "x", "json_schema": {"type": "object"}}, "json_schema", "not supported"),
    ("/completion", {"prompt": "x", "logit_bias": [[5, -100]]}, "logit_bias", "not supported"),
    ("/completion", {"prompt": "x", "logit_bias": {"5": False}}, "logit_bias", "not supported"),
    ("/completion", {"prompt": "x", "mirostat": 2}, "mirostat", "mirostat is not supported"),
    ("/completion", {"prompt": "x", "typical_p": 0.5}, "typical_p", "typical_p is not supported"),
    ("/completion", {"prompt": "x", "dry_multiplier": 0.8}, "dry_multiplier", "not supported"),
    ("/completion", {"prompt": "x", "xtc_probability": 0.5}, "xtc_probability", "not supported"),
    ("/completion", {"prompt": "x", "dynatemp_range": 0.5}, "dynatemp_range", "not supported"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 2, "best_of": 3}, "best_of", "only best_of=1"),
    ("/detokenize", {"tokens": [1, 10**9]}, "tokens", "outside the vocabulary"),
    ("/tokenize", {"content": 3}, "content", "valid string"),
])
def test_bad_requests_are_400_naming_the_field(server, path, payload, param, needle):
    error = assert_openai_error(post(server, path, json=payload), 400, param, needle)
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("body,needle", [(b"{not json", "malformed JSON"), (b"", "empty"), (b"[1, 2]", "JSON object"),
                                         (b"\xff\xfe", "not UTF-8"),
                                         (b"[" * 100_000 + b"]" * 100_000, "nested too deeply")],
                         ids=["not-json", "empty", "array", "not-utf8", "nested-100000-deep"])
def test_malformed_bodies_are_400(server, body, needle):
    response = post(server, "/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert_openai_error(response, 400, None, needle)


def test_unknown_paths_and_methods_keep_the_error_shape(server):
    assert_openai_error(httpx.get(server.url + "/v1/nothing"), 404, None, "Not Found")
    assert_openai_error(httpx.get(server.url + "/v1/chat/completions"), 405, None, "Method Not Allowed")


def test_the_server_still_answers_after_all_that(server, model):
    response = post(server, "/completion", json={"prompt": "hello", "n_predict": 4, "temperature": 0,
                                                 "return_tokens": True})
    assert response.status_code == 200
    assert response.json()["tokens"] == model.generate(model.tokenize("hello"), 4, stop_at_eos=True)
    assert server.engine.n_active == 0 and server.engine.metrics.requests_failed == 0


def test_the_api_key_is_required_everywhere_but_health(model):
    with RunningServer(model, api_key="s3cret") as running:
        url = running.url
        assert httpx.get(url + "/health").status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": "s3cre"}, {"Authorization": "s3cret"}):
            assert_openai_error(httpx.get(url + "/v1/models", headers=headers), 401, None, "API key")
        response = httpx.post(url + "/v1/messages", json={"max_tokens": 2, "messages": []})
        assert response.status_code == 401 and response.json()["error"]["type"] == "authentication_error"
        assert response.json()["type"] == "error"  # Anthropic's shape on its endpoint
        for headers in ({"Authorization": "Bearer s3cret"}, {"x-api-key": "s3cret"}):
            assert httpx.get(url + "/v1/models", headers=headers).status_code == 200


def test_a_full_queue_answers_429_with_retry_after(model):
    with RunningServer(model, parallel=1, queue_size=1, n_ctx=4096) as running:
        long_request = {"prompt": "hello", "n_predict": 2000, "temperature": 0, "stream": True}
        with httpx.Client(timeout=30) as first, httpx.Client(timeout=30) as second:
            with first.stream("POST", running.url + "/completion", json=long_request) as streaming:
                lines = streaming.iter_lines()  # (kept: a dropped iterator closes the stream)
                next(lines)  # the first request holds the only slot
                waiting = threading.Thread(target=lambda: second.post(running.url + "/completion",
                                                                      json={"prompt": "x", "n_predict": 2,
                                                                            "temperature": 0}))
                waiting.start()
                deadline = time.monotonic() + 10
                while running.engine.n_waiting < 1 and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert running.engine.n_waiting == 1
                busy = httpx.post(running.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2,
                                                                          "temperature": 0})
                assert_openai_error(busy, 429, None, "busy")
                assert busy.headers["Retry-After"] == "1"
                assert running.engine.metrics.requests_rejected == 1
            waiting.join(30)  # the first stream closed: the queued request runs
            assert not waiting.is_alive()
        running.wait_idle()
        assert running.engine.metrics.requests_total == 2


def test_a_client_that_gives_up_during_the_prompt_pass_stops_it(model, tiny_model_path):
    """A 2000-token prompt takes many 64-token chunks (measured here: ~0.3 s a chunk, ~10 s in all on
    a busy 2-core machine); the client gives up after 0.5 s; the server is idle again within 3 s
    (a chunk or a few), generated nothing, and the context is closed."""
    counter = ContextCounter(model)
    try:
        with RunningServer(model, n_ctx=4096) as running:
            prompt = [(7 * i) % 900 + 10 for i in range(2000)]
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(running.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 4,
                                                                  "temperature": 0}, timeout=0.5)
            t0 = time.monotonic()
            assert running.engine.n_active == 1 or running.engine.metrics.requests_cancelled == 1
            running.wait_idle(timeout_s=3.0)
            print(f"idle {time.monotonic() - t0:.2f} s after the client left")
            assert running.engine.metrics.tokens_generated == 0
            assert running.engine.metrics.requests_cancelled == 1
            assert counter.contexts and counter.open == 0
    finally:
        counter.restore()


class FailingModel:
    """A real model whose generation raises `error` when its prompt starts with token 0."""

    def __init__(self, model, error):
        self._model = model
        self.error = error

    def __getattr__(self, name):
        return getattr(self._model, name)

    def generation(self, prompt_ids, *args, **kwargs):
        if prompt_ids[0] == 0:
            raise self.error
        return self._model.generation(prompt_ids, *args, **kwargs)


@pytest.mark.parametrize("error,status", [(UsageError("a value the library refuses"), 400),
                                          (RuntimeError("native failure"), 500)])
def test_a_generation_that_raises_answers_an_error_and_the_worker_goes_on(model, error, status):
    with RunningServer(FailingModel(model, error)) as running:
        failed = post(running, "/v1/completions", json={"prompt": [0, 5, 6], "max_tokens": 3, "temperature": 0})
        assert_openai_error(failed, status, None, str(error))
        with httpx.stream("POST", running.url + "/v1/completions", json={"prompt": [0, 5], "max_tokens": 3,
                                                                        "temperature": 0, "stream": True}) as streamed:
            lines = [line for line in streamed.iter_lines() if line.startswith("data: ")]
        assert len(lines) == 1 and str(error) in lines[0] and '"error"' in lines[0]
        fine = post(running, "/v1/completions", json={"prompt": [5, 6], "max_tokens": 3, "temperature": 0})
        assert fine.status_code == 200
        assert fine.json()["usage"]["completion_tokens"] == len(model.generate([5, 6], 3, stop_at_eos=True))
        assert running.engine.metrics.requests_failed == 2 and running.engine.n_active == 0
