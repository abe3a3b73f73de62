"""jina-embeddings-v2 files (`jina-bert-v2`) as llama.cpp's converter writes them from Jina's
checkpoint layout: the WordPiece tokens and the mean-pooled embeddings equal llama.cpp's and
Jina's forward pass (ALiBi both ways on inputs long enough for distant keys to fade, GeGLU
with tanh GELU as llama.cpp's, Jina's exact: 5e-4 apart; without ALiBi 0.4), F32 and Q8_0."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from converter import convert_with_vocab
from gguf_serve.engine import encode, load_model
from gguf_serve.engine.embed import embed
from oracles import llama_cpp_embeddings
from tiny_jina import reference, tiny_jina

TEXTS = ["Hello the quick brown foxes!", "the lazy dog runs over the world " * 6, "zzyzx qwerty"]


@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
def test_tokens_and_embeddings_equal_llama_cpp_and_jinas_forward(tmp_path, outtype):
    hf, weights = tiny_jina(tmp_path)
    path = convert_with_vocab(hf, tmp_path / f"jina-{outtype}.gguf", outtype)
    lm = load_model(path, device="cpu", n_seq=2)
    assert lm.architecture.name == "jina-bert-v2" and lm.pooling == "mean"
    theirs = llama_cpp_embeddings(path, TEXTS)
    ids = [encode(lm.tokenizer, t) for t in TEXTS]
    assert ids == [t for t, _ in theirs] and len(ids[1]) > 40
    got = embed(lm, ids, normalize=False)
    for row, (_, vec), seq in zip(got, theirs, ids):
        assert float(F.cosine_similarity(row, vec, dim=0)) > (0.99999 if outtype == "f32" else 0.999)
        if outtype == "f32":
            torch.testing.assert_close(row, vec, rtol=0, atol=1e-3)
            torch.testing.assert_close(row, reference(weights, seq).mean(0), rtol=0, atol=1e-3)
