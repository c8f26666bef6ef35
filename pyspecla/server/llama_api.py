"""llama-server's own endpoints: /health, /completion (its request and answer shapes, streaming
too), /tokenize, /detokenize, /props, /metrics (Prometheus text)."""

from __future__ import annotations

import json

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from .engine import GenerationRequest
from .errors import bad_request, parse_json_body, validated
from .openai_api import SSE_HEADERS, sse, token_text
from .prompts import DEFAULT_SAMPLING, new_token_budget, sampling_params, tokenize_prompt
from .schemas import DetokenizeRequest, LlamaCompletionRequest, TokenizeRequest
from .session import TextGeneration, collect, watch_disconnect

router = APIRouter()


@router.get("/health")
async def health(request: Request):
    return {"status": "ok"}


def _probabilities(tokenizer, tokens) -> list[dict]:
    """llama-server's completion_probabilities entries."""
    def entry(token_id, logprob):
        piece = tokenizer.token_bytes(token_id)
        return {"id": int(token_id), "token": piece.decode("utf-8", errors="replace"), "logprob": logprob,
                "bytes": list(piece)}

    out = []
    for token in tokens:
        item = entry(token.id, token.logprob)
        item["top_logprobs"] = [entry(i, lp) for i, lp in (token.top_logprobs or [])]
        out.append(item)
    return out


def _stop_type(gen: TextGeneration) -> str:
    if gen.stop_word is not None:
        return "word"
    if gen.finish_reason == "length":
        return "limit"
    return "eos" if gen.finish_reason == "stop" else "none"


def _timings(gen: TextGeneration) -> dict:
    prompt_ms = float(gen.stats.get("prefill_ms", 0.0) or 0.0)
    predicted_ms = float(gen.stats.get("decode_ms", 0.0) or 0.0)
    predicted_n = max(gen.n_generated - 1, 0)  # (the first token comes out of the prompt pass)
    return {"prompt_n": gen.n_prompt, "prompt_ms": prompt_ms,
            "prompt_per_second": gen.n_prompt / prompt_ms * 1e3 if prompt_ms > 0 else 0.0,
            "predicted_n": predicted_n, "predicted_ms": predicted_ms,
            "predicted_per_second": predicted_n / predicted_ms * 1e3 if predicted_ms > 0 else 0.0}


def _settings(state, sampling, n_predict: int) -> dict:
    fields = {name: getattr(sampling, name) for name in DEFAULT_SAMPLING}
    return {**fields, "seed": sampling.seed, "n_predict": n_predict, "repeat_last_n": sampling.penalty_last_n,
            "n_ctx": state.n_ctx, "model": state.model_id, "speculative": state.draft is not None}


def _refuse_what_cannot_be_honoured(body: LlamaCompletionRequest) -> None:
    """A 400 for a /completion option this server cannot honour: served without it, the output would
    not be what the client asked for. Each sampler counts only when on: llama-server clients send
    every one at its off value."""
    constrained = "it needs constrained decoding"
    samplers = "the samplers here: temperature, top_k, top_p, min_p and the repetition penalties"
    for name, on, why in (("grammar", bool(body.grammar), constrained),
                          ("json_schema", bool(body.json_schema), constrained),
                          ("logit_bias", bool(body.logit_bias), "no logit biases here"),
                          ("mirostat", body.mirostat != 0, samplers),
                          ("typical_p", body.typical_p < 1.0, samplers),
                          ("dry_multiplier", body.dry_multiplier != 0.0, samplers),
                          ("xtc_probability", body.xtc_probability > 0.0, samplers),
                          ("dynatemp_range", body.dynatemp_range != 0.0, samplers)):
        if on:
            value = json.dumps(getattr(body, name), default=str)[:80]
            raise bad_request(f"{name} is not supported ({why}), got {value}", param=name, code="unsupported_value")


