"""Codebook and non-linear types: IQ1_S … IQ4_XS, the ternary TQ1_0/TQ2_0, and the
FP4 formats MXFP4 and NVFP4. Dequantization only (models arrive quantized)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..constants import QK_K, GGMLType
from .registry import DEQUANTIZERS, QUANTIZERS, register
from .common import f16, nibbles, u16, u32
from .grids import grid

KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)
# E2M1 values, doubled (ggml's kvalues_mxfp4)
KVALUES_FP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)
IQ1_DELTA = np.float32(0.125)


@lru_cache(maxsize=None)
def _grid(name: str) -> np.ndarray:
    return grid(name)


@lru_cache(maxsize=None)
def _ksigns() -> np.ndarray:
    """7 sign bits → 8 signs (±1) with even parity: the 8th sign is the parity bit."""
    i = np.arange(128, dtype=np.uint8)
    parity = np.unpackbits(i[:, None], axis=1).sum(axis=1) & 1
    byte = i | (parity.astype(np.uint8) << 7)
    return np.where(((byte[:, None] >> np.arange(8, dtype=np.uint8)) & 1) == 1, np.float32(-1), np.float32(1))


def _signs(byte_bits: np.ndarray) -> np.ndarray:
    """(..., k) uint8 of explicit sign bits → (..., 8k) of ±1."""
    b = (byte_bits[..., None] >> np.arange(8, dtype=np.uint8)) & 1
    return np.where(b == 1, np.float32(-1), np.float32(1)).reshape(*byte_bits.shape[:-1], -1)


@register(DEQUANTIZERS, GGMLType.IQ2_XXS)
def dq_iq2_xxs(b):
    n = b.shape[0]
    d = f16(b[:, 0:2])
    q = u32(b[:, 2:66]).reshape(n, 8, 2)
    db = (d * (np.float32(0.5) + (q[:, :, 1] >> 28).astype(np.float32)) * np.float32(0.25)).reshape(n, 8, 1, 1)
    idx = np.ascontiguousarray(q[:, :, 0]).view(np.uint8).reshape(n, 8, 4)
    sign_idx = (q[:, :, 1:2] >> np.array([0, 7, 14, 21], dtype=np.uint32)) & 0x7F
    signs = _ksigns()[sign_idx]  # (n, 8, 4, 8)
    return (db * _grid("iq2xxs")[idx] * signs).reshape(n, QK_K)


@register(DEQUANTIZERS, GGMLType.IQ2_XS)
def dq_iq2_xs(b):
    n = b.shape[0]
    d = f16(b[:, 0:2])
    q = u16(b[:, 2:66]).reshape(n, 16, 2)
    db = (d * (np.float32(0.5) + nibbles_interleaved(b[:, 66:74])) * np.float32(0.25)).reshape(n, 16, 1, 1)
    signs = _ksigns()[q >> 9]
    return (db * _grid("iq2xs")[q & 511] * signs).reshape(n, QK_K)


def nibbles_interleaved(b):
    """(n, k) → (n, 2k) float32 as lo0, hi0, lo1, hi1, …"""
    return np.stack([b & 0x0F, b >> 4], axis=-1).reshape(b.shape[0], -1).astype(np.float32)


@register(DEQUANTIZERS, GGMLType.IQ2_S)
def dq_iq2_s(b):
    n = b.shape[0]
    d = f16(b[:, 0:2])
    qs, sign_bytes, qh, sc = b[:, 2:34], b[:, 34:66], b[:, 66:74], b[:, 74:82]
    db = (d * (np.float32(0.5) + nibbles_interleaved(sc)) * np.float32(0.25)).reshape(n, 16, 1, 1)
    high = ((qh[:, :, None] >> np.array([0, 2, 4, 6], dtype=np.uint8)) & 3).reshape(n, 32).astype(np.uint16)
    idx = (qs.astype(np.uint16) | (high << 8)).reshape(n, 16, 2)
    signs = _signs(sign_bytes).reshape(n, 16, 2, 8)
    return (db * _grid("iq2s")[idx] * signs).reshape(n, QK_K)


@register(DEQUANTIZERS, GGMLType.IQ3_XXS)
def dq_iq3_xxs(b):
    n = b.shape[0]
    d = f16(b[:, 0:2])
    qs, ss = b[:, 2:66], u32(b[:, 66:98])
    db = (d * (np.float32(0.5) + (ss >> 28).astype(np.float32)) * np.float32(0.5)).reshape(n, 8, 1, 1)
    sign_idx = (ss[:, :, None] >> np.array([0, 7, 14, 21], dtype=np.uint32)) & 0x7F
    signs = _ksigns()[sign_idx]  # (n, 8, 4, 8)
    g = _grid("iq3xxs")[qs].reshape(n, 8, 4, 8)
    return (db * g * signs).reshape(n, QK_K)


@register(DEQUANTIZERS, GGMLType.IQ3_S)
def dq_iq3_s(b):
    n = b.shape[0]
    d = f16(b[:, 0:2])
    qs, qh, sign_bytes, sc = b[:, 2:66], b[:, 66:74], b[:, 74:106], b[:, 106:110]
    scales = np.stack([sc & 0x0F, sc >> 4], axis=-1).reshape(n, 8)
    db = (d * (1 + 2 * scales)).reshape(n, 8, 1, 1)
    high = ((qh[:, :, None] >> np.arange(8, dtype=np.uint8)) & 1).reshape(n, 64).astype(np.uint16)
    idx = qs.astype(np.uint16) | (high << 8)
    g = _grid("iq3s")[idx].reshape(n, 8, 4, 8)
    signs = _signs(sign_bytes).reshape(n, 8, 4, 8)
    return (db * g * signs).reshape(n, QK_K)


@register(DEQUANTIZERS, GGMLType.IQ1_S)
def dq_iq1_s(b):
    n = b.shape[0]
    d = f16(b[:, 0:2])
    qs, qh = b[:, 2:34], u16(b[:, 34:50])
    dl = (d * (2 * ((qh >> 12) & 7) + 1)).reshape(n, 8, 1, 1)
    delta = np.where((qh & 0x8000) == 0, IQ1_DELTA, -IQ1_DELTA).reshape(n, 8, 1, 1)
    high = ((qh[:, :, None] >> np.array([0, 3, 6, 9], dtype=np.uint16)) & 7).reshape(n, 32)
    idx = qs.astype(np.uint16) | (high << 8)
    g = _grid("iq1s")[idx].reshape(n, 8, 4, 8)
    return (dl * (g + delta)).reshape(n, QK_K)


@register(DEQUANTIZERS, GGMLType.IQ1_M)
def dq_iq1_m(b):
    n = b.shape[0]
    qs, qh, sc = b[:, 0:32], b[:, 32:48], u16(b[:, 48:56])
    top = (sc & np.uint16(0xF000)) >> np.array([12, 8, 4, 0], dtype=np.uint16)
    d = (top[:, 0] | top[:, 1] | top[:, 2] | top[:, 3]).view("<f2").astype(np.float32).reshape(n, 1)
    sub = ((sc[:, :, None] >> np.array([0, 3, 6, 9], dtype=np.uint16)) & 7).reshape(n, 16)
    dl = (d * (2 * sub + 1)).reshape(n, 8, 2, 1, 1)
    nib = np.stack([qh & 0x0F, qh >> 4], axis=-1).reshape(n, 32)
    idx = qs.astype(np.uint16) | ((nib & 7).astype(np.uint16) << 8)
    delta = np.where((nib & 8) == 0, IQ1_DELTA, -IQ1_DELTA).reshape(n, 8, 2, 2, 1)
    g = _grid("iq1s")[idx].reshape(n, 8, 2, 2, 8)
    return (dl * (g + delta)).reshape(n, QK_K)


@register(DEQUANTIZERS, GGMLType.IQ4_NL)
def dq_iq4_nl(b):
    return f16(b[:, 0:2]) * KVALUES_IQ4NL[nibbles(b[:, 2:18])].astype(np.float32)


@register(QUANTIZERS, GGMLType.IQ4_NL)
def q_iq4_nl(x):
    """ggml's quantize_row_iq4_nl_ref (what llama.cpp writes IQ4_NL cache rows with): the
    scale from the value of largest magnitude over the table's -127, each value to its
    nearest entry (the upper one on a tie), then the scale refit by least squares weighted
    by x^2, summed in order as ggml does."""
    x = x.astype(np.float32)
    i = np.abs(x).argmax(axis=1)[:, None]
    mx = np.take_along_axis(x, i, axis=1)
    amax = np.abs(mx)
    table = KVALUES_IQ4NL.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.float32(1) / (mx / table[0]) * x
    hi = np.searchsorted(table, v, side="right").clip(1, 15)
    L = np.where(v - table[hi - 1] < table[hi] - v, hi - 1, hi)
    L = np.where(v <= table[0], 0, np.where(v >= table[15], 15, L))
    small = (amax < np.float32(1e-15))[:, 0]
    L[small] = 0
    q = table[L]
    w = x * x
    sumqx = np.cumsum(w * q * x, axis=1, dtype=np.float32)[:, -1]
    sumq2 = np.cumsum(w * q * q, axis=1, dtype=np.float32)[:, -1]
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.where((sumq2 > 0) & ~small, sumqx / sumq2, np.float32(0)).astype(np.float32)
    qs = (L[:, :16] | (L[:, 16:] << 4)).astype(np.uint8)
    return np.concatenate([d.astype(np.float16).view(np.uint8).reshape(-1, 2), qs], axis=1)


@register(DEQUANTIZERS, GGMLType.IQ4_XS)
def dq_iq4_xs(b):
    n = b.shape[0]
    d = f16(b[:, 0:2])
    sh = u16(b[:, 2:4])
    sl = b[:, 4:8]
    low = np.stack([sl & 0x0F, sl >> 4], axis=-1).reshape(n, 8)
    high = ((sh >> (2 * np.arange(8, dtype=np.uint16))) & 3).astype(np.uint8)
    ls = (low | (high << 4)).astype(np.int8) - np.int8(32)
    dl = (d * ls.astype(np.float32)).reshape(n, 8, 1)
    q = nibbles(b[:, 8:136].reshape(n * 8, 16)).reshape(n, 8, 32)
    return (dl * KVALUES_IQ4NL[q].astype(np.float32)).reshape(n, QK_K)


_POW3 = np.array([1, 3, 9, 27, 81], dtype=np.uint8)


def _trits(b, k):
    """Base-3 digits stored as ggml's fixed-point fractions: (n, m) bytes → (n, k*m)."""
    n = b.shape[0]
    v = (b[:, None, :] * _POW3[:k, None]).reshape(n, -1)  # uint8 arithmetic wraps, as in ggml
    return ((v.astype(np.uint16) * 3) >> 8).astype(np.int8) - np.int8(1)


