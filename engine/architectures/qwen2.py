"""qwen2: llama layout with q/k/v biases, NeoX rotary."""

from __future__ import annotations

from transformers import Qwen2Config

from .base import Architecture


class Qwen2(Architecture):
    name = "qwen2"
    chat_template_fallback = "chatml"

    def config(self):
        return Qwen2Config(**self.common_config(), use_sliding_window=False)
