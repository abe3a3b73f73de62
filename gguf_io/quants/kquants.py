"""The k-quants: 256-element super-blocks of 16- or 32-element sub-blocks (Q2_K … Q8_K).

Dequantization keeps ggml's arithmetic order (bit-identical to gguf-py). The
quantizers are ggml's reference algorithms (`quantize_row_q*_K_ref` with their
`make_q*_quants` searches), vectorized over all sub-blocks at once.
"""

from __future__ import annotations

import numpy as np

from ..constants import QK_K, GGMLType
from .registry import DEQUANTIZERS, QUANTIZERS, register
from .common import bits, f16, f16_bytes, nearest_int

GROUP_MAX_EPS = np.float32(1e-15)

# --------------------------------------------------------------- dequantization


def _q2_layout(qs):
    """(n, 64) bytes of 2-bit fields → (n, 256): element 128h + 32s + l is field s of byte 32h + l."""
    n = qs.shape[0]
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    return ((qs.reshape(n, 2, 1, 32) >> shifts) & 3).reshape(n, QK_K)


def _scale_min_k4(sc):
    """The 12 packed bytes of Q4_K/Q5_K → 8 six-bit scales and 8 six-bit mins."""
    d, m, md = sc[:, 0:4], sc[:, 4:8], sc[:, 8:12]
    scales = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=1)
    mins = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=1)
    return scales, mins


def _q3_scales(sc):
    """The 12 packed bytes of Q3_K → 16 signed six-bit scales."""
    low = np.concatenate([sc[:, 0:8] & 0x0F, sc[:, 0:8] >> 4], axis=1)
    high = bits(sc[:, 8:12], 2)  # (n, 16): field k of byte j → index 4j + k
    n = sc.shape[0]
    high = high.reshape(n, 4, 4).transpose(0, 2, 1).reshape(n, 16)  # scale j uses byte j%4, field j//4
    return (low | (high << 4)).astype(np.int8) - np.int8(32)


@register(DEQUANTIZERS, GGMLType.Q2_K)
def dq_q2_k(b):
    n = b.shape[0]
    sc, qs = b[:, 0:16], b[:, 16:80]
    d, dmin = f16(b[:, 80:82]), f16(b[:, 82:84])
    dl = (d * (sc & 0xF).astype(np.float32)).reshape(n, 16, 1)
    ml = (dmin * (sc >> 4).astype(np.float32)).reshape(n, 16, 1)
    q = _q2_layout(qs).reshape(n, 16, 16).astype(np.float32)
    return (dl * q - ml).reshape(n, QK_K)


