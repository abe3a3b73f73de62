"""gemma3 (text): sandwich norms, q/k norms, scaled embeddings, interleaved sliding
and global attention, each with its own rotary base."""

from __future__ import annotations

from ...gguf_io import Keys
from .base import Architecture, Config

SLIDING_WINDOW_PATTERN = 6  # every 6th layer attends globally (llama.cpp: set_swa_pattern(6))
LOCAL_ROPE_BASE = 10000.0  # llama.cpp: rope_freq_base_train_swa for Gemma 3


class Gemma3(Architecture):
    name = "gemma3"
    chat_template_fallback = "gemma"

    def config(self):
        cfg = self.common_config()
        n_layers = cfg["num_hidden_layers"]
        layer_types = ["full_attention" if (i + 1) % SLIDING_WINDOW_PATTERN == 0 else "sliding_attention"
                       for i in range(n_layers)]
        # llama.cpp scales queries by 1/sqrt(head_dim), except the 27B (62 layers): 1/sqrt(hidden/heads)
        scalar = cfg["hidden_size"] // cfg["num_attention_heads"] if n_layers == 62 else cfg["head_dim"]
        global_rope = cfg.pop("rope_parameters")
        local_base = self.get(Keys.ROPE_FREQ_BASE_SWA, LOCAL_ROPE_BASE)
        return Config(
            **cfg,
            layer_types=layer_types,
            sliding_window=self.get(Keys.SLIDING_WINDOW, 4096),
            query_pre_attn_scalar=scalar,
            rope_parameters={"full_attention": global_rope,
                             "sliding_attention": {"rope_type": "default", "rope_theta": float(local_base)}},
            final_logit_softcapping=self.get(Keys.FINAL_LOGIT_SOFTCAPPING, None),
            attn_logit_softcapping=self.get(Keys.ATTN_LOGIT_SOFTCAPPING, None),
        )
