"""Llama 4 (`llama4`) as llama.cpp's converter writes Meta's checkpoints: a prompt's logits
equal llama.cpp's and transformers' Llama4ForCausalLM (a NoPE layer with its attention
temperature, weightless q/k norms after rotary in the others, dense and routed layers
interleaved, the top expert's input scaled by its router sigmoid, a shared expert), F32 and
Q8_0; token by token decoding gives the prompt's logits."""

from __future__ import annotations

import pytest
import torch
from transformers import Llama4ForCausalLM, Llama4TextConfig

from converter import convert_with_vocab
from gguf_serve.engine import load_model
from oracles import dense_logits, llama_cpp_logits, prompt_logits, stepped_logits
from tiny_modernbert import bpe_tokenizer

IDS = [5, 17, 200, 3, 99, 42, 7, 128, 64, 11, 250, 1, 299, 77, 30, 31, 32]


def tiny(folder):
    cfg = Llama4TextConfig(vocab_size=300, hidden_size=128, intermediate_size=64, intermediate_size_mlp=256,
                           num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                           num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2,
                           max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False, use_qk_norm=True,
                           pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = Llama4ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("router.weight"):  # clear choices: no near ties for Q8_0 to flip
                p.normal_(0, 1.0)
    model.save_pretrained(folder / "hf")
    bpe_tokenizer(folder / "hf")
    return folder / "hf", model


@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
def test_logits_equal_llama_cpp_and_transformers(tmp_path, outtype):
    hf, model = tiny(tmp_path)
    path = convert_with_vocab(hf, tmp_path / f"llama4-{outtype}.gguf", outtype)
    lm = load_model(path, device="cpu", n_seq=2)
    assert lm.architecture.name == "llama4"
    ours = prompt_logits(lm, IDS)
    theirs = llama_cpp_logits(path, IDS)
    scale = float(theirs.abs().max())
    assert float((ours - theirs).abs().max()) < (2e-3 if outtype == "f32" else 5e-2) * scale
    if outtype == "f32":
        assert float((dense_logits(model, IDS) - ours).abs().max()) < 2e-3 * scale
        torch.testing.assert_close(stepped_logits(lm, IDS), ours, rtol=0, atol=1e-3 * scale)
