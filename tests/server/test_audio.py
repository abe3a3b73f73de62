"""Audio through the server with the real openai and anthropic clients: a tiny random
Gemma 4 with a vision and an audio tower (text file + mmproj file), served beside the
text-only Gemma 3 270M. An input_audio part in chat completions, the Responses API and
Anthropic's Messages (both block shapes), its tokens counted in the usage as the engine
counts them from the clip's header; audio and an image in one message, in order;
/v1/audio/transcriptions (json, text, verbose_json, streamed); and every bad clip a 400
naming the content part (or the form's field) while the server keeps serving."""

from __future__ import annotations

import base64
import io
import json
import os

import anthropic
import httpx
import numpy as np
import openai
import pytest
import soundfile as sf

from server_harness import server
from tiny_media import GEMMA4_MTMD_WRAP, tiny_gemma4_media
from tiny_vision import data_url, image

MODEL = "text-f32.gguf"
WRAP = len(GEMMA4_MTMD_WRAP["audio"])  # <|audio> and <audio|> around a clip's tokens
MAX_BYTES, MAX_SECONDS, CTX = 250_000, 120, 2048


def wav(seconds: float = 1.0, rate: int = 16000, subtype: str = "PCM_16", fmt: str = "WAV", hz: float = 440) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32), rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def audio(data: bytes, fmt: str | None = "wav") -> dict:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}


def user(*parts) -> dict:
    return {"role": "user", "content": [{"type": "text", "text": "what is this"}, *parts]}


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    return tiny_gemma4_media(tmp_path_factory.mktemp("media"))


@pytest.fixture(scope="module")
def lm(media):
    """The engine's own reading of the model, the oracle of the tokens a clip takes."""
    from gguf_serve.engine import EngineConfig, load_model

    return load_model(media.text_path, config=EngineConfig(mmproj=media.mmproj_path, n_ctx=CTX, n_seq=1))


@pytest.fixture(scope="module")
def base(media, gemma_path):
    with server(media.text_path, gemma_path, "--mmproj", media.mmproj_path, "--ctx-size", str(CTX), "--parallel", "2",
                "-n", "6", "--max-audio", "2", "--max-audio-bytes", str(MAX_BYTES),
                "--max-audio-seconds", str(MAX_SECONDS)) as b:
        yield b


@pytest.fixture(scope="module")
def client(base):
    return openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)


def clip_tokens(lm, data: bytes) -> int:
    return lm.vision.count_audio(data, "wav")[1]


def test_chat_counts_the_clips_tokens(client, lm):
    clip = wav(1.0)
    r = client.chat.completions.create(model=MODEL, messages=[user(audio(clip))], max_tokens=3, temperature=0,
                                       extra_body={"ignore_eos": True})
    text_only = client.chat.completions.create(model=MODEL, messages=[user()], max_tokens=1)
    assert r.usage.completion_tokens == 3
    n = clip_tokens(lm, clip)
    assert n == 25  # Gemma 4: a token per 40 ms
    assert r.usage.prompt_tokens - text_only.usage.prompt_tokens == n + WRAP
    chunks = list(client.chat.completions.create(model=MODEL, messages=[user(audio(clip))], max_tokens=3,
                                                 temperature=0, stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))
    assert chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content


def test_clips_and_an_image_in_one_message_in_order(client, lm):
    a, b, picture = wav(1.0), wav(2.0, hz=220), data_url(1)
    one = client.chat.completions.create(model=MODEL, messages=[user(audio(a), image(picture), audio(b))],
                                         max_tokens=3, temperature=0, logprobs=True, extra_body={"ignore_eos": True})
    two = client.chat.completions.create(model=MODEL, messages=[user(audio(b), image(picture), audio(a))],
                                         max_tokens=3, temperature=0, logprobs=True, extra_body={"ignore_eos": True})
    text_only = client.chat.completions.create(model=MODEL, messages=[user()], max_tokens=1)
    _, image_tokens = lm.vision.count(base64.b64decode(picture.partition(",")[2]))
    added = clip_tokens(lm, a) + clip_tokens(lm, b) + 2 * WRAP + image_tokens + 2  # <|image> and <image|>
    assert one.usage.prompt_tokens == two.usage.prompt_tokens == text_only.usage.prompt_tokens + added
    lp = lambda r: [t.logprob for t in r.choices[0].logprobs.content]  # noqa: E731
    assert lp(one) != lp(two)


def test_responses_and_messages_take_audio(client, base):
    clip = wav(1.5)
    part = audio(clip)
    chat = client.chat.completions.create(model=MODEL, messages=[user(part)], max_tokens=1)
    r = client.responses.create(model=MODEL, max_output_tokens=2, input=[{"role": "user", "content": [
        {"type": "input_text", "text": "what is this"}, part]}])
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    claude = anthropic.Anthropic(base_url=base, api_key="x", max_retries=0)
    shaped_as_image = {"type": "audio", "source": {"type": "base64", "media_type": "audio/wav",
                                                   "data": part["input_audio"]["data"]}}
    for block in (part, shaped_as_image):
        m = claude.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "text", "text": "what is this"}, block]}])
        assert m.usage.input_tokens + m.usage.cache_read_input_tokens == chat.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, max_output_tokens=2, input=[{"role": "user", "content": [
            {"type": "input_text", "text": "hi"}, audio(b"not audio")]}])
    assert e.value.body["param"] == "input.0.content.1" and e.value.body["code"] == "invalid_audio"
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "audio", "source": {"type": "base64", "media_type": "audio/mpeg",
                                         "data": part["input_audio"]["data"]}}]}])
    assert "messages.0.content.0" in e.value.message and "bytes are wav" in e.value.message


