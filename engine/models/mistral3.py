"""mistral3 (Ministral 3 and Mistral Small 3.x text models, as llama.cpp's converter
writes them: conversion/mistral3.py, a LlamaModel, so q/k rows permuted for GPT-J
pairing): llama's layers with YaRN rotary (`rope.scaling.*`, the cos/sin scale from
`yarn_log_multiplier`) and an attention temperature: past the original context, each
query is scaled by 1 + beta ln(1 + floor(position / original context)), beta the
file's `attention.temperature_scale` (the config's llama_4_scaling_beta), as
transformers' Ministral3Attention and llama.cpp's attn_temp input do (Attention's
`temperature`)."""

from __future__ import annotations

from ...gguf_io import Keys
from . import llama
from .params import Metadata

ARCHITECTURE = "mistral3"


def read(m: Metadata, c: dict) -> dict:
    beta = float(m.get(Keys.ATTENTION_TEMPERATURE_SCALE, 0.0) or 0.0)
    length = c["rope_scaling"].original_context
    if beta and not length:
        raise ValueError(f"{m.path}: {m.key(Keys.ATTENTION_TEMPERATURE_SCALE)} needs "
                         f"{m.key(Keys.ROPE_SCALING_ORIG_CTX)} (the original context)")
    return dict(temperature_scale=beta, temperature_length=length)


Params = llama.Params.member(read)
build = llama.build
