"""The OpenAI wire format: pydantic models in the API reference's order and names.
Extensions that OpenAI does not define sit in marked blocks. Unknown request
fields are accepted and ignored, as OpenAI-compatible servers do; fields we cannot
honour yet are refused by `unsupported_fields` with a message naming them."""

from __future__ import annotations

import re
import time
import uuid
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator, PrivateAttr
from pydantic_core import PydanticCustomError


def _lone_surrogate(value: Any, path: str = "") -> str | None:
    """The path of the first string in `value` that is not valid Unicode (a lone UTF-16
    surrogate such as "\\ud800", which JSON allows), else None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "body"
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _lone_surrogate(item, f"{path}.{key}" if path else str(key))
        if found:
            return found
    return None


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_seconds(value: Any) -> float | None:
    """Ollama's keep_alive: seconds as a number, or a duration as Go writes it ("5m",
    "1h30m", "-1"); negative: stay loaded. Raises ValueError for anything else."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("keep_alive is a number of seconds or a duration such as '5m'")
    if isinstance(value, (int, float)):
        if value != value:
            raise ValueError("keep_alive is not a number (NaN)")
        return float(value)
    text = str(value).strip()
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    try:
        return sign * float(body)  # "300", "-1"
    except ValueError:
        pass
    parts = _DURATION.findall(body)
    if not body or "".join(n + u for n, u in parts) != body:
        raise ValueError(f"keep_alive {text!r} is neither seconds nor a duration such as '5m' or '1h30m'")
    return sign * sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)


def _keep_alive(value: Any) -> float | None:
    try:
        return keep_alive_seconds(value)
    except ValueError as e:
        raise PydanticCustomError("keep_alive", str(e)) from None


KeepAlive = Annotated[Optional[Union[float, str]], BeforeValidator(_keep_alive)]


class OpenAIRequest(OpenAIModel):
    """A request body: every string in it must be valid Unicode (the tokenizer, the
    templates and the error messages all need UTF-8)."""

    # --- gguf-serve extension (Ollama's): how long the model stays loaded once idle
    keep_alive: KeepAlive = None

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        where = _lone_surrogate(data)
        if where:  # the field travels in ctx: the error handler names it in `param`
            raise PydanticCustomError("invalid_unicode", "the string is not valid Unicode (a lone surrogate)",
                                      {"field": where})
        return data


# OpenAI's bounds: logit_bias values in [-100, 100]; a seed is a 64-bit integer
LogitBias = Optional[dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]]]
Seed = Optional[Annotated[int, Field(ge=-(2 ** 63), le=2 ** 64 - 1)]]
# ours: the CTRL-style penalty divides logits, so it stays in a range where they stay finite
RepetitionPenalty = Optional[Annotated[float, Field(ge=0.01, le=100.0)]]
# speculative decoding for this request (an extension): the model's default (auto), none, or a drafter it has
Speculative = Optional[Literal["auto", "off", "ngram", "mtp", "draft"]]


# ----------------------------------------------------------------- errors


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: Optional[str] = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


# ----------------------------------------------------------------- models


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "gguf-serve"
    # --- gguf-serve extensions ---
    loaded: bool = False
    status: Literal["unloaded", "loading", "loaded", "failed"] = "unloaded"
    memory_bytes: Optional[int] = None  # what it holds loaded (files and caches), or took when last loaded
    context_length: Optional[int] = None
    quantization: Optional[str] = None
    size_bytes: Optional[int] = None
    chat_template: Optional[bool] = None  # False: the file has none (a base model); chat uses a fallback
    vision: bool = False  # a vision file goes with it: chat messages may hold images
    error: Optional[str] = None  # set when the model cannot be served (its file failed to read or load)


class ModelAction(OpenAIRequest):
    """POST /models/load and /models/unload (llama-server's router)."""

    model: str


class ModelActionResult(BaseModel):
    success: bool = True
    model: str
    status: Literal["unloaded", "loading", "loaded", "failed"]


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]


# ------------------------------------------------------- chat completions


class ContentPart(OpenAIModel):
    type: str
    text: Optional[str] = None
    image_url: Optional[Union[dict[str, Any], str]] = None  # {"url": ..., "detail": ...}


class ChatMessage(OpenAIModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[str, list[ContentPart]]] = None
    name: Optional[str] = None
    tool_calls: Optional[list[dict[str, Any]]] = None
    tool_call_id: Optional[str] = None
    # --- extension (DeepSeek/vLLM convention): earlier reasoning sent back ---
    reasoning_content: Optional[str] = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text or "" for p in self.content if p.type == "text")


