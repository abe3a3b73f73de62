"""Tiny XLM-RoBERTa checkpoints as users' are laid out (bge-m3 and multilingual-e5 embedders,
bge-reranker cross-encoders) and a tiny BERT cross-encoder: random transformers models, the
XLM-R ones with a SentencePiece Unigram vocabulary trained here on a few multilingual lines
(NFKC normalization, as XLM-R's), for llama.cpp's converter to write (conversion/bert.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import sentencepiece
import torch
from transformers import (AutoTokenizer, BertConfig, BertForSequenceClassification, XLMRobertaConfig,
                          XLMRobertaForSequenceClassification, XLMRobertaModel)

from tiny_bert import sentence_transformers_pooling, tiny_bert

CORPUS = """The quick brown fox jumps over the lazy dog. Hello world! Café au lait, naïve résumé.
Ein schneller brauner Fuchs springt über den faulen Hund. Le renard brun rapide saute par-dessus le chien.
What is the capital of France? Paris is the capital of France. Berlin is the capital of Germany.
Numbers 12345 and symbols #@! and ｆｕｌｌ-ｗｉｄｔｈ １２３ characters."""


def spm_model(folder: Path) -> Path:
    """A Unigram SentencePiece model of 90 pieces (XLM-R's file name)."""
    folder.mkdir(parents=True, exist_ok=True)
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join([CORPUS] * 20))
    sentencepiece.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(folder / "sp"), vocab_size=90,
                                             model_type="unigram", character_coverage=1.0,
                                             normalization_rule_name="nmt_nfkc", minloglevel=2)
    corpus.unlink()
    return folder / "sp.model"


def tiny_xlmr(folder: Path, head: str = "mean", seed: int = 0):
    """The checkpoint folder and its model: an XLMRobertaModel with sentence-transformers'
    pooling `head` (mean, cls), or with head="rank" an XLMRobertaForSequenceClassification
    of one label (bge-reranker's shape)."""
    hf = folder / "hf"
    hf.mkdir(parents=True, exist_ok=True)
    shutil.copy(spm_model(folder / "spm"), hf / "sentencepiece.bpe.model")
    (hf / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "XLMRobertaTokenizer"}))
    tok = AutoTokenizer.from_pretrained(hf)
    tok.save_pretrained(hf)  # tokenizer.json and the config beside the SentencePiece model
    cfg = XLMRobertaConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=128, max_position_embeddings=130, type_vocab_size=1, pad_token_id=1,
                           num_labels=1)
    torch.manual_seed(seed)
    if head == "rank":
        model = XLMRobertaForSequenceClassification(cfg).eval()
        with torch.no_grad():  # a head whose scores differ from one document to the next
            torch.nn.init.normal_(model.classifier.dense.weight, std=0.5)
            torch.nn.init.normal_(model.classifier.out_proj.weight, std=1.0)
    else:
        model = XLMRobertaModel(cfg, add_pooling_layer=False).eval()
        sentence_transformers_pooling(hf, 64, head)
    model.save_pretrained(hf)
    return hf, model, tok


def tiny_bert_ranker(folder: Path, seed: int = 0):
    """A BertForSequenceClassification of one label over tiny_bert's WordPiece vocabulary
    (the ms-marco cross-encoders' shape): the folder and the model."""
    hf, _ = tiny_bert(folder / "base", seed=seed)
    (hf / "modules.json").unlink()  # a cross-encoder names no pooling
    shutil.rmtree(hf / "1_Pooling")
    cfg = BertConfig.from_pretrained(hf)
    cfg.num_labels = 1
    torch.manual_seed(seed)
    model = BertForSequenceClassification(cfg).eval()
    with torch.no_grad():
        torch.nn.init.normal_(model.classifier.weight, std=1.0)
    model.save_pretrained(hf)
    return hf, model
