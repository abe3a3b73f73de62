"""deepseek2 (DeepSeek-V2, -V2-Lite, V3-style MoE files and those that reuse the
architecture, as llama.cpp's converter writes them, conversion/deepseek.py): multi-head
latent attention (MLA) with pre-norm layers, the first `leading_dense_block_count` with a
dense MLP, the rest with routed experts (softmax, or sigmoid with the file's expert bias
and groups) plus shared ones, the routed weights times `expert_weights_scale`.

MLA as llama.cpp runs it: the keys and values of a token are one compressed vector c
(kv_lora_rank, RMS-normalized) and a rotary key part k_pe (rope.dimension_count, GPT-J
pairs) shared by every head; each head's query is q_nope (key_length_mla - rope dims) and
q_pe, through q_a / q_a_norm / q_b or one q matrix (the Lite files). The query's nope part
is absorbed into the latent space per head (attn_k_b: c-space x nope), so attention is
one key head of [k_pe, c] against every query head's [q_pe, q_nope k_b], scaled by
1/sqrt(key_length_mla) (times YaRN's mscale squared); each head's output in c-space goes
through attn_v_b to value_length_mla, then attn_output. The cache holds [k_pe, c] per
token and layer as the key and again as the value (the value's k_pe part unused): twice
llama.cpp's MLA cache, a fraction of the decompressed heads'."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from ...gguf_io import Keys
from ..batch import Batch
from ..cache import attention
from ..errors import WeightError
from ..modules import Weights
from .base import Model, standard_model
from .layers import MLP, AttentionSpec, Block, MoE, Rope
from .params import Metadata, TextParams

ARCHITECTURE = "deepseek2"
CHAT_TEMPLATE_FALLBACK = "chatml"
SOFTMAX, SIGMOID = 1, 2  # llama.cpp's expert_gating_func


@dataclass
class Params(TextParams):
    q_lora: int = 0  # 0: one q matrix (the Lite files)
    kv_lora: int = 0
    k_head: int = 0  # a decompressed key head: nope + rope
    v_head: int = 0
    n_experts: int = 0
    n_experts_used: int = 0
    expert_ffn: int = 0
    n_shared: int = 0
    n_dense: int = 0
    norm_topk: bool = False
    expert_scale: float = 1.0
    sigmoid: bool = False
    groups: int = 1
    groups_used: int = 1
    kq_scale: float = 1.0

    @staticmethod
    def read(m: Metadata, c: dict) -> dict:
        gating = m.get(Keys.EXPERT_GATING_FUNC, SOFTMAX)
        if gating not in (SOFTMAX, SIGMOID):
            raise ValueError(f"{m.path}: {m.key(Keys.EXPERT_GATING_FUNC)} is {gating}: expected {SOFTMAX} (softmax) "
                             f"or {SIGMOID} (sigmoid)")
        k_head = int(m.get(Keys.KEY_LENGTH_MLA))
        scaling = c["rope_scaling"]
        mscale = 1.0
        if scaling.kind == "yarn" and scaling.factor > 1:  # llama.cpp: the file's multiplier is 0.1 mscale_all_dim
            log_mul = float(m.get(Keys.ROPE_SCALING_YARN_LOG_MUL, 0.0) or 0.0) / 0.1
            mscale = 1.0 + 0.1 * log_mul * math.log(scaling.factor)
            scaling = replace(scaling, attention_factor=1.0)  # the rotary tables unscaled: all of it in kq_scale
        n_experts = int(m.get(Keys.EXPERT_COUNT, 0) or 0)
        return dict(q_lora=int(m.get(Keys.Q_LORA_RANK, 0) or 0), kv_lora=int(m.get(Keys.KV_LORA_RANK)), k_head=k_head,
                    v_head=int(m.get(Keys.VALUE_LENGTH_MLA)), n_experts=n_experts,
                    n_experts_used=int(m.get(Keys.EXPERT_USED_COUNT, 0) or 0),
                    expert_ffn=int(m.get(Keys.EXPERT_FEED_FORWARD_LENGTH, 0) or 0),
                    n_shared=int(m.get(Keys.EXPERT_SHARED_COUNT, 0) or 0),
                    n_dense=int(m.get(Keys.LEADING_DENSE_BLOCK_COUNT, 0) or 0),
                    norm_topk=bool(m.get(Keys.EXPERT_WEIGHTS_NORM, False)),
                    expert_scale=float(m.get(Keys.EXPERT_WEIGHTS_SCALE, 1.0) or 1.0), sigmoid=gating == SIGMOID,
                    groups=int(m.get(Keys.EXPERT_GROUP_COUNT, 1) or 1),
                    groups_used=int(m.get(Keys.EXPERT_GROUP_USED_COUNT, 1) or 1),
                    rope_scaling=scaling, kq_scale=mscale * mscale / math.sqrt(k_head))


class HeadMatrices:
    """One packed matrix per head (heads, out, in): y[:, h] = W[h] x[:, h] for x (T, heads, in),
    through the kernels' mixture-of-experts product with every head chosen once."""

    def __init__(self, w: Weights, name: str, shape: tuple[int, int, int]):
        info = w.info(name)
        if tuple(info.shape) != shape:
            raise WeightError(f"{w.reader.path}: tensor {name!r} has shape {tuple(info.shape)}, expected {shape}")
        self.weight, self.type, self.out = w.packed(name), info.ggml_type, shape[1]
        self.kernels = w.settings.select(self.weight.device, info.ggml_type)
        self._ids: dict[int, torch.Tensor] = {}

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        t, h = x.shape[0], x.shape[1]
        ids = self._ids.get(t)
        if ids is None:
            ids = torch.arange(h, device=x.device).expand(t, h).contiguous()
            if t <= 64:  # a decode step's sizes, kept
                self._ids[t] = ids
        return self.kernels.mul_mat_id(self.weight, x.float().contiguous(), ids, self.type, self.out)


