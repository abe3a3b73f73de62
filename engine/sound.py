"""Audio in: bytes decoded to mono samples at the model's rate, and the log-mel features
llama.cpp's mtmd computes from them (tools/mtmd/mtmd-helper.cpp, mtmd-audio.cpp), so that
an audio tower here sees what it sees under llama.cpp.

Decoding is soundfile's (libsndfile: WAV, FLAC, MP3, OGG); what mtmd's miniaudio decoder
does after that is done here the way miniaudio does it: channels averaged to mono in
float32, then miniaudio's linear resampler (`ma_linear_resampler`, the decoder's default:
a 4th-order Butterworth low-pass as two biquads, at the lower rate's Nyquist, run on the
input when downsampling and on the output when upsampling, and linear interpolation that
lags one input sample), padded or cut to the length `ma_decoder_get_length_in_pcm_frames`
reports, which is what mtmd allocates. The biquads run as their impulse response by FFT
(float64) rather than as float32 recursions: the values differ from miniaudio's by float32
rounding (~1e-6), the lengths not at all. MP3 decoders (libmpg123 here, minimp3 there)
may differ slightly; mtmd reads no OGG.

The features: `gemma4_log_mel` is mtmd_audio_preprocessor_gemma4a, `whisper_log_mel` the
whisper preprocessor mtmd uses for QWEN2A, QWEN25O, ULTRAVOX, VOXTRAL, GLMA, MERALION and
MUSIC_FLAMINGO, each with the hparams clip.cpp sets (16 kHz, hop 160; n_mel is the file's
`clip.audio.num_mel_bins`). Only the FFT differs: numpy's in float64 for mtmd's float32
radix-2 one. This module knows nothing of models, tokens or requests; torch is not used."""

from __future__ import annotations

import io
import math
from functools import lru_cache

import numpy as np
import soundfile as sf

from .errors import AudioError

MAX_AUDIO_BYTES = 25 << 20  # an encoded file: OpenAI's transcription limit
MAX_AUDIO_SECONDS = 600.0  # ten minutes once decoded (20 Gemma 4 chunks, ~15k audio tokens)
SAMPLE_RATE = 16000  # every feature extractor here (clip.cpp's audio_sample_rate)
HOP = 160  # 10 ms
CHUNK_SECONDS = 30  # both preprocessors cut audio into 30 s pieces

# soundfile's container names, and the names a client may give them
CONTAINERS = {"WAV": "wav", "WAVEX": "wav", "FLAC": "flac", "MP3": "mp3", "OGG": "ogg"}
FORMAT_NAMES = {"wav": "wav", "wave": "wav", "x-wav": "wav", "mp3": "mp3", "mpeg": "mp3", "mpga": "mp3",
                "flac": "flac", "ogg": "ogg", "oga": "ogg", "opus": "ogg"}

GEMMA4_N_FFT, GEMMA4_WINDOW, GEMMA4_FLOOR = 512, 320, 0.001
WHISPER_N_FFT, WHISPER_FRAMES = 400, 3000
WHISPER_FLOOR = 5.960464477539063e-08  # filter_params' default mel floor (2^-24); transformers clips at 1e-10
SLANEY_LOG_STEP = math.log(6.4) / 27.0  # Slaney's mel scale above 1 kHz (librosa's default)


# --- decoding ---------------------------------------------------------------------

def _named_format(fmt: str) -> str:
    name = FORMAT_NAMES.get(fmt.lower().removeprefix("audio/"))
    if name is None:
        raise AudioError(f"audio format {fmt!r} is not supported; expected one of wav, mp3, flac, ogg")
    return name


