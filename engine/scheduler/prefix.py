"""The prefix cache: what each KV cache slot holds, which slot a new prompt starts in,
and which finished slots are kept for reuse. It owns the slots' token ids (`held`), the
finished slots kept (`idle`, least recently used first) and the prompts' state
checkpoints; it does not decide what a step feeds (engine.scheduler.loop).

A finished sequence's slot keeps what it holds (its token ids are remembered) until the
slot is needed again, least recently used first. A new prompt that starts with tokens
some slot holds goes on from there instead of prefilling them: in that slot when the
prompt covers at least half of what the slot holds (or no slot is free), else copied
into a free slot (from a finished or a running sequence). Reuse is exact or not at all
(`KVCache.can_restart_at`): full-attention layers at any prefix; sliding-window layers
(Gemma 3) while the window of the reuse point is still in the ring; recurrent layers
(Qwen3.5's Gated DeltaNet) at the end of what the slot holds, where their state is the
state of that prefix (a multi-turn chat whose next prompt extends the last one), and
elsewhere at a state checkpoint. Where the cache has such layers, a prompt's prefill
keeps checkpoints (`KVCache.save`) every CHECKPOINT_EVERY tokens and
CHECKPOINT_BEFORE_END tokens before its end: a chat's next turn, whose template drops
the last reply's thinking, leaves the history there.

What else follows a slot (the MTP head's cache, the draft model's slot: engine.
scheduler.speculation) hears of it through `follower`.

With a disk tier (`disk`, engine.scheduler.disk), a kept slot evicted for another, and
every kept slot when the scheduler closes (its model unloads, the server stops), is
written out; a prompt that a file covers further than any slot starts from the file."""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Iterable, Protocol

from ..batch import media_of
from ..errors import CacheError
from .disk import DiskCache, DiskCacheError

log = logging.getLogger("gguf_serve.engine")

CHECKPOINT_BEFORE_END = 4  # a checkpoint this many tokens before a prompt's end (the assistant turn's header)...
CHECKPOINT_EVERY = 512  # ...and at chunk ends at least this many tokens past the slot's last one


class SlotFollower(Protocol):
    """What keeps state per slot beside the KV cache."""

    def copied(self, src: int, dst: int, n: int) -> None:
        """`dst` now holds `src`'s first n tokens (dst may be src, cut back)."""

    def fresh(self, slot: int) -> None:
        """`slot` was just allocated: it holds nothing."""

    def released(self, slot: int) -> None:
        """`slot` went back to the cache."""


