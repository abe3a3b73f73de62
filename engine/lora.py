"""LoRA adapters: llama.cpp's GGUF adapter files (convert_lora_to_gguf.py: `general.type`
adapter, `adapter.type` lora, `adapter.lora.alpha`, tensors `<base tensor>.lora_a` (rank,
in) and `.lora_b` (out, rank)), applied per row of a batch.

An adapter is read and checked against its base model (architecture, every pair's shape
and rank), its pairs read as float32 (A with alpha / rank folded in, B transposed), and
attached to the model's matrices by name (`attach`): a matrix then holds a `Stack` of its
adapters' factors (float16 with the native CPU kernels, which then take a decode step's
products). A forward pass says
which rows use which adapters at what scale (`Batch.lora`: slot -> ((adapter id, scale),
...)); while it runs (`rows`), each matrix with adapters adds, to the rows that use one,
scale * alpha / rank * (x A^T) B^T, as llama.cpp's build_lora_mm does. The base product is
computed once for the whole batch: requests with different adapters, or none, share the
batch."""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import numpy as np
import torch

from ..gguf_io import GGUFReader
from .errors import FileError
from .kernels import cpu

# while a forward runs: adapter id -> (the batch's rows that use it, their scales, whether that
# is every row, the one scale they share or None)
_ROWS: contextvars.ContextVar[dict[int, tuple] | None] = contextvars.ContextVar("lora_rows", default=None)


class AdapterError(FileError):
    """An adapter file that is not a LoRA adapter for this model (its words say why)."""


@dataclass
class Adapter:
    """A LoRA adapter read from its file: per base tensor name, (A (rank, in) times alpha /
    rank, as llama.cpp's get_scale (1 where the file gives no alpha), B^T (rank, out)); once
    attached, they live in the matrices' stacks (`pairs` emptied)."""

    id: int
    path: str
    alpha: float
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]]
    names: tuple[str, ...] = ()
    nbytes: int = 0

    def __post_init__(self):
        self.names = tuple(self.pairs)
        self.nbytes = sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in self.pairs.values())


F16_MAX = 65504.0  # the largest float16


class Stack:
    """One matrix's adapters: their A's stacked (R, in) and their B^T's (R, out), R the sum
    of their ranks. With the native kernels, float16 (an F16 adapter file's values as they
    are; an F32 one's rounded: half the bytes a decode step reads) where they fit its range,
    and a decode step's products on the kernels' threads (cpu.LoraProducts: all adapters at
    once, and each adapter's alone)."""

    def __init__(self, parts: dict[int, tuple[torch.Tensor, torch.Tensor]], native: cpu.CpuKernels | None):
        self.native = native if next(iter(parts.values()))[0].device.type == "cpu" else None
        self.ids = tuple(parts)
        a = torch.cat([a for a, _ in parts.values()])
        bt = torch.cat([bt for _, bt in parts.values()])
        self.spans, start = {}, 0
        for i, (part, _) in parts.items():
            self.spans[i] = (start, part.shape[0])
            start += part.shape[0]
        half = self.native is not None and all(bool(t.float().abs().max() < F16_MAX) for t in (a, bt))
        dtype = torch.float16 if half else torch.float32
        self.a, self.bt = a.to(dtype).contiguous(), bt.to(dtype).contiguous()
        self.fast = self.each = None
        if half:
            self.fast = cpu.LoraProducts(self.native, self.a, self.bt, [o + r for o, r in self.spans.values()])
            self.each = {i: cpu.LoraProducts(self.native, self.a[o:o + r], self.bt[o:o + r], [r])
                         for i, (o, r) in self.spans.items()}

    def parts(self) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        return {i: (self.a[o:o + r], self.bt[o:o + r]) for i, (o, r) in self.spans.items()}

    def adding(self, adapter_id: int, a: torch.Tensor, bt: torch.Tensor) -> "Stack":
        return Stack({**self.parts(), adapter_id: (a, bt)}, self.native)

    def without(self, adapter_id: int) -> "Stack | None":
        rest = {i: p for i, p in self.parts().items() if i != adapter_id}
        return Stack(rest, self.native) if rest else None


def read_adapter(path: str, base: GGUFReader, adapter_id: int, device: torch.device | str = "cpu") -> Adapter:
    """The adapter in `path`, checked against the base model's file; AdapterError naming
    what does not fit."""
    try:
        r = GGUFReader(path)
    except (OSError, ValueError) as e:
        raise AdapterError(f"{path}: not a readable GGUF file ({e})") from None
    kind = (r.metadata.get("general.type"), r.metadata.get("adapter.type"))
    if kind != ("adapter", "lora"):
        raise AdapterError(f"{path}: not a LoRA adapter (general.type {kind[0]!r}, adapter.type {kind[1]!r})")
    arch, base_arch = r.metadata.get("general.architecture"), base.metadata.get("general.architecture")
    if arch != base_arch:
        raise AdapterError(f"{path}: an adapter for {arch!r}, and the model is {base_arch!r}")
    alpha = float(r.metadata.get("adapter.lora.alpha") or 0.0)
    names = {n[:-len(".lora_a")] for n in r.tensors if n.endswith(".lora_a")}
    names |= {n[:-len(".lora_b")] for n in r.tensors if n.endswith(".lora_b")}
    pairs = {}
    for name in sorted(names):
        a, b = r.tensors.get(name + ".lora_a"), r.tensors.get(name + ".lora_b")
        if a is None or b is None:
            raise AdapterError(f"{path}: {name} has only one of lora_a and lora_b")
        w = base.tensors.get(name)
        if w is None:
            raise AdapterError(f"{path}: the model has no tensor {name} (an adapter for another model?)")
        out_features, in_features = tuple(w.shape)[:2] if len(w.shape) == 2 else (None, None)
        if (len(a.shape), len(b.shape)) != (2, 2) or a.shape[1] != in_features or b.shape[0] != out_features \
                or a.shape[0] != b.shape[1]:
            raise AdapterError(f"{path}: {name}'s lora_a {tuple(a.shape)} and lora_b {tuple(b.shape)} do not fit "
                               f"the model's {tuple(w.shape)} (an adapter for another model?)")
        a_, b_ = (torch.from_numpy(np.ascontiguousarray(t.dequantize(), dtype=np.float32).reshape(t.shape))
                  for t in (a, b))
        factor = alpha / a_.shape[0] if alpha else 1.0
        pairs[name] = ((a_ * factor).to(device), b_.T.contiguous().to(device))  # B^T: the product reads its rows
    if not pairs:
        raise AdapterError(f"{path}: holds no lora_a / lora_b tensors")
    return Adapter(adapter_id, path, alpha, pairs)


