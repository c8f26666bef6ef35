"""The server's OpenAI endpoints driven by the real `openai` client, on the tiny synthetic model:
greedy output equals Model.generate (plain, n-gram draft, draft model), streaming equals the one-shot
answer, stop strings cut across chunk boundaries, usage in the last chunk, logprobs, a tool call and
thinking (a scripted model), cancelling mid-stream frees the context and the server goes on."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from server_harness import ContextCounter, RunningServer, ScriptedModel, module_fixtures

openai = pytest.importorskip("openai")

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Write a haiku about caches."}]
N = 24


model, server = module_fixtures()


def client(server, **kwargs):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=kwargs.pop("api_key", "unused"), max_retries=0,
                         **kwargs)


def chat_ids(model, messages=MESSAGES):
    return model.tokenize(model.tokenizer.apply_chat_template(messages, add_generation_prompt=True))


def visible_text(model, tokens):
    """What the server shows of generated tokens: no end-of-generation token, no control tokens."""
    shown = [t for t in tokens if t not in model.tokenizer.eos_ids]
    return model.tokenizer.decode(shown, skip_special=True)


def test_greedy_chat_equals_model_generate(server, model):
    expected = model.generate(chat_ids(model), N, stop_at_eos=True)
    answer = client(server).chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=N, temperature=0)
    choice = answer.choices[0]
    assert choice.message.content == visible_text(model, expected)
    assert choice.finish_reason == ("stop" if expected[-1] in model.tokenizer.eos_ids else "length")
    assert answer.usage.prompt_tokens == len(chat_ids(model))
    assert answer.usage.completion_tokens == len(expected)
    assert answer.object == "chat.completion" and answer.model == "tiny-f32-0.gguf"


def test_streamed_chat_equals_the_one_shot_answer_and_ends_with_usage(server, model):
    c = client(server)
    whole = c.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=N, temperature=0)
    chunks = list(c.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=N, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(ch.usage is None for ch in chunks[:-1])
    assert len([ch for ch in chunks if ch.choices and ch.choices[0].delta.content]) > 3  # really streamed


def test_completions_greedy_equals_model_generate_for_text_and_token_prompts(server, model):
    prompt = "def greedy_decode(model, prompt_ids):"
    expected = model.generate(model.tokenize(prompt), N, stop_at_eos=True)
    c = client(server)
    for given in (prompt, model.tokenize(prompt)):
        answer = c.completions.create(model="tiny", prompt=given, max_tokens=N, temperature=0)
        assert answer.choices[0].text == visible_text(model, expected)
        assert answer.usage.completion_tokens == len(expected)
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model="tiny", prompt=prompt, max_tokens=N, temperature=0, stream=True) if ch.choices)
    assert streamed == visible_text(model, expected)


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_cuts_the_output_even_across_chunks(server, model, stream):
    """The stop string is made of the end of one generated token and the start of the next, so it
    never sits inside one chunk; the answer stops right before it, finish_reason stop."""
    prompt = "import numpy as np\n"
    tokens = model.generate(model.tokenize(prompt), N, stop_at_eos=True)
    pieces = [model.tokenizer.decode([t]) for t in tokens]
    k = next(i for i in range(3, len(pieces) - 1) if len(pieces[i]) >= 2 and pieces[i + 1])
    stop = pieces[k][-2:] + pieces[k + 1][:1]
    full = "".join(pieces)
    expected = full[: full.find(stop)]
    c = client(server)
    if stream:
        chunks = list(c.completions.create(model="tiny", prompt=prompt, max_tokens=N, temperature=0, stop=[stop],
                                           stream=True))
        text = "".join(ch.choices[0].text for ch in chunks)
        finish = chunks[-1].choices[0].finish_reason
    else:
        answer = c.completions.create(model="tiny", prompt=prompt, max_tokens=N, temperature=0, stop=stop)
        text, finish = answer.choices[0].text, answer.choices[0].finish_reason
    assert text == expected and finish == "stop"
    assert stop not in text


def test_logprobs_are_those_of_the_model(server, model):
    prompt_ids = chat_ids(model)
    answer = client(server).chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, temperature=0,
                                                    logprobs=True, top_logprobs=3)
    entries = answer.choices[0].logprobs.content
    tokens = model.generate(prompt_ids, 4, stop_at_eos=True)
    assert len(entries) == len(tokens)
    # the first token's log-probabilities from the full logits of a fresh context
    logits = model.logits(prompt_ids)[-1].astype(np.float64)
    logp = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
    top = np.argsort(-logp)[:3]
    first = entries[0]
    assert first.token == model.tokenizer.token_bytes(tokens[0]).decode("utf-8", "replace")
    assert abs(first.logprob - logp[tokens[0]]) < 1e-4  # float32 logits; measured < 1e-6
    assert [bytes(t.bytes) for t in first.top_logprobs] == [model.tokenizer.token_bytes(int(i)) for i in top]
    assert np.allclose([t.logprob for t in first.top_logprobs], logp[top], atol=1e-4)


@pytest.mark.parametrize("draft", ["ngram", "draft_model"])
def test_greedy_output_with_a_draft_equals_plain_generation(model, tiny_model_path, draft):
    """The server speculating with the n-gram drafter or a draft model (the q8_0 file of the same
    weights, loaded once for the slot and reused by every request) answers what plain greedy
    decoding gives."""
    spec = "ngram" if draft == "ngram" else tiny_model_path("q8_0")
    prompts = ["def greedy_decode(model, prompt_ids):", "the cache the cache the cache"]
    with RunningServer(model, draft=spec, speculative_options={"specla": True}) as running:
        (slot_draft,) = running.engine._free_drafts
        assert slot_draft == "ngram" if draft == "ngram" else type(slot_draft).__name__ == "ModelDrafter"
        c = client(running)
        for prompt in prompts:
            expected = model.generate(model.tokenize(prompt), N, stop_at_eos=True)
            answer = c.completions.create(model="tiny", prompt=prompt, max_tokens=N, temperature=0)
            assert answer.choices[0].text == visible_text(model, expected), prompt
            assert answer.usage.completion_tokens == len(expected)
        assert running.engine._free_drafts == [slot_draft]


def test_a_tool_call_comes_back_as_tool_calls(model):
    scripted = ScriptedModel(model, 'Let me look.<tool_call>\n{"name": "get_weather", "arguments": '
                                    '{"city": "Paris"}}\n</tool_call>')
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "weather of a city",
                                                "parameters": {"type": "object",
                                                               "properties": {"city": {"type": "string"}}}}}]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    with RunningServer(scripted) as running:
        c = client(running)
        answer = c.chat.completions.create(model="tiny", messages=messages, tools=tools, max_tokens=64, temperature=0)
        choice = answer.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content == "Let me look."
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris"}
        # the tools reached the template (the synthetic ChatML template ignores them: the prompt is
        # the same as without) and streaming gives the call as a delta
        chunks = list(c.chat.completions.create(model="tiny", messages=messages, tools=tools, max_tokens=64,
                                                temperature=0, stream=True))
        deltas = [d for ch in chunks for d in (ch.choices[0].delta.tool_calls or [])]
        assert [(d.index, d.function.name, json.loads(d.function.arguments)) for d in deltas] == \
            [(0, "get_weather", {"city": "Paris"})]
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        # a later turn with the call and its result renders through the template
        history = messages + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                              {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
        scripted.text = "It is sunny."
        answer = c.chat.completions.create(model="tiny", messages=history, tools=tools, max_tokens=64, temperature=0)
        assert answer.choices[0].message.content == "It is sunny." and answer.choices[0].finish_reason == "stop"


def test_thinking_goes_to_reasoning_content_unless_turned_off(model):
    scripted = ScriptedModel(model, "<think>\nThe user greets.\n</think>\n\nHello!")
    with RunningServer(scripted) as running:
        c = client(running)
        hi = [{"role": "user", "content": "hi"}]
        answer = c.chat.completions.create(model="tiny", messages=hi, max_tokens=64, temperature=0)
        message = answer.choices[0].message
        assert message.content == "\n\nHello!"
        assert message.model_extra["reasoning_content"] == "\nThe user greets.\n"
        chunks = list(c.chat.completions.create(model="tiny", messages=hi, max_tokens=64, temperature=0, stream=True))
        reasoning = "".join(ch.choices[0].delta.model_extra.get("reasoning_content") or "" for ch in chunks)
        assert reasoning == "\nThe user greets.\n"
        off = c.chat.completions.create(model="tiny", messages=hi, max_tokens=64, temperature=0,
                                        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        assert off.choices[0].message.content == scripted.text
        assert "reasoning_content" not in (off.choices[0].message.model_extra or {})


def test_cancelling_a_stream_frees_its_context_and_the_server_serves_the_next_request(model):
    counter = ContextCounter(model)
    try:
        with RunningServer(model, n_ctx=4096) as running:
            c = client(running)
            stream = c.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3000, temperature=0,
                                               stream=True)
            received = 0
            for chunk in stream:
                received += 1
                if received == 5:
                    break
            stream.close()  # drops the connection
            t_idle = running.wait_idle(timeout_s=5.0)
            generated = running.engine.metrics.tokens_generated
            assert generated < 3000, "the generation ran to the end"
            assert running.engine.metrics.requests_cancelled == 1
            assert counter.contexts and counter.open == 0
            time.sleep(0.3)
            assert running.engine.metrics.tokens_generated == generated  # nothing runs any more
            expected = model.generate(chat_ids(model), N, stop_at_eos=True)
            answer = c.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=N, temperature=0)
            assert answer.choices[0].message.content == visible_text(model, expected)
            assert counter.open == 0 and running.engine.n_active == 0
            print(f"idle {t_idle * 1e3:.0f} ms after the disconnect, {generated} tokens generated")
    finally:
        counter.restore()


def test_the_models_list(server):
    models = client(server).models.list()
    assert [m.id for m in models.data] == ["tiny-f32-0.gguf"]


def test_parallel_slots_serve_concurrent_requests_each_exactly(model):
    """Four concurrent requests on two slots (and two waiting): each answer equals its own plain
    greedy generation, and the two slots really ran at once."""
    import asyncio

    prompts = ["def greedy_decode(model, prompt_ids):", "The cache keeps", "import numpy as np\n", "x = "]
    expected = [visible_text(model, model.generate(model.tokenize(p), N, stop_at_eos=True)) for p in prompts]
    with RunningServer(model, parallel=2, queue_size=2) as running:
        peak = []

        async def main():
            c = openai.AsyncOpenAI(base_url=running.url + "/v1", api_key="unused", max_retries=0)

            async def watch():
                while True:
                    peak.append(running.engine.n_active)
                    await asyncio.sleep(0.005)

            watcher = asyncio.create_task(watch())
            answers = await asyncio.gather(*(c.completions.create(model="tiny", prompt=p, max_tokens=N, temperature=0)
                                             for p in prompts))
            watcher.cancel()
            await c.close()
            return [a.choices[0].text for a in answers]

        assert asyncio.run(main()) == expected
        assert max(peak) == 2
        running.wait_idle()
