"""qwen35 (Qwen3.5): layers alternate Gated DeltaNet linear attention with gated full
attention (every `full_attention_interval`-th layer, or as `attention.recurrent_layers`
says), partial multi-section rotary."""

from __future__ import annotations

from ...gguf_io import Keys
from .base import Architecture, Config

SSM_CONV_KERNEL = "{arch}.ssm.conv_kernel"
SSM_STATE_SIZE = "{arch}.ssm.state_size"
SSM_GROUP_COUNT = "{arch}.ssm.group_count"
SSM_TIME_STEP_RANK = "{arch}.ssm.time_step_rank"
SSM_INNER_SIZE = "{arch}.ssm.inner_size"
FULL_ATTENTION_INTERVAL = "{arch}.full_attention_interval"
ROPE_SECTIONS = "{arch}.rope.dimension_sections"


class Qwen35(Architecture):
    name = "qwen35"
    chat_template_fallback = "chatml"

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
        return Config(**self.base_config())
