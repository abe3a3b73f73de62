"""Small helpers shared by the block codecs."""

from __future__ import annotations

import numpy as np


def f16(b: np.ndarray) -> np.ndarray:
    """(n, 2k) uint8 → (n, k) float32, from little-endian float16."""
    return np.ascontiguousarray(b).view("<f2").astype(np.float32)


def u16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view("<u2")


def u32(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view("<u4")


def f16_bytes(v: np.ndarray) -> np.ndarray:
    """float32 (n, k) → (n, 2k) uint8 of float16 (round to nearest even)."""
    return np.ascontiguousarray(v, dtype=np.float32).astype("<f2").view(np.uint8)


def nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, k) uint8 → (n, 2k): the k low nibbles, then the k high nibbles."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def bits(b: np.ndarray, width: int) -> np.ndarray:
    """(n, k) uint8 → (n, k*8/width) fields of `width` bits, least significant first."""
    shifts = np.arange(0, 8, width, dtype=np.uint8)
    return ((b[..., None] >> shifts) & ((1 << width) - 1)).reshape(*b.shape[:-1], -1)


def round_away(x: np.ndarray) -> np.ndarray:
    """C roundf: halves away from zero."""
    a = np.abs(x)
    f = np.floor(a)
    return np.sign(x) * (f + np.floor(2 * (a - f)))


def nearest_int(x: np.ndarray) -> np.ndarray:
    """ggml's nearest_int: round to nearest, ties to even (float32 magic-number trick)."""
    return np.rint(x).astype(np.int32)


def safe_inverse(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
