"""qwen3moe: qwen3's attention with routed experts (top-k renormalized) in every layer."""

from __future__ import annotations

from dataclasses import dataclass

from . import llama
from .base import Metadata

ARCHITECTURE = "qwen3moe"
CHAT_TEMPLATE_FALLBACK = "chatml"


@dataclass
class Params(llama.Params):
    @classmethod
    def from_gguf(cls, m: Metadata) -> "Params":
        return cls(**cls.common(m), neox=True, qk_norm=True, norm_topk=True, **cls.experts(m))


build = llama.build
