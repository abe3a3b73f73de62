"""gpt-oss (gpt-oss-20b, gpt-oss-120b, as llama.cpp's converter writes them:
conversion/gpt_oss.py): pre-norm layers (attn_norm, then post_attention_norm before the
experts) whose attention has biased q/k/v/o, a learned sink logit per head
(attn_sinks) and NeoX rotary with YaRN, sliding-window layers alternating with full
ones (the even layers slide, llama.cpp's pattern of 2, unless the file lists them);
every layer's feed-forward routed experts: a biased router, the top
`expert_used_count` experts weighted by a softmax over their logits, each expert's
gate/up/down biased and joined by the clamped SwiGLU (swiglu_oai). Files keep the
experts in MXFP4.

YaRN's ramp: gpt-oss is trained with transformers' `truncate: false` (the correction
range not rounded to whole dimensions), which the files do not record; llama.cpp rounds
it (on a tiny model with YaRN factor 8 the logits then differ by 4 %). The exact range is
used here, as the model was trained (YARN_TRUNCATE)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ...gguf_io import Keys
from ..modules import Weights
from .base import Model, standard_model
from .layers import Attention, Block, MoE, Rope
from .params import Metadata, TextParams, sliding_layers

ARCHITECTURE = "gpt-oss"
SWA_PATTERN = 2  # llama.cpp's load_swa_pattern(ml, 2): layer i slides where i % 2 == 0
YARN_TRUNCATE = False  # as trained; llama.cpp's rounding is True


@dataclass
class Params(TextParams):
    n_experts: int = 0
    n_experts_used: int = 0
    expert_ffn: int = 0
    window: int = 0
    sliding: list[bool] = field(default_factory=list)  # per layer

    @staticmethod
    def read(m: Metadata, c: dict) -> dict:
        return dict(rope_scaling=replace(c["rope_scaling"], truncate=YARN_TRUNCATE), n_experts=m.get(Keys.EXPERT_COUNT),
                    n_experts_used=m.get(Keys.EXPERT_USED_COUNT), expert_ffn=m.get(Keys.EXPERT_FEED_FORWARD_LENGTH),
                    window=m.get(Keys.SLIDING_WINDOW), sliding=sliding_layers(m, c["n_layers"], SWA_PATTERN))


def layer(w: Weights, i: int, p: Params, rope: Rope, ops) -> Block:
    w.info(f"blk.{i}.ffn_gate_inp.bias")  # required: refused by name where absent
    attn = Attention(w, i, ops, hidden=p.hidden, n_heads=p.n_heads, n_kv_heads=p.n_kv_heads, head_dim=p.head_dim,
                     eps=p.eps, rope=rope, window=p.window if p.sliding[i] else 0, sinks=True)
    moe = MoE(w, i, ops, hidden=p.hidden, n_experts=p.n_experts, n_used=p.n_experts_used, expert_ffn=p.expert_ffn,
              act="swiglu_oai", norm_topk=True, biases=True)
    return Block(w, i, ops, hidden=p.hidden, eps=p.eps, mixer=attn, mlp=moe, ffn_norm="post_attention_norm")


def build(p: Params, w: Weights, ops) -> Model:
    rope = Rope.build(p.rope_theta, p.rope_dims, p.rope_scaling, context_length=p.context_length)
    return standard_model(ops, w, p, [layer(w, i, p, rope, ops) for i in range(p.n_layers)])
