"""llama-server's request bodies for /completion and /infill (its tools/server README's
field names); fields it takes that this server does not are ignored, as it ignores
unknown ones."""

from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import Field

from ..core.protocol import LlamaSamplers, LoraChoices, OpenAIRequest


class LlamaCompletionRequest(LlamaSamplers, LoraChoices, OpenAIRequest):
    model: Optional[str] = None
    prompt: Union[str, list[Union[int, str]]] = ""
    n_predict: int = -1  # -1: until the end of generation (or the server's --n-predict)
    temperature: Optional[float] = Field(default=None, ge=0.0)
    top_k: Optional[int] = Field(default=None, ge=0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    min_p: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    seed: Optional[int] = None  # -1: random
    stop: Optional[list[str]] = None
    repeat_penalty: Optional[float] = Field(default=None, ge=0.01, le=100.0)
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    logit_bias: Optional[Union[dict[str, Any], list[list[Any]]]] = None
    ignore_eos: Optional[bool] = None
    n_probs: int = Field(default=0, ge=0, le=20)
    grammar: Optional[str] = None  # GBNF
    json_schema: Optional[dict[str, Any]] = None
    return_tokens: bool = False
    stream: bool = False
    cache_prompt: bool = True  # the prefix cache is always on
    return_progress: bool = False  # with `stream`: prompt_progress chunks while the prompt is processed


class LlamaInfillRequest(LlamaCompletionRequest):
    input_prefix: str
    input_suffix: str
    input_extra: list[dict[str, Any]] = Field(default_factory=list)