class LatentAttention:
    """Multi-head latent attention (the module's docstring)."""

    def __init__(self, w: Weights, i: int, p: Params, ops, rope: Rope):
        pre = f"blk.{i}."
        h, rd, r = p.n_heads, p.rope_dims, p.kv_lora
        self.ops, self.eps, self.h, self.rd, self.r = ops, p.eps, h, rd, r
        self.nope, self.k_head, self.v_head = p.k_head - rd, p.k_head, p.v_head
        if p.q_lora:
            self.q_a = w.linear(pre + "attn_q_a.weight", p.q_lora, p.hidden)
            self.q_a_norm = w.vector(pre + "attn_q_a_norm.weight", p.q_lora)
            self.q = w.linear(pre + "attn_q_b.weight", h * p.k_head, p.q_lora)
        else:
            self.q_a = self.q_a_norm = None
            self.q = w.linear(pre + "attn_q.weight", h * p.k_head, p.hidden)
        self.kv_a = w.linear(pre + "attn_kv_a_mqa.weight", r + rd, p.hidden)
        self.kv_a_norm = w.vector(pre + "attn_kv_a_norm.weight", r)
        # per head, c-space x nope and value x c-space: packed as the file has them (a decode step reads
        # them like the other matrices, not as float32), each head's product as a mixture-of-experts
        # selection of every head
        self.k_b, self.v_b = (HeadMatrices(w, pre + name, shape) for name, shape in
                              (("attn_k_b.weight", (h, r, self.nope)), ("attn_v_b.weight", (h, p.v_head, r))))
        self.o = w.linear(pre + "attn_output.weight", p.hidden, h * p.v_head)
        self.spec = AttentionSpec(i, h, 1, rd + r, rope, p.kq_scale, p.eps)

    def cache_spec(self):
        return attention(1, self.rd + self.r)

    def __call__(self, x: torch.Tensor, batch: Batch, cache) -> torch.Tensor:
        t, h, rd, r = x.shape[0], self.h, self.rd, self.r
        q_in = x if self.q_a is None else self.ops.rms_norm(self.q_a(x), self.q_a_norm, self.eps)
        q = self.q(q_in).float().view(t, h, self.k_head)
        q_abs = self.k_b(q[..., :self.nope])
        kv = self.kv_a(x).float()
        c = self.ops.rms_norm(kv[:, :r].contiguous(), self.kv_a_norm, self.eps)
        key = torch.cat([kv[:, r:], c], dim=-1)  # [k_pe (rotated by the attention), c]; the value too
        qkv = torch.cat([torch.cat([q[..., self.nope:], q_abs], dim=-1).reshape(t, h * (rd + r)), key, key], dim=-1)
        o = self.ops.self_attention(qkv.to(x.dtype).contiguous(), self.spec, batch, cache).float()
        o = self.v_b(o.view(t, h, rd + r)[..., rd:])
        return self.o(o.reshape(t, h * self.v_head).to(x.dtype))


def feed_forward(w: Weights, i: int, p: Params, ops):
    if i < p.n_dense or not p.n_experts:
        return MLP(w, i, ops, hidden=p.hidden, ffn=p.ffn, act="silu")
    return MoE(w, i, ops, hidden=p.hidden, n_experts=p.n_experts, n_used=p.n_experts_used, expert_ffn=p.expert_ffn,
               act="silu", norm_topk=p.norm_topk, shared_ffn=p.expert_ffn * p.n_shared, sigmoid=p.sigmoid,
               scale=p.expert_scale, shared_gate=False, groups=p.groups, groups_used=p.groups_used)


def build(p: Params, w: Weights, ops) -> Model:
    rope = Rope.build(p.rope_theta, p.rope_dims, p.rope_scaling, neox=False, context_length=p.context_length)
    layers = [Block(w, i, ops, hidden=p.hidden, eps=p.eps, mixer=LatentAttention(w, i, p, ops, rope),
                    mlp=feed_forward(w, i, p, ops)) for i in range(p.n_layers)]
    return standard_model(ops, w, p, layers)
