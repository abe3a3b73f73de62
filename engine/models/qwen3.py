"""qwen3: qwen2 without biases, with RMS norms on each q and k head. Its rerankers'
classifier (Qwen3-Reranker's yes/no rows) gives probabilities."""

from __future__ import annotations

from . import llama

ARCHITECTURE = "qwen3"
CHAT_TEMPLATE_FALLBACK = "chatml"

Params = llama.Params.member(neox=True, qk_norm="head", rank_softmax=True)
build = llama.build
