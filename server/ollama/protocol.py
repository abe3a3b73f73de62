"""Ollama's request bodies (its docs/api.md), as lenient as Ollama is: fields it does
not know are ignored."""

from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import BaseModel, Field

from ..core.protocol import OpenAIModel, OpenAIRequest


class OllamaMessage(OpenAIModel):
    role: str
    content: Optional[str] = ""
    thinking: Optional[str] = None
    images: Optional[list[str]] = None  # base64
    tool_calls: Optional[list[dict[str, Any]]] = None  # [{"function": {"name", "arguments": {...}}}]
    tool_name: Optional[str] = None


class _Generating(OpenAIRequest):
    model: Optional[str] = None
    format: Optional[Union[str, dict[str, Any]]] = None  # "json" or a JSON schema
    options: Optional[dict[str, Any]] = None
    stream: bool = True
    think: Optional[Union[bool, str]] = None  # on / off, or gpt-oss's level
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = Field(default=None, ge=0, le=20)


class OllamaChatRequest(_Generating):
    messages: list[OllamaMessage] = Field(default_factory=list)
    tools: Optional[list[dict[str, Any]]] = None
    # --- gguf-serve extensions (as on chat completions): Ollama has no way to ask for a call ---
    tool_choice: Optional[Any] = None
    logit_bias: Optional[dict[str, float]] = None


class OllamaGenerateRequest(_Generating):
    prompt: Optional[str] = ""
    suffix: Optional[str] = None
    system: Optional[str] = None
    images: Optional[list[str]] = None
    raw: bool = False
    context: Optional[list[int]] = None


class OllamaEmbedRequest(OpenAIRequest):
    model: Optional[str] = None
    input: Union[str, list[str]]
    truncate: Optional[bool] = None
    options: Optional[dict[str, Any]] = None
    dimensions: Optional[int] = Field(default=None, ge=1)


class OllamaEmbeddingsRequest(OpenAIRequest):
    model: Optional[str] = None
    prompt: str = ""
    options: Optional[dict[str, Any]] = None


class OllamaError(BaseModel):
    """Ollama's error envelope."""

    error: str


class OllamaModelRequest(OpenAIRequest):
    """/api/show, /api/pull, /api/delete: the model as `model` (or the older `name`)."""

    model: Optional[str] = None
    name: Optional[str] = None
    stream: bool = True
    verbose: Optional[bool] = None

    def named(self) -> Optional[str]:
        return self.model or self.name
