"""The OpenAI chat completions and completions wire format: pydantic models in the API
reference's order and names; the extensions that OpenAI does not define follow them
(server.core.protocol's SamplingExtensions, then marked blocks). Fields we cannot
honour yet are refused by `unsupported_fields` with a message naming them."""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, Field, PrivateAttr

from ..core.protocol import LogitBias, OpenAIModel, OpenAIRequest, SamplingExtensions, Seed


# ------------------------------------------------------- chat completions


class ContentPart(OpenAIModel):
    type: str
    text: Optional[str] = None
    image_url: Optional[Union[dict[str, Any], str]] = None  # {"url": ..., "detail": ...}
    input_audio: Any = None  # {"data": <base64>, "format": "wav", "mp3", ...}: checked where it is read


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


class _ChatCompletionFields(OpenAIRequest):
    """POST /v1/chat/completions as OpenAI's reference has it."""

    messages: list[ChatMessage] = Field(min_length=1)
    model: Optional[str] = None  # none (or a name not served): the one model served (llama-server's way)
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
    temperature: Optional[float] = Field(default=None, ge=0.0, le=2.0)  # none: --temp, else 1
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)  # none: --top-p, else 1
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Any] = None
    parallel_tool_calls: Optional[bool] = None
    user: Optional[str] = None


class ChatCompletionRequest(SamplingExtensions, _ChatCompletionFields):  # OpenAI's fields, then the extensions
    _origins: Optional[list] = PrivateAttr(default=None)  # from the Responses API: each message's input item
    _fit_max_tokens: bool = PrivateAttr(default=False)  # max tokens cut to the context left (Messages API)
    # --- gguf-serve extensions beyond SamplingExtensions ---
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


class _Reply(BaseModel):
    """What a chat completion, its chunks and a completion all carry, in the reference's
    order; each narrows `object`, `choices` and `usage` (a field redefined keeps its place)."""

    id: str
    object: str
    created: int
    model: str
    choices: list
    usage: Optional[Usage] = None
    system_fingerprint: Optional[str] = None
    # --- extension (llama-server's): the prompt's and the generation's times and rates ---
    timings: Optional[dict[str, Any]] = None


class ChatCompletion(_Reply):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[Choice]
    usage: Usage


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


class ChatCompletionChunk(_Reply):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChunkChoice]


# ------------------------------------------------------------ completions


class _CompletionFields(OpenAIRequest):
    """POST /v1/completions as OpenAI's reference has it."""

    model: Optional[str] = None  # as on chat completions
    prompt: Union[str, list[str], list[int]]  # a string, or one prompt's token ids
    frequency_penalty: Optional[float] = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: LogitBias = None
    logprobs: Optional[int] = Field(default=None, ge=0, le=20)
    max_tokens: Optional[int] = Field(default=None, ge=1)  # none: --max-tokens (OpenAI's 16 is llama-server's -1)
    n: Optional[int] = Field(default=1, ge=1, le=8)
    presence_penalty: Optional[float] = Field(default=0.0, ge=-2.0, le=2.0)
    seed: Seed = None
    stop: Optional[Union[str, list[str]]] = None
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    temperature: Optional[float] = Field(default=None, ge=0.0, le=2.0)  # none: --temp, else 1
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)  # none: --top-p, else 1
    user: Optional[str] = None


class CompletionRequest(SamplingExtensions, _CompletionFields):  # OpenAI's fields, then the extensions
    _grammar: Optional[str] = PrivateAttr(default=None)  # llguidance's grammar for the reply (llama-server's)
    _progress: bool = PrivateAttr(default=False)  # llama-server's streamed /completion asked for prompt_progress


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


class Completion(_Reply):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


def unsupported_fields(req: BaseModel) -> list[str]:
    """Fields set in the request that this server cannot honour (yet): refused, never ignored."""
    bad = []
    rf = getattr(req, "response_format", None)
    if rf and rf.get("type") not in (None, "text", "json_object", "json_schema"):
        bad.append("response_format")
    return bad
