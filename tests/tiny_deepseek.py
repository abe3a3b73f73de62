"""Tiny DeepSeek-V2 / V3 checkpoints as DeepSeek publishes them (each expert's matrices on
their own, which the converter stacks; transformers 5 keeps them fused), with a byte-level
BPE vocabulary, for llama.cpp's converter (conversion/deepseek.py DeepseekV2Model). The
latent is DeepSeek's 512 wide, so the attention's keys ([k_pe, c]: 520) are past 512, as
the real models' 576."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM

from tiny_modernbert import bpe_tokenizer

COMMON = dict(vocab_size=300, hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_attention_heads=4,
              num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
              first_k_dense_replace=1, kv_lora_rank=512, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
              max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False)


def tiny_deepseek(folder: Path, kind: str, seed: int = 0):
    """kind: "v2" (a q LoRA, softmax routing, 3 layers), "v2-lite" (one q matrix, 26 layers:
    llama.cpp reads a file without q_lora_rank only at the Lite models' depths), "v2-yarn"
    (v2 with the Lite's YaRN: mscale and mscale_all_dim 0.707, over a short original context), "v3"
    (sigmoid routing with a score bias, two expert groups of which one is used)."""
    torch.manual_seed(seed)
    if kind == "v3":
        cfg = DeepseekV3Config(**COMMON, num_hidden_layers=3, q_lora_rank=48, n_group=2, topk_group=1,
                               norm_topk_prob=True, routed_scaling_factor=2.5)
        model = DeepseekV3ForCausalLM(cfg).eval()
        with torch.no_grad():
            for layer in model.model.layers[1:]:
                layer.mlp.gate.e_score_correction_bias.normal_(0, 0.5)
    else:
        rope = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 8.0, "original_max_position_embeddings": 16,
                "mscale": 0.707, "mscale_all_dim": 0.707, "beta_fast": 32.0, "beta_slow": 1.0} \
            if kind == "v2-yarn" else {"rope_type": "default", "rope_theta": 1e4}
        cfg = DeepseekV2Config(**COMMON, num_hidden_layers=26 if kind == "v2-lite" else 3,
                               q_lora_rank=None if kind == "v2-lite" else 48, norm_topk_prob=False,
                               routed_scaling_factor=1.0, topk_method="greedy", rope_parameters=rope)
        model = DeepseekV2ForCausalLM(cfg).eval()
    hf = folder / "hf"
    model.save_pretrained(hf)
    if kind == "v3":  # DeepSeek's config names its router, which the converter writes (transformers 5 leaves it out)
        config = json.loads((hf / "config.json").read_text())
        (hf / "config.json").write_text(json.dumps({**config, "scoring_func": "sigmoid", "topk_method": "noaux_tc"}))
    unstack_experts(hf / "model.safetensors")
    bpe_tokenizer(hf)
    return hf, model


def unstack_experts(path: Path) -> None:
    with safe_open(str(path), "pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys()}
    out = {}
    for k, v in state.items():
        if k.endswith("mlp.experts.gate_up_proj"):  # (E, 2 ffn, hidden): gate rows, then up
            base, ffn = k[:-len("gate_up_proj")], v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = v[e, :ffn].contiguous()
                out[f"{base}{e}.up_proj.weight"] = v[e, ffn:].contiguous()
        elif k.endswith("mlp.experts.down_proj"):
            for e in range(v.shape[0]):
                out[f"{k[:-len('down_proj')]}{e}.down_proj.weight"] = v[e].contiguous()
        else:
            out[k] = v
    save_file(out, str(path), metadata={"format": "pt"})