@register(DEQUANTIZERS, GGMLType.TQ1_0)
def dq_tq1_0(b):
    d = f16(b[:, 52:54])
    q = np.concatenate([_trits(b[:, 0:32], 5), _trits(b[:, 32:48], 5), _trits(b[:, 48:52], 4)], axis=1)
    return d * q.astype(np.float32)


@register(DEQUANTIZERS, GGMLType.TQ2_0)
def dq_tq2_0(b):
    n = b.shape[0]
    d = f16(b[:, 64:66])
    q = (b[:, 0:64].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 3
    return d * (q.reshape(n, QK_K).astype(np.int8) - np.int8(1)).astype(np.float32)


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """ggml_e8m0_to_fp32_half: 2^(e-128) as float32 (denormal for e < 2)."""
    e = e.astype(np.uint32)
    bits_ = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << 23).astype(np.uint32)
    return bits_.view(np.float32)


@register(DEQUANTIZERS, GGMLType.MXFP4)
def dq_mxfp4(b):
    d = e8m0_half(b[:, 0:1])
    return d * KVALUES_FP4[nibbles(b[:, 1:17])].astype(np.float32)


@register(QUANTIZERS, GGMLType.MXFP4)
def q_mxfp4(x):
    """ggml's reference: the shared exponent puts the block's largest magnitude in the top
    of the E2M1 range (floor(log2 amax) - 2), each value the nearest of the 16 codes
    (the first on a tie); the low nibbles hold the block's first half."""
    amax = np.abs(x).max(axis=1)
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.floor(np.log2(amax)) - 2 + 127, 0).astype(np.uint8)
    d = e8m0_half(e)[:, None, None]
    codes = np.abs(d * KVALUES_FP4.astype(np.float32)[None, None, :] - x[:, :, None]).argmin(axis=-1).astype(np.uint8)
    return np.concatenate([e[:, None], codes[:, :16] | (codes[:, 16:] << 4)], axis=1)


def ue4m3_half(x: np.ndarray) -> np.ndarray:
    """ggml_ue4m3_to_fp32: unsigned E4M3 (bias 7), halved; 0 and 0x7F decode to 0."""
    e = ((x >> 3) & 0xF).astype(np.int32)
    m = (x & 7).astype(np.float32)
    raw = np.where(e == 0, np.ldexp(m, -9), np.ldexp(1 + m / np.float32(8), e - 7)).astype(np.float32)
    return np.where((x == 0) | (x == 0x7F), np.float32(0), raw * np.float32(0.5))


@register(DEQUANTIZERS, GGMLType.NVFP4)
def dq_nvfp4(b):
    n = b.shape[0]
    d = ue4m3_half(b[:, 0:4]).reshape(n, 4, 1)
    q = nibbles(b[:, 4:36].reshape(n * 4, 8)).reshape(n, 4, 16)
    return (d * KVALUES_FP4[q].astype(np.float32)).reshape(n, 64)
