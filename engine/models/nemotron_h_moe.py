"""nemotron_h_moe (NVIDIA Nemotron 3 Nano and the Nemotron-H MoE files): nemotron_h's layers
with relu-squared routed experts in place of the MLP layers (nemotron_h.py)."""

from __future__ import annotations

from . import nemotron_h

ARCHITECTURE = "nemotron_h_moe"

Params = nemotron_h.Params
build = nemotron_h.build