def test_transcriptions(client, lm):
    clip = wav(1.0)
    t = client.audio.transcriptions.create(model=MODEL, file=("clip.wav", clip, "audio/wav"))
    assert isinstance(t.text, str)
    assert t.usage.type == "tokens" and t.usage.input_token_details.audio_tokens == clip_tokens(lm, clip)
    assert t.usage.input_tokens > clip_tokens(lm, clip) and 1 <= t.usage.output_tokens <= 6  # -n 6
    text = client.audio.transcriptions.create(model=MODEL, file=("clip.wav", clip), response_format="text")
    assert text == t.text  # greedy: the same transcript
    verbose = client.audio.transcriptions.create(model=MODEL, file=("clip.wav", clip), language="en",
                                                 prompt="a tone", response_format="verbose_json")
    assert verbose.duration == pytest.approx(1.0) and verbose.language == "en" and isinstance(verbose.text, str)
    events = list(client.audio.transcriptions.create(model=MODEL, file=("clip.wav", clip), stream=True))
    assert events[-1].type == "transcript.text.done" and all(e.type == "transcript.text.delta" for e in events[:-1])
    assert events[-1].text == t.text == "".join(e.delta for e in events[:-1]).strip()
    assert events[-1].usage.input_tokens == t.usage.input_tokens
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.transcriptions.create(model=MODEL, file=("clip.wav", clip), response_format="srt")
    assert e.value.body["param"] == "response_format" and "timestamps" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.transcriptions.create(model=MODEL, file=("clip.wav", b"RIFF not really"))
    assert e.value.body["param"] == "file" and e.value.body["code"] == "invalid_audio"
    r = httpx.post(f"{client.base_url}audio/transcriptions", data={"model": MODEL})
    assert r.status_code == 400 and r.json()["error"]["param"] == "file"


def test_the_streamed_events_fit_the_document(base):
    import jsonschema

    doc = httpx.get(f"{base}/openapi.json").json()
    ok = doc["paths"]["/v1/audio/transcriptions"]["post"]["responses"]["200"]["content"]
    data_schema = {**ok["text/event-stream"]["schema"]["properties"]["data"]["contentSchema"],
                   "components": doc["components"]}
    r = httpx.post(f"{base}/v1/audio/transcriptions", data={"model": MODEL, "stream": "true"},
                   files={"file": ("clip.wav", wav(1.0), "audio/wav")}, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1]["type"] == "transcript.text.done"
    for e in events:
        jsonschema.validate(e, data_schema)


def bad(client, messages) -> dict:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    return e.value.body


def test_bad_audio_names_the_part_and_the_server_keeps_serving(client, lm):
    clip = wav(1.0)
    cases = [  # (part, what the message says)
        ({"type": "input_audio", "input_audio": {"data": "@@@", "format": "wav"}}, "not valid base64"),
        ({"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}, "empty"),
        (audio(b"not a sound at all"), "does not decode"),
        (audio(clip, "mp3"), "given as 'mp3', but its bytes are wav"),
        (audio(clip, "aac"), "'aac' is not supported"),
        ({"type": "input_audio", "input_audio": "a string"}, "needs input_audio"),
        (audio(wav(10.0)), f"over {MAX_BYTES} bytes (--max-audio-bytes)"),  # 320 kB
        (audio(wav(130.0, rate=1000, subtype="PCM_U8")), f"the limit is {MAX_SECONDS} seconds"),
    ]
    for part, says in cases:
        b = bad(client, [{"role": "system", "content": "be brief"}, user(part)])
        assert (b["param"], b["code"]) == ("messages.1.content.1", "invalid_audio"), (says, b)
        assert says in b["message"], b
    b = bad(client, [user(audio(clip), audio(clip), audio(clip))])
    assert b["param"] == "messages.0.content.3" and "at most 2 audio clips (--max-audio)" in b["message"]
    long = wav(90.0, rate=1000)  # within the bytes and seconds, not within the context
    assert clip_tokens(lm, long) >= CTX
    b = bad(client, [user(audio(long))])
    assert (b["param"], b["code"]) == ("messages.0.content.1", "context_length_exceeded")
    b = bad(client, [user(), {"role": "assistant", "content": [audio(clip)]}])
    assert b["param"] == "messages.1.content.0" and "user messages" in b["message"]
    ok = client.chat.completions.create(model=MODEL, messages=[user(audio(clip))], max_tokens=2)
    assert ok.usage.completion_tokens >= 1


def test_a_text_only_model_refuses_audio(client, gemma_path):
    text_model = os.path.basename(gemma_path)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=text_model, messages=[user(audio(wav()))], max_tokens=1)
    body = e.value.body
    assert (body["param"], body["code"]) == ("messages.0.content.1", "unsupported_parameter")
    assert "cannot take audio" in body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.transcriptions.create(model=text_model, file=("clip.wav", wav()))
    assert e.value.body["param"] == "model" and "cannot transcribe" in e.value.body["message"]
    ok = client.chat.completions.create(model=text_model, messages=[user()], max_tokens=1)
    assert ok.usage.completion_tokens == 1
