"""Audio in (engine/sound.py). Decoding: files written by soundfile come back as their
samples; stereo is averaged; other rates are resampled to sines of the same frequency, and
to miniaudio's own decoder output (llama.cpp's vendored miniaudio.h, built here as mtmd's
`decode_audio_from_buf` uses it); bad, empty, oversized and mislabelled audio is refused
with a message that says why. Features: the Gemma 4 and Whisper log-mels equal
transformers' extractors where mtmd does what they do, and follow mtmd where it does not
(the differences are asserted too, so that a test fails if either side changes)."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from transformers import Gemma4AudioFeatureExtractor, WhisperFeatureExtractor

from gguf_serve.engine.errors import AudioError
from gguf_serve.engine.sound import (audio_header, decode_audio, gemma4_frames, gemma4_log_mel, resampled_length,
                                     whisper_frames, whisper_log_mel)

Q16 = 1 / 32768  # one step of 16-bit PCM


def encode(x: np.ndarray, rate: int, fmt: str = "WAV", subtype: str = "PCM_16") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def noise(n: int, channels: int = 1, seed: int = 0, scale: float = 0.3) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, channels)) * scale
    return np.clip(x, -0.99, 0.99).astype(np.float32).squeeze()


def chirp(seconds: float, seed: int = 0, loud: float = 0.3) -> np.ndarray:
    t = np.arange(int(16000 * seconds)) / 16000
    x = loud * np.sin(2 * np.pi * (200 + 800 * t / seconds) * t) + 0.05 * np.random.default_rng(seed).standard_normal(len(t))
    return x.astype(np.float32)


# --- decoding ---------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["WAV", "FLAC"])
def test_16k_files_round_trip(fmt):
    x = noise(16000 + 7)
    y = decode_audio(encode(x, 16000, fmt))
    assert y.dtype == np.float32 and y.shape == x.shape
    assert np.abs(y - x).max() <= Q16  # 16-bit quantization, nothing else
    assert audio_header(encode(x, 16000, fmt)) == (fmt.lower(), len(x) / 16000, 16000, 1)


def test_stereo_is_averaged_to_mono():
    left, right = noise(8000, seed=1), noise(8000, seed=2)
    y = decode_audio(encode(np.stack([left, right], 1), 16000))
    assert y.shape == (8000,)
    assert np.abs(y - (left + right) / 2).max() <= Q16
    assert np.abs(y - left).max() > 0.1  # not one channel


@pytest.mark.parametrize("rate", [44100, 8000, 22050])
def test_other_rates_resample_to_the_same_sine(rate):
    n = rate + 17
    y = decode_audio(encode(0.5 * np.sin(2 * np.pi * 440 * np.arange(n) / rate), rate, subtype="FLOAT"))
    assert len(y) == resampled_length(n, rate, 16000) == {44100: 16006, 8000: 16034, 22050: 16012}[rate]
    t = np.arange(len(y)) / 16000
    steady = slice(400, len(y) - 10)  # past the low-pass's start
    basis = np.stack([np.sin(2 * np.pi * 440 * t), np.cos(2 * np.pi * 440 * t)], 1)[steady]
    (s, c), *_ = np.linalg.lstsq(basis, y[steady], rcond=None)
    residual = y[steady] - basis @ (s, c)
    assert abs(np.hypot(s, c) - 0.5) < 0.005  # 440 Hz passes the low-pass whole
    assert np.sqrt(np.mean(residual ** 2)) < 1e-3 and np.abs(residual).max() < 2e-3  # a sine of that frequency
    # lagging by miniaudio's one input sample and the low-pass's delay (under 0.25 ms at 440 Hz)
    assert 2 * np.pi * 440 / rate < -np.arctan2(c, s) < 0.7


def test_mp3_decodes():
    if "MP3" not in sf.available_formats():
        pytest.skip("this libsndfile writes no MP3 (1.1+ does)")
    x = 0.5 * np.sin(2 * np.pi * 440 * np.arange(44100) / 44100)
    data = encode(x, 44100, "MP3", "MPEG_LAYER_III")
    assert audio_header(data)[0] == "mp3"
    y = decode_audio(data, fmt="mp3")
    assert len(y) == resampled_length(44100, 44100, 16000) == 16000  # gapless: the encoder's delay is removed
    ref = decode_audio(encode(x, 44100, subtype="FLOAT"))
    snr = 10 * np.log10(np.sum(ref ** 2) / np.sum((y - ref) ** 2))
    assert snr > 25, snr


# miniaudio's decoder as mtmd-helper.cpp's decode_audio_from_buf sets it up: f32, mono,
# the model's rate; a buffer of get_length_in_pcm_frames samples, zero-filled, read into
MINIAUDIO_DECODE = r"""
#define MINIAUDIO_IMPLEMENTATION
#define MA_NO_ENCODING
#define MA_NO_DEVICE_IO
#define MA_NO_RESOURCE_MANAGER
#define MA_NO_NODE_GRAPH
#define MA_NO_ENGINE
#define MA_NO_GENERATION
#define MA_API static
#include "miniaudio/miniaudio.h"
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    FILE *f = fopen(argv[1], "rb");
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    rewind(f);
    unsigned char *buf = malloc(len);
    if (fread(buf, 1, len, f) != (size_t)len) return 1;
    ma_decoder_config cfg = ma_decoder_config_init(ma_format_f32, 1, atoi(argv[2]));
    ma_decoder dec;
    ma_uint64 n, got = 0;
    if (ma_decoder_init_memory(buf, len, &cfg, &dec) != MA_SUCCESS) return 2;
    if (ma_decoder_get_length_in_pcm_frames(&dec, &n) != MA_SUCCESS) return 3;
    float *out = calloc(n + 1, sizeof(float));
    if (n && ma_decoder_read_pcm_frames(&dec, out, n, &got) != MA_SUCCESS) return 4;
    fwrite(out, sizeof(float), n, stdout);
    return 0;
}
"""


@pytest.fixture(scope="module")
def miniaudio(tmp_path_factory) -> Path:
    src = Path(os.environ.get("LLAMA_CPP_SRC", "/nonexistent")) / "vendor"
    cc = shutil.which("cc") or shutil.which("gcc")
    if not (src / "miniaudio" / "miniaudio.h").exists() or not cc:
        if os.environ.get("CI"):
            pytest.fail("LLAMA_CPP_SRC (llama.cpp's source, with vendor/miniaudio) is not set; .ci/run sets it")
        pytest.skip("LLAMA_CPP_SRC with vendor/miniaudio/miniaudio.h, or a C compiler, is missing")
    folder = tmp_path_factory.mktemp("miniaudio")
    (folder / "decode.c").write_text(MINIAUDIO_DECODE)
    subprocess.run([cc, "-O1", "-w", "-I", str(src), "-o", str(folder / "decode"), str(folder / "decode.c"),
                    "-lm", "-lpthread"], check=True)
    return folder / "decode"


@pytest.mark.parametrize("rate, channels, fmt, subtype, n, tol", [
    (44100, 1, "WAV", "PCM_16", 88217, 1e-6),
    (8000, 1, "WAV", "PCM_16", 8003, 1e-6),
    (48000, 2, "WAV", "PCM_16", 48000, 1e-6),  # miniaudio's count is one over what it makes: a zero at the end
    (96000, 1, "FLAC", "PCM_16", 96000, 1e-6),
    (11025, 2, "WAV", "FLOAT", 11111, 1e-6),
    (22050, 1, "WAV", "PCM_24", 22050, 1e-6),
    (44100, 1, "MP3", "MPEG_LAYER_III", 44100, 1e-4),  # its own MP3 decoder (minimp3) against libmpg123
])
def test_resampling_is_miniaudios(miniaudio, tmp_path, rate, channels, fmt, subtype, n, tol):
    t = np.arange(n)[:, None] / rate
    x = 0.4 * np.sin(2 * np.pi * 440 * t) + noise(n * channels, seed=3, scale=0.1).reshape(n, channels)
    data = encode(np.clip(x, -1, 1), rate, fmt, subtype)
    (tmp_path / "in").write_bytes(data)
    run = subprocess.run([str(miniaudio), str(tmp_path / "in"), "16000"], capture_output=True, check=True)
    theirs = np.frombuffer(run.stdout, np.float32)
    ours = decode_audio(data)
    assert len(ours) == len(theirs) == resampled_length(n, rate, 16000)
    assert np.abs(ours - theirs).max() < tol
    if (rate, n) == (48000, 48000):
        assert len(ours) == 16001 and ours[-1] == theirs[-1] == 0


def test_bad_audio_is_refused_with_a_reason():
    wav = encode(noise(16000), 16000)
    with pytest.raises(AudioError, match="does not decode as WAV, MP3, FLAC or OGG"):
        decode_audio(b"this is not audio at all" * 10)
    with pytest.raises(AudioError, match="does not decode"):
        decode_audio(wav[:40])  # a header cut short
    with pytest.raises(AudioError, match="empty"):
        decode_audio(b"")
    with pytest.raises(AudioError, match="no samples"):
        decode_audio(encode(np.zeros(0, np.float32), 16000))
    with pytest.raises(AudioError, match=f"{len(wav)} bytes; the limit is 1000 bytes"):
        decode_audio(wav, max_bytes=1000)
    with pytest.raises(AudioError, match="1.0 seconds; the limit is 0.5 seconds"):
        audio_header(wav, max_seconds=0.5)
    with pytest.raises(AudioError, match="given as 'mp3', but its bytes are wav"):
        decode_audio(wav, fmt="mp3")
    with pytest.raises(AudioError, match="'aac' is not supported"):
        decode_audio(wav, fmt="aac")
    with pytest.raises(AudioError, match="AIFF"):
        decode_audio(encode(noise(100), 16000, "AIFF"))
    assert len(decode_audio(wav, fmt="audio/wav")) == 16000


# --- features -----------------------------------------------------------------------

def transformers_gemma4(x: np.ndarray) -> np.ndarray:
    """transformers' Gemma 4 features as mtmd computes them: no padding to 128 samples (so
    no masked frames), and ln(max(mel, 0.001)) for its ln(mel + 0.001)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fe = Gemma4AudioFeatureExtractor(mel_floor=0.0)
        out = fe([x], pad_to_multiple_of=None, return_tensors="np")
    assert out["input_features_mask"].all()
    return np.maximum(out["input_features"][0], np.log(0.001))


