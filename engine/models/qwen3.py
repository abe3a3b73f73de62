"""qwen3: qwen2 without biases, with RMS norms on each q and k head."""

from __future__ import annotations

from dataclasses import dataclass

from . import llama
from .base import Metadata

ARCHITECTURE = "qwen3"
CHAT_TEMPLATE_FALLBACK = "chatml"


@dataclass
class Params(llama.Params):
    @classmethod
    def from_gguf(cls, m: Metadata) -> "Params":
        return cls(**cls.common(m), neox=True, qk_norm=True)


build = llama.build
