"""qwen2: llama layout with q/k/v biases, NeoX rotary."""

from __future__ import annotations

from .base import Architecture, Config


class Qwen2(Architecture):
    name = "qwen2"
    chat_template_fallback = "chatml"

    def config(self):
        return Config(**self.common_config(), use_sliding_window=False)
