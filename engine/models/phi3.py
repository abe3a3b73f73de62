"""phi3: llama's layers with fused qkv and gate/up projections (llama.cpp keeps them
fused too), NeoX rotary over `rope.dimension_count` dimensions, an optional sliding
window in every layer."""

from __future__ import annotations

from dataclasses import dataclass

from ...gguf_io import Keys
from . import llama
from .base import Metadata

ARCHITECTURE = "phi3"


@dataclass
class Params(llama.Params):
    @classmethod
    def from_gguf(cls, m: Metadata) -> "Params":
        if m.has_tensor("rope_factors_long.weight"):
            raise NotImplementedError(f"{m.path}: phi3 with LongRoPE factors is not supported yet")
        return cls(**cls.common(m), neox=True, fused=True, window=m.get(Keys.SLIDING_WINDOW, 0) or 0)


build = llama.build
