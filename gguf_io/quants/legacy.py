"""The 32-element block types (Q4_0 … Q8_1) and the 1- and 2-bit Q1_0, Q2_0.

Dequantization follows ggml's arithmetic order so that results are bit-identical to
gguf-py; quantization follows ggml's reference (`quantize_row_*_ref`) byte for byte.
"""

from __future__ import annotations

import numpy as np

from ..constants import GGMLType
from .registry import DEQUANTIZERS, QUANTIZERS, register
from .common import bits, f16, f16_bytes, nibbles, round_away, safe_inverse, u32

# ---------------------------------------------------------------- dequantization


@register(DEQUANTIZERS, GGMLType.Q4_0)
def dq_q4_0(b):
    d = f16(b[:, 0:2])
    q = nibbles(b[:, 2:18]).astype(np.int8) - np.int8(8)
    return d * q.astype(np.float32)


@register(DEQUANTIZERS, GGMLType.Q4_1)
def dq_q4_1(b):
    d, m = f16(b[:, 0:2]), f16(b[:, 2:4])
    q = nibbles(b[:, 4:20]).astype(np.float32)
    return d * q + m


def _q5(qh_bytes, qs):
    qh = (u32(qh_bytes) >> np.arange(32, dtype=np.uint32)) & 1
    return nibbles(qs) | (qh.astype(np.uint8) << 4)


@register(DEQUANTIZERS, GGMLType.Q5_0)
def dq_q5_0(b):
    d = f16(b[:, 0:2])
    q = _q5(b[:, 2:6], b[:, 6:22]).astype(np.int8) - np.int8(16)
    return d * q.astype(np.float32)


@register(DEQUANTIZERS, GGMLType.Q5_1)
def dq_q5_1(b):
    d, m = f16(b[:, 0:2]), f16(b[:, 2:4])
    q = _q5(b[:, 4:8], b[:, 8:24]).astype(np.float32)
    return d * q + m


@register(DEQUANTIZERS, GGMLType.Q8_0)
def dq_q8_0(b):
    return b[:, 2:34].view(np.int8).astype(np.float32) * f16(b[:, 0:2])


@register(DEQUANTIZERS, GGMLType.Q8_1)
def dq_q8_1(b):
    return b[:, 4:36].view(np.int8).astype(np.float32) * f16(b[:, 0:2])


@register(DEQUANTIZERS, GGMLType.Q1_0)
def dq_q1_0(b):
    d = f16(b[:, 0:2])
    return np.where(bits(b[:, 2:18], 1) == 1, d, -d)


@register(DEQUANTIZERS, GGMLType.Q2_0)
def dq_q2_0(b):
    q = bits(b[:, 2:18], 2).astype(np.int8) - np.int8(1)
    return q.astype(np.float32) * f16(b[:, 0:2])


# ------------------------------------------------------------------ quantization


def _absmax_signed(x):
    """The element of largest magnitude (first one on ties), with its sign."""
    i = np.abs(x).argmax(axis=-1)[:, None]
    return np.take_along_axis(x, i, axis=-1)


def _pack_nibbles(q):
    half = q.shape[1] // 2
    return (q[:, :half] & 0x0F) | (q[:, half:] << 4)


def _trunc_u8(v, hi):
    return np.trunc(v).astype(np.uint8).clip(0, hi)


@register(QUANTIZERS, GGMLType.Q4_0)
def q_q4_0(x):
    d = _absmax_signed(x) / np.float32(-8)
    q = _trunc_u8(x * safe_inverse(d) + np.float32(8.5), 15)
    return np.concatenate([f16_bytes(d), _pack_nibbles(q)], axis=1)


@register(QUANTIZERS, GGMLType.Q4_1)
def q_q4_1(x):
    lo, hi = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    d = (hi - lo) / np.float32(15)
    q = _trunc_u8((x - lo) * safe_inverse(d) + np.float32(0.5), 15)
    return np.concatenate([f16_bytes(d), f16_bytes(lo), _pack_nibbles(q)], axis=1)


def _qh(q):
    return np.packbits((q >> 4) & 1, axis=1, bitorder="little")


@register(QUANTIZERS, GGMLType.Q5_0)
def q_q5_0(x):
    d = _absmax_signed(x) / np.float32(-16)
    q = _trunc_u8(x * safe_inverse(d) + np.float32(16.5), 31)
    return np.concatenate([f16_bytes(d), _qh(q), _pack_nibbles(q)], axis=1)


@register(QUANTIZERS, GGMLType.Q5_1)
def q_q5_1(x):
    lo, hi = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    d = (hi - lo) / np.float32(31)
    q = _trunc_u8((x - lo) * safe_inverse(d) + np.float32(0.5), 31)
    return np.concatenate([f16_bytes(d), f16_bytes(lo), _qh(q), _pack_nibbles(q)], axis=1)


@register(QUANTIZERS, GGMLType.Q8_0)
def q_q8_0(x):
    d = np.abs(x).max(axis=1, keepdims=True) / np.float32(127)
    q = round_away(x * safe_inverse(d)).astype(np.int8).view(np.uint8)
    return np.concatenate([f16_bytes(d), q], axis=1)
