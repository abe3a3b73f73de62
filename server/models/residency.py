"""Which models are loaded: loading them on demand, the memory budget and --max-loaded
(unloading the least recently used that nobody holds), idle unloading (--idle-unload,
a request's keep_alive); each loaded model gets its worker (server.models.worker).

A request holds its model from before the load to the end of its generation (`acquire`
... `release`, or `hold` / `holding` on the event loop): a held model is never
unloaded, so a request never sees its model vanish. Room for a model is made by
unloading the least recently used models that nobody holds, as far as --max-loaded and
--memory-budget ask; where the others are all held, the request waits (at most
--load-wait seconds, then 503 with Retry-After). --idle-unload and a request's
keep_alive unload an idle model after a quiet while (`reap`, on a thread of its own)."""

from __future__ import annotations

import asyncio
import copy
import gc
import logging
import os
import threading
import time
from contextlib import asynccontextmanager

from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from ...engine import LOAD_STAGES, available_memory, is_file_error, is_transient, load_model, trim_heap
from ..core.errors import Conflict, ModelLoadFailed, Unavailable, public
from ..core.pools import Pool, loads_pool
from .catalog import Catalog, Entry
from .worker import Worker, worker_for

log = logging.getLogger("gguf_serve.server")


def resident_bytes() -> int:
    """This process's resident memory (0 where /proc does not tell)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


MEMORY_PARTS = ("files", "kv", "checkpoints", "adapters", "draft", "disk_writes")  # what a loaded model holds


def default_budget() -> int:
    """Bytes the loaded models may hold together by default: the memory available at
    startup, less 1 GiB for everything else."""
    return max(available_memory() - (1 << 30), 1 << 30)


class Residency:
    """The catalog's models in memory: `entries` is the catalog's, in least recently
    used order (a model used moves to the end); `cond` guards their load state."""

    def __init__(self, catalog: Catalog, settings, metrics=None, clock=time.monotonic, pool: Pool | None = None):
        """`pool`: the threads requests wait for their model's load on (server.core.pools'
        loads: not the event loop's shared executor). `clock`: the seconds that idle time is
        counted in (keep_alive, --idle-unload); a
        test gives its own to step through them without waiting."""
        self.catalog = catalog
        self.clock = clock
        self.pool = pool or loads_pool()
        self.entries = catalog.entries
        self.settings = settings
        self.metrics = metrics
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.load_lock = threading.Lock()  # one load at a time (see _load)
        self.budget = settings.memory_budget if settings.memory_budget is not None else default_budget()
        log.info("models: at most %d loaded, holding at most %.1f GiB together (%s)", settings.max_loaded,
                 self.budget / 2**30, "--memory-budget" if settings.memory_budget is not None
                 else "the memory available less 1 GiB; raise with --memory-budget")

    # ------------------------------------------------------- on the event loop

    async def hold(self, model: str | None, keep_alive: float | None = None, kind: str | None = None) -> Entry:
        """The model a request names (catalog.named; `kind`: the endpoint's, for a name not
        served), held for it and loaded, off the event loop; it stays loaded until `release`."""
        entry = self.catalog.named(model, kind)
        task = asyncio.ensure_future(self.pool.run(self.acquire, entry, keep_alive))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:  # the client went while it waited: the hold ends once the load does
            task.add_done_callback(lambda t: t.cancelled() or t.exception() is not None
                                   or self.release(entry))
            raise

    @asynccontextmanager
    async def holding(self, model: str | None, keep_alive: float | None = None, kind: str | None = None):
        """A loaded model for the duration of a `with` block (tokenize, embeddings)."""
        entry = await self.hold(model, keep_alive, kind)
        try:
            yield entry
        finally:
            self.release(entry)

    # ---------------------------------------------------------- on threads

    def acquire(self, entry: Entry, keep_alive: float | None = None, wait: float | None = None) -> Entry:
        """Hold `entry` for a request and have it loaded: waits for its load (or does it),
        or for room; the caller calls `release` once its request has ended. `keep_alive`:
        seconds it stays loaded once idle (a negative number: until evicted; 0: unloaded
        at once; None: --idle-unload), as Ollama's: each request sets it anew. A model that
        failed to load raises its failure (`_ready`)."""
        with self.cond:
            entry.users += 1
            entry.keep_alive = keep_alive
            self._gauge(entry)
        try:
            self._load(entry, time.monotonic() + (self.settings.load_wait if wait is None else wait))
        except BaseException:
            self.release(entry)
            raise
        return entry

    def release(self, entry: Entry) -> None:
        """A request that held `entry` has ended (callable from any thread, once per acquire)."""
        with self.cond:
            entry.users -= 1
            entry.last_used = self.clock()
            self._gauge(entry)
            self.cond.notify_all()

    def ensure_loaded(self, entry: Entry, keep_alive: float | None = None) -> Entry:
        """Load `entry` (startup's named models, /models/load) without holding it."""
        self.acquire(entry, keep_alive)
        self.release(entry)
        return entry

    def state(self, entry: Entry) -> str:
        if entry.error is not None:
            return "failed"
        return "loading" if entry.loading else "loaded" if entry.lm is not None else "unloaded"

    def _gauge(self, entry: Entry) -> None:
        if self.metrics:
            self.metrics.model_requests.labels(entry.id).set(entry.users)

    def _need(self, entry: Entry) -> int:
        """Bytes `entry` takes loaded: what it took last time (its files, its caches, or
        what the process grew by, whichever is more), else its files (the rest is counted
        once the load has sized it, and more models go then if need be)."""
        return entry.memory or self._files_bytes(entry)

    @staticmethod
    def _files_bytes(entry: Entry) -> int:
        """The model's file and its vision file (mapped whole once loaded)."""
        size = entry.info.get("size_bytes") or 0
        if entry.mmproj and os.path.exists(entry.mmproj):
            size += os.path.getsize(entry.mmproj)
        return size

    def _room_for(self, entry: Entry) -> list[Entry] | None:
        """The models to unload so that `entry` fits (least recently used first, none that
        a request holds or that is loading); None where it cannot fit until some are free.
        A model alone is loaded whatever the budget: the budget is for models together."""
        others = [e for e in self.entries.values() if e is not entry and (e.lm is not None or e.loading)]
        idle = [e for e in others if e.lm is not None and not e.loading and e.users == 0]
        need, budget, cap = self._need(entry), self.budget, self.settings.max_loaded
        chosen: list[Entry] = []

        def fits() -> bool:
            kept = [e for e in others if e not in chosen]
            return len(kept) < cap and (not kept or sum(self._need(e) for e in kept) + need <= budget)

        for victim in idle:
            if fits():
                break
            chosen.append(victim)
        return chosen if fits() else None

    def _ready(self, entry: Entry) -> bool:
        """Whether `entry` is loaded (under the lock); raises its load failure."""
        if entry.error is not None:
            raise copy.copy(entry.failure) if entry.failure is not None else ModelLoadFailed(entry.error)
        if entry.lm is not None and not entry.loading:
            self.entries.move_to_end(entry.id)
            return True
        return False

    def _load(self, entry: Entry, deadline: float) -> None:
        """Load `entry` unless it is. Loads go one at a time (the engine's kernel settings
        are the process's, and each load's memory is known before the next one makes
        room); a request waits its turn, and for room, until `deadline`."""
        with self.cond:
            if self._ready(entry):
                return
        if not self.load_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise self._busy(entry, "waits for another model's load")
        try:
            with self.cond:
                while not self._ready(entry):
                    victims = self._room_for(entry)
                    if victims is not None:
                        break
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise self._busy(entry)
                    self.cond.wait(min(left, 1.0))
                else:
                    return  # loaded by the request before this one
                gone = [self._take_down(v, "room", f"to make room for {entry.id}") for v in victims]
                entry.loading = True
            try:
                for worker in gone:
                    self._finish_unload(worker)
                rss = resident_bytes()
                lm = self._build(entry)
                grown = resident_bytes() - rss  # what the load kept resident: its tokenizer and all
            except BaseException:
                with self.cond:
                    entry.loading = False
                    self.cond.notify_all()
                raise
            with self.cond:
                entry.lm, entry.worker = lm, worker_for(entry.id, lm, self.settings.max_queue, self.metrics)
                parts = self._footprint(entry, lm)
                entry.memory = max(sum(parts.values()), grown)
                log.info("%s holds %.0f MiB: %s (the models together: at most %.1f GiB)", entry.id,
                         entry.memory / 2**20, ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in parts.items() if v),
                         self.budget / 2**30)
                if self.metrics:
                    for part, n in parts.items():
                        self.metrics.model_memory_parts.labels(entry.id, part).set(n)
                entry.loading = False
                entry.last_used = self.clock()
                self.entries.move_to_end(entry.id)
                over = self._room_for(entry) or []  # its whole size is known now: over the budget, more go
                gone = [self._take_down(v, "memory", f"{entry.id} took {entry.memory / 2**20:.0f} MiB")
                        for v in over]
                if self.metrics:
                    self.metrics.models_loaded.inc()
                    self.metrics.model_memory.set(self._held_memory())
                self.cond.notify_all()
            for worker in gone:
                self._finish_unload(worker)
        finally:
            self.load_lock.release()

    def _busy(self, entry: Entry, what: str | None = None) -> Unavailable:
        held = [f"{e.id} ({e.users} request(s))" for e in self.entries.values() if e.lm is not None and e.users]
        what = what or (f"needs room and the models loaded are all in use: {', '.join(held)}" if held
                        else "cannot be loaded yet")
        return Unavailable(f"model {entry.id} {what}; waited {self.settings.load_wait:g} s (--load-wait); retry "
                           f"shortly", param="model", code="model_busy", headers={"Retry-After": "5"})

    def _build(self, entry: Entry):
        self.catalog.fetch(entry)
        t = time.perf_counter()
        bar = tqdm(total=len(LOAD_STAGES), desc=f"loading {entry.id}", unit="step", leave=False)

        def progress(stage: str) -> None:
            if bar.n or stage != LOAD_STAGES[0]:
                bar.update(1)
            bar.set_postfix_str(stage)

        try:
            with logging_redirect_tqdm():  # the load's log lines above its bar, not on its line
                lm = load_model(entry.path, progress=progress, config=self.settings.engine_config(mmproj=entry.mmproj))
                for i, path in enumerate(entry.adapters):  # ids: what requests and /lora-adapters name
                    if path is not None:
                        lm.load_adapter(path, i)
        except Exception as e:
            raise self._failed(entry, e) from e
        finally:
            bar.close()
        elapsed = time.perf_counter() - t
        if self.metrics:
            self.metrics.load_time.labels(entry.id).observe(elapsed)
        log.info("loaded %s in %.1f s", entry.id, elapsed)
        return lm

    @staticmethod
    def _failed(entry: Entry, e: Exception) -> Unavailable | ModelLoadFailed:
        """A load's failure as the API error it means. One that may pass (memory short for
        now, a file being replaced, a disk that does not answer: engine.is_transient) is a
        503 naming it, not kept: the next request loads again. Any other (the file's own:
        corrupt, an architecture or type not supported) is kept on the entry and answered
        500 from then on: the file will not get better by retrying."""
        reason = f"{type(e).__name__}: {e}" if is_transient(e) else str(e)
        if is_transient(e):
            log.warning("loading %s failed, retried by the next request: %s", entry.id, reason)
            gc.collect()  # what the failed load held goes back before the next try
            trim_heap()
            return Unavailable(f"cannot load {entry.id} now ({reason}); retry shortly", param="model",
                               code="model_load_unavailable", headers={"Retry-After": "5"})
        log.error("cannot load %s: %s (kept: %s)", entry.id, reason,
                  "the file's own fault" if is_file_error(e) else "not one that passes")
        entry.error = public(f"cannot load {entry.id}: {reason}")  # as clients see it: no server paths
        return ModelLoadFailed(entry.error)

    def _footprint(self, entry: Entry, lm) -> dict[str, int]:
        """The bytes a loaded model holds, by part: its files (mapped), its KV cache, the state
        checkpoints' budget, its adapters, a draft model, the disk tier's copies waiting to
        be written (at most)."""
        draft = getattr(lm, "draft", None)
        sched = getattr(entry.worker, "scheduler", None)  # (an embedding model's worker has none)
        disk = sched.prefix.disk if sched is not None else None
        return {"files": self._files_bytes(entry), "kv": lm.cache.nbytes, "checkpoints": lm.cache.checkpoint_budget,
                "adapters": sum(a.nbytes for a in lm.adapters.values()),
                "draft": os.path.getsize(draft.gguf.path) + draft.cache.nbytes if draft is not None else 0,
                "disk_writes": disk.max_pending if disk is not None else 0}

    def _held_memory(self) -> int:
        return sum(e.memory for e in self.entries.values() if e.lm is not None)

    def _take_down(self, entry: Entry, reason: str, why: str) -> Worker:
        """Mark `entry` unloaded (under the lock; nobody holds it); its worker is stopped
        and its memory freed by `_finish_unload`, outside the lock."""
        log.info("unloading %s (%s)", entry.id, why)
        worker = entry.worker
        entry.lm, entry.worker = None, None
        if self.metrics:
            self.metrics.models_loaded.dec()
            self.metrics.model_memory.set(self._held_memory())
            self.metrics.unloads.labels(reason).inc()
            for gauge in (self.metrics.queue_depth, self.metrics.running, self.metrics.sequences_running):
                gauge.labels(entry.id).set(0)
            for part in MEMORY_PARTS:
                self.metrics.model_memory_parts.labels(entry.id, part).set(0)
        return worker

    def resized(self, entry: Entry, delta: int) -> None:
        """A loaded model took `delta` bytes more (an adapter loaded at run time; less: unloaded)."""
        with self.cond:
            entry.memory += delta
            if self.metrics and entry.lm is not None:
                self.metrics.model_memory.set(self._held_memory())
                self.metrics.model_memory_parts.labels(entry.id, "adapters").set(
                    sum(a.nbytes for a in entry.lm.adapters.values()))

    @staticmethod
    def _finish_unload(worker: Worker | None) -> None:
        """Stop an unloaded model's worker, wait for its thread (it holds the model), and
        hand the memory back: the mapped file is closed once nothing refers to it."""
        if worker is not None:
            worker.stop()
            worker.thread.join()
            worker.lm = worker.scheduler = None
        gc.collect()
        trim_heap()

    def unload(self, entry: Entry, why: str = "asked to") -> bool:
        """Unload `entry` now (POST /models/unload); False where it was not loaded.
        Refused (409) while a request holds it."""
        with self.cond:
            if entry.lm is None or entry.loading:
                return False
            if entry.users:
                raise Conflict(f"model {entry.id} is in use by {entry.users} request(s); it is unloaded once idle "
                               f"with keep_alive 0, or retry later", param="model", code="model_in_use")
            worker = self._take_down(entry, "asked", why)
        self._finish_unload(worker)
        return True

    def idle_deadline(self, entry: Entry) -> float | None:
        """When `entry` is unloaded for being idle (monotonic seconds), or None."""
        keep = entry.keep_alive if entry.keep_alive is not None else self.settings.idle_unload
        if keep is None or keep < 0:
            return None
        return entry.last_used + keep

    def reap(self, stop: threading.Event) -> None:
        """Unload idle models as --idle-unload and keep_alive ask, until `stop` is set
        (the server's thread for it)."""
        while not stop.is_set():
            with self.cond:
                gone, wake = self._due()
                if not gone:
                    self.cond.wait(max(wake, 0.05))
            for worker in gone:
                self._finish_unload(worker)

    def unload_idle(self) -> float:
        """One pass of the reaper: the idle models whose time is up (by `clock`) unloaded;
        the seconds until the next one is due (at most 5)."""
        with self.cond:
            gone, wake = self._due()
        for worker in gone:
            self._finish_unload(worker)
        return wake

    def _due(self) -> tuple[list[Worker], float]:
        """Under `cond`: the idle models whose time is up taken down (their workers, to
        finish outside the lock), and the seconds until the next one is due (at most 5)."""
        gone, now, wake = [], self.clock(), 5.0
        for e in list(self.entries.values()):
            if e.lm is None or e.loading or e.users:
                continue
            due = self.idle_deadline(e)
            if due is None:
                continue
            if due <= now:
                gone.append(self._take_down(e, "idle", "idle"))
            else:
                wake = min(wake, due - now)
        return gone, wake

    def cancel_all(self) -> None:
        """Cancel every generation (Ctrl-C, SIGTERM): each ends at its next step."""
        for entry in self.entries.values():
            if entry.worker is not None:
                entry.worker.cancel_all()

    def stop_workers(self, timeout: float = 10.0) -> None:
        """Stop every loaded model's worker and wait for its thread (the server's shutdown)."""
        workers = [e.worker for e in self.entries.values() if e.worker is not None]
        for w in workers:
            w.stop()
        deadline = time.monotonic() + timeout  # their steps end first: a forward still running in torch's or
        for w in workers:  # the kernels' threads while the process exits aborts it ("terminate called ...")
            w.thread.join(max(0.0, deadline - time.monotonic()))
