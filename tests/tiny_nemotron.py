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
KINDS = {"M": "linear_attention", "-": "mlp", "*": "full_attention"}
SIZES = dict(vocab_size=320, hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
             intermediate_size=256, mamba_num_heads=8, mamba_head_dim=32, ssm_state_size=16, n_groups=2,
             conv_kernel=4, max_position_embeddings=256, tie_word_embeddings=False, layer_norm_epsilon=1e-5)


def tiny_nemotron(folder: Path, seed: int = 0) -> tuple[Path, NemotronHForCausalLM]:
    torch.manual_seed(seed)
    model = NemotronHForCausalLM(NemotronHConfig(**SIZES, layers_block_type=[KINDS[c] for c in PATTERN])).eval()
    with torch.no_grad():  # norms and decays away from their initial values
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "norm_f.weight")):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith(("A_log", "dt_bias", "D")):
                p.normal_(0, 0.5)
    hf = folder / "hf"
    hf.mkdir(parents=True, exist_ok=True)
    save_file({k.replace("model.", "backbone.", 1): v.contiguous() for k, v in model.state_dict().items()},
              str(hf / "model.safetensors"), metadata={"format": "pt"})
    (hf / "config.json").write_text(json.dumps({
        "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", **SIZES,
        "num_hidden_layers": len(PATTERN), "hybrid_override_pattern": PATTERN, "expand": 2, "mlp_hidden_act": "relu2",
        "attention_bias": False, "mlp_bias": False, "use_bias": False, "use_conv_bias": True,
        "rms_norm_eps": SIZES["layer_norm_epsilon"]}))
    bpe_tokenizer(hf)
    return hf, model