def test_gemma4_matches_transformers():
    x = chirp(3.7)
    (ours,) = gemma4_log_mel(x, 128)
    theirs = transformers_gemma4(x)
    assert ours.shape == theirs.shape == (369, 128) and gemma4_frames(len(x)) == [369]
    assert np.abs(ours - theirs).max() < 5e-5  # measured 1.2e-5: float32 frames, one bin at ln(mel) ~ -5.7
    # where mtmd differs: transformers' own floor is added, not a maximum
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        added = Gemma4AudioFeatureExtractor()([x], pad_to_multiple_of=None, return_tensors="np")["input_features"][0]
    assert np.abs(ours - added).max() > 0.01


def test_gemma4_chunks_long_audio():
    x = np.concatenate([chirp(30, seed=1), chirp(30, seed=2), chirp(5.5, seed=3)])
    chunks = gemma4_log_mel(x, 128)
    assert [len(c) for c in chunks] == gemma4_frames(len(x)) == [2999, 2999, 549]
    for i in (1, 2):
        assert np.abs(chunks[i] - transformers_gemma4(x[480000 * i:480000 * (i + 1)])).max() < 5e-5
    # a last chunk of one sample has no frame (mtmd fails on it); one of two has one
    assert gemma4_frames(480001) == [2999] and gemma4_frames(480002) == [2999, 1]
    assert len(gemma4_log_mel(x[:480001], 128)) == 1
    with pytest.raises(AudioError):
        gemma4_log_mel(np.zeros(0, np.float32), 128)


