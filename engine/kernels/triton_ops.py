"""Our Triton kernels for packed GGUF weights: the blocks stay packed on the device (the
file's bytes as uint8 rows) and every product decodes them tile by tile in registers.

- `mul_mat`: y = x @ W.T over (BLOCK_M rows of x) x (BLOCK_N rows of W) tiles; each step
  decodes one GGUF block (32 or 256 values) of BLOCK_N rows to float and multiplies with
  `tl.dot` in the activations' dtype (bfloat16 on CUDA), accumulating in float32.
- `get_rows` / `dequantize`: the selected rows decoded, one block a program.
- `mul_mat_id`: the MoE product in one launch: the (token, slot) pairs sorted by expert
  on the device, each program BLOCK_M pairs of one expert times that expert's rows, its
  outputs written to the pairs' rows (no host sync: the grid is sized for the most tiles
  there can be, and the spare ones return at once).

Types decoded: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, the k-quants Q2_K to Q6_K, IQ4_NL, IQ4_XS and
MXFP4 here; the codebook i-quants (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S)
and the ternary TQ1_0, TQ2_0 in kernels.triton_iquants, their grids in the same table
of values as the IQ4 and MXFP4 ones. Each type's decoding gives a (rows, block) float32
tile with the arithmetic in gguf_io's order (so that a decoded tile equals
`gguf_io.dequantize`'s). Float weights (F32, F16, BF16) are torch's matmul.

Triton kernels need a GPU, or `TRITON_INTERPRET=1` set before this module is imported:
then they run on CPU tensors through Triton's interpreter (slow; float32 only), which is
how the tests check every kernel on machines without a GPU. Without the `triton` package
this module offers nothing (`AVAILABLE` False) and the selection never picks it."""

from __future__ import annotations

import os

import numpy as np
import torch

from ...gguf_io import TYPE_INFO, GGMLType
from . import reference, triton_iquants
from .interface import KernelOps

try:
    import triton
    import triton.language as tl
except ImportError:  # an optional dependency: the reference serves instead
    triton = None

AVAILABLE = triton is not None
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # read by triton.jit when this module is imported

# the types decoded here, by their GGML type code (the kernels' TYPE constant)
TYPES = (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.Q2_K,
         GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.IQ4_NL, GGMLType.IQ4_XS,
         GGMLType.MXFP4, *triton_iquants.TYPES)
FLOATS = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
# IQ4 values at 0, MXFP4's (doubled) at 16, the i-quants' codebooks (triton_iquants.grid_table) from 32
_TABLES = np.concatenate([np.array(reference.KVALUES_IQ4NL + reference.KVALUES_MXFP4, dtype=np.float32),
                          triton_iquants.grid_table()])


def supports(ggml_type: GGMLType) -> bool:
    return AVAILABLE and (GGMLType(ggml_type) in TYPES or GGMLType(ggml_type) in FLOATS)


def usable_on(device: torch.device | str) -> bool:
    """Whether the kernels can run on tensors of `device`: a CUDA device, or any under the
    interpreter."""
    return AVAILABLE and (INTERPRETED or torch.device(device).type == "cuda")