def _info(data: bytes, max_bytes: int, fmt: str | None):
    """soundfile's header reading, within the size limit and of the format the client named."""
    if not data:
        raise AudioError("the audio is empty (0 bytes)")
    if len(data) > max_bytes:
        raise AudioError(f"the audio is {len(data)} bytes; the limit is {max_bytes} bytes")
    try:
        info = sf.info(io.BytesIO(data))
    except (sf.SoundFileError, RuntimeError, TypeError) as e:
        reason = getattr(e, "error_string", None) or str(e)
        raise AudioError(f"the audio does not decode as WAV, MP3, FLAC or OGG ({reason})") from None
    container = CONTAINERS.get(info.format)
    if container is None:
        raise AudioError(f"the audio is {info.format} ({info.format_info}); expected WAV, MP3, FLAC or OGG")
    if fmt is not None and _named_format(fmt) != container:
        raise AudioError(f"the audio's format is given as {fmt!r}, but its bytes are {container}")
    if info.samplerate <= 0 or info.channels <= 0:
        raise AudioError(f"the audio's header says {info.samplerate} Hz, {info.channels} channels")
    return info, container


def audio_header(data: bytes, max_bytes: int = MAX_AUDIO_BYTES, max_seconds: float = MAX_AUDIO_SECONDS,
                 fmt: str | None = None) -> tuple[str, float, int, int]:
    """(format, seconds, sample_rate, channels) from the header alone, so that a server can
    count an audio's tokens (`resampled_length`, then `*_frames`) before decoding it;
    AudioError where `decode_audio` would fail on what the header shows."""
    info, container = _info(data, max_bytes, fmt)
    seconds = info.frames / info.samplerate
    if seconds > max_seconds:
        raise AudioError(f"the audio is {seconds:.1f} seconds; the limit is {max_seconds:g} seconds")
    return container, seconds, info.samplerate, info.channels


def decode_audio(data: bytes, sample_rate: int = SAMPLE_RATE, max_bytes: int = MAX_AUDIO_BYTES,
                 max_seconds: float = MAX_AUDIO_SECONDS, fmt: str | None = None) -> np.ndarray:
    """WAV, MP3, FLAC or OGG bytes as float32 mono samples at `sample_rate`, as mtmd's
    `decode_audio_from_buf` gives them (miniaudio's decoder set to f32, 1 channel, that rate).
    AudioError for bytes that do not decode, audio that is empty, over `max_bytes` (encoded)
    or `max_seconds` (decoded), or not the format `fmt` a client named ("wav", "mp3", ...)."""
    _, seconds, rate, _ = audio_header(data, max_bytes, max_seconds, fmt)
    try:
        pcm, _ = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except (sf.SoundFileError, RuntimeError) as e:
        raise AudioError(f"the audio does not decode ({getattr(e, 'error_string', None) or e})") from None
    if len(pcm) == 0:
        raise AudioError("the audio has no samples")
    if len(pcm) / rate > max_seconds:  # a header's frame count can be an estimate (MP3)
        raise AudioError(f"the audio is {len(pcm) / rate:.1f} seconds; the limit is {max_seconds:g} seconds")
    # miniaudio's N->1 channel converter: a float32 sum over the channels, divided by N
    mono = pcm[:, 0] if pcm.shape[1] == 1 else pcm.sum(axis=1, dtype=np.float32) / np.float32(pcm.shape[1])
    return resample(mono, rate, sample_rate)


