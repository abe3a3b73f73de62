"""bert (BERT encoders as llama.cpp's converter writes them, conversion/bert.py BertModel and
XLMRobertaModel: BGE, all-MiniLM and the other sentence-transformers embedders of that
family; bge-m3 and multilingual-e5 (XLM-RoBERTa, its position table cut past the padding
offset by the converter, a SentencePiece Unigram vocabulary); and their cross-encoders,
bge-reranker and the BertForSequenceClassification ones, reranking through their
classification head, models.pooling). Each
token's input is its embedding plus its position's (`position_embd`) and the first token
type's (`token_types`; llama.cpp passes type 0 throughout), through a LayerNorm
(`token_embd_norm`). Every layer is post-norm: x = LN(x + attn(x)) (`attn_output_norm`),
then x = LN(x + down(GELU(up(x)))) (`layer_output_norm`); q/k/v/output and the
feed-forward carry biases; no rotary; every token sees every other. No final norm: the
last layer's output is pooled as the file says (mean, CLS)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...gguf_io import Keys
from ..batch import Batch
from ..modules import Weights
from .base import Model
from .layers import Attention, Rope
from .params import Metadata, TextParams
from .pooling import PoolingHead

ARCHITECTURE = "bert"


@dataclass
class Params(TextParams):
    @staticmethod
    def read(m: Metadata, c: dict) -> dict:
        # a cross-encoder (BertForSequenceClassification, XLMRobertaForSequenceClassification) names no
        # pooling (llama-server is told --reranking): its classification head makes it a reranker
        ranks = c.get("pooling") is None and (m.has_tensor("cls.output.weight") or m.has_tensor("cls.weight"))
        return dict(eps=float(m.get(Keys.LAYERNORM_EPS, 1e-12)), pooling="rank" if ranks else c.get("pooling"))


class Norm:
    """A LayerNorm of the file (`{name}.weight`, `{name}.bias`)."""

    def __init__(self, w: Weights, name: str, hidden: int, eps: float):
        self.weight, self.bias, self.eps = w.vector(f"{name}.weight", hidden), w.vector(f"{name}.bias", hidden), eps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.float(), self.weight.shape, self.weight, self.bias, self.eps).to(x.dtype)


class Layer:
    def __init__(self, w: Weights, i: int, p: Params, ops):
        pre = f"blk.{i}."
        self.attn = Attention(w, i, ops, hidden=p.hidden, n_heads=p.n_heads, n_kv_heads=p.n_kv_heads,
                              head_dim=p.head_dim, eps=p.eps, rope=Rope.none(), encoder=True)
        self.attn_norm = Norm(w, pre + "attn_output_norm", p.hidden, p.eps)
        self.up = w.linear(pre + "ffn_up.weight", p.ffn, p.hidden, bias=pre + "ffn_up.bias")
        self.down = w.linear(pre + "ffn_down.weight", p.hidden, p.ffn, bias=pre + "ffn_down.bias")
        self.out_norm = Norm(w, pre + "layer_output_norm", p.hidden, p.eps)

    def cache_spec(self):
        return self.attn.cache_spec()

    def __call__(self, x: torch.Tensor, batch: Batch, cache) -> torch.Tensor:
        x = self.attn_norm(x + self.attn(x, batch, cache))
        return self.out_norm(x + self.down(F.gelu(self.up(x))))


def build(p: Params, w: Weights, ops) -> Model:
    positions = w.dense("position_embd.weight", (p.context_length, p.hidden))
    first_type = w.dense("token_types.weight", (w.info("token_types.weight").shape[0], p.hidden))[0]
    norm = Norm(w, "token_embd_norm", p.hidden, p.eps)

    def inputs(x: torch.Tensor, batch: Batch) -> None:  # the position's and type's embeddings, normalized
        if int(batch.positions.max()) >= p.context_length:
            raise ValueError(f"a BERT input holds at most {p.context_length} tokens (its position table)")
        x.copy_(norm(x + positions[batch.positions].to(x.dtype) + first_type.to(x.dtype)))

    return Model(ops, w.embedding("token_embd.weight", p.vocab_size, p.hidden), [Layer(w, i, p, ops)
                 for i in range(p.n_layers)], None, None, p.eps, p.vocab_size, before_layers=inputs,
                 pool=PoolingHead.build(p, w), both_ways=True)
