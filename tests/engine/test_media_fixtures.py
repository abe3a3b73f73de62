"""The image and audio fixtures (tests/tiny_media.py) held up against llama.cpp's mtmd
(tests/mtmd_oracle.py), before the engine is measured with them: the converted files
load in mtmd, the prompts split into the chunks mtmd documents (the media wrapped in the
family's begin and end tokens, as many media tokens as clip.cpp's rules give), the text
chunks are the tokenizer's tokens, the media embeddings depend on the media, and the
greedy tokens are ids of the vocabulary."""

from __future__ import annotations

import copy
import io
import math

import numpy as np
import pytest
import soundfile
import torch
from PIL import Image

from gguf_serve.gguf_io import GGUFReader
from mtmd_oracle import MARKER, mtmd_prompt, mtmd_run
from tiny_media import (GEMMA4_MEDIA_TOKENS, GEMMA4_MTMD_WRAP, PATCH, QWEN2_AUDIO_MEDIA_TOKENS, QWEN2_AUDIO_MTMD_WRAP,
                        tiny_gemma4_media, tiny_qwen2_audio)

RATE = 16000  # both projectors' sample rate
QWEN2A_TOKENS = 750  # per 30 s window: 3000 mel frames, halved by the conv, halved by the pooling


@pytest.fixture(scope="session")
def gemma4(tmp_path_factory):
    return tiny_gemma4_media(tmp_path_factory.mktemp("gemma4-media"))


@pytest.fixture(scope="session")
def qwen2a(tmp_path_factory):
    return tiny_qwen2_audio(tmp_path_factory.mktemp("qwen2-audio"))


def png(width: int, height: int, seed: int = 0) -> bytes:
    rgb = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "PNG")
    return buf.getvalue()


def wav(seconds: float, seed: int = 0) -> bytes:
    """A 16 kHz 16-bit WAV: a rising tone under a slow swell, and some noise."""
    t = np.arange(int(seconds * RATE)) / RATE
    x = 0.3 * np.sin(2 * np.pi * (200 + 400 * t) * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 1.5 * t))
    x += 0.05 * np.random.default_rng(seed).standard_normal(t.size)
    buf = io.BytesIO()
    soundfile.write(buf, x.astype(np.float32), RATE, format="WAV")
    return buf.getvalue()


