"""The engine's KV cache: one object, sized once at load, holding every layer's state
for a fixed number of sequence slots.

- full-attention layers: keys and values (slots, kv_heads, n_ctx, head_dim); cell c
  holds position c.
- sliding-window layers: a ring of `window + max_batch` cells per slot (or n_ctx cells
  when that is fewer); position p lives in cell p % cells, and a batch of up to
  `max_batch` tokens never overwrites a position its own queries still see.
- linear-attention layers (Qwen3.5's Gated DeltaNet): a causal-conv state (slots,
  kernel - 1, channels) and a recurrent state (slots, heads, key_dim, value_dim), float32.

Attention reads the buffers (`kv`, `linear`) and the per-token cell indices (`cells`);
nothing else touches them. A slot is allocated, filled by forward passes (`begin`
checks each batch against what the slot holds), copied up to a prefix, and freed."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .batch import Batch


class CacheError(ValueError):
    """A batch does not fit what the cache holds (slot, position, size)."""


@dataclass(frozen=True)
class LayerCache:
    """What one layer keeps: kind "attention" (n_kv_heads, head_dim, window; 0 = full
    attention) or "linear" (conv_dim, conv_kernel, n_heads, key_dim, value_dim)."""

    kind: str
    n_kv_heads: int = 0
    head_dim: int = 0
    window: int = 0
    conv_dim: int = 0
    conv_kernel: int = 0
    n_heads: int = 0
    key_dim: int = 0
    value_dim: int = 0


def attention(n_kv_heads: int, head_dim: int, window: int = 0) -> LayerCache:
    return LayerCache("attention", n_kv_heads=n_kv_heads, head_dim=head_dim, window=window)


def linear(conv_dim: int, conv_kernel: int, n_heads: int, key_dim: int, value_dim: int) -> LayerCache:
    return LayerCache("linear", conv_dim=conv_dim, conv_kernel=conv_kernel, n_heads=n_heads, key_dim=key_dim,
                      value_dim=value_dim)


def _elsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def bytes_per_token(layers: list[LayerCache], dtype: torch.dtype) -> int:
    """Bytes a sequence's cache grows by per token of context (full-attention layers)."""
    return sum(2 * lc.n_kv_heads * lc.head_dim * _elsize(dtype) for lc in layers
               if lc.kind == "attention" and lc.window == 0)


def fixed_bytes(layers: list[LayerCache], n_ctx: int, max_batch: int, dtype: torch.dtype) -> int:
    """Bytes per sequence that do not grow with the context: sliding windows, linear states."""
    n = 0
    for lc in layers:
        if lc.kind == "attention" and lc.window:
            n += 2 * lc.n_kv_heads * lc.head_dim * min(n_ctx, lc.window + max_batch) * _elsize(dtype)
        elif lc.kind == "linear":
            n += 4 * (lc.conv_dim * (lc.conv_kernel - 1) + lc.n_heads * lc.key_dim * lc.value_dim)
    return n


