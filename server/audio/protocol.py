"""The audio transcriptions wire format (POST /v1/audio/transcriptions): the request is a
multipart form (the `file` itself is the route's own parameter), its fields in the API
reference's order and names; the replies (`json`, `verbose_json`) and the stream's two
events as the reference documents them."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, Field

from ..core.protocol import OpenAIModel

ResponseFormat = Literal["json", "text", "srt", "verbose_json", "vtt"]


class TranscriptionForm(OpenAIModel):
    """The form's fields beside `file`. Lists come as OpenAI's clients send them (`include[]`)."""

    model: Optional[str] = None  # as on chat completions: with one model served, any name reaches it
    language: Optional[str] = None  # ISO-639-1 ("en"), or a language's name: said in the instruction
    prompt: Optional[str] = None  # text before the audio, for its style and spelling
    response_format: ResponseFormat = "json"
    stream: bool = False
    temperature: float = Field(default=0.0, ge=0.0, le=1.0)  # 0: greedy
    include: list[str] = Field(default_factory=list, alias="include[]")  # logprobs: refused, not given
    timestamp_granularities: list[str] = Field(default_factory=list, alias="timestamp_granularities[]")


class InputTokenDetails(BaseModel):
    text_tokens: int
    audio_tokens: int


class TokenUsage(BaseModel):
    type: Literal["tokens"] = "tokens"
    input_tokens: int
    input_token_details: InputTokenDetails
    output_tokens: int
    total_tokens: int


class DurationUsage(BaseModel):
    type: Literal["duration"] = "duration"
    seconds: float


class Transcription(BaseModel):
    """`response_format: json`."""

    text: str
    usage: Optional[TokenUsage] = None


class TranscriptionVerbose(BaseModel):
    """`response_format: verbose_json`: the text and the audio's length; no segments or
    words (this server produces no timestamps)."""

    task: Literal["transcribe"] = "transcribe"
    language: str  # as the request named it ("unknown" where it named none: nothing is detected)
    duration: float
    text: str
    usage: Optional[DurationUsage] = None


class TranscriptDelta(BaseModel):
    """A stream's event: text as it is generated."""

    type: Literal["transcript.text.delta"] = "transcript.text.delta"
    delta: str


class TranscriptDone(BaseModel):
    """A stream's last event: the whole text, and the tokens."""

    type: Literal["transcript.text.done"] = "transcript.text.done"
    text: str
    usage: Optional[TokenUsage] = None
