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
from gguf_serve.engine.embed import embed, rank
from gguf_serve.server.embeddings.serving import _rerank_inputs
from oracles import llama_cpp_embeddings, llama_cpp_rank
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


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_reranker_scores_equal_llama_cpp_and_transformers(tmp_path, pooling):
    """A ModernBertForSequenceClassification file (gte-reranker-modernbert's kind) ranks: its
    classifier pooling (the first token or the mean), the head's dense layer, GELU and norm,
    then the label's projection, on llama-server's query-document pairs."""
    hf, model, tok = tiny_modernbert(tmp_path, rank=pooling)
    path = convert_with_vocab(hf, tmp_path / "rerank.gguf", "f32")
    lm = load_model(path, device="cpu", n_seq=2)
    assert lm.pooling == "rank"
    inputs = _rerank_inputs(lm, "What is the capital of France?", ["Paris is the capital of France.", "Café", "dog"])
    ours = rank(lm, inputs)
    theirs, _ = llama_cpp_rank(path, inputs)
    torch.testing.assert_close(ours, torch.tensor(theirs), rtol=0, atol=2e-3 * float(ours.abs().max()))
    with torch.no_grad():
        dense = torch.cat([model(torch.tensor([i])).logits[0] for i in inputs])
    torch.testing.assert_close(ours, dense, rtol=0, atol=2e-3 * float(dense.abs().max()))
    assert float(ours.max() - ours.min()) > 1e-3