def transformers_whisper(x: np.ndarray, n_mel: int) -> np.ndarray:
    fe = WhisperFeatureExtractor(feature_size=n_mel)
    return fe([x], sampling_rate=16000, return_tensors="np")["input_features"][0].T


@pytest.mark.parametrize("n_mel", [80, 128])
def test_whisper_matches_transformers(n_mel):
    x = chirp(3.7)
    (ours,) = whisper_log_mel(x, n_mel)
    assert ours.shape == (3000, n_mel) and whisper_frames(len(x)) == [3000]
    assert np.abs(ours - transformers_whisper(x, n_mel)).max() < 5e-5  # measured 1.6e-5 (transformers' float32 torch STFT)


def test_whisper_follows_mtmds_floor_on_quiet_audio():
    # mtmd floors the mel at 2^-24 before log10, transformers at 1e-10: after the clamp to
    # max - 8 they differ only where the loudest mel is under 10^0.78, as here, in the silence
    x = chirp(2.0) * 0.1  # 2 s: 200 frames, the loudest mel at 10^-0.63
    (ours,) = whisper_log_mel(x, 80)
    theirs = transformers_whisper(x, 80)
    assert np.abs(ours[:199] - theirs[:199]).max() < 5e-5  # measured 4.6e-6
    silence = (np.log10(2.0 ** -24) + 4) / 4
    assert np.allclose(ours[205:], silence) and theirs[205:].max() < silence - 0.3


def test_whisper_chunks_long_audio():
    loud, quiet = chirp(30, seed=1, loud=0.5), chirp(35, seed=2, loud=0.1) * 0.5
    x = np.concatenate([loud, quiet])  # the loudest mel in the first 30 s: one max for both
    chunks = whisper_log_mel(x, 128)
    assert [len(c) for c in chunks] == whisper_frames(len(x)) == [3000, 3000, 3000]
    # the first chunk is transformers' first 30 s, but its last frame, which mtmd sees past 30 s
    assert np.abs(chunks[0][:2999] - transformers_whisper(loud, 128)[:2999]).max() < 5e-5
    assert whisper_frames(479840) == [3000, 3000] and whisper_frames(479839) == [3000]  # mtmd pads *by* 30 s
    short = whisper_log_mel(x[:100], 80)[0]  # under 201 samples: zero-filled to 201
    assert np.array_equal(short, whisper_log_mel(np.pad(x[:100], (0, 101)), 80)[0])
