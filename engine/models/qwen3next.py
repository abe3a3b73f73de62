"""qwen3next (Qwen3-Next-80B-A3B, as llama.cpp's converter writes it, conversion/qwen.py
Qwen3NextModel): Qwen3.5 MoE's layers (Gated DeltaNet with a gated full-attention layer
every fourth, routed experts plus a gated shared expert, MTP block) with two differences
in the files: the value heads stay in the checkpoint's grouped order (value head h reads
key head h // (n_v / n_k); Qwen3.5's converter tiles them) and beta and alpha come from one
matrix, ssm_ba, whose rows hold per key head its group's betas, then its alphas.
The linear attention runs in the tiled order as Qwen3.5's: its per-head inputs permuted
after the causal convolution (a per-channel op), its output back before the norm and
gate; the decay's per-head constants are permuted at load."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..modules import LinearGroup, Weights
from . import qwen35, qwen35moe
from .base import Model, standard_model
from .layers import Block, Rope, feed_forward

ARCHITECTURE = "qwen3next"
CHAT_TEMPLATE_FALLBACK = "chatml"

Params = qwen35moe.Params


class GroupedDeltaNet(qwen35.GatedDeltaNet):
    def __init__(self, w: Weights, i: int, p: Params, ops):
        pre = f"blk.{i}."
        self.layer, self.ops, self.eps = i, ops, p.eps
        self.n_k, self.n_v, self.dk, self.dv = p.n_k_heads, p.n_v_heads, p.k_dim, p.v_dim
        self.key_dim, self.value_dim = p.n_k_heads * p.k_dim, p.n_v_heads * p.v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.conv_kernel = p.conv_kernel
        self.inputs = LinearGroup([w.linear(pre + "attn_qkv.weight", self.conv_dim, p.hidden),
                                   w.linear(pre + "attn_gate.weight", self.value_dim, p.hidden),
                                   w.linear(pre + "ssm_ba.weight", 2 * p.n_v_heads, p.hidden)])
        self.out = w.linear(pre + "ssm_out.weight", p.hidden, self.value_dim)
        self.conv_w = w.vector(pre + "ssm_conv1d.weight").reshape(self.conv_dim, p.conv_kernel).t().contiguous()
        r = self.n_v // self.n_k
        # tiled head t = j n_k + k is grouped head k r + j
        self.to_tiled = torch.tensor([(t % self.n_k) * r + t // self.n_k for t in range(self.n_v)])
        self.to_grouped = torch.argsort(self.to_tiled)
        self.a_neg = w.vector(pre + "ssm_a", p.n_v_heads).float()[self.to_tiled].contiguous()  # -exp(A_log)
        self.dt_bias = w.vector(pre + "ssm_dt.bias", p.n_v_heads).float()[self.to_tiled].contiguous()
        self.norm = w.vector(pre + "ssm_norm.weight", p.v_dim)

    def __call__(self, x, batch, cache):
        ops, t, r = self.ops, x.shape[0], self.n_v // self.n_k
        y = self.inputs(x)  # qkv | z | (per key head: r betas, r alphas)
        c, v = self.conv_dim, self.value_dim
        qkv, z, ba = y[:, :c], y[:, c:c + v], y[:, c + v:].reshape(t, self.n_k, 2, r).float()
        b, a = ba[:, :, 0].reshape(t, self.n_v)[:, self.to_tiled], ba[:, :, 1].reshape(t, self.n_v)[:, self.to_tiled]
        conv_state, state = cache.linear_state(self.layer)
        mixed = ops.causal_conv(qkv, conv_state, self.conv_w, batch)
        q, k, vv = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        vv = vv.reshape(t, self.n_v, self.dv)[:, self.to_tiled]
        beta = torch.sigmoid(b)
        g = self.a_neg * F.softplus(a + self.dt_bias)
        o = ops.gated_delta_rule(q.reshape(t, self.n_k, self.dk), k.reshape(t, self.n_k, self.dk), vv.contiguous(),
                                 g.contiguous(), beta.contiguous(), state, batch)
        o = ops.rms_norm(o[:, self.to_grouped].to(x.dtype).contiguous(), self.norm, self.eps)
        o = ops.act_mul(z.reshape(t, self.n_v, self.dv), o, "silu")  # norm(o) * silu(z)
        return self.out(o.reshape(t, self.value_dim))


def layer(w: Weights, i: int, p: Params, rope: Rope, ops) -> Block:
    mixer = GroupedDeltaNet(w, i, p, ops) if i < p.n_layers and p.linear_layers[i] \
        else qwen35.attention(w, i, p, rope, ops)
    mlp = feed_forward(w, i, ops, hidden=p.hidden, ffn=p.ffn, n_experts=p.n_experts, n_used=p.n_experts_used,
                       expert_ffn=p.expert_ffn, shared_ffn=p.shared_ffn)
    return Block(w, i, ops, hidden=p.hidden, eps=p.eps, mixer=mixer, mlp=mlp, ffn_norm="post_attention_norm")


def build(p: Params, w: Weights, ops) -> Model:
    rope = Rope.build(p.rope_theta, p.rope_dims, p.rope_scaling, context_length=p.context_length)
    layers = [layer(w, i, p, rope, ops) for i in range(p.n_layers)]
    return standard_model(ops, w, p, layers)