class KVCache:
    def __init__(self, layers: list[LayerCache], n_seq: int, n_ctx: int, max_batch: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        if n_seq < 1 or n_ctx < 1 or max_batch < 1:
            raise ValueError(f"KV cache: n_seq, n_ctx and max_batch must be >= 1, got {n_seq}, {n_ctx}, {max_batch}")
        self.layers = list(layers)
        self.n_seq, self.n_ctx, self.max_batch = n_seq, n_ctx, max_batch
        self.dtype, self.device = dtype, torch.device(device)
        self.k: list[torch.Tensor | None] = []
        self.v: list[torch.Tensor | None] = []
        self.n_cells: list[int] = []
        self.conv: list[torch.Tensor | None] = []
        self.state: list[torch.Tensor | None] = []
        for lc in self.layers:
            k = v = conv = state = None
            cells = 0
            if lc.kind == "attention":
                cells = n_ctx if not lc.window else min(n_ctx, lc.window + max_batch)
                # empty, not zeros: untouched pages cost no memory until a sequence reaches them
                k = torch.empty(n_seq, lc.n_kv_heads, cells, lc.head_dim, dtype=dtype, device=self.device)
                v = torch.empty_like(k)
            elif lc.kind == "linear":
                # zeroed per slot when a sequence starts (`begin`)
                conv = torch.empty(n_seq, lc.conv_kernel - 1, lc.conv_dim, dtype=torch.float32, device=self.device)
                state = torch.empty(n_seq, lc.n_heads, lc.key_dim, lc.value_dim, dtype=torch.float32,
                                    device=self.device)
            else:
                raise ValueError(f"KV cache: unknown layer kind {lc.kind!r}")
            self.k.append(k)
            self.v.append(v)
            self.n_cells.append(cells)
            self.conv.append(conv)
            self.state.append(state)
        self.lengths = [0] * n_seq
        self._free = list(range(n_seq - 1, -1, -1))
        self.has_linear = any(lc.kind == "linear" for lc in self.layers)
        self.min_ring = min((c for c, lc in zip(self.n_cells, self.layers) if lc.kind == "attention" and lc.window),
                            default=0)

    # ------------------------------------------------------------ size

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for ts in (self.k, self.v, self.conv, self.state) for t in ts
                   if t is not None)

    def describe(self) -> str:
        per_token = bytes_per_token(self.layers, self.dtype)
        fixed = fixed_bytes(self.layers, self.n_ctx, self.max_batch, self.dtype)
        return (f"KV cache: {self.n_seq} sequence(s) x {self.n_ctx} tokens, {per_token / 1024:.1f} KiB per token"
                f" + {fixed / 2**20:.1f} MiB fixed per sequence, {self.nbytes / 2**20:.0f} MiB in all")

    # ----------------------------------------------------------- slots

    def allocate(self) -> int:
        """A free slot, emptied."""
        if not self._free:
            raise CacheError(f"KV cache: all {self.n_seq} sequence slots are in use")
        slot = self._free.pop()
        self.lengths[slot] = 0
        return slot

    def free(self, slot: int) -> None:
        self._check_slot(slot)
        if slot in self._free:
            raise CacheError(f"KV cache: slot {slot} is not allocated")
        self.lengths[slot] = 0
        self._free.append(slot)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Make `dst` hold `src`'s state after its first `n` tokens: exact only where `src`
        could go on from `n` itself (`can_restart_at`), else CacheError. Sliding rings
        and recurrent states are copied whole (what lies beyond `n` in a ring is never
        read: positions past a sequence's end are masked, and its next batch overwrites them)."""
        self._check_slot(src)
        self._check_slot(dst)
        if not self.can_restart_at(src, n):
            raise CacheError(f"KV cache: slot {src} holds {self.lengths[src]} tokens; its state after {n} cannot "
                             f"be copied exactly")
        if n:
            for i, lc in enumerate(self.layers):
                if lc.kind == "attention":
                    used = n if not lc.window else min(self.lengths[src], self.n_cells[i])
                    self.k[i][dst, :, :used].copy_(self.k[i][src, :, :used])
                    self.v[i][dst, :, :used].copy_(self.v[i][src, :, :used])
                else:
                    self.conv[i][dst].copy_(self.conv[i][src])
                    self.state[i][dst].copy_(self.state[i][src])
        self.lengths[dst] = n

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.n_seq:
            raise CacheError(f"KV cache: slot {slot} out of range 0..{self.n_seq - 1}")

    # ---------------------------------------------------------- batches

    def can_restart_at(self, slot: int, pos: int) -> bool:
        """Whether a sequence can go on from `pos` (dropping what it holds beyond) with
        exactly the state it had there: always at 0 and at its end; earlier only where
        no layer has lost what `pos` needs (sliding rings, recurrent states)."""
        n = self.lengths[slot]
        if pos == 0 or pos == n:
            return True
        if pos > n or self.has_linear:
            return False
        for cells, lc in zip(self.n_cells, self.layers):
            if lc.kind == "attention" and lc.window and cells < n:
                if max(0, pos - lc.window + 1) < n - cells:  # positions the ring has overwritten
                    return False
        return True

    def begin(self, batch: Batch) -> None:
        """Check a batch against the slots and take its positions: each sequence goes
        on from a position where its state is exact; a sequence at position 0 starts
        empty. Raises CacheError without changing anything when a batch does not fit."""
        if batch.n_tokens > self.max_batch:
            raise CacheError(f"KV cache: a batch of {batch.n_tokens} tokens exceeds max_batch {self.max_batch}")
        for s in batch.seqs:
            self._check_slot(s.slot)
            if s.slot in self._free:
                raise CacheError(f"KV cache: slot {s.slot} is not allocated")
            if s.end > self.n_ctx:
                raise CacheError(f"KV cache: slot {s.slot} would reach {s.end} tokens; the context is {self.n_ctx}")
            if not self.can_restart_at(s.slot, s.pos):
                raise CacheError(f"KV cache: slot {s.slot} holds {self.lengths[s.slot]} tokens and cannot go on "
                                 f"from position {s.pos}")
        for s in batch.seqs:
            if s.pos == 0:
                for conv, state in zip(self.conv, self.state):
                    if conv is not None:
                        conv[s.slot].zero_()
                        state[s.slot].zero_()
            self.lengths[s.slot] = s.end

    def cells(self, layer: int, batch: Batch) -> torch.Tensor:
        """Per token of the batch, the cell its keys and values go to in `layer`."""
        n = self.n_cells[layer]
        key = ("cells", n)
        if key not in batch.memo:
            batch.memo[key] = batch.positions if n >= self.n_ctx else batch.positions % n
        return batch.memo[key]

    def kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer], self.v[layer]

    def linear_state(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.conv[layer], self.state[layer]
