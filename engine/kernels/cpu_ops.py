"""The dense ops on CPU with the native library (csrc/ops/): each op here replaces a
chain of small torch ops (a decode step runs hundreds of them) with one native call,
on float32 CPU tensors; anything else falls back to the torch op it overrides
(kernels.ops.TorchOps, the reference these are tested against). One CpuOps per model's
kernel settings (kernels.cpu.CpuKernels): its calls run on that model's threads."""

from __future__ import annotations

import ctypes
import weakref

import torch

from ..batch import Batch
from . import cpu
from .ops import DELTA_CHUNK, TorchOps

P, I64, INT, F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
ACTS = {"silu": 0, "gelu_tanh": 1, "swiglu_oai": 2}
# Sequences of at most this many new tokens attend natively over blocks of cells split
# across threads (decode); a batch with a longer one (a prompt chunk) attends natively in
# tiles of tokens (flash attention), where the head size is a multiple of 16, else
# through torch's SDPA. Prompts with images seen both ways and encoders take torch's.
NATIVE_ATTENTION_MAX_TOKENS = 16
ATTEND_TORCH, ATTEND_BLOCKS, ATTEND_TILES = 0, 1, 2
MAX_HEAD_DIM = 1024  # ops.h: the native attention's largest head (DeepSeek's MLA keys are 576)


class AttnLayer(ctypes.Structure):
    """gc_attn_layer (csrc/ops/attention.c): a layer's attention as the native op sees it."""

    _fields_ = [("n_head", I64), ("n_kv", I64), ("d", I64), ("q_off", I64), ("q_head", I64), ("k_off", I64),
                ("v_off", I64), ("gate_off", I64), ("q_norm", P), ("k_norm", P), ("eps", F), ("scale", F),
                ("softcap", F), ("half", ctypes.c_int32), ("neox", ctypes.c_int32), ("window", ctypes.c_int32),
                ("kc", P), ("vc", P), ("n_cells", I64), ("sinks", P), ("v_norm", P), ("kv_shared", ctypes.c_int32),
                ("k_type", ctypes.c_int32), ("v_type", ctypes.c_int32)]


def _bind(lib) -> None:
    lib.gc_rms_norm.restype = None
    lib.gc_rms_norm.argtypes = [P, I64, P, P, I64, I64, F, P]
    lib.gc_act_mul.restype = None
    lib.gc_act_mul.argtypes = [P, I64, P, I64, P, I64, I64, INT, INT]
    lib.gc_attention.restype = INT
    lib.gc_attention.argtypes = [ctypes.POINTER(AttnLayer), P, I64, I64, P, P, P, P, P, P, P, INT, INT]
    lib.gc_kv_rows.restype = INT
    lib.gc_kv_rows.argtypes = [INT, P, I64, I64, I64, I64, P, INT]
    lib.gc_moe_route.restype = None
    lib.gc_moe_route.argtypes = [P, I64, I64, INT, INT, P, P]
    lib.gc_moe_combine.restype = None
    lib.gc_moe_combine.argtypes = [P, P, I64, INT, I64, P]
    lib.gc_mask_logits.restype = None
    lib.gc_mask_logits.argtypes = [P, I64, P, I64]
    lib.gc_causal_conv.restype = INT
    lib.gc_causal_conv.argtypes = [P, I64, P, I64, P, INT, INT, P, INT, P, P, P, INT]
    lib.gc_gated_delta.restype = INT
    lib.gc_gated_delta.argtypes = [P, I64, P, I64, P, I64, P, P, P, INT, INT, INT, INT, P, INT, P, P, P, INT]


F32 = torch.float32


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


def _past_chunk(batch, chunk: int) -> bool:
    """Whether a chunked layer's queries reach past the first chunk (the native kernels
    attend causally or in a window; chunks past the first are masked in torch)."""
    if not chunk:
        return False
    key = ("past_chunk", chunk)
    if key not in batch.memo:
        batch.memo[key] = max(s.pos + s.n for s in batch.seqs) > chunk
    return batch.memo[key]


def _native_layer(spec, cache, memo: weakref.WeakKeyDictionary) -> AttnLayer | None:
    """The layer's native description for this cache (built once per spec and cache
    buffer), or None where the native op does not apply (a head count that does not
    divide, weights of another dtype)."""
    key = (id(cache), cache.k[spec.layer].data_ptr())
    got = memo.get(spec)
    if got is not None and got[0] == key:
        return got[1]
    kbuf, vbuf = cache.kv(spec.layer)
    d, h, hkv = spec.head_dim, spec.n_heads, spec.n_kv_heads
    ok = kbuf.device.type == "cpu" and kbuf.is_contiguous() and vbuf.is_contiguous() and h % hkv == 0 and \
        d <= MAX_HEAD_DIM and all(
        w is None or (w.dtype is F32 and w.is_contiguous()) for w in (spec.sinks, spec.v_norm, spec.q_norm, spec.k_norm))
    qw = spec.q_width
    layer = None
    if ok:
        layer = AttnLayer(h, hkv, d, 0, 2 * d if spec.gated else d, qw, qw + hkv * d, d if spec.gated else -1,
                          _ptr(spec.q_norm), _ptr(spec.k_norm), spec.eps, spec.scale, spec.softcap or 0.0,
                          spec.rope.inv_freq.shape[0], int(spec.rope.neox), spec.window, kbuf.data_ptr(),
                          vbuf.data_ptr(), cache.n_cells[spec.layer], _ptr(spec.sinks), _ptr(spec.v_norm),
                          int(spec.kv_shared), cache.types[0].ggml, cache.types[1].ggml)
        layer._keep = (spec.q_norm, spec.k_norm, kbuf, vbuf, spec.sinks, spec.v_norm)  # the pointers' owners
    memo[spec] = (key, layer)
    return layer


