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
checks each batch against what the slot holds), copied up to a prefix, and freed.

State checkpoints: what a slot cannot give back once it has gone on (recurrent and
conv states, the part of a sliding ring that later positions overwrite) is copied
at chosen positions (`save`, within a byte budget, least recently used dropped
first), so that a sequence can go on from there exactly (`can_restart_at`,
`restart_point`; `begin` and `copy_prefix` restore it). A checkpoint stands for the
slot's tokens before its position: a batch that writes at an earlier position drops it."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from .batch import Batch
from .kv_rows import KVType, kv_types
from .errors import CacheError


@dataclass(frozen=True)
class LayerCache:
    """What one layer keeps: kind "attention" (n_kv_heads, head_dim, window; 0 = full
    attention), "linear" (conv_dim, conv_kernel, n_heads, key_dim, value_dim), "shared":
    nothing of its own, it attends over layer `source`'s cache (Gemma 4's last layers), or
    "none": a layer that keeps nothing (Nemotron-H's feed-forward layers)."""

    kind: str
    n_kv_heads: int = 0
    head_dim: int = 0
    window: int = 0
    conv_dim: int = 0
    conv_kernel: int = 0
    n_heads: int = 0
    key_dim: int = 0
    value_dim: int = 0
    source: int = -1


def shared(source: int) -> LayerCache:
    return LayerCache("shared", source=source)


def nothing() -> LayerCache:
    return LayerCache("none")


def attention(n_kv_heads: int, head_dim: int, window: int = 0) -> LayerCache:
    return LayerCache("attention", n_kv_heads=n_kv_heads, head_dim=head_dim, window=window)


def linear(conv_dim: int, conv_kernel: int, n_heads: int, key_dim: int, value_dim: int) -> LayerCache:
    return LayerCache("linear", conv_dim=conv_dim, conv_kernel=conv_kernel, n_heads=n_heads, key_dim=key_dim,
                      value_dim=value_dim)


def _types(types) -> tuple[KVType, KVType]:
    return kv_types(types) if isinstance(types, torch.dtype) else types


def _row(lc: LayerCache, types) -> int:
    """Bytes of one position's keys and values in an attention layer."""
    k, v = _types(types)
    return lc.n_kv_heads * (k.row_bytes(lc.head_dim) + v.row_bytes(lc.head_dim))


def bytes_per_token(layers: list[LayerCache], types: tuple[KVType, KVType] | torch.dtype) -> int:
    """Bytes a sequence's cache grows by per token of context (full-attention layers);
    `types` the (key, value) KVTypes, or a dtype for both."""
    return sum(_row(lc, types) for lc in layers if lc.kind == "attention" and lc.window == 0)


def fixed_bytes(layers: list[LayerCache], n_ctx: int, max_batch: int,
                types: tuple[KVType, KVType] | torch.dtype) -> int:
    """Bytes per sequence that do not grow with the context: sliding windows, linear states."""
    n = 0
    for lc in layers:
        if lc.kind == "attention" and lc.window:
            n += _row(lc, types) * min(n_ctx, lc.window + max_batch)
        elif lc.kind == "linear":
            n += 4 * (lc.conv_dim * (lc.conv_kernel - 1) + lc.n_heads * lc.key_dim * lc.value_dim)
    return n


def checkpoint_bytes(layers: list[LayerCache], n_ctx: int, max_batch: int,
                     types: tuple[KVType, KVType] | torch.dtype) -> int:
    """Bytes of one state checkpoint: the recurrent and conv states, and what a sliding
    window sees before a position (window - 1 cells) where its ring is shorter than the
    context."""
    n = 0
    for lc in layers:
        if lc.kind == "attention" and lc.window and lc.window + max_batch < n_ctx:
            n += _row(lc, types) * (lc.window - 1)
        elif lc.kind == "linear":
            n += 4 * (lc.conv_dim * (lc.conv_kernel - 1) + lc.n_heads * lc.key_dim * lc.value_dim)
    return n


