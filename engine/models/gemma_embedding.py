"""gemma-embedding (EmbeddingGemma): Gemma 3's layers as an encoder. Every token of an
input sees every other (llama.cpp: causal_attn false), the sliding layers within a
window symmetric about the query (|q - k| <= sliding_window / 2, llama.cpp's
LLAMA_SWA_TYPE_SYMMETRIC; transformers' bidirectional overlay of sliding_window // 2 + 1,
exclusive). Mean pooling, then the dense_2 / dense_3 projections the converter stores
with --sentence-transformers-dense-modules (models.pooling). A whole input goes in one
forward, so its layers keep every position (no ring)."""

from __future__ import annotations

from . import gemma3

ARCHITECTURE = "gemma-embedding"
CHAT_TEMPLATE_FALLBACK = "gemma"

Params = gemma3.Params.member(encoder=True)
build = gemma3.build
