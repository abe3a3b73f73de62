"""smollm3: llama's layers, and every fourth layer has no rotary (NoPE): it attends by
content alone. llama.cpp fixes the step at 4 (`n_no_rope_layer_step`); the file
states nothing about it. The converter permutes q/k as for llama (GPT-J pairing)."""

from __future__ import annotations

from . import llama

ARCHITECTURE = "smollm3"
NO_ROPE_LAYER_STEP = 4

Params = llama.Params.member(no_rope_every=NO_ROPE_LAYER_STEP)
build = llama.build
