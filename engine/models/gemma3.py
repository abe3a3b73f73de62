"""Gemma 3 (text): sandwich norms around attention and the MLP, RMS-normalized q and
k heads, embeddings scaled by sqrt(hidden), GeGLU (tanh GELU), queries scaled by
query_pre_attn_scalar^-0.5, and sliding-window layers (their own rotary base)
interleaved with global ones. The head is tied to the embedding."""

from __future__ import annotations

from dataclasses import dataclass

from ..cache import LayerCache
from ..modules import Weights
from .base import MLP, Attention, Model, Rope, output_head, rope_from_config


@dataclass
class Gemma3Params:
    vocab_size: int
    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    eps: float
    window: int
    sliding: list[bool]  # per layer: sliding-window attention
    query_scale: float
    attn_softcap: float | None
    final_softcap: float | None

    @classmethod
    def from_config(cls, config) -> "Gemma3Params":
        return cls(
            vocab_size=config.vocab_size, hidden=config.hidden_size, n_layers=config.num_hidden_layers,
            n_heads=config.num_attention_heads, n_kv_heads=config.num_key_value_heads, head_dim=config.head_dim,
            ffn=config.intermediate_size, eps=config.rms_norm_eps, window=config.sliding_window,
            sliding=[t == "sliding_attention" for t in config.layer_types],
            query_scale=config.query_pre_attn_scalar ** -0.5,
            attn_softcap=config.attn_logit_softcapping, final_softcap=config.final_logit_softcapping,
        )


class Gemma3Layer:
    def __init__(self, w: Weights, i: int, p: Gemma3Params, rope: Rope, ops):
        n = lambda name: w.vector(f"blk.{i}.{name}.weight", p.hidden)  # noqa: E731
        self.ops, self.eps = ops, p.eps
        self.attn_norm, self.post_attn_norm = n("attn_norm"), n("post_attention_norm")
        self.ffn_norm, self.post_ffn_norm = n("ffn_norm"), n("post_ffw_norm")
        self.attn = Attention(w, i, ops, hidden=p.hidden, n_heads=p.n_heads, n_kv_heads=p.n_kv_heads,
                              head_dim=p.head_dim, eps=p.eps, rope=rope, scale=p.query_scale,
                              window=p.window if p.sliding[i] else 0, softcap=p.attn_softcap, qk_norm=True)
        self.mlp = MLP(w, i, ops, hidden=p.hidden, ffn=p.ffn, act="gelu_tanh")

    def cache_spec(self) -> LayerCache:
        return self.attn.cache_spec()

    def __call__(self, x, batch, cache):
        norm, norm_add, eps = self.ops.rms_norm, self.ops.rms_norm_add, self.eps
        h = norm_add(self.attn(norm(x, self.attn_norm, eps), batch, cache), self.post_attn_norm, eps, x)
        return norm_add(self.mlp(norm(h, self.ffn_norm, eps)), self.post_ffn_norm, eps, h)


def build(arch: str, config, w: Weights, ops) -> Model:
    p = Gemma3Params.from_config(config)
    ropes = {kind: rope_from_config(config, config.rope_parameters[kind], p.head_dim, True, layer_type=kind)
             for kind in ("sliding_attention", "full_attention")}
    layers = [Gemma3Layer(w, i, p, ropes["sliding_attention" if p.sliding[i] else "full_attention"], ops)
              for i in range(p.n_layers)]
    embed = w.embedding("token_embd.weight", p.vocab_size, p.hidden, scale=p.hidden ** 0.5)
    return Model(ops, embed, layers, w.vector("output_norm.weight", p.hidden), output_head(w, p.vocab_size, p.hidden),
                 p.eps, p.vocab_size, softcap=p.final_softcap)
