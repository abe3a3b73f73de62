"""qwen3: qwen2 without biases, with RMS norms on q and k per head."""

from __future__ import annotations

from transformers import Qwen3Config, Qwen3ForCausalLM

from .base import LLAMA_LAYER_NAMES, QK_NORM_NAMES, Architecture

QWEN3_LAYER_NAMES = {**LLAMA_LAYER_NAMES, **QK_NORM_NAMES}


class Qwen3(Architecture):
    name = "qwen3"
    model_class = Qwen3ForCausalLM
    layer_names = QWEN3_LAYER_NAMES
    chat_template_fallback = "chatml"

    def config(self):
        has_bias = "blk.0.attn_q.bias" in self.reader.tensors
        return Qwen3Config(**self.common_config(), attention_bias=has_bias, use_sliding_window=False)
