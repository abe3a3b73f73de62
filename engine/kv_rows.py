"""How a KV cache row is stored: the row types llama-server's --cache-type-k/-v name, built from gguf_io's type
table (a quantized row is a run of that type's blocks). A leaf module: the cache and its kernels read it; it
imports only torch, the type table and the names the settings choose from (engine.options)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..gguf_io import TYPE_INFO, GGMLType
from .options import CACHE_TYPES


@dataclass(frozen=True)
class KVType:
    """How a cache row (one head's values at one position) is stored: `name` as
    llama-server's --cache-type-k/-v take it, GGML's type id (the native kernels'), the
    torch dtype of the buffer, and `block` values in `block_bytes` bytes. The quantized
    types (blocks of 32: an fp16 scale and 8- or 4-bit values) are uint8 buffers whose
    last dimension is the row's bytes."""

    name: str
    ggml: int
    dtype: torch.dtype
    block: int = 1
    block_bytes: int = 4

    def row_bytes(self, head_dim: int) -> int:
        return head_dim // self.block * self.block_bytes

    def row_elements(self, head_dim: int) -> int:
        """The buffer's last dimension."""
        return head_dim if self.block == 1 else self.row_bytes(head_dim)

    @property
    def quantized(self) -> bool:
        return self.block > 1


def _row_type(t: GGMLType, dtype: torch.dtype) -> KVType:
    info = TYPE_INFO[t]
    return KVType(t.name.lower(), int(t), dtype, info.block_size, info.type_size)


_FLOAT_ROWS = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}  # the others: bytes of blocks
KV_TYPES = {name: _row_type(GGMLType[name.upper()], _FLOAT_ROWS.get(name, torch.uint8)) for name in CACHE_TYPES}
_BY_DTYPE = {dtype: name for name, dtype in _FLOAT_ROWS.items()}


def kv_types(dtype: torch.dtype, k: str | None = None, v: str | None = None) -> tuple[KVType, KVType]:
    """The cache's (key, value) row types: as named, else the compute dtype's."""
    default = _BY_DTYPE.get(dtype, "f32")
    out = []
    for what, name in (("k", k), ("v", v)):
        name = (name or default).lower()
        if name not in KV_TYPES:
            raise ValueError(f"cache type {what}={name!r}: expected one of {', '.join(KV_TYPES)}")
        out.append(KV_TYPES[name])
    return out[0], out[1]
