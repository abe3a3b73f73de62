"""llama (also Mistral files, which llama.cpp writes as `llama`)."""

from __future__ import annotations

from transformers import LlamaConfig, LlamaForCausalLM

from .base import Architecture, llama_qk_permutation


class Llama(Architecture):
    name = "llama"
    model_class = LlamaForCausalLM

    def config(self):
        has_bias = "blk.0.attn_q.bias" in self.reader.tensors
        return LlamaConfig(**self.common_config(), attention_bias=has_bias, mlp_bias=False)

    def _qk_heads(self, hf_name: str, config) -> int | None:
        if hf_name.endswith("self_attn.q_proj.weight") or hf_name.endswith("self_attn.q_proj.bias"):
            return config.num_attention_heads
        if hf_name.endswith("self_attn.k_proj.weight") or hf_name.endswith("self_attn.k_proj.bias"):
            return config.num_key_value_heads
        return None

    def output_permutation(self, hf_name, config):
        heads = self._qk_heads(hf_name, config)
        if heads is None:
            return None
        rows = heads * config.head_dim
        return llama_qk_permutation(rows, heads)

    def dense(self, hf_name, array, config):
        t = super().dense(hf_name, array, config)
        heads = self._qk_heads(hf_name, config)
        if heads is not None:  # q/k biases were permuted like the weight rows
            t = t[llama_qk_permutation(t.shape[0], heads)]
        return t
