"""llama (also Mistral files, which llama.cpp writes as `llama`): x → x + attn(norm(x))
→ h + mlp(norm(h)). Its q/k rows are in llama.cpp's interleaved order (the converter
permutes them), so its rotary pairs adjacent dimensions (GPT-J style); a rope_freqs
tensor (Llama 3.1) divides the frequencies.

The llama-family files (qwen2, qwen3, qwen3moe, phi3) reuse `LlamaLayer` and
`build` with their own switches."""

from __future__ import annotations

from dataclasses import dataclass

from ...gguf_io import Keys
from ..cache import LayerCache
from ..modules import Weights
from .base import Metadata, Model, TextParams, standard_model
from .layers import Attention, Rope, feed_forward

ARCHITECTURE = "llama"


@dataclass
class Params(TextParams):
    neox: bool = False  # rotary pairing: NeoX halves, or GPT-J pairs (llama.cpp's permuted q/k)
    qk_norm: bool = False  # RMS norms on each q and k head
    fused: bool = False  # one attn_qkv and one gate+up matrix (Phi-3)
    window: int = 0  # sliding-window attention in every layer (0: none)
    n_experts: int = 0  # > 0: routed experts in every layer
    n_experts_used: int = 0
    expert_ffn: int = 0
    norm_topk: bool = True


def experts(m: Metadata) -> dict:
    """The routed experts' fields, for the family's MoE members."""
    return dict(n_experts=m.get(Keys.EXPERT_COUNT), n_experts_used=m.get(Keys.EXPERT_USED_COUNT),
                expert_ffn=m.get(Keys.EXPERT_FEED_FORWARD_LENGTH))


class LlamaLayer:
    def __init__(self, w: Weights, i: int, p: Params, rope: Rope, ops):
        self.ops, self.eps = ops, p.eps
        self.attn_norm = w.vector(f"blk.{i}.attn_norm.weight", p.hidden)
        self.ffn_norm = w.vector(f"blk.{i}.ffn_norm.weight", p.hidden)
        self.attn = Attention(w, i, ops, hidden=p.hidden, n_heads=p.n_heads, n_kv_heads=p.n_kv_heads,
                              head_dim=p.head_dim, eps=p.eps, rope=rope, scale=p.head_dim ** -0.5,
                              window=p.window, qk_norm=p.qk_norm, fused_qkv=p.fused)
        self.mlp = feed_forward(w, i, ops, hidden=p.hidden, ffn=p.ffn, n_experts=p.n_experts, n_used=p.n_experts_used,
                                expert_ffn=p.expert_ffn, norm_topk=p.norm_topk, fused=p.fused)

    def cache_spec(self) -> LayerCache:
        return self.attn.cache_spec()

    def __call__(self, x, batch, cache):
        h = x + self.attn(self.ops.rms_norm(x, self.attn_norm, self.eps), batch, cache)
        return h + self.mlp(self.ops.rms_norm(h, self.ffn_norm, self.eps))


def rope(p: Params, w: Weights) -> Rope:
    """The rotary of every layer: the file's base, scaling and rope_freqs factors."""
    factors = w.vector("rope_freqs.weight") if w.has("rope_freqs.weight") else None
    return Rope.build(p.rope_theta, p.rope_dims, p.rope_scaling, neox=p.neox, context_length=p.context_length,
                      freq_factors=factors)


def build(p: Params, w: Weights, ops) -> Model:
    r = rope(p, w)
    return standard_model(ops, w, p, [LlamaLayer(w, i, p, r, ops) for i in range(p.n_layers)])
