"""olmo2 (OLMo 2, and OLMo 3 files, which llama.cpp also writes as `olmo2`): no norms
before attention and the MLP, RMS norms after them instead (post_attention_norm,
post_ffw_norm, added to the residual), q and k RMS-normalized over the whole
projection (all heads at once, not per head), NeoX rotary. OLMo 3 adds sliding-window
layers (`attention.sliding_window_pattern`, else every fourth layer global) whose
rotary has no scaling."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...gguf_io import Keys
from ..modules import Weights
from .base import Model, standard_model
from .layers import MLP, Attention, Block, Rope
from .params import Metadata, RopeScaling, TextParams, sliding_layers

ARCHITECTURE = "olmo2"
GLOBAL_EVERY = 4  # llama.cpp's default pattern: every 4th layer global


@dataclass
class Params(TextParams):
    window: int = 0  # 0: no sliding-window layers (OLMo 2)
    sliding: list[bool] = field(default_factory=list)
    local_rope_theta: float = 0.0

    @staticmethod
    def read(m: Metadata, c: dict) -> dict:
        n, window = c["n_layers"], m.get(Keys.SLIDING_WINDOW, 0) or 0
        return dict(window=window, sliding=sliding_layers(m, n, GLOBAL_EVERY) if window else [False] * n,
                    local_rope_theta=float(m.get(Keys.ROPE_FREQ_BASE_SWA, c["rope_theta"])))


def layer(w: Weights, i: int, p: Params, rope: Rope, ops) -> Block:
    attn = Attention(w, i, ops, hidden=p.hidden, n_heads=p.n_heads, n_kv_heads=p.n_kv_heads, head_dim=p.head_dim,
                     eps=p.eps, rope=rope, window=p.window if p.sliding[i] else 0, qk_norm="whole")
    return Block(w, i, ops, hidden=p.hidden, eps=p.eps, mixer=attn, mlp=MLP(w, i, ops, hidden=p.hidden, ffn=p.ffn,
                 act="silu"), attn_norm=None, ffn_norm=None, post_norms=True)


def build(p: Params, w: Weights, ops) -> Model:
    full = Rope.build(p.rope_theta, p.rope_dims, p.rope_scaling, context_length=p.context_length)
    local = Rope.build(p.local_rope_theta, p.rope_dims, RopeScaling(), context_length=p.context_length)
    return standard_model(ops, w, p, [layer(w, i, p, local if p.sliding[i] else full, ops) for i in range(p.n_layers)])
