"""nemotron_h (NVIDIA's dense Nemotron-H: Mamba-2, attention and MLP layers, as llama.cpp's
converter writes them, conversion/nemotron.py NemotronHModel): every layer is one of the
three, x + part(rms_norm(x)): a Mamba-2 mixer as Granite 4's (granitehybrid.Mamba2: groups,
a biased causal conv, D skip, the grouped gated norm), attention without positions (no
rotary) whose layers the file marks with a key-value head count, or an MLP (down(relu(up(x))
^2)) where the file gives a feed-forward length; a final norm and the head."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...gguf_io import Keys
from ..batch import Batch
from ..cache import nothing
from ..modules import Weights
from .base import Model, output_head
from .granitehybrid import Mamba2
from .layers import Attention, Rope
from .params import Metadata, TextParams, kv_heads_per_layer, per_layer

ARCHITECTURE = "nemotron_h"


@dataclass
class Params(TextParams):
    kinds: list[str] = field(default_factory=list)  # per layer: "mamba", "attention" or "mlp"
    ffns: list[int] = field(default_factory=list)
    conv_kernel: int = 4
    state: int = 128
    groups: int = 1
    inner: int = 0
    ssm_heads: int = 0

    @staticmethod
    def read(m: Metadata, c: dict) -> dict:
        n = c["n_layers"]
        kv = kv_heads_per_layer(m, c)
        ffns = [int(f) for f in per_layer(m, Keys.FEED_FORWARD_LENGTH, c["ffn"], n)]
        kinds = ["attention" if kv[i] else "mlp" if ffns[i] else "mamba" for i in range(n)]
        attn = sorted({h for h in kv if h})
        if len(attn) > 1:
            raise ValueError(f"{m.path}: {m.key(Keys.HEAD_COUNT_KV)} {kv} is not one count for the attention layers")
        inner, heads, groups = m.get(Keys.SSM_INNER_SIZE), m.get(Keys.SSM_TIME_STEP_RANK), m.get(Keys.SSM_GROUP_COUNT)
        if inner % heads or heads % groups:
            raise ValueError(f"{m.path}: Mamba-2 inner size {inner}, {heads} heads and {groups} groups do not divide")
        return dict(kinds=kinds, ffns=ffns, ffn=max(ffns), n_kv_heads=attn[0] if attn else c["n_heads"],
                    conv_kernel=m.get(Keys.SSM_CONV_KERNEL), state=m.get(Keys.SSM_STATE_SIZE), groups=groups,
                    inner=inner, ssm_heads=heads)


class ReluSquared:
    """down(relu(up(x))^2), the biases where the file has them."""

    def __init__(self, w: Weights, i: int, hidden: int, ffn: int):
        pre = f"blk.{i}."
        self.up = w.linear(pre + "ffn_up.weight", ffn, hidden, bias=pre + "ffn_up.bias")
        self.down = w.linear(pre + "ffn_down.weight", hidden, ffn, bias=pre + "ffn_down.bias")

    def cache_spec(self):
        return nothing()

    def __call__(self, x: torch.Tensor, batch: Batch, cache) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)).square())


class Layer:
    def __init__(self, w: Weights, i: int, p: Params, ops):
        self.ops, self.eps = ops, p.eps
        self.norm = w.vector(f"blk.{i}.attn_norm.weight", p.hidden)
        kind = p.kinds[i]
        if kind == "attention":
            self.part = Attention(w, i, ops, hidden=p.hidden, n_heads=p.n_heads, n_kv_heads=p.n_kv_heads,
                                  head_dim=p.head_dim, eps=p.eps, rope=Rope.none())
        elif kind == "mlp":
            self.part = ReluSquared(w, i, p.hidden, p.ffns[i])
        else:
            self.part = Mamba2(w, i, p, ops)

    def cache_spec(self):
        return self.part.cache_spec()

    def __call__(self, x: torch.Tensor, batch: Batch, cache) -> torch.Tensor:
        return x + self.part(self.ops.rms_norm(x, self.norm, self.eps), batch, cache)


def build(p: Params, w: Weights, ops) -> Model:
    return Model(ops, w.embedding("token_embd.weight", p.vocab_size, p.hidden),
                 [Layer(w, i, p, ops) for i in range(p.n_layers)], w.vector("output_norm.weight", p.hidden),
                 output_head(w, p.vocab_size, p.hidden), p.eps, p.vocab_size)
