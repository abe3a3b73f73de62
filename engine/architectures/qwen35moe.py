"""qwen35moe (Qwen3.5 MoE): qwen35's hybrid attention with routed experts plus a
gated shared expert in every layer."""

from __future__ import annotations

from ...gguf_io import Keys
from .base import Config
from .qwen35 import Qwen35


class Qwen35Moe(Qwen35):
    name = "qwen35moe"

    def config(self):
        cfg = self.base_config()
        n_ff = self.get(Keys.EXPERT_FEED_FORWARD_LENGTH)
        return Config(
            **cfg,
            num_experts=self.get(Keys.EXPERT_COUNT),
            num_experts_per_tok=self.get(Keys.EXPERT_USED_COUNT),
            moe_intermediate_size=n_ff,
            shared_expert_intermediate_size=self.get(Keys.EXPERT_SHARED_FEED_FORWARD_LENGTH, n_ff),
        )
