"""The portable torch kernels: block dequantization in torch ops on any device, and
the kernel interface built on it (dequantize, get_rows, mul_mat_vec), working in
bounded row chunks so that no whole weight is ever dequantized at once.

This is the ground truth every fast kernel is tested against. Block layouts and the
arithmetic order follow gguf_io (itself bit-identical to gguf-py), so results are
bit-identical to `gguf_io.dequantize` for every type decoded here; types without a
torch decoder go through gguf_io's numpy decoder on the CPU.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ...gguf_io import TYPE_INFO, GGMLType
from ...gguf_io import dequantize as np_dequantize

BlockDecoder = Callable[[torch.Tensor], torch.Tensor]  # (n, type_size) uint8 → (n, block_size) f32
DECODERS: dict[GGMLType, BlockDecoder] = {}

# Types mul_mat_vec takes (all weight types: the reference decodes every one).
GEMV_TYPES = [int(t) for t, info in TYPE_INFO.items() if info.quantized] + [int(GGMLType.F16), int(GGMLType.BF16), int(GGMLType.F32)]

# Rows are dequantized this many elements at a time (about 16 MB of float32).
CHUNK_ELEMENTS = 1 << 22

KVALUES_IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
KVALUES_MXFP4 = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)  # E2M1 doubled


def decoder(*types: GGMLType):
    def deco(fn):
        for t in types:
            DECODERS[t] = fn
        return fn
    return deco


def _f16(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).float()


def _i32(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.int32)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1)


def _shifted(b: torch.Tensor, shifts: list[int], mask: int) -> torch.Tensor:
    """(…, k) → (…, len(shifts), k): field of each byte at each shift."""
    s = torch.tensor(shifts, dtype=b.dtype, device=b.device).view(*([1] * (b.dim() - 1)), -1, 1)
    return (b.unsqueeze(-2) >> s) & mask


@decoder(GGMLType.Q4_0)
def _q4_0(b):
    return _f16(b[:, 0:2]) * (_nibbles(b[:, 2:18]).to(torch.int8) - 8).float()


@decoder(GGMLType.Q4_1)
def _q4_1(b):
    return _f16(b[:, 0:2]) * _nibbles(b[:, 4:20]).float() + _f16(b[:, 2:4])


def _q5_bits(qh: torch.Tensor, qs: torch.Tensor) -> torch.Tensor:
    high = (_i32(qh) >> torch.arange(32, dtype=torch.int32, device=qh.device)) & 1
    return _nibbles(qs) | (high.to(torch.uint8) << 4)


@decoder(GGMLType.Q5_0)
def _q5_0(b):
    return _f16(b[:, 0:2]) * (_q5_bits(b[:, 2:6], b[:, 6:22]).to(torch.int8) - 16).float()


@decoder(GGMLType.Q5_1)
def _q5_1(b):
    return _f16(b[:, 0:2]) * _q5_bits(b[:, 4:8], b[:, 8:24]).float() + _f16(b[:, 2:4])


@decoder(GGMLType.Q8_0)
def _q8_0(b):
    return b[:, 2:34].contiguous().view(torch.int8).float() * _f16(b[:, 0:2])


def _q2_layout(qs):
    n = qs.shape[0]
    return _shifted(qs.view(n, 2, 32), [0, 2, 4, 6], 3).reshape(n, 256)


@decoder(GGMLType.Q2_K)
def _q2_k(b):
    n = b.shape[0]
    sc = b[:, 0:16]
    dl = (_f16(b[:, 80:82]) * (sc & 0xF).float()).view(n, 16, 1)
    ml = (_f16(b[:, 82:84]) * (sc >> 4).float()).view(n, 16, 1)
    q = _q2_layout(b[:, 16:80]).view(n, 16, 16).float()
    return (dl * q - ml).reshape(n, 256)


@decoder(GGMLType.Q3_K)
def _q3_k(b):
    n = b.shape[0]
    hmask, qs, sc = b[:, 0:32], b[:, 32:96], b[:, 96:108]
    low = torch.cat([sc[:, 0:8] & 0x0F, sc[:, 0:8] >> 4], dim=1)
    high = _shifted(sc[:, 8:12], [0, 2, 4, 6], 3).reshape(n, 16)  # scale j: byte j % 4, field j // 4
    scales = ((low | (high << 4)).to(torch.int8) - 32).float()
    dl = (_f16(b[:, 108:110]) * scales).view(n, 16, 1)
    hbit = _shifted(hmask, list(range(8)), 1).reshape(n, 256)
    q = (_q2_layout(qs).to(torch.int8) - ((hbit ^ 1) << 2).to(torch.int8)).float()
    return (dl * q.view(n, 16, 16)).reshape(n, 256)


def _scale_min_k4(sc):
    d, m, md = sc[:, 0:4], sc[:, 4:8], sc[:, 8:12]
    scales = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=1)
    mins = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=1)
    return scales, mins


def _q45_scales(b):
    n = b.shape[0]
    sc, m = _scale_min_k4(b[:, 4:16])
    dl = (_f16(b[:, 0:2]) * sc.float()).view(n, 8, 1)
    ml = (_f16(b[:, 2:4]) * m.float()).view(n, 8, 1)
    return dl, ml


def _q4_layout(qs):
    n = qs.shape[0]
    return _shifted(qs.reshape(n, 4, 32), [0, 4], 0x0F).reshape(n, 256)


@decoder(GGMLType.Q4_K)
def _q4_k(b):
    n = b.shape[0]
    dl, ml = _q45_scales(b)
    return (dl * _q4_layout(b[:, 16:144]).view(n, 8, 32).float() - ml).reshape(n, 256)


@decoder(GGMLType.Q5_K)
def _q5_k(b):
    n = b.shape[0]
    dl, ml = _q45_scales(b)
    high = _shifted(b[:, 16:48], list(range(8)), 1).reshape(n, 256)
    q = (_q4_layout(b[:, 48:176]) | (high << 4)).view(n, 8, 32).float()
    return (dl * q - ml).reshape(n, 256)


@decoder(GGMLType.Q6_K)
def _q6_k(b):
    n = b.shape[0]
    dl = (_f16(b[:, 208:210]) * b[:, 192:208].contiguous().view(torch.int8).float()).view(n, 16, 1)
    low = _shifted(b[:, 0:128].reshape(n, 2, 64), [0, 4], 0x0F).reshape(n, 256)
    high = _shifted(b[:, 128:192].reshape(n, 2, 32), [0, 2, 4, 6], 3).reshape(n, 256)
    q = ((low | (high << 4)).to(torch.int8) - 32).float()
    return (dl * q.view(n, 16, 16)).reshape(n, 256)


def _iq4_values(idx: torch.Tensor) -> torch.Tensor:
    table = torch.tensor(KVALUES_IQ4NL, dtype=torch.float32, device=idx.device)
    return table[idx.long()]


@decoder(GGMLType.IQ4_NL)
def _iq4_nl(b):
    return _f16(b[:, 0:2]) * _iq4_values(_nibbles(b[:, 2:18]))


@decoder(GGMLType.IQ4_XS)
def _iq4_xs(b):
    n = b.shape[0]
    sh = b[:, 2:4].contiguous().view(torch.int16).to(torch.int32)
    sl = b[:, 4:8]
    low = torch.stack([sl & 0x0F, sl >> 4], dim=-1).reshape(n, 8)
    high = ((sh >> (2 * torch.arange(8, dtype=torch.int32, device=b.device))) & 3).to(torch.uint8)
    ls = ((low | (high << 4)).to(torch.int8) - 32).float()
    dl = (_f16(b[:, 0:2]) * ls).view(n, 8, 1)
    q = _nibbles(b[:, 8:136].reshape(n * 8, 16)).view(n, 8, 32)
    return (dl * _iq4_values(q)).reshape(n, 256)


@decoder(GGMLType.MXFP4)
def _mxfp4(b):
    e = b[:, 0:1].to(torch.int32)
    # 2^(e - 128) exactly, as float32 bits (e < 2: the subnormals)
    bits = torch.where(e < 2, 0x00200000 << e, (e - 1) << 23)
    table = torch.tensor(KVALUES_MXFP4, dtype=torch.float32, device=b.device)
    return bits.view(torch.float32) * table[_nibbles(b[:, 1:17]).long()]


def _decode_blocks(blocks: torch.Tensor, gtype: GGMLType) -> torch.Tensor:
    """(n, type_size) uint8 on any device → (n, block_size) float32 on the same device."""
    fn = DECODERS.get(gtype)
    if fn is not None:
        return fn(blocks)
    info = TYPE_INFO[gtype]
    host = blocks.detach().cpu().numpy()
    out = np_dequantize(host, gtype, (host.shape[0], info.block_size))
    return torch.from_numpy(out).to(blocks.device)


def dequantize_rows(weight: torch.Tensor, ggml_type: GGMLType, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """Packed rows (r, row_bytes) uint8 → (r, cols) of `dtype` (no chunking: callers chunk)."""
    gtype = GGMLType(ggml_type)
    info = TYPE_INFO[gtype]
    rows = weight.shape[0]
    if not info.quantized:
        if gtype == GGMLType.F32:
            return weight.contiguous().view(torch.float32).to(dtype)
        if gtype == GGMLType.F16:
            return weight.contiguous().view(torch.float16).to(dtype)
        if gtype == GGMLType.BF16:
            return weight.contiguous().view(torch.bfloat16).to(dtype)
        raise TypeError(f"{gtype.name} tensors hold no weights")
    blocks = weight.reshape(rows * (cols // info.block_size), info.type_size)
    return _decode_blocks(blocks, gtype).reshape(rows, cols).to(dtype)


def rows_per_chunk(cols: int) -> int:
    return max(1, CHUNK_ELEMENTS // max(cols, 1))


def dequantize(weight: torch.Tensor, ggml_type: GGMLType, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """The whole (rows, cols) matrix, built chunk by chunk (for tests and small tensors)."""
    out = torch.empty(rows, cols, dtype=dtype, device=weight.device)
    step = rows_per_chunk(cols)
    for r in range(0, rows, step):
        out[r:r + step] = dequantize_rows(weight[r:r + step], ggml_type, cols, dtype)
    return out


def get_rows(weight: torch.Tensor, indices: torch.Tensor, ggml_type: GGMLType, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """Embedding lookup: only the selected rows are dequantized."""
    flat = indices.reshape(-1).to(weight.device)
    out = dequantize_rows(weight.index_select(0, flat), ggml_type, cols, dtype)
    return out.reshape(*indices.shape, cols)


def matmul_by_tiles(weight: torch.Tensor, x2: torch.Tensor, out_features: int, step: int,
                    dequantize_tile: Callable[[torch.Tensor, int], torch.Tensor]) -> torch.Tensor:
    """x2 (n, in) @ W.T for packed W (out, row_bytes): W is dequantized `step` rows at a
    time by dequantize_tile(rows, n_rows), so no whole weight ever exists in float."""
    out = torch.empty(x2.shape[0], out_features, dtype=x2.dtype, device=x2.device)
    for r in range(0, out_features, step):
        n = min(step, out_features - r)
        out[:, r:r + n] = x2 @ dequantize_tile(weight[r:r + n], n).T
    return out


def mul_mat_vec(weight: torch.Tensor, x: torch.Tensor, ggml_type: GGMLType, out_features: int) -> torch.Tensor:
    """x (…, in) @ W.T for packed W (out, row_bytes), dequantizing bounded row chunks."""
    cols = x.shape[-1]
    out = matmul_by_tiles(weight, x.reshape(-1, cols), out_features, rows_per_chunk(cols),
                          lambda rows, n: dequantize_rows(rows, ggml_type, cols, x.dtype))
    return out.reshape(*x.shape[:-1], out_features)


def mul_mat_id(weight: torch.Tensor, x: torch.Tensor, ids: torch.Tensor, ggml_type: GGMLType,
               out_features: int, mul_mat: Callable = None) -> torch.Tensor:
    """Mixture-of-experts matmul: weight (experts, out, row_bytes) packed; x (T, in) used
    by every selected expert or (T, K, in) one row per selection; ids (T, K) expert
    indices. Returns (T, K, out). Only experts that were selected are touched, each
    with `mul_mat` (this module's mul_mat_vec by default)."""
    mul_mat = mul_mat or mul_mat_vec
    t, k = ids.shape
    xk = x.unsqueeze(1).expand(t, k, x.shape[-1]) if x.dim() == 2 else x
    out = torch.empty(t, k, out_features, dtype=x.dtype, device=x.device)
    for e in torch.unique(ids).tolist():
        mask = ids == e
        out[mask] = mul_mat(weight[e], xk[mask], ggml_type, out_features)
    return out


def as_tensor(data: np.ndarray) -> torch.Tensor:
    """Zero-copy torch view of a (read-only) numpy byte array from the memory map."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch warns that the map is read-only
        return torch.from_numpy(data)
