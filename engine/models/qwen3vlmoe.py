"""qwen3vlmoe (Qwen3-VL-30B-A3B and 235B-A22B, the language model of the file): qwen3moe's
layers, with qwen3vl's rotary sections (NeoX rotary over the whole head for text). Text
only, as qwen3vl."""

from __future__ import annotations

from . import llama

ARCHITECTURE = "qwen3vlmoe"
CHAT_TEMPLATE_FALLBACK = "chatml"

Params = llama.Params.member(llama.experts, neox=True, qk_norm="head", norm_topk=True)
build = llama.build
