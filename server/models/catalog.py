"""Which models this server offers (local files, directories, Hub IDs and the Hub cache,
the embedded default), their names and aliases, loading them on demand and unloading
the least recently used beyond --max-loaded; each loaded model gets its generation
worker (server.worker)."""

from __future__ import annotations

import copy
import gc
import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ..engine import load_model
from ..engine.loader import available_memory, trim_heap
from ..engine.vision import goes_with
from ..gguf_io import GGUFError, GGUFReader
from ..gguf_io.summary import describe
from . import resolve
from .default_model import default_model_path
from .errors import APIError, Conflict, ModelLoadFailed, ModelNotFound, Unavailable
from .worker import Worker, worker_for

log = logging.getLogger("gguf_serve.server")

DEFAULT_MODEL_ID = "embedded:gemma-3-270m-q4_k_m.gguf"


def resident_bytes() -> int:
    """This process's resident memory (0 where /proc does not tell)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def default_budget() -> int:
    """Bytes the loaded models may hold together by default: the memory available at
    startup, less 1 GiB for everything else."""
    return max(available_memory() - (1 << 30), 1 << 30)


@dataclass
class Entry:
    id: str
    path: str | None  # None: a Hub file not fetched yet
    lm: Any = None
    hub_ref: tuple | None = None
    worker: Worker | None = None
    info: dict = field(default_factory=dict)
    error: str | None = None  # why it cannot be served (a file that failed to read or load)
    failure: Any = None  # the APIError that said so, where one did (its status is kept: 403, 404, 503, ...)
    mmproj: str | None = None  # its vision file: a local path, or a Hub ID fetched with the model
    mmproj_hub: tuple | None = None  # (repo, file, revision) of a Hub vision file not fetched yet
    users: int = 0  # requests holding it: waiting for its load, or being served (never unloaded then)
    loading: bool = False
    last_used: float = 0.0  # when its last request ended (monotonic)
    keep_alive: float | None = None  # seconds to stay loaded once idle, as the last request asked
    memory: int = 0  # bytes it took when last loaded (files + caches)

    @property
    def vision(self) -> bool:
        return bool(self.mmproj or self.mmproj_hub)


class Registry:
    def __init__(self, settings, metrics=None):
        self.settings = settings
        self.metrics = metrics
        self.entries: OrderedDict[str, Entry] = OrderedDict()
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.load_lock = threading.Lock()  # one load at a time (see _load)
        self.budget = settings.memory_budget if settings.memory_budget is not None else default_budget()
        log.info("models: at most %d loaded, holding at most %.1f GiB together (%s)", settings.max_loaded,
                 self.budget / 2**30, "--memory-budget" if settings.memory_budget is not None
                 else "the memory available less 1 GiB; raise with --memory-budget")
        self.aliases: dict[str, str] = {}
        self._reach: tuple[bool, float] | None = None  # (the Hub answers, when probed)

    # ------------------------------------------------------------ naming

    def add(self, spec: str, alias: str | None = None, mmproj: str | None = None) -> Entry:
        """Register a model by local path, Hub id (see server.hub), or `default`; a Hub
        repo's other .gguf files are registered too (listed, fetched on first use). A
        local file is listed as `alias`, else its file name (the path as typed, should
        two files share a name); the path is accepted as well. Its vision file is `mmproj`
        (--mmproj), else the one beside it (best_companion), unless --no-mmproj."""
        if spec in ("default", DEFAULT_MODEL_ID):
            return self._put(Entry(DEFAULT_MODEL_ID, default_model_path()))
        if os.path.isdir(spec):
            return self.add_directory(spec)
        if os.path.exists(spec):
            path = os.path.abspath(spec)
            mid = alias or os.path.basename(spec)
            if mid in self.entries and self.entries[mid].path != path:
                mid = spec
            entry = self._put(Entry(mid, path, mmproj=self._vision(mmproj) or self._beside(path)))
            for name in {spec, path} - {mid}:
                self.aliases[name] = mid
            return entry
        ref = resolve.parse(spec)
        if ref is None:
            raise ModelNotFound(spec)
        everything = []
        if self._online():
            everything = resolve.gguf_files(ref.repo, ref.revision, models_only=False)  # the Hub's answer stands
            files = [f for f in everything if resolve.is_model_file(f)]
        elif ref.filename is not None:
            files = [ref.filename]  # fetched from the cache, or a 404/503 saying why not
        else:  # offline, or a Hub that does not answer: only the cache can choose a file
            files = [mid.split(":", 1)[1] for mid, _ in resolve.cached_gguf_models() if mid.split(":", 1)[0] == ref.repo]
            if not files:
                why = ("--offline (HF_HUB_OFFLINE) is set" if resolve.offline()
                       else f"the Hub at {resolve.endpoint()} does not answer")
                raise ModelNotFound(spec, f"no file of {ref.repo} is in the Hub cache and {why}")
        chosen = resolve.choose_file(ref, files)
        for f in files:
            mid = resolve.model_id(ref.repo, f, ref.revision)
            if mid not in self.entries:
                self.entries[mid] = Entry(mid, None, hub_ref=(ref.repo, f, ref.revision))
                vision = None if self.settings.no_mmproj else resolve.best_companion(everything, f)
                if vision is not None:
                    self.entries[mid].mmproj_hub = (ref.repo, vision, ref.revision)
        entry = self.entries[resolve.model_id(ref.repo, chosen, ref.revision)]
        if self._vision(mmproj):
            entry.mmproj, entry.mmproj_hub = mmproj, None
        self._fetch(entry)
        for name in (spec, alias):
            if name and name != entry.id:
                self.aliases[name] = entry.id
        return entry

    def add_directory(self, root: str) -> list[Entry]:
        """Every .gguf model under `root` (recursively; a split model once, by its first
        shard; not the files that go with models, such as mmproj vision projectors), listed
        by its path relative to `root` and loaded on first request. A file that cannot be
        read is listed with its error."""
        found = []
        for d, dirs, files in os.walk(root):
            dirs.sort()
            for f in sorted(files):
                if resolve.is_model_file(f):
                    found.append(os.path.join(d, f))
        if not found:
            raise ModelLoadFailed(f"no .gguf files under {root}")
        entries = []
        for path in found:
            mid = os.path.relpath(path, root)
            entry = Entry(mid, os.path.abspath(path), mmproj=self._beside(path))
            try:
                self._describe(entry)
            except ModelLoadFailed as e:
                entry.error = str(e)
            self.entries[mid] = entry
            self.aliases.setdefault(path, mid)
            entries.append(entry)
        return entries

    def add_failed(self, spec: str, error: Exception) -> Entry:
        """A model named at startup that could not be registered or loaded: listed with
        its error, refused with it (with its status where it was an API error)."""
        entry = self.entries.get(spec) or self.entries.get(self.aliases.get(spec, ""))
        if entry is None:
            entry = self.entries[spec] = Entry(spec, None)
        entry.error = error.message if isinstance(error, APIError) else str(error)
        entry.failure = error if isinstance(error, APIError) else None
        return entry

    def add_cached(self) -> None:
        """Every GGUF model in the Hub cache, loaded on first request."""
        for mid, path in resolve.cached_gguf_models():
            if mid not in self.entries:
                repo, f = mid.split(":", 1)
                self.entries[mid] = Entry(mid, path, hub_ref=(repo, f, None))
                try:
                    self._describe(self.entries[mid])
                except ModelLoadFailed:
                    del self.entries[mid]

    def _beside(self, path: str) -> str | None:
        """The vision file in a local model's folder (llama.cpp's choice among several), unless --no-mmproj."""
        if self.settings.no_mmproj:
            return None
        folder = os.path.dirname(os.path.abspath(path))
        found = resolve.best_companion(sorted(os.listdir(folder)), os.path.basename(path))
        if found is None or not goes_with(os.path.join(folder, found), path):
            return None  # none, or one for another architecture beside it
        return os.path.join(folder, found)

    def _vision(self, mmproj: str | None) -> str | None:
        return None if self.settings.no_mmproj else mmproj

    def _put(self, entry: Entry) -> Entry:
        self._describe(entry)
        self.entries[entry.id] = entry
        return entry

    def _online(self) -> bool:
        """Whether the Hub answers, probed once a minute at most: an unreachable Hub is
        known in seconds, and cached files are served without waiting on retries."""
        now = time.monotonic()
        if self._reach is None or now - self._reach[1] > 60:
            self._reach = (resolve.reachable(), now)
            if not self._reach[0] and not resolve.offline():
                log.warning("the Hub at %s does not answer: serving from the cache only", resolve.endpoint())
        return self._reach[0]

    def _fetch(self, entry: Entry) -> None:
        if entry.path is None:
            repo, f, rev = entry.hub_ref
            try:
                entry.path = resolve.download(repo, f, rev, cached_only=not self._online())
            except Exception as e:
                raise resolve.hub_error(e, entry.id) from e
            if entry.mmproj is None and entry.mmproj_hub is None:  # offline: a vision file fetched before
                entry.mmproj = self._beside(entry.path)
        if entry.mmproj_hub is not None:
            repo, f, rev = entry.mmproj_hub
            try:
                entry.mmproj = resolve.download(repo, f, rev, cached_only=not self._online())
            except Exception as e:
                raise resolve.hub_error(e, resolve.model_id(repo, f, rev)) from e
            entry.mmproj_hub = None
        if not entry.info:
            self._describe(entry)

    def _describe(self, entry: Entry) -> None:
        try:
            r = GGUFReader(entry.path)
        except (GGUFError, OSError) as e:
            raise ModelLoadFailed(f"cannot read {entry.id}: {e}") from e
        d = describe(r)
        entry.info = {
            "created": int(os.path.getmtime(entry.path)),
            "chat_template": d["chat_template"],
            "context_length": d["context_length"],
            "quantization": d["quantization"],
            "size_bytes": d["file_size"],
        }

    def get(self, model_id: str) -> Entry:
        entry = self.entries.get(model_id) or self.entries.get(self.aliases.get(model_id, ""))
        if entry is None and model_id == "default" and DEFAULT_MODEL_ID in self.entries:
            entry = self.entries[DEFAULT_MODEL_ID]
        if entry is None:
            raise ModelNotFound(model_id)
        return entry

    # ----------------------------------------------------------- loading
    #
    # A request holds its model from before the load to the end of its generation
    # (`acquire` ... `release`): a held model is never unloaded, so a request never sees
    # its model vanish. Room for a model is made by unloading the least recently used
    # models that nobody holds, as far as --max-loaded and --memory-budget ask; where
    # the others are all held, the request waits (at most --load-wait seconds, then 503
    # with Retry-After). --idle-unload and a request's keep_alive unload an idle model
    # after a quiet while (`reap`, on a thread of its own).

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
            entry.last_used = time.monotonic()
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
                entry.memory = max(self._footprint(entry, lm), grown)
                entry.loading = False
                entry.last_used = time.monotonic()
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
        self._fetch(entry)
        t = time.perf_counter()
        from tqdm.auto import tqdm

        from ..engine.loader import LOAD_STAGES

        bar = tqdm(total=len(LOAD_STAGES), desc=f"loading {entry.id}", unit="step", leave=False)

        def progress(stage: str) -> None:
            if bar.n or stage != LOAD_STAGES[0]:
                bar.update(1)
            bar.set_postfix_str(stage)

        try:
            lm = load_model(entry.path, progress=progress, config=self.settings.engine_config(mmproj=entry.mmproj))
        except Exception as e:
            entry.error = f"cannot load {entry.id}: {e}"  # the file will not get better by retrying
            raise ModelLoadFailed(entry.error) from e
        finally:
            bar.close()
        elapsed = time.perf_counter() - t
        if self.metrics:
            self.metrics.load_time.labels(entry.id).observe(elapsed)
        log.info("loaded %s in %.1f s", entry.id, elapsed)
        return lm

    def _footprint(self, entry: Entry, lm) -> int:
        """The bytes a loaded model holds: its files' (mapped) and its caches'."""
        size = self._files_bytes(entry) + lm.cache.nbytes + lm.cache.checkpoint_budget
        draft = getattr(lm, "draft", None)
        if draft is not None:
            size += os.path.getsize(draft.gguf.path) + draft.cache.nbytes
        return size

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
        return worker

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
            gone = []
            with self.cond:
                now, wake = time.monotonic(), 5.0
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
                if not gone:
                    self.cond.wait(max(wake, 0.05))
            for worker in gone:
                self._finish_unload(worker)
