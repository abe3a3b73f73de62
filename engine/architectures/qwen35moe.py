"""qwen35moe (Qwen3.5 MoE): qwen35's hybrid attention with routed experts plus a
gated shared expert in every layer. Experts arrive fused (ffn_gate_up_exps) or as
separate gate and up tensors; both stay packed."""

from __future__ import annotations

from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

from ...gguf_io import Keys
from .qwen35 import QWEN35_LAYER_NAMES, Qwen35

QWEN35MOE_LAYER_NAMES = {
    **{k: v for k, v in QWEN35_LAYER_NAMES.items() if not k.startswith("mlp.")},
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
}


class Qwen35Moe(Qwen35):
    name = "qwen35moe"
    model_class = Qwen3_5MoeForCausalLM
    layer_names = QWEN35MOE_LAYER_NAMES
    config_class = Qwen3_5MoeTextConfig

    def config(self):
        cfg = self.base_config()
        n_ff = self.get(Keys.EXPERT_FEED_FORWARD_LENGTH)
        return Qwen3_5MoeTextConfig(
            **cfg,
            num_experts=self.get(Keys.EXPERT_COUNT),
            num_experts_per_tok=self.get(Keys.EXPERT_USED_COUNT),
            moe_intermediate_size=n_ff,
            shared_expert_intermediate_size=self.get(Keys.EXPERT_SHARED_FEED_FORWARD_LENGTH, n_ff),
        )

    def experts_names(self, module_name):
        names = super().experts_names(module_name)
        if names is None:
            return None
        fused = names[0].replace("ffn_gate_exps", "ffn_gate_up_exps")
        if fused in self.reader.tensors:
            return (fused, fused, names[2])
        return names
