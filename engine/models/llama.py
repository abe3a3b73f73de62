"""The Llama family: llama (and Mistral files), qwen2, qwen3, qwen3moe, phi3.

x → x + attn(norm(x)) → h + mlp(norm(h)). The members differ only in named switches:
Llama's q/k rows are in llama.cpp's interleaved order (GPT-J rotary), the others use
NeoX rotary; Qwen2 has q/k/v biases, Qwen3 RMS-normalizes each q and k head, Phi-3
fuses qkv and gate/up, Qwen3-MoE routes its feed-forward through experts."""

from __future__ import annotations

from dataclasses import dataclass

from ..cache import LayerCache
from ..modules import Weights
from .base import Attention, Model, Rope, feed_forward, output_head, rope_from_config


@dataclass
class LlamaParams:
    vocab_size: int
    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    eps: float
    neox: bool = True  # rotary pairing; False: GPT-J pairs (Llama files)
    qk_norm: bool = False
    fused: bool = False  # one attn_qkv and one gate+up matrix (Phi-3)
    window: int = 0  # sliding-window attention in every layer (0: none)
    n_experts: int = 0  # > 0: routed experts in every layer
    n_experts_used: int = 0
    expert_ffn: int = 0
    norm_topk: bool = True

    @classmethod
    def from_config(cls, arch: str, config) -> "LlamaParams":
        moe = getattr(config, "num_experts", 0) or 0
        return cls(
            vocab_size=config.vocab_size, hidden=config.hidden_size, n_layers=config.num_hidden_layers,
            n_heads=config.num_attention_heads, n_kv_heads=config.num_key_value_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
            ffn=config.intermediate_size, eps=config.rms_norm_eps,
            neox=arch != "llama", qk_norm=arch in ("qwen3", "qwen3moe"), fused=arch == "phi3",
            window=(getattr(config, "sliding_window", None) or 0) if arch == "phi3" else 0,
            n_experts=moe, n_experts_used=getattr(config, "num_experts_per_tok", 0) if moe else 0,
            expert_ffn=getattr(config, "moe_intermediate_size", 0) if moe else 0,
            norm_topk=bool(getattr(config, "norm_topk_prob", True)),
        )


class LlamaLayer:
    def __init__(self, w: Weights, i: int, p: LlamaParams, rope: Rope, ops):
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


def build(arch: str, config, w: Weights, ops) -> Model:
    p = LlamaParams.from_config(arch, config)
    factors = w.vector("rope_freqs.weight") if w.has("rope_freqs.weight") else None
    rope = rope_from_config(config, config.rope_parameters, p.head_dim, p.neox, freq_factors=factors)
    layers = [LlamaLayer(w, i, p, rope, ops) for i in range(p.n_layers)]
    embed = w.embedding("token_embd.weight", p.vocab_size, p.hidden)
    return Model(ops, embed, layers, w.vector("output_norm.weight", p.hidden), output_head(w, p.vocab_size, p.hidden),
                 p.eps, p.vocab_size)
