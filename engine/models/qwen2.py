"""qwen2: llama's layers with q/k/v biases (read where the file has them) and NeoX rotary."""

from __future__ import annotations

from . import llama

ARCHITECTURE = "qwen2"
CHAT_TEMPLATE_FALLBACK = "chatml"

Params = llama.Params.member(neox=True)
build = llama.build
