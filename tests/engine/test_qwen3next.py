"""Qwen3-Next (`qwen3next`) as llama.cpp's converter writes Qwen's checkpoints (experts one by
one, value heads grouped by key head, beta and alpha in one matrix): a prompt's logits equal
llama.cpp's and transformers' Qwen3NextForCausalLM (Gated DeltaNet layers with two value
heads per key head, a gated attention layer, routed and gated shared experts), F32 and Q8_0;
token by token decoding gives the prompt's logits (the recurrent state carried)."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

from converter import convert_with_vocab
from gguf_serve.engine import load_model
from oracles import dense_logits, llama_cpp_logits, prompt_logits, stepped_logits
from tiny_deepseek import unstack_experts
from tiny_modernbert import bpe_tokenizer

IDS = [5, 17, 200, 3, 99, 42, 7, 128, 64, 11, 250, 1, 299, 77, 30, 31, 32]


def tiny(folder):
    cfg = Qwen3NextConfig(vocab_size=300, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=64, linear_conv_kernel_dim=4,
                          linear_key_head_dim=32, linear_value_head_dim=32, linear_num_key_heads=2,
                          linear_num_value_heads=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                          shared_expert_intermediate_size=64, decoder_sparse_step=1, mlp_only_layers=[],
                          norm_topk_prob=True, max_position_embeddings=256, rms_norm_eps=1e-6,
                          tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Qwen3NextForCausalLM(cfg).eval()
    with torch.no_grad():  # norms and decays away from their initial values, so that a misplaced one shows
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "A_log", "dt_bias")):
                p.normal_(0, 0.3)
            elif name.endswith("mlp.gate.weight"):  # routers whose choices are clear: no near ties for Q8_0 to flip
                p.normal_(0, 1.0)
    hf = folder / "hf"
    model.save_pretrained(hf)
    unstack_experts(hf / "model.safetensors")
    bpe_tokenizer(hf)
    return hf, model


@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
def test_logits_equal_llama_cpp_and_transformers(tmp_path, outtype):
    hf, model = tiny(tmp_path)
    # the tiny model has no MTP block, which Qwen's checkpoints carry (the converter asks for it)
    path = convert_with_vocab(hf, tmp_path / f"qwen3next-{outtype}.gguf", outtype, ("--no-mtp",))
    lm = load_model(path, device="cpu", n_seq=2)
    assert lm.architecture.name == "qwen3next"
    ours = prompt_logits(lm, IDS)
    theirs = llama_cpp_logits(path, IDS)
    scale = float(theirs.abs().max())
    # Q8_0: llama.cpp's activations quantized to 8 bits in every product (the recurrent layers' too)
    # move it 6.5 % of the largest logit from the float model; ours 2.3 % where the prompt multiplies in
    # bfloat16 tiles (AMX), 6.8 % where it quantizes activations as llama.cpp does (AVX-512 VNNI, AVX2:
    # then 1.2 % from llama.cpp's)
    assert float((ours - theirs).abs().max()) < (2e-3 if outtype == "f32" else 1e-1) * scale
    assert float((dense_logits(model, IDS) - ours).abs().max()) < (2e-3 if outtype == "f32" else 8e-2) * scale
    if outtype == "f32":
        torch.testing.assert_close(stepped_logits(lm, IDS), ours, rtol=0, atol=1e-3 * scale)
