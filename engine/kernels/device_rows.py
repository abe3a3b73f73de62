"""KV cache rows of the quantized types written and read on the tensors' own device, in
torch: the same bytes gguf_io's quantizers give (round-to-nearest-even float16 scales,
C's roundf and truncation where ggml's reference uses them), without a trip through the
host. IQ4_NL's quantizer (a search over scales) goes through gguf_io on the host."""

from __future__ import annotations

import torch

from ...gguf_io import TYPE_INFO, GGMLType
from ...gguf_io.quants import quantize as np_quantize
from . import reference


def _f16_bytes(v: torch.Tensor) -> torch.Tensor:
    """float32 (n, 1) → (n, 2) uint8: the little-endian float16."""
    return v.to(torch.float16).contiguous().view(torch.uint8)


def _inverse(d: torch.Tensor) -> torch.Tensor:
    return torch.where(d == 0, torch.zeros_like(d), 1.0 / torch.where(d == 0, torch.ones_like(d), d))


def _round_away(x: torch.Tensor) -> torch.Tensor:
    a = x.abs()
    f = torch.floor(a)
    return torch.sign(x) * (f + torch.floor(2 * (a - f)))


def _absmax_signed(x: torch.Tensor) -> torch.Tensor:
    """Per block the element of largest magnitude (the first on ties), with its sign."""
    return torch.gather(x, 1, x.abs().argmax(dim=1, keepdim=True))


def _trunc_u8(v: torch.Tensor, hi: int) -> torch.Tensor:
    return torch.trunc(v).clamp(0, hi).to(torch.uint8)


def _nibbles(q: torch.Tensor) -> torch.Tensor:
    return (q[:, :16] & 0x0F) | (q[:, 16:] << 4)


def _high_bits(q: torch.Tensor) -> torch.Tensor:
    """Bit 4 of each of 32 values, packed little-endian into 4 bytes."""
    bits = ((q >> 4) & 1).view(-1, 4, 8).to(torch.int32)
    weights = 1 << torch.arange(8, device=q.device, dtype=torch.int32)
    return (bits * weights).sum(-1).to(torch.uint8)


def _q8_0(x):
    d = x.abs().amax(dim=1, keepdim=True) / 127.0
    q = _round_away(x * _inverse(d)).to(torch.int8).view(torch.uint8)
    return torch.cat([_f16_bytes(d), q], dim=1)


def _q4_0(x):
    d = _absmax_signed(x) / -8.0
    return torch.cat([_f16_bytes(d), _nibbles(_trunc_u8(x * _inverse(d) + 8.5, 15))], dim=1)


def _q5_0(x):
    d = _absmax_signed(x) / -16.0
    q = _trunc_u8(x * _inverse(d) + 16.5, 31)
    return torch.cat([_f16_bytes(d), _high_bits(q), _nibbles(q & 0x0F)], dim=1)


def _q_1(x, levels: int, five: bool):
    lo, hi = x.amin(dim=1, keepdim=True), x.amax(dim=1, keepdim=True)
    d = (hi - lo) / float(levels)
    q = _trunc_u8((x - lo) * _inverse(d) + 0.5, levels)
    parts = [_f16_bytes(d), _f16_bytes(lo)] + ([_high_bits(q)] if five else []) + [_nibbles(q & 0x0F)]
    return torch.cat(parts, dim=1)


_QUANTIZERS = {GGMLType.Q8_0: _q8_0, GGMLType.Q4_0: _q4_0, GGMLType.Q5_0: _q5_0,
               GGMLType.Q4_1: lambda x: _q_1(x, 15, False), GGMLType.Q5_1: lambda x: _q_1(x, 31, True)}


def quantize(x: torch.Tensor, ggml_type: int) -> torch.Tensor:
    """(..., n) values → (..., row bytes) uint8 rows of `ggml_type`, on x's device."""
    gtype = GGMLType(ggml_type)
    info = TYPE_INFO[gtype]
    lead, n = x.shape[:-1], x.shape[-1]
    blocks = x.detach().reshape(-1, info.block_size).float()
    fn = _QUANTIZERS.get(gtype)
    if fn is None:  # IQ4_NL: gguf_io's quantizer, on the host
        host = np_quantize(blocks.cpu().numpy(), gtype)
        out = torch.from_numpy(host).to(x.device)
    else:
        out = fn(blocks)
    return out.reshape(*lead, n // info.block_size * info.type_size)


def dequantize(rows: torch.Tensor, ggml_type: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """(..., row bytes) uint8 rows of `ggml_type` → (..., n) values of `dtype`, on their device."""
    lead = rows.shape[:-1]
    flat = rows.reshape(-1, rows.shape[-1])
    return reference.dequantize_rows(flat, GGMLType(ggml_type), n, dtype).reshape(*lead, n)