class CpuOps(TorchOps):
    name = "cpu-native"

    def __init__(self, kernels: cpu.CpuKernels):
        lib = kernels.lib
        _bind(lib)
        self._lib, self.kernels, self.threads = lib, kernels, kernels.threads
        self._norm, self._act, self._attn = lib.gc_rms_norm, lib.gc_act_mul, lib.gc_attention
        self._layers = weakref.WeakKeyDictionary()  # AttentionSpec -> (cache key, AttnLayer)

    def rms_norm(self, x, w, eps):
        if x.dtype is F32 and x.is_contiguous():
            y = torch.empty_like(x)
            cols = w.shape[0]
            self._norm(x.data_ptr(), cols, w.data_ptr(), y.data_ptr(), x.numel() // cols, cols, eps, None)
            return y
        if x.dtype is F32 and x.dim() == 2 and x.stride(1) == 1:  # rows with a stride (q/k heads)
            y = x.new_empty(x.shape)
            self._norm(x.data_ptr(), x.stride(0), w.data_ptr(), y.data_ptr(), x.shape[0], x.shape[1], eps, None)
            return y
        return super().rms_norm(x, w, eps)

    def rms_norm_add(self, x, w, eps, residual):
        if x.dtype is F32 and x.is_contiguous() and residual.is_contiguous() and residual.dtype is F32:
            y = torch.empty_like(x)
            cols = w.shape[0]
            self._norm(x.data_ptr(), cols, w.data_ptr(), y.data_ptr(), x.numel() // cols, cols, eps, residual.data_ptr())
            return y
        return super().rms_norm_add(x, w, eps, residual)

    def moe_route(self, logits, k, norm):
        if logits.dtype is F32 and logits.dim() == 2 and logits.is_contiguous() and 0 < k <= logits.shape[1]:
            t = logits.shape[0]
            weights, ids = logits.new_empty(t, k), torch.empty(t, k, dtype=torch.int64)
            self._lib.gc_moe_route(logits.data_ptr(), t, logits.shape[1], k, int(norm), ids.data_ptr(), weights.data_ptr())
            return weights, ids
        return super().moe_route(logits, k, norm)

    def moe_combine(self, y, weights):
        if y.dtype is F32 and weights.dtype is F32 and y.dim() == 3 and y.is_contiguous() and weights.is_contiguous():
            out = y.new_empty(y.shape[0], y.shape[2])
            self._lib.gc_moe_combine(y.data_ptr(), weights.data_ptr(), y.shape[0], y.shape[1], y.shape[2], out.data_ptr())
            return out
        return super().moe_combine(y, weights)

    def mask_logits(self, logits, allowed, n_allowed):
        if logits.dtype is not F32 or logits.dim() != 1 or logits.device.type != "cpu":
            return super().mask_logits(logits, allowed, n_allowed)
        out = logits.clone()
        buf = (ctypes.c_char * len(allowed)).from_buffer_copy(allowed)
        self._lib.gc_mask_logits(out.data_ptr(), out.shape[0], ctypes.addressof(buf), min(n_allowed, 8 * len(allowed)))
        return out

    def gated_mul(self, y, n, act):
        if y.dtype is F32 and y.is_contiguous() and y.dim() == 2:
            out = y.new_empty(y.shape[0], n)
            p, row = y.data_ptr(), y.shape[1]
            self._act(p, row, p + 4 * n, row, out.data_ptr(), y.shape[0], n, ACTS[act], self.threads)
            return out
        return super().gated_mul(y, n, act)

    def act_mul(self, gate, up, act):
        g2, u2 = gate.reshape(-1, gate.shape[-1]), up.reshape(-1, up.shape[-1])
        if not (_f32(gate, up) and _rows(g2) and _rows(u2)):
            return super().act_mul(gate, up, act)
        out = torch.empty(gate.shape, dtype=torch.float32)
        self._act(g2.data_ptr(), g2.stride(0), u2.data_ptr(), u2.stride(0), out.data_ptr(), g2.shape[0], g2.shape[1],
             ACTS[act], self.threads)
        return out

    def self_attention(self, qkv, spec, batch, cache):
        layer = _native_layer(spec, cache, self._layers)
        if layer is None or qkv.dtype is not F32 or qkv.stride(1) != 1 or _past_chunk(batch, spec.chunk):
            return super().self_attention(qkv, spec, batch, cache)
        memo = batch.memo
        native = memo.get("native_attention")
        if native is None:  # once per forward: the batch's arrays, and how to attend
            mode = ATTEND_TORCH
            if not batch.media_spans and not batch.both_ways:
                mode = ATTEND_BLOCKS if max(s.n for s in batch.seqs) <= NATIVE_ATTENTION_MAX_TOKENS else ATTEND_TILES
            native = memo["native_attention"] = (mode, batch.slots.data_ptr(), batch.positions.data_ptr(),
                                                 batch.ends().data_ptr())
        attend, slots, pos, kv_end = native
        if (attend == ATTEND_TILES and spec.head_dim % 16) or spec.alibi is not None:
            attend = ATTEND_TORCH
        t, hd = qkv.shape[0], spec.n_heads * spec.head_dim
        cos, sin = spec.rope.tables(batch)
        out = qkv.new_empty(t, hd)
        rc = self._attn(layer, qkv.data_ptr(), qkv.stride(0), t, cos.data_ptr(), sin.data_ptr(), slots,
                        cache.cells(spec.layer, batch).data_ptr(), pos, kv_end, out.data_ptr(), attend,
                        self.threads)
        cpu.check(rc, "gc_attention", f"{t} tokens, {spec.n_heads} heads of {spec.head_dim}")
        if attend:
            return out
        # prompt chunks: q/k normalized and rotated, k/v cached by the native op; torch attends
        d, h = spec.head_dim, spec.n_heads
        q = qkv[:, :layer.k_off].reshape(t, h, -1)[..., :d]
        kbuf, vbuf = cache.kv(spec.layer)
        o = self.attention(q, kbuf, vbuf, batch, cache.n_cells[spec.layer], spec.window, spec.scale,
                           spec.softcap, spec.media_both_ways, spec.sinks, cache.types, alibi=spec.alibi,
                           chunk=spec.chunk).reshape(t, hd)
        if spec.gated:
            o = o * torch.sigmoid(qkv[:, :layer.k_off].reshape(t, h, 2 * d)[..., d:].reshape(t, hd))
        return o

    def from_rows(self, rows, t, head_dim, dtype):
        if (not t.quantized or dtype is not F32 or rows.dim() != 3 or rows.device.type != "cpu"
                or rows.stride(2) != 1 or rows.stride(1) != rows.shape[2]):
            return super().from_rows(rows, t, head_dim, dtype)
        # (kv heads, cells, row bytes) of one slot: each head's cells are contiguous rows
        out = torch.empty(*rows.shape[:-1], head_dim, dtype=torch.float32)
        rc = self._lib.gc_kv_rows(t.ggml, rows.data_ptr(), rows.shape[0], rows.stride(0), rows.shape[1], head_dim,
                                  out.data_ptr(), self.threads)
        cpu.check(rc, "gc_kv_rows", f"{t.name} rows of {head_dim}")
        return out

    def causal_conv(self, x, conv_state, weight, batch, silu: bool = True):
        if not (_f32(x, conv_state, weight) and _rows(x) and conv_state.is_contiguous() and weight.is_contiguous()):
            return super().causal_conv(x, conv_state, weight, batch, silu)
        n, slot, start, length = _seq_arrays(batch)
        out = torch.empty(x.shape, dtype=torch.float32)
        rc = self._lib.gc_causal_conv(x.data_ptr(), x.stride(0), out.data_ptr(), x.shape[1], weight.data_ptr(),
                                 weight.shape[0], int(silu), conv_state.data_ptr(), n, slot.data_ptr(),
                                 start.data_ptr(), length.data_ptr(), self.threads)
        if rc == cpu.Status.UNSUPPORTED:  # a kernel size the native op does not take
            return super().causal_conv(x, conv_state, weight, batch, silu)
        cpu.check(rc, "gc_causal_conv", f"{x.shape[1]} channels, kernel {weight.shape[0]}")
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
        rc = self._lib.gc_gated_delta(q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0),
                                 g.data_ptr(), beta.data_ptr(), out.data_ptr(), n_k, n_v, dk, dv, state.data_ptr(), n,
                                 slot.data_ptr(), start.data_ptr(), length.data_ptr(), self.threads)
        if rc == cpu.Status.UNSUPPORTED:  # head sizes the native op does not take
            return super().gated_delta_rule(q, k, v, g, beta, state, batch)
        cpu.check(rc, "gc_gated_delta", f"{n_k} key / {n_v} value heads of {dk} / {dv}")
        return out


def cpu_ops(threads: int | None = None) -> CpuOps:
    """Native dense ops for direct calls (tests, benchmarks) on `threads` (None: the
    default), the process's code path; a model's come from its kernel settings
    (kernels.KernelSettings.ops_for)."""
    kernels = cpu.CpuKernels.make(threads)
    if kernels is None:
        raise RuntimeError("the native CPU kernels are not built")
    return CpuOps(kernels)
