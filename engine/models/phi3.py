"""phi3: llama's layers with fused qkv and gate/up projections (llama.cpp keeps them
fused too), NeoX rotary over `rope.dimension_count` dimensions, an optional sliding
window in every layer."""

from __future__ import annotations

from ...gguf_io import Keys
from . import llama
from .params import Metadata

ARCHITECTURE = "phi3"


def read(m: Metadata, c: dict) -> dict:
    if m.has_tensor("rope_factors_long.weight"):
        raise NotImplementedError(f"{m.path}: phi3 with LongRoPE factors is not supported yet")
    return dict(window=m.get(Keys.SLIDING_WINDOW, 0) or 0)


Params = llama.Params.member(read, neox=True, fused=True)
build = llama.build
