"""glm4moe (GLM-4.5, GLM-4.5-Air, GLM-4.6, as llama.cpp's converter writes them:
conversion/glm.py Glm4MoeModel): pre-norm layers with biased q/k/v (optional per-head
q/k norms), NeoX rotary over the first `rope.dimension_count` dimensions of each head
(half of them), the first `leading_dense_block_count` layers with a dense MLP and the
rest with routed experts plus shared ones: a sigmoid router whose choice adds the
file's expert bias (exp_probs_b), limited to the best `expert_group_used_count` of
`expert_group_count` groups (one group in GLM-4.5's files), the chosen scores renormalized
(`expert_weights_norm`) and scaled (`expert_weights_scale`), the shared experts' MLP
added unweighted. The files keep the multi-token-prediction layers after the trunk
(`nextn_predict_layers`); the trunk stops before them."""

from __future__ import annotations

from dataclasses import dataclass

from ...gguf_io import Keys
from ..modules import Weights
from .base import Model, standard_model
from .layers import MLP, Attention, Block, MoE, Rope
from .params import Metadata, TextParams

ARCHITECTURE = "glm4moe"
SIGMOID = 2  # llama.cpp's expert_gating_func for sigmoid


@dataclass
class Params(TextParams):
    n_experts: int = 0
    n_experts_used: int = 0
    expert_ffn: int = 0
    n_shared: int = 0
    n_dense: int = 0  # leading layers with a dense MLP
    norm_topk: bool = True
    expert_scale: float = 1.0
    qk_norm: str | None = None  # "head" where the file has per-head q/k norms
    groups: int = 1  # expert groups, and how many of them a token's experts come from
    groups_used: int = 1

    @staticmethod
    def read(m: Metadata, c: dict) -> dict:
        gating = m.get(Keys.EXPERT_GATING_FUNC, SIGMOID)
        if gating != SIGMOID:
            raise ValueError(f"{m.path}: {m.key(Keys.EXPERT_GATING_FUNC)} is {gating}; GLM-4.5's "
                             f"router is sigmoid ({SIGMOID})")
        n_experts, groups = m.get(Keys.EXPERT_COUNT), m.get(Keys.EXPERT_GROUP_COUNT, 1) or 1
        groups_used = m.get(Keys.EXPERT_GROUP_USED_COUNT, 1) or 1
        if n_experts % groups or not 1 <= groups_used <= groups:
            raise ValueError(f"{m.path}: {n_experts} experts in {groups} groups, {groups_used} of them used, "
                             "is not a grouping")
        return dict(n_experts=n_experts, n_experts_used=m.get(Keys.EXPERT_USED_COUNT), groups=groups,
                    groups_used=groups_used, expert_ffn=m.get(Keys.EXPERT_FEED_FORWARD_LENGTH),
                    n_shared=m.get(Keys.EXPERT_SHARED_COUNT, 0), n_dense=m.get(Keys.LEADING_DENSE_BLOCK_COUNT, 0),
                    norm_topk=bool(m.get(Keys.EXPERT_WEIGHTS_NORM, True)),
                    expert_scale=float(m.get(Keys.EXPERT_WEIGHTS_SCALE, 1.0)),
                    qk_norm="head" if m.has_tensor("blk.0.attn_q_norm.weight") else None)


def feed_forward(w: Weights, i: int, p: Params, ops):
    if i < p.n_dense:
        return MLP(w, i, ops, hidden=p.hidden, ffn=p.ffn, act="silu")
    return MoE(w, i, ops, hidden=p.hidden, n_experts=p.n_experts, n_used=p.n_experts_used, expert_ffn=p.expert_ffn,
               act="silu", norm_topk=p.norm_topk, shared_ffn=p.expert_ffn * p.n_shared, sigmoid=True,
               scale=p.expert_scale, shared_gate=False, groups=p.groups, groups_used=p.groups_used)


def layer(w: Weights, i: int, p: Params, rope: Rope, ops) -> Block:
    attn = Attention(w, i, ops, hidden=p.hidden, n_heads=p.n_heads, n_kv_heads=p.n_kv_heads, head_dim=p.head_dim,
                     eps=p.eps, rope=rope, qk_norm=p.qk_norm)
    return Block(w, i, ops, hidden=p.hidden, eps=p.eps, mixer=attn, mlp=feed_forward(w, i, p, ops),
                 ffn_norm="post_attention_norm")


def build(p: Params, w: Weights, ops) -> Model:
    rope = Rope.build(p.rope_theta, p.rope_dims, p.rope_scaling, context_length=p.context_length)
    return standard_model(ops, w, p, [layer(w, i, p, rope, ops) for i in range(p.n_layers)])
