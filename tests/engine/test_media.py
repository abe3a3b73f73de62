"""Images and audio against llama.cpp's mtmd (what llama-server --mmproj runs) on tiny
random models that llama.cpp's converter wrote (tests/tiny_media.py): Gemma 4 (a text
file and one mmproj file with its vision and audio towers), Qwen2-Audio (Whisper's
encoder, the second audio family) and Qwen3-VL (deepstack, multi-section rotary). The
same prompt tokens around each image or clip, the same number of media tokens, the
towers' embeddings within float rounding, the prompt's last logits close and the first
greedy tokens the same."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf
import torch
from PIL import Image

from gguf_serve.engine import AudioError, EngineConfig, ImageError, load_model
from gguf_serve.engine.batch import Batch
from gguf_serve.engine.generate import prompt_for
from gguf_serve.engine.chat import render
from gguf_serve.engine.sampling import SamplingParams
from gguf_serve.engine.scheduler import run_one
from gguf_serve.engine.vision import RopePlan

from mtmd_oracle import MARKER, mtmd_prompt, mtmd_run
from tiny_media import tiny_gemma4_media, tiny_qwen2_audio, tiny_qwen3vl


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory):
    return tiny_gemma4_media(tmp_path_factory.mktemp("gemma4-media"))


@pytest.fixture(scope="module")
def lm(gemma4):
    return load(gemma4)


def load(media, **kw):
    """The model with its mmproj file; forward passes of up to 2,048 tokens, so that `ours`
    takes a prompt with a whole clip in one (the scheduler's own chunks are tested too)."""
    return load_model(media.text_path, config=EngineConfig.resolve(mmproj=media.mmproj_path, n_ctx=2048, n_seq=1,
                                                                   max_batch=2048, **kw))


def png(width: int, height: int, seed: int = 1) -> bytes:
    rgb = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "PNG")
    return buf.getvalue()


def wav(seconds: float, rate: int = 16000, seed: int = 2, channels: int = 1, fmt: str = "WAV") -> bytes:
    n = int(seconds * rate)
    t = np.arange(n) / rate
    x = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * np.random.default_rng(seed).standard_normal(n)
    x = np.stack([x] * channels, axis=1) if channels > 1 else x
    buf = io.BytesIO()
    sf.write(buf, x.astype(np.float32), rate, format=fmt, subtype="PCM_16")
    return buf.getvalue()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def ours(lm, text: str, items: list) -> tuple[list[int], torch.Tensor, list[int]]:
    """Our prompt ids for a template-rendered `text` (marks where the media go), the last
    position's logits (the prompt in one forward) and 4 greedy tokens (the scheduler)."""
    ids = lm.vision.rendered_ids(text, items)
    media = {i.key: i for i in items}
    emb = {k: lm.vision.encode(i) for k, i in media.items()}
    causal = frozenset(k for k, i in media.items() if not i.both_ways)
    ropes = [RopePlan(ids, media).positions(0, len(ids))] if lm.vision.mrope else None
    slot = lm.cache.allocate()
    try:
        logits = lm.forward(Batch.of([(slot, ids, 0)], "last", media=emb, causal_media=causal,
                                     rope_positions=ropes))[-1]
    finally:
        lm.cache.free(slot)
    steps = run_one(lm, ids, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), media=media)
    return ids, logits, [s.token_id for s in steps if s.token_id is not None]


def text_tokens(result) -> list[list[int]]:
    return [c["tokens"] for c in result["chunks"] if c["type"] == "text"]


