"""Triton decoders of the codebook and ternary GGUF types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
IQ3_S, IQ1_S, IQ1_M, TQ1_0, TQ2_0), and the byte reads every block decoder shares.

kernels.triton_ops owns the kernels and dispatches these types' blocks to `tile`; this
module knows only block layouts. Each type follows gguf_io.quants.iquants (layout and
order of float operations), so a decoded tile equals `gguf_io.dequantize`'s bit for bit.
The codebooks (gguf_io.quants.grids) reach the kernels as one float32 device tensor,
`grid_table()`, each grid at its offset below; the sign patterns of IQ2_XXS, IQ2_XS and
IQ3_XXS (7 stored bits and their parity) are computed, not looked up."""

from __future__ import annotations

import numpy as np

from ...gguf_io import GGMLType
from ...gguf_io.quants.grids import grid

try:
    import triton
    import triton.language as tl
except ImportError:  # an optional dependency: kernels.triton_ops says so
    triton = None

TYPES = (GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ2_S, GGMLType.IQ3_XXS, GGMLType.IQ3_S,
         GGMLType.IQ1_S, GGMLType.IQ1_M, GGMLType.TQ1_0, GGMLType.TQ2_0)
# the codebooks in grid_table()'s order; their offsets (in values) are the constexprs below
GRIDS = ("iq2xxs", "iq2xs", "iq2s", "iq3xxs", "iq3s", "iq1s")


def grid_table() -> np.ndarray:
    """Every codebook's rows, flattened and concatenated in GRIDS' order, as float32."""
    return np.concatenate([grid(name).reshape(-1) for name in GRIDS])


_AT = dict(zip(GRIDS, np.cumsum([0] + [grid(name).size for name in GRIDS[:-1]]).tolist()))

