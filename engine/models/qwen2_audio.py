"""Qwen2-Audio's audio tower (Whisper's encoder) and projector, as llama.cpp's converter
writes them (`clip.projector_type` "qwen2a", conversion/ultravox.py WhisperEncoderModel;
Qwen2.5-Omni's audio files are the same tower), run as mtmd runs them
(tools/mtmd/models/whisper-enc.cpp):

- Whisper's log-mel features (engine.sound.whisper_log_mel: 25 ms frames every 10 ms,
  30-second chunks of 3,000 frames, the clip padded with 30 s of silence, so a short clip
  is one whole chunk), each chunk on its own through the tower;
- two convolutions over time (kernel 3, the second of stride 2) with exact GELUs, learned
  positions, pre-norm layers (LayerNorms with biases, attention with biased queries and
  values, an exact-GELU MLP);
- the frames averaged two by two, a LayerNorm, and the projection to the text model's
  width: 750 tokens a chunk (40 ms a token).

In the text model a clip is `<|audio_bos|>`, its tokens, `<|audio_eos|>` (Qwen2-Audio's
template writes those three tokens for an audio part and the processor repeats the middle
one; a template that writes the middle one alone gets the same); its tokens attend causally."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..sound import whisper_frames, whisper_log_mel
from .audio import SAMPLE_RATE, AudioParams, AudioPlan

PROJECTOR = "qwen2a"
KIND = "audio"
TEXT_ARCHITECTURES = ("qwen2",)
# what a chat template writes for an audio part: Qwen2-Audio's own the three tokens, others its token alone
TEMPLATE_MARKS = ("<|audio_bos|><|AUDIO|><|audio_eos|>", "<|AUDIO|>")
TEMPLATE_MARK = TEMPLATE_MARKS[0]
AUDIO_TOKEN = "<|AUDIO|>"
BIDIRECTIONAL = False
MROPE = False


def expand(n_tokens: int) -> str:
    return f"<|audio_bos|>{AUDIO_TOKEN * n_tokens}<|audio_eos|>"


@dataclass
class Params(AudioParams):
    pass


def tokens_of(frames: int) -> int:
    """A chunk's tokens: halved by the strided convolution, then by the average pooling."""
    return frames // 2 // 2


class Layer:
    def __init__(self, w, i: int, p: Params):
        b, h = f"a.blk.{i}.", p.hidden
        lin = lambda n, o, k: w.linear(f"{b}{n}.weight", o, k, bias=f"{b}{n}.bias")  # noqa: E731
        self.ln1 = (w.vector(b + "ln1.weight", h), w.vector(b + "ln1.bias", h))
        self.ln2 = (w.vector(b + "ln2.weight", h), w.vector(b + "ln2.bias", h))
        self.q, self.k, self.v = lin("attn_q", h, h), lin("attn_k", h, h), lin("attn_v", h, h)
        self.o = lin("attn_out", h, h)
        self.up, self.down = lin("ffn_up", p.ffn, h), lin("ffn_down", h, p.ffn)
        self.heads, self.eps = p.n_heads, p.eps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        n, d = x.shape
        h = F.layer_norm(x, (d,), *self.ln1, self.eps)
        q, k, v = (m(h).view(n, self.heads, -1).transpose(0, 1)[None] for m in (self.q, self.k, self.v))
        x = x + self.o(F.scaled_dot_product_attention(q, k, v)[0].transpose(0, 1).reshape(n, d))
        h = F.layer_norm(x, (d,), *self.ln2, self.eps)
        return x + self.down(F.gelu(self.up(h)))


class Tower:
    """audio samples -> (tokens, text width) embeddings."""

    def __init__(self, p: Params, w):
        self.p = p
        self.convs = []
        for i in (1, 2):
            b = f"a.conv1d.{i}."
            weight = w.dense(b + "weight", tuple(w.info(b + "weight").shape)).float()
            self.convs.append((weight, w.vector(b + "bias").reshape(-1)))
        info = w.info("a.position_embd.weight")
        self.positions = w.dense("a.position_embd.weight", tuple(info.shape))  # (max positions, width): a view
        self.layers = [Layer(w, i, p) for i in range(p.n_layers)]
        self.post_ln = (w.vector("a.post_ln.weight", p.hidden), w.vector("a.post_ln.bias", p.hidden))
        self.proj = w.linear("mm.a.fc.weight", p.projection_dim, p.hidden, bias="mm.a.fc.bias")

    def n_tokens(self, n_samples: int) -> int:
        return sum(tokens_of(f) for f in whisper_frames(n_samples))

    def plan(self, samples: np.ndarray) -> AudioPlan:
        chunks = [torch.from_numpy(np.ascontiguousarray(c.T, dtype=np.float32))  # (mel bins, frames)
                  for c in whisper_log_mel(samples, self.p.n_mel)]
        return AudioPlan(chunks, sum(tokens_of(c.shape[1]) for c in chunks), seconds=len(samples) / SAMPLE_RATE)

    def encode_steps(self, plan: AudioPlan):
        p, outs = self.p, []
        for mel in plan.chunks:
            x = mel[None]
            for (weight, bias), stride in zip(self.convs, (1, 2)):
                x = F.gelu(F.conv1d(x, weight, bias, stride=stride, padding=weight.shape[-1] // 2))
            x = x[0].T  # (positions, width)
            if x.shape[0] > self.positions.shape[0]:
                raise ValueError(f"a chunk of {x.shape[0]} positions; the tower has {self.positions.shape[0]}")
            x = x + self.positions[:x.shape[0]].float()
            yield None
            for layer in self.layers:
                x = layer(x)
                yield None
            x = F.avg_pool1d(x.T[None], 2, 2)[0].T
            outs.append(self.proj(F.layer_norm(x, (p.hidden,), *self.post_ln, p.eps)))
        yield torch.cat(outs)


def build(p: Params, w) -> Tower:
    return Tower(p, w)
