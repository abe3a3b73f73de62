"""nomic-bert (nomic-embed-text v1 / v1.5, Ollama's most pulled embedder, as llama.cpp's
converter writes it, conversion/bert.py NomicBertModel): a BERT encoder without a position
table, rotary positions instead (NeoX style, every dimension); one fused q/k/v projection
without biases; a SwiGLU feed-forward (down(silu(gate(x)) * up(x)), the checkpoint's fc12
the gate and fc11 the up); post-norm layers and the input's LayerNorm as BERT's; every
token sees every other; pooled as the file says (mean for nomic-embed-text)."""

from __future__ import annotations

import torch

from ..batch import Batch
from ..modules import Weights
from .base import Model
from .bert import Norm
from .bert import Params as BertParams
from .layers import MLP, Attention, Rope
from .pooling import PoolingHead

ARCHITECTURE = "nomic-bert"


class Params(BertParams):
    pass


class Layer:
    def __init__(self, w: Weights, i: int, p: Params, ops, rope: Rope):
        pre = f"blk.{i}."
        self.attn = Attention(w, i, ops, hidden=p.hidden, n_heads=p.n_heads, n_kv_heads=p.n_kv_heads,
                              head_dim=p.head_dim, eps=p.eps, rope=rope, fused_qkv=True, encoder=True)
        self.attn_norm = Norm(w, pre + "attn_output_norm", p.hidden, p.eps)
        self.mlp = MLP(w, i, ops, hidden=p.hidden, ffn=p.ffn, act="silu")
        self.out_norm = Norm(w, pre + "layer_output_norm", p.hidden, p.eps)

    def cache_spec(self):
        return self.attn.cache_spec()

    def __call__(self, x: torch.Tensor, batch: Batch, cache) -> torch.Tensor:
        x = self.attn_norm(x + self.attn(x, batch, cache))
        return self.out_norm(x + self.mlp(x))


def build(p: Params, w: Weights, ops) -> Model:
    first_type = w.dense("token_types.weight", (w.info("token_types.weight").shape[0], p.hidden))[0] \
        if w.has("token_types.weight") else None
    norm = Norm(w, "token_embd_norm", p.hidden, p.eps)
    rope = Rope.build(p.rope_theta, p.rope_dims, p.rope_scaling)

    def inputs(x: torch.Tensor, batch: Batch) -> None:  # the first token type's embedding, normalized
        x.copy_(norm(x + first_type.to(x.dtype)) if first_type is not None else norm(x))

    return Model(ops, w.embedding("token_embd.weight", p.vocab_size, p.hidden),
                 [Layer(w, i, p, ops, rope) for i in range(p.n_layers)], None, None, p.eps, p.vocab_size,
                 before_layers=inputs, pool=PoolingHead.build(p, w), both_ways=True)
