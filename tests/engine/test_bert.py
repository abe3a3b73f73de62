"""BERT sentence embedders (`bert`) as llama.cpp's converter writes them, vocabulary and
all: the WordPiece tokenizer gives llama.cpp's token ids (case, punctuation, accents, a
word split into pieces, an unknown one), and the pooled embeddings equal llama.cpp's and
transformers' (mean and CLS pooling, F32 and Q8_0 files)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from converter import convert_with_vocab
from gguf_serve.engine import encode, load_model
from gguf_serve.engine.embed import embed
from oracles import llama_cpp_embeddings
from tiny_bert import tiny_bert

TEXTS = ["Hello the quick brown foxes!", "THE LAZY DOG runs, jumped over... Café?", "zzyzx qwerty", "it's a dog"]


@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_tokens_and_embeddings_equal_llama_cpp_and_transformers(tmp_path, pooling, outtype):
    hf, model = tiny_bert(tmp_path / "hf", pooling)
    path = convert_with_vocab(hf, tmp_path / f"bert-{outtype}.gguf", outtype)
    lm = load_model(path, device="cpu", n_seq=2)
    assert lm.pooling == pooling and lm.model.both_ways
    theirs = llama_cpp_embeddings(path, TEXTS)
    ids = [encode(lm.tokenizer, t) for t in TEXTS]
    assert ids == [t for t, _ in theirs]
    assert ids[0][0] == lm.tokenizer.convert_tokens_to_ids("[CLS]") and ids[0][-1] == lm.tokenizer.convert_tokens_to_ids(
        "[SEP]")
    got = embed(lm, ids, normalize=False)  # four inputs, two slots: two forwards
    for row, (_, vec), seq in zip(got, theirs, ids):
        assert float(F.cosine_similarity(row, vec, dim=0)) > (0.99999 if outtype == "f32" else 0.999)
        if outtype == "f32":
            with torch.no_grad():
                hidden = model(torch.tensor([seq])).last_hidden_state[0]
            pooled = hidden.mean(0) if pooling == "mean" else hidden[0]
            torch.testing.assert_close(row, pooled, rtol=1e-4, atol=1e-4)
    assert lm.tokenizer.decode(ids[0], skip_special_tokens=True) == "hello the quick brown foxes!"


def test_an_input_longer_than_the_position_table_is_refused(tmp_path):
    hf, _ = tiny_bert(tmp_path / "hf")
    lm = load_model(convert_with_vocab(hf, tmp_path / "bert.gguf", "f32"), device="cpu", n_ctx=256)
    with pytest.raises(ValueError, match="at most 128 tokens"):
        embed(lm, [[2] + [40] * 140 + [3]])
