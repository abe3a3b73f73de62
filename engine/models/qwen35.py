"""Qwen3.5 (qwen35) and Qwen3.5 MoE (qwen35moe): Gated DeltaNet linear-attention
layers with a gated full-attention layer every `full_attention_interval`-th.

The linear-attention layer: qkv → causal conv (kernel 4) + SiLU → L2-normalized q, k;
per value head a recurrent state S (dk × dv) decayed by g = A · softplus(a + dt_bias)
and updated by the delta rule with β = sigmoid(b); the output RMS-normalized and
gated by SiLU(z). The file keeps llama.cpp's tiled value-head order (value head h
reads key head h % n_k heads) and A as -exp(A_log): the forward works in that order.
The attention layer: q_proj yields query and a sigmoid output gate per head, q/k
RMS-normalized, rotary over the first quarter of each head (text positions: the
multi-section rotary reduces to plain NeoX). A file with a multi-token-prediction block
(nextn_predict_layers) gets its head (`MtpHead`) for speculative decoding's drafts."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import torch
import torch.nn.functional as F

from ...gguf_io import Keys
from ..cache import LayerCache, linear
from ..modules import LinearGroup, Weights
from .base import Model, standard_model
from .layers import Attention, Block, Rope, feed_forward
from .params import Metadata, TextParams, layer_pattern

ARCHITECTURE = "qwen35"
CHAT_TEMPLATE_FALLBACK = "chatml"


@dataclass
class Params(TextParams):
    linear_layers: list[bool] = field(default_factory=list)  # per layer: Gated DeltaNet (else attention)
    conv_kernel: int = 4
    n_k_heads: int = 0  # linear attention: key heads
    n_v_heads: int = 0  # value heads
    k_dim: int = 0
    v_dim: int = 0
    n_experts: int = 0  # qwen35moe: routed experts and a gated shared expert in every layer
    n_experts_used: int = 0
    expert_ffn: int = 0
    shared_ffn: int = 0
    rope_sections: list[int] = field(default_factory=lambda: [11, 11, 10, 0])  # time, rows, columns (, unused)
    # qwen3next: the value heads in the checkpoint's grouped order (head h reads key head h // (n_v / n_k))
    # and beta / alpha in one matrix (ssm_ba); Qwen3.5's converter tiles the heads
    grouped_v: bool = False

    @staticmethod
    def read(m: Metadata, c: dict) -> dict:
        """The layer pattern and the linear attention's shape (shared with qwen35moe, whose
        readers add its experts). Rotary over the first quarter of each head by default."""
        linear_layers = layer_pattern(m, Keys.RECURRENT_LAYERS, c["n_layers"], m.get(Keys.FULL_ATTENTION_INTERVAL, 4))
        n_k, n_v = m.get(Keys.SSM_GROUP_COUNT), m.get(Keys.SSM_TIME_STEP_RANK)
        return dict(rope_dims=m.get(Keys.ROPE_DIMENSION_COUNT, c["head_dim"] // 4), linear_layers=linear_layers,
                    conv_kernel=m.get(Keys.SSM_CONV_KERNEL), n_k_heads=n_k, n_v_heads=n_v,
                    rope_sections=list(m.get(Keys.ROPE_DIMENSION_SECTIONS, [11, 11, 10, 0])),
                    k_dim=m.get(Keys.SSM_STATE_SIZE), v_dim=m.get(Keys.SSM_INNER_SIZE) // n_v)


class GatedDeltaNet:
    def __init__(self, w: Weights, i: int, p: Params, ops):
        pre = f"blk.{i}."
        self.layer, self.ops, self.eps = i, ops, p.eps
        self.n_k, self.n_v, self.dk, self.dv = p.n_k_heads, p.n_v_heads, p.k_dim, p.v_dim
        self.key_dim, self.value_dim = p.n_k_heads * p.k_dim, p.n_v_heads * p.v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.conv_kernel = p.conv_kernel
        gates = [w.linear(pre + "ssm_ba.weight", 2 * p.n_v_heads, p.hidden)] if p.grouped_v else \
            [w.linear(pre + "ssm_beta.weight", p.n_v_heads, p.hidden), w.linear(pre + "ssm_alpha.weight", p.n_v_heads,
                                                                                 p.hidden)]
        self.inputs = LinearGroup([w.linear(pre + "attn_qkv.weight", self.conv_dim, p.hidden),
                                   w.linear(pre + "attn_gate.weight", self.value_dim, p.hidden)] + gates)
        self.out = w.linear(pre + "ssm_out.weight", p.hidden, self.value_dim)
        self.conv_w = w.vector(pre + "ssm_conv1d.weight").reshape(self.conv_dim, p.conv_kernel).t().contiguous()
        self.a_neg = w.vector(pre + "ssm_a", p.n_v_heads)  # -exp(A_log)
        self.dt_bias = w.vector(pre + "ssm_dt.bias", p.n_v_heads)
        self.norm = w.vector(pre + "ssm_norm.weight", p.v_dim)
        self.to_tiled = self.to_grouped = None
        if p.grouped_v:  # the delta rule runs in the tiled order: tiled head t = j n_k + k is grouped head k r + j
            r = self.n_v // self.n_k
            self.to_tiled = torch.tensor([(t % self.n_k) * r + t // self.n_k for t in range(self.n_v)],
                                         device=self.a_neg.device)
            self.to_grouped = torch.argsort(self.to_tiled)
            self.a_neg = self.a_neg.float()[self.to_tiled].contiguous()
            self.dt_bias = self.dt_bias.float()[self.to_tiled].contiguous()

    def cache_spec(self) -> LayerCache:
        return linear(self.conv_dim, self.conv_kernel, self.n_v, self.dk, self.dv)

    def __call__(self, x, batch, cache):
        ops, t = self.ops, x.shape[0]
        y = self.inputs(x)  # qkv | z | b | a (grouped: per key head its betas, then its alphas)
        c, v = self.conv_dim, self.value_dim
        qkv, z = y[:, :c], y[:, c:c + v]
        if self.to_tiled is None:
            b, a = y[:, c + v:c + v + self.n_v], y[:, c + v + self.n_v:]
        else:
            ba = y[:, c + v:].reshape(t, self.n_k, 2, self.n_v // self.n_k)
            b, a = (ba[:, :, j].reshape(t, self.n_v)[:, self.to_tiled] for j in (0, 1))
        conv_state, state = cache.linear_state(self.layer)
        mixed = ops.causal_conv(qkv, conv_state, self.conv_w, batch)  # per channel: the file's order throughout
        q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        v = v.reshape(t, self.n_v, self.dv)
        if self.to_tiled is not None:
            v = v[:, self.to_tiled].contiguous()
        beta = torch.sigmoid(b.float()).contiguous()
        g = (self.a_neg * F.softplus(a.float() + self.dt_bias)).contiguous()
        o = ops.gated_delta_rule(q.reshape(t, self.n_k, self.dk), k.reshape(t, self.n_k, self.dk), v, g, beta, state,
                                 batch)
        if self.to_grouped is not None:  # back to the file's order before the norm, the gate and ssm_out
            o = o[:, self.to_grouped].contiguous()
        o = ops.rms_norm(o.to(x.dtype), self.norm, self.eps)
        o = ops.act_mul(z.reshape(t, self.n_v, self.dv), o, "silu")  # norm(o) * silu(z)
        return self.out(o.reshape(t, self.value_dim))


def attention(w: Weights, i: int, p: Params, rope: Rope, ops) -> Attention:
    return Attention(w, i, ops, hidden=p.hidden, n_heads=p.n_heads, n_kv_heads=p.n_kv_heads, head_dim=p.head_dim,
                     eps=p.eps, rope=rope, qk_norm="head", gated=True)


def layer(w: Weights, i: int, p: Params, rope: Rope, ops) -> Block:
    """Layer i: Gated DeltaNet or gated attention as the file's pattern says (the MTP block's,
    past the trunk's layers, attention), its feed-forward after post_attention_norm."""
    mixer = GatedDeltaNet(w, i, p, ops) if i < p.n_layers and p.linear_layers[i] else attention(w, i, p, rope, ops)
    mlp = feed_forward(w, i, ops, hidden=p.hidden, ffn=p.ffn, n_experts=p.n_experts, n_used=p.n_experts_used,
                       expert_ffn=p.expert_ffn, shared_ffn=p.shared_ffn)
    return Block(w, i, ops, hidden=p.hidden, eps=p.eps, mixer=mixer, mlp=mlp, ffn_norm="post_attention_norm")


