"""Anthropic's /v1/messages: one JSON message, or the streaming event sequence message_start,
content_block_start / content_block_delta / content_block_stop per block, message_delta,
message_stop. Thinking becomes `thinking` blocks, tool calls `tool_use` blocks."""

from __future__ import annotations

import json
import secrets

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from .engine import GenerationRequest
from .errors import bad_request, parse_json_body, validated
from .openai_api import SSE_HEADERS
from .prompts import new_token_budget, render_chat, sampling_params, tokenize_prompt
from .schemas import MessagesRequest
from .session import TextGeneration, watch_disconnect
from .text import ChatOutputParser, prompt_opens_thinking

router = APIRouter()


def _block_text(block: dict, where: str) -> str:
    if block.get("type") == "text" and isinstance(block.get("text"), str):
        return block["text"]
    raise bad_request(f"{where}: expected a text block, got type {block.get('type')!r}", param=where,
                      code="unsupported_content")


def _tool_result_text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    return "".join(_block_text(b, f"{where}.content[{i}]") for i, b in enumerate(content))


def template_messages(body: MessagesRequest) -> list[dict]:
    """Anthropic messages as the chat template's messages: the system prompt first, tool_use blocks
    as assistant tool calls, tool_result blocks as tool messages."""
    out = []
    if body.system:
        system = body.system if isinstance(body.system, str) else "".join(
            _block_text(b, f"system[{i}]") for i, b in enumerate(body.system))
        out.append({"role": "system", "content": system})
    for i, message in enumerate(body.messages):
        where = f"messages.{i}"
        if isinstance(message.content, str):
            out.append({"role": message.role, "content": message.content})
            continue
        texts, reasoning, calls, results = [], [], [], []
        for j, block in enumerate(message.content):
            kind = block.get("type")
            if kind == "text":
                texts.append(_block_text(block, f"{where}.content[{j}]"))
            elif kind == "thinking" and message.role == "assistant":
                reasoning.append(str(block.get("thinking", "")))
            elif kind == "tool_use" and message.role == "assistant":
                arguments = block.get("input", {})
                if not isinstance(arguments, dict):
                    raise bad_request(f"{where}.content[{j}].input: a tool_use block's input must be an object, got "
                                      f"{json.dumps(arguments, default=str)[:80]}", param=f"{where}.content",
                                      code="invalid_value")
                calls.append({"type": "function", "id": block.get("id"),
                              "function": {"name": block.get("name"), "arguments": arguments},
                              "name": block.get("name"), "arguments": arguments})
            elif kind == "tool_result" and message.role == "user":
                results.append({"role": "tool", "tool_call_id": block.get("tool_use_id"),
                                "content": _tool_result_text(block.get("content"), f"{where}.content[{j}]")})
            else:
                raise bad_request(f"{where}.content[{j}]: block type {kind!r} is not supported in a {message.role} "
                                  f"message", param=f"{where}.content", code="unsupported_content")
        out += results
        if texts or calls or reasoning or not results:
            item = {"role": message.role, "content": "".join(texts)}
            if calls:
                item["tool_calls"] = calls
            if reasoning:
                item["reasoning_content"] = "".join(reasoning)
            out.append(item)
    return out


def _stop_reason(gen: TextGeneration, parser: ChatOutputParser) -> str:
    if gen.stop_word is not None:
        return "stop_sequence"
    if gen.finish_reason == "length":
        return "max_tokens"
    return "tool_use" if parser.tool_calls else "end_turn"


def _tool_use(call) -> dict:
    return {"type": "tool_use", "id": "toolu_" + call.id.removeprefix("call_"), "name": call.name,
            "input": json.loads(call.arguments)}


def event(name: str, data: dict) -> str:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