class StreamOptions(OpenAIModel):
    include_usage: bool = False


class ChatCompletionRequest(OpenAIRequest):
    _origins: Optional[list] = PrivateAttr(default=None)  # from the Responses API: each message's input item
    _fit_max_tokens: bool = PrivateAttr(default=False)  # max tokens cut to the context left (Messages API)
    messages: list[ChatMessage] = Field(min_length=1)
    model: str
    frequency_penalty: Optional[float] = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: LogitBias = None
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = Field(default=None, ge=0, le=20)
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)
    max_tokens: Optional[int] = Field(default=None, ge=1)
    n: Optional[int] = Field(default=1, ge=1, le=8)
    presence_penalty: Optional[float] = Field(default=0.0, ge=-2.0, le=2.0)
    reasoning_effort: Optional[str] = None
    response_format: Optional[dict[str, Any]] = None
    seed: Seed = None
    stop: Optional[Union[str, list[str]]] = None
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    temperature: Optional[float] = Field(default=1.0, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(default=1.0, gt=0.0, le=1.0)
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Any] = None
    parallel_tool_calls: Optional[bool] = None
    user: Optional[str] = None
    # --- extensions (vLLM / llama.cpp server conventions) ---
    top_k: Optional[int] = Field(default=None, ge=0)
    min_p: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: RepetitionPenalty = None
    ignore_eos: Optional[bool] = None  # keep generating past end-of-generation tokens (benchmarks)
    speculative: Speculative = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    thinking_budget_tokens: Optional[int] = Field(default=None, ge=0)  # then the think block is closed


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: Optional[dict[str, int]] = None  # cached_tokens: from the prefix cache
    completion_tokens_details: Optional[dict[str, int]] = None  # reasoning_tokens


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: Optional[str] = None
    tool_calls: Optional[list[dict[str, Any]]] = None
    # --- extension ---
    reasoning_content: Optional[str] = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: Optional[list[int]] = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: Optional[list[TokenLogprob]] = None


class Choice(BaseModel):
    index: int
    message: ResponseMessage
    logprobs: Optional[ChoiceLogprobs] = None
    finish_reason: Optional[str] = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    system_fingerprint: Optional[str] = None


class Delta(BaseModel):
    role: Optional[Literal["assistant"]] = None
    content: Optional[str] = None
    tool_calls: Optional[list[dict[str, Any]]] = None
    # --- extension ---
    reasoning_content: Optional[str] = None


class ChunkChoice(BaseModel):
    index: int
    delta: Delta
    logprobs: Optional[ChoiceLogprobs] = None
    finish_reason: Optional[str] = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Optional[Usage] = None
    system_fingerprint: Optional[str] = None


# ------------------------------------------------------------ completions


