"""qwen2: llama layout with q/k/v biases, no head permutation (NeoX rotary)."""

from __future__ import annotations

from transformers import Qwen2Config, Qwen2ForCausalLM

from .base import Architecture


class Qwen2(Architecture):
    name = "qwen2"
    model_class = Qwen2ForCausalLM
    chat_template_fallback = "chatml"

    def config(self):
        return Qwen2Config(**self.common_config(), use_sliding_window=False)