@router.post("/completion")
@router.post("/completions")
async def completion(request: Request):
    state = request.app.state.server
    model = state.model
    body = validated(LlamaCompletionRequest, parse_json_body(await request.body()))
    _refuse_what_cannot_be_honoured(body)
    ids = tokenize_prompt(model, body.prompt)
    n_predict = new_token_budget(len(ids), None if body.n_predict < 0 else body.n_predict, state.n_ctx, "prompt")
    sampling = sampling_params(body, penalty_last_n=body.repeat_last_n)
    request_ = GenerationRequest(ids, n_predict, sampling, stop_at_eos=not body.ignore_eos, logprobs=body.n_probs,
                                 token_logprobs=body.n_probs > 0)
    gen = TextGeneration(state.engine, request_, [s for s in body.stop if s])

    def final(content: str, tokens: list) -> dict:
        out = {"index": 0, "content": content, "id_slot": 0, "stop": True, "model": state.model_id,
               "tokens_predicted": gen.n_generated, "tokens_evaluated": gen.n_prompt,
               "generation_settings": _settings(state, sampling, n_predict), "prompt": body.prompt
               if isinstance(body.prompt, str) else model.detokenize(ids), "has_new_line": "\n" in content,
               "truncated": False, "stop_type": _stop_type(gen), "stopping_word": gen.stop_word or "",
               "tokens_cached": 0, "timings": _timings(gen)}
        if body.return_tokens:
            out["tokens"] = [int(t.id) for t in tokens]
        if body.n_probs:
            out["completion_probabilities"] = _probabilities(model.tokenizer, tokens)
        return out

    if body.stream:
        async def stream():
            async with watch_disconnect(request, gen):
                async for piece in gen.pieces():
                    if not piece.text and not piece.tokens:
                        continue
                    item = {"index": 0, "content": piece.text, "tokens": [int(t.id) for t in piece.tokens],
                            "stop": False, "id_slot": 0}
                    if body.n_probs:
                        item["completion_probabilities"] = _probabilities(model.tokenizer, piece.tokens)
                    yield sse(item)
            if gen.failure() is not None:
                yield sse(gen.failure().openai_body())
            elif gen.finish_reason != "cancelled":
                last = final("", [])
                if body.return_tokens:
                    last["tokens"] = []
                yield sse(last)

        return StreamingResponse(stream(), media_type="text/event-stream", headers=SSE_HEADERS)

    text, tokens = await collect(request, gen)
    return JSONResponse(final(text, tokens))


@router.post("/tokenize")
async def tokenize(request: Request):
    model = request.app.state.server.model
    body = validated(TokenizeRequest, parse_json_body(await request.body()))
    ids = model.tokenizer.encode(body.content, special=body.parse_special)
    if body.with_pieces:
        return {"tokens": [{"id": i, "piece": token_text(model.tokenizer, i)} for i in ids]}
    return {"tokens": ids}


@router.post("/detokenize")
async def detokenize(request: Request):
    model = request.app.state.server.model
    body = validated(DetokenizeRequest, parse_json_body(await request.body()))
    n_vocab = model.tokenizer.n_vocab
    bad = [t for t in body.tokens if t >= n_vocab]
    if bad:
        raise bad_request(f"tokens: id {bad[0]} is outside the vocabulary (0..{n_vocab - 1})", param="tokens",
                          code="invalid_value")
    return {"content": model.tokenizer.decode(body.tokens)}


@router.get("/props")
async def props(request: Request):
    state = request.app.state.server
    engine = state.engine
    tokenizer = state.model.tokenizer
    settings = {**DEFAULT_SAMPLING, "n_ctx": state.n_ctx, "model": state.model_id,
                "speculative": state.draft is not None}
    return {"model_path": state.model_path, "model_alias": state.model_id, "total_slots": engine.parallel,
            "n_ctx": state.n_ctx, "queue_size": engine.queue_size, "active_slots": engine.n_active,
            "queued_requests": engine.n_waiting, "draft": str(state.draft) if state.draft is not None else None,
            "default_generation_settings": settings, "chat_template": tokenizer.chat_template or "",
            "eos_tokens": sorted(token_text(tokenizer, t) for t in tokenizer.eos_ids), "build_info": "pyspecla"}


@router.get("/metrics")
async def metrics(request: Request):
    state = request.app.state.server
    engine = state.engine
    m = engine.metrics
    rows = [
        ("requests_total", "counter", "requests accepted into the queue", m.requests_total),
        ("requests_rejected_total", "counter", "requests refused with 429 (queue full)", m.requests_rejected),
        ("requests_cancelled_total", "counter", "requests cancelled (client gone, stop string)", m.requests_cancelled),
        ("requests_failed_total", "counter", "requests whose generation raised", m.requests_failed),
        ("prompt_tokens_total", "counter", "prompt tokens prefilled", m.prompt_tokens),
        ("tokens_generated_total", "counter", "tokens generated", m.tokens_generated),
        ("decode_seconds_total", "counter", "seconds spent decoding (after each first token)", m.decode_seconds),
        ("prefill_seconds_total", "counter", "seconds spent on prompts", m.prefill_seconds),
        ("decode_tokens_per_second", "gauge", "decode tokens per second over the finished generations",
         m.decode_tokens / m.decode_seconds if m.decode_seconds > 0 else 0.0),
        ("accepted_tokens_per_step", "gauge", "tokens committed per target step over the finished generations",
         m.accepted_tokens / m.steps if m.steps else 0.0),
        ("queue_depth", "gauge", "requests waiting for a slot", engine.n_waiting),
        ("active_generations", "gauge", "requests being generated (each holds a context)", engine.n_active),
        ("slots_total", "gauge", "--parallel", engine.parallel),
    ]
    lines = []
    for name, kind, help_text, value in rows:
        lines += [f"# HELP pyspecla_{name} {help_text}", f"# TYPE pyspecla_{name} {kind}",
                  f"pyspecla_{name} {json.dumps(value)}"]
    return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")
