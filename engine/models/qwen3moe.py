"""qwen3moe: qwen3's attention with routed experts (top-k renormalized) in every layer."""

from __future__ import annotations

from . import llama

ARCHITECTURE = "qwen3moe"
CHAT_TEMPLATE_FALLBACK = "chatml"

Params = llama.Params.member(llama.experts, neox=True, qk_norm="head", norm_topk=True)
build = llama.build
