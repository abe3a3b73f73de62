"""llama4 (Llama 4 Scout and Maverick text, as llama.cpp's converter writes them,
conversion/llama.py Llama4Model): llama's layers without the q/k permutation (GPT-J rotary
pairs as the checkpoint's complex rotary has them), every fourth layer without rotary (NoPE)
whose queries take the attention temperature 1 + 0.1 ln(1 + floor((position + 1) / 8192)),
the others' q and k heads RMS-normalized without a weight after rotary (not in Maverick's
128-expert files, as llama.cpp); every `interleave_moe_layer_step`-th layer routed experts:
each token's top expert by the router's logit, its input scaled by the logit's sigmoid
before the expert (llama.cpp's weight_before_ffn), plus a shared expert on the same input;
the other layers a dense MLP. The rotary layers attend in chunks of 8192 positions (each
query over the keys of its own chunk, llama.cpp's LLAMA_SWA_TYPE_CHUNKED), the NoPE layers
over the whole context; a file whose sliding_window is 0 attends in full everywhere."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...gguf_io import Keys
from ..modules import Weights
from .base import Model, standard_model
from .layers import MLP, Attention, Block, MoE, Rope
from .params import Metadata, TextParams

ARCHITECTURE = "llama4"
CHAT_TEMPLATE_FALLBACK = "llama3"
CHUNK = 8192  # llama.cpp: n_swa (chunked) and the temperature's floor scale
NO_ROPE_EVERY = 4


@dataclass
class Params(TextParams):
    n_experts: int = 0
    n_experts_used: int = 1
    expert_ffn: int = 0
    moe_every: int = 1
    chunked: bool = True

    @staticmethod
    def read(m: Metadata, c: dict) -> dict:
        n_experts = int(m.get(Keys.EXPERT_COUNT, 0) or 0)
        used = int(m.get(Keys.EXPERT_USED_COUNT, 1) or 1)
        if n_experts and used != 1:
            raise ValueError(f"{m.path}: {m.key(Keys.EXPERT_USED_COUNT)} is {used}: Llama 4's router picks one")
        window = m.get(Keys.SLIDING_WINDOW, None)
        return dict(n_experts=n_experts, n_experts_used=used,
                    expert_ffn=int(m.get(Keys.EXPERT_FEED_FORWARD_LENGTH, 0) or 0),
                    moe_every=int(m.get(Keys.INTERLEAVE_MOE_LAYER_STEP, 1) or 1),
                    chunked=window is None or window != 0)


class TopOneExperts(MoE):
    """Llama 4's routed experts: the top expert by logit, its input times sigmoid(logit)."""

    def __init__(self, w: Weights, i: int, p: Params, ops):
        super().__init__(w, i, ops, hidden=p.hidden, n_experts=p.n_experts, n_used=1, expert_ffn=p.expert_ffn,
                         act="silu", shared_ffn=p.expert_ffn, shared_gate=False)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.router(x).float()
        top, ids = logits.max(dim=-1, keepdim=True)
        scaled = (x.float() * torch.sigmoid(top)).to(x.dtype)
        y = self.experts(scaled, ids, self.ops, self.act)[:, 0]
        return y.to(x.dtype) + self.shared(x)


def layer(w: Weights, i: int, p: Params, rope: Rope, ops) -> Block:
    nope = (i + 1) % NO_ROPE_EVERY == 0 and p.chunked
    attn = Attention(w, i, ops, hidden=p.hidden, n_heads=p.n_heads, n_kv_heads=p.n_kv_heads, head_dim=p.head_dim,
                     eps=p.eps, rope=Rope.none() if nope else rope,
                     temperature=(0.1, CHUNK, 1) if nope else None, chunk=CHUNK if p.chunked and not nope else 0)
    if not nope and p.n_experts != 128:  # llama.cpp: use_kq_norm unless Maverick's 128 experts
        ones = torch.ones(p.head_dim, device=w.device)  # an RMS norm without a weight (it commutes with the rotation)
        attn.spec.q_norm, attn.spec.k_norm = ones, ones
    moe = p.n_experts and (i + 1) % p.moe_every == 0
    mlp = TopOneExperts(w, i, p, ops) if moe else MLP(w, i, ops, hidden=p.hidden, ffn=p.ffn, act="silu")
    return Block(w, i, ops, hidden=p.hidden, eps=p.eps, mixer=attn, mlp=mlp)


def build(p: Params, w: Weights, ops) -> Model:
    factors = w.vector("rope_freqs.weight") if w.has("rope_freqs.weight") else None
    rope = Rope.build(p.rope_theta, p.rope_dims, p.rope_scaling, neox=False, context_length=p.context_length,
                      freq_factors=factors)
    return standard_model(ops, w, p, [layer(w, i, p, rope, ops) for i in range(p.n_layers)])
