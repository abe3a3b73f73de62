"""The scheduler's loop: requests in, one batch forward per step over every admitted
request's sequences, Steps out. A step admits what waits, builds the batch (each
sequence's row), runs the forward, samples, emits, lets the drafters draft and retires
what finished. It owns the queue and the running requests; the slots' contents are the
prefix cache's (engine.scheduler.prefix), drafting is engine.scheduler.speculation's,
images engine.scheduler.media's."""

from __future__ import annotations

import logging
import threading
from collections import deque

import torch

from ..batch import Batch
from ..cache import CacheError
from ..sampling import SamplingParams
from ..speculative import SpecSettings
from ..text import Step, end_of_generation_ids
from .disk import DiskCache
from .media import batch_media, media_chunk, rope_plan
from .prefix import PrefixCache
from .speculation import Speculation, check_speculative, default_mode
from .state import Choice, Purpose, Request, Row, Running

PREFILL_CHUNK = 128  # prompt tokens per step while other sequences decode

log = logging.getLogger("gguf_serve.engine")


class Scheduler:
    """One model's continuous batching: `add` queues a request, `step` runs one batch
    forward over every running sequence, `close` gives everything back."""

    def __init__(self, lm, prefill_chunk: int = PREFILL_CHUNK, prefix_cache: bool = True,
                 spec: SpecSettings | None = None, disk: DiskCache | None = None):
        """`spec`: speculative decoding's settings; None: the model's default (`lm.config.spec`).
        `disk`: the prompt cache's disk tier; None: the one the model's config names, if any."""
        self.lm, self.cache = lm, lm.cache
        self.spec = spec if spec is not None else SpecSettings(mode=default_mode(lm))
        check_speculative(lm, self.spec.mode)
        self.prefill_chunk = max(1, min(prefill_chunk, self.cache.max_batch))
        self.eog = end_of_generation_ids(lm)
        self.waiting: deque[Request] = deque()
        self.running: list[Running] = []
        cfg = lm.config
        if disk is None and prefix_cache and cfg.cache_disk:  # the prompt cache's disk tier (--cache-disk)
            disk = DiskCache.for_model(lm, cfg.cache_disk, cfg.cache_disk_size and cfg.cache_disk_size << 20)
            log.info("%s", disk.describe())
        self.prefix = PrefixCache(self.cache, prefix_cache, disk=disk)
        self.speculation = Speculation(lm, self.spec, self.prefix)
        self.prefix.follower = self.speculation  # the MTP head's cache and the draft model's slots follow
        self.prefix_hit_tokens = 0  # prompt tokens not prefilled thanks to the prefix cache

    def step(self) -> int:
        """One batch forward over every running sequence; returns its tokens (0: nothing to do)."""
        self._drop_cancelled()
        self._admit()
        rows = self._decode_rows()
        rows += self._prompt_rows(rows)
        if not rows:
            return 0
        batch = self._batch(rows)
        logits = self._forward(batch, rows)
        self._sample(rows, logits)
        self._emit(rows)
        self.speculation.after_step(batch, rows, self.running)  # the next step's drafts
        self._retire()
        return batch.n_tokens

    # ---------------------------------------------------------- the phases

    def _drop_cancelled(self) -> None:
        for r in [r for r in self.running if r.req.cancel.is_set()]:
            self.running.remove(r)
            self._cancel(r)

    def _admit(self) -> None:
        """Waiting requests, first come first served, while their choices have slots."""
        while self.waiting and self.room_for(self.waiting[0]):
            req = self.waiting.popleft()
            if req.cancel.is_set():
                self._end_unstarted(req, "cancelled")
                continue
            choices = [Choice(i, p, self.lm.tokenizer, req.prompt_ids, self._budget_for(req, p), self.eog)
                       for i, p in enumerate(req.params)]
            for c in choices:
                c.drafting = self.speculation.drafting(c.params, req)
            prompts_in = [c.slot for r in self.running for c in r.choices if not r.prefilling]
            choices[0].slot, reused = self.prefix.prefill_slot(req.prompt_ids, prompts_in, req.lora)
            for c in choices[1:]:
                c.slot = self.prefix.take_slot()
            self.prefix_hit_tokens += reused
            for c in choices:
                c.cached = reused
            self.running.append(Running(req, choices, reused, rope_plan(self.lm, req)))
            if req.progress:
                req.emit(Step(None, "", None, len(req.prompt_ids), 0, progress=(reused, reused)))

    def _decode_rows(self) -> list[Row]:
        """Each decoding sequence's next token (after what a rollback left to feed again),
        with the drafts the batch has room for."""
        decoding = [(r, c) for r in self.running if not r.prefilling for c in r.choices if not c.finished]
        room = self.cache.max_batch - sum(len(c.refeed) + 1 for _, c in decoding)
        rows = []
        for r, c in decoding:
            pos = len(self.prefix.held[c.slot])
            drafts = self.speculation.drafts(c, pos, room)
            room -= len(drafts)
            rows.append(Row(Purpose.DECODE, r, c, c.slot, c.refeed + [c.next_token] + drafts, pos, drafts))
        return rows

    def _prompt_rows(self, decoding: list[Row]) -> list[Row]:
        """Chunks of the prompts being prefilled, in what the batch has left: at most
        `prefill_chunk` tokens each while others decode, else as much as fits."""
        budget = self.cache.max_batch - sum(len(row.tokens) for row in decoding)
        chunk = self.prefill_chunk if decoding else budget
        rows = []
        for r in self.running:
            if not r.prefilling or budget <= 0:
                continue
            n = self.prefix.chunk(r.fed, min(len(r.prompt) - r.fed, chunk, budget), len(r.prompt))
            if r.req.media:
                try:
                    n = media_chunk(self.lm, r, n, budget, piecewise=bool(decoding or rows))
                except Exception as e:  # an image the tower fails on ends its request only
                    self._fail([r], e)
                    continue
                if n == 0:
                    continue
            last = r.fed + n == len(r.prompt)
            rows.append(Row(Purpose.PROMPT_END if last else Purpose.PREFILL, r, r.choices[0], r.choices[0].slot,
                            r.prompt[r.fed:r.fed + n], r.fed))
            budget -= n
        return rows

    def _batch(self, rows: list[Row]) -> Batch:
        """The rows as one batch, each row's logits at its place in the forward's."""
        try:
            batch = Batch.of([(row.slot, row.tokens, row.pos) for row in rows], [row.n_logits for row in rows],
                             device=self.lm.device, **batch_media(self.lm, rows))
        except ValueError as e:  # an image the chunking let through whole or not at all
            self._fail(_runs(rows), e)
            raise
        batch.keep_hidden = self.speculation.keeps_hidden(rows)
        batch.lora = {row.slot: row.run.req.lora for row in rows if row.run.req.lora}
        start = 0
        for row in rows:
            row.logits = slice(start, start + row.n_logits)
            start = row.logits.stop
        return batch

    def _forward(self, batch: Batch, rows: list[Row]) -> torch.Tensor:
        try:
            logits = self.lm.forward(batch)
        except Exception as e:  # a failed forward ends the requests in it; the scheduler goes on
            self._fail(_runs(rows), e)
            raise
        for row in rows:
            self.prefix.record(row.slot, row.tokens, row.pos)
        if logits.device.type == "cpu" or all(c.draws_anywhere for row in rows for c in _drawing(row)):
            return logits  # on a GPU: greedy draws there, one number back per token, not the vocabulary's row
        return logits.cpu()

    def _sample(self, rows: list[Row], logits: torch.Tensor) -> None:
        """Each row's sequences take their tokens: a decode row's its next and the drafts that
        hold, a prompt's last row every choice's first (a prompt's other rows: checkpoints)."""
        for row in rows:
            if row.purpose is not Purpose.DECODE:
                row.run.fed += len(row.tokens)
                if row.run.req.progress:
                    row.run.req.emit(Step(None, "", None, len(row.run.prompt), 0,
                                          progress=(row.run.fed, row.run.choices[0].cached)))
            if row.purpose is Purpose.PREFILL:
                self.prefix.checkpoint(row.slot, row.run.fed, len(row.run.prompt))
                continue
            try:
                if row.purpose is Purpose.PROMPT_END:
                    self._fork(row, logits[row.logits.start])
                else:
                    row.out = [(row.choice, step) for step in self.speculation.verify(row, logits[row.logits])]
            except Exception as e:  # a sampler or logits processor failing ends its request only
                row.error = e

    def _fork(self, row: Row, logits: torch.Tensor) -> None:
        """The prompt is in: copy it into the other choices' slots; each samples its first token."""
        r = row.run
        for c in r.choices[1:]:
            self.prefix.copy(row.slot, c.slot, len(r.prompt))
        for c in r.choices:
            row.out.append((c, c.take(logits)))

    def _emit(self, rows: list[Row]) -> None:
        """What each row's choices took goes to their requests; finished choices retire, and
        a request whose choices all finished ends."""
        for row in rows:
            for c, step in row.out:
                row.run.req.emit(step)
                if step.finish_reason is not None:
                    self._retire_choice(c)
            if row.error is not None and not row.run.req.done:
                self._fail([row.run], row.error)
        for r in _runs(rows):
            if not r.req.done and all(c.finished for c in r.choices):
                self._finish(r.req)

    def _retire(self) -> None:
        """Requests that ended leave (their choices' slots went as each finished)."""
        self.running = [r for r in self.running if not r.req.done]

    # ------------------------------------------------------ requests and slots

    @property
    def busy(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def n_running(self) -> int:
        return sum(1 for r in self.running for c in r.choices if not c.finished)

    @property
    def drafted_tokens(self) -> int:
        return self.speculation.drafted_tokens

    @property
    def accepted_tokens(self) -> int:
        return self.speculation.accepted_tokens

    def slots(self) -> dict[str, int]:
        """KV cache slots: running sequences, finished ones kept for reuse, free."""
        cached, free = len(self.prefix.idle), self.cache.free_slots
        return {"running": self.cache.n_seq - cached - free, "cached": cached, "free": free}

    def cells_in_use(self) -> tuple[int, int]:
        """(KV cells the running sequences hold, cells in all): a finished prefix kept for
        reuse counts as free, as vLLM counts its cached blocks (it goes when room is needed)."""
        idle = set(self.prefix.idle)
        used = sum(n for slot, n in enumerate(self.cache.lengths) if slot not in idle)
        return used, self.cache.n_seq * self.cache.n_ctx

    def room_for(self, req: Request) -> bool:
        return len(req.params) <= self.prefix.available

    def has_room(self) -> bool:
        """Whether a slot would be left after admitting every waiting request."""
        return sum(len(r.params) for r in self.waiting) < self.prefix.available

    def add(self, req: Request) -> None:
        """Queue a request; it is admitted, first come first served, once its choices
        have slots. A request that cannot start (no prompt, no room in the context)
        finishes at once with "length"."""
        if not req.params:
            raise ValueError("a request needs at least one SamplingParams")
        unknown = [i for i, _ in req.lora if i not in self.lm.adapters]
        if unknown:
            raise ValueError(f"LoRA adapter {unknown[0]} is not loaded (unloaded since the request came?)")
        if len(req.params) > self.cache.n_seq:
            raise CacheError(f"{len(req.params)} choices need as many sequence slots; the cache has {self.cache.n_seq}")
        if self._budget(req) <= 0 or not req.prompt_ids:
            self._end_unstarted(req, "length")
            return
        self.waiting.append(req)

    def close(self) -> None:
        """Cancel what runs, drop what waits, and give every slot back to the cache."""
        for r in self.running:
            self._cancel(r)
        for req in self.waiting:
            self._finish(req)
        self.running, self.waiting = [], deque()
        self.prefix.clear()
        if self.prefix.disk is not None:
            self.prefix.disk.close()

    def _budget(self, req: Request) -> int:
        return self.cache.n_ctx - len(req.prompt_ids)  # the context limit: the cache's, decided at load

    def _budget_for(self, req: Request, p: SamplingParams) -> int:
        b = self._budget(req)
        return b if p.max_tokens is None else min(b, p.max_tokens)

    def _end_unstarted(self, req: Request, reason: str) -> None:
        for i in range(len(req.params)):
            req.emit(Step(None, "", reason, len(req.prompt_ids), 0, index=i))
        self._finish(req)

    def _finish(self, req: Request) -> None:
        req.done = True
        req.emit(None)

    def _retire_choice(self, c: Choice) -> None:
        if c.slot is not None:
            self.prefix.retire(c.slot)
            c.slot = None

    def _cancel(self, r: Running) -> None:
        for c in r.choices:
            if not c.finished:
                r.req.emit(c.cancelled())
            self._retire_choice(c)
        self._finish(r.req)

    def _fail(self, runs, e: Exception) -> None:
        for r in runs:
            for c in r.choices:
                c.finished = True
                if c.slot is not None:  # its state may be half-written: not kept
                    self.prefix.release(c.slot)
                    c.slot = None
            r.req.done = True
            r.req.emit(e)
        self._retire()


def _drawing(row: Row) -> list[Choice]:
    """The choices that draw from a row's logits."""
    if row.purpose is Purpose.DECODE:
        return [row.choice]
    return list(row.run.choices) if row.purpose is Purpose.PROMPT_END else []


def _runs(rows: list[Row]) -> list[Running]:
    """The requests the rows are of, each once."""
    return list({id(row.run): row.run for row in rows}.values())


def run_one(lm, prompt_ids: list[int], params: SamplingParams, cancel: threading.Event | None = None,
            media: dict | None = None, lora: tuple[tuple[int, float], ...] = ()):
    """A scheduler with one request, its Steps as they come (generate()'s loop)."""
    out: deque = deque()
    req = Request(list(prompt_ids), [params], out.append, cancel or threading.Event(), media=media or {}, lora=lora)
    sched = Scheduler(lm, prefix_cache=False)
    try:
        sched.add(req)
        while True:
            while out:
                item = out.popleft()
                if item is None:
                    return
                if isinstance(item, Exception):
                    raise item
                yield item
            if not sched.step() and not out:
                raise CacheError(f"no free sequence slot: all {sched.cache.n_seq} are held by another scheduler")
    finally:
        sched.close()
