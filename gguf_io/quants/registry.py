"""The codec tables: block type -> dequantizer / quantizer, filled by the codec modules as they are imported.

A leaf module (it imports only the type table), so `legacy`, `kquants` and `iquants` register into it and the
package's `dequantize` / `quantize` read it without an import circle.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..constants import GGMLType

Dequantizer = Callable[[np.ndarray], np.ndarray]
Quantizer = Callable[[np.ndarray], np.ndarray]

DEQUANTIZERS: dict[GGMLType, Dequantizer] = {}
QUANTIZERS: dict[GGMLType, Quantizer] = {}


def register(table: dict, *types: GGMLType):
    """Decorator: `fn` handles each of `types` in `table` (DEQUANTIZERS or QUANTIZERS)."""
    def deco(fn):
        for t in types:
            table[t] = fn
        return fn

    return deco
