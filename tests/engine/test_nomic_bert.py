"""nomic-embed-text files (`nomic-bert`) as llama.cpp's converter writes them from the
checkpoint's own layout: the WordPiece tokens and the mean-pooled embeddings equal
llama.cpp's and transformers' NomicBertModel's (rotary positions, fused q/k/v, SwiGLU,
post-norm), F32 and Q8_0; an encoder's keys and values stay float32 by default."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from converter import convert_with_vocab
from gguf_serve.engine import encode, load_model
from gguf_serve.engine.embed import embed
from oracles import llama_cpp_embeddings
from tiny_nomic import tiny_nomic

TEXTS = ["search_query: Hello the quick brown foxes!", "search_document: THE LAZY DOG runs, jumped over... Café?",
         "zzyzx qwerty", "it's a dog " * 12]


@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
def test_tokens_and_embeddings_equal_llama_cpp_and_transformers(tmp_path, outtype):
    hf, model = tiny_nomic(tmp_path)
    path = convert_with_vocab(hf, tmp_path / f"nomic-{outtype}.gguf", outtype)
    lm = load_model(path, device="cpu", n_seq=2)
    assert lm.architecture.name == "nomic-bert" and lm.pooling == "mean" and lm.model.both_ways
    assert lm.cache.types[0].name == "f32"  # as llama.cpp, which runs an encoder without a cache
    theirs = llama_cpp_embeddings(path, TEXTS)
    ids = [encode(lm.tokenizer, t) for t in TEXTS]
    assert ids == [t for t, _ in theirs]
    got = embed(lm, ids, normalize=False)
    for row, (_, vec), seq in zip(got, theirs, ids):
        assert float(F.cosine_similarity(row, vec, dim=0)) > (0.999999 if outtype == "f32" else 0.999)
        if outtype == "f32":
            torch.testing.assert_close(row, vec, rtol=1e-4, atol=1e-4)
            with torch.no_grad():
                hidden = model(torch.tensor([seq])).last_hidden_state[0]
            torch.testing.assert_close(row, hidden.mean(0), rtol=1e-4, atol=1e-4)
