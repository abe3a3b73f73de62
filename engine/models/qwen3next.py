"""qwen3next (Qwen3-Next-80B-A3B, as llama.cpp's converter writes it, conversion/qwen.py
Qwen3NextModel): Qwen3.5 MoE's layers (Gated DeltaNet with a gated full-attention layer
every fourth, routed experts plus a gated shared expert) with two differences in the files:
the value heads stay in the checkpoint's grouped order (value head h reads key head
h // (n_v / n_k); Qwen3.5's converter tiles them) and beta and alpha come from one matrix,
ssm_ba, whose rows hold per key head its group's betas, then its alphas (qwen35.py's
`grouped_v`). The files' multi-token-prediction block is not used for drafts."""

from __future__ import annotations

from ..modules import Weights
from . import qwen35, qwen35moe
from .base import Model, standard_model
from .layers import Rope

ARCHITECTURE = "qwen3next"
CHAT_TEMPLATE_FALLBACK = "chatml"

Params = qwen35moe.Params.member(grouped_v=True)


def build(p: Params, w: Weights, ops) -> Model:
    rope = Rope.build(p.rope_theta, p.rope_dims, p.rope_scaling, context_length=p.context_length)
    return standard_model(ops, w, p, [qwen35.layer(w, i, p, rope, ops) for i in range(p.n_layers)])
