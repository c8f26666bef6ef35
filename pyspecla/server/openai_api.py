"""OpenAI's endpoints: /v1/chat/completions, /v1/completions (SSE streaming or one JSON answer),
/v1/models."""

from __future__ import annotations

import json
import secrets
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from .engine import GenerationRequest
from .errors import bad_request, parse_json_body, validated
from .prompts import chat_messages, new_token_budget, render_chat, sampling_params, tokenize_prompt
from .schemas import ChatCompletionRequest, CompletionRequest
from .session import TextGeneration, collect, watch_disconnect
from .text import ChatOutputParser, prompt_opens_thinking

router = APIRouter()

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(data) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


def token_text(tokenizer, token_id: int) -> str:
    return tokenizer.token_bytes(token_id).decode("utf-8", errors="replace")


def chat_logprob(tokenizer, token, n_top: int) -> dict:
    """OpenAI's chat logprobs entry of one generated token."""
    def entry(token_id, logprob):
        piece = tokenizer.token_bytes(token_id)
        return {"token": piece.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(piece)}

    out = entry(token.id, token.logprob)
    out["top_logprobs"] = [entry(i, lp) for i, lp in (token.top_logprobs or [])[:n_top]]
    return out


def usage(gen: TextGeneration) -> dict:
    return {"prompt_tokens": gen.n_prompt, "completion_tokens": gen.n_generated,
            "total_tokens": gen.n_prompt + gen.n_generated}


def _check_common(body) -> None:
    if body.n != 1:
        raise bad_request(f"n: only n=1 is supported, got {body.n}", param="n", code="unsupported_value")
    if body.logit_bias:
        raise bad_request("logit_bias is not supported", param="logit_bias", code="unsupported_value")


def _stops(stop) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > 16:
        raise bad_request(f"stop: at most 16 stop strings, got {len(stops)}", param="stop", code="invalid_value")
    return [s for s in stops if s]


# --- /v1/chat/completions -------------------------------------------------------------------------

@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    state = request.app.state.server
    model = state.model
    body = validated(ChatCompletionRequest, parse_json_body(await request.body()))
    _check_common(body)
    if body.response_format is not None and body.response_format.type != "text":
        raise bad_request(f"response_format {body.response_format.type} is not supported (it needs constrained "
                          f"decoding); ask for JSON in the prompt", param="response_format", code="unsupported_value")
    if isinstance(body.tool_choice, dict) or body.tool_choice == "required":
        raise bad_request("tool_choice: only 'auto' and 'none' are supported (forcing a call needs constrained "
                          "decoding)", param="tool_choice", code="unsupported_value")
    messages = chat_messages(body.messages)
    tools = None
    if body.tools and body.tool_choice != "none":
        tools = [tool.model_dump(exclude_none=True) for tool in body.tools]
    template_kwargs = dict(body.chat_template_kwargs or {})
    if not isinstance(template_kwargs.get("enable_thinking", True), bool):
        # a template tests it for truth: "false" or 0 would not mean what the client meant
        raise bad_request(f"chat_template_kwargs.enable_thinking must be true or false, got "
                          f"{json.dumps(template_kwargs['enable_thinking'], default=str)[:80]}",
                          param="chat_template_kwargs.enable_thinking", code="invalid_value")
    thinking = template_kwargs.get("enable_thinking", True)
    prompt = render_chat(model, messages, tools, template_kwargs)
    ids = tokenize_prompt(model, prompt, "messages")
    max_tokens = new_token_budget(len(ids), body.max_completion_tokens or body.max_tokens, state.n_ctx, "messages")
    n_top = (body.top_logprobs or 0) if body.logprobs else 0
    request_ = GenerationRequest(ids, max_tokens, sampling_params(body), stop_at_eos=True, logprobs=n_top,
                                 token_logprobs=body.logprobs)
    gen = TextGeneration(state.engine, request_, _stops(body.stop))
    parser = ChatOutputParser(thinking=thinking, in_thinking=prompt_opens_thinking(prompt), tools=bool(tools))
    completion_id = "chatcmpl-" + secrets.token_hex(12)
    created = int(time.time())
    head = {"id": completion_id, "created": created, "model": state.model_id, "system_fingerprint": "pyspecla"}
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        stream = _chat_stream(request, gen, parser, head, n_top if body.logprobs else None, include_usage)
        return StreamingResponse(stream, media_type="text/event-stream", headers=SSE_HEADERS)

    reasoning, content, logprobs = [], [], []
    async with watch_disconnect(request, gen):
        async for piece in gen.pieces():
            if body.logprobs:
                logprobs += [chat_logprob(model.tokenizer, t, n_top) for t in piece.tokens]
            for delta in parser.push(piece.text):
                reasoning.append(delta.reasoning)
                content.append(delta.content)
        for delta in parser.flush():
            reasoning.append(delta.reasoning)
            content.append(delta.content)
    if gen.failure() is not None:
        raise gen.failure()
    message = {"role": "assistant", "content": "".join(content) if (any(content) or not parser.tool_calls) else None}
    if any(reasoning):
        message["reasoning_content"] = "".join(reasoning)
    if parser.tool_calls:
        message["tool_calls"] = [call.openai() for call in parser.tool_calls]
    finish = _chat_finish_reason(gen, parser)
    choice = {"index": 0, "message": message, "logprobs": {"content": logprobs} if body.logprobs else None,
              "finish_reason": finish}
    return JSONResponse({**head, "object": "chat.completion", "choices": [choice], "usage": usage(gen)})