def resampled_length(n: int, rate_in: int, rate_out: int) -> int:
    """The sample count `ma_decoder_get_length_in_pcm_frames` gives for n samples at rate_in
    read at rate_out (ma_calculate_frame_count_after_resampling, its arithmetic as written)."""
    if n == 0 or rate_in == rate_out:
        return n
    out = n * rate_out // rate_in
    needed = out * (rate_in % rate_out) + out * (rate_in // rate_out) // rate_out
    return out + 1 if needed <= n else out


@lru_cache(maxsize=16)
def _lowpass_response(rate_in: int, rate_out: int) -> np.ndarray:
    """The impulse response of miniaudio's resampler low-pass (ma_lpf, order 4: two biquads
    with q = 1/(2 cos((2i+1)π/8)), float32 coefficients) for the reduced rates, run until it
    has died away."""
    w = math.pi * min(rate_in, rate_out) / max(rate_in, rate_out)  # 2π·cutoff/rate, cutoff at min/2
    sections = []
    for i in range(2):
        q = 1 / (2 * math.cos((1 + 2 * i) * math.pi / 8))
        alpha = math.sin(w) / (2 * q)
        a0 = 1 + alpha
        coef = ((1 - math.cos(w)) / 2, 1 - math.cos(w), (1 - math.cos(w)) / 2, -2 * math.cos(w), 1 - alpha)
        sections.append([float(np.float32(c / a0)) for c in coef] + [0.0, 0.0])
    h, x = [], 1.0
    for n in range(1 << 16):
        y = x
        for s in sections:  # direct form II transposed, as ma_biquad
            b0, b1, b2, a1, a2, r1, r2 = s
            x, y = y, b0 * y + r1
            s[5], s[6] = b1 * x - a1 * y + r2, b2 * x - a2 * y
        h.append(y)
        x = 0.0
        if n > 16 and abs(y) < 1e-12 and all(abs(s[5]) + abs(s[6]) < 1e-12 for s in sections):
            break
    return np.array(h)


def _filter(x: np.ndarray, h: np.ndarray) -> np.ndarray:
    """x convolved with h, cut to len(x): overlap-add FFTs in blocks (memory stays bounded)."""
    block = max(1 << 14, 1 << (len(h) - 1).bit_length())
    spectrum = np.fft.rfft(h, 2 * block)
    out = np.zeros(len(x) + 2 * block)
    for start in range(0, len(x), 64 * block):
        part = x[start:start + 64 * block].astype(np.float64)
        part = np.pad(part, (0, -len(part) % block)).reshape(-1, block)
        y = np.fft.irfft(np.fft.rfft(part, 2 * block) * spectrum, 2 * block)
        out[start:start + part.size] += y[:, :block].ravel()
        out[start + block:start + block + part.size] += y[:, block:].ravel()
    return out[:len(x)]


def resample(x: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """float32 mono samples at rate_out as miniaudio's linear resampler makes them, padded
    with zeros or cut to `resampled_length` as mtmd's buffer is. Output k interpolates at
    input position k·in/out - 1 (the resampler starts with a zero sample loaded)."""
    x = np.asarray(x, dtype=np.float32)
    if rate_in == rate_out:
        return x
    g = math.gcd(rate_in, rate_out)
    a, b = rate_in // g, rate_out // g
    h = _lowpass_response(a, b)
    if a > b:  # downsampling: every input sample goes through the low-pass first
        x = _filter(x, h).astype(np.float32)
    k = np.arange(-(-len(x) * b // a), dtype=np.int64)  # outputs whose input is all loaded
    i, frac = np.divmod(k * a, b)
    src = np.concatenate([np.zeros(1, np.float32), x])  # src[i] = x[i-1], x[-1] = 0
    x0, x1 = src[i], src[i + 1]
    y = x0 + (x1 - x0) * (frac.astype(np.float32) / np.float32(b))
    if a < b:  # upsampling: the low-pass runs on the interpolated output
        y = _filter(y, h).astype(np.float32)
    n = resampled_length(len(x), rate_in, rate_out)
    return np.pad(y[:n], (0, max(0, n - len(y))))


# --- log-mel features -----------------------------------------------------------------

def _hz_to_mel(f: np.ndarray, htk: bool) -> np.ndarray:
    if htk:
        return 2595.0 * np.log10(1.0 + f / 700.0)
    return np.where(f < 1000.0, f * 3 / 200, 15.0 + np.log(np.maximum(f, 1000.0) / 1000.0) / SLANEY_LOG_STEP)


def _mel_to_hz(m: np.ndarray, htk: bool) -> np.ndarray:
    if htk:
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)
    return np.where(m < 15.0, m * 200 / 3, 1000.0 * np.exp((m - 15.0) * SLANEY_LOG_STEP))


@lru_cache(maxsize=8)
def _mel_filters(n_mel: int, n_fft: int, htk: bool) -> np.ndarray:
    """(n_fft/2+1, n_mel) float32 triangles, as mtmd_audio_cache::fill_mel_filterbank_matrix
    builds them from 0 to 8 kHz: HTK's mel without area norm, or Slaney's with it."""
    edges = np.linspace(_hz_to_mel(np.float64(0.0), htk), _hz_to_mel(np.float64(SAMPLE_RATE / 2), htk), n_mel + 2)
    hz = _mel_to_hz(edges, htk)
    left, center, right = hz[:-2, None], hz[1:-1, None], hz[2:, None]
    f = np.arange(n_fft // 2 + 1) * (SAMPLE_RATE / n_fft)
    rise = (f - left) / np.maximum(center - left, 1e-30)
    fall = (right - f) / np.maximum(right - center, 1e-30)
    w = np.where((f >= left) & (f <= center), rise, np.where((f > center) & (f <= right), fall, 0.0))
    if not htk:
        w *= 2.0 / np.maximum(right - left, 1e-30)
    return w.T.astype(np.float32)


def _hann(length: int) -> np.ndarray:
    """mtmd's periodic Hann window: 0.5 - 0.5·cos(2πi/length), in float32."""
    return (0.5 - 0.5 * np.cos((2 * np.pi * np.arange(length) / length).astype(np.float32))).astype(np.float32)


def _mel_frames(padded: np.ndarray, n_frames: int, window: np.ndarray, n_fft: int, n_mel: int,
                magnitude: bool, htk: bool) -> np.ndarray:
    """mtmd's log_mel_spectrogram worker before its log: frame i is padded[i·hop:] times the
    window, zero-filled to n_fft; |X| or |X|² in float32; its mel sums (float64). (n_frames, n_mel)."""
    filters = _mel_filters(n_mel, n_fft, htk).astype(np.float64)
    out = np.empty((n_frames, n_mel))
    for start in range(0, n_frames, 4096):  # bounded memory for long audio
        stop = min(n_frames, start + 4096)
        idx = np.arange(start, stop)[:, None] * HOP + np.arange(len(window))
        spec = np.fft.rfft(padded[idx] * window, n_fft)
        power = (spec.real ** 2 + spec.imag ** 2).astype(np.float32)
        out[start:stop] = (np.sqrt(power) if magnitude else power) @ filters
    return out


def _chunks(n_samples: int) -> list[int]:
    size = CHUNK_SECONDS * SAMPLE_RATE
    return [min(size, n_samples - off) for off in range(0, n_samples, size)]


def _gemma4_chunk_frames(n: int) -> int:
    """The frames mtmd keeps of a chunk of n samples: transformers' unfold count over the
    semicausally padded chunk, (n + 160 - 321)/160 + 1 in C's truncating division."""
    return int((n + GEMMA4_WINDOW // 2 - (GEMMA4_WINDOW + 1)) / HOP) + 1


def gemma4_frames(n_samples: int) -> list[int]:
    """Mel frames per 30 s chunk mtmd_audio_preprocessor_gemma4a makes of n 16 kHz samples.
    A last chunk of one sample has none (mtmd fails on it; here it is dropped)."""
    return [f for f in map(_gemma4_chunk_frames, _chunks(n_samples)) if f > 0]


def gemma4_log_mel(samples: np.ndarray, n_mel: int) -> list[np.ndarray]:
    """mtmd_audio_preprocessor_gemma4a: per 30 s chunk, 160 zeros before it (semicausal) and
    zeros after it up to the last frame; a periodic Hann of 320 at the start of each 512-point
    frame; |X| through HTK mel filters (no area norm); ln(max(mel, 0.001)). One (frames, n_mel)
    float32 array per chunk. transformers' Gemma4AudioFeatureExtractor takes ln(mel + 0.001)
    instead, and pads to a multiple of 128 samples, masking the frames past the audio."""
    samples = np.asarray(samples, dtype=np.float32)
    if len(samples) == 0:
        raise AudioError("the audio has no samples")
    window = np.zeros(GEMMA4_N_FFT, np.float32)
    window[:GEMMA4_WINDOW] = _hann(GEMMA4_WINDOW)
    out, size = [], CHUNK_SECONDS * SAMPLE_RATE
    for off in range(0, len(samples), size):
        chunk = samples[off:off + size]
        frames = _gemma4_chunk_frames(len(chunk))
        if frames <= 0:
            continue
        padded = np.zeros(max((frames - 1) * HOP + GEMMA4_N_FFT, len(chunk) + GEMMA4_WINDOW // 2), np.float32)
        padded[GEMMA4_WINDOW // 2:GEMMA4_WINDOW // 2 + len(chunk)] = chunk
        mel = _mel_frames(padded, frames, window, GEMMA4_N_FFT, n_mel, magnitude=True, htk=True)
        out.append(np.log(np.maximum(mel, GEMMA4_FLOOR)).astype(np.float32))
    if not out:
        raise AudioError(f"the audio is {len(samples)} samples; too short for a mel frame")
    return out


def whisper_frames(n_samples: int) -> list[int]:
    """Mel frames per chunk mtmd_audio_preprocessor_whisper makes of n 16 kHz samples: 3000
    for each whole chunk of the mel over the audio plus 30 s of silence (so exactly 30 s
    gives two chunks, the second silent)."""
    n_len = (max(n_samples, WHISPER_N_FFT // 2 + 1) + CHUNK_SECONDS * SAMPLE_RATE) // HOP + 1
    return [WHISPER_FRAMES] * (n_len // WHISPER_FRAMES)


def whisper_log_mel(samples: np.ndarray, n_mel: int) -> list[np.ndarray]:
    """mtmd_audio_preprocessor_whisper: audio shorter than 201 samples zero-filled to 201;
    200 samples reflected before it, 30 s and 200 samples of zeros after; a periodic Hann of
    400, |X|² through Slaney mel filters (area-normed); log10(max(mel, 2^-24)); every value
    clamped to (the maximum over all chunks) - 8, then (x + 4) / 4; cut into 3000-frame
    chunks, an incomplete last one dropped. One (3000, n_mel) float32 array per chunk.
    transformers' WhisperFeatureExtractor floors at 1e-10 rather than 2^-24 (the same
    after the clamp unless the loudest mel is under 10^0.78), pads to 30 s rather than by
    30 s, reflects at the end, and truncates to one chunk."""
    samples = np.asarray(samples, dtype=np.float32)
    if len(samples) == 0:
        raise AudioError("the audio has no samples")
    half = WHISPER_N_FFT // 2
    samples = np.pad(samples, (0, max(0, half + 1 - len(samples))))
    silence = np.zeros(CHUNK_SECONDS * SAMPLE_RATE + half, np.float32)
    padded = np.concatenate([samples[1:half + 1][::-1], samples, silence])
    n_len = (len(padded) - WHISPER_N_FFT) // HOP + 1
    mel = _mel_frames(padded, n_len, _hann(WHISPER_N_FFT), WHISPER_N_FFT, n_mel, magnitude=False, htk=False)
    mel = np.log10(np.maximum(mel, WHISPER_FLOOR)).astype(np.float32).astype(np.float64)
    mel = ((np.maximum(mel, mel.max() - 8.0) + 4.0) / 4.0).astype(np.float32)
    return [mel[i:i + WHISPER_FRAMES] for i in range(0, n_len - WHISPER_FRAMES + 1, WHISPER_FRAMES)]
