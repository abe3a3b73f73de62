"""granitehybrid (IBM Granite 4.0 H models, as llama.cpp's converter writes them:
conversion/granite.py GraniteHybridModel): Mamba-2 layers beside a few attention
layers (`attention.head_count_kv` per layer, 0 for Mamba-2), each followed by routed
experts plus a shared MLP (a dense MLP alone where the file has no experts); Granite's
multipliers: embeddings times `embedding_scale`, each block's output times
`residual_scale` before it joins the residual, attention scores times
`attention.scale`, logits divided by `logit_scale`. The attention layers turn with
rotary only where `rope.scaling.finetuned` says so (the converter's flag for it; the
hybrids have none, and their q/k rows, permuted for GPT-J pairing, then carry no
position).

Mamba-2 layer: ssm_in gives z (inner), xBC (inner + 2 groups x state) and dt (heads);
xBC goes through a depthwise causal conv with bias and SiLU (its last taps - 1 inputs
are the slot's conv state), splitting into x (heads x head_dim), B and C (groups x
state). With dt = softplus(dt + dt_bias) and A = ssm_a (the converter stores -exp(A_log)),
each head's state S (head_dim x state) goes S = exp(dt A) S + dt x Bᵀ and y = S C + D x
(a prompt's positions SCAN_CHUNK at a time, as matrix products: `ssd_chunk`); y times
SiLU(z) is RMS-normalized per group (ssm_norm) and projected by ssm_out."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ...gguf_io import Keys
from ..cache import LayerCache, linear
from ..modules import Weights
from . import granite
from .base import Model
from .layers import Block, Rope
from .params import Metadata, TextParams, kv_heads_per_layer

ARCHITECTURE = "granitehybrid"


@dataclass
class Params(granite.Scales, TextParams):
    attn_layers: list[bool] = field(default_factory=list)
    n_experts: int = 0
    n_experts_used: int = 0
    expert_ffn: int = 0
    conv_kernel: int = 4
    state: int = 128
    groups: int = 1
    inner: int = 0
    ssm_heads: int = 0

    @staticmethod
    def read(m: Metadata, c: dict) -> dict:
        per_layer = kv_heads_per_layer(m, c)
        attn = sorted({n for n in per_layer if n})
        if len(attn) > 1:
            raise ValueError(f"{m.path}: {m.key(Keys.HEAD_COUNT_KV)} {per_layer} is not one count per "
                             "layer (0 for Mamba-2 layers)")
        inner, heads, groups = m.get(Keys.SSM_INNER_SIZE), m.get(Keys.SSM_TIME_STEP_RANK), m.get(Keys.SSM_GROUP_COUNT)
        if inner % heads or heads % groups:
            raise ValueError(f"{m.path}: Mamba-2 inner size {inner}, {heads} heads and {groups} groups do not divide")
        n_experts = m.get(Keys.EXPERT_COUNT, 0) or 0
        return dict(n_kv_heads=attn[0] if attn else c["n_heads"], attn_layers=[n > 0 for n in per_layer],
                    n_experts=n_experts, n_experts_used=m.get(Keys.EXPERT_USED_COUNT, 0) or 0,
                    expert_ffn=m.get(Keys.FEED_FORWARD_LENGTH) if n_experts else 0,
                    conv_kernel=m.get(Keys.SSM_CONV_KERNEL), state=m.get(Keys.SSM_STATE_SIZE), groups=groups,
                    inner=inner, ssm_heads=heads,
                    use_rope=bool(m.get(Keys.ROPE_SCALING_FINETUNED, False)))  # the hybrids: none unless it says


class Mamba2:
    def __init__(self, w: Weights, i: int, p: Params, ops):
        pre = f"blk.{i}."
        self.ops, self.layer, self.eps = ops, i, p.eps
        self.inner, self.heads, self.groups, self.state = p.inner, p.ssm_heads, p.groups, p.state
        self.head_dim = p.inner // p.ssm_heads
        self.conv_dim = p.inner + 2 * p.groups * p.state
        self.kernel = p.conv_kernel
        self.in_proj = w.linear(pre + "ssm_in.weight", p.inner + self.conv_dim + p.ssm_heads, p.hidden)
        conv = w.vector(pre + "ssm_conv1d.weight", self.conv_dim * p.conv_kernel)
        self.conv_w = conv.reshape(self.conv_dim, p.conv_kernel).t().contiguous()  # (taps, channels)
        self.conv_b = w.vector(pre + "ssm_conv1d.bias", self.conv_dim)
        self.dt_bias = w.vector(pre + "ssm_dt.bias", p.ssm_heads)
        self.a = w.vector(pre + "ssm_a", p.ssm_heads).reshape(-1)  # -exp(A_log), stored (heads, 1)
        self.d = w.vector(pre + "ssm_d", p.ssm_heads).reshape(-1)
        self.norm = w.vector(pre + "ssm_norm.weight", p.inner).reshape(-1)  # stored (groups, inner / groups)
        self.out = w.linear(pre + "ssm_out.weight", p.hidden, p.inner)

    def cache_spec(self) -> LayerCache:
        return linear(self.conv_dim, self.kernel, self.heads, self.head_dim, self.state)

    def __call__(self, x, batch, cache):
        t = x.shape[0]
        n, hd, g, h = self.inner, self.head_dim, self.groups, self.heads
        proj = self.in_proj(x).float()
        z, xbc, dt = proj[:, :n], proj[:, n:n + self.conv_dim], proj[:, n + self.conv_dim:]
        conv_state, ssm_state = cache.linear_state(self.layer)
        xbc = F.silu(self.ops.causal_conv(xbc.contiguous(), conv_state, self.conv_w, batch, silu=False) + self.conv_b)
        xs = xbc[:, :n].reshape(t, h, hd)
        b = xbc[:, n:n + g * self.state].reshape(t, g, self.state)
        c = xbc[:, n + g * self.state:].reshape(t, g, self.state)
        per = h // g  # heads per group
        b, c = b.repeat_interleave(per, dim=1), c.repeat_interleave(per, dim=1)  # (t, h, state)
        dt = F.softplus(dt + self.dt_bias)  # (t, h)
        if batch.by_slot_tensor(x):  # a decode step on a GPU or captured: every slot's state at once
            state = ssm_state[batch.slots] * torch.exp(dt * self.a)[:, :, None, None] \
                + (xs * dt[:, :, None])[..., None] * b[:, :, None, :]  # (t, h, head_dim, N)
            ssm_state[batch.slots] = state
            y = torch.einsum("thdn,thn->thd", state, c)
        else:
            y = torch.empty(t, h, hd, dtype=torch.float32, device=x.device)
            for s in batch.seqs:
                state = ssm_state[s.slot]
                for lo in range(s.start, s.start + s.n, SCAN_CHUNK):
                    hi = min(lo + SCAN_CHUNK, s.start + s.n)
                    y[lo:hi] = ssd_chunk(state, xs[lo:hi], b[lo:hi], c[lo:hi], dt[lo:hi], self.a)
        y = (y + self.d[:, None] * xs).reshape(t, n) * F.silu(z)
        grouped = y.view(t, g, n // g)
        y = (grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)).view(t, n) * self.norm
        return self.out(y.to(x.dtype))


SCAN_CHUNK = 64  # positions a prompt's scan takes at once (its decays within a chunk as one matrix)


def ssd_chunk(state: torch.Tensor, x: torch.Tensor, b: torch.Tensor, c: torch.Tensor, dt: torch.Tensor,
              a: torch.Tensor) -> torch.Tensor:
    """Mamba-2's scan over L consecutive positions at once (its state-space dual form): for
    each head, S_t = exp(dt_t A) S_(t-1) + dt_t x_t B_tᵀ and y_t = S_t C_t. With the decays'
    running sums l_t (log of their product up to t), y_t = exp(l_t) S_0 C_t + Σ_(s<=t)
    exp(l_t - l_s) (C_t · B_s) dt_s x_s, and S_L = exp(l_L) S_0 + Σ_s exp(l_L - l_s) dt_s x_s
    B_sᵀ: matrix products instead of L steps. `state` (heads, head_dim, N) is updated in
    place; x (L, heads, head_dim), b and c (L, heads, N), dt (L, heads) → y (L, heads, head_dim)."""
    logs = (dt * a).cumsum(0).T  # (h, L): l_t
    seg = logs[:, :, None] - logs[:, None, :]  # (h, t, s): l_t - l_s
    causal = torch.ones(seg.shape[1:], dtype=torch.bool, device=x.device).tril()
    ch, bh = c.transpose(0, 1), b.transpose(0, 1)  # (h, L, N)
    g = torch.bmm(ch, bh.transpose(1, 2)) * torch.where(causal, seg, -torch.inf).exp()  # (h, t, s)
    xdt = (x * dt[:, :, None]).transpose(0, 1)  # (h, L, head_dim)
    y = torch.bmm(g, xdt) + logs.exp()[:, :, None] * torch.bmm(ch, state.transpose(1, 2))  # (h, L, head_dim)
    last = logs[:, -1:]
    w = (last - logs).exp()[:, :, None]  # (h, s, 1): exp(l_L - l_s)
    state.mul_(last.exp()[:, :, None]).add_(torch.bmm((xdt * w).transpose(1, 2), bh))
    return y.transpose(0, 1)


def layer(w: Weights, i: int, p: Params, rope: Rope, ops) -> Block:
    mixer = granite.attention(w, i, p, rope, ops) if p.attn_layers[i] else Mamba2(w, i, p, ops)
    return granite.block(w, i, p, ops, mixer)


def build(p: Params, w: Weights, ops) -> Model:
    r = granite.rope(p)
    return granite.model(p, w, ops, [layer(w, i, p, r, ops) for i in range(p.n_layers)])
