"""A scheduler's sequence slots seen from outside, as llama-server's /slots shows and keeps
them: what each holds (`table`), and a slot's state kept in a file and taken back, by
the same server or one started later (`export` then `write_state`; `read_state` then
`restore`), or dropped (`erase`).

A slot's state is its token ids and the KV cache's tensors for them (every position of
the full-attention layers, the last window of sliding ones, the recurrent states), in
the disk tier's file format (engine.scheduler.disk: atomic writes, each tensor checked). A
restored slot is a finished sequence the prefix cache keeps: the next prompt that starts
with its tokens goes on from there instead of prefilling them. A running sequence's
slot is busy (SlotError); everything here runs on the scheduler's thread, between steps,
except the file's reading and writing."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import CacheError
from . import disk

KIND = "slot"  # what the header says a slot file is (the disk tier's say nothing)


class SlotError(ValueError):
    """A slot action that cannot be done: no such slot, a busy one, a file of another model."""


@dataclass
class SlotState:
    """What a slot held: its tokens and the cache's tensors for them (KVCache.export_points
    at its end: `full` by layer, the lossy layers' state by layer)."""

    tokens: list[int]
    full: dict
    lossy: dict


identity = disk.cache_identity  # what a slot file must match to be taken back


def _check(sched, slot: int, busy_ok: bool = False) -> None:
    if not 0 <= slot < sched.cache.n_seq:
        raise SlotError(f"Invalid slot ID {slot}: this model has slots 0..{sched.cache.n_seq - 1}")
    if not busy_ok and slot in running_slots(sched):
        raise SlotError(f"slot {slot} is generating; try again once its request has finished")


def running_slots(sched) -> dict[int, tuple]:
    """slot → (request, choice) of every sequence running."""
    return {c.slot: (r, c) for r in sched.running for c in r.choices if c.slot is not None}


def table(sched) -> list[dict]:
    """Each slot as llama-server's GET /slots lists it."""
    lm, running = sched.lm, running_slots(sched)
    out = []
    for slot in range(sched.cache.n_seq):
        held = sched.prefix.held.get(slot) or []
        row = {"id": slot, "n_ctx": sched.cache.n_ctx, "speculative": sched.spec.mode != "off",
               "is_processing": slot in running, "n_prompt_tokens": len(held)}
        if slot in running:
            r, c = running[slot]
            p = c.params
            row.update(n_prompt_tokens=len(r.req.prompt_ids), n_prompt_tokens_cache=c.cached,
                       params={"n_predict": p.max_tokens if p.max_tokens is not None else -1,
                               "temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p,
                               "seed": p.seed if p.seed is not None else -1, "stop": p.stop},
                       next_token=[{"has_next_token": not c.finished, "n_remain": c.budget - len(c.generated),
                                    "n_decoded": len(c.generated)}])
        if held:
            row["prompt"] = lm.tokenizer.decode([t for t in held if t >= 0], skip_special_tokens=False)
        out.append(row)
    return out


def export(sched, slot: int) -> SlotState:
    """A copy of what `slot` holds (nothing for a free slot)."""
    _check(sched, slot)
    held = sched.prefix.held.get(slot)
    if not held:
        return SlotState([], {}, {})
    full, points = sched.cache.export_points(slot, last=0)
    return SlotState(list(held), full, points[len(held)])


def restore(sched, slot: int, state: SlotState) -> None:
    """Make `slot` hold `state` (what it held before is dropped), kept for reuse."""
    _check(sched, slot)
    if len(state.tokens) >= sched.cache.n_ctx:
        raise SlotError(f"the saved state holds {len(state.tokens)} tokens; this model's context is "
                        f"{sched.cache.n_ctx}")
    if any(t >= sched.lm.model.vocab_size for t in state.tokens):
        raise SlotError("Invalid tokens in slot save file")
    erase(sched, slot)
    if not state.tokens:
        return
    p = sched.prefix
    sched.cache.allocate(slot)
    if p.follower is not None:
        p.follower.fresh(slot)
    try:
        sched.cache.load_point(slot, len(state.tokens), state.full, state.lossy)
    except CacheError as e:
        sched.cache.free(slot)
        raise SlotError(f"the saved state does not fit this model's cache: {e}") from None
    p.held[slot] = list(state.tokens)
    p.idle[slot] = None


def erase(sched, slot: int) -> int:
    """Drop what `slot` holds; how many tokens that was."""
    _check(sched, slot)
    p = sched.prefix
    n = len(p.held.get(slot) or [])
    if slot in p.idle:
        del p.idle[slot]
        p.release(slot)
    return n


def write_state(path: str, state: SlotState, ident: dict) -> int:
    """Write a state file (atomically: a file that is there is whole); its size in bytes."""
    n = len(state.tokens)
    disk.write_state(path, {"kind": KIND, "model": ident}, state.tokens, state.full, {n: state.lossy} if n else {},
                     lossy=True)
    return os.path.getsize(path)


def read_state(path: str, ident: dict) -> tuple[SlotState, int]:
    """A state file written by `write_state` for this model and cache layout, and its size."""
    name = os.path.basename(path)
    try:
        header = disk.read_header(path)
    except FileNotFoundError:
        raise SlotError(f"no slot file {name!r}") from None
    except (OSError, ValueError) as e:  # not a file of this format, or its header damaged
        raise SlotError(f"{name!r} is not a slot file: {e}") from None
    if header.get("kind") != KIND:
        raise SlotError(f"{name!r} is not a slot file of this server")
    model = header.get("model") or {}
    for key in ("architecture", "vocab_size", "layout"):
        if model.get(key) != ident[key]:
            raise SlotError(f"{name!r} was saved from another model or cache layout ({key} differs); start the "
                            f"server with the model and cache settings it was saved with")
    tokens = header.get("tokens")
    try:
        full, lossy = disk.read_tensors(path, header, len(tokens))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SlotError(f"{name!r} is damaged: {e}") from None
    return SlotState([int(t) for t in tokens], full, lossy), os.path.getsize(path)
