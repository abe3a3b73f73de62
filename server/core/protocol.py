"""What every API's wire format shares: the base models (unknown request fields accepted
and ignored, as OpenAI-compatible servers do; every string valid Unicode), Ollama's
`keep_alive`, the bounded field types, the extension fields the generating requests
share (one marked mixin), OpenAI's error envelope, and reply ids. Each API's own models
live in its folder's protocol.py."""

from __future__ import annotations

import re
import time
import uuid
from typing import Annotated, Any, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from ...engine import SpecChoice, sampler_names


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
        seconds = float(body)  # "300", "-1"
    except ValueError:
        pass
    else:
        if seconds != seconds:
            raise ValueError("keep_alive is not a number (NaN)")
        return sign * seconds
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
Speculative = Optional[SpecChoice]


class LoraChoice(BaseModel):
    """An adapter a request runs with: its id (GET /lora-adapters) and scale."""

    id: int = Field(ge=0)
    scale: float


class LoraChoices(BaseModel):
    """llama-server's `lora` (every generating API here): the LoRA adapters a request runs
    with at these scales, the others off; none given: the model's (--lora, /lora-adapters)."""

    lora: Optional[list[LoraChoice]] = None


class LlamaSamplers(BaseModel):
    """llama.cpp's samplers, in its names (each off at its default): on every generating
    API here (SamplingExtensions) and llama-server's /completion."""

    typical_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    top_n_sigma: Optional[float] = None  # negative: off
    xtc_probability: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    xtc_threshold: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    dynatemp_range: Optional[float] = Field(default=None, ge=0.0)
    dynatemp_exponent: Optional[float] = Field(default=None, ge=0.0)
    mirostat: Optional[int] = Field(default=None, ge=0, le=2)
    mirostat_tau: Optional[float] = Field(default=None, ge=0.0)
    mirostat_eta: Optional[float] = Field(default=None, ge=0.0)
    dry_multiplier: Optional[float] = Field(default=None, ge=0.0)
    dry_base: Optional[float] = Field(default=None, ge=1.0)
    dry_allowed_length: Optional[int] = Field(default=None, ge=0)
    dry_penalty_last_n: Optional[int] = Field(default=None, ge=-1)
    dry_sequence_breakers: Optional[list[str]] = None
    samplers: Optional[Union[list[str], str]] = None  # the ones that apply (names or letters); the others off
    t_max_predict_ms: Optional[int] = Field(default=None, ge=0)  # past it, a reply ends at its next newline

    @field_validator("samplers")
    @classmethod
    def _known_samplers(cls, v):
        return None if v is None else sampler_names(v)


class SamplingExtensions(LlamaSamplers, LoraChoices):
    """--- gguf-serve extensions (vLLM / llama.cpp server conventions) ---
    The sampling fields that chat completions, completions and Responses requests take
    beyond OpenAI's. A request class lists it first among its bases, so that these
    fields follow OpenAI's own (which its base class holds, in the reference's order)."""

    top_k: Optional[int] = Field(default=None, ge=0)
    min_p: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: RepetitionPenalty = None
    ignore_eos: Optional[bool] = None  # keep generating past end-of-generation tokens (benchmarks)
    speculative: Speculative = None
    return_progress: Optional[bool] = None  # llama-server's: a stream's chunks give prompt_progress while it is read


# ----------------------------------------------------------------- errors


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: Optional[str] = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


def new_id(prefix: str) -> str:
    """An OpenAI reply's id: `chatcmpl-...`, `cmpl-...`."""
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def item_id(prefix: str) -> str:
    """A Responses or Anthropic object's id: `resp_...`, `msg_...`."""
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())
