"""How a KV cache row is stored: the row types llama-server's --cache-type-k/-v name, built from gguf_io's type
table (a quantized row is a run of that type's blocks). A leaf module: the cache, its kernels and the settings'
choices read it; it imports only torch and the type table."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..gguf_io import TYPE_INFO, GGMLType


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


KV_TYPES = {t.name: t for t in (
    _row_type(GGMLType.F32, torch.float32), _row_type(GGMLType.F16, torch.float16),
    _row_type(GGMLType.BF16, torch.bfloat16), _row_type(GGMLType.Q8_0, torch.uint8),
    _row_type(GGMLType.Q4_0, torch.uint8), _row_type(GGMLType.Q4_1, torch.uint8),
    _row_type(GGMLType.Q5_0, torch.uint8), _row_type(GGMLType.Q5_1, torch.uint8),
    _row_type(GGMLType.IQ4_NL, torch.uint8))}
_BY_DTYPE = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


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
