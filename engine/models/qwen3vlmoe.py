"""qwen3vlmoe (Qwen3-VL-30B-A3B and 235B-A22B, the language model of the file): qwen3moe's
layers, with qwen3vl's rotary sections and deepstack image inputs (qwen3vl.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from . import llama, qwen3vl

ARCHITECTURE = "qwen3vlmoe"
CHAT_TEMPLATE_FALLBACK = "chatml"


@dataclass
class Params(llama.Params.member(llama.experts, neox=True, qk_norm="head", norm_topk=True)):
    rope_sections: list[int] = field(default_factory=list)
    read = staticmethod(qwen3vl.sections)


build = qwen3vl.build
