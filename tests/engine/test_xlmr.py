"""The BERT family's XLM-RoBERTa files and cross-encoders as llama.cpp's converter writes
them: a SentencePiece Unigram vocabulary ("t5": bge-m3, multilingual-e5, bge-reranker)
gives llama.cpp's and transformers' token ids (NFKC normalization, merged and trimmed
spaces, an unknown character, an empty text); XLM-R embeddings equal both (mean and CLS
pooling, F32 and Q8_0 files, the position table cut past the padding offset); a
reranker's scores (its classification head on the first token) equal llama.cpp's
(--pooling rank) on query-document pairs as llama-server writes them, and transformers'
where the converter keeps the whole head (XLM-R's dense + tanh + projection; a
BertForSequenceClassification file loses BERT's pooler in the converter, so llama.cpp's
scores, and ours, are not transformers' there)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from converter import convert_with_vocab
from gguf_serve.engine import encode, load_model
from gguf_serve.engine.config import EngineConfig
from gguf_serve.engine.errors import WeightError
from gguf_serve.engine.embed import embed, rank
from gguf_serve.server.embeddings.serving import _rerank_inputs
from oracles import llama_cpp_embeddings, llama_cpp_rank
from tiny_xlmr import tiny_bert_ranker, tiny_xlmr

TEXTS = ["Hello world! Café ＡＢＣ", "  Paris   is the capital  ", "zzq 漢字 ünknown", "", "The quick brown fox."]
QUERY = "What is the capital of France?"
DOCS = ["Paris is the capital of France.", "The quick brown fox.", "Berlin", "ｆｕｌｌ-ｗｉｄｔｈ １２３"]


@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_xlmr_tokens_and_embeddings_equal_llama_cpp_and_transformers(tmp_path, pooling, outtype):
    hf, model, tok = tiny_xlmr(tmp_path, pooling)
    path = convert_with_vocab(hf, tmp_path / f"xlmr-{outtype}.gguf", outtype)
    lm = load_model(path, device="cpu", n_seq=2)
    assert lm.pooling == pooling and lm.model.both_ways
    theirs = llama_cpp_embeddings(path, TEXTS)
    ids = [encode(lm.tokenizer, t) for t in TEXTS]
    assert ids == [t for t, _ in theirs]
    assert ids == [tok(t)["input_ids"] for t in TEXTS]
    assert lm.tokenizer.unk_token_id in ids[2] and ids[3] == [0, 2]
    got = embed(lm, ids, normalize=False)
    for row, (_, vec), seq in zip(got, theirs, ids):
        assert float(F.cosine_similarity(row, vec, dim=0)) > (0.99999 if outtype == "f32" else 0.999)
        if outtype == "f32":
            with torch.no_grad():
                hidden = model(torch.tensor([seq])).last_hidden_state[0]
            torch.testing.assert_close(row, hidden.mean(0) if pooling == "mean" else hidden[0], rtol=1e-4, atol=1e-4)
    assert lm.tokenizer.decode(ids[4], skip_special_tokens=True) == "The quick brown fox."


@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
def test_xlmr_reranker_scores_equal_llama_cpp_and_transformers(tmp_path, outtype):
    hf, model, tok = tiny_xlmr(tmp_path, "rank")
    path = convert_with_vocab(hf, tmp_path / f"rerank-{outtype}.gguf", outtype)
    lm = load_model(path, device="cpu", n_seq=2)
    assert lm.pooling == "rank"  # the file names no pooling: its classification head makes it a reranker
    inputs = _rerank_inputs(lm, QUERY, DOCS)
    assert inputs == [tok(QUERY, d)["input_ids"] for d in DOCS]  # <s> query </s></s> document </s>
    ours = rank(lm, inputs)
    theirs, _ = llama_cpp_rank(path, inputs)
    torch.testing.assert_close(ours, torch.tensor(theirs), rtol=1e-4 if outtype == "f32" else 2e-2, atol=1e-4)
    assert float(ours.max() - ours.min()) > 0.01  # scores that tell the documents apart
    if outtype == "f32":
        with torch.no_grad():
            logits = torch.cat([model(torch.tensor([i])).logits[0] for i in inputs])
        torch.testing.assert_close(ours, logits, rtol=1e-4, atol=1e-4)


def test_bert_cross_encoder_scores_equal_llama_cpp(tmp_path):
    hf, model = tiny_bert_ranker(tmp_path)
    path = convert_with_vocab(hf, tmp_path / "bert-rerank.gguf", "f32")
    lm = load_model(path, device="cpu", n_seq=2)
    assert lm.pooling == "rank"
    docs = ["hello world", "the lazy fox jumps", "zzyzx"]
    inputs = _rerank_inputs(lm, "the quick dog?", docs)
    assert all(i[0] == lm.tokenizer.cls_token_id or i[0] == lm.tokenizer.bos_token_id for i in inputs)
    ours = rank(lm, inputs)
    theirs, _ = llama_cpp_rank(path, inputs)
    torch.testing.assert_close(ours, torch.tensor(theirs), rtol=1e-4, atol=1e-4)
    assert float(ours.max() - ours.min()) > 0.01
    with torch.no_grad():  # transformers' model runs BERT's pooler, which the converter drops
        hf_scores = torch.cat([model(torch.tensor([i])).logits[0] for i in inputs])
    assert not torch.allclose(ours, hf_scores, atol=1e-3)


def test_rank_pooling_on_a_file_without_a_classifier_is_refused(tmp_path):
    hf, _, _ = tiny_xlmr(tmp_path, "mean")
    path = convert_with_vocab(hf, tmp_path / "xlmr.gguf", "f32")
    with pytest.raises(WeightError, match="cls.output.weight or cls.weight"):
        load_model(path, device="cpu", config=EngineConfig(pooling="rank"))