class MtpHead:
    """Qwen3.5's multi-token-prediction block (llama.cpp's nextn layer, `blk.N.nextn.*` and
    `blk.N.*` at N = the trunk's layers): at position p, the embedding of token x_p and the
    trunk's output (after its final norm) at p - 1, each RMS-normalized, concatenated
    (embedding first) and projected (eh_proj), then one gated full-attention decoder layer
    with its own KV cache, a norm (shared_head_norm, else the trunk's) and the head
    (shared_head_head, else the trunk's): logits for x_{p+1}, one token past what the
    trunk at p - 1 predicted. Its normed output feeds the next draft in a chain."""

    def __init__(self, w: Weights, i: int, p: Params, rope: Rope, ops, embed, head, output_norm: torch.Tensor):
        pre = f"blk.{i}.nextn."
        self.layer, self.ops, self.eps = i, ops, p.eps
        self.eh_proj = w.linear(pre + "eh_proj.weight", p.hidden, 2 * p.hidden)
        self.enorm = w.vector(pre + "enorm.weight", p.hidden)
        self.hnorm = w.vector(pre + "hnorm.weight", p.hidden)
        self.norm = w.vector(pre + "shared_head_norm.weight", p.hidden) if w.has(pre + "shared_head_norm.weight") \
            else output_norm
        self.embed = w.embedding(pre + "embed_tokens.weight", p.vocab_size, p.hidden) \
            if w.has(pre + "embed_tokens.weight") else embed
        self.head = w.linear(pre + "shared_head_head.weight", p.vocab_size, p.hidden) \
            if w.has(pre + "shared_head_head.weight") else head
        self.block = layer(w, i, p, rope, ops)

    def cache_spec(self) -> LayerCache:
        return self.block.cache_spec()

    def __call__(self, batch, cache, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits of batch.rows, the normed output of every row) for the batch's tokens
        paired with `hidden` (one trunk output per token: the previous position's). The
        batch's positions are written in this layer's cache cells only: the slots' lengths
        are the trunk's (cache.begin is not called)."""
        ops = self.ops
        e = ops.rms_norm(self.embed(batch.tokens), self.enorm, self.eps)
        h = ops.rms_norm(hidden.to(e.dtype), self.hnorm, self.eps)
        x = self.eh_proj(torch.cat([e, h], dim=-1))
        out = ops.rms_norm(self.block(x, batch, cache), self.norm, self.eps)
        rows = out if batch.rows.numel() == out.shape[0] else out[batch.rows]
        logits = self.head(rows).float() if batch.rows.numel() else torch.empty(0, 0)
        return logits, out


def build(p: Params, w: Weights, ops) -> Model:
    # multi-section rotary: for text (every section at the same position) it is plain NeoX; a batch
    # with images carries (time, row, column) positions (Batch.mrope)
    rope = Rope.build(p.rope_theta, p.rope_dims, p.rope_scaling, context_length=p.context_length)
    rope = rope.with_sections(p.rope_sections)
    layers = [layer(w, i, p, rope, ops) for i in range(p.n_layers)]
    drafts = p.n_mtp_layers and w.has(f"blk.{p.n_layers}.nextn.eh_proj.weight")  # the first MTP block drafts
    return standard_model(ops, w, p, layers, mtp=partial(MtpHead, w, p.n_layers, p, rope, ops) if drafts else None)
