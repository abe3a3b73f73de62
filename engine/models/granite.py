"""granite (IBM Granite 3.x dense models, as llama.cpp's converter writes them:
conversion/granite.py GraniteModel): llama's layers (q/k permuted for GPT-J pairing) with
Granite's multipliers: embeddings times `embedding_scale`, each block's output times
`residual_scale` before it joins the residual, attention scores times `attention.scale`,
logits divided by `logit_scale`; rotary unless `rope.scaling.finetuned` is false
(llama.cpp's switch for it). Its MoE members (granitemoe) route softmax experts with a
shared MLP beside them where the file has one."""

from __future__ import annotations

from dataclasses import dataclass

from ...gguf_io import Keys
from ..modules import Weights
from . import llama
from .base import Model, standard_model
from .layers import MLP, Attention, Block, MoE, Rope
from .params import Metadata

ARCHITECTURE = "granite"


@dataclass
class Scales:
    """Granite's multipliers, its rotary switch and shared MLP, as every Granite file states
    them (granitehybrid's Params has them too): a Params dataclass takes them before its
    base, `Params(Scales, TextParams)`, and reads them with the rest."""

    embedding_scale: float = 1.0
    residual_scale: float = 1.0
    attention_scale: float = 0.0  # 0: head_dim ** -0.5
    logit_scale: float = 1.0
    use_rope: bool = True
    shared_ffn: int = 0  # > 0: a shared MLP beside the routed experts (Granite MoE Shared, Granite 4.0 H)

    @staticmethod
    def read(m: Metadata, c: dict) -> dict:
        return dict(embedding_scale=float(m.get(Keys.EMBEDDING_SCALE, 1.0)),
                    residual_scale=float(m.get(Keys.RESIDUAL_SCALE, 1.0)),
                    attention_scale=float(m.get(Keys.ATTENTION_SCALE, 0.0)),
                    logit_scale=float(m.get(Keys.LOGIT_SCALE, 1.0)),
                    use_rope=bool(m.get(Keys.ROPE_SCALING_FINETUNED, True)),
                    shared_ffn=m.get(Keys.EXPERT_SHARED_FEED_FORWARD_LENGTH, 0) or 0)


@dataclass
class Params(Scales, llama.Params):
    pass


def rope(p: Params) -> Rope:
    return (Rope.build(p.rope_theta, p.rope_dims, p.rope_scaling, neox=False, context_length=p.context_length)
            if p.use_rope else Rope.none())


def attention(w: Weights, i: int, p: Params, rope: Rope, ops) -> Attention:
    return Attention(w, i, ops, hidden=p.hidden, n_heads=p.n_heads, n_kv_heads=p.n_kv_heads, head_dim=p.head_dim,
                     eps=p.eps, rope=rope, scale=p.attention_scale or None)


def block(w: Weights, i: int, p: Params, ops, mixer) -> Block:
    """A layer around its mixer: routed experts with the shared MLP beside them, or the
    (shared) MLP alone; each part's output times the residual multiplier."""
    if p.n_experts:
        mlp = MoE(w, i, ops, hidden=p.hidden, n_experts=p.n_experts, n_used=p.n_experts_used, expert_ffn=p.expert_ffn,
                  act="silu", norm_topk=True, shared_ffn=p.shared_ffn, shared_gate=False)
    else:  # a hybrid's shared MLP alone is stored as the layer's MLP
        mlp = MLP(w, i, ops, hidden=p.hidden, ffn=p.shared_ffn or p.ffn, act="silu")
    return Block(w, i, ops, hidden=p.hidden, eps=p.eps, mixer=mixer, mlp=mlp, residual=p.residual_scale)


def model(p: Params, w: Weights, ops, layers: list) -> Model:
    return standard_model(ops, w, p, layers, embed_scale=p.embedding_scale, logit_scale=p.logit_scale)


def build(p: Params, w: Weights, ops) -> Model:
    r = rope(p)
    return model(p, w, ops, [block(w, i, p, ops, attention(w, i, p, r, ops)) for i in range(p.n_layers)])
