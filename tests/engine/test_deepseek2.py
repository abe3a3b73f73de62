"""DeepSeek's multi-head latent attention (`deepseek2`) as llama.cpp's converter writes
DeepSeek-V2, V2-Lite and V3 checkpoints: a prompt's logits equal llama.cpp's and
transformers' (the latent attention with its absorbed k_b and v_b, q through a LoRA or one
matrix, dense then routed layers with shared experts, softmax or grouped sigmoid routing
with the score bias, YaRN's mscale in the attention's scale), F32 and Q8_0; decoding token by
token gives the prompt's logits."""

from __future__ import annotations

import pytest
import torch

from converter import convert_with_vocab
from gguf_serve.engine import load_model
from oracles import dense_logits, llama_cpp_logits, prompt_logits, stepped_logits
from tiny_deepseek import tiny_deepseek

IDS = [5, 17, 200, 3, 99, 42, 7, 128, 64, 11, 250, 1, 299, 77, 30, 31, 32, 33, 34, 35]  # past YaRN's 16


@pytest.mark.parametrize("kind,outtype", [("v2", "f32"), ("v2", "q8_0"), ("v2-lite", "f32"), ("v2-yarn", "f32"),
                                          ("v3", "f32"), ("v3", "q8_0")])
def test_logits_equal_llama_cpp_and_transformers(tmp_path, kind, outtype):
    hf, model = tiny_deepseek(tmp_path, kind)
    path = convert_with_vocab(hf, tmp_path / f"deepseek-{kind}-{outtype}.gguf", outtype)
    lm = load_model(path, device="cpu", n_seq=2)
    assert lm.architecture.name == "deepseek2" and lm.params.q_lora == (0 if kind == "v2-lite" else 48)
    ours = prompt_logits(lm, IDS)
    theirs = llama_cpp_logits(path, IDS)
    scale = float(theirs.abs().max())
    assert float((ours - theirs).abs().max()) < (2e-3 if outtype == "f32" else 5e-2) * scale
    if outtype == "f32":
        assert float((dense_logits(model, IDS) - ours).abs().max()) < 2e-3 * scale


def test_decode_token_by_token_equals_the_prompt(tmp_path):
    hf, _ = tiny_deepseek(tmp_path, "v2")
    lm = load_model(convert_with_vocab(hf, tmp_path / "deepseek.gguf", "f32"), device="cpu", n_seq=2)
    whole = prompt_logits(lm, IDS)
    torch.testing.assert_close(stepped_logits(lm, IDS), whole, rtol=0, atol=1e-3 * float(whole.abs().max()))
