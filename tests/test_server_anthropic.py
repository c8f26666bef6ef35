"""Anthropic's /v1/messages through httpx: the one-shot message (greedy text equals Model.generate
on the template's prompt), the streaming event sequence, thinking and tool_use blocks (a scripted
model), tool results in a later turn, Anthropic's error shape."""

from __future__ import annotations

import json

import httpx
import pytest

from server_harness import RunningServer, ScriptedModel, module_fixtures

N = 16


model, server = module_fixtures()


def post(server, payload):
    return httpx.post(server.url + "/v1/messages", json=payload, timeout=60)


def events(server, payload) -> list[tuple[str, dict]]:
    out = []
    with httpx.stream("POST", server.url + "/v1/messages", json={**payload, "stream": True}, timeout=60) as response:
        assert response.status_code == 200
        name = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: "):])
                assert data["type"] == name
                out.append((name, data))
    return out


REQUEST = {"model": "tiny", "max_tokens": N, "temperature": 0, "system": "Be brief.",
           "messages": [{"role": "user", "content": [{"type": "text", "text": "Name a colour."}]}]}


def test_a_message_equals_model_generate_on_the_templates_prompt(server, model):
    prompt = model.tokenizer.apply_chat_template([{"role": "system", "content": "Be brief."},
                                                  {"role": "user", "content": "Name a colour."}])
    expected = model.generate(model.tokenize(prompt), N, stop_at_eos=True)
    body = post(server, REQUEST).json()
    assert body["type"] == "message" and body["role"] == "assistant" and body["id"].startswith("msg_")
    shown = [t for t in expected if t not in model.tokenizer.eos_ids]
    assert body["content"] == [{"type": "text", "text": model.tokenizer.decode(shown, skip_special=True)}]
    assert body["stop_reason"] == ("end_turn" if expected[-1] in model.tokenizer.eos_ids else "max_tokens")
    assert body["usage"] == {"input_tokens": len(model.tokenize(prompt)), "output_tokens": len(expected)}


def test_the_streaming_event_sequence(server):
    whole = post(server, REQUEST).json()
    sequence = events(server, REQUEST)
    names = [name for name, _ in sequence]
    assert names[0] == "message_start" and names[1] == "content_block_start"
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[2:-3]) == {"content_block_delta"}
    text = "".join(data["delta"]["text"] for name, data in sequence if name == "content_block_delta")
    assert text == whole["content"][0]["text"]
    delta = sequence[-2][1]
    assert delta["delta"]["stop_reason"] == whole["stop_reason"]
    assert delta["usage"]["output_tokens"] == whole["usage"]["output_tokens"]
    assert sequence[0][1]["message"]["usage"]["input_tokens"] == whole["usage"]["input_tokens"]


def test_thinking_and_tool_use_blocks(model):
    scripted = ScriptedModel(model, '<think>\nNeed the weather.\n</think>\n\nChecking.<tool_call>\n{"name": '
                                    '"get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
    tools = [{"name": "get_weather", "description": "weather of a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    request = {"max_tokens": 200, "temperature": 0, "tools": tools,
               "messages": [{"role": "user", "content": "Weather in Oslo?"}]}
    with RunningServer(scripted) as running:
        body = post(running, request).json()
        assert [b["type"] for b in body["content"]] == ["thinking", "text", "tool_use"]
        assert body["content"][0]["thinking"] == "\nNeed the weather.\n"
        assert body["content"][1]["text"] == "\n\nChecking."
        tool_use = body["content"][2]
        assert tool_use["name"] == "get_weather" and tool_use["input"] == {"city": "Oslo"}
        assert tool_use["id"].startswith("toolu_") and body["stop_reason"] == "tool_use"

        sequence = events(running, request)
        starts = [data["content_block"]["type"] for name, data in sequence if name == "content_block_start"]
        assert starts == ["thinking", "text", "tool_use"]
        stops = [data["index"] for name, data in sequence if name == "content_block_stop"]
        assert stops == [0, 1, 2]
        deltas = [data["delta"] for name, data in sequence if name == "content_block_delta"]
        assert "".join(d.get("thinking", "") for d in deltas) == "\nNeed the weather.\n"
        assert [json.loads(d["partial_json"]) for d in deltas if d["type"] == "input_json_delta"] == [{"city": "Oslo"}]
        assert sequence[-2][1]["delta"]["stop_reason"] == "tool_use"

        # the next turn carries the tool_use and its tool_result; thinking off by request
        scripted.text = "Cold."
        follow = {"max_tokens": 50, "temperature": 0, "tools": tools, "thinking": {"type": "disabled"},
                  "messages": [request["messages"][0],
                               {"role": "assistant", "content": [tool_use]},
                               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use["id"],
                                                             "content": "-5 C"}]}]}
        body = post(running, follow).json()
        assert body["content"] == [{"type": "text", "text": "Cold."}] and body["stop_reason"] == "end_turn"
        prompt = model.detokenize(scripted.prompts[-1])
        assert "-5 C" in prompt  # the tool result reached the template as a tool message


@pytest.mark.parametrize("payload,needle", [
    ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"max_tokens": 4, "messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "image"),
    ({"max_tokens": 4, "messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": "[1, 2]"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "r"}]}]},
     "messages.1.content[0].input: a tool_use block's input must be an object"),
])
def test_errors_in_anthropics_shape(server, payload, needle):
    response = post(server, payload)
    assert response.status_code == 400
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert needle in body["error"]["message"]
