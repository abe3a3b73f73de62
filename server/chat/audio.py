"""Audio in chat messages: an `input_audio` content part (OpenAI's shape: `{"data":
<base64>, "format": "wav" | "mp3" | "flac" | "ogg"}`) had as bytes for the model's audio
encoder. The bounds are checked before any sample is decoded: at most --max-audio clips a
request, the base64 no longer than --max-audio-bytes allows before it is decoded, then
(server.chat.media, from each clip's header) the bytes, --max-audio-seconds, the format
named, and the clips' tokens against the context. Every failure is a 400 that names the
content part; nothing is dropped. Decoding the audio is the engine's (engine.sound)."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from ...engine import AudioError
from ..core.errors import BadRequest

TOKENS_PER_CLIP = 750  # the default --max-audio is the context over this (30 s of Gemma 4 audio)


class NoAudio(AudioError):
    """Audio for a model without an audio encoder: content it cannot use."""


@dataclass
class AudioPart:
    """An input_audio content part, its bytes had (decoded from base64, or uploaded)."""

    where: str  # the content part, as errors name it
    data: bytes
    format: str | None  # as the client named it ("wav", "audio/mpeg", ...), checked against the bytes


def audio_bytes(part, max_bytes: int) -> tuple[bytes, str | None]:
    """An input_audio part's (bytes, format), not yet decoded as audio (AudioError saying why
    not). `data` may also be a data URL (its media type the format where none is named), or
    bytes where the server made the part itself (an upload to /v1/audio/transcriptions)."""
    v = part.input_audio
    if not isinstance(v, dict) or "data" not in v:
        raise AudioError("an input_audio part needs input_audio: {\"data\": <base64>, \"format\": \"wav\", "
                         "\"mp3\", \"flac\" or \"ogg\"}")
    data, fmt = v["data"], v.get("format")
    if fmt is not None and not isinstance(fmt, str):
        raise AudioError(f"input_audio.format must be a name such as 'wav' or 'mp3', got {fmt!r}")
    if isinstance(data, bytes):
        return data, fmt
    if not isinstance(data, str):
        raise AudioError("input_audio.data must be the audio's bytes in base64")
    if data.startswith("data:"):
        head, sep, data = data.partition(",")
        if not sep or not head.endswith(";base64"):
            raise AudioError("a data URL must be data:<media type>;base64,<data>")
        fmt = fmt or head[5:-7].split(";")[0].strip() or None
    if any(c in data[:100] for c in " \n\r\t"):  # base64 wrapped in lines, as some encoders write it
        data = "".join(data.split())
    if len(data) // 4 * 3 > max_bytes + 2:  # refused before a byte is decoded
        raise AudioError(f"the audio is over {max_bytes} bytes (--max-audio-bytes)")
    try:
        return base64.b64decode(data, validate=True), fmt
    except (binascii.Error, ValueError):
        raise AudioError("input_audio.data is not valid base64") from None


def max_audio(settings, lm) -> int:
    """Clips a request may hold: --max-audio, else as many as the context holds at 30 s of
    Gemma 4 audio each."""
    return settings.max_audio or max(1, lm.n_ctx // TOKENS_PER_CLIP)


def no_audio(lm) -> NoAudio:
    if lm.vision is None:
        return NoAudio("this model has no mmproj file with an audio encoder, so it cannot take audio (start it "
                       "with --mmproj, or put the mmproj .gguf beside the model)")
    return NoAudio(f"this model's mmproj file ({lm.vision.projector}) has no audio encoder: it takes images, "
                   "not audio")


def bad_audio(e: AudioError, param: str) -> BadRequest:
    code = "unsupported_parameter" if isinstance(e, NoAudio) else "invalid_audio"
    return BadRequest(f"{param}: {e}", param=param, code=code)
