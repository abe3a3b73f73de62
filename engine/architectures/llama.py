"""llama (also Mistral files, which llama.cpp writes as `llama`)."""

from __future__ import annotations

from .base import Architecture, Config


class Llama(Architecture):
    name = "llama"

    def config(self):
        has_bias = "blk.0.attn_q.bias" in self.reader.tensors
        return Config(**self.common_config(), attention_bias=has_bias, mlp_bias=False)
