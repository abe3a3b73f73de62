"""olmo2 (OLMo 2, and OLMo 3 files, which llama.cpp also writes as `olmo2`): no norms
before attention and the MLP, RMS norms after them instead (post_attention_norm,
post_ffw_norm, added to the residual), q and k RMS-normalized over the whole
projection (all heads at once, not per head), NeoX rotary. OLMo 3 adds sliding-window
layers (`attention.sliding_window_pattern`, else every fourth layer global) whose
rotary has no scaling."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...gguf_io import Keys
from ..cache import LayerCache
from ..modules import Weights
from .base import Metadata, Model, TextParams, standard_model
from .layers import MLP, Attention, Rope, RopeScaling

ARCHITECTURE = "olmo2"
GLOBAL_EVERY = 4  # llama.cpp's default pattern: every 4th layer global


@dataclass
class Params(TextParams):
    window: int = 0  # 0: no sliding-window layers (OLMo 2)
    sliding: list[bool] = field(default_factory=list)
    local_rope_theta: float = 0.0

    @classmethod
    def from_gguf(cls, m: Metadata) -> "Params":
        c = cls.common(m)
        n = c["n_layers"]
        window = m.get(Keys.SLIDING_WINDOW, 0) or 0
        pattern = m.get(Keys.SLIDING_WINDOW_PATTERN, None)
        if not window:
            sliding = [False] * n
        elif isinstance(pattern, list) and len(pattern) >= n:
            sliding = [bool(s) for s in pattern[:n]]
        else:
            sliding = [(i + 1) % GLOBAL_EVERY != 0 for i in range(n)]
        return cls(**c, window=window, sliding=sliding,
                   local_rope_theta=float(m.get(Keys.ROPE_FREQ_BASE_SWA, c["rope_theta"])))


class Olmo2Layer:
    def __init__(self, w: Weights, i: int, p: Params, rope: Rope, ops):
        n = lambda name, size=p.hidden: w.vector(f"blk.{i}.{name}.weight", size)  # noqa: E731
        self.ops, self.eps = ops, p.eps
        self.attn = Attention(w, i, ops, hidden=p.hidden, n_heads=p.n_heads, n_kv_heads=p.n_kv_heads,
                              head_dim=p.head_dim, eps=p.eps, rope=rope, scale=p.head_dim ** -0.5,
                              window=p.window if p.sliding[i] else 0)
        self.q_width, self.k_width = p.n_heads * p.head_dim, p.n_kv_heads * p.head_dim
        self.q_norm, self.k_norm = n("attn_q_norm", self.q_width), n("attn_k_norm", self.k_width)
        self.post_attn_norm, self.post_ffn_norm = n("post_attention_norm"), n("post_ffw_norm")
        self.mlp = MLP(w, i, ops, hidden=p.hidden, ffn=p.ffn, act="silu")

    def cache_spec(self) -> LayerCache:
        return self.attn.cache_spec()

    def attention(self, x, batch, cache):
        qkv = self.attn.qkv(x)
        qw, kw, norm = self.q_width, self.k_width, self.ops.rms_norm
        q, k = norm(qkv[:, :qw], self.q_norm, self.eps), norm(qkv[:, qw:qw + kw], self.k_norm, self.eps)
        qkv = torch.cat([q, k, qkv[:, qw + kw:]], dim=-1)
        return self.attn.o(self.ops.self_attention(qkv, self.attn.spec, batch, cache))

    def __call__(self, x, batch, cache):
        h = self.ops.rms_norm_add(self.attention(x, batch, cache), self.post_attn_norm, self.eps, x)
        return self.ops.rms_norm_add(self.mlp(h), self.post_ffn_norm, self.eps, h)


def build(p: Params, w: Weights, ops) -> Model:
    full = Rope.build(p.rope_theta, p.rope_dims, p.rope_scaling, context_length=p.context_length)
    local = Rope.build(p.local_rope_theta, p.rope_dims, RopeScaling(), context_length=p.context_length)
    layers = [Olmo2Layer(w, i, p, local if p.sliding[i] else full, ops) for i in range(p.n_layers)]
    return standard_model(ops, w, p, layers)
