"""One small file per GGUF `general.architecture`; this registry maps the name to it."""

from __future__ import annotations

from .base import Architecture
from .gemma3 import Gemma3
from .llama import Llama
from .phi3 import Phi3
from .qwen2 import Qwen2
from .qwen3 import Qwen3
from .qwen3moe import Qwen3Moe
from .qwen35 import Qwen35
from .qwen35moe import Qwen35Moe

ARCHITECTURES: dict[str, type[Architecture]] = {
    cls.name: cls for cls in (Llama, Qwen2, Qwen3, Qwen3Moe, Qwen35, Qwen35Moe, Gemma3, Phi3)
}


class UnsupportedArchitecture(ValueError):
    """The file's architecture has no architecture file here."""


def architecture_for(reader) -> Architecture:
    name = reader.architecture
    cls = ARCHITECTURES.get(name)
    if cls is None:
        raise UnsupportedArchitecture(
            f"{reader.path}: architecture {name!r} is not supported; supported: {', '.join(sorted(ARCHITECTURES))}")
    return cls(reader)
