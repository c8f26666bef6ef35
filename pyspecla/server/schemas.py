"""Request bodies (pydantic v2). Fields a client may send that change nothing here (user, store,
metadata, cache_prompt, ...) are accepted and ignored, as OpenAI-compatible servers do; a known
field with a value this server cannot honour is refused by the endpoint with a 400 naming it."""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, confloat, conint

FiniteFloat = confloat(allow_inf_nan=False)
NonNegative = confloat(ge=0.0, allow_inf_nan=False)
Probability = confloat(ge=0.0, le=1.0, allow_inf_nan=False)
Penalty = confloat(ge=-2.0, le=2.0, allow_inf_nan=False)
TopP = confloat(gt=0.0, le=1.0, allow_inf_nan=False)  # (0 would keep no token: the library refuses it)
Seed = conint(lt=2**64, strict=True)  # the library's seed is 64-bit; a negative one asks for a random seed
Positive = conint(ge=1, strict=True)
Stop = Union[str, list[str], None]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class SamplingFields(_Body):
    """The sampling knobs every generating endpoint takes (OpenAI's names, plus llama-server's
    top_k, min_p, repeat_penalty; OpenAI's defaults)."""

    temperature: NonNegative | None = None
    top_p: TopP | None = None
    top_k: conint(ge=0, strict=True) | None = None
    min_p: Probability | None = None
    repeat_penalty: confloat(gt=0.0, allow_inf_nan=False) | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: Seed | None = None


class StreamOptions(_Body):
    include_usage: StrictBool = False


class FunctionSpec(_Body):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Body):
    type: Literal["function"]
    function: FunctionSpec


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # (reasoning_content, name, ... reach the template)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[dict[str, Any]], None] = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class ChatCompletionRequest(SamplingFields):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Positive | None = None
    max_completion_tokens: Positive | None = None
    stop: Stop = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt = 1
    logprobs: StrictBool = False
    top_logprobs: conint(ge=0, le=20, strict=True) | None = None
    tools: list[Tool] | None = None
    tool_choice: Union[Literal["none", "auto", "required"], dict[str, Any], None] = None
    response_format: ResponseFormat | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    logit_bias: dict[str, float] | None = None


class CompletionRequest(SamplingFields):
    model: str | None = None
    prompt: Union[str, list[str], list[StrictInt]]
    max_tokens: Positive | None = 16  # OpenAI's default for /v1/completions
    stop: Stop = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt = 1
    logprobs: conint(ge=0, le=20, strict=True) | None = None
    echo: StrictBool = False
    suffix: str | None = None
    logit_bias: dict[str, float] | None = None
    best_of: StrictInt | None = None


class LlamaCompletionRequest(SamplingFields):
    """llama-server's /completion (its field names)."""

    prompt: Union[str, list[StrictInt]]
    n_predict: conint(ge=-1, strict=True) = -1
    stop: list[str] = []
    stream: StrictBool = False
    n_probs: conint(ge=0, le=20, strict=True) = 0
    repeat_last_n: conint(ge=-1, strict=True) | None = None
    ignore_eos: StrictBool = False
    return_tokens: StrictBool = False
    # options this server cannot honour, declared so that a request using them is refused, not served
    # as if they were absent (llama-server takes logit_bias as a list of pairs or an object)
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    logit_bias: Union[list[Any], dict[str, Any], None] = None
    # llama-server's other samplers, each at its "off" value (a client may send that explicitly);
    # any other value is refused (llama_api.py)
    mirostat: conint(ge=0, le=2, strict=True) = 0
    typical_p: FiniteFloat = 1.0
    dry_multiplier: FiniteFloat = 0.0
    xtc_probability: FiniteFloat = 0.0
    dynatemp_range: FiniteFloat = 0.0


class TokenizeRequest(_Body):
    content: str
    add_special: StrictBool = False  # (no BOS is ever added: Qwen vocabularies have none)
    parse_special: StrictBool = True
    with_pieces: StrictBool = False


class DetokenizeRequest(_Body):
    tokens: list[conint(ge=0, strict=True)]


class AnthropicTool(_Body):
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any] = {}


class AnthropicMessage(_Body):
    role: Literal["user", "assistant"]
    content: Union[str, list[dict[str, Any]]]


class AnthropicThinking(_Body):
    type: Literal["enabled", "disabled", "adaptive"]


class MessagesRequest(_Body):
    model: str | None = None
    max_tokens: Positive
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: Union[str, list[dict[str, Any]], None] = None
    stop_sequences: list[str] | None = None
    stream: StrictBool = False
    temperature: NonNegative | None = None
    top_p: TopP | None = None
    top_k: conint(ge=0, strict=True) | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: AnthropicThinking | None = None
