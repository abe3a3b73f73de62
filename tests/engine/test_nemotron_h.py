"""Nemotron-H (`nemotron_h`, and `nemotron_h_moe`: Nemotron 3 Nano's kind) as llama.cpp's
converter writes NVIDIA's checkpoints: a prompt's logits equal llama.cpp's and transformers'
NemotronHForCausalLM (Mamba-2 layers with two groups, attention without positions,
relu-squared MLP layers, or routed relu-squared experts with a score bias and a shared one,
none of which keep a cache), F32 and Q8_0; token by token decoding gives the prompt's logits."""

from __future__ import annotations

import pytest
import torch

from converter import convert_with_vocab
from gguf_serve.engine import load_model
from oracles import dense_logits, llama_cpp_logits, prompt_logits, stepped_logits
from tiny_nemotron import MOE_PATTERN, PATTERN, tiny_nemotron

IDS = [5, 17, 200, 3, 99, 42, 7, 128, 64, 11, 250, 1, 299, 77, 30, 31, 32]


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
def test_logits_equal_llama_cpp_and_transformers(tmp_path, outtype, moe):
    hf, model = tiny_nemotron(tmp_path, moe=moe)
    path = convert_with_vocab(hf, tmp_path / f"nemotron-{outtype}.gguf", outtype, ("--raw-config",))
    lm = load_model(path, device="cpu", n_seq=2)
    assert lm.architecture.name == ("nemotron_h_moe" if moe else "nemotron_h")
    kinds = {"M": "mamba", "-": "mlp", "E": "mlp", "*": "attention"}
    assert lm.params.kinds == [kinds[c] for c in (MOE_PATTERN if moe else PATTERN)]
    ours = prompt_logits(lm, IDS)
    theirs = llama_cpp_logits(path, IDS)
    scale = float(theirs.abs().max())
    assert float((ours - theirs).abs().max()) < (2e-3 if outtype == "f32" else 5e-2) * scale
    if outtype == "f32":
        assert float((dense_logits(model, IDS) - ours).abs().max()) < 2e-3 * scale
        torch.testing.assert_close(stepped_logits(lm, IDS), ours, rtol=0, atol=1e-3 * scale)