@dataclass(eq=False)
class Checkpoint:
    """A slot's state after its first `pos` tokens, per layer: (conv, state) for linear
    layers, (keys, values) of positions [pos - window + 1, pos) for sliding ones, None
    for full attention (its cells keep every position)."""

    slot: int
    pos: int
    layers: list = field(repr=False)
    nbytes: int = 0


@dataclass
class CheckpointStats:
    held: int = 0
    bytes: int = 0
    saved: int = 0
    hits: int = 0  # restores: a sequence went on from a checkpoint
    evicted: int = 0


class KVCache:
    def __init__(self, layers: list[LayerCache], n_seq: int, n_ctx: int, max_batch: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 checkpoint_budget: int = 0, types: tuple[KVType, KVType] | None = None):
        if n_seq < 1 or n_ctx < 1 or max_batch < 1:
            raise ValueError(f"KV cache: n_seq, n_ctx and max_batch must be >= 1, got {n_seq}, {n_ctx}, {max_batch}")
        self.layers = list(layers)
        self.n_seq, self.n_ctx, self.max_batch = n_seq, n_ctx, max_batch
        self.dtype, self.device = dtype, torch.device(device)
        self.types = types or kv_types(dtype)  # the (key, value) rows' KVTypes
        kt, vt = self.types
        for t in self.types:
            for lc in self.layers:
                if lc.kind == "attention" and lc.head_dim % t.block:
                    raise ValueError(f"KV cache type {t.name}: head size {lc.head_dim} is not a multiple of {t.block}")
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
                # full attention: empty, not zeros (untouched pages cost no memory until a sequence
                # reaches them; its cells are written in order before they are read). Rings: zeros,
                # since a slot restored from a checkpoint holds only its window, and torch's attention
                # reads the ring's other cells masked: a NaN there (uninitialized half or quantized
                # bits often are one) would survive the mask
                alloc = torch.zeros if lc.window else torch.empty
                k = alloc(n_seq, lc.n_kv_heads, cells, kt.row_elements(lc.head_dim), dtype=kt.dtype, device=self.device)
                v = alloc(n_seq, lc.n_kv_heads, cells, vt.row_elements(lc.head_dim), dtype=vt.dtype, device=self.device)
            elif lc.kind == "none":
                pass
            elif lc.kind == "shared":
                if not 0 <= lc.source < len(self.layers) or self.layers[lc.source].kind != "attention":
                    raise ValueError(f"KV cache: a shared layer's source {lc.source} is not an attention layer")
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
        # sliding rings shorter than the context lose positions as a sequence goes on: `lost[slot]`,
        # the first position every such ring still holds (positions before it are overwritten)
        rings = [(cells, lc.window) for cells, lc in zip(self.n_cells, self.layers)
                 if lc.kind == "attention" and lc.window and cells < n_ctx]
        self.min_ring = min((c for c, _ in rings), default=0)
        self.windows = (min(w for _, w in rings), max(w for _, w in rings)) if rings else (0, 0)
        self.lost = [0] * n_seq
        self.checkpoint_size = checkpoint_bytes(self.layers, n_ctx, max_batch, self.types)
        self.checkpoint_budget = checkpoint_budget if self.checkpoint_size else 0
        self._checkpoints: OrderedDict[tuple[int, int], Checkpoint] = OrderedDict()  # (slot, pos), least recent first
        self.checkpoint_stats = CheckpointStats()

    # ------------------------------------------------------------ size

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for ts in (self.k, self.v, self.conv, self.state) for t in ts
                   if t is not None)

    def describe(self) -> str:
        per_token = bytes_per_token(self.layers, self.types)
        fixed = fixed_bytes(self.layers, self.n_ctx, self.max_batch, self.types)
        kt, vt = self.types
        line = (f"KV cache: {self.n_seq} sequence(s) x {self.n_ctx} tokens, {per_token / 1024:.1f} KiB per token"
                f" (k {kt.name}, v {vt.name})"
                f" + {fixed / 2**20:.1f} MiB fixed per sequence, {self.nbytes / 2**20:.0f} MiB in all")
        if self.checkpoint_size:
            line += (f"; state checkpoints {self.checkpoint_size / 2**20:.1f} MiB each, up to "
                     f"{self.checkpoint_budget // self.checkpoint_size} ({self.checkpoint_budget / 2**20:.0f} MiB)")
        return line

    # ----------------------------------------------------------- slots

    def allocate(self, slot: int | None = None) -> int:
        """A free slot (`slot` itself where given), emptied."""
        if not self._free:
            raise CacheError(f"KV cache: all {self.n_seq} sequence slots are in use")
        if slot is None:
            slot = self._free.pop()
        elif slot in self._free:
            self._free.remove(slot)
        else:
            raise CacheError(f"KV cache: slot {slot} is not free")
        self.lengths[slot] = self.lost[slot] = 0
        self._drop_checkpoints(slot, after=-1)
        return slot

    def free(self, slot: int) -> None:
        self._check_slot(slot)
        if slot in self._free:
            raise CacheError(f"KV cache: slot {slot} is not allocated")
        self.lengths[slot] = self.lost[slot] = 0
        self._drop_checkpoints(slot, after=-1)
        self._free.append(slot)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Make `dst` hold `src`'s state after its first `n` tokens: exact only where `src`
        could go on from `n` itself (`can_restart_at`), else CacheError. Sliding rings
        and recurrent states are copied whole (what lies beyond `n` in a ring is never
        read: positions past a sequence's end are masked, and its next batch overwrites
        them), or, where `src` has gone on past `n`, taken from its checkpoint at `n`."""
        self._check_slot(src)
        self._check_slot(dst)
        if not self.can_restart_at(src, n):
            raise CacheError(f"KV cache: slot {src} holds {self.lengths[src]} tokens; its state after {n} cannot "
                             f"be copied exactly")
        ckpt = None if self._natural_restart(src, n) else self._checkpoints[(src, n)]
        self._drop_checkpoints(dst, after=-1)
        if n:
            for i, lc in enumerate(self.layers):
                if lc.kind == "attention":
                    if ckpt is not None and ckpt.layers[i] is not None:
                        continue  # the ring's window comes from the checkpoint
                    used = n if not lc.window else min(self.lengths[src], self.n_cells[i])
                    self.k[i][dst, :, :used].copy_(self.k[i][src, :, :used])
                    self.v[i][dst, :, :used].copy_(self.v[i][src, :, :used])
                elif lc.kind == "linear" and ckpt is None:
                    self.conv[i][dst].copy_(self.conv[i][src])
                    self.state[i][dst].copy_(self.state[i][src])
        self.lost[dst] = self.lost[src]
        if ckpt is not None:
            self._restore(ckpt, dst)
        self.lengths[dst] = n

    def rewind(self, slot: int, pos: int) -> None:
        """Make `slot` hold its state after its first `pos` tokens, dropping the rest:
        exact where `can_restart_at`, else CacheError. Its checkpoints beyond `pos` go."""
        self._check_slot(slot)
        if not self.can_restart_at(slot, pos):
            raise CacheError(f"KV cache: slot {slot} holds {self.lengths[slot]} tokens and cannot go back to {pos}")
        if not self._natural_restart(slot, pos):
            self._restore(self._checkpoints[(slot, pos)], slot)
        self._drop_checkpoints(slot, after=pos)
        self.lengths[slot] = pos

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.n_seq:
            raise CacheError(f"KV cache: slot {slot} out of range 0..{self.n_seq - 1}")

    # ---------------------------------------------------------- batches

    def can_restart_at(self, slot: int, pos: int) -> bool:
        """Whether a sequence can go on from `pos` (dropping what it holds beyond) with
        exactly the state it had there: always at 0 and at its end; earlier where no
        layer has lost what `pos` needs (sliding rings, recurrent states) or where a
        checkpoint at `pos` keeps it."""
        if 0 < pos < self.lengths[slot] and (slot, pos) in self._checkpoints:
            return True
        return self._natural_restart(slot, pos)

    def restart_point(self, slot: int, n: int) -> int:
        """The furthest position <= n from which `slot` can go on exactly (0 at worst)."""
        n = min(n, self.lengths[slot])
        if self.can_restart_at(slot, n):
            return n
        return max((p for (s, p) in self._checkpoints if s == slot and p <= n), default=0)

    def can_cut_back(self, slot: int, n: int) -> bool:
        """Whether, after its next `n` tokens, `slot` can go back exactly to any position past
        its current end without a snapshot (speculation's rollback): no recurrent layer, and
        every sliding ring still holding the window before the earliest such position."""
        if self.has_linear:
            return False
        if not self.min_ring:
            return True
        first = self.lengths[slot] + 1
        return max(0, first - self.windows[1] + 1) >= max(self.lost[slot], first - 1 + n - self.min_ring)

    def _natural_restart(self, slot: int, pos: int) -> bool:
        """Exact without a checkpoint: at 0, at the end, and before the end where no
        recurrent layer exists and every sliding ring still holds the window before `pos`."""
        n = self.lengths[slot]
        if pos == 0 or pos == n:
            return True
        if pos > n or self.has_linear:
            return False
        return not self.min_ring or max(0, pos - self.windows[1] + 1) >= self.lost[slot]

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
                self.lost[s.slot] = 0
            elif not self._natural_restart(s.slot, s.pos):
                self._restore(self._checkpoints[(s.slot, s.pos)], s.slot)
            self._drop_checkpoints(s.slot, after=s.pos)  # their tokens are being overwritten
            self.lengths[s.slot] = s.end
            if self.min_ring:
                self.lost[s.slot] = max(self.lost[s.slot], s.end - self.min_ring)

    # ------------------------------------------------------ checkpoints

    def save(self, slot: int, pos: int | None = None) -> bool:
        """Keep a checkpoint of `slot` at its current end (`pos`, when given, must be it);
        False where checkpoints do not pay (no lossy layer) or the budget holds none.
        The least recently used checkpoints make room."""
        self._check_slot(slot)
        end = self.lengths[slot]
        if pos is not None and pos != end:
            raise CacheError(f"KV cache: a checkpoint of slot {slot} is taken at its end ({end}), not at {pos}")
        if not self.checkpoint_size or self.checkpoint_size > self.checkpoint_budget or end == 0:
            return False
        key = (slot, end)
        if key in self._checkpoints:
            self._checkpoints.move_to_end(key)
            return True
        while self.checkpoint_stats.bytes + self.checkpoint_size > self.checkpoint_budget:
            self._evict(next(iter(self._checkpoints)))
            self.checkpoint_stats.evicted += 1
        ckpt = self.snapshot(slot)
        self._checkpoints[key] = ckpt
        self.checkpoint_stats.bytes += ckpt.nbytes
        self.checkpoint_stats.held += 1
        self.checkpoint_stats.saved += 1
        return True

    def snapshot(self, slot: int, reuse: Checkpoint | None = None) -> Checkpoint:
        """A checkpoint of `slot` at its end, outside the budget (the caller keeps it; `reuse`:
        an earlier snapshot of the same cache whose buffers it overwrites)."""
        end = self.lengths[slot]
        layers = []
        for i, lc in enumerate(self.layers):
            old = reuse.layers[i] if reuse is not None else None
            if lc.kind == "linear":
                a, b = self.conv[i][slot], self.state[i][slot]
            elif self._lossy(i):
                cells = self._ring_cells(i, max(0, end - lc.window + 1), end)
                a, b = self.k[i][slot][:, cells], self.v[i][slot][:, cells]
            else:
                layers.append(None)
                continue
            if old is not None and old[0].shape == a.shape:
                old[0].copy_(a)
                old[1].copy_(b)
                layers.append(old)
            else:
                layers.append((a.clone(), b.clone()))
        return Checkpoint(slot, end, layers, self.checkpoint_size)

    def restore(self, slot: int, ckpt: Checkpoint) -> None:
        """Make `slot` hold the state of a snapshot of its own (taken at ckpt.pos, with
        no batch since that wrote before ckpt.pos), dropping what it holds beyond."""
        if ckpt.slot != slot or ckpt.pos > self.lengths[slot]:
            raise CacheError(f"KV cache: slot {slot} (holding {self.lengths[slot]} tokens) cannot take back a "
                             f"snapshot of slot {ckpt.slot} at {ckpt.pos}")
        self._write_back(ckpt, slot)
        self._drop_checkpoints(slot, after=ckpt.pos)
        self.lengths[slot] = ckpt.pos

    def layout(self) -> list[tuple]:
        """What a slot's state is made of, per layer (`export_points`' tensors follow it): its
        kind and sizes, and for attention layers whether a ring shorter than the context."""
        kt, vt = self.types
        return [(lc.kind, lc.n_kv_heads, lc.head_dim, lc.window, cells < self.n_ctx, lc.conv_dim, lc.conv_kernel,
                 lc.n_heads, lc.key_dim, lc.value_dim, kt.name, vt.name) for lc, cells in zip(self.layers, self.n_cells)]

    def load(self, slot: int, n: int, layers: list) -> None:
        """Make the allocated `slot` hold a state of `n` tokens, per layer: (keys, values) of
        every position for full attention, a checkpoint's tensors for rings and recurrent
        layers, None for shared ones (`load_point` builds it from `export_points`' parts);
        CacheError where a tensor's shape is not this cache's."""
        self._check_slot(slot)
        if slot in self._free:
            raise CacheError(f"KV cache: slot {slot} is not allocated")
        if not 0 <= n <= self.n_ctx:
            raise CacheError(f"KV cache: a state of {n} tokens does not fit the context ({self.n_ctx})")
        for i, lc in enumerate(self.layers):
            got = layers[i] if i < len(layers) else None
            if lc.kind in ("shared", "none"):
                continue
            cells = min(n, lc.window - 1) if self._lossy(i) else n
            like = ((self.conv[i][slot], self.state[i][slot]) if lc.kind == "linear" else
                    (self.k[i][slot, :, :cells], self.v[i][slot, :, :cells]))
            if (not isinstance(got, (list, tuple)) or len(got) != 2 or any(
                    not isinstance(t, torch.Tensor) or t.shape != w.shape or t.dtype != w.dtype
                    for t, w in zip(got, like))):
                raise CacheError(f"KV cache: layer {i}'s saved state is not of this cache's shape")
        self._drop_checkpoints(slot, after=-1)
        self.lost[slot] = 0
        for i, lc in enumerate(self.layers):
            if lc.kind == "attention" and not self._lossy(i):
                self.k[i][slot, :, :n].copy_(layers[i][0])
                self.v[i][slot, :, :n].copy_(layers[i][1])
        self._write_back(Checkpoint(slot, n, [tuple(layers[i]) if self._lossy(i) else None
                                              for i in range(len(self.layers))]), slot)
        self.lengths[slot] = n

    def export_points(self, slot: int, last: int = 2) -> tuple[dict[int, tuple], dict[int, dict]]:
        """`slot`'s state for a file that a later sequence may go on from at several
        positions (the disk tier): the keys and values of every position it holds in the
        layers that keep them all, by layer; and what the lossy layers hold (`_lossy`) at
        its end and at its `last` latest checkpoints, by position then layer. Copies (the
        checkpoints' own tensors, which nothing writes to)."""
        self._check_slot(slot)
        n = self.lengths[slot]
        full = {i: (self.k[i][slot, :, :n].clone(), self.v[i][slot, :, :n].clone())
                for i, lc in enumerate(self.layers) if lc.kind == "attention" and not self._lossy(i)}
        points = {p: self._checkpoints[(slot, p)].layers for p in self.checkpoints(slot)[-last:] if last}
        points[n] = self.snapshot(slot).layers
        return full, {p: {i: tuple(t) for i, t in enumerate(layers) if t is not None} for p, layers in points.items()}

    def export_bytes(self, slot: int, last: int = 2) -> int:
        """The bytes of `export_points(slot, last)`."""
        n = self.lengths[slot]
        full = sum(_row(lc, self.types) for i, lc in enumerate(self.layers)
                   if lc.kind == "attention" and not self._lossy(i))
        return n * full + (1 + min(last, len(self.checkpoints(slot)))) * self.checkpoint_size

    def load_point(self, slot: int, pos: int, full: dict[int, tuple], lossy: dict[int, tuple]) -> None:
        """Make the allocated `slot` hold the state after `pos` tokens from `export_points`'
        parts: the first `pos` positions of `full`'s layers, `lossy` the lossy layers'
        state at `pos`; CacheError where a part is missing or not of this cache's shape."""
        layers = []
        for i, lc in enumerate(self.layers):
            part = lossy.get(i) if self._lossy(i) else full.get(i) if lc.kind == "attention" else None
            if part is not None and not self._lossy(i):
                part = tuple(t[:, :pos] for t in part)
            layers.append(part)
        self.load(slot, pos, layers)

    def lossy(self) -> bool:
        """Whether some layer loses what a sequence held as it goes on: a sequence can then go
        on exactly only from its end or a checkpoint, not from any position it holds."""
        return any(self._lossy(i) for i in range(len(self.layers)))

    def checkpoints(self, slot: int) -> list[int]:
        """The positions `slot` has checkpoints at, ascending."""
        return sorted(p for (s, p) in self._checkpoints if s == slot)

    def _lossy(self, layer: int) -> bool:
        """Whether a layer loses what a sequence held as it goes on (a checkpoint keeps it): a
        recurrent one, or a sliding ring shorter than the context."""
        lc = self.layers[layer]
        return lc.kind == "linear" or bool(lc.kind == "attention" and lc.window and self.n_cells[layer] < self.n_ctx)

    def _ring_cells(self, layer: int, lo: int, hi: int) -> torch.Tensor:
        return torch.arange(lo, hi, device=self.device) % self.n_cells[layer]

    def _restore(self, ckpt: Checkpoint, slot: int) -> None:
        self._write_back(ckpt, slot)
        self._checkpoints.move_to_end((ckpt.slot, ckpt.pos))
        self.checkpoint_stats.hits += 1

    def _write_back(self, ckpt: Checkpoint, slot: int) -> None:
        for i, saved in enumerate(ckpt.layers):
            if saved is None:
                continue
            a, b = saved
            if self.layers[i].kind == "linear":
                self.conv[i][slot].copy_(a)
                self.state[i][slot].copy_(b)
            else:
                cells = self._ring_cells(i, ckpt.pos - a.shape[1], ckpt.pos)
                self.k[i][slot][:, cells] = a
                self.v[i][slot][:, cells] = b
        if self.min_ring:  # every ring holds the window before pos again, and what it held past pos is gone:
            # the first position all of them hold is the smallest window's first (not what the slot
            # had lost before, which a long answer after pos had pushed far past it)
            self.lost[slot] = max(0, ckpt.pos - self.windows[0] + 1)

    def _evict(self, key: tuple[int, int]) -> None:
        ckpt = self._checkpoints.pop(key)
        self.checkpoint_stats.bytes -= ckpt.nbytes
        self.checkpoint_stats.held -= 1

    def _drop_checkpoints(self, slot: int, after: int) -> None:
        """Drop `slot`'s checkpoints at positions beyond `after` (-1: all of them)."""
        for key in [k for k in self._checkpoints if k[0] == slot and k[1] > after]:
            self._evict(key)

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
