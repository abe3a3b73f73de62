"""A tiny dense Nemotron-H checkpoint as NVIDIA publishes them (`backbone.*` tensors, a
`hybrid_override_pattern` of Mamba-2 "M", MLP "-" and attention "*" layers), with a
byte-level BPE vocabulary of 300 (the model's 320 rows: the converter pads the vocabulary to
a multiple of 16, as NVIDIA's are), for llama.cpp's converter (conversion/nemotron.py NemotronHModel,
reading config.json as it is: "--raw-config"); and transformers' NemotronHForCausalLM of
the same weights as the reference."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import NemotronHConfig, NemotronHForCausalLM

from tiny_modernbert import bpe_tokenizer

PATTERN = "M-*-M"
MOE_PATTERN = "ME*EM"  # Nemotron 3 Nano's kinds: E an expert layer
KINDS = {"M": "linear_attention", "-": "mlp", "*": "full_attention", "E": "moe"}
MOE = dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, moe_shared_expert_intermediate_size=64,
           n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True, n_group=1, topk_group=1)
SIZES = dict(vocab_size=320, hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
             intermediate_size=256, mamba_num_heads=8, mamba_head_dim=32, ssm_state_size=16, n_groups=2,
             conv_kernel=4, max_position_embeddings=256, tie_word_embeddings=False, layer_norm_epsilon=1e-5)


def tiny_nemotron(folder: Path, seed: int = 0, moe: bool = False) -> tuple[Path, NemotronHForCausalLM]:
    """Dense (PATTERN), or with `moe` Nemotron 3 Nano's kind (MOE_PATTERN: routed relu-squared
    experts with a score bias, a shared expert, routed weights scaled)."""
    torch.manual_seed(seed)
    pattern, extra = (MOE_PATTERN, MOE) if moe else (PATTERN, {})
    model = NemotronHForCausalLM(NemotronHConfig(**SIZES, **extra, layers_block_type=[KINDS[c] for c in pattern])).eval()
    with torch.no_grad():  # norms and decays away from their initial values
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "norm_f.weight")):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith(("A_log", "dt_bias", "D", "e_score_correction_bias")):
                p.normal_(0, 0.5)
            elif name.endswith("gate.weight"):  # routers with clear choices
                p.normal_(0, 1.0)
    hf = folder / "hf"
    hf.mkdir(parents=True, exist_ok=True)
    state = {}
    for k, v in model.state_dict().items():
        k = k.replace("model.", "backbone.", 1)
        if k.endswith(("mixer.experts.up_proj", "mixer.experts.down_proj")):  # NVIDIA's: each expert on its own
            for e in range(v.shape[0]):
                state[f"{k.rsplit('.', 1)[0]}.{e}.{k.rsplit('.', 1)[1]}.weight"] = v[e].contiguous()
        else:
            state[k] = v.contiguous()
    save_file(state, str(hf / "model.safetensors"), metadata={"format": "pt"})
    (hf / "config.json").write_text(json.dumps({
        "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", **SIZES, **extra,
        "num_hidden_layers": len(pattern), "hybrid_override_pattern": pattern, "expand": 2, "mlp_hidden_act": "relu2",
        "attention_bias": False, "mlp_bias": False, "use_bias": False, "use_conv_bias": True,
        "rms_norm_eps": SIZES["layer_norm_epsilon"]}))
    bpe_tokenizer(hf)
    return hf, model