@register(DEQUANTIZERS, GGMLType.Q3_K)
def dq_q3_k(b):
    n = b.shape[0]
    hmask, qs, sc = b[:, 0:32], b[:, 32:96], b[:, 96:108]
    d = f16(b[:, 108:110])
    dl = (d * _q3_scales(sc).astype(np.float32)).reshape(n, 16, 1)
    low = _q2_layout(qs).astype(np.int8)
    # element e takes bit e // 32 of hmask[e % 32]; a clear bit means "minus 4"
    high = ((hmask[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1).reshape(n, QK_K)
    q = (low - ((high ^ 1) << 2).astype(np.int8)).astype(np.float32)
    return (dl * q.reshape(n, 16, 16)).reshape(n, QK_K)


def _q4_5_common(b):
    n = b.shape[0]
    d, dmin = f16(b[:, 0:2]), f16(b[:, 2:4])
    sc, m = _scale_min_k4(b[:, 4:16])
    dl = (d * sc.astype(np.float32)).reshape(n, 8, 1)
    ml = (dmin * m.astype(np.float32)).reshape(n, 8, 1)
    return n, dl, ml


def _q4_layout(qs):
    """(n, 128) bytes → (n, 256): chunk c of 64 = low nibbles of bytes 32c.. then their high nibbles."""
    n = qs.shape[0]
    q = qs.reshape(n, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (q & 0x0F).reshape(n, QK_K)


@register(DEQUANTIZERS, GGMLType.Q4_K)
def dq_q4_k(b):
    n, dl, ml = _q4_5_common(b)
    q = _q4_layout(b[:, 16:144]).reshape(n, 8, 32).astype(np.float32)
    return (dl * q - ml).reshape(n, QK_K)


@register(DEQUANTIZERS, GGMLType.Q5_K)
def dq_q5_k(b):
    n, dl, ml = _q4_5_common(b)
    qh, qs = b[:, 16:48], b[:, 48:176]
    high = ((qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1).reshape(n, QK_K)
    q = (_q4_layout(qs) | (high << 4)).reshape(n, 8, 32).astype(np.float32)
    return (dl * q - ml).reshape(n, QK_K)


@register(DEQUANTIZERS, GGMLType.Q6_K)
def dq_q6_k(b):
    n = b.shape[0]
    ql, qh, sc = b[:, 0:128], b[:, 128:192], b[:, 192:208]
    d = f16(b[:, 208:210])
    dl = (d * sc.view(np.int8).astype(np.float32)).reshape(n, 16, 1)
    low = (ql.reshape(n, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & 0x0F
    high = (qh.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 3
    q = (low.reshape(n, QK_K) | (high.reshape(n, QK_K) << 4)).astype(np.int8) - np.int8(32)
    return (dl * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, QK_K)


@register(DEQUANTIZERS, GGMLType.Q8_K)
def dq_q8_k(b):
    d = np.ascontiguousarray(b[:, 0:4]).view("<f4")
    return d * b[:, 4:260].view(np.int8).astype(np.float32)


# ------------------------------------------------------------ reference searches


def _signed_absmax(x):
    i = np.abs(x).argmax(axis=-1)[:, None]
    return np.take_along_axis(x, i, axis=-1)[:, 0]


def make_qkx2_quants(x, w, nmax, rmin, rdelta, nstep, use_mad):
    """Per row of x (m, n): scale, min (as a positive offset) and levels 0..nmax."""
    f32 = np.float32
    lo = np.minimum(x.min(axis=1), f32(0))
    hi = x.max(axis=1)
    sum_w = w.sum(axis=1)
    sum_x = (w * x).sum(axis=1)
    flat = hi == lo
    rng = np.where(flat, f32(1), hi - lo)

    def levels(iscale, offset):
        return np.clip(nearest_int(iscale[:, None] * (x - offset[:, None])), 0, nmax)

    def error(scale, offset, L):
        diff = scale[:, None] * L.astype(f32) + offset[:, None] - x
        diff = np.abs(diff) if use_mad else diff * diff
        return (w * diff).sum(axis=1)

    iscale = f32(nmax) / rng
    scale = f32(1) / iscale
    L = levels(iscale, lo)
    best = error(scale, lo, L)
    mn = lo.copy()
    for i in range(nstep + 1):
        # as in ggml, each trial measures from the best minimum found so far
        span = np.where(flat, f32(1), hi - mn)
        iscale = (f32(rmin) + f32(rdelta) * f32(i) + f32(nmax)) / span
        La = levels(iscale, mn)
        Lf = La.astype(f32)
        sum_l = (w * Lf).sum(axis=1)
        sum_l2 = (w * Lf * Lf).sum(axis=1)
        sum_xl = (w * Lf * x).sum(axis=1)
        D = sum_w * sum_l2 - sum_l * sum_l
        ok = D > 0
        Ds = np.where(ok, D, f32(1))
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / Ds
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / Ds
        pos = this_min > 0
        this_min = np.where(pos, f32(0), this_min)
        with np.errstate(divide="ignore", invalid="ignore"):
            this_scale = np.where(pos, sum_xl / np.where(sum_l2 == 0, f32(1), sum_l2), this_scale)
        cur = error(this_scale, this_min, La)
        better = ok & (cur < best)
        L = np.where(better[:, None], La, L)
        best = np.where(better, cur, best)
        scale = np.where(better, this_scale, scale)
        mn = np.where(better, this_min, mn)
    L = np.where(flat[:, None], 0, L)
    scale = np.where(flat, f32(0), scale)
    mn = np.where(flat, lo, mn)
    return scale.astype(f32), (-mn).astype(f32), L


def make_qx_quants(x, nmax):
    """ggml's make_qx_quants with rmse_type=1 (weights x²): signed scale, levels 0..2*nmax-1."""
    f32 = np.float32
    mx = _signed_absmax(x)
    zero = np.abs(mx) < GROUP_MAX_EPS
    mxs = np.where(zero, f32(1), mx)
    w = x * x

    def trial(iscale):
        l = np.clip(nearest_int(iscale[:, None] * x), -nmax, nmax - 1)
        lf = l.astype(f32)
        return l, (w * x * lf).sum(axis=1), (w * lf * lf).sum(axis=1)

    l, sumlx, suml2 = trial(f32(-nmax) / mxs)
    L = l + nmax
    scale = np.where(suml2 != 0, sumlx / np.where(suml2 == 0, f32(1), suml2), f32(0))
    best = scale * sumlx
    for i in range(-9, 10):
        if i == 0:
            continue
        l, sumlx, suml2 = trial(-(f32(nmax) + f32(0.1) * f32(i)) / mxs)
        better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        L = np.where(better[:, None], l + nmax, L)
        new_scale = sumlx / np.where(suml2 == 0, f32(1), suml2)
        scale = np.where(better, new_scale, scale)
        best = np.where(better, new_scale * sumlx, best)
    return np.where(zero, f32(0), scale).astype(f32), np.where(zero[:, None], 0, L)


def make_q3_quants(x, nmax):
    """ggml's make_q3_quants with do_rmse: coordinate descent on the weighted error."""
    f32 = np.float32
    m, n = x.shape
    mx = _signed_absmax(x)
    zero = np.abs(mx) < GROUP_MAX_EPS
    iscale = f32(-nmax) / np.where(zero, f32(1), mx)
    L = np.clip(nearest_int(iscale[:, None] * x), -nmax, nmax - 1)
    w = x * x
    sumlx = (w * x * L.astype(f32)).sum(axis=1)
    suml2 = (w * L.astype(f32) * L.astype(f32)).sum(axis=1)
    active = ~zero
    for _ in range(5):
        changed = np.zeros(m, dtype=bool)
        for i in range(n):
            xi, wi, li = x[:, i], w[:, i], L[:, i].astype(f32)
            slx = sumlx - wi * xi * li
            sl2 = suml2 - wi * li * li
            cand = active & (slx > 0)
            new_l = np.clip(nearest_int(xi * sl2 / np.where(cand, slx, f32(1))), -nmax, nmax - 1)
            nl = new_l.astype(f32)
            slx2 = slx + wi * xi * nl
            sl22 = sl2 + wi * nl * nl
            take = cand & (new_l != L[:, i]) & (sl22 > 0) & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22)
            L[:, i] = np.where(take, new_l, L[:, i])
            sumlx = np.where(take, slx2, sumlx)
            suml2 = np.where(take, sl22, suml2)
            changed |= take
        active &= changed
        if not active.any():
            break
    scale = np.where(suml2 > 0, sumlx / np.where(suml2 > 0, suml2, f32(1)), f32(0))
    return np.where(zero, f32(0), scale).astype(f32), np.where(zero[:, None], 0, L + nmax)


def _fp16_round(v):
    return v.astype(np.float16).astype(np.float32)


def _pack_2bit(L):
    """(n, 256) levels 0..3 → (n, 64): byte 32h + l holds elements 128h + 32s + l in bits 2s."""
    n = L.shape[0]
    L = L.astype(np.uint8).reshape(n, 2, 4, 32)
    return (L[:, :, 0] | (L[:, :, 1] << 2) | (L[:, :, 2] << 4) | (L[:, :, 3] << 6)).reshape(n, 64)


def _requantize(x, d_eff, offset, L, lo, hi):
    """Re-derive levels from the stored (fp16-rounded) scales, where the scale is non-zero."""
    ok = d_eff != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        l = np.clip(nearest_int((x + offset) / np.where(ok, d_eff, np.float32(1))), lo, hi)
    return np.where(ok, l, L)


# ------------------------------------------------------------------ quantizers


@register(QUANTIZERS, GGMLType.Q2_K)
def q_q2_k(x):
    f32 = np.float32
    n = x.shape[0]
    sub = x.reshape(n * 16, 16)
    scales, mins, L = make_qkx2_quants(sub, np.abs(sub), 3, -0.5, 0.1, 15, True)
    scales, mins, L = scales.reshape(n, 16), mins.reshape(n, 16), L.reshape(n, 16, 16)
    max_scale, max_min = scales.max(axis=1), mins.max(axis=1)
    has_s, has_m = max_scale > 0, max_min > 0
    ls = np.where(has_s[:, None], nearest_int((f32(15) / np.where(has_s, max_scale, 1))[:, None] * scales), 0)
    lm = np.where(has_m[:, None], nearest_int((f32(15) / np.where(has_m, max_min, 1))[:, None] * mins), 0)
    d = np.where(has_s, max_scale / f32(15), f32(0)).astype(f32)
    dmin = np.where(has_m, max_min / f32(15), f32(0)).astype(f32)
    sc = (ls | (lm << 4)).astype(np.uint8)
    d_eff = (_fp16_round(d)[:, None] * (sc & 0xF).astype(f32))[:, :, None]
    dm = (_fp16_round(dmin)[:, None] * (sc >> 4).astype(f32))[:, :, None]
    L = _requantize(x.reshape(n, 16, 16), d_eff, dm, L, 0, 3).reshape(n, QK_K)
    return np.concatenate([sc, _pack_2bit(L), f16_bytes(d[:, None]), f16_bytes(dmin[:, None])], axis=1)


@register(QUANTIZERS, GGMLType.Q3_K)
def q_q3_k(x):
    f32 = np.float32
    n = x.shape[0]
    scales, L = make_q3_quants(x.reshape(n * 16, 16), 4)
    scales, L = scales.reshape(n, 16), L.reshape(n, 16, 16)
    max_scale = _signed_absmax(scales)
    has = max_scale != 0
    iscale = np.where(has, f32(-32) / np.where(has, max_scale, f32(1)), f32(0))
    l = np.where(has[:, None], np.clip(nearest_int(iscale[:, None] * scales), -32, 31) + 32, 0).astype(np.uint8)
    packed = np.zeros((n, 12), dtype=np.uint8)
    packed[:, 0:8] = (l[:, 0:8] & 0xF) | ((l[:, 8:16] & 0xF) << 4)
    high = (l >> 4).reshape(n, 4, 4)  # [j // 4, j % 4]
    packed[:, 8:12] = high[:, 0] | (high[:, 1] << 2) | (high[:, 2] << 4) | (high[:, 3] << 6)
    d = np.where(has, f32(1) / np.where(has, iscale, f32(1)), f32(0)).astype(f32)
    d_eff = (_fp16_round(d)[:, None] * (l.astype(np.int32) - 32).astype(f32))[:, :, None]
    L = np.where(has[:, None, None], _requantize(x.reshape(n, 16, 16), d_eff, f32(0), L - 4, -4, 3) + 4, L)
    L = L.reshape(n, QK_K)
    high_bit = L > 3
    L = np.where(high_bit, L - 4, L)
    hmask = np.packbits(high_bit.reshape(n, 8, 32).transpose(0, 2, 1), axis=2, bitorder="little").reshape(n, 32)
    return np.concatenate([hmask, _pack_2bit(L), packed, f16_bytes(d[:, None])], axis=1)


def _q45_k(x, nmax, rmin, nstep):
    f32 = np.float32
    n = x.shape[0]
    sub = x.reshape(n * 8, 32)
    av = np.sqrt((sub * sub).sum(axis=1) / f32(32))
    scales, mins, L = make_qkx2_quants(sub, av[:, None] + np.abs(sub), nmax, rmin, 0.1, nstep, False)
    scales, mins, L = scales.reshape(n, 8), mins.reshape(n, 8), L.reshape(n, 8, 32)
    max_scale, max_min = scales.max(axis=1), mins.max(axis=1)
    inv_s = np.where(max_scale > 0, f32(63) / np.where(max_scale > 0, max_scale, 1), f32(0))
    inv_m = np.where(max_min > 0, f32(63) / np.where(max_min > 0, max_min, 1), f32(0))
    ls = np.minimum(nearest_int(inv_s[:, None] * scales), 63).astype(np.uint8)
    lm = np.minimum(nearest_int(inv_m[:, None] * mins), 63).astype(np.uint8)
    packed = np.empty((n, 12), dtype=np.uint8)
    packed[:, 0:4] = ls[:, 0:4] | ((ls[:, 4:8] >> 4) << 6)
    packed[:, 4:8] = lm[:, 0:4] | ((lm[:, 4:8] >> 4) << 6)
    packed[:, 8:12] = (ls[:, 4:8] & 0xF) | ((lm[:, 4:8] & 0xF) << 4)
    d = (max_scale / f32(63)).astype(f32)
    dmin = (max_min / f32(63)).astype(f32)
    d_eff = (_fp16_round(d)[:, None] * ls.astype(f32))[:, :, None]
    dm = (_fp16_round(dmin)[:, None] * lm.astype(f32))[:, :, None]
    L = _requantize(x.reshape(n, 8, 32), d_eff, dm, L, 0, nmax).reshape(n, QK_K).astype(np.uint8)
    head = np.concatenate([f16_bytes(d[:, None]), f16_bytes(dmin[:, None]), packed], axis=1)
    return head, L


def _pack_nibble_chunks(L):
    n = L.shape[0]
    L = (L & 0xF).reshape(n, 4, 2, 32)
    return (L[:, :, 0] | (L[:, :, 1] << 4)).reshape(n, 128)


@register(QUANTIZERS, GGMLType.Q4_K)
def q_q4_k(x):
    head, L = _q45_k(x, 15, -1.0, 20)
    return np.concatenate([head, _pack_nibble_chunks(L)], axis=1)


@register(QUANTIZERS, GGMLType.Q5_K)
def q_q5_k(x):
    head, L = _q45_k(x, 31, -0.5, 15)
    n = x.shape[0]
    qh = np.packbits((L >> 4).reshape(n, 8, 32).transpose(0, 2, 1), axis=2, bitorder="little").reshape(n, 32)
    return np.concatenate([head, qh, _pack_nibble_chunks(L)], axis=1)


@register(QUANTIZERS, GGMLType.Q6_K)
def q_q6_k(x):
    f32 = np.float32
    n = x.shape[0]
    scales, L = make_qx_quants(x.reshape(n * 16, 16), 32)
    scales, L = scales.reshape(n, 16), L.reshape(n, 16, 16)
    max_scale = _signed_absmax(scales)
    zero = np.abs(max_scale) < GROUP_MAX_EPS
    iscale = f32(-128) / np.where(zero, f32(1), max_scale)
    d = np.where(zero, f32(0), f32(1) / iscale).astype(f32)
    sc = np.where(zero[:, None], 0, np.minimum(nearest_int(iscale[:, None] * scales), 127)).astype(np.int8)
    d_eff = (_fp16_round(d)[:, None] * sc.astype(f32))[:, :, None]
    L = _requantize(x.reshape(n, 16, 16), d_eff, f32(0), L - 32, -32, 31) + 32
    L = np.where(zero[:, None, None], 0, L).reshape(n, 2, 4, 32).astype(np.uint8)
    ql = np.concatenate([(L[:, :, 0] & 0xF) | ((L[:, :, 2] & 0xF) << 4),
                         (L[:, :, 1] & 0xF) | ((L[:, :, 3] & 0xF) << 4)], axis=2).reshape(n, 128)
    qh = ((L[:, :, 0] >> 4) | ((L[:, :, 1] >> 4) << 2) | ((L[:, :, 2] >> 4) << 4) | ((L[:, :, 3] >> 4) << 6)).reshape(n, 64)
    return np.concatenate([ql, qh, sc.view(np.uint8), f16_bytes(d[:, None])], axis=1)
