"""qwen3moe: qwen3 attention with a routed mixture of experts in every layer."""

from __future__ import annotations

from ...gguf_io import Keys
from .base import Config
from .qwen3 import Qwen3


class Qwen3Moe(Qwen3):
    name = "qwen3moe"

    def config(self):
        cfg = self.common_config()
        n_expert_ff = self.get(Keys.EXPERT_FEED_FORWARD_LENGTH)
        cfg["intermediate_size"] = cfg["intermediate_size"] or n_expert_ff
        return Config(
            **cfg,
            num_experts=self.get(Keys.EXPERT_COUNT),
            num_experts_per_tok=self.get(Keys.EXPERT_USED_COUNT),
            moe_intermediate_size=n_expert_ff,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            attention_bias="blk.0.attn_q.bias" in self.reader.tensors,
        )