@router.post("/v1/messages")
async def messages(request: Request):
    state = request.app.state.server
    model = state.model
    body = validated(MessagesRequest, parse_json_body(await request.body()))
    if body.tool_choice is not None and body.tool_choice.get("type") not in ("auto", "none"):
        raise bad_request("tool_choice: only auto and none are supported", param="tool_choice",
                          code="unsupported_value")
    tools = None
    if body.tools and (body.tool_choice or {}).get("type") != "none":
        tools = [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                                   "parameters": t.input_schema}} for t in body.tools]
    template_kwargs = {}
    if body.thinking is not None:
        template_kwargs["enable_thinking"] = body.thinking.type != "disabled"
    thinking = template_kwargs.get("enable_thinking", True)
    prompt = render_chat(model, template_messages(body), tools, template_kwargs)
    ids = tokenize_prompt(model, prompt, "messages")
    max_tokens = new_token_budget(len(ids), body.max_tokens, state.n_ctx, "messages")
    request_ = GenerationRequest(ids, max_tokens, sampling_params(body), stop_at_eos=True)
    gen = TextGeneration(state.engine, request_, [s for s in body.stop_sequences or [] if s])
    parser = ChatOutputParser(thinking=thinking, in_thinking=prompt_opens_thinking(prompt), tools=bool(tools))
    message_id = "msg_" + secrets.token_hex(12)
    if body.stream:
        return StreamingResponse(_stream(request, gen, parser, message_id, state.model_id),
                                 media_type="text/event-stream", headers=SSE_HEADERS)

    blocks: list[dict] = []

    def add(deltas):
        for delta in deltas:
            for kind, text in (("thinking", delta.reasoning), ("text", delta.content)):
                if not text:
                    continue
                if blocks and blocks[-1]["type"] == kind:
                    blocks[-1][kind] += text
                else:
                    blocks.append({"type": kind, kind: text})
            if delta.tool_call is not None:
                blocks.append(_tool_use(delta.tool_call))

    async with watch_disconnect(request, gen):
        async for piece in gen.pieces():
            add(parser.push(piece.text))
        add(parser.flush())
    if gen.failure() is not None:
        raise gen.failure()
    if not blocks:
        blocks.append({"type": "text", "text": ""})
    return JSONResponse({"id": message_id, "type": "message", "role": "assistant", "model": state.model_id,
                         "content": blocks, "stop_reason": _stop_reason(gen, parser), "stop_sequence": gen.stop_word,
                         "usage": {"input_tokens": gen.n_prompt, "output_tokens": gen.n_generated}})


async def _stream(request, gen: TextGeneration, parser: ChatOutputParser, message_id: str, model_id: str):
    open_kind = None
    index = -1

    def start(kind: str, block: dict):
        nonlocal open_kind, index
        out = []
        if open_kind is not None:
            out.append(event("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1
        open_kind = kind
        out.append(event("content_block_start", {"type": "content_block_start", "index": index,
                                                 "content_block": block}))
        return out

    def render(deltas):
        out = []
        for delta in deltas:
            for kind, text, delta_type in (("thinking", delta.reasoning, "thinking_delta"),
                                           ("text", delta.content, "text_delta")):
                if not text:
                    continue
                if open_kind != kind:
                    out += start(kind, {"type": kind, kind: ""})
                out.append(event("content_block_delta", {"type": "content_block_delta", "index": index,
                                                         "delta": {"type": delta_type, kind: text}}))
            if delta.tool_call is not None:
                block = _tool_use(delta.tool_call)
                out += start("tool_use", {**block, "input": {}})
                out.append(event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": {
                    "type": "input_json_delta", "partial_json": delta.tool_call.arguments}}))
        return out

    yield event("message_start", {"type": "message_start", "message": {
        "id": message_id, "type": "message", "role": "assistant", "model": model_id, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": gen.n_prompt, "output_tokens": 0}}})
    async with watch_disconnect(request, gen):
        async for piece in gen.pieces():
            for item in render(parser.push(piece.text)):
                yield item
        for item in render(parser.flush()):
            yield item
    if gen.failure() is not None:
        yield event("error", gen.failure().anthropic_body())
        return
    if gen.finish_reason == "cancelled":
        return
    if open_kind is None:
        for item in start("text", {"type": "text", "text": ""}):
            yield item
    yield event("content_block_stop", {"type": "content_block_stop", "index": index})
    yield event("message_delta", {"type": "message_delta", "delta": {"stop_reason": _stop_reason(gen, parser),
                                                                     "stop_sequence": gen.stop_word},
                                  "usage": {"output_tokens": gen.n_generated}})
    yield event("message_stop", {"type": "message_stop"})