def gemma4v_tokens(width: int, height: int, patch: int = PATCH, merge: int = 3) -> int:
    """clip.cpp's count for gemma4v: mtmd_image_preprocessor_dyn_size resizes the image by
    calc_size_preserved_ratio (mtmd-image.cpp, in float32 as there) to multiples of
    patch * merge within 70 to 1120 tokens (set_limit_image_tokens), and each merge x merge
    block of patches is one token (clip_n_output_tokens)."""
    f32 = np.float32
    align = patch * merge
    lo, hi = 70 * align * align, 1120 * align * align
    w = max(align, math.floor(width / align + 0.5) * align)  # std::round
    h = max(align, math.floor(height / align + 0.5) * align)
    if w * h > hi:
        beta = np.sqrt(f32(height) * f32(width) / f32(hi))
        h = max(align, int(np.floor(f32(height) / beta / f32(align))) * align)
        w = max(align, int(np.floor(f32(width) / beta / f32(align))) * align)
    elif w * h < lo:
        beta = np.sqrt(f32(lo) / (f32(height) * f32(width)))
        h = int(np.ceil(f32(height) * beta / f32(align))) * align
        w = int(np.ceil(f32(width) * beta / f32(align))) * align
    return (w // align) * (h // align)


def gemma4a_tokens(n_samples: int) -> list[int]:
    """clip.cpp's counts for gemma4a, one per 30 s chunk: mtmd_audio_preprocessor_gemma4a's
    frames (20 ms windows every 10 ms, half a window of left padding: PyTorch's unfold
    count), then two stride-2 convolutions, O = (I - 1) / 2 + 1 each."""
    counts = []
    for off in range(0, n_samples, 30 * RATE):
        n = min(30 * RATE, n_samples - off)
        frames = (n + 160 - 321) // 160 + 1
        for _ in range(2):
            frames = (frames - 1) // 2 + 1
        counts.append(frames)
    return counts


def media_chunks(out: dict) -> list[tuple[str, int]]:
    return [(c["type"], c["n_tokens"]) for c in out["chunks"] if c["type"] != "text"]


def assert_well_formed(out: dict, n_vocab: int, n_embd: int) -> None:
    """Every media chunk encoded to (n_tokens, n_embd) finite embeddings, the positions
    add up, and the greedy tokens are ids of the vocabulary."""
    media = [c for c in out["chunks"] if c["type"] != "text"]
    assert [np.shape(e) for e in out["embeddings"]] == [(c["n_tokens"], n_embd) for c in media]
    assert all(np.isfinite(e).all() for e in out["embeddings"])
    assert out["n_past"] == sum(c["n_pos"] for c in out["chunks"])
    assert len(out["greedy"]) == 4 and all(0 <= t < n_vocab for t in out["greedy"]), out["greedy"]


def test_gemma4_files_are_the_converters(gemma4):
    """One mmproj file with both towers (gemma4v, gemma4a); the text file's vocabulary is
    the tokenizer's, its media tokens control tokens."""
    text, mmproj = GGUFReader(gemma4.text_path).metadata, GGUFReader(gemma4.mmproj_path).metadata
    assert (text["general.architecture"], text["tokenizer.ggml.model"]) == ("gemma4", "gemma4")
    assert text["tokenizer.ggml.tokens"] == gemma4.tokenizer.convert_ids_to_tokens(range(len(gemma4.tokenizer)))
    for name in ("<|image>", "<image|>", "<|image|>", "<|audio>", "<audio|>", "<|audio|>", "<|turn>", "<turn|>"):
        assert text["tokenizer.ggml.token_type"][gemma4.token_ids[name]] == 3, name  # CONTROL
    assert (mmproj["clip.vision.projector_type"], mmproj["clip.audio.projector_type"]) == ("gemma4v", "gemma4a")
    assert (mmproj["clip.vision.patch_size"], mmproj["clip.audio.num_mel_bins"]) == (PATCH, 128)


def test_gemma4_image_and_audio_prompt_through_mtmd(gemma4):
    """A chat with an image and a sound, rendered by the fixture's template and handed to
    mtmd as llama-server does: text, image, text, audio, text; the media wrapped in
    <|image> ... <image|> and <|audio> ... <audio|>; each text chunk the tokenizer's tokens."""
    tok, ids = gemma4.tokenizer, gemma4.token_ids
    content = [{"type": "image"}, {"type": "text", "text": "Describe this image,"}, {"type": "audio"},
               {"type": "text", "text": "then the sound: 12 cafés?"}]
    messages = [{"role": "user", "content": content}]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered.count(GEMMA4_MEDIA_TOKENS["image"]) == rendered.count(GEMMA4_MEDIA_TOKENS["audio"]) == 1
    prompt = mtmd_prompt(rendered, GEMMA4_MEDIA_TOKENS.values(), bos=tok.bos_token)
    out = mtmd_run(gemma4.text_path, gemma4.mmproj_path, prompt, [png(96, 64), wav(1.5)])
    assert [c["type"] for c in out["chunks"]] == ["text", "image", "text", "audio", "text"]
    assert media_chunks(out) == [("image", gemma4v_tokens(96, 64)), ("audio", *gemma4a_tokens(int(1.5 * RATE)))]
    assert gemma4v_tokens(96, 64) == 77  # raised to the 70 tokens' floor: 264 x 168 pixels, 11 x 7 tokens
    # the text between: mtmd tokenizes each piece by itself (BOS before the first), the wrap tokens at the ends
    pieces = prompt.split(MARKER)
    (image_beg, image_end), (audio_beg, audio_end) = GEMMA4_MTMD_WRAP["image"], GEMMA4_MTMD_WRAP["audio"]
    expected = [tok(pieces[0]).input_ids + [ids[image_beg]],
                [ids[image_end]] + tok(pieces[1], add_special_tokens=False).input_ids + [ids[audio_beg]],
                [ids[audio_end]] + tok(pieces[2], add_special_tokens=False).input_ids]
    assert [c["tokens"] for c in out["chunks"] if c["type"] == "text"] == expected
    # llama.cpp attends both ways inside an image for every Gemma 4 but E2B and E4B (n_embd 1536, 2560)
    assert [c["non_causal"] for c in out["chunks"] if c["type"] != "text"] == [True, False]
    assert_well_formed(out, len(tok), 128)
    image, audio = (np.asarray(e) for e in out["embeddings"])
    for e in (image, audio):  # the tokens differ from one another: the media counts, not a bias alone
        assert e.std(axis=0).mean() > 0.2 * np.abs(e).mean(), e.std(axis=0).mean()


@pytest.mark.parametrize("width,height,kind", [(96, 64, "png"), (250, 190, "rgb")])
def test_gemma4_image_tokens_follow_clip_rule(gemma4, width, height, kind):
    """The image's token count is clip.cpp's (96 x 64: raised to the floor of 70 tokens;
    250 x 190: rounded to 240 x 192 pixels, 10 x 8 tokens), from a PNG file's bytes or
    raw RGB; another image gives other embeddings."""
    rgb = np.asarray(Image.open(io.BytesIO(png(width, height, seed=1))))
    media = png(width, height, seed=1) if kind == "png" else (width, height, rgb.tobytes())
    out = mtmd_run(gemma4.text_path, gemma4.mmproj_path, f"Look: {MARKER}", [media])
    assert media_chunks(out) == [("image", gemma4v_tokens(width, height))]
    assert_well_formed(out, len(gemma4.tokenizer), 128)
    if kind == "rgb":
        assert gemma4v_tokens(width, height) == 80
        other = mtmd_run(gemma4.text_path, gemma4.mmproj_path, f"Look: {MARKER}", [png(width, height, seed=2)])
        assert np.abs(np.subtract(other["embeddings"][0], out["embeddings"][0])).max() > 0.1


@pytest.mark.parametrize("seconds", [1.0, 2.5, 31.0])
def test_gemma4_audio_tokens_follow_clip_rule(gemma4, seconds):
    """The sound's token count is clip.cpp's (25 for 1 s, 63 for 2.5 s); past 30 s mtmd
    cuts it into 30 s chunks, back to back between one <|audio> and one <audio|>."""
    out = mtmd_run(gemma4.text_path, gemma4.mmproj_path, f"Listen: {MARKER} now", [wav(seconds)])
    counts = gemma4a_tokens(int(seconds * RATE))
    assert media_chunks(out) == [("audio", n) for n in counts]
    assert counts == {1.0: [25], 2.5: [63], 31.0: [750, 25]}[seconds]
    assert [c["type"] for c in out["chunks"]] == ["text"] + ["audio"] * len(counts) + ["text"]
    assert_well_formed(out, len(gemma4.tokenizer), 128)


def test_gemma4_q8_0_text_file_runs_with_the_projector(tmp_path_factory, gemma4):
    """The text model at q8_0 (the projector file as before) loads beside the projector
    and decodes an image prompt."""
    q8 = tiny_gemma4_media(tmp_path_factory.mktemp("gemma4-q8"), outtype="q8_0")
    assert q8.mmproj_path == gemma4.mmproj_path and q8.model is gemma4.model
    assert GGUFReader(q8.text_path).metadata["general.file_type"] == 7  # MOSTLY_Q8_0
    out = mtmd_run(q8.text_path, q8.mmproj_path, f"Look: {MARKER}", [png(96, 64)])
    assert media_chunks(out) == [("image", 77)]
    assert_well_formed(out, len(q8.tokenizer), 128)


def test_qwen2_audio_prompt_through_mtmd(qwen2a):
    """A chat with a sound, rendered by the fixture's template and handed to mtmd: text,
    750 audio tokens (a whole 30 s window, whatever the sound's length), text; the audio
    wrapped in <|audio_bos|> ... <|audio_eos|>; no BOS (Qwen2's files add none)."""
    tok, ids = qwen2a.tokenizer, qwen2a.token_ids
    messages = [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "What is this sound?"}]}]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt = mtmd_prompt(rendered, QWEN2_AUDIO_MEDIA_TOKENS.values())
    out = mtmd_run(qwen2a.text_path, qwen2a.mmproj_path, prompt, [wav(2.0)])
    assert [c["type"] for c in out["chunks"]] == ["text", "audio", "text"]
    assert media_chunks(out) == [("audio", QWEN2A_TOKENS)]
    before, after = prompt.split(MARKER)
    beg, end = QWEN2_AUDIO_MTMD_WRAP["audio"]
    assert [c["tokens"] for c in out["chunks"] if c["type"] == "text"] == [
        tok(before).input_ids + [ids[beg]], [ids[end]] + tok(after).input_ids]
    assert out["chunks"][1]["non_causal"] is False
    assert_well_formed(out, len(tok), 64)
    e = np.asarray(out["embeddings"][0])
    # the sound's tokens (2 s: the first 50) differ from the padding's more than those differ among themselves
    sound, padding = e[:50], e[400:]
    assert np.linalg.norm(sound - padding.mean(0), axis=1).mean() > 2 * np.linalg.norm(
        padding - padding.mean(0), axis=1).mean()


