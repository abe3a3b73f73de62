"""Llama 4 (`llama4`) as llama.cpp's converter writes Meta's checkpoints: a prompt's logits
equal llama.cpp's and transformers' Llama4ForCausalLM (a NoPE layer with its attention
temperature, weightless q/k norms after rotary in the others, dense and routed layers
interleaved, the top expert's input scaled by its router sigmoid, a shared expert), F32 and
Q8_0; token by token decoding gives the prompt's logits; past 8,192 positions the rotary
layers attend within their chunk (llama.cpp's chunked attention), the NoPE layers over all."""

from __future__ import annotations

import pytest
import torch
from transformers import Llama4ForCausalLM, Llama4TextConfig

from converter import convert_with_vocab
from gguf_serve.engine import load_model
from oracles import dense_logits, llama_cpp_logits, prompt_logits, stepped_logits
from tiny_modernbert import bpe_tokenizer

IDS = [5, 17, 200, 3, 99, 42, 7, 128, 64, 11, 250, 1, 299, 77, 30, 31, 32]


def tiny(folder, context: int = 256):
    cfg = Llama4TextConfig(vocab_size=300, hidden_size=128, intermediate_size=64, intermediate_size_mlp=256,
                           num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                           num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2,
                           max_position_embeddings=context, rms_norm_eps=1e-5, tie_word_embeddings=False, use_qk_norm=True,
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


LLAMA_CPP_TAIL = """
import sys, json, llama_cpp, numpy as np
ids, tail = json.loads(sys.argv[2]), int(sys.argv[3])
m = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=len(ids) + 16, n_batch=512, n_threads=2, logits_all=True, verbose=False)
m.eval(ids)
print(json.dumps(np.asarray(m.scores[len(ids) - tail:len(ids)]).tolist()))
"""


def test_chunked_attention_past_8192_equals_llama_cpp(tmp_path):
    """A prompt of 8,300 tokens: the last 200 positions' logits (108 of them in the second
    chunk, where the rotary layers no longer see the first chunk and the NoPE layers' query
    temperature steps up) equal llama.cpp's; attending over the whole context is far off."""
    import json
    import subprocess
    import sys

    from gguf_serve.engine.models import llama4

    hf, _ = tiny(tmp_path, context=16384)
    path = convert_with_vocab(hf, tmp_path / "llama4-long.gguf", "f32")
    ids = torch.randint(3, 300, (8300,), generator=torch.Generator().manual_seed(1)).tolist()
    lm = load_model(path, device="cpu", n_seq=1, n_ctx=8320)
    ours = prompt_logits(lm, ids)[-200:]
    p = subprocess.run([sys.executable, "-c", LLAMA_CPP_TAIL, path, json.dumps(ids), "200"], capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    theirs = torch.tensor(json.loads(p.stdout))
    scale = float(theirs.abs().max())
    assert float((ours - theirs).abs().max()) < 2e-3 * scale
    for layer in lm.model.layers:  # the same file attending in full: the second chunk's logits move
        layer.mixer.spec.chunk = 0
    full = prompt_logits(lm, ids)[-200:]
    assert float((full[-100:] - theirs[-100:]).abs().max()) > 2e-2 * scale
    assert llama4.CHUNK == 8192