def _chat_finish_reason(gen: TextGeneration, parser: ChatOutputParser) -> str:
    if parser.tool_calls and gen.finish_reason == "stop" and gen.stop_word is None:
        return "tool_calls"
    return "length" if gen.finish_reason == "length" else "stop"


async def _chat_stream(request, gen: TextGeneration, parser: ChatOutputParser, head: dict, n_top: int | None,
                       include_usage: bool):
    tokenizer = gen.tokenizer

    def chunk(delta: dict, finish=None, logprobs=None) -> str:
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        out = {**head, "object": "chat.completion.chunk", "choices": [choice]}
        if include_usage:
            out["usage"] = None
        return sse(out)

    def deltas_to_chunks(deltas, logprobs=None):
        for delta in deltas:
            if delta.reasoning:
                yield {"reasoning_content": delta.reasoning}
            if delta.content:
                yield {"content": delta.content}
            if delta.tool_call is not None:
                index = parser.tool_calls.index(delta.tool_call)
                yield {"tool_calls": [delta.tool_call.openai(index)]}

    async with watch_disconnect(request, gen):
        yield chunk({"role": "assistant", "content": ""})
        async for piece in gen.pieces():
            logprobs = None
            if n_top is not None and piece.tokens:
                logprobs = {"content": [chat_logprob(tokenizer, t, n_top) for t in piece.tokens]}
            sent = False
            for delta in deltas_to_chunks(parser.push(piece.text)):
                yield chunk(delta, logprobs=logprobs)
                logprobs, sent = None, True
            if logprobs is not None and not sent:
                yield chunk({}, logprobs=logprobs)
        for delta in deltas_to_chunks(parser.flush()):
            yield chunk(delta)
    if gen.failure() is not None:
        yield sse(gen.failure().openai_body())
        return
    if gen.finish_reason == "cancelled":
        return  # the client is gone
    yield chunk({}, finish=_chat_finish_reason(gen, parser))
    if include_usage:
        yield sse({**head, "object": "chat.completion.chunk", "choices": [], "usage": usage(gen)})
    yield sse("[DONE]")


# --- /v1/completions ------------------------------------------------------------------------------

