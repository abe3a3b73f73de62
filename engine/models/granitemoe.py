"""granitemoe (IBM Granite 3.x MoE, and MoE Shared with its shared MLP: conversion/granite.py
GraniteMoeModel, which splits each layer's fused expert gate/up): granite's layers with
softmax-routed experts, the chosen weights renormalized."""

from __future__ import annotations

from ...gguf_io import Keys
from . import granite
from .params import Metadata

ARCHITECTURE = "granitemoe"


def experts(m: Metadata, c: dict) -> dict:
    """The file's feed_forward_length is each expert's."""
    return dict(n_experts=m.get(Keys.EXPERT_COUNT), n_experts_used=m.get(Keys.EXPERT_USED_COUNT),
                expert_ffn=m.get(Keys.FEED_FORWARD_LENGTH))


Params = granite.Params.member(experts)
build = granite.build
