"""Anthropic's Messages API wire format (/v1/messages, /v1/messages/count_tokens): the
request as Anthropic's API reference has it, then gguf-serve's extensions; the reply,
the token count and Anthropic's error envelope as documented. Content blocks stay
dicts here and are checked, each error naming its block, where they become chat
messages (server.anthropic.serving)."""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from ..core.protocol import OpenAIModel, OpenAIRequest, Seed


class AnthropicMessageParam(OpenAIModel):
    """One turn of a request's `messages` (the SDK's MessageParam; the reply is AnthropicMessage)."""

    role: Literal["user", "assistant", "system"]  # system: mid-conversation instructions (Claude Code sends them)
    content: Union[str, list[dict[str, Any]]]


class CountTokensRequest(OpenAIRequest):
    model: Optional[str] = None  # as on chat completions
    messages: list[AnthropicMessageParam] = Field(min_length=1)
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


class AnthropicMessage(BaseModel):
    """An Anthropic Messages reply (`type: "message"`), as Anthropic documents it (the SDK's Message)."""

    model_config = ConfigDict(extra="allow")
    id: str
    type: str = "message"
    role: str = "assistant"
    model: str
    content: list[dict[str, Any]]
    stop_reason: Optional[str] = None
    stop_sequence: Optional[str] = None
    usage: dict[str, Any]


class TokenCount(BaseModel):
    input_tokens: int


class AnthropicErrorInfo(BaseModel):
    type: str
    message: str


class AnthropicError(BaseModel):
    type: str = "error"
    error: AnthropicErrorInfo
