"""qwen3: qwen2 without biases, with RMS norms on q and k per head."""

from __future__ import annotations

from .base import Architecture, Config


class Qwen3(Architecture):
    name = "qwen3"
    chat_template_fallback = "chatml"

    def config(self):
        has_bias = "blk.0.attn_q.bias" in self.reader.tensors
        return Config(**self.common_config(), attention_bias=has_bias, use_sliding_window=False)
