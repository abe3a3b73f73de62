"""The batch the model forward takes: a flattened list of tokens from one or more
sequences, each token with its sequence slot (its row in the KV cache) and its
position, and the rows whose logits are wanted (llama.cpp's `llama_batch`, vLLM's
flattened tokens). The batch is data: it knows nothing of requests or sampling.

A sequence's tokens are contiguous in the batch and at consecutive positions; a slot
appears at most once per batch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Sequence

import torch

Want = Literal["last", "all", "none"] | int  # an int m: the last m tokens' logits


@dataclass(frozen=True)
class Seq:
    """One sequence's part of a batch: rows [start, start + n) at positions [pos, pos + n)."""

    slot: int
    start: int
    n: int
    pos: int

    @property
    def end(self) -> int:
        """The sequence's length once this batch is in the cache."""
        return self.pos + self.n


@dataclass
class Batch:
    tokens: torch.Tensor  # (T,) int64
    slots: torch.Tensor  # (T,) int64
    positions: torch.Tensor  # (T,) int64
    seqs: tuple[Seq, ...]
    rows: torch.Tensor  # (R,) int64, ascending: the rows whose logits are returned
    memo: dict = field(default_factory=dict, repr=False)  # per-forward tables (rotary, masks)
    keep_hidden: bool = False  # the forward keeps every token's final normed output in `hidden`
    hidden: torch.Tensor | None = field(default=None, repr=False)

    @property
    def n_tokens(self) -> int:
        return self.tokens.shape[0]

    @classmethod
    def of(cls, items: Sequence[tuple[int, Sequence[int], int]], want: Want | Sequence[Want] = "last",
           device: torch.device | str = "cpu") -> "Batch":
        """A batch of (slot, token ids, position of the first) items; `want` says, for all
        items or per item, whose logits come back: the last token's, every token's, none,
        or (an int m) the last m tokens'."""
        wants = [want] * len(items) if isinstance(want, (str, int)) else list(want)
        if len(wants) != len(items):
            raise ValueError(f"batch: {len(items)} items but {len(wants)} logits requests")
        tokens, slots, positions, rows, seqs = [], [], [], [], []
        seen: set[int] = set()
        for (slot, ids, pos), w in zip(items, wants):
            slot, pos, ids = int(slot), int(pos), [int(t) for t in ids]
            if not ids:
                raise ValueError(f"batch: slot {slot} has no tokens")
            if slot in seen:
                raise ValueError(f"batch: slot {slot} appears twice")
            if pos < 0:
                raise ValueError(f"batch: slot {slot} starts at position {pos}")
            seen.add(slot)
            start = len(tokens)
            seqs.append(Seq(slot, start, len(ids), pos))
            tokens += ids
            slots += [slot] * len(ids)
            positions += range(pos, pos + len(ids))
            if isinstance(w, int) and not isinstance(w, bool):
                if not 0 <= w <= len(ids):
                    raise ValueError(f"batch: slot {slot} has {len(ids)} tokens; cannot return the last {w}")
                rows += range(start + len(ids) - w, start + len(ids))
            elif w == "last":
                rows.append(start + len(ids) - 1)
            elif w == "all":
                rows += range(start, start + len(ids))
            elif w != "none":
                raise ValueError(f"batch: want must be 'last', 'all' or 'none', got {w!r}")
        as_long = lambda v: torch.tensor(v, dtype=torch.long, device=device)  # noqa: E731
        return cls(as_long(tokens), as_long(slots), as_long(positions), tuple(seqs), as_long(rows))

    def split(self, max_tokens: int) -> list["Batch"]:
        """Consecutive sub-batches of at most `max_tokens` tokens (a long prompt is then
        processed in chunks, in order); logits rows are renumbered within each."""
        if self.n_tokens <= max_tokens:
            return [self]
        out = []
        rows = self.rows.tolist()
        for lo in range(0, self.n_tokens, max_tokens):
            hi = min(lo + max_tokens, self.n_tokens)
            seqs = []
            for s in self.seqs:
                a, b = max(s.start, lo), min(s.start + s.n, hi)
                if a < b:
                    seqs.append(Seq(s.slot, a - lo, b - a, s.pos + (a - s.start)))
            sub_rows = [r - lo for r in rows if lo <= r < hi]
            out.append(Batch(self.tokens[lo:hi], self.slots[lo:hi], self.positions[lo:hi], tuple(seqs),
                             torch.tensor(sub_rows, dtype=torch.long, device=self.tokens.device),
                             keep_hidden=self.keep_hidden))
        return out
