"""qwen3moe: qwen3 attention with a routed mixture of experts in every layer. The
router (ffn_gate_inp) stays dense; experts stay packed as 3-D tensors."""

from __future__ import annotations

from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from ...gguf_io import Keys
from .qwen3 import QWEN3_LAYER_NAMES, Qwen3

QWEN3MOE_LAYER_NAMES = {**QWEN3_LAYER_NAMES, "mlp.gate.weight": "ffn_gate_inp.weight"}


class Qwen3Moe(Qwen3):
    name = "qwen3moe"
    model_class = Qwen3MoeForCausalLM
    layer_names = QWEN3MOE_LAYER_NAMES

    def config(self):
        cfg = self.common_config()
        n_expert_ff = self.get(Keys.EXPERT_FEED_FORWARD_LENGTH)
        cfg["intermediate_size"] = cfg["intermediate_size"] or n_expert_ff
        return Qwen3MoeConfig(
            **cfg,
            num_experts=self.get(Keys.EXPERT_COUNT),
            num_experts_per_tok=self.get(Keys.EXPERT_USED_COUNT),
            moe_intermediate_size=n_expert_ff,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            attention_bias="blk.0.attn_q.bias" in self.reader.tensors,
        )
