"""The Responses API's wire format (POST /v1/responses): the request in the API
reference's order and names, then the extensions; the reply object as documented."""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from ..core.protocol import LogitBias, OpenAIModel, OpenAIRequest, SamplingExtensions, Seed


class ResponsesTextConfig(OpenAIModel):
    format: Optional[dict[str, Any]] = None  # {"type": "text" | "json_object" | "json_schema", ...}


class ResponsesReasoning(OpenAIModel):
    effort: Optional[str] = None  # "none" turns thinking off; any other effort turns it on
    summary: Optional[str] = None  # accepted; the reasoning comes back whole, not summarized
    max_tokens: Optional[int] = Field(default=None, ge=0)  # extension (OpenRouter's): the thinking budget


class _ResponsesFields(OpenAIRequest):
    """POST /v1/responses as OpenAI's reference has it."""

    model: Optional[str] = None  # as on chat completions
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


class _ResponsesExtensions(_ResponsesFields):
    # --- gguf-serve extensions, as on chat completions (before SamplingExtensions' own) ---
    logit_bias: LogitBias = None
    seed: Seed = None
    stop: Optional[Union[str, list[str]]] = None
    presence_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    chat_template_kwargs: Optional[dict[str, Any]] = None


class ResponsesRequest(SamplingExtensions, _ResponsesExtensions):  # OpenAI's fields, then the extensions
    """POST /v1/responses, stateless: nothing is stored, so `previous_response_id`,
    `conversation`, `prompt` and `background` are refused."""


class ResponseObject(BaseModel):
    """A Responses API reply (`object: "response"`), as documented by OpenAI."""

    model_config = ConfigDict(extra="allow")
    id: str
    object: str = "response"
    created_at: float
    status: str
    model: str
    output: list[dict[str, Any]]
    usage: Optional[dict[str, Any]] = None
    error: Optional[dict[str, Any]] = None
    incomplete_details: Optional[dict[str, Any]] = None
