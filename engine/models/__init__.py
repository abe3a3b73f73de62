"""The engine's forward passes: one file per GGUF `general.architecture` in this
package, each with `ARCHITECTURE` (the name llama.cpp's converter writes), `Params`
(a dataclass of params.py's, built by `from_gguf(Metadata)`), `build(params, weights,
ops) -> Model` (base.py's, its optional parts given as it is built) and
optionally `CHAT_TEMPLATE_FALLBACK`. The registry finds them by that name: adding an
architecture is adding its file."""

from __future__ import annotations

import importlib
import pkgutil
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Callable

from ...gguf_io import GGUFReader
from .base import Model
from .params import Metadata, MissingMetadata, TextParams

__all__ = ["Architecture", "MissingMetadata", "Metadata", "Model", "TextParams", "UnsupportedArchitecture",
           "architecture_for", "architectures", "projectors"]

# the pieces architectures are built from, not architectures
SHARED_MODULES = {"base", "layers", "params", "pooling", "vision"}


class UnsupportedArchitecture(ValueError):
    """The file's architecture has no file here."""


@dataclass(frozen=True)
class Architecture:
    """One architecture file, as the loader uses it."""

    name: str
    params: type  # its Params dataclass
    build: Callable  # (params, weights, ops) -> Model
    chat_template_fallback: str | None
    module: ModuleType

    def read(self, reader: GGUFReader) -> TextParams:
        """The file's hyperparameters (raises MissingMetadata naming a required key it lacks)."""
        return self.params.from_gguf(Metadata(reader))


_REGISTRY: dict[str, Architecture] = {}
_PROJECTORS: dict[str, ModuleType] = {}  # vision towers by clip.projector_type: PROJECTOR, Params, build
_FINDING = threading.Lock()


def architectures() -> dict[str, Architecture]:
    """Every architecture file of this package, by `general.architecture` (found once;
    two threads loading models at once both get the whole table)."""
    with _FINDING:
        if not _REGISTRY:
            found: dict[str, Architecture] = {}
            for info in pkgutil.iter_modules(__path__):
                if info.name in SHARED_MODULES or info.name.startswith("_"):
                    continue
                mod = importlib.import_module(f"{__name__}.{info.name}")
                name = getattr(mod, "ARCHITECTURE", None)
                if name is None:
                    if getattr(mod, "PROJECTOR", None) is not None:
                        _PROJECTORS[mod.PROJECTOR] = mod
                    continue
                if name in found:
                    raise RuntimeError(f"architecture {name!r} is defined by both {found[name].module.__name__} "
                                       f"and {mod.__name__}")
                found[name] = Architecture(name, mod.Params, mod.build, getattr(mod, "CHAT_TEMPLATE_FALLBACK", None),
                                           mod)
            _REGISTRY.update(found)
    return _REGISTRY


def architecture_for(reader: GGUFReader) -> Architecture:
    name = reader.architecture
    arch = architectures().get(name)
    if arch is None:
        raise UnsupportedArchitecture(
            f"{reader.path}: architecture {name!r} is not supported; supported: {', '.join(sorted(architectures()))}")
    return arch


def projectors() -> dict[str, ModuleType]:
    """Every vision tower file of this package (`PROJECTOR`, `TEXT_ARCHITECTURES`, `Params`,
    `build(params, weights)`), by the `clip.projector_type` llama.cpp's converter writes."""
    architectures()
    return _PROJECTORS
