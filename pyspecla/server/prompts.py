"""From a request to what the engine runs: the prompt's token ids (chat messages through the GGUF's
chat template, the same rendering as `pyspecla run --chat`), the sampling parameters with the
server's defaults, and the number of new tokens that fit in the context."""

from __future__ import annotations

import json
import secrets

from ..errors import SpeclaError, UsageError
from .errors import APIError, bad_request
from ..sampling import SamplingParams

# llama-server's sampling defaults, for a request that leaves a knob out.
DEFAULT_SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0,
                    "presence_penalty": 0.0, "frequency_penalty": 0.0}
# A greedy request (temperature 0) gets no default filter: the filters cannot change the argmax,
# but they would change the reported log-probabilities (those of the processed distribution),
# which for greedy decoding should be the model's own.
GREEDY_DEFAULTS = {"top_k": 0, "top_p": 1.0, "min_p": 0.0}
PENALTY_LAST_N = 64


def sampling_params(fields, penalty_last_n: int | None = None) -> SamplingParams:
    """SamplingParams from a request's sampling fields (None: the default); a seed is drawn when
    the request gives none, so that the answer can say which one produced it."""
    given = {name: getattr(fields, name, None) for name in DEFAULT_SAMPLING}
    defaults = dict(DEFAULT_SAMPLING)
    if given["temperature"] == 0:
        defaults.update(GREEDY_DEFAULTS)
    values = {name: defaults[name] if value is None else value for name, value in given.items()}
    seed = getattr(fields, "seed", None)
    if seed is None or seed < 0:  # (llama-server: -1 is a random seed)
        seed = secrets.randbits(32)
    params = SamplingParams(**values, penalty_last_n=PENALTY_LAST_N if penalty_last_n is None else penalty_last_n,
                            seed=seed)
    try:
        params.validate()
    except UsageError as exc:
        raise bad_request(str(exc), code="invalid_value") from None
    return params


def _text_of_content(content, where: str) -> str:
    """OpenAI/Anthropic content: a string, or a list of parts of which only text parts are known."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            raise bad_request(f"{where}.content[{i}]: only text parts are supported, got type {kind!r}",
                              param=f"{where}.content", code="unsupported_content")
    return "".join(texts)


def _template_tool_call(call: dict, where: str) -> dict:
    """An OpenAI tool call as a chat template reads it: function.arguments as a mapping (Qwen's
    templates iterate it), also exposed at the top level as transformers' templates expect."""
    function = call.get("function") if isinstance(call.get("function"), dict) else call
    name = function.get("name")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise bad_request(f"{where}: function.arguments is not valid JSON", param=where,
                              code="invalid_value") from None
    if not isinstance(name, str) or not isinstance(arguments, dict):
        raise bad_request(f"{where}: a tool call needs function.name (a string) and function.arguments (an "
                          f"object)", param=where, code="invalid_value")
    return {"type": "function", "id": call.get("id"), "function": {"name": name, "arguments": arguments},
            "name": name, "arguments": arguments}


def chat_messages(messages) -> list[dict]:
    """Request messages (pydantic ChatMessage objects) as plain dicts for the template: content as
    text, developer as system, tool calls with their arguments as mappings."""
    out = []
    for i, message in enumerate(messages):
        item = message.model_dump(exclude_none=True)
        where = f"messages.{i}"
        item["role"] = "system" if message.role == "developer" else message.role
        item["content"] = _text_of_content(message.content, where)
        if message.tool_calls:
            item["tool_calls"] = [_template_tool_call(call, f"{where}.tool_calls.{j}")
                                  for j, call in enumerate(message.tool_calls)]
        out.append(item)
    return out


def render_chat(model, messages: list[dict], tools: list[dict] | None = None, template_kwargs: dict | None = None
                ) -> str:
    """The prompt text: the GGUF's chat template with the generation prompt, tools and the
    request's chat_template_kwargs (enable_thinking, ...) as template variables."""
    kwargs = dict(template_kwargs or {})
    if tools:
        kwargs["tools"] = tools
    try:
        return model.tokenizer.apply_chat_template(messages, add_generation_prompt=True, **kwargs)
    except SpeclaError as exc:  # no chat template in the file
        raise bad_request(f"this model has no usable chat template ({exc}); use /v1/completions",
                          code="no_chat_template") from None
    except Exception as exc:  # noqa: BLE001 - the template refused the messages (raise_exception, bad types)
        raise bad_request(f"the chat template cannot render these messages: {exc}", param="messages",
                          code="template_error") from None


def tokenize_prompt(model, prompt, param: str = "prompt") -> list[int]:
    """A prompt given as text (special tokens written in it are parsed) or as token ids."""
    if isinstance(prompt, str):
        ids = model.tokenize(prompt)
    else:
        ids = [int(t) for t in prompt]
        n_vocab = model.tokenizer.n_vocab
        bad = [t for t in ids if not 0 <= t < n_vocab]
        if bad:
            raise bad_request(f"{param}: token id {bad[0]} is outside the vocabulary (0..{n_vocab - 1})", param=param,
                              code="invalid_value")
    if not ids:
        raise bad_request(f"{param}: the prompt is empty", param=param, code="invalid_value")
    return ids


def new_token_budget(n_prompt: int, max_tokens: int | None, n_ctx: int, param: str = "messages") -> int:
    """New tokens to generate: max_tokens, capped by what the context has left after the prompt
    (all of it when max_tokens is not given). A prompt that leaves no room is a 400."""
    if n_prompt >= n_ctx:
        raise APIError(400, f"the prompt is {n_prompt} tokens but the context holds {n_ctx} (the server's -c): "
                            f"no room for a new token; shorten the prompt", param=param,
                       code="context_length_exceeded")
    room = n_ctx - n_prompt
    return room if max_tokens is None else min(max_tokens, room)
