"""gemma-embedding (EmbeddingGemma): Gemma 3's layers as an encoder. Every token of an
input sees every other (llama.cpp: causal_attn false), the sliding layers within a
window symmetric about the query (|q - k| <= sliding_window / 2, llama.cpp's
LLAMA_SWA_TYPE_SYMMETRIC; transformers' bidirectional overlay of sliding_window // 2 + 1,
exclusive). Mean pooling, then the dense_2 / dense_3 projections the converter stores
with --sentence-transformers-dense-modules (engine.embed). A whole input goes in one
forward, so its layers keep every position (no ring)."""

from __future__ import annotations

from ..cache import attention
from ..modules import Weights
from . import gemma3
from .base import Model

ARCHITECTURE = "gemma-embedding"
CHAT_TEMPLATE_FALLBACK = "gemma"
Params = gemma3.Params


def build(p: Params, w: Weights, ops) -> Model:
    model = gemma3.build(p, w, ops)
    model.both_ways = True
    for layer in model.layers:  # the window is the mask's, not the cache's
        spec = layer.attn.spec
        layer.cache_spec = lambda spec=spec: attention(spec.n_kv_heads, spec.head_dim, 0)
    return model
