"""Qwen3.5 (qwen35) and Qwen3.5 MoE (qwen35moe): Gated DeltaNet linear-attention
layers with a gated full-attention layer every `full_attention_interval`-th.

The linear-attention layer: qkv → causal conv (kernel 4) + SiLU → L2-normalized q, k;
per value head a recurrent state S (dk × dv) decayed by g = A · softplus(a + dt_bias)
and updated by the delta rule with β = sigmoid(b); the output RMS-normalized and
gated by SiLU(z). The file keeps llama.cpp's tiled value-head order (value head h
reads key head h % n_k heads) and A as -exp(A_log): the forward works in that order.
The attention layer: q_proj yields query and a sigmoid output gate per head, q/k
RMS-normalized, rotary over the first quarter of each head (text positions: the
multi-section rotary reduces to plain NeoX)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..cache import LayerCache, linear
from ..modules import LinearGroup, Weights
from .base import Attention, Model, Rope, feed_forward, output_head, rope_from_config


@dataclass
class Qwen35Params:
    vocab_size: int
    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    eps: float
    linear_layers: list[bool]
    conv_kernel: int
    n_k_heads: int  # linear attention: key heads
    n_v_heads: int  # value heads
    k_dim: int
    v_dim: int
    n_experts: int = 0
    n_experts_used: int = 0
    expert_ffn: int = 0
    shared_ffn: int = 0

    @classmethod
    def from_config(cls, config) -> "Qwen35Params":
        moe = getattr(config, "num_experts", 0) or 0
        return cls(
            vocab_size=config.vocab_size, hidden=config.hidden_size, n_layers=config.num_hidden_layers,
            n_heads=config.num_attention_heads, n_kv_heads=config.num_key_value_heads, head_dim=config.head_dim,
            ffn=config.intermediate_size, eps=config.rms_norm_eps,
            linear_layers=[t == "linear_attention" for t in config.layer_types],
            conv_kernel=config.linear_conv_kernel_dim, n_k_heads=config.linear_num_key_heads,
            n_v_heads=config.linear_num_value_heads, k_dim=config.linear_key_head_dim,
            v_dim=config.linear_value_head_dim, n_experts=moe,
            n_experts_used=config.num_experts_per_tok if moe else 0,
            expert_ffn=config.moe_intermediate_size if moe else 0,
            shared_ffn=getattr(config, "shared_expert_intermediate_size", 0) if moe else 0,
        )


class GatedDeltaNet:
    def __init__(self, w: Weights, i: int, p: Qwen35Params, ops):
        pre = f"blk.{i}."
        self.layer, self.ops, self.eps = i, ops, p.eps
        self.n_k, self.n_v, self.dk, self.dv = p.n_k_heads, p.n_v_heads, p.k_dim, p.v_dim
        self.key_dim, self.value_dim = p.n_k_heads * p.k_dim, p.n_v_heads * p.v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.conv_kernel = p.conv_kernel
        self.inputs = LinearGroup([w.linear(pre + "attn_qkv.weight", self.conv_dim, p.hidden),
                                   w.linear(pre + "attn_gate.weight", self.value_dim, p.hidden),
                                   w.linear(pre + "ssm_beta.weight", p.n_v_heads, p.hidden),
                                   w.linear(pre + "ssm_alpha.weight", p.n_v_heads, p.hidden)])
        self.out = w.linear(pre + "ssm_out.weight", p.hidden, self.value_dim)
        self.conv_w = w.vector(pre + "ssm_conv1d.weight").reshape(self.conv_dim, p.conv_kernel).t().contiguous()
        self.a_neg = w.vector(pre + "ssm_a", p.n_v_heads)  # -exp(A_log)
        self.dt_bias = w.vector(pre + "ssm_dt.bias", p.n_v_heads)
        self.norm = w.vector(pre + "ssm_norm.weight", p.v_dim)

    def cache_spec(self) -> LayerCache:
        return linear(self.conv_dim, self.conv_kernel, self.n_v, self.dk, self.dv)

    def __call__(self, x, batch, cache):
        ops, t = self.ops, x.shape[0]
        y = self.inputs(x)  # qkv | z | b | a
        c, v = self.conv_dim, self.value_dim
        qkv, z, b, a = y[:, :c], y[:, c:c + v], y[:, c + v:c + v + self.n_v], y[:, c + v + self.n_v:]
        conv_state, state = cache.linear_state(self.layer)
        mixed = ops.causal_conv(qkv, conv_state, self.conv_w, batch)
        q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        beta = torch.sigmoid(b.float())
        g = self.a_neg * F.softplus(a.float() + self.dt_bias)
        o = ops.gated_delta_rule(q.reshape(t, self.n_k, self.dk), k.reshape(t, self.n_k, self.dk),
                                 v.reshape(t, self.n_v, self.dv), g, beta, state, batch)
        o = ops.rms_norm(o.to(x.dtype), self.norm, self.eps)
        o = ops.act_mul(z.reshape(t, self.n_v, self.dv), o, "silu")  # norm(o) * silu(z)
        return self.out(o.reshape(t, self.value_dim))


class Qwen35Layer:
    def __init__(self, w: Weights, i: int, p: Qwen35Params, rope: Rope, ops):
        self.ops, self.eps = ops, p.eps
        self.attn_norm = w.vector(f"blk.{i}.attn_norm.weight", p.hidden)
        self.post_attn_norm = w.vector(f"blk.{i}.post_attention_norm.weight", p.hidden)
        if p.linear_layers[i]:
            self.mixer = GatedDeltaNet(w, i, p, ops)
        else:
            self.mixer = Attention(w, i, ops, hidden=p.hidden, n_heads=p.n_heads, n_kv_heads=p.n_kv_heads,
                                   head_dim=p.head_dim, eps=p.eps, rope=rope, scale=p.head_dim ** -0.5,
                                   qk_norm=True, gated=True)
        self.mlp = feed_forward(w, i, ops, hidden=p.hidden, ffn=p.ffn, n_experts=p.n_experts, n_used=p.n_experts_used,
                                expert_ffn=p.expert_ffn, shared_ffn=p.shared_ffn)

    def cache_spec(self) -> LayerCache:
        return self.mixer.cache_spec()

    def __call__(self, x, batch, cache):
        h = x + self.mixer(self.ops.rms_norm(x, self.attn_norm, self.eps), batch, cache)
        return h + self.mlp(self.ops.rms_norm(h, self.post_attn_norm, self.eps))


def build(arch: str, config, w: Weights, ops) -> Model:
    p = Qwen35Params.from_config(config)
    rope = rope_from_config(config, config.rope_parameters, p.head_dim, True)
    layers = [Qwen35Layer(w, i, p, rope, ops) for i in range(p.n_layers)]
    embed = w.embedding("token_embd.weight", p.vocab_size, p.hidden)
    return Model(ops, embed, layers, w.vector("output_norm.weight", p.hidden), output_head(w, p.vocab_size, p.hidden),
                 p.eps, p.vocab_size)