def attach(linears: dict, adapter: Adapter, native: cpu.CpuKernels | None = None) -> None:
    """The adapter's pairs onto the model's matrices (`linears`: tensor name -> matrix):
    each matrix's Stack gets them (the adapter's own copies are let go); AdapterError for a
    pair on a tensor that is not one of them (an embedding, experts). With the native CPU
    kernels (`native`), float16 factors and a decode step's few rows through their threads
    (Stack)."""
    missing = sorted(set(adapter.pairs) - set(linears))
    if missing:
        raise AdapterError(f"{adapter.path}: adapters on {', '.join(missing[:3])} are not supported (only on the "
                           "attention and feed-forward matrices)")
    held = 0
    for name, (a, bt) in adapter.pairs.items():
        m = linears[name]
        m.lora = m.lora.adding(adapter.id, a, bt) if m.lora is not None else Stack({adapter.id: (a, bt)}, native)
        held += (a.numel() + bt.numel()) * m.lora.a.element_size()
    adapter.pairs = {}
    adapter.nbytes = held  # as its stacks keep it (float16 with the native kernels)


def detach(linears: dict, adapter_id: int) -> None:
    for m in linears.values():
        if m.lora is not None and adapter_id in m.lora.spans:
            m.lora = m.lora.without(adapter_id)


@contextlib.contextmanager
def rows(batch):
    """While a forward of `batch` runs: which of its tokens use which adapters, at what scale."""
    chosen = batch.lora
    if not chosen:
        yield
        return
    by_id: dict[int, list[tuple[int, int, float]]] = {}
    for s in batch.seqs:
        for adapter_id, scale in chosen.get(s.slot, ()):
            if scale:
                by_id.setdefault(adapter_id, []).append((s.start, s.n, scale))
    table = {}
    for adapter_id, spans in by_id.items():
        idx = torch.cat([torch.arange(start, start + n) for start, n, _ in spans])
        scales = torch.cat([torch.full((n,), scale) for _, n, scale in spans])
        every = idx.numel() == batch.n_tokens  # all the batch's rows, in order: no gather
        one = {scale for _, _, scale in spans}
        table[adapter_id] = (idx.to(batch.tokens.device), scales.to(batch.tokens.device), every,
                             one.pop() if len(one) == 1 else None)
    token = _ROWS.set(table or None)
    try:
        yield
    finally:
        _ROWS.reset(token)


def add(y: torch.Tensor, x: torch.Tensor, stack: Stack) -> torch.Tensor:
    """y (the base product of x, written into) plus the active adapters' products for their
    rows: x A^T (A with alpha / rank folded in), times each row's scale, then B. A decode
    step's few rows take the native products: where every adapter the matrix has is active,
    all of them at once (every row through the stacked A's, each row's scales as a mask over
    their columns, 0 for an adapter it does not use, then B span by span: a row's sum is
    what it is with its own adapters alone); else each active one on its own rows. Longer
    batches (a prompt) take torch's products in float32."""
    table = _ROWS.get()
    if not table:
        return y
    active = [i for i in stack.ids if i in table]
    fast = stack.fast
    native = fast is not None and fast.takes(x, y)
    if native and 1 < len(active) == len(stack.ids):
        fast.up(y, fast.down(x, _mask(table, stack, x.shape[0])))
        return y
    for i in active:
        idx, scales, every, scale = table[i]
        o, r = stack.spans[i]
        xs = x if every else x.index_select(0, idx)
        if native:
            h = stack.each[i].down(xs.contiguous())
        else:
            h = xs.to(torch.float32) @ stack.a[o:o + r].to(torch.float32).T
        if scale != 1.0:  # one scale for all its rows (1: nothing to do), else each row's
            h = h * (scales.unsqueeze(1) if scale is None else scale)
        if native and every:
            stack.each[i].up(y, h)
            continue
        if native:
            delta = torch.zeros(h.shape[0], y.shape[1])
            stack.each[i].up(delta, h)
        else:
            delta = (h @ stack.bt[o:o + r].to(torch.float32)).to(y.dtype)
        if every:
            y.add_(delta)
        else:
            y.index_add_(0, idx, delta)
    return y


def _mask(table: dict, stack: Stack, n: int) -> torch.Tensor:
    """(n rows, the stack's R columns): each row's scale in the columns of the adapters it
    uses, else 0; made once per forward for each stack layout."""
    key = ("mask", stack.ids, tuple(stack.spans.values()), n)
    got = table.get(key)
    if got is None:
        got = torch.zeros(n, stack.a.shape[0], device=stack.a.device)
        for i in stack.ids:
            idx, scales = table[i][:2]
            o, r = stack.spans[i]
            got[idx, o:o + r] = scales.unsqueeze(1)
        table[key] = got
    return got
