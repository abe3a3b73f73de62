"""The batch the model forward takes: a flattened list of tokens from one or more
sequences, each token with its sequence slot (its row in the KV cache) and its
position, and the rows whose logits are wanted (llama.cpp's `llama_batch`, vLLM's
flattened tokens). The batch is data: it knows nothing of requests or sampling.

A sequence's tokens are contiguous in the batch and at consecutive positions; a slot
appears at most once per batch.

Image tokens are negative ids (`media_token`: an image's content key and the token's
index in it; the batch's id space, so defined here): `Batch.of` takes the images' embeddings by key and gives the
model `media` (the rows and the embeddings that stand for their tokens) and
`media_spans` (per sequence, each image's positions [lo, hi) in this batch: an image is
never split between batches)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import AbstractSet, Literal, Mapping, Sequence

import torch

Want = Literal["last", "all", "none"] | int  # an int m: the last m tokens' logits

MEDIA_SHIFT = 20  # a media token: (content key << MEDIA_SHIFT | index within the image), negated
KEY_BITS = 40  # an image's content key: with the index, a media token fits an int64 id


def media_token(key: int, index: int) -> int:
    return -((key << MEDIA_SHIFT) | index) - 1


def media_of(token: int) -> tuple[int, int]:
    """(content key, index within the image) of a media token (< 0)."""
    v = -token - 1
    return v >> MEDIA_SHIFT, v & ((1 << MEDIA_SHIFT) - 1)


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
    media: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)  # (rows, embeddings)
    media_spans: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # slot -> image positions [lo, hi)
    mrope: torch.Tensor | None = None  # (T, 3) multi-section rotary positions (time, row, column), with images
    both_ways: bool = False  # each sequence's tokens see each other both ways (an encoder: EmbeddingGemma)
    lora: dict[int, tuple[tuple[int, float], ...]] = field(default_factory=dict)  # slot -> ((adapter id, scale), ...)
    # its sequences are placeholders (a captured decode step, engine.graphs): layers read the
    # slots and positions from the tensors alone
    static: bool = False

    @property
    def n_tokens(self) -> int:
        return self.tokens.shape[0]

    def ends(self) -> torch.Tensor:
        """Per token, its sequence's length once the batch is in the cache ((T,) int64 on the
        batch's device), once per forward (a captured step's come from its positions: engine.graphs)."""
        if "ends" not in self.memo:
            self.memo["ends"] = torch.tensor([s.end for s in self.seqs for _ in range(s.n)], dtype=torch.long,
                                             device=self.positions.device)
        return self.memo["ends"]

    def by_slot_tensor(self, x: torch.Tensor) -> bool:
        """Whether a recurrent layer's step on x updates every slot's state at once through the
        slot tensor: a token a sequence (a decode step) on a GPU, or in a captured step (it
        replays for any slots). On a CPU the per-sequence path, in place, costs less than the
        gather and scatter."""
        return self.n_tokens == len(self.seqs) and (self.static or x.device.type != "cpu")

    @classmethod
    def of(cls, items: Sequence[tuple[int, Sequence[int], int]], want: Want | Sequence[Want] = "last",
           device: torch.device | str = "cpu", media: Mapping[int, torch.Tensor] | None = None,
           causal_media: AbstractSet[int] = frozenset(),
           rope_positions: Sequence[torch.Tensor | None] | None = None) -> "Batch":
        """A batch of (slot, token ids, position of the first) items; `want` says, for all
        items or per item, whose logits come back: the last token's, every token's, none,
        or (an int m) the last m tokens'. `media`: the embeddings (n, hidden) of the
        media whose tokens (negative ids) the items hold, by content key: each whole in
        the batch, its span recorded for attention both ways, except those in
        `causal_media` (read causally, in pieces if the prompt is chunked). `rope_positions`: per item, its
        tokens' (n, 3) multi-section rotary positions (None: the plain positions)."""
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
        batch = cls(as_long(tokens), as_long(slots), as_long(positions), tuple(seqs), as_long(rows))
        if any(t < 0 for t in tokens):
            batch._place_media(tokens, media or {}, causal_media)
        if rope_positions is not None and any(r is not None for r in rope_positions):
            parts = [r if r is not None else torch.arange(pos, pos + len(ids))[:, None].expand(-1, 3)
                     for r, (_, ids, pos) in zip(rope_positions, items)]
            batch.mrope = torch.cat(parts).to(device=device, dtype=torch.long)
        return batch

    def _place_media(self, tokens: list[int], media: Mapping[int, torch.Tensor], causal: AbstractSet[int]) -> None:
        rows, parts = [], []
        for s in self.seqs:
            run = None  # (key, first row) of the image being read
            for r in range(s.start, s.start + s.n + 1):
                t = tokens[r] if r < s.start + s.n else 0
                key, index = media_of(t) if t < 0 else (None, 0)
                if run is not None and (key != run[0] or index == 0):  # the run ends (at the image's end if whole)
                    n = r - run[1]
                    emb = media[run[0]]
                    first, last = media_of(tokens[run[1]])[1], media_of(tokens[r - 1])[1]
                    if run[0] not in causal:
                        if last != emb.shape[0] - 1 or first != 0:
                            raise ValueError(f"batch: slot {s.slot} holds part of an image ({n} of its "
                                             f"{emb.shape[0]} tokens); an image goes in one batch")
                        self.media_spans.setdefault(s.slot, []).append((s.pos + run[1] - s.start,
                                                                        s.pos + r - s.start))
                    rows.extend(range(run[1], r))
                    parts.append(emb[first:last + 1])
                    run = None
                if key is not None and run is None:
                    if key not in media:
                        raise ValueError(f"batch: slot {s.slot} holds an image whose embeddings were not given")
                    run = (key, r)
        device = self.tokens.device
        self.media = (torch.tensor(rows, dtype=torch.long, device=device), torch.cat(parts).to(device))

    def split(self, max_tokens: int) -> list["Batch"]:
        """Consecutive sub-batches of at most `max_tokens` tokens (a long prompt is then
        processed in chunks, in order); logits rows are renumbered within each."""
        if self.n_tokens <= max_tokens:
            return [self]
        if self.media is not None:
            raise ValueError(f"batch: {self.n_tokens} tokens with images do not fit {max_tokens} per forward "
                             "(an image goes in one forward)")
        if self.both_ways:
            raise ValueError(f"batch: {self.n_tokens} tokens attending both ways do not fit {max_tokens} per forward "
                             "(such a batch goes in one forward)")
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
                             keep_hidden=self.keep_hidden, mrope=None if self.mrope is None else self.mrope[lo:hi],
                             lora=self.lora))
        return out
