"""phi3: fused qkv and gate/up projections (llama.cpp keeps them fused too)."""

from __future__ import annotations

from ...gguf_io import Keys
from .base import Architecture, Config


class Phi3(Architecture):
    name = "phi3"

    def config(self):
        if "rope_factors_long.weight" in self.reader.tensors:
            raise NotImplementedError(f"{self.reader.path}: phi3 with LongRoPE factors is not supported yet")
        cfg = self.common_config()
        rope_dims = self.get(Keys.ROPE_DIMENSION_COUNT, cfg["head_dim"])
        cfg["rope_parameters"]["partial_rotary_factor"] = rope_dims / cfg["head_dim"]
        return Config(**cfg, sliding_window=self.get(Keys.SLIDING_WINDOW, None))