if triton is not None:
    _IQ2XXS = tl.constexpr(_AT["iq2xxs"])  # offsets in grid_table() (rows of 8 values, iq3's of 4)
    _IQ2XS = tl.constexpr(_AT["iq2xs"])
    _IQ2S = tl.constexpr(_AT["iq2s"])
    _IQ3XXS = tl.constexpr(_AT["iq3xxs"])
    _IQ3S = tl.constexpr(_AT["iq3s"])
    _IQ1S = tl.constexpr(_AT["iq1s"])  # values -1, 0, 1

    @triton.jit
    def byte(w, off, mask):
        return tl.load(w + off, mask=mask, other=0).to(tl.int32)

    @triton.jit
    def _u16(w, off, mask):
        return byte(w, off, mask) | (byte(w, off + 1, mask) << 8)

    @triton.jit
    def half(w, off, mask):
        """The little-endian float16 at byte `off`, as float32."""
        return _u16(w, off, mask).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)

    @triton.jit
    def _u32(w, off, mask):
        """The little-endian 32 bits at byte `off` (as int32: bit 31 is the sign)."""
        return _u16(w, off, mask) | (_u16(w, off + 2, mask) << 16)

    @triton.jit
    def _signed(v, bits, j):
        """v negated where bit j (0..7) of the 7 sign bits `bits` and their parity (bit 7)
        is set."""
        p = bits ^ (bits >> 4)
        p = p ^ (p >> 2)
        p = p ^ (p >> 1)
        return tl.where((((bits | ((p & 1) << 7)) >> j) & 1) == 1, -v, v)

    @triton.jit
    def _scale4(w, at, g, mask):
        """Nibble g of the bytes at `at`, low nibble first (IQ2_XS, IQ2_S, IQ3_S scales)."""
        return ((byte(w, at + g // 2, mask) >> (4 * (g % 2))) & 0xF).to(tl.float32)

    @triton.jit
    def _iq1_delta(bit):
        return tl.where(bit == 0, 0.125, -0.125)

    @triton.jit
    def tile(w, grids, base, e, mask, TYPE: tl.constexpr):
        """Values e (a (1, 256) range) of the blocks at byte offsets `base` ((rows, 1)) of a
        type in TYPES, as float32 (rows, 256); `grids` points at grid_table()'s values."""
        if TYPE == 16:  # IQ2_XXS: d, 8 groups of (4 grid bytes, 4 sign fields of 7 bits and a 4-bit scale)
            at = base + 2 + 8 * (e // 32)
            db = half(w, base, mask) * (0.5 + (byte(w, at + 7, mask) >> 4).to(tl.float32)) * 0.25
            v = db * tl.load(grids + _IQ2XXS + 8 * byte(w, at + (e % 32) // 8, mask) + e % 8)
            return _signed(v, (_u32(w, at + 4, mask) >> (7 * ((e % 32) // 8))) & 0x7F, e % 8)
        elif TYPE == 17:  # IQ2_XS: d, 32 u16 of (9-bit grid index, 7 sign bits), 16 scale nibbles
            q = _u16(w, base + 2 + 2 * (e // 8), mask)
            db = half(w, base, mask) * (0.5 + _scale4(w, base + 66, e // 16, mask)) * 0.25
            return _signed(db * tl.load(grids + _IQ2XS + 8 * (q & 511) + e % 8), q >> 9, e % 8)
        elif TYPE == 22:  # IQ2_S: d, 32 grid bytes, 32 sign bytes, 32 2-bit index highs, 16 scale nibbles
            i = e // 8
            idx = byte(w, base + 2 + i, mask) | (((byte(w, base + 66 + i // 4, mask) >> (2 * (i % 4))) & 3) << 8)
            db = half(w, base, mask) * (0.5 + _scale4(w, base + 74, e // 16, mask)) * 0.25
            v = db * tl.load(grids + _IQ2S + 8 * idx + e % 8)
            return tl.where(((byte(w, base + 34 + i, mask) >> (e % 8)) & 1) == 1, -v, v)
        elif TYPE == 18:  # IQ3_XXS: d, 64 grid bytes, 8 u32 of (4 sign fields of 7 bits, a 4-bit scale)
            at = base + 66 + 4 * (e // 32)
            db = half(w, base, mask) * (0.5 + (byte(w, at + 3, mask) >> 4).to(tl.float32)) * 0.5
            v = db * tl.load(grids + _IQ3XXS + 4 * byte(w, base + 2 + e // 4, mask) + e % 4)
            return _signed(v, (_u32(w, at, mask) >> (7 * ((e % 32) // 8))) & 0x7F, e % 8)
        elif TYPE == 21:  # IQ3_S: d, 64 grid bytes, 64 index high bits, 32 sign bytes, 8 scale nibbles
            i = e // 4
            idx = byte(w, base + 2 + i, mask) | (((byte(w, base + 66 + i // 8, mask) >> (i % 8)) & 1) << 8)
            db = half(w, base, mask) * (1 + 2 * _scale4(w, base + 106, e // 32, mask))
            v = db * tl.load(grids + _IQ3S + 4 * idx + e % 4)
            return tl.where(((byte(w, base + 74 + e // 8, mask) >> (e % 8)) & 1) == 1, -v, v)
        elif TYPE == 19:  # IQ1_S: d, 32 grid bytes, 8 u16 of (4 3-bit index highs, a 3-bit scale, the delta's sign)
            i = e // 8
            qh = _u16(w, base + 34 + 2 * (e // 32), mask)
            dl = half(w, base, mask) * (2 * ((qh >> 12) & 7) + 1).to(tl.float32)
            idx = byte(w, base + 2 + i, mask) | (((qh >> (3 * (i % 4))) & 7) << 8)
            return dl * (tl.load(grids + _IQ1S + 8 * idx + e % 8) + _iq1_delta(qh & 0x8000))
        elif TYPE == 29:  # IQ1_M: 32 grid bytes, 32 nibbles (3 index high bits, the delta's sign), 4 u16 scales
            # d's float16 bits are the scales' top nibbles; sub-block s's 3-bit scale is field s % 4 of u16 s // 4
            bits = (byte(w, base + 49, mask) >> 4) | ((byte(w, base + 51, mask) >> 4) << 4) | \
                ((byte(w, base + 53, mask) >> 4) << 8) | ((byte(w, base + 55, mask) >> 4) << 12)
            d = bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
            s = e // 16
            dl = d * (2 * ((_u16(w, base + 48 + 2 * (s // 4), mask) >> (3 * (s % 4))) & 7) + 1).to(tl.float32)
            i = e // 8
            nib = (byte(w, base + 32 + i // 2, mask) >> (4 * (i % 2))) & 0xF
            idx = byte(w, base + i, mask) | ((nib & 7) << 8)
            return dl * (tl.load(grids + _IQ1S + 8 * idx + e % 8) + _iq1_delta(nib & 8))
        elif TYPE == 34:  # TQ1_0: 48 bytes of 5 trits and 4 of 4 (fixed-point fractions of 3^5), d
            # element e is trit p of byte j: bytes 0-31 for e < 160, 32-47 below 240, 48-51 last
            first = e < 160
            second = e < 240
            p = tl.where(first, e // 32, tl.where(second, (e - 160) // 16, (e - 240) // 4))
            j = tl.where(first, e % 32, tl.where(second, 32 + (e - 160) % 16, 48 + (e - 240) % 4))
            pow3 = tl.where(p == 0, 1, tl.where(p == 1, 3, tl.where(p == 2, 9, tl.where(p == 3, 27, 81))))
            v = (byte(w, base + j, mask) * pow3) & 0xFF  # uint8 arithmetic wraps, as in ggml
            return half(w, base + 52, mask) * (((v * 3) >> 8) - 1).to(tl.float32)
        else:  # TQ2_0 (35): 64 bytes of 2-bit fields (Q2_K's layout), d
            q = (byte(w, base + 32 * (e // 128) + e % 32, mask) >> (2 * ((e % 128) // 32))) & 3
            return half(w, base + 64, mask) * (q - 1).to(tl.float32)
