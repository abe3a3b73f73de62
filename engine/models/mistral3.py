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


class Mistral3Layer(llama.LlamaLayer):
    def __init__(self, w: Weights, i: int, p: Params, rope: Rope, ops):
        super().__init__(w, i, p, rope, ops)
        self.beta, self.length = p.temperature_scale, p.temperature_length
        self.q_width = p.n_heads * p.head_dim

    def temperature(self, batch) -> torch.Tensor | None:
        """(T, 1) query scales for the batch's positions, once per forward; None while
        every position is inside the original context (all scales 1)."""
        key = ("attn_temp", self.beta, self.length)
        if key not in batch.memo:
            steps = torch.div(batch.positions, self.length, rounding_mode="floor")
            batch.memo[key] = (1.0 + self.beta * torch.log1p(steps.float()))[:, None] if bool(steps.any()) else None
        return batch.memo[key]

    def attention(self, x, batch, cache):
        qkv = self.attn.qkv(x)
        if self.beta and (scale := self.temperature(batch)) is not None:
            qkv[:, :self.q_width] *= scale.to(qkv.device, qkv.dtype)
        return self.attn.o(self.ops.self_attention(qkv, self.attn.spec, batch, cache))

    def __call__(self, x, batch, cache):
        h = x + self.attention(self.ops.rms_norm(x, self.attn_norm, self.eps), batch, cache)
        return h + self.mlp(self.ops.rms_norm(h, self.ffn_norm, self.eps))


def build(p: Params, w: Weights, ops) -> Model:
    r = llama.rope(p, w)
    return standard_model(ops, w, p, [Mistral3Layer(w, i, p, r, ops) for i in range(p.n_layers)])