class PrefixCache:
    def __init__(self, cache, enabled: bool = True, follower: SlotFollower | None = None,
                 disk: DiskCache | None = None):
        self.cache, self.enabled, self.follower = cache, enabled, follower
        self.disk = disk if enabled else None
        self.checkpoints = enabled and cache.checkpoint_budget > 0  # state checkpoints while prefilling
        self.held: dict[int, list[int]] = {}  # slot → the token ids whose state it holds
        self.keys: dict[int, tuple] = {}  # slot → the LoRA adapters (and scales) that state was computed with
        self.idle: OrderedDict[int, None] = OrderedDict()  # finished slots kept for reuse, least recent first

    @property
    def available(self) -> int:
        """Slots a new sequence can take: free ones and finished ones kept for reuse."""
        return self.cache.free_slots + len(self.idle)

    def usable(self, slot: int, prompt: list[int], key: tuple = ()) -> int:
        """How much of `prompt` the slot's state can stand for, exactly (one prompt
        token is always left to feed: its logits start the completion); nothing where it
        was computed under other adapters than `key`'s."""
        held = self.held.get(slot)
        if not held or self.keys.get(slot, ()) != key:
            return 0
        n = shared_prefix(held, prompt)
        if n and prompt[n] < 0:  # never into an image: from its first token
            n -= media_of(prompt[n])[1]
        return self.cache.restart_point(slot, n) if n else 0

    def prefill_slot(self, prompt: list[int], running: Iterable[int | None], key: tuple = ()) -> tuple[int, int]:
        """A slot for a new prompt and how many of its tokens it already holds (reused from
        a kept slot, or copied from a kept one or one of the `running` sequences', computed
        under the same adapters: `key`)."""
        slot, n = self._prefill_slot(prompt, running, key)
        self.keys[slot] = key
        return slot, n

    def _prefill_slot(self, prompt: list[int], running: Iterable[int | None], key: tuple) -> tuple[int, int]:
        best, best_n = None, 0
        if self.enabled:
            for slot in list(self.idle) + list(running):
                n = self.usable(slot, prompt, key)
                if n > best_n:
                    best, best_n = slot, n
            loaded = self._from_disk(prompt, key, best, best_n)
            if loaded is not None:
                return loaded
        if best is not None and best in self.idle and (2 * best_n >= len(self.held[best])
                                                        or not self.cache.free_slots):
            del self.idle[best]
            self.cache.rewind(best, best_n)  # now: a checkpoint it needs is not evicted before its first step
            self.held[best] = self.held[best][:best_n]
            self._copied(best, best, best_n)
            return best, best_n
        slot = self.take_slot(keep=best)
        if best is not None:
            self.copy(best, slot, best_n)
            self._copied(best, slot, best_n)
            return slot, best_n
        return slot, 0

    def _from_disk(self, prompt: list[int], key: tuple, best: int | None, best_n: int) -> tuple[int, int] | None:
        """A slot holding the disk tier's state for the most of `prompt`, where a file covers
        more than the `best_n` tokens of slot `best` (which stays as it is); else None."""
        if self.disk is None or not (self.cache.free_slots or any(s != best for s in self.idle)):
            return None
        adapters = self.disk.adapters(key)
        entry, n = self.disk.find(prompt, adapters) if adapters is not None else (None, 0)
        if entry is None or n <= best_n:
            return None
        slot = self.take_slot(keep=best)
        try:
            self.cache.load_point(slot, n, *self.disk.read(entry, n))
        except (DiskCacheError, CacheError) as e:  # a damaged file (dropped): the prompt is prefilled
            log.warning("%s", e)
            self.release(slot)
            return None
        self.held[slot] = entry.tokens[:n].tolist()
        return slot, n

    def _offer(self, slot: int, wait: bool = False) -> None:
        """A kept slot about to be given back: its state to the disk tier, where it wants it
        (`wait`: after the writes under way where they hold too much memory)."""
        held = self.held.get(slot)
        if self.disk is None or not held or len(held) != self.cache.lengths[slot]:
            return
        adapters = self.disk.adapters(self.keys.get(slot, ()))
        if (adapters is not None and self.disk.wants(held, adapters)
                and self.disk.room(self.cache.export_bytes(slot), wait)):
            self.disk.put(held, adapters, *self.cache.export_points(slot))

    def take_slot(self, keep: int | None = None) -> int:
        """A free slot, else the least recently used finished one (never `keep`), written to
        the disk tier first."""
        if not self.cache.free_slots:
            victim = next(s for s in self.idle if s != keep)
            del self.idle[victim]
            self._offer(victim)
            self.release(victim)
        slot = self.cache.allocate()
        self.held[slot] = []
        self.keys[slot] = ()
        if self.follower is not None:
            self.follower.fresh(slot)
        return slot

    def copy(self, src: int, dst: int, n: int) -> None:
        """`dst` (just taken) gets `src`'s first n tokens."""
        self.cache.copy_prefix(src, dst, n)
        self.held[dst] = self.held[src][:n]
        self.keys[dst] = self.keys.get(src, ())

    def record(self, slot: int, tokens: list[int], pos: int) -> None:
        """A forward wrote `tokens` into the slot from `pos` on."""
        held = self.held[slot]
        del held[pos:]
        held.extend(tokens)

    def cut(self, slot: int, n: int) -> None:
        """The slot's state stands for its first n tokens only."""
        del self.held[slot][n:]

    def chunk(self, fed: int, n: int, prompt_len: int) -> int:
        """The next n prompt tokens from `fed`, or fewer: the last few go in a step of their
        own, after a checkpoint."""
        mark = prompt_len - CHECKPOINT_BEFORE_END
        return mark - fed if self.checkpoints and fed < mark < fed + n else n

    def checkpoint(self, slot: int, fed: int, prompt_len: int) -> None:
        """After a prompt chunk: keep the slot's state where a later prompt may leave this one."""
        if not self.checkpoints:
            return
        last = max(self.cache.checkpoints(slot), default=0)
        if fed == prompt_len - CHECKPOINT_BEFORE_END or fed - last >= CHECKPOINT_EVERY:
            self.cache.save(slot, fed)

    def retire(self, slot: int) -> None:
        """A finished sequence's slot: kept for reuse, or freed."""
        if self.enabled and self.held.get(slot):
            self.idle[slot] = None
        else:
            self.release(slot)

    def release(self, slot: int) -> None:
        if self.follower is not None:
            self.follower.released(slot)
        self.held.pop(slot, None)
        self.keys.pop(slot, None)
        self.cache.free(slot)

    def clear(self) -> None:
        """Give every kept slot back to the cache (written to the disk tier first, and the
        writes waited for)."""
        for slot in list(self.idle):
            self._offer(slot, wait=True)
            self.release(slot)
        self.idle.clear()
        if self.disk is not None:
            self.disk.flush()

    def _copied(self, src: int, dst: int, n: int) -> None:
        if self.follower is not None:
            self.follower.copied(src, dst, n)


def shared_prefix(held: list[int], seq: list[int]) -> int:
    """How many leading tokens `held` shares with `seq`, leaving seq's last one to feed (its
    logits are what comes next)."""
    n, limit = 0, min(len(held), len(seq) - 1)
    while n < limit and held[n] == seq[n]:
        n += 1
    return n
