"""gemma3 (text): sandwich norms around attention and the MLP, RMS-normalized q and
k heads, embeddings scaled by sqrt(hidden), GeGLU (tanh GELU), queries scaled by
query_pre_attn_scalar^-0.5, and sliding-window layers (their own rotary base)
interleaved with global ones (every 6th). The head is tied to the embedding."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...gguf_io import Keys
from ..cache import LayerCache
from ..modules import Weights
from .base import Metadata, Model, TextParams, standard_model
from .layers import MLP, Attention, Rope, RopeScaling

ARCHITECTURE = "gemma3"
CHAT_TEMPLATE_FALLBACK = "gemma"
SLIDING_WINDOW_PATTERN = 6  # every 6th layer attends globally (llama.cpp: set_swa_pattern(6))
LOCAL_ROPE_BASE = 10000.0  # llama.cpp: rope_freq_base_train_swa for Gemma 3


@dataclass
class Params(TextParams):
    window: int = 4096
    sliding: list[bool] = field(default_factory=list)  # per layer: sliding-window attention
    local_rope_theta: float = LOCAL_ROPE_BASE
    query_scale: float = 1.0
    attn_softcap: float | None = None
    final_softcap: float | None = None

    @classmethod
    def from_gguf(cls, m: Metadata) -> "Params":
        c = cls.common(m)
        n = c["n_layers"]
        # llama.cpp scales queries by 1/sqrt(head_dim), except the 27B (62 layers): 1/sqrt(hidden/heads)
        scalar = c["hidden"] // c["n_heads"] if n == 62 else c["head_dim"]
        return cls(**c, window=m.get(Keys.SLIDING_WINDOW, 4096),
                   sliding=[(i + 1) % SLIDING_WINDOW_PATTERN != 0 for i in range(n)],
                   local_rope_theta=float(m.get(Keys.ROPE_FREQ_BASE_SWA, LOCAL_ROPE_BASE)),
                   query_scale=scalar ** -0.5, attn_softcap=m.get(Keys.ATTN_LOGIT_SOFTCAPPING, None),
                   final_softcap=m.get(Keys.FINAL_LOGIT_SOFTCAPPING, None))


class Gemma3Layer:
    def __init__(self, w: Weights, i: int, p: Params, rope: Rope, ops):
        n = lambda name: w.vector(f"blk.{i}.{name}.weight", p.hidden)  # noqa: E731
        self.ops, self.eps = ops, p.eps
        self.attn_norm, self.post_attn_norm = n("attn_norm"), n("post_attention_norm")
        self.ffn_norm, self.post_ffn_norm = n("ffn_norm"), n("post_ffw_norm")
        self.attn = Attention(w, i, ops, hidden=p.hidden, n_heads=p.n_heads, n_kv_heads=p.n_kv_heads,
                              head_dim=p.head_dim, eps=p.eps, rope=rope, scale=p.query_scale,
                              window=p.window if p.sliding[i] else 0, softcap=p.attn_softcap, qk_norm=True,
                              media_both_ways=True)
        self.mlp = MLP(w, i, ops, hidden=p.hidden, ffn=p.ffn, act="gelu_tanh")

    def cache_spec(self) -> LayerCache:
        return self.attn.cache_spec()

    def __call__(self, x, batch, cache):
        norm, norm_add, eps = self.ops.rms_norm, self.ops.rms_norm_add, self.eps
        h = norm_add(self.attn(norm(x, self.attn_norm, eps), batch, cache), self.post_attn_norm, eps, x)
        return norm_add(self.mlp(norm(h, self.ffn_norm, eps)), self.post_ffn_norm, eps, h)


def build(p: Params, w: Weights, ops) -> Model:
    full = Rope.build(p.rope_theta, p.rope_dims, p.rope_scaling, context_length=p.context_length)
    local = Rope.build(p.local_rope_theta, p.rope_dims, RopeScaling(), context_length=p.context_length)
    layers = [Gemma3Layer(w, i, p, local if p.sliding[i] else full, ops) for i in range(p.n_layers)]
    return standard_model(ops, w, p, layers, embed_scale=p.hidden ** 0.5, softcap=p.final_softcap)
