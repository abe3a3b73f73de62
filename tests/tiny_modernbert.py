"""A tiny ModernBERT embedder as users' checkpoints are laid out (ModernBERT-embed, gte-modernbert,
granite-embedding R2): a random transformers ModernBertModel with alternating global and
sliding-window layers, a byte-level BPE vocabulary trained here, sentence-transformers' mean
pooling; for llama.cpp's converter (conversion/bert.py ModernBertModel)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import ModernBertConfig, ModernBertForSequenceClassification, ModernBertModel, PreTrainedTokenizerFast

from tiny_bert import sentence_transformers_pooling
from tiny_xlmr import CORPUS

SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]


def bpe_tokenizer(folder: Path, vocab_size: int = 300) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer of the corpus, [CLS] text [SEP], saved in `folder`."""
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS.splitlines() * 5, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                       special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
                                   unk_token="[UNK]", mask_token="[MASK]")
    fast.save_pretrained(folder)
    return fast


def tiny_modernbert(folder: Path, seed: int = 0, rank: str | None = None):
    """The folder, the model and the tokenizer: a mean-pooled embedder, or with `rank` ("cls",
    "mean": its classifier pooling) a ModernBertForSequenceClassification of one label
    (gte-reranker-modernbert's shape)."""
    hf = folder / "hf"
    hf.mkdir(parents=True, exist_ok=True)
    tok = bpe_tokenizer(hf)
    cfg = ModernBertConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                           intermediate_size=96, local_attention=8, global_attn_every_n_layers=3,
                           max_position_embeddings=256, pad_token_id=0, cls_token_id=1, sep_token_id=2,
                           bos_token_id=1, eos_token_id=2, num_labels=1, classifier_pooling=rank or "cls")
    torch.manual_seed(seed)
    model = (ModernBertForSequenceClassification if rank else ModernBertModel)(cfg).eval()
    with torch.no_grad():  # weights of a trained model's spread, not the initializer's near-zero ones
        for name, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if name.endswith("norm.weight") else 0.2 * torch.randn_like(p))
    model.save_pretrained(hf)
    # the name the converter writes as layer_norm_epsilon, which llama.cpp's loader needs (with only
    # transformers' norm_eps it writes an RMS epsilon and llama.cpp refuses the file)
    config = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**config, "layer_norm_eps": config["norm_eps"]}))
    if rank:
        return hf, model, tok
    sentence_transformers_pooling(hf, 64, "mean")
    return hf, model, tok