if AVAILABLE:
    _byte, _half = triton_iquants.byte, triton_iquants.half  # the byte reads every decoder shares

    @triton.jit
    def _nibble32(w, qs, e, mask):
        """Element e (0..31) of a 32-value block whose 16 bytes at `qs` hold values 0-15 in
        their low nibbles and 16-31 in their high ones (Q4_0's layout)."""
        return (_byte(w, qs + (e % 16), mask) >> (4 * (e // 16))) & 0xF

    @triton.jit
    def _scale_min_k4(w, sc, j, mask):
        """Q4_K and Q5_K: sub-block j's 6-bit scale and min from the 12 bytes at `sc`."""
        a = _byte(w, sc + j, mask)
        b = _byte(w, sc + j + 4, mask)
        c = _byte(w, sc + tl.where(j >= 4, j - 4, 0), mask)
        low = j < 4
        scale = tl.where(low, a & 63, (b & 0xF) | ((c >> 6) << 4))
        least = tl.where(low, b & 63, (b >> 4) | ((a >> 6) << 4))
        return scale.to(tl.float32), least.to(tl.float32)

    @triton.jit
    def _tile(w, tables, base, e, mask, TYPE: tl.constexpr):
        """Values e (a (1, QK) range) of the blocks at byte offsets `base` ((rows, 1)), as
        float32 (rows, QK)."""
        if TYPE == 8:  # Q8_0: d, 32 int8
            q = _byte(w, base + 2 + e, mask).to(tl.int8).to(tl.float32)
            return _half(w, base, mask) * q
        elif TYPE == 2:  # Q4_0: d, 16 bytes of nibbles, offset 8
            return _half(w, base, mask) * (_nibble32(w, base + 2, e, mask) - 8).to(tl.float32)
        elif TYPE == 3:  # Q4_1: d, m, nibbles
            return _half(w, base, mask) * _nibble32(w, base + 4, e, mask).to(tl.float32) + _half(w, base + 2, mask)
        elif TYPE == 6:  # Q5_0: d, 32 high bits, nibbles, offset 16
            high = (_byte(w, base + 2 + e // 8, mask) >> (e % 8)) & 1
            q = _nibble32(w, base + 6, e, mask) | (high << 4)
            return _half(w, base, mask) * (q - 16).to(tl.float32)
        elif TYPE == 7:  # Q5_1: d, m, 32 high bits, nibbles
            high = (_byte(w, base + 4 + e // 8, mask) >> (e % 8)) & 1
            q = _nibble32(w, base + 8, e, mask) | (high << 4)
            return _half(w, base, mask) * q.to(tl.float32) + _half(w, base + 2, mask)
        elif TYPE == 20:  # IQ4_NL: d, nibbles into the IQ4 table
            return _half(w, base, mask) * tl.load(tables + _nibble32(w, base + 2, e, mask))
        elif TYPE == 39:  # MXFP4: an E8M0 exponent, nibbles into the (doubled) E2M1 table
            x = _byte(w, base, mask)
            bits = tl.where(x < 2, 0x00200000 << x, (x - 1) << 23)
            return bits.to(tl.float32, bitcast=True) * tl.load(tables + 16 + _nibble32(w, base + 1, e, mask))
        elif TYPE == 10:  # Q2_K: 16 scale-and-min bytes, 64 bytes of 2-bit fields, d, dmin
            sc = _byte(w, base + e // 16, mask)
            q = (_byte(w, base + 16 + 32 * (e // 128) + e % 32, mask) >> (2 * ((e % 128) // 32))) & 3
            dl = _half(w, base + 80, mask) * (sc & 0xF).to(tl.float32)
            return dl * q.to(tl.float32) - _half(w, base + 82, mask) * (sc >> 4).to(tl.float32)
        elif TYPE == 11:  # Q3_K: 32 high-bit bytes, 64 bytes of 2-bit fields, 12 of 6-bit scales, d
            j = e // 16  # scale j: nibble j // 8 of byte j % 8, high bits field j // 4 of byte 8 + j % 4
            low = (_byte(w, base + 96 + j % 8, mask) >> (4 * (j // 8))) & 0xF
            high = (_byte(w, base + 104 + j % 4, mask) >> (2 * (j // 4))) & 3
            scale = ((low | (high << 4)) - 32).to(tl.float32)
            q = (_byte(w, base + 32 + 32 * (e // 128) + e % 32, mask) >> (2 * ((e % 128) // 32))) & 3
            q -= (((_byte(w, base + e % 32, mask) >> (e // 32)) & 1) ^ 1) << 2  # a clear high bit: minus 4
            return (_half(w, base + 108, mask) * scale) * q.to(tl.float32)
        elif TYPE == 12 or TYPE == 13:  # Q4_K, Q5_K: d, dmin, 12 bytes of scales, (Q5_K: 32 high-bit bytes), nibbles
            g = e // 64
            hi = (e % 64) // 32
            j = 2 * g + hi
            scale, least = _scale_min_k4(w, base + 4, j, mask)
            if TYPE == 12:
                q = (_byte(w, base + 16 + 32 * g + e % 32, mask) >> (4 * hi)) & 0xF
            else:
                q = ((_byte(w, base + 48 + 32 * g + e % 32, mask) >> (4 * hi)) & 0xF) | \
                    (((_byte(w, base + 16 + e % 32, mask) >> j) & 1) << 4)
            return (_half(w, base, mask) * scale) * q.to(tl.float32) - _half(w, base + 2, mask) * least
        elif TYPE == 14:  # Q6_K: 128 low-nibble bytes, 64 high-bit bytes, 16 int8 scales, d
            n = e // 128
            quarter = (e % 128) // 32
            lane = e % 32
            low = (_byte(w, base + 64 * n + lane + 32 * (quarter % 2), mask) >> (4 * (quarter // 2))) & 0xF
            high = (_byte(w, base + 128 + 32 * n + lane, mask) >> (2 * quarter)) & 3
            scale = _byte(w, base + 192 + 8 * n + lane // 16 + 2 * quarter, mask).to(tl.int8).to(tl.float32)
            return (_half(w, base + 208, mask) * scale) * ((low | (high << 4)) - 32).to(tl.float32)
        elif TYPE == 23:  # IQ4_XS: d, 2 bytes of high scale bits, 4 of low, 8 sub-blocks of 16 nibble bytes
            j = e // 32
            low = (_byte(w, base + 4 + j // 2, mask) >> (4 * (j % 2))) & 0xF
            high = ((_byte(w, base + 2, mask) | (_byte(w, base + 3, mask) << 8)) >> (2 * j)) & 3
            scale = ((low | (high << 4)) - 32).to(tl.float32)
            nib = _nibble32(w, base + 8 + 16 * j, e % 32, mask)
            return (_half(w, base, mask) * scale) * tl.load(tables + nib)
        else:  # the codebook and ternary types
            return triton_iquants.tile(w, tables + 32, base, e, mask, TYPE)

    @triton.jit
    def _product(x, xrows, in_m, w, wrows, in_n, tables, stride_x, BLOCKS, TYPE: tl.constexpr, QK: tl.constexpr,
                 TS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EXACT: tl.constexpr):
        """x's rows `xrows` ((BLOCK_M, 1)) times the packed rows at byte offsets `wrows`
        ((BLOCK_N, 1)) of w, over BLOCKS blocks: (BLOCK_M, BLOCK_N) float32."""
        e = tl.arange(0, QK)[None, :]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for b in range(0, BLOCKS):
            tile = _tile(w, tables, wrows + b * TS, e, in_n, TYPE)  # (BLOCK_N, QK)
            xs = tl.load(x + xrows * stride_x + b * QK + e, mask=in_m, other=0.0)
            if EXACT:
                acc += tl.dot(xs, tl.trans(tile.to(xs.dtype)), input_precision="ieee")
            else:
                acc += tl.dot(xs, tl.trans(tile.to(xs.dtype)))
        return acc

    @triton.jit
    def _mul_mat(x, w, y, tables, M, N, row_bytes, stride_x, stride_y, BLOCKS,
                 TYPE: tl.constexpr, QK: tl.constexpr, TS: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, EXACT: tl.constexpr):
        rm = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M))[:, None].to(tl.int64)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        in_m = rm < M
        acc = _product(x, rm, in_m, w, rn[:, None].to(tl.int64) * row_bytes, rn[:, None] < N, tables, stride_x,
                       BLOCKS, TYPE, QK, TS, BLOCK_M, BLOCK_N, EXACT)
        tl.store(y + rm * stride_y + rn[None, :], acc.to(y.dtype.element_ty), mask=in_m & (rn[None, :] < N))

    @triton.jit
    def _mul_mat_id(x, w, y, tables, tiles, order, N, expert_bytes, row_bytes, slots, stride_x, stride_y, BLOCKS,
                    TYPE: tl.constexpr, QK: tl.constexpr, TS: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, EXACT: tl.constexpr):
        """One tile of _expert_tiles: BLOCK_M of the (token, slot) pairs sorted by expert,
        all of one expert, times that expert's rows; each pair's output row is its index."""
        t = tl.program_id(0)
        start = tl.load(tiles + 3 * t + 1)
        end = tl.load(tiles + 3 * t + 2)
        if start >= end:  # a tile past the last expert's (the grid is sized for the most there can be)
            return
        expert = tl.load(tiles + 3 * t).to(tl.int64)
        r = start + tl.arange(0, BLOCK_M)
        pair = tl.load(order + r, mask=r < end, other=0)[:, None].to(tl.int64)
        in_m = (r < end)[:, None]
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = _product(x, pair // slots, in_m, w + expert * expert_bytes, rn[:, None].to(tl.int64) * row_bytes,
                       rn[:, None] < N, tables, stride_x, BLOCKS, TYPE, QK, TS, BLOCK_M, BLOCK_N, EXACT)
        tl.store(y + pair * stride_y + rn[None, :], acc.to(y.dtype.element_ty), mask=in_m & (rn[None, :] < N))

    @triton.jit
    def _rows(w, ids, y, tables, cols, row_bytes, TYPE: tl.constexpr, QK: tl.constexpr, TS: tl.constexpr):
        i = tl.program_id(0)
        b = tl.program_id(1)
        row = tl.load(ids + i).to(tl.int64)
        e = tl.arange(0, QK)[None, :]
        base = tl.zeros((1, 1), dtype=tl.int64) + row * row_bytes + b * TS
        tile = _tile(w, tables, base, e, base >= 0, TYPE)
        tl.store(y + i.to(tl.int64) * cols + b * QK + e, tile.to(y.dtype.element_ty))


_TABLE_CACHE: dict = {}


def _tables(device: torch.device) -> torch.Tensor:
    got = _TABLE_CACHE.get(device)
    if got is None:
        got = _TABLE_CACHE[device] = torch.from_numpy(_TABLES).to(device)
    return got


_SMS: dict = {}


def _multiprocessors(device: torch.device) -> int:
    """The device's streaming multiprocessors (an H100 / H200's 132 where it is not a GPU)."""
    if device not in _SMS:
        _SMS[device] = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132
    return _SMS[device]


def _blocks(m: int, n: int = 0, device: torch.device | None = None) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) for m rows of activations times n output rows: a decode step's few
    rows in the smallest tile tl.dot takes, with output tiles narrowed (64 down to 16 rows) until
    the launch has two programs a multiprocessor, since a decode step's product only streams
    the weights; a prompt's rows in larger tiles."""
    if m <= 16:
        bn = 64
        while bn > 16 and n and device is not None and triton.cdiv(n, bn) < 2 * _multiprocessors(device):
            bn //= 2
        return 16, bn
    return (32, 64) if m <= 64 else (64, 64)


def mul_mat(weight: torch.Tensor, x: torch.Tensor, ggml_type: GGMLType, out_features: int) -> torch.Tensor:
    """x (..., in) @ W.T for W packed (out, row_bytes) on x's device."""
    gtype = GGMLType(ggml_type)
    cols = x.shape[-1]
    if gtype in FLOATS:
        return torch.nn.functional.linear(x, reference.dequantize_rows(weight, gtype, cols, x.dtype))
    info = TYPE_INFO[gtype]
    x2 = x.reshape(-1, cols).contiguous()
    m = x2.shape[0]
    y = torch.empty(m, out_features, dtype=x.dtype, device=x.device)
    if m == 0:
        return y.reshape(*x.shape[:-1], out_features)
    bm, bn = _blocks(m, out_features, x.device)
    grid = (triton.cdiv(m, bm), triton.cdiv(out_features, bn))
    _mul_mat[grid](x2, weight, y, _tables(x.device), m, out_features, weight.shape[-1], x2.stride(0), y.stride(0),
                   cols // info.block_size, TYPE=int(gtype), QK=info.block_size, TS=info.type_size,
                   BLOCK_M=bm, BLOCK_N=bn, EXACT=x.dtype == torch.float32)
    return y.reshape(*x.shape[:-1], out_features)


def get_rows(weight: torch.Tensor, indices: torch.Tensor, ggml_type: GGMLType, cols: int,
             dtype: torch.dtype) -> torch.Tensor:
    """The rows `indices` picks from a packed (rows, row_bytes) table, decoded to `dtype`."""
    gtype = GGMLType(ggml_type)
    if gtype in FLOATS:  # the reference's lookup: the rows as they are stored
        return reference.get_rows(weight, indices, gtype, cols, dtype)
    flat = indices.reshape(-1).to(device=weight.device, dtype=torch.int64).contiguous()
    info = TYPE_INFO[gtype]
    y = torch.empty(flat.numel(), cols, dtype=dtype, device=weight.device)
    if flat.numel():
        _rows[(flat.numel(), cols // info.block_size)](weight, flat, y, _tables(weight.device), cols,
                                                       weight.shape[-1], TYPE=int(gtype), QK=info.block_size,
                                                       TS=info.type_size)
    return y.reshape(*indices.shape, cols)


def dequantize(weight: torch.Tensor, ggml_type: GGMLType, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    return get_rows(weight, torch.arange(rows, device=weight.device), ggml_type, cols, dtype)


def _expert_tiles(ids: torch.Tensor, experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The (token, slot) pairs of ids (T, K) sorted by expert (`order`: pair indices t*K + k),
    and the tiles that cover each expert's run of them, BLOCK_M pairs at most: (tiles, 3)
    int32 rows of (expert, first, end) positions in `order`, computed on the device (no
    host sync). There are as many rows as tiles there can be (n); the ones past the last
    expert's are empty (first == end)."""
    flat = ids.reshape(-1).to(torch.int64)
    pairs = flat.numel()
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(experts, dtype=torch.int64, device=ids.device).scatter_add_(0, flat, torch.ones_like(flat))
    ends = torch.cumsum(counts, 0)
    per_expert = (counts + block_m - 1) // block_m
    tiles_through = torch.cumsum(per_expert, 0)  # tiles of experts 0..e
    n = triton.cdiv(pairs, block_m) + min(experts, pairs)  # the most: each used expert's last tile partial
    i = torch.arange(n, device=ids.device)
    expert = torch.searchsorted(tiles_through, i, right=True)
    used = expert < experts
    expert = expert.clamp(max=experts - 1)
    first = ends[expert] - counts[expert] + (i - tiles_through[expert] + per_expert[expert]) * block_m
    tiles = torch.stack([expert, torch.where(used, first, 0), torch.where(used, ends[expert], 0)], dim=1)
    return order, tiles.to(torch.int32), n


def mul_mat_id(weight: torch.Tensor, x: torch.Tensor, ids: torch.Tensor, ggml_type: GGMLType,
               out_features: int) -> torch.Tensor:
    """Mixture-of-experts product (kernels.reference.mul_mat_id's contract): weight (experts,
    out, row_bytes) packed, x (T, in) for every selected expert or (T, K, in) a row per
    selection, ids (T, K); (T, K, out). One launch over all selections, grouped by expert
    (_expert_tiles) and written back in place."""
    gtype = GGMLType(ggml_type)
    if gtype in FLOATS:
        return reference.mul_mat_id(weight, x, ids, gtype, out_features, mul_mat=mul_mat)
    info = TYPE_INFO[gtype]
    t, k = ids.shape
    cols = x.shape[-1]
    slots = 1 if x.dim() == 3 else k  # the pairs of one x row
    x2 = x.reshape(-1, cols).contiguous()
    y = torch.empty(t * k, out_features, dtype=x.dtype, device=x.device)
    if t * k == 0:
        return y.reshape(t, k, out_features)
    experts = weight.shape[0]
    bm, bn = _blocks(triton.cdiv(t * k, experts))  # the rows an expert gets on average
    order, tiles, n = _expert_tiles(ids.to(x.device), experts, bm)
    _mul_mat_id[(n, triton.cdiv(out_features, bn))](
        x2, weight, y, _tables(x.device), tiles, order, out_features, weight.stride(0), weight.stride(1), slots,
        x2.stride(0), y.stride(0), cols // info.block_size, TYPE=int(gtype), QK=info.block_size, TS=info.type_size,
        BLOCK_M=bm, BLOCK_N=bn, EXACT=x.dtype == torch.float32)
    return y.reshape(t, k, out_features)


TRITON = KernelOps("triton", mul_mat, get_rows, dequantize, mul_mat_id)
