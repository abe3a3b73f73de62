"""POST /v1/audio/transcriptions over the chat path: the upload becomes one user message
holding the audio (an input_audio part, checked and bounded as any chat message's:
server.chat.media) and an instruction to transcribe it (with the language and the prompt
where given), run greedily unless a temperature is given, without thinking. The reply's
text is the transcript: as OpenAI's `json` (with token usage), `text` or `verbose_json`,
or streamed as `transcript.text.delta` events and one `transcript.text.done`. Segment
and word timestamps are not produced: `srt`, `vtt` and timestamp_granularities are
refused. An error from the chat path names the form's field (`file`, `model`), not the
message it made."""

from __future__ import annotations

import threading
from typing import AsyncIterator

from ...engine import audio_header
from ..chat.protocol import ChatCompletionRequest
from ..chat.serving import ChatServing
from ..chat.wire import Tally
from ..core.errors import APIError, BadRequest
from .protocol import (DurationUsage, InputTokenDetails, TokenUsage, TranscriptDelta, TranscriptDone, Transcription,
                       TranscriptionForm, TranscriptionVerbose)

INSTRUCTION = "Transcribe the speech in this audio{language}. Write only the words spoken, nothing else."
AUDIO_PART = "messages.0.content.0"  # where the chat path names the upload


def instruction(form: TranscriptionForm) -> str:
    """What the model is asked, after the audio."""
    text = INSTRUCTION.format(language=f" (its language: {form.language})" if form.language else "")
    if form.prompt:
        text += f"\nThe text that comes before it, for its style and spelling: {form.prompt}"
    return text


def to_chat(form: TranscriptionForm, data: bytes) -> ChatCompletionRequest:
    """The chat request an upload means (the audio's bytes as they are: the part is the
    server's own, so nothing is base64'd; its format is read from its bytes)."""
    content = [{"type": "input_audio", "input_audio": {"data": data}},
               {"type": "text", "text": instruction(form)}]
    return ChatCompletionRequest(model=form.model, messages=[{"role": "user", "content": content}],
                                 temperature=form.temperature, chat_template_kwargs={"enable_thinking": False})


def in_form_terms(e: APIError, model: str | None) -> APIError:
    """A chat path error as the form's: the audio part's is the file's, a model without an
    audio encoder the model's."""
    param = e.param or ""
    if param == AUDIO_PART and e.code == "unsupported_parameter":
        e.message = f"model {model!r} cannot transcribe: {e.message.removeprefix(AUDIO_PART + ': ')}"
        e.param = "model"
    elif param.startswith(AUDIO_PART) or param == "messages":
        e.message = e.message.replace(AUDIO_PART, "file", 1)
        e.param = "file"
    e.args = (e.message,)
    return e


def refuse_unsupported(form: TranscriptionForm) -> None:
    if form.response_format in ("srt", "vtt"):
        raise BadRequest(f"response_format {form.response_format!r} needs segment timestamps, which this server "
                         "does not produce; json, text or verbose_json can be had", param="response_format",
                         code="unsupported_parameter")
    if form.timestamp_granularities:
        raise BadRequest("timestamp_granularities: this server produces no segment or word timestamps",
                         param="timestamp_granularities", code="unsupported_parameter")
    if form.include:
        raise BadRequest(f"include: {form.include[0]!r} is not given by this server's transcriptions",
                         param="include", code="unsupported_parameter")
    if form.stream and form.response_format != "json":
        raise BadRequest("a streamed transcription is json events; response_format must be json",
                         param="response_format", code="unsupported_parameter")


def _usage(tally: Tally, audio_tokens: int) -> TokenUsage:
    return TokenUsage(input_tokens=tally.prompt_tokens, output_tokens=tally.completion_tokens,
                      total_tokens=tally.prompt_tokens + tally.completion_tokens,
                      input_token_details=InputTokenDetails(text_tokens=tally.prompt_tokens - audio_tokens,
                                                            audio_tokens=audio_tokens))


class TranscriptionServing:
    """The transcriptions endpoint over the chat path's generation."""

    def __init__(self, chat: ChatServing):
        self.service = chat

    async def _prepare(self, form: TranscriptionForm, data: bytes):
        refuse_unsupported(form)
        try:
            return await self.service.prepare_chat(to_chat(form, data))
        except APIError as e:
            raise in_form_terms(e, form.model) from None

    async def _pieces(self, prep, tally: Tally) -> AsyncIterator[str]:
        """The transcript's text as it is generated (a reasoning block, where a model
        writes one regardless, is not part of it)."""
        async for p in self.service.pieces(prep, tally):
            if p.content:
                yield p.content

    @staticmethod
    def _audio_tokens(prep) -> int:
        return sum(m.n_tokens for m in prep.media.values() if m.kind == "audio")

    async def create(self, form: TranscriptionForm, data: bytes) -> Transcription | TranscriptionVerbose | str:
        prep = await self._prepare(form, data)
        tally = Tally()
        text = "".join([piece async for piece in self._pieces(prep, tally)]).strip()
        if form.response_format == "text":
            return text
        if form.response_format == "verbose_json":
            settings = self.service.settings  # the bounds it was decoded within: its header reads
            seconds = audio_header(data, max_bytes=settings.max_audio_bytes, max_seconds=settings.max_audio_seconds)[1]
            return TranscriptionVerbose(language=form.language or "unknown", duration=seconds, text=text,
                                        usage=DurationUsage(seconds=seconds))
        return Transcription(text=text, usage=_usage(tally, self._audio_tokens(prep)))

    async def stream(self, form: TranscriptionForm, data: bytes) -> tuple[AsyncIterator[str], threading.Event]:
        """The SSE lines (a `data:` line an event, as OpenAI sends them), and the job's cancel flag."""
        prep = await self._prepare(form, data)  # queued now: a refusal is the response's status

        async def lines():
            tally, text, started = Tally(), [], False
            async for piece in self._pieces(prep, tally):
                if not started:  # the transcript starts at its first word
                    piece = piece.lstrip()
                    started = bool(piece)
                if piece:
                    text.append(piece)
                    yield f"data: {TranscriptDelta(delta=piece).model_dump_json()}\n\n"
            done = TranscriptDone(text="".join(text).strip(), usage=_usage(tally, self._audio_tokens(prep)))
            yield f"data: {done.model_dump_json(exclude_none=True)}\n\n"
        return lines(), prep.job.cancel
