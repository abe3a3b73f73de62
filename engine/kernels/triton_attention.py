"""Attention over the engine's KV cache on the device, as Triton kernels, and the dense ops
that use them (`TritonOps`, what `KernelSettings.ops_for` gives CUDA devices and a forced
`kernels=triton`).

- `decode_attention`: flash decoding for batches of few tokens per sequence (decode steps,
  speculative verification). A program takes one token's query heads of one KV head group
  and a split of the cache's cells; it reads each cell's position from the ring's
  arithmetic (a full-attention layer's cell is its position, a sliding ring's the position
  modulo its size), masks what the token may not see (later positions, outside the
  window or the chunk) in the kernel, and keeps an online softmax; the splits are then
  combined with torch, a head's sink logit (gpt-oss) joining there. Everything the kernel
  needs is a device tensor (slots, positions, each sequence's end): no host round trip,
  the same launch for every step of a batch's shape. Quantized cache rows (q8_0, q4_0,
  q4_1, q5_0, q5_1, iq4_nl) are decoded in the kernel with kernels.triton_ops' decoders.
- Prompts (many tokens of one sequence) stay with torch's SDPA per sequence, which reads
  the cache through `from_rows`; quantized rows are written and read on the device
  (kernels.device_rows), never through the host.

As with kernels.triton_ops, the kernels run on CUDA tensors, or on CPU tensors under
`TRITON_INTERPRET=1` (float32), which is how the tests check them."""

from __future__ import annotations

import torch

from . import device_rows, triton_ops
from .ops import TorchOps

DECODE_TOKENS = 16  # the most tokens of one sequence that go through decode_attention
_SPLIT_CELLS = 512  # cells per program: longer caches are split across programs, then combined

