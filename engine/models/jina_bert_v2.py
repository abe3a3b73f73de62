"""jina-bert-v2 (jina-embeddings-v2 base/small, as llama.cpp's converter writes them,
conversion/bert.py JinaBertV2Model): BERT's post-norm encoder without a position table:
ALiBi instead (each head's scores less its slope times the keys' distance either way,
slopes from a maximum bias of 8 as llama.cpp's); q/k/v with biases; a GeGLU feed-forward
(gelu(first half of up) x second half, or gelu(gate) x up where the file has a gate) with
a biased down projection; pooled as the file says (mean). Files with attention q/k norms
(jina-embeddings-v2-base-code) are refused."""

from __future__ import annotations

import torch

from ..batch import Batch
from ..errors import WeightError
from ..modules import Weights
from .base import Model
from .bert import Norm
from .bert import Params as BertParams
from .layers import Attention, Rope
from .pooling import PoolingHead

ARCHITECTURE = "jina-bert-v2"
MAX_ALIBI_BIAS = 8.0  # llama.cpp: hparams.f_max_alibi_bias for this architecture


class Params(BertParams):
    pass


class FeedForward:
    """down(gelu(gate) * up) + bias, gate and up one fused matrix (its first half the gate)
    or two."""

    def __init__(self, w: Weights, i: int, p: Params, ops):
        pre = f"blk.{i}."
        up_rows = w.info(pre + "ffn_up.weight").shape[0]
        self.ops, self.ffn, self.fused = ops, p.ffn, not w.has(pre + "ffn_gate.weight")
        if self.fused and up_rows != 2 * p.ffn:
            raise WeightError(f"{w.reader.path}: {pre}ffn_up.weight has {up_rows} rows: a fused gate and up of "
                              f"{2 * p.ffn} expected (or a separate ffn_gate)")
        self.up = w.linear(pre + "ffn_up.weight", up_rows, p.hidden, bias=pre + "ffn_up.bias")
        self.gate = None if self.fused else w.linear(pre + "ffn_gate.weight", p.ffn, p.hidden)
        self.down = w.linear(pre + "ffn_down.weight", p.hidden, p.ffn, bias=pre + "ffn_down.bias")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return self.down(self.ops.gated_mul(self.up(x), self.ffn, "gelu_tanh"))
        return self.down(self.ops.act_mul(self.gate(x), self.up(x), "gelu_tanh"))


class Layer:
    def __init__(self, w: Weights, i: int, p: Params, ops):
        pre = f"blk.{i}."
        if w.has(pre + "attn_q_norm.weight") or w.has(pre + "attn_k_norm.weight"):
            raise WeightError(f"{w.reader.path}: jina-bert-v2 with attention q/k norms (the code models) is not "
                              "supported")
        self.attn = Attention(w, i, ops, hidden=p.hidden, n_heads=p.n_heads, n_kv_heads=p.n_kv_heads,
                              head_dim=p.head_dim, eps=p.eps, rope=Rope.none(), encoder=True,
                              alibi_max_bias=MAX_ALIBI_BIAS)
        self.attn_norm = Norm(w, pre + "attn_output_norm", p.hidden, p.eps)
        self.attn_norm_2 = Norm(w, pre + "attn_norm_2", p.hidden, p.eps) if w.has(pre + "attn_norm_2.weight") else None
        self.ffn = FeedForward(w, i, p, ops)
        self.out_norm = Norm(w, pre + "layer_output_norm", p.hidden, p.eps)

    def cache_spec(self):
        return self.attn.cache_spec()

    def __call__(self, x: torch.Tensor, batch: Batch, cache) -> torch.Tensor:
        h = self.attn_norm(x + self.attn(x, batch, cache))
        if self.attn_norm_2 is not None:  # the layer input added again, normed (llama.cpp's attn_norm_2)
            h = self.attn_norm_2(h + x)
        return self.out_norm(h + self.ffn(h))


def build(p: Params, w: Weights, ops) -> Model:
    first_type = w.dense("token_types.weight", (w.info("token_types.weight").shape[0], p.hidden))[0]
    norm = Norm(w, "token_embd_norm", p.hidden, p.eps)

    def inputs(x: torch.Tensor, batch: Batch) -> None:  # the first token type's embedding, normalized
        x.copy_(norm(x + first_type.to(x.dtype)))

    return Model(ops, w.embedding("token_embd.weight", p.vocab_size, p.hidden),
                 [Layer(w, i, p, ops) for i in range(p.n_layers)], None, None, p.eps, p.vocab_size,
                 before_layers=inputs, pool=PoolingHead.build(p, w), both_ways=True)