def _completion_logprobs(tokenizer, tokens, offset: int) -> dict:
    """The legacy completions logprobs object for these tokens (text_offset counted from offset)."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for token in tokens:
        text = token_text(tokenizer, token.id)
        out["tokens"].append(text)
        out["token_logprobs"].append(token.logprob)
        out["top_logprobs"].append({token_text(tokenizer, i): lp for i, lp in (token.top_logprobs or [])})
        out["text_offset"].append(offset)
        offset += len(text)
    return out


@router.post("/v1/completions")
async def completions(request: Request):
    state = request.app.state.server
    model = state.model
    body = validated(CompletionRequest, parse_json_body(await request.body()))
    _check_common(body)
    if body.suffix:
        raise bad_request("suffix is not supported", param="suffix", code="unsupported_value")
    if body.best_of is not None and body.best_of != 1:
        raise bad_request(f"best_of: only best_of=1 is supported, got {body.best_of}", param="best_of",
                          code="unsupported_value")
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise bad_request(f"prompt: one prompt per request (n=1), got {len(prompt)}", param="prompt",
                              code="unsupported_value")
        prompt = prompt[0]
    ids = tokenize_prompt(model, prompt)
    max_tokens = new_token_budget(len(ids), body.max_tokens, state.n_ctx, "prompt")
    n_top = body.logprobs
    request_ = GenerationRequest(ids, max_tokens, sampling_params(body), stop_at_eos=True, logprobs=n_top or 0,
                                 token_logprobs=n_top is not None)
    gen = TextGeneration(state.engine, request_, _stops(body.stop))
    completion_id = "cmpl-" + secrets.token_hex(12)
    head = {"id": completion_id, "object": "text_completion", "created": int(time.time()), "model": state.model_id,
            "system_fingerprint": "pyspecla"}
    echo = (prompt if isinstance(prompt, str) else model.detokenize(ids)) if body.echo else ""

    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        async def stream():
            offset = len(echo)
            async with watch_disconnect(request, gen):
                if echo:
                    yield sse({**head, "choices": [{"index": 0, "text": echo, "logprobs": None,
                                                    "finish_reason": None}]})
                async for piece in gen.pieces():
                    logprobs = None
                    if n_top is not None and piece.tokens:
                        logprobs = _completion_logprobs(model.tokenizer, piece.tokens, offset)
                    if piece.text or logprobs is not None:
                        yield sse({**head, "choices": [{"index": 0, "text": piece.text, "logprobs": logprobs,
                                                        "finish_reason": None}]})
                    offset += len(piece.text)
            if gen.failure() is not None:
                yield sse(gen.failure().openai_body())
                return
            if gen.finish_reason == "cancelled":
                return
            final = {**head, "choices": [{"index": 0, "text": "", "logprobs": None,
                                          "finish_reason": "length" if gen.finish_reason == "length" else "stop"}]}
            yield sse(final)
            if include_usage:
                yield sse({**head, "choices": [], "usage": usage(gen)})
            yield sse("[DONE]")

        return StreamingResponse(stream(), media_type="text/event-stream", headers=SSE_HEADERS)

    text, tokens = await collect(request, gen)
    logprobs = _completion_logprobs(model.tokenizer, tokens, len(echo)) if n_top is not None else None
    choice = {"index": 0, "text": echo + text, "logprobs": logprobs,
              "finish_reason": "length" if gen.finish_reason == "length" else "stop"}
    return JSONResponse({**head, "choices": [choice], "usage": usage(gen)})


# --- /v1/models -----------------------------------------------------------------------------------

@router.get("/v1/models")
async def models(request: Request):
    state = request.app.state.server
    hp = state.model.hparams
    return {"object": "list", "data": [{
        "id": state.model_id, "object": "model", "created": int(state.started), "owned_by": "pyspecla",
        "meta": {"n_vocab": hp.n_vocab, "n_ctx_train": hp.n_ctx_train, "n_ctx": state.n_ctx,
                 "n_embd": hp.n_embd, "draft": str(state.draft) if state.draft is not None else None},
    }]}
