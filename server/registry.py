"""Which models this server offers (local files, directories, Hub IDs and the Hub cache,
the embedded default), their names and aliases, loading them on demand and unloading
the least recently used beyond --max-loaded; each loaded model gets its generation
worker (server.worker)."""

from __future__ import annotations

import copy
import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ..engine import load_model
from ..gguf_io import GGUFError, GGUFReader
from ..gguf_io.summary import describe
from . import resolve
from .default_model import default_model_path
from .errors import APIError, ModelLoadFailed, ModelNotFound
from .worker import Worker

log = logging.getLogger("gguf_serve.server")

DEFAULT_MODEL_ID = "embedded:gemma-3-270m-q4_k_m.gguf"


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

    @property
    def vision(self) -> bool:
        return bool(self.mmproj or self.mmproj_hub)


class Registry:
    def __init__(self, settings, metrics=None):
        self.settings = settings
        self.metrics = metrics
        self.entries: OrderedDict[str, Entry] = OrderedDict()
        self.lock = threading.Lock()
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
        return os.path.join(folder, found) if found else None

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

    def ensure_loaded(self, entry: Entry) -> Entry:
        if entry.error is not None:
            raise copy.copy(entry.failure) if entry.failure is not None else ModelLoadFailed(entry.error)
        with self.lock:
            self._fetch(entry)
            if entry.lm is None:
                loaded = [e for e in self.entries.values() if e.lm is not None]
                while len(loaded) >= self.settings.max_loaded:
                    victim = loaded.pop(0)  # least recently used first
                    log.info("unloading %s (limit of %d loaded models)", victim.id, self.settings.max_loaded)
                    victim.worker.stop()
                    victim.lm, victim.worker = None, None
                    if self.metrics:
                        self.metrics.models_loaded.dec()
                t = time.perf_counter()
                from tqdm.auto import tqdm

                from ..engine.loader import LOAD_STAGES

                bar = tqdm(total=len(LOAD_STAGES), desc=f"loading {entry.id}", unit="step", leave=False)

                def progress(stage: str) -> None:
                    if bar.n or stage != LOAD_STAGES[0]:
                        bar.update(1)
                    bar.set_postfix_str(stage)

                try:
                    entry.lm = load_model(entry.path, progress=progress,
                                          config=self.settings.engine_config(mmproj=entry.mmproj))
                except Exception as e:
                    entry.error = f"cannot load {entry.id}: {e}"  # the file will not get better by retrying
                    raise ModelLoadFailed(entry.error) from e
                finally:
                    bar.close()
                entry.worker = Worker(entry.id, entry.lm, self.settings.max_queue, self.metrics)
                elapsed = time.perf_counter() - t
                if self.metrics:
                    self.metrics.load_time.labels(entry.id).observe(elapsed)
                    self.metrics.models_loaded.inc()
                log.info("loaded %s in %.1f s", entry.id, elapsed)
            self.entries.move_to_end(entry.id)
        return entry
