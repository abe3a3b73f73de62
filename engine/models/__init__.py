"""The engine's own forward passes, one small file per architecture family; this
registry maps a GGUF `general.architecture` to its family's `build`."""

from __future__ import annotations

from . import gemma3, llama, qwen35

BUILDERS = {
    "llama": llama.build,
    "qwen2": llama.build,
    "qwen3": llama.build,
    "qwen3moe": llama.build,
    "phi3": llama.build,
    "gemma3": gemma3.build,
    "qwen35": qwen35.build,
    "qwen35moe": qwen35.build,
}
