"""modern-bert (ModernBERT embedders: modernbert-embed, gte-modernbert, granite-embedding R2,
as llama.cpp's converter writes them, conversion/bert.py ModernBertModel): pre-norm layers
(LayerNorms without biases; the first layer's attention input not normed), one fused q/k/v
projection, rotary positions with a base of their own in the sliding-window layers, every
third layer global from the first (the others see the tokens within half the window either
side), a gated feed-forward (act(first half of up) x second half: GeGLU, or SwiGLU where the
file's hidden_activation says silu), a final norm; a byte-level BPE vocabulary; pooled as the
file says (mean). No biases anywhere."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ...gguf_io import Keys
from ..batch import Batch
from ..modules import Weights
from .base import Model
from .layers import MLP, Attention, Rope
from .params import Metadata, RopeScaling, TextParams
from .pooling import PoolingHead

ARCHITECTURE = "modern-bert"
GLOBAL_EVERY = 3  # llama.cpp: load_swa_pattern(ml, 3, dense_first)
ACTS = {"gelu": "gelu_tanh", "silu": "silu"}  # the file's hidden_activation -> the gated product (llama.cpp: GEGLU, SWIGLU)


@dataclass
class Params(TextParams):
    window: int = 0
    sliding: list[bool] = field(default_factory=list)
    local_rope_theta: float = 10000.0
    act: str = "gelu_tanh"

    @staticmethod
    def read(m: Metadata, c: dict) -> dict:
        n = c["n_layers"]
        pattern = m.get(Keys.SLIDING_WINDOW_PATTERN, GLOBAL_EVERY)
        window = int(m.get(Keys.SLIDING_WINDOW, 0))
        if isinstance(pattern, list):
            sliding = [bool(v) for v in pattern[:n]]
        else:  # every n-th layer global, the first included
            sliding = [int(pattern) == 0 or i % int(pattern) != 0 for i in range(n)]
        act = str(m.get(Keys.HIDDEN_ACTIVATION, "gelu"))
        if act not in ACTS:
            raise ValueError(f"{m.path}: {m.key(Keys.HIDDEN_ACTIVATION)} {act!r}: expected one of {', '.join(ACTS)}")
        eps = m.get(Keys.LAYERNORM_EPS, None)
        # a ModernBertForSequenceClassification file names no pooling: its classification head ranks
        ranks = c.get("pooling") is None and (m.has_tensor("cls.output.weight") or m.has_tensor("cls.weight"))
        return dict(window=window, sliding=[s and window > 0 for s in sliding], act=ACTS[act],
                    pooling="rank" if ranks else c.get("pooling"),
                    local_rope_theta=float(m.get(Keys.ROPE_FREQ_BASE_SWA, 10000.0)),
                    eps=float(eps if eps is not None else c["eps"]))


class Norm:
    """A LayerNorm of the file without a bias (`{name}.weight`)."""

    def __init__(self, w: Weights, name: str, hidden: int, eps: float):
        self.weight, self.eps = w.vector(f"{name}.weight", hidden), eps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.float(), self.weight.shape, self.weight, None, self.eps).to(x.dtype)


class Layer:
    def __init__(self, w: Weights, i: int, p: Params, ops, rope: Rope, final: Norm | None):
        pre = f"blk.{i}."
        self.attn_norm = Norm(w, pre + "attn_norm", p.hidden, p.eps) if w.has(pre + "attn_norm.weight") else None
        self.attn = Attention(w, i, ops, hidden=p.hidden, n_heads=p.n_heads, n_kv_heads=p.n_kv_heads,
                              head_dim=p.head_dim, eps=p.eps, rope=rope, window=p.window if p.sliding[i] else 0,
                              fused_qkv=True, encoder=True)
        self.ffn_norm = Norm(w, pre + "ffn_norm", p.hidden, p.eps)
        self.mlp = MLP(w, i, ops, hidden=p.hidden, ffn=p.ffn, act=p.act, fused=True)
        self.final = final  # the model's output norm, after the last layer

    def cache_spec(self):
        return self.attn.cache_spec()

    def __call__(self, x: torch.Tensor, batch: Batch, cache) -> torch.Tensor:
        x = x + self.attn(x if self.attn_norm is None else self.attn_norm(x), batch, cache)
        x = x + self.mlp(self.ffn_norm(x))
        return x if self.final is None else self.final(x)


def build(p: Params, w: Weights, ops) -> Model:
    norm = Norm(w, "token_embd_norm", p.hidden, p.eps)
    final = Norm(w, "output_norm", p.hidden, p.eps)
    full = Rope.build(p.rope_theta, p.rope_dims, p.rope_scaling)
    local = Rope.build(p.local_rope_theta, p.rope_dims, RopeScaling())
    layers = [Layer(w, i, p, ops, local if p.sliding[i] else full, final if i == p.n_layers - 1 else None)
              for i in range(p.n_layers)]

    def inputs(x: torch.Tensor, batch: Batch) -> None:
        x.copy_(norm(x))

    return Model(ops, w.embedding("token_embd.weight", p.vocab_size, p.hidden), layers, None, None, p.eps,
                 p.vocab_size, before_layers=inputs, pool=PoolingHead.build(p, w), both_ways=True)