class CompletionRequest(OpenAIRequest):
    model: str
    prompt: Union[str, list[str]]
    frequency_penalty: Optional[float] = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: LogitBias = None
    logprobs: Optional[int] = Field(default=None, ge=0, le=20)
    max_tokens: Optional[int] = Field(default=16, ge=1)
    n: Optional[int] = Field(default=1, ge=1, le=8)
    presence_penalty: Optional[float] = Field(default=0.0, ge=-2.0, le=2.0)
    seed: Seed = None
    stop: Optional[Union[str, list[str]]] = None
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    temperature: Optional[float] = Field(default=1.0, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(default=1.0, gt=0.0, le=1.0)
    user: Optional[str] = None
    # --- extensions ---
    top_k: Optional[int] = Field(default=None, ge=0)
    min_p: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: RepetitionPenalty = None
    ignore_eos: Optional[bool] = None  # keep generating past end-of-generation tokens (benchmarks)
    speculative: Speculative = None


class CompletionLogprobs(BaseModel):
    """The legacy completions shape: parallel lists, one entry per token."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    text: str
    index: int
    logprobs: Optional[CompletionLogprobs] = None
    finish_reason: Optional[str] = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Optional[Usage] = None
    system_fingerprint: Optional[str] = None


# -------------------------------------------------------------- responses


class ResponsesTextConfig(OpenAIModel):
    format: Optional[dict[str, Any]] = None  # {"type": "text" | "json_object" | "json_schema", ...}


class ResponsesReasoning(OpenAIModel):
    effort: Optional[str] = None  # "none" turns thinking off; any other effort turns it on
    summary: Optional[str] = None  # accepted; the reasoning comes back whole, not summarized
    max_tokens: Optional[int] = Field(default=None, ge=0)  # extension (OpenRouter's): the thinking budget


class ResponsesRequest(OpenAIRequest):
    """POST /v1/responses, stateless: nothing is stored, so `previous_response_id`,
    `conversation`, `prompt` and `background` are refused."""

    model: str
    input: Union[str, list[dict[str, Any]]]
    instructions: Optional[str] = None
    include: Optional[list[str]] = None  # "message.output_text.logprobs" adds logprobs
    max_output_tokens: Optional[int] = Field(default=None, ge=1)
    metadata: Optional[dict[str, str]] = None
    parallel_tool_calls: Optional[bool] = None
    previous_response_id: Optional[str] = None
    conversation: Optional[Any] = None
    prompt: Optional[Any] = None
    background: Optional[bool] = None
    reasoning: Optional[ResponsesReasoning] = None
    store: Optional[bool] = None  # accepted; nothing is ever stored (the reply says store: false)
    stream: Optional[bool] = False
    temperature: Optional[float] = Field(default=None, ge=0.0, le=2.0)
    text: Optional[ResponsesTextConfig] = None
    tool_choice: Optional[Any] = None
    tools: Optional[list[dict[str, Any]]] = None
    top_logprobs: Optional[int] = Field(default=None, ge=0, le=20)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    truncation: Optional[Literal["disabled", "auto"]] = None
    user: Optional[str] = None
    # --- extensions, as on chat completions ---
    logit_bias: LogitBias = None
    seed: Seed = None
    stop: Optional[Union[str, list[str]]] = None
    top_k: Optional[int] = Field(default=None, ge=0)
    min_p: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: RepetitionPenalty = None
    presence_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    chat_template_kwargs: Optional[dict[str, Any]] = None
    ignore_eos: Optional[bool] = None
    speculative: Speculative = None


# ------------------------------------------------------ Anthropic Messages
# The request as Anthropic's API reference has it; content blocks stay dicts here and are
# checked, each error naming its block, where they become chat messages (server.messages).


class AnthropicMessage(OpenAIModel):
    role: Literal["user", "assistant", "system"]  # system: mid-conversation instructions (Claude Code sends them)
    content: Union[str, list[dict[str, Any]]]


class CountTokensRequest(OpenAIRequest):
    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: Optional[Union[str, list[dict[str, Any]]]] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[dict[str, Any]] = None
    thinking: Optional[dict[str, Any]] = None
    output_config: Optional[dict[str, Any]] = None
    output_format: Optional[dict[str, Any]] = None  # the structured-outputs beta's name for output_config.format


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)  # required, as Anthropic requires it
    metadata: Optional[dict[str, Any]] = None
    stop_sequences: Optional[list[str]] = None
    stream: bool = False
    temperature: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    top_k: Optional[int] = Field(default=None, ge=0)
    # --- gguf-serve extensions, as in the chat request ---
    seed: Seed = None
    ignore_eos: Optional[bool] = None


# ------------------------------------------------------ embeddings and rerank


class EmbeddingRequest(OpenAIRequest):
    model: str
    input: Union[str, list[str], list[int], list[list[int]]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[int] = Field(default=None, ge=1)
    user: Optional[str] = None


class RerankRequest(OpenAIRequest):
    """llama-server's and Jina's /v1/rerank."""

    model: str
    query: str
    documents: list[Union[str, dict[str, Any]]] = Field(min_length=1)
    top_n: Optional[int] = Field(default=None, ge=1)
    return_documents: bool = False


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


class TokenizeRequest(OpenAIRequest):
    """llama-server's /tokenize: text to the model's token ids."""

    model: Optional[str] = None  # default: the only model served
    content: str
    add_special: bool = False  # BOS (and EOS) as the file asks
    with_pieces: bool = False  # each id with its text


class DetokenizeRequest(OpenAIRequest):
    model: Optional[str] = None
    tokens: list[int]


def unsupported_fields(req: BaseModel) -> list[str]:
    """Fields set in the request that this server cannot honour (yet): refused, never ignored."""
    bad = []
    rf = getattr(req, "response_format", None)
    if rf and rf.get("type") not in (None, "text", "json_object", "json_schema"):
        bad.append("response_format")
    return bad
