"""qwen2: llama's layers with q/k/v biases (read where the file has them) and NeoX rotary."""

from __future__ import annotations

from dataclasses import dataclass

from . import llama
from .base import Metadata

ARCHITECTURE = "qwen2"
CHAT_TEMPLATE_FALLBACK = "chatml"


@dataclass
class Params(llama.Params):
    @classmethod
    def from_gguf(cls, m: Metadata) -> "Params":
        return cls(**cls.common(m), neox=True)


build = llama.build