def test_qwen2_audio_past_30_seconds_makes_more_chunks(qwen2a):
    """Past 30 s mtmd encodes each whole 30 s window (the mel padded with 30 s of
    silence, the last incomplete window dropped) as its own chunk of 750 tokens."""
    out = mtmd_run(qwen2a.text_path, qwen2a.mmproj_path, f"Hear {MARKER}", [wav(31.0)])
    assert [c["type"] for c in out["chunks"]] == ["text", "audio", "audio", "text"]
    assert media_chunks(out) == [("audio", QWEN2A_TOKENS)] * 2
    assert_well_formed(out, len(qwen2a.tokenizer), 64)


@pytest.mark.parametrize("family", ["gemma4", "qwen2a"])
def test_checkpoint_text_logits_equal_llama_cpps(request, family):
    """The fixture's transformers model is what the text file holds: its logits for a text
    prompt equal llama.cpp's in float32 (no flash attention, a float32 KV cache)."""
    media = request.getfixturevalue(family)
    out = mtmd_run(media.text_path, media.mmproj_path, "The quick brown fox jumps over the lazy dog", [],
                   n_predict=1, f32=True)
    ids = out["chunks"][0]["tokens"]
    with torch.no_grad():
        dense = media.model(input_ids=torch.tensor([ids])).logits[0, -1]
    theirs = torch.tensor(out["logits"])
    assert (dense - theirs).abs().max() < 1e-3 * theirs.abs().max()


