"""Block (de)quantization of every ggml tensor type, in vectorized numpy.

Each type registers a function over `(n_blocks, type_size)` uint8 arrays (in
`registry`, a leaf the codec modules import): dequantizers return
`(n_blocks, block_size)` float32 and quantizers the reverse.
`dequantize` and `quantize` are the public entry points; they work in bounded
chunks of blocks so temporaries stay small whatever the tensor size.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..constants import TYPE_INFO, GGMLType
from . import iquants, kquants, legacy  # noqa: F401  (each registers its types)
from .registry import DEQUANTIZERS, QUANTIZERS

_CHUNK_BLOCKS = 1 << 14


def _n_elements(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def dequantize(data: np.ndarray, ggml_type: GGMLType | int, shape: Sequence[int]) -> np.ndarray:
    """Packed bytes of a tensor of `shape` (torch order) → float32 array of `shape`."""
    gtype = GGMLType(ggml_type)
    info = TYPE_INFO[gtype]
    shape = tuple(int(d) for d in shape)
    n = _n_elements(shape)
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    expected = (n // info.block_size) * info.type_size
    if (shape and shape[-1] % info.block_size) or raw.size != expected:
        raise ValueError(
            f"{gtype.name} tensor of shape {shape} needs {expected} bytes "
            f"(rows a multiple of {info.block_size}), got {raw.size}"
        )
    if not info.quantized:
        if gtype == GGMLType.BF16:
            out = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            out = raw.view(info.dtype).astype(np.float32)
        return out.reshape(shape)
    fn = DEQUANTIZERS.get(gtype)
    if fn is None:
        raise NotImplementedError(f"dequantization of {gtype.name} is not implemented")
    blocks = raw.reshape(-1, info.type_size)
    out = np.empty((blocks.shape[0], info.block_size), dtype=np.float32)
    with np.errstate(all="ignore"):  # inf/nan scales decode to inf/nan, as in ggml
        for start in range(0, blocks.shape[0], _CHUNK_BLOCKS):
            out[start : start + _CHUNK_BLOCKS] = fn(blocks[start : start + _CHUNK_BLOCKS])
    return out.reshape(shape)


def quantize(array: np.ndarray, ggml_type: GGMLType | int) -> np.ndarray:
    """float array → packed uint8 blocks, shaped (*array.shape[:-1], row_bytes)."""
    gtype = GGMLType(ggml_type)
    info = TYPE_INFO[gtype]
    arr = np.ascontiguousarray(array, dtype=np.float32)
    if arr.ndim == 0 or arr.shape[-1] % info.block_size:
        raise ValueError(f"{gtype.name}: row length {arr.shape[-1] if arr.ndim else 0} is not a multiple of {info.block_size}")
    row_bytes = arr.shape[-1] // info.block_size * info.type_size
    if gtype == GGMLType.F32:
        out = arr.view(np.uint8)
    elif gtype == GGMLType.F16:
        out = arr.astype("<f2").view(np.uint8)
    elif gtype == GGMLType.BF16:
        out = _to_bf16(arr).view(np.uint8)
    elif gtype in QUANTIZERS:
        blocks = arr.reshape(-1, info.block_size)
        out = np.empty((blocks.shape[0], info.type_size), dtype=np.uint8)
        for start in range(0, blocks.shape[0], _CHUNK_BLOCKS):
            out[start : start + _CHUNK_BLOCKS] = QUANTIZERS[gtype](blocks[start : start + _CHUNK_BLOCKS])
    else:
        raise NotImplementedError(f"quantization to {gtype.name} is not implemented")
    return out.reshape(*arr.shape[:-1], row_bytes)


def _to_bf16(arr: np.ndarray) -> np.ndarray:
    """float32 → bfloat16 bits, round to nearest even, NaNs kept quiet (as ggml)."""
    bits = arr.view(np.uint32).astype(np.uint64)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
    quiet = ((bits >> 16) | 64) & 0xFFFF
    return np.where(nan, quiet, rounded).astype("<u2")

__all__ = ["dequantize", "quantize", "DEQUANTIZERS", "QUANTIZERS"]
