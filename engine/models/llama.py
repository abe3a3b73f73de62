"""llama (also Mistral files, which llama.cpp writes as `llama`): x → x + attn(norm(x))
→ h + mlp(norm(h)). Its q/k rows are in llama.cpp's interleaved order (the converter
permutes them), so its rotary pairs adjacent dimensions (GPT-J style); a rope_freqs
tensor (Llama 3.1) divides the frequencies.

The llama-family files (qwen2, qwen3, qwen3moe, phi3, smollm3, mistral3) are this
`Params` with their own switches and fields, and this `build`."""

from __future__ import annotations

from dataclasses import dataclass

from ...gguf_io import Keys
from ..modules import Weights
from .base import Model, standard_model
from .layers import Attention, Block, Rope, feed_forward
from .params import Metadata, TextParams

ARCHITECTURE = "llama"


@dataclass
class Params(TextParams):
    neox: bool = False  # rotary pairing: NeoX halves, or GPT-J pairs (llama.cpp's permuted q/k)
    qk_norm: str | None = None  # "head": RMS norms on each q and k head
    fused: bool = False  # one attn_qkv and one gate+up matrix (Phi-3)
    window: int = 0  # sliding-window attention in every layer (0: none)
    no_rope_every: int = 0  # > 0: layers i with (i + 1) % no_rope_every == 0 have no rotary (SmolLM3's NoPE)
    temperature_scale: float = 0.0  # > 0: the queries' attention temperature (Mistral 3)
    temperature_length: int = 0  # positions per step of the temperature (the original context)
    n_experts: int = 0  # > 0: routed experts in every layer
    n_experts_used: int = 0
    expert_ffn: int = 0
    norm_topk: bool = True


def experts(m: Metadata, c: dict) -> dict:
    """The routed experts' fields, for the family's MoE members."""
    return dict(n_experts=m.get(Keys.EXPERT_COUNT), n_experts_used=m.get(Keys.EXPERT_USED_COUNT),
                expert_ffn=m.get(Keys.EXPERT_FEED_FORWARD_LENGTH))


def layer(w: Weights, i: int, p: Params, rope: Rope, ops) -> Block:
    attn = Attention(w, i, ops, hidden=p.hidden, n_heads=p.n_heads, n_kv_heads=p.n_kv_heads, head_dim=p.head_dim,
                     eps=p.eps, rope=rope, window=p.window, qk_norm=p.qk_norm, fused_qkv=p.fused,
                     temperature=(p.temperature_scale, p.temperature_length))
    mlp = feed_forward(w, i, ops, hidden=p.hidden, ffn=p.ffn, n_experts=p.n_experts, n_used=p.n_experts_used,
                       expert_ffn=p.expert_ffn, norm_topk=p.norm_topk, fused=p.fused)
    return Block(w, i, ops, hidden=p.hidden, eps=p.eps, mixer=attn, mlp=mlp)


def build(p: Params, w: Weights, ops) -> Model:
    """Every layer's rotary: the file's base, scaling and rope_freqs factors (none in NoPE layers)."""
    factors = w.vector("rope_freqs.weight") if w.has("rope_freqs.weight") else None
    rope = Rope.build(p.rope_theta, p.rope_dims, p.rope_scaling, neox=p.neox, context_length=p.context_length,
                      freq_factors=factors)
    every, none = p.no_rope_every, Rope.none()
    layers = [layer(w, i, p, none if every and (i + 1) % every == 0 else rope, ops) for i in range(p.n_layers)]
    return standard_model(ops, w, p, layers)