class _GeluQuickHalfTable(torch.nn.Module):
    """ggml's GELU-quick on the CPU: looked up in a float16 table at the input rounded to half."""

    def forward(self, x):
        h = x.half().float()
        return (h * torch.sigmoid(1.702 * h)).half().float()


def test_gemma4_image_embeddings_are_transformers_with_llama_cpps_arithmetic(gemma4):
    """mtmd's gemma4v is the fixture's vision tower and projector, with llama.cpp's choices:
    GELU-quick in the MLP where transformers has tanh GELU (the converter writes no
    clip.use_gelu, and clip.cpp's default is GELU-quick), and the patch convolution on
    pixels and weights rounded to half (ggml_conv_2d's im2col). An image that needs no
    resizing (264 x 168: multiples of 24, above the 70 tokens' floor)."""
    width, height = 264, 168
    data = png(width, height, seed=5)
    out = mtmd_run(gemma4.text_path, gemma4.mmproj_path, f"Look: {MARKER}", [data], f32=True)
    theirs = torch.tensor(out["embeddings"][0], dtype=torch.float32)
    model = copy.deepcopy(gemma4.model).model  # the session's model stays as it is
    tower = model.vision_tower
    for layer in tower.encoder.layers:
        layer.mlp.act_fn = _GeluQuickHalfTable()
    with torch.no_grad():
        proj = tower.patch_embedder.input_proj.weight
        proj.copy_(proj.half().float())
        pixels = torch.tensor(np.asarray(Image.open(io.BytesIO(data))), dtype=torch.float32).permute(2, 0, 1) / 255
        pixels = (2 * pixels - 1).half().float() / 2 + 0.5  # the tower scales by 2x - 1: half there
        p = PATCH
        patches = pixels.reshape(3, height // p, p, width // p, p).permute(1, 3, 2, 4, 0).reshape(1, -1, 3 * p * p)
        xy = torch.stack(torch.meshgrid(torch.arange(width // p), torch.arange(height // p), indexing="xy"), -1)
        ours = model.get_image_features(patches, xy.reshape(1, -1, 2)).pooler_output[0]
    assert ours.shape == theirs.shape == (gemma4v_tokens(width, height), 128)
    assert (ours - theirs).abs().max() < 3e-4 * theirs.abs().max()
