"""qwen35 (Qwen3.5): layers alternate Gated DeltaNet linear attention with gated full
attention (every `full_attention_interval`-th layer). Inverse of llama.cpp's converter:
norms were stored as `1 + w` (not the gated SSM norm), A_log as -exp(A_log), dt_bias
renamed ssm_dt.bias, conv1d squeezed, and when there are more V heads than K heads
the V heads were reordered from grouped-by-K to tiled order in qkv, z, a, b, A_log,
dt_bias, conv1d (rows) and out_proj (columns)."""

from __future__ import annotations

import numpy as np
import torch
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

from ...gguf_io import Keys
from .base import ATTENTION_NAMES, MLP_NAMES, QK_NORM_NAMES, Architecture

QWEN35_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "linear_attn.in_proj_qkv.weight": "attn_qkv.weight",
    "linear_attn.in_proj_z.weight": "attn_gate.weight",
    "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
    "linear_attn.in_proj_b.weight": "ssm_beta.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight",
    "linear_attn.conv1d.weight": "ssm_conv1d.weight",
    "linear_attn.A_log": "ssm_a",
    "linear_attn.dt_bias": "ssm_dt.bias",
    "linear_attn.norm.weight": "ssm_norm.weight",
    **ATTENTION_NAMES,
    **QK_NORM_NAMES,
    **MLP_NAMES,
}

SSM_CONV_KERNEL = "{arch}.ssm.conv_kernel"
SSM_STATE_SIZE = "{arch}.ssm.state_size"
SSM_GROUP_COUNT = "{arch}.ssm.group_count"
SSM_TIME_STEP_RANK = "{arch}.ssm.time_step_rank"
SSM_INNER_SIZE = "{arch}.ssm.inner_size"
FULL_ATTENTION_INTERVAL = "{arch}.full_attention_interval"
ROPE_SECTIONS = "{arch}.rope.dimension_sections"


def v_head_order(n_k: int, n_v: int, head_dim: int) -> torch.Tensor:
    """The converter's grouped → tiled V-head reorder as a gather index: file[i] = hf[idx[i]]."""
    per_k = n_v // n_k
    return torch.arange(n_v * head_dim).reshape(n_k, per_k, head_dim).permute(1, 0, 2).reshape(-1)


class Qwen35(Architecture):
    name = "qwen35"
    model_class = Qwen3_5ForCausalLM
    layer_names = QWEN35_LAYER_NAMES
    chat_template_fallback = "chatml"
    config_class = Qwen3_5TextConfig

    def linear_attention_config(self) -> dict:
        n_k = self.get(SSM_GROUP_COUNT)
        n_v = self.get(SSM_TIME_STEP_RANK)
        return dict(
            linear_conv_kernel_dim=self.get(SSM_CONV_KERNEL),
            linear_key_head_dim=self.get(SSM_STATE_SIZE),
            linear_value_head_dim=self.get(SSM_INNER_SIZE) // n_v,
            linear_num_key_heads=n_k,
            linear_num_value_heads=n_v,
        )

    def base_config(self) -> dict:
        cfg = self.common_config()
        n = cfg["num_hidden_layers"]
        recurrent = self.reader.metadata.get(f"{self.arch}.attention.recurrent_layers")
        if isinstance(recurrent, list) and len(recurrent) >= n:
            layer_types = ["linear_attention" if r else "full_attention" for r in recurrent[:n]]
        else:
            interval = self.get(FULL_ATTENTION_INTERVAL, 4)
            layer_types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
        rope = cfg["rope_parameters"]
        rope["partial_rotary_factor"] = self.get(Keys.ROPE_DIMENSION_COUNT, cfg["head_dim"] // 4) / cfg["head_dim"]
        sections = self.reader.metadata.get(ROPE_SECTIONS.format(arch=self.arch))
        if isinstance(sections, list) and len(sections) >= 3:
            rope["mrope_section"] = [int(s) for s in sections[:3]]
        return dict(cfg, layer_types=layer_types, **self.linear_attention_config())

    def config(self):
        return self.config_class(**self.base_config())

    # ---------------------------------------------------------------- V heads

    def _v(self, config, head_dim: int) -> torch.Tensor | None:
        n_k, n_v = config.linear_num_key_heads, config.linear_num_value_heads
        if n_k == n_v:
            return None
        return v_head_order(n_k, n_v, head_dim)

    def output_permutation(self, hf_name, config):
        if ".linear_attn." not in hf_name:
            return None
        if hf_name.endswith("in_proj_qkv.weight"):
            idx = self._v(config, config.linear_value_head_dim)
            if idx is None:
                return None
            qk = 2 * config.linear_num_key_heads * config.linear_key_head_dim
            return torch.cat([torch.arange(qk), qk + torch.argsort(idx)])
        if hf_name.endswith("in_proj_z.weight"):
            idx = self._v(config, config.linear_value_head_dim)
        elif hf_name.endswith(("in_proj_a.weight", "in_proj_b.weight")):
            idx = self._v(config, 1)
        else:
            return None
        return None if idx is None else torch.argsort(idx)

    def input_permutation(self, hf_name, config):
        if hf_name.endswith("linear_attn.out_proj.weight"):
            return self._v(config, config.linear_value_head_dim)
        return None

    def dense(self, hf_name, array, config):
        t = torch.from_numpy(np.array(array, dtype=np.float32))
        if hf_name.endswith("norm.weight") and not hf_name.endswith("linear_attn.norm.weight"):
            return t - 1.0
        if hf_name.endswith("linear_attn.A_log"):
            t = torch.log(-t)
            idx = self._v(config, 1)
            return t if idx is None else t[torch.argsort(idx)]
        if hf_name.endswith("linear_attn.dt_bias"):
            idx = self._v(config, 1)
            return t if idx is None else t[torch.argsort(idx)]
        if hf_name.endswith("linear_attn.conv1d.weight"):
            idx = self._v(config, config.linear_value_head_dim)
            if idx is not None:
                qk = 2 * config.linear_num_key_heads * config.linear_key_head_dim
                t = torch.cat([t[:qk], t[qk:][torch.argsort(idx)]])
            return t.reshape(t.shape[0], 1, -1)
        return t
