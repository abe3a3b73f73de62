"""What the audio towers share: the file's clip.audio.* keys (`AudioParams`), a clip of
audio made ready for a tower (`AudioPlan`: its log-mel chunks as the family's feature
extractor makes them, engine.sound), and an RMS norm as llama.cpp's towers take it.

An audio family's file is like a vision family's (`PROJECTOR`, `TEXT_ARCHITECTURES`,
`Params`, `build`) with `KIND = "audio"`, `AUDIO_TOKEN` and `TEMPLATE_MARK` (what the
chat template writes for an audio part), `expand(n)` (the text the mark becomes), and a
tower with `n_tokens(n_samples)`, `plan(samples)` and `encode_steps(plan)`."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...gguf_io import Keys
from .params import FileParams, Metadata

SAMPLE_RATE = 16000  # every audio tower here takes 16 kHz mono


@dataclass
class AudioParams(FileParams):
    hidden: int
    ffn: int
    n_layers: int
    n_heads: int
    eps: float
    projection_dim: int  # the text model's width
    n_mel: int

    @staticmethod
    def read(m: Metadata, c: dict) -> dict:
        return dict(hidden=m.get(Keys.AUDIO_EMBEDDING_LENGTH), ffn=m.get(Keys.AUDIO_FEED_FORWARD_LENGTH),
                    n_layers=m.get(Keys.AUDIO_BLOCK_COUNT), n_heads=m.get(Keys.AUDIO_HEAD_COUNT),
                    eps=float(m.get(Keys.AUDIO_LAYERNORM_EPS, 1e-5)), projection_dim=m.get(Keys.AUDIO_PROJECTION_DIM),
                    n_mel=m.get(Keys.AUDIO_NUM_MEL_BINS))


@dataclass
class AudioPlan:
    """A clip as a tower takes it: one (frames, mel bins) float32 tensor per chunk the
    family's extractor cuts, and how many tokens it becomes in the text model."""

    chunks: list[torch.Tensor]
    n_tokens: int
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)


def rms(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * weight if weight is not None else y
