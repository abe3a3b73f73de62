"""Gemma 4's audio tower (a Conformer) and embedder, as llama.cpp's converter writes
them into the model's mmproj beside the vision tower (`clip.audio.projector_type`
"gemma4a", conversion/gemma.py Gemma4VisionAudioModel), run as mtmd runs them
(tools/mtmd/models/gemma4a.cpp):

- log-mel features (engine.sound.gemma4_log_mel: 20 ms frames every 10 ms, 30-second
  chunks), each chunk on its own through the tower;
- subsampling: two 3x3 convolutions of stride 2 over (time, frequency), each with a
  LayerNorm over its channels and a ReLU, the channels and frequencies flattened and
  projected to the tower's width (a quarter of the frames: 40 ms a token);
- Conformer layers: half a SiLU feed-forward, chunked local self-attention (chunks of
  12 frames seeing themselves and the 12 before, causally: each frame the 11 before it;
  relative positions as Transformer-XL's sinusoids through `attn_k_rel`, shifted
  blockwise; scores capped by 50 tanh), a convolution module (GLU, a causal depthwise
  convolution of 5, RMS norm, SiLU), the other half feed-forward, an RMS norm;
- the output projection, an RMS norm (times `mm.a.soft_emb_norm` where present) and the
  projection to the text model's width. Matrices may carry clamps (Gemma4ClippableLinear).

In the text model a clip is `<|audio>`, its tokens, `<audio|>`, and its tokens attend
causally (llama.cpp decodes audio causally)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..sound import gemma4_frames, gemma4_log_mel
from .audio import SAMPLE_RATE, AudioParams, AudioPlan, rms
from .gemma4_vision import Clamped
from .params import Metadata

PROJECTOR = "gemma4a"
KIND = "audio"
TEXT_ARCHITECTURES = ("gemma4",)
TEMPLATE_MARK = "<|audio|>"  # what Gemma 4's chat template writes for an audio part
AUDIO_TOKEN = "<|audio|>"
BIDIRECTIONAL = False
MROPE = False
EPS = 1e-6  # every norm of the tower (llama.cpp ignores the file's epsilon, written wrong by early converters)
CHUNK, PAST = 12, 12  # local attention: frames a chunk, frames before it each chunk sees
SOFTCAP = 50.0
RESIDUAL = 0.5  # the feed-forward halves' weight


def expand(n_tokens: int) -> str:
    return f"<|audio>{AUDIO_TOKEN * n_tokens}<audio|>"


def subsampled(frames: int) -> int:
    """Tokens of a chunk of `frames` feature frames (two stride-2 convolutions, padding 1)."""
    for _ in range(2):
        frames = (frames - 1) // 2 + 1
    return frames


@dataclass
class Params(AudioParams):
    @staticmethod
    def read(m: Metadata, c: dict) -> dict:
        return dict(eps=EPS)


def relative_positions(width: int) -> torch.Tensor:
    """(PAST + 1, width) sinusoids of the distances PAST .. 0 (sines then cosines)."""
    half = width // 2
    inc = math.log(10000.0) / max(half - 1, 1)
    inv = torch.exp(-torch.arange(half, dtype=torch.float32) * inc)
    pos = torch.arange(PAST, -1, -1, dtype=torch.float32)[:, None] * inv
    return torch.cat([pos.sin(), pos.cos()], dim=-1)


def block_mask(n: int) -> torch.Tensor:
    """(blocks, CHUNK, CHUNK + PAST) additive mask: query b*C+q sees key b*C-P+k when
    that key exists, is not after it and is fewer than PAST before it."""
    blocks = (n + CHUNK - 1) // CHUNK
    gq = (torch.arange(blocks)[:, None] * CHUNK + torch.arange(CHUNK)[None, :])[:, :, None]
    gk = (torch.arange(blocks)[:, None] * CHUNK - PAST + torch.arange(CHUNK + PAST)[None, :])[:, None, :]
    ok = (gq < n) & (gk >= 0) & (gk < n) & (gk <= gq) & (gq - gk < PAST)
    return torch.where(ok, 0.0, -1e9)


class Layer:
    def __init__(self, w, i: int, p: Params):
        b, h = f"a.blk.{i}.", p.hidden
        opt = lambda n: w.vector(b + n) if w.has(b + n) else None  # noqa: E731
        self.ffn = [(w.vector(b + f"ffn_norm{s}.weight", h), Clamped(w, b + f"ffn_up{s}", p.ffn, h),
                     Clamped(w, b + f"ffn_down{s}", h, p.ffn), opt(f"ffn_post_norm{s}.weight")) for s in ("", "_1")]
        self.attn_norm = opt("attn_pre_norm.weight") if w.has(b + "attn_pre_norm.weight") else opt("ln1.weight")
        self.q, self.k, self.v = (Clamped(w, b + n, h, h) for n in ("attn_q", "attn_k", "attn_v"))
        self.o = Clamped(w, b + "attn_out", h, h)
        self.q_scale, self.k_scale = opt("per_dim_scale.weight"), opt("per_dim_k_scale.weight")
        self.k_rel = w.linear(b + "attn_k_rel.weight", h, h) if w.has(b + "attn_k_rel.weight") else None
        self.attn_post = opt("attn_post_norm.weight")
        # llama.cpp's names are swapped against the converter's: "conv_norm" comes before the module
        self.conv_pre, self.conv_post = opt("conv_norm.weight"), opt("norm_conv.weight")
        self.pw1, self.pw2 = Clamped(w, b + "conv_pw1", 2 * h, h), Clamped(w, b + "conv_pw2", h, h)
        dw = w.vector(b + "conv_dw.weight")
        self.dw = dw.reshape(h, 1, -1).float()
        self.dw_bias = opt("conv_dw.bias")
        self.out_norm = opt("ln2.weight")
        self.heads = p.n_heads

    def _half_ffn(self, x: torch.Tensor, which: int) -> torch.Tensor:
        norm, up, down, post = self.ffn[which]
        y = down(F.silu(up(rms(x, norm, EPS))))
        return x + RESIDUAL * rms(y, post, EPS) if post is not None else x + RESIDUAL * y

    def _attention(self, x: torch.Tensor, rel: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        n, width = x.shape
        hd, heads = width // self.heads, self.heads
        h = rms(x, self.attn_norm, EPS) if self.attn_norm is not None else x
        q = self.q(h).view(n, heads, hd) * ((1.0 / math.sqrt(hd)) / math.log(2.0))
        k = self.k(h).view(n, heads, hd) * (math.log(1.0 + math.e) / math.log(2.0))
        v = self.v(h).view(n, heads, hd)
        if self.q_scale is not None:
            q = q * self.q_scale
        if self.k_scale is not None:
            k = k * self.k_scale
        blocks = mask.shape[0]
        span = CHUNK + PAST
        qb = F.pad(q, (0, 0, 0, 0, 0, blocks * CHUNK - n)).view(blocks, CHUNK, heads, hd).permute(0, 2, 1, 3)
        kv = [F.pad(t, (0, 0, 0, 0, PAST, blocks * CHUNK - n)).unfold(0, span, CHUNK).permute(0, 1, 3, 2)
              for t in (k, v)]  # (blocks, heads, span, hd): each block's keys from PAST before it
        scores = qb @ kv[0].transpose(-1, -2)  # (blocks, heads, CHUNK, span)
        if self.k_rel is not None:
            p = self.k_rel(rel).view(PAST + 1, heads, hd).permute(1, 2, 0)  # (heads, hd, PAST + 1)
            bd = qb @ p  # (blocks, heads, CHUNK, PAST + 1)
            bd = F.pad(bd, (0, span + 1 - (PAST + 1))).reshape(blocks, heads, CHUNK * (span + 1))
            scores = scores + bd[..., :CHUNK * span].reshape(blocks, heads, CHUNK, span)  # Transformer-XL's shift
        scores = torch.tanh(scores / SOFTCAP) * SOFTCAP + mask[:, None]
        out = (scores.softmax(-1) @ kv[1]).permute(0, 2, 1, 3).reshape(blocks * CHUNK, width)[:n]
        out = self.o(out)
        return x + (rms(out, self.attn_post, EPS) if self.attn_post is not None else out)

    def _convolution(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pw1(rms(x, self.conv_pre, EPS) if self.conv_pre is not None else x)
        half = y.shape[1] // 2
        y = (y[:, :half] * torch.sigmoid(y[:, half:])).T[None]  # (1, width, frames)
        k = self.dw.shape[-1]
        y = F.conv1d(F.pad(y, (k - 1, 0)), self.dw, groups=self.dw.shape[0])[0].T  # causal, depthwise
        if self.dw_bias is not None:
            y = y + self.dw_bias
        if self.conv_post is not None:
            y = rms(y, self.conv_post, EPS)
        return x + self.pw2(F.silu(y))

    def __call__(self, x: torch.Tensor, rel: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self._half_ffn(x, 0)
        x = self._attention(x, rel, mask)
        x = self._convolution(x)
        x = self._half_ffn(x, 1)
        return rms(x, self.out_norm, EPS) if self.out_norm is not None else x


class Tower:
    """audio samples -> (tokens, text width) embeddings."""

    def __init__(self, p: Params, w):
        self.p = p
        self.convs = []
        for i in range(2):
            b = f"a.conv1d.{i}."
            weight = w.dense(b + "weight", tuple(w.info(b + "weight").shape)).float()
            self.convs.append((weight, w.vector(b + "bias") if w.has(b + "bias") else None,
                               w.vector(b + "norm.weight") if w.has(b + "norm.weight") else None))
        channels = self.convs[1][0].shape[0]
        freq = subsampled(p.n_mel)
        self.inp = w.linear("a.input_projection.weight", p.hidden, channels * freq, bias="a.input_projection.bias")
        self.layers = [Layer(w, i, p) for i in range(p.n_layers)]
        out_width = w.info("a.pre_encode.out.weight").shape[0] if w.has("a.pre_encode.out.weight") else p.hidden
        self.out = (w.linear("a.pre_encode.out.weight", out_width, p.hidden, bias="a.pre_encode.out.bias")
                    if w.has("a.pre_encode.out.weight") else None)
        self.soft_norm = w.vector("mm.a.soft_emb_norm.weight") if w.has("mm.a.soft_emb_norm.weight") else None
        self.proj = Clamped(w, "mm.a.input_projection", p.projection_dim, out_width)
        self.rel = relative_positions(p.hidden)

    def n_tokens(self, n_samples: int) -> int:
        return sum(subsampled(f) for f in gemma4_frames(n_samples))

    def plan(self, samples: np.ndarray) -> AudioPlan:
        mels = gemma4_log_mel(samples, self.p.n_mel)
        chunks = [torch.from_numpy(np.ascontiguousarray(c, dtype=np.float32)) for c in mels]
        return AudioPlan(chunks, sum(subsampled(c.shape[0]) for c in chunks), seconds=len(samples) / SAMPLE_RATE)

    def _subsample(self, mel: torch.Tensor) -> torch.Tensor:
        x = mel[None, None]  # (1, 1, frames, mel bins)
        for weight, bias, norm in self.convs:
            x = F.conv2d(x, weight, bias, stride=2, padding=1)
            if norm is not None:
                x = F.layer_norm(x.permute(0, 2, 3, 1), (x.shape[1],), norm, None, EPS).permute(0, 3, 1, 2)
            x = F.relu(x)
        frames = x.shape[2]
        return self.inp(x[0].permute(1, 2, 0).reshape(frames, -1))  # (frames, freq * channels), channels fastest

    def encode_steps(self, plan: AudioPlan):
        outs = []
        for mel in plan.chunks:
            x = self._subsample(mel)
            mask = block_mask(x.shape[0])
            yield None
            for layer in self.layers:
                x = layer(x, self.rel, mask)
                yield None
            if self.out is not None:
                x = self.out(x)
            outs.append(self.proj(rms(x, self.soft_norm, EPS)))
        yield torch.cat(outs)


def build(p: Params, w) -> Tower:
    return Tower(p, w)
