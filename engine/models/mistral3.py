"""mistral3 (Ministral 3 and Mistral Small 3.x text models, as llama.cpp's converter
writes them: conversion/mistral3.py, a LlamaModel, so q/k rows permuted for GPT-J
pairing): llama's layers with YaRN rotary (`rope.scaling.*`, the cos/sin scale from
`yarn_log_multiplier`) and an attention temperature: past the original context, each
query is scaled by 1 + beta ln(1 + floor(position / original context)), beta the
file's `attention.temperature_scale` (the config's llama_4_scaling_beta), as
transformers' Ministral3Attention and llama.cpp's attn_temp input do. Rotary is linear
in q, so the scale is applied to the projected queries before it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...gguf_io import Keys
from ..modules import Weights
from . import llama
from .base import Metadata, Model, standard_model
from .layers import Rope

ARCHITECTURE = "mistral3"


@dataclass
class Params(llama.Params):
    temperature_scale: float = 0.0  # 0: no attention temperature
    temperature_length: int = 0  # positions per step of the temperature (the original context)

    @classmethod
    def from_gguf(cls, m: Metadata) -> "Params":
        c = cls.common(m)
        beta = float(m.get(Keys.ATTENTION_TEMPERATURE_SCALE, 0.0) or 0.0)
        length = c["rope_scaling"].original_context
        if beta and not length:
            raise ValueError(f"{m.path}: {Keys.arch(Keys.ATTENTION_TEMPERATURE_SCALE, m.arch)} needs "
                             f"{Keys.arch(Keys.ROPE_SCALING_ORIG_CTX, m.arch)} (the original context)")
        return cls(**c, temperature_scale=beta, temperature_length=length)


class TemperedAttention:
    """A layer's attention with its queries scaled by the temperature of their positions."""

    def __init__(self, attn, beta: float, length: int):
        self.attn, self.beta, self.length = attn, beta, length
        self.q_width = attn.spec.n_heads * attn.spec.head_dim

    def cache_spec(self):
        return self.attn.cache_spec()

    def temperature(self, batch) -> torch.Tensor | None:
        """(T, 1) query scales for the batch's positions, once per forward; None while
        every position is inside the original context (all scales 1)."""
        key = ("attn_temp", self.beta, self.length)
        if key not in batch.memo:
            steps = torch.div(batch.positions, self.length, rounding_mode="floor")
            batch.memo[key] = (1.0 + self.beta * torch.log1p(steps.float()))[:, None] if bool(steps.any()) else None
        return batch.memo[key]

    def __call__(self, x, batch, cache):
        a = self.attn
        qkv = a.qkv(x)
        if (scale := self.temperature(batch)) is not None:
            qkv[:, :self.q_width] *= scale.to(qkv.device, qkv.dtype)
        return a.o(a.ops.self_attention(qkv, a.spec, batch, cache))


def layer(w: Weights, i: int, p: Params, rope: Rope, ops) -> llama.LlamaLayer:
    out = llama.LlamaLayer(w, i, p, rope, ops)
    if p.temperature_scale:
        out.attn = TemperedAttention(out.attn, p.temperature_scale, p.temperature_length)
    return out


def build(p: Params, w: Weights, ops) -> Model:
    r = llama.rope(p, w)
    return standard_model(ops, w, p, [layer(w, i, p, r, ops) for i in range(p.n_layers)])
