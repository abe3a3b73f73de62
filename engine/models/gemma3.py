"""gemma3 (text): sandwich norms around attention and the MLP, RMS-normalized q and
k heads, embeddings scaled by sqrt(hidden), GeGLU (tanh GELU), queries scaled by
query_pre_attn_scalar^-0.5, and sliding-window layers (their own rotary base)
interleaved with global ones (every 6th). The head is tied to the embedding.
`encoder` makes it EmbeddingGemma's (gemma_embedding.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...gguf_io import Keys
from ..modules import Weights
from .base import Model, standard_model
from .layers import MLP, Attention, Block, Rope
from .params import Metadata, RopeScaling, TextParams, sliding_layers

ARCHITECTURE = "gemma3"
CHAT_TEMPLATE_FALLBACK = "gemma"
SLIDING_WINDOW_PATTERN = 6  # every 6th layer attends globally (llama.cpp: set_swa_pattern(6))
LOCAL_ROPE_BASE = 10000.0  # llama.cpp: rope_freq_base_train_swa for Gemma 3


@dataclass
class Params(TextParams):
    window: int = 4096
    sliding: list[bool] = field(default_factory=list)  # per layer: sliding-window attention
    local_rope_theta: float = LOCAL_ROPE_BASE
    query_scale: float = 1.0
    attn_softcap: float | None = None
    final_softcap: float | None = None
    encoder: bool = False  # every token of an input sees every other (EmbeddingGemma)

    @staticmethod
    def read(m: Metadata, c: dict) -> dict:
        n = c["n_layers"]
        # llama.cpp scales queries by 1/sqrt(head_dim), except the 27B (62 layers): 1/sqrt(hidden/heads)
        scalar = c["hidden"] // c["n_heads"] if n == 62 else c["head_dim"]
        return dict(window=m.get(Keys.SLIDING_WINDOW, 4096), sliding=sliding_layers(m, n, SLIDING_WINDOW_PATTERN),
                    local_rope_theta=float(m.get(Keys.ROPE_FREQ_BASE_SWA, LOCAL_ROPE_BASE)),
                    query_scale=scalar ** -0.5, attn_softcap=m.get(Keys.ATTN_LOGIT_SOFTCAPPING, None),
                    final_softcap=m.get(Keys.FINAL_LOGIT_SOFTCAPPING, None))


def layer(w: Weights, i: int, p: Params, rope: Rope, ops) -> Block:
    attn = Attention(w, i, ops, hidden=p.hidden, n_heads=p.n_heads, n_kv_heads=p.n_kv_heads, head_dim=p.head_dim,
                     eps=p.eps, rope=rope, scale=p.query_scale, window=p.window if p.sliding[i] else 0,
                     softcap=p.attn_softcap, qk_norm="head", media_both_ways=True, encoder=p.encoder)
    return Block(w, i, ops, hidden=p.hidden, eps=p.eps, mixer=attn,
                 mlp=MLP(w, i, ops, hidden=p.hidden, ffn=p.ffn, act="gelu_tanh"), post_norms=True)


def build(p: Params, w: Weights, ops) -> Model:
    full = Rope.build(p.rope_theta, p.rope_dims, p.rope_scaling, context_length=p.context_length)
    local = Rope.build(p.local_rope_theta, p.rope_dims, RopeScaling(), context_length=p.context_length)
    layers = [layer(w, i, p, local if p.sliding[i] else full, ops) for i in range(p.n_layers)]
    return standard_model(ops, w, p, layers, embed_scale=p.hidden ** 0.5, softcap=p.final_softcap,
                          both_ways=p.encoder)
