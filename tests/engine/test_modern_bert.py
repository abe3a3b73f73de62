"""ModernBERT embedders (`modern-bert`) as llama.cpp's converter writes them: the byte-level
BPE tokens and the mean-pooled embeddings equal llama.cpp's and transformers' (inputs longer
than the sliding window, so the local layers' symmetric window and their own rotary base
count; GeGLU with tanh GELU as llama.cpp's, where transformers' is exact: 3e-4 apart), F32
and Q8_0."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from converter import convert_with_vocab
from gguf_serve.engine import encode, load_model
from gguf_serve.engine.embed import embed
from oracles import llama_cpp_embeddings
from tiny_modernbert import tiny_modernbert

TEXTS = ["Hello world! The quick brown fox jumps over the lazy dog and Paris is the capital of France.",
         "Café ＡＢＣ", "Ein schneller brauner Fuchs springt über den faulen Hund. " * 3]


@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
def test_tokens_and_embeddings_equal_llama_cpp_and_transformers(tmp_path, outtype):
    hf, model, tok = tiny_modernbert(tmp_path)
    path = convert_with_vocab(hf, tmp_path / f"modernbert-{outtype}.gguf", outtype)
    lm = load_model(path, device="cpu", n_seq=2)
    assert lm.architecture.name == "modern-bert" and lm.pooling == "mean" and lm.model.both_ways
    assert lm.params.sliding == [False, True, True, False] and lm.params.window == 8
    theirs = llama_cpp_embeddings(path, TEXTS)
    ids = [encode(lm.tokenizer, t) for t in TEXTS]
    assert ids == [t for t, _ in theirs] == [tok(t)["input_ids"] for t in TEXTS]
    assert all(len(i) > 16 for i in ids[::2])  # past the window both ways
    got = embed(lm, ids, normalize=False)
    for row, (_, vec), seq in zip(got, theirs, ids):
        assert float(F.cosine_similarity(row, vec, dim=0)) > (0.99999 if outtype == "f32" else 0.999)
        if outtype == "f32":
            torch.testing.assert_close(row, vec, rtol=0, atol=2e-3)
            with torch.no_grad():
                hidden = model(torch.tensor([seq])).last_hidden_state[0]
            torch.testing.assert_close(row, hidden.mean(0), rtol=0, atol=1e-3)
