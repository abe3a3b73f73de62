"""The dense ops on CPU with the native library (csrc/ops.c): each op here replaces a
chain of small torch ops (a decode step runs hundreds of them) with one native call,
on float32 CPU tensors; anything else falls back to the torch op it overrides
(kernels.ops.TorchOps, the reference these are tested against)."""

from __future__ import annotations

import ctypes

import torch

from ..batch import Batch
from . import cpu
from .ops import DELTA_CHUNK, TorchOps

P, I64, INT, F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
ACTS = {"silu": 0, "gelu_tanh": 1}
# Sequences of at most this many new tokens attend natively; longer ones (prompt
# chunks) through torch's SDPA, whose blocked kernels win there.
NATIVE_ATTENTION_MAX_TOKENS = 16


def _bind(lib) -> None:
    lib.gc_rms_norm.restype = None
    lib.gc_rms_norm.argtypes = [P, I64, P, P, I64, I64, F, P]
    lib.gc_act_mul.restype = None
    lib.gc_act_mul.argtypes = [P, I64, P, I64, P, I64, I64, INT, INT]
    lib.gc_attention.restype = None
    lib.gc_attention.argtypes = [P, I64, I64, P, I64, P, I64, I64, INT, INT, INT, P, P, F, P, P, INT, INT, P, P, I64,
                                 P, P, P, P, INT, F, F, P, I64, I64, P, INT, INT]
    lib.gc_causal_conv.restype = INT
    lib.gc_causal_conv.argtypes = [P, I64, P, I64, P, INT, P, INT, P, P, P, INT]
    lib.gc_gated_delta.restype = INT
    lib.gc_gated_delta.argtypes = [P, I64, P, I64, P, I64, P, P, P, INT, INT, INT, INT, P, INT, P, P, P, INT]


_LIB = cpu.load()
if _LIB is not None:
    _bind(_LIB)


def _f32(*ts: torch.Tensor) -> bool:
    return all(t.dtype is torch.float32 and t.device.type == "cpu" for t in ts)


def _rows(x: torch.Tensor) -> bool:
    """Rows of contiguous elements (any row stride)."""
    return x.dim() == 2 and x.stride(1) == 1


def _ptr(t: torch.Tensor | None):
    return None if t is None else t.data_ptr()


def _seq_arrays(batch: Batch):
    """(n_seq, slot, start, len) int64 tensors of the batch's sequences, once per forward."""
    if "seq_arrays" not in batch.memo:
        a = torch.tensor([[s.slot, s.start, s.n] for s in batch.seqs], dtype=torch.int64).t().contiguous()
        batch.memo["seq_arrays"] = (len(batch.seqs), a[0].contiguous(), a[1].contiguous(), a[2].contiguous())
    return batch.memo["seq_arrays"]


def _kv_end(batch: Batch) -> torch.Tensor:
    if "kv_end" not in batch.memo:
        batch.memo["kv_end"] = torch.tensor([s.end for s in batch.seqs for _ in range(s.n)], dtype=torch.int64)
    return batch.memo["kv_end"]