if triton_ops.AVAILABLE:
    import triton
    import triton.language as tl

    @triton.jit
    def _load_rows(buf, tables, row, d, mask, TYPE: tl.constexpr, TS: tl.constexpr):
        """A (cells, D) tile of cache rows starting at element/byte offsets `row` ((cells, 1)):
        float rows as stored, quantized ones (blocks of 32 values in TS bytes) decoded."""
        if TYPE == 0:
            return tl.load(buf + row + d, mask=mask, other=0.0).to(tl.float32)
        else:
            return triton_ops._tile(buf, tables, row + (d // 32) * TS, d % 32, mask, TYPE)

    @triton.jit
    def _attend(q, k, v, tables, part_m, part_l, part_o, slots, positions, ends,
                stride_qt, stride_qh, stride_ks, stride_kh, stride_kc, stride_vs, stride_vh, stride_vc,
                n_cells, window, chunk, scale, softcap, split_cells, n_splits,
                GROUP: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, DP: tl.constexpr,
                BLOCK_N: tl.constexpr, KTYPE: tl.constexpr, KTS: tl.constexpr, VTYPE: tl.constexpr, VTS: tl.constexpr,
                EXACT: tl.constexpr):
        t = tl.program_id(0)
        h = tl.program_id(1)
        sp = tl.program_id(2)
        slot = tl.load(slots + t).to(tl.int64)
        pos = tl.load(positions + t)
        end = tl.load(ends + t)
        used = tl.minimum(end, n_cells)
        lo = sp * split_cells
        hi = tl.minimum(lo + split_cells, used)
        g = tl.arange(0, GP)
        d = tl.arange(0, DP)[None, :]
        in_g = g[:, None] < GROUP
        in_d = d < D
        qs = tl.load(q + t.to(tl.int64) * stride_qt + (h * GROUP + g[:, None]) * stride_qh + d,
                     mask=in_g & in_d, other=0.0)
        m = tl.full((GP,), float("-inf"), tl.float32)
        l_sum = tl.zeros((GP,), tl.float32)
        acc = tl.zeros((GP, DP), tl.float32)
        k_base = k + slot * stride_ks + h * stride_kh
        v_base = v + slot * stride_vs + h * stride_vh
        for c0 in range(lo, hi, BLOCK_N):
            c = c0 + tl.arange(0, BLOCK_N)
            live = c < hi
            # the position cell c holds once the sequence has `end` tokens (the ring's arithmetic)
            cpos = c + n_cells * ((end - 1 - tl.minimum(c, end - 1)) // n_cells)
            ok = live & (cpos <= pos)
            ok = ok & ((window == 0) | (pos - cpos < window))
            ok = ok & ((chunk == 0) | (pos // tl.maximum(chunk, 1) == cpos // tl.maximum(chunk, 1)))
            cell_mask = live[:, None] & in_d
            ks = _load_rows(k_base, tables, c[:, None].to(tl.int64) * stride_kc, d, cell_mask, KTYPE, KTS)
            if EXACT:
                s = tl.dot(qs, tl.trans(ks.to(qs.dtype)), input_precision="ieee")
            else:
                s = tl.dot(qs, tl.trans(ks.to(qs.dtype)))
            s = s * scale
            if softcap != 0.0:  # softcap * tanh(s / softcap), tanh through exp
                s = softcap * (1.0 - 2.0 / (tl.exp(2.0 * s / softcap) + 1.0))
            s = tl.where(ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(s - m_use[:, None])
            alpha = tl.exp(m - m_use)
            l_sum = l_sum * alpha + tl.sum(p, axis=1)
            vs = _load_rows(v_base, tables, c[:, None].to(tl.int64) * stride_vc, d, cell_mask, VTYPE, VTS)
            if EXACT:
                acc = acc * alpha[:, None] + tl.dot(p.to(qs.dtype), vs.to(qs.dtype), input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(qs.dtype), vs.to(qs.dtype))
            m = m_new
        heads = t.to(tl.int64) * tl.num_programs(1) * GROUP + h * GROUP + g  # (token, head) rows
        out = heads * n_splits + sp
        tl.store(part_m + out, m, mask=g < GROUP)
        tl.store(part_l + out, l_sum, mask=g < GROUP)
        tl.store(part_o + out[:, None] * D + d, acc, mask=in_g & in_d)


def _pow2(n: int, least: int = 16) -> int:
    return max(least, 1 << (int(n) - 1).bit_length())


def _row_type(t) -> tuple[int, int]:
    """The kernel's row type and block bytes: (0, 0) for float rows, else the quantized type's
    GGML code and its blocks' size."""
    if t is None or not t.quantized:
        return 0, 0
    return t.ggml, t.block_bytes


def decode_attention(q: torch.Tensor, kbuf: torch.Tensor, vbuf: torch.Tensor, slots: torch.Tensor,
                     positions: torch.Tensor, ends: torch.Tensor, n_cells: int, scale: float, window: int = 0,
                     chunk: int = 0, softcap: float | None = None, sinks: torch.Tensor | None = None,
                     types=None) -> torch.Tensor:
    """Attention of q (T, heads, head_dim), each token at `positions` of the sequence in
    `slots` whose length once this batch is in the cache is `ends` (all (T,) device
    tensors), over the cache's keys and values (slots, kv heads, cells, row), written
    already. Returns (T, heads, head_dim) in q's dtype."""
    t, h, d = q.shape
    hkv = kbuf.shape[1]
    group = h // hkv
    split = max(_SPLIT_CELLS, triton.cdiv(n_cells, 64))
    n_splits = triton.cdiv(n_cells, split)
    dev = q.device
    part_m = torch.empty(t * h * n_splits, dtype=torch.float32, device=dev)
    part_l = torch.empty_like(part_m)
    part_o = torch.empty(t * h * n_splits, d, dtype=torch.float32, device=dev)
    qc = q if q.stride(-1) == 1 else q.contiguous()
    (ktype, kts), (vtype, vts) = (_row_type(t) for t in (types if types is not None else (None, None)))
    _attend[(t, hkv, n_splits)](
        qc, kbuf, vbuf, triton_ops._tables(dev), part_m, part_l, part_o, slots, positions, ends,
        qc.stride(0), qc.stride(1), kbuf.stride(0), kbuf.stride(1), kbuf.stride(2),
        vbuf.stride(0), vbuf.stride(1), vbuf.stride(2),
        n_cells, window, chunk, float(scale), float(softcap or 0.0), split, n_splits,
        GROUP=group, GP=_pow2(group), D=d, DP=_pow2(d), BLOCK_N=32 if d <= 128 else 16,
        KTYPE=ktype, KTS=kts, VTYPE=vtype, VTS=vts, EXACT=q.dtype == torch.float32)
    m = part_m.view(t, h, n_splits)
    top = m.amax(-1, keepdim=True)
    if sinks is not None:
        top = torch.maximum(top, sinks.float().view(1, h, 1))
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    w = torch.exp(m - top)
    total = (w * part_l.view(t, h, n_splits)).sum(-1)
    if sinks is not None:
        total = total + torch.exp(sinks.float().view(1, h) - top[..., 0])
    out = (w[..., None] * part_o.view(t, h, n_splits, d)).sum(-2) / total[..., None]
    return out.to(q.dtype)


class TritonOps(TorchOps):
    """The dense ops on a GPU: decode steps' attention through `decode_attention`, quantized
    cache rows written and read on the device; the rest as TorchOps. A decode step through
    these ops reads the batch's sequences only from its tensors (`graph_safe`)."""

    name = "triton"
    graph_safe = True

    def attention(self, q, kbuf, vbuf, batch, n_cells, window, scale, softcap=None, media_both_ways=False,
                  sinks=None, types=None, alibi=None, chunk=0):
        few = max(s.n for s in batch.seqs) <= DECODE_TOKENS
        spans = media_both_ways and any(batch.media_spans.get(s.slot) for s in batch.seqs)
        if not few or spans or alibi is not None or batch.both_ways:
            return super().attention(q, kbuf, vbuf, batch, n_cells, window, scale, softcap, media_both_ways,
                                     sinks, types, alibi, chunk)
        return decode_attention(q, kbuf, vbuf, batch.slots, batch.positions, batch.ends(), n_cells, scale,
                                window, chunk, softcap, sinks, types)

    @staticmethod
    def to_rows(x: torch.Tensor, t) -> torch.Tensor:
        if not t.quantized:
            return TorchOps.to_rows(x, t)
        return device_rows.quantize(x, t.ggml)

    def from_rows(self, rows: torch.Tensor, t, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
        if not t.quantized:
            return super().from_rows(rows, t, head_dim, dtype)
        return device_rows.dequantize(rows, t.ggml, head_dim, dtype)


TRITON_OPS = TritonOps()
