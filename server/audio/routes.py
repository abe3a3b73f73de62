"""POST /v1/audio/transcriptions: a multipart form (`file` and the fields of
TranscriptionForm); the transcript as JSON, as plain text (`response_format: text`), or
with `stream: true` as server-sent events."""

from __future__ import annotations

from typing import Annotated, Union

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import PlainTextResponse

from ..core.openapi import generating, ref, sse_event
from ..core.streaming import folded, openai_stream
from .protocol import TranscriptDelta, TranscriptDone, Transcription, TranscriptionForm, TranscriptionVerbose
from .serving import TranscriptionServing

router = APIRouter()

EVENT = sse_event({"anyOf": [ref(TranscriptDelta), ref(TranscriptDone)]}, done=False)
RESPONSES = generating(Union[Transcription, TranscriptionVerbose],
                       "`transcript.text.delta` events as `data:` lines, then one `transcript.text.done`", EVENT)
RESPONSES[200]["content"]["text/plain"] = {"schema": {"type": "string"}}  # response_format: text


def transcriptions(request: Request) -> TranscriptionServing:
    return request.app.state.transcriptions


@router.post("/v1/audio/transcriptions", responses=RESPONSES)
async def create_transcription(file: Annotated[UploadFile, File(description="the audio: WAV, MP3, FLAC or OGG")],
                               form: Annotated[TranscriptionForm, Form()], request: Request):
    """The audio's transcript, by a model that takes audio (its mmproj file has an audio encoder)."""
    request.app.state.catalog.answering(form)
    data = await file.read()
    if form.stream:
        return openai_stream(await transcriptions(request).stream(form, data))
    reply = await folded(request, transcriptions(request).create(form, data))
    return PlainTextResponse(reply) if isinstance(reply, str) else reply
