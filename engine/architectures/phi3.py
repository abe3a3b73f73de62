"""phi3: fused qkv and gate/up projections (llama.cpp keeps them fused too)."""

from __future__ import annotations

from transformers import Phi3Config, Phi3ForCausalLM

from ...gguf_io import Keys
from .base import Architecture

PHI3_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


class Phi3(Architecture):
    name = "phi3"
    model_class = Phi3ForCausalLM
    layer_names = PHI3_LAYER_NAMES

    def config(self):
        if "rope_factors_long.weight" in self.reader.tensors:
            raise NotImplementedError(f"{self.reader.path}: phi3 with LongRoPE factors is not supported yet")
        cfg = self.common_config()
        rope_dims = self.get(Keys.ROPE_DIMENSION_COUNT, cfg["head_dim"])
        cfg["rope_parameters"]["partial_rotary_factor"] = rope_dims / cfg["head_dim"]
        return Phi3Config(**cfg, sliding_window=self.get(Keys.SLIDING_WINDOW, None))
