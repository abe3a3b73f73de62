"""smollm3: llama's layers, and every fourth layer has no rotary (NoPE): it attends by
content alone. llama.cpp fixes the step at 4 (`n_no_rope_layer_step`); the file
states nothing about it. The converter permutes q/k as for llama (GPT-J pairing)."""

from __future__ import annotations

from dataclasses import dataclass

from ..modules import Weights
from . import llama
from .base import Metadata, Model, standard_model
from .layers import Rope

ARCHITECTURE = "smollm3"
NO_ROPE_LAYER_STEP = 4


@dataclass
class Params(llama.Params):
    no_rope_step: int = NO_ROPE_LAYER_STEP  # layers i with (i + 1) % step == 0 have no rotary

    @classmethod
    def from_gguf(cls, m: Metadata) -> "Params":
        return cls(**cls.common(m))


def build(p: Params, w: Weights, ops) -> Model:
    rope, none = llama.rope(p, w), Rope.none()
    layers = [llama.LlamaLayer(w, i, p, none if (i + 1) % p.no_rope_step == 0 else rope, ops)
              for i in range(p.n_layers)]
    return standard_model(ops, w, p, layers)
