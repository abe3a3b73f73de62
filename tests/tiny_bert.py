"""A tiny BERT sentence embedder as a checkpoint folder the way users' models are: a
random transformers BertModel, a WordPiece tokenizer of a small vocabulary, and
sentence-transformers' pooling config (mean or CLS), for llama.cpp's converter to write
as users' files are written (conversion/bert.py)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import BertConfig, BertModel, BertTokenizerFast

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world", "cafe", "run", "##s",
         "##ing", "##ed", "!", "?", ",", ".", "'"]


def tiny_bert(folder: Path, pooling: str = "mean", seed: int = 0) -> tuple[Path, BertModel]:
    """The checkpoint folder and the model it holds."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + letters + ["##" + c for c in letters] + WORDS
    vocab = list(dict.fromkeys(vocab))
    vocab += [f"w{i}" for i in range(len(vocab), 128)]
    folder.mkdir(parents=True, exist_ok=True)
    BertTokenizerFast(vocab={w: i for i, w in enumerate(vocab)}, do_lower_case=True).save_pretrained(folder)
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=128, type_vocab_size=2)
    torch.manual_seed(seed)
    model = BertModel(cfg, add_pooling_layer=False).eval()
    model.save_pretrained(folder)
    sentence_transformers_pooling(folder, 64, pooling)
    return folder, model


def sentence_transformers_pooling(folder: Path, width: int, pooling: str) -> None:
    """sentence-transformers' modules.json and pooling config (mean or CLS), from which the
    converter writes the file's pooling type."""
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": width, "pooling_mode_mean_tokens": pooling == "mean",
        "pooling_mode_cls_token": pooling == "cls"}))


def wordpiece_folder(folder: Path, seed: int = 0) -> tuple[Path, int]:
    """`folder` with tiny_bert's WordPiece tokenizer and mean pooling only, for a checkpoint of
    another layout to be written beside them (nomic-bert's, jina-bert-v2's), and the
    vocabulary's size."""
    tiny_bert(folder, "mean", seed=seed)
    for f in ("config.json", "model.safetensors"):
        (folder / f).unlink()
    return folder, len(json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"])