def check(lm, files, mark_text: str, items: list, data: list[bytes], tol: float = 2e-3, logits_tol: float = 1e-2,
          bos: str = "<bos>", greedy_tokens: int = 4):
    """Our prompt, embeddings, logits and first `greedy_tokens` greedy tokens against mtmd's for
    the same prompt (`mark_text` with "{}" where each medium goes; mtmd adds the file's BOS, `bos`)."""
    marks = [lm.vision.kinds[i.kind].marks[-1] for i in items]
    theirs = mtmd_run(files.text_path, files.mmproj_path, mark_text.format(*[MARKER] * len(items)), data)
    ids, logits, greedy = ours(lm, bos + mark_text.format(*marks), items)
    media_chunks = [c for c in theirs["chunks"] if c["type"] != "text"]
    # mtmd cuts clips over 30 s into several chunks, back to back: one run of ours
    assert sum(c["n_tokens"] for c in media_chunks) == sum(i.n_tokens for i in items)
    # positions: with multi-section rotary an image takes max(rows, columns) of them
    assert len(ids) - (RopePlan(ids, {i.key: i for i in items}).total if lm.vision.mrope else 0) == theirs["n_past"]
    assert [t for t in ids if t >= 0] == [t for tokens in text_tokens(theirs) for t in tokens]
    embeddings = [torch.tensor(e) for e in theirs["embeddings"]]
    at = 0
    for item in items:
        want, n = [], 0
        while n < item.n_tokens:
            want.append(embeddings[at])
            n, at = n + embeddings[at].shape[0], at + 1
        assert rel(lm.vision.encode(item), torch.cat(want)) < tol, item.kind
    # llama.cpp's f16 cache rows keep its logits ~3e-3 from ours; an image read causally is 0.58 off
    assert rel(logits, torch.tensor(theirs["logits"])) < logits_tol
    assert greedy[:greedy_tokens] == theirs["greedy"][:greedy_tokens]
    return theirs


@pytest.mark.parametrize("size", [(240, 192), (96, 64), (1000, 300), (30, 40)])
def test_images_equal_mtmd(lm, gemma4, size):
    """Sizes: one the tower takes as it is, and ones resized up, with std::round's halves
    (1000 x 300: 12.5 rows round up), and to the 70-token minimum."""
    data = png(*size)
    item = lm.vision.prepare(data)
    assert lm.vision.count(data)[1] == item.n_tokens
    theirs = check(lm, gemma4, "look {} here", [item], [data])
    assert [c["non_causal"] for c in theirs["chunks"] if c["type"] == "image"] == [True]  # both ways (sliding layers)


@pytest.mark.parametrize("seconds,rate,channels", [(2.0, 16000, 1), (1.3, 44100, 2), (0.5, 8000, 1)])
def test_audio_equals_mtmd(lm, gemma4, seconds, rate, channels):
    data = wav(seconds, rate, channels=channels)
    item = lm.vision.prepare_audio(data, "wav")
    assert lm.vision.count_audio(data, "wav")[1] == item.n_tokens
    theirs = check(lm, gemma4, "listen {} now", [item], [data])
    assert [c["non_causal"] for c in theirs["chunks"] if c["type"] == "audio"] == [False]


def test_clip_over_thirty_seconds_is_mtmd_chunks(lm, gemma4):
    """A 35-second clip: mtmd encodes 30-second pieces on their own (750 + 125 tokens)."""
    data = wav(35.0)
    item = lm.vision.prepare_audio(data)
    assert item.n_tokens == 875
    check(lm, gemma4, "{}", [item], [data])


def test_image_and_audio_in_one_prompt(lm, gemma4):
    image, clip = png(96, 64, seed=5), wav(1.0, seed=6)
    items = [lm.vision.prepare(image), lm.vision.prepare_audio(clip)]
    check(lm, gemma4, "see {} and hear {} then", items, [image, clip])


def test_q8_0_text_file(tmp_path):
    """A Q8_0 text file: both engines quantize the activations of this tiny random model,
    which moves its logits ~5% apart with or without media (a text-only prompt as much);
    the first greedy token stays the same (on CPUs without AMX, where our prompt quantizes
    its activations too, the later ones of this random model part from mtmd's)."""
    q8 = tiny_gemma4_media(tmp_path, outtype="q8_0")
    lm = load(q8)
    data = wav(1.0)
    check(lm, q8, "hear {}", [lm.vision.prepare_audio(data)], [data], logits_tol=0.1, greedy_tokens=1)


def test_bad_media_named(lm):
    with pytest.raises(AudioError, match="does not decode"):
        lm.vision.prepare_audio(b"RIFF....WAVEfmt nonsense")
    with pytest.raises(AudioError, match="given as 'mp3'"):
        lm.vision.count_audio(wav(0.5), "mp3")
    with pytest.raises(ImageError):
        lm.vision.prepare(b"not an image")