class CpuOps(TorchOps):
    name = "cpu-native"

    def rms_norm(self, x, w, eps):
        if not _f32(x, w):
            return super().rms_norm(x, w, eps)
        cols = x.shape[-1]
        x2 = x.reshape(-1, cols)
        if not _rows(x2):
            x2 = x2.contiguous()
        y = torch.empty(x.shape, dtype=torch.float32)
        _LIB.gc_rms_norm(x2.data_ptr(), x2.stride(0), w.data_ptr(), y.data_ptr(), x2.shape[0], cols, eps, None)
        return y

    def rms_norm_add(self, x, w, eps, residual):
        if not (_f32(x, w, residual) and x.is_contiguous() and residual.is_contiguous()):
            return super().rms_norm_add(x, w, eps, residual)
        cols = x.shape[-1]
        y = torch.empty(x.shape, dtype=torch.float32)
        _LIB.gc_rms_norm(x.data_ptr(), cols, w.data_ptr(), y.data_ptr(), x.numel() // cols, cols, eps,
                         residual.data_ptr())
        return y

    def act_mul(self, gate, up, act):
        g2, u2 = gate.reshape(-1, gate.shape[-1]), up.reshape(-1, up.shape[-1])
        if not (_f32(gate, up) and _rows(g2) and _rows(u2)):
            return super().act_mul(gate, up, act)
        out = torch.empty(gate.shape, dtype=torch.float32)
        _LIB.gc_act_mul(g2.data_ptr(), g2.stride(0), u2.data_ptr(), u2.stride(0), out.data_ptr(), g2.shape[0],
                        g2.shape[1], ACTS[act], cpu.threads())
        return out

    def self_attention(self, q, k, v, gate, *, q_norm, k_norm, eps, cos, sin, neox, kbuf, vbuf, cells, batch,
                       n_cells, window, scale, softcap):
        t, h, d = q.shape
        n_kv = k.shape[1]
        heads_ok = q.stride(2) == k.stride(2) == v.stride(2) == 1 and k.stride(1) == v.stride(1) == d
        if not (_f32(q, k, v, kbuf, vbuf, cos, sin) and heads_ok and kbuf.is_contiguous() and vbuf.is_contiguous()
                and (gate is None or gate.stride(2) == 1)):
            return super().self_attention(q, k, v, gate, q_norm=q_norm, k_norm=k_norm, eps=eps, cos=cos, sin=sin,
                                          neox=neox, kbuf=kbuf, vbuf=vbuf, cells=cells, batch=batch, n_cells=n_cells,
                                          window=window, scale=scale, softcap=softcap)
        attend = max(s.n for s in batch.seqs) <= NATIVE_ATTENTION_MAX_TOKENS
        out = torch.empty(t, h * d, dtype=torch.float32)
        g_row, g_head = (gate.stride(0), gate.stride(1)) if gate is not None else (0, 0)
        _LIB.gc_attention(q.data_ptr(), q.stride(0), q.stride(1), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0),
                          t, h, n_kv, d, _ptr(q_norm), _ptr(k_norm), eps, cos.data_ptr(), sin.data_ptr(),
                          cos.shape[-1], int(neox), kbuf.data_ptr(), vbuf.data_ptr(), n_cells, batch.slots.data_ptr(),
                          cells.data_ptr(), batch.positions.data_ptr(), _kv_end(batch).data_ptr(), window, scale,
                          softcap or 0.0, _ptr(gate) if attend else None, g_row, g_head, out.data_ptr(), int(attend),
                          cpu.threads())
        if attend:
            return out
        o = self.attention(q, kbuf, vbuf, batch, n_cells, window, scale, softcap).reshape(t, h * d)
        return o if gate is None else o * torch.sigmoid(gate.reshape(t, h * d))

    def causal_conv(self, x, conv_state, weight, batch):
        if not (_f32(x, conv_state, weight) and _rows(x) and conv_state.is_contiguous() and weight.is_contiguous()):
            return super().causal_conv(x, conv_state, weight, batch)
        n, slot, start, length = _seq_arrays(batch)
        out = torch.empty(x.shape, dtype=torch.float32)
        rc = _LIB.gc_causal_conv(x.data_ptr(), x.stride(0), out.data_ptr(), x.shape[1], weight.data_ptr(),
                                 weight.shape[1], conv_state.data_ptr(), n, slot.data_ptr(), start.data_ptr(),
                                 length.data_ptr(), cpu.threads())
        if rc != 0:
            return super().causal_conv(x, conv_state, weight, batch)
        return out

    def gated_delta_rule(self, q, k, v, g, beta, state, batch):
        t, n_k, dk = q.shape
        n_v, dv = v.shape[1], v.shape[2]
        shaped = all(x.stride(2) == 1 and x.stride(1) == x.shape[2] for x in (q, k, v))
        if (max(s.n for s in batch.seqs) > DELTA_CHUNK or not shaped
                or not (_f32(q, k, v, g, beta, state) and state.is_contiguous())):
            return super().gated_delta_rule(q, k, v, g, beta, state, batch)
        g, beta = g.contiguous(), beta.contiguous()
        n, slot, start, length = _seq_arrays(batch)
        out = torch.empty(t, n_v, dv, dtype=torch.float32)
        rc = _LIB.gc_gated_delta(q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0),
                                 g.data_ptr(), beta.data_ptr(), out.data_ptr(), n_k, n_v, dk, dv, state.data_ptr(), n,
                                 slot.data_ptr(), start.data_ptr(), length.data_ptr(), cpu.threads())
        if rc != 0:
            return super().gated_delta_rule(q, k, v, g, beta, state, batch)
        return out


CPU_OPS = CpuOps()
