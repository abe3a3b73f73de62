"""qwen35moe (Qwen3.5 MoE): qwen35's hybrid layers with routed experts plus a gated
shared expert in every layer."""

from __future__ import annotations

from ...gguf_io import Keys
from . import qwen35
from .params import Metadata

ARCHITECTURE = "qwen35moe"
CHAT_TEMPLATE_FALLBACK = "chatml"


def experts(m: Metadata, c: dict) -> dict:
    n_ff = m.get(Keys.EXPERT_FEED_FORWARD_LENGTH)
    return dict(n_experts=m.get(Keys.EXPERT_COUNT), n_experts_used=m.get(Keys.EXPERT_USED_COUNT), expert_ffn=n_ff,
                shared_ffn=m.get(Keys.EXPERT_SHARED_FEED_FORWARD_LENGTH, n_ff))


Params = qwen35.Params.member(experts)
build = qwen35.build
