"""Qwen3-VL's language models (`qwen3vl`, `qwen3vlmoe`) as llama.cpp's converter writes them
from transformers' Qwen3VLForConditionalGeneration / Qwen3VLMoeForConditionalGeneration:
text prompts give llama.cpp's logits and transformers' (the interleaved rotary sections
reduce to NeoX rotary for text), F32 and Q8_0; the checkpoints carry a vision tower, which
the converter leaves for the mmproj file."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import (Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLMoeConfig,
                          Qwen3VLMoeForConditionalGeneration)

from converter import convert_with_vocab
from gguf_serve.engine import load_model
from oracles import dense_logits, llama_cpp_logits, prompt_logits
from tiny_modernbert import bpe_tokenizer

TEXT = dict(vocab_size=300, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, max_position_embeddings=512, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [6, 5, 5],
                             "mrope_interleaved": True}, tie_word_embeddings=False)
VISION = dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=128, patch_size=16,
              spatial_merge_size=2, temporal_patch_size=2, deepstack_visual_indexes=[0], num_position_embeddings=64)


def tiny(arch: str):
    torch.manual_seed(0)
    if arch == "qwen3vl":
        return Qwen3VLForConditionalGeneration(Qwen3VLConfig(text_config=TEXT, vision_config=VISION)).eval()
    text = dict(TEXT, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, decoder_sparse_step=1,
                mlp_only_layers=[], norm_topk_prob=True)
    return Qwen3VLMoeForConditionalGeneration(Qwen3VLMoeConfig(text_config=text, vision_config=VISION)).eval()


def hub_expert_layout(path) -> None:
    """The experts as Qwen's checkpoints hold them, which the converter transposes: gate_up
    (E, hidden, 2 ffn) and down (E, ffn, hidden); transformers 5 saves them the other way."""
    with safe_open(str(path), "pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys()}
    for k, v in state.items():
        if k.endswith(("mlp.experts.down_proj", "mlp.experts.gate_up_proj")):
            state[k] = v.transpose(1, 2).contiguous()
    save_file(state, str(path), metadata={"format": "pt"})


@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
@pytest.mark.parametrize("arch", ["qwen3vl", "qwen3vlmoe"])
def test_text_logits_equal_llama_cpp_and_transformers(tmp_path, arch, outtype):
    model = tiny(arch)
    model.save_pretrained(tmp_path / "hf")
    if arch == "qwen3vlmoe":
        hub_expert_layout(tmp_path / "hf" / "model.safetensors")
    bpe_tokenizer(tmp_path / "hf")  # a byte-level BPE vocabulary of the model's 300 tokens
    path = convert_with_vocab(tmp_path / "hf", tmp_path / f"{arch}-{outtype}.gguf", outtype)
    lm = load_model(path, device="cpu", n_seq=2)
    assert lm.architecture.name == arch
    ids = [5, 17, 200, 3, 99, 42, 7, 128, 64, 11, 250, 1, 299, 77]
    ours = prompt_logits(lm, ids)
    theirs = llama_cpp_logits(path, ids)
    tol = 2e-3 if outtype == "f32" else 5e-2
    assert (ours - theirs).abs().max() < tol * theirs.abs().max()
    if outtype == "f32":
        dense = dense_logits(model, ids)
        torch.testing.assert_close(ours, dense, rtol=0, atol=1e-3 * float(dense.abs().max()))