# ----------------------------------------------------------------------------- Qwen2-Audio


@pytest.fixture(scope="module")
def qwen2_audio(tmp_path_factory):
    return tiny_qwen2_audio(tmp_path_factory.mktemp("qwen2-audio"))


@pytest.mark.parametrize("seconds,rate", [(2.0, 16000), (0.7, 22050)])
def test_qwen2_audio_equals_mtmd(qwen2_audio, seconds, rate):
    """Whisper pads every clip to whole 30-second chunks: 750 tokens for a short one."""
    lm = load(qwen2_audio)
    data = wav(seconds, rate)
    item = lm.vision.prepare_audio(data)
    assert item.n_tokens == lm.vision.count_audio(data)[1] == 750
    check(lm, qwen2_audio, "listen {} now", [item], [data], logits_tol=2e-2, bos="")


def test_qwen2_audio_takes_no_images(qwen2_audio):
    lm = load(qwen2_audio)
    with pytest.raises(ImageError, match="no vision encoder"):
        lm.vision.prepare(png(32, 32))


# ----------------------------------------------------------------------------- Qwen3-VL


@pytest.fixture(scope="module")
def qwen3vl(tmp_path_factory):
    return tiny_qwen3vl(tmp_path_factory.mktemp("qwen3vl"))


def test_qwen3vl_deepstack_image_equals_mtmd(qwen3vl):
    """Qwen3-VL's image tokens carry the main embedding and one per deepstack layer (3 x the
    text width), added after the first text layers; their rotary positions are (time, row,
    column). A 256 x 256 image: 64 tokens by llama.cpp's sizing and by Qwen's processor
    (which ours follows: at least 64 tokens, where llama.cpp's go down to 8)."""
    lm = load(qwen3vl)
    data = png(256, 256)
    item = lm.vision.prepare(data)
    assert item.n_tokens == 64 and lm.vision.encode(item).shape == (64, 3 * lm.params.hidden)
    check(lm, qwen3vl, "look {} here", [item], [data], bos="")
    # without the deepstack slices the prompt's logits are far from llama.cpp's
    flat = lm.vision.prepare(data)
    flat.embeddings = lm.vision.encode(item)[:, :lm.params.hidden].contiguous()
    _, logits, _ = ours(lm, "look <|image_pad|> here", [flat])
    theirs = mtmd_run(qwen3vl.text_path, qwen3vl.mmproj_path, "look " + MARKER + " here", [data])
    assert rel(logits, torch.tensor(theirs["logits"])) > 0.1


def test_chat_messages_render_as_llama_server_prompts_them(gemma4, qwen2_audio, qwen3vl):
    """Chat messages with media parts, through each tiny model's own template: our prompt's
    text tokens and media runs are those mtmd makes of the template's output with each
    part's placeholder as its marker (what llama-server hands it)."""
    cases = ((gemma4, ("<|image|>", "<|audio|>"), "<bos>"), (qwen2_audio, ("<|AUDIO|>",), None),
             (qwen3vl, ("<|vision_start|><|image_pad|><|vision_end|>",), None))
    for files, tokens, bos in cases:
        lm = load(files)
        parts = [{"type": "text", "text": "What is this?"}]
        if lm.vision.audio_tower is not None:
            parts.insert(0, {"type": "audio", "audio": wav(0.8)})
        if lm.vision.tower is not None:
            parts.insert(0, {"type": "image", "image": png(256, 256)})
        messages = [{"role": "user", "content": parts}]
        ids, media = prompt_for(lm, messages)
        marked = [{"type": p["type"]} if p["type"] != "text" else p for p in parts]
        text = render(lm.tokenizer, lm.chat_template, [{"role": "user", "content": marked}])
        theirs = mtmd_run(files.text_path, files.mmproj_path, mtmd_prompt(text, tokens, bos),
                          [p[p["type"]] for p in parts if p["type"] != "text"])
        assert [t for t in ids if t >= 0] == [t for chunk in text_tokens(theirs) for t in chunk]
        assert sum(t < 0 for t in ids) == sum(c["n_tokens"] for c in theirs["chunks"] if c["type"] != "text")
