"""Which models this server offers and under which names: local files, directories, Hub
IDs (`<repo>:<file>.gguf`, `<repo>:<QUANT>`, a bare repo: server.models.resolve) and
the Hub cache's files, the embedded default; their aliases, what their files say
(context, quantization, size), the vision file that goes with each. Loading them is
server.models.residency's job."""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ...engine import goes_with
from ...gguf_io import GGUFError, GGUFReader
from ...gguf_io.summary import describe
from ..core.errors import APIError, BadRequest, ModelLoadFailed, ModelNotFound, public
from . import resolve
from .default_model import default_model_path
from .worker import Worker

log = logging.getLogger("gguf_serve.server")

DEFAULT_MODEL_ID = "embedded:gemma-3-270m-q4_k_m.gguf"

# what a model file is for (/v1/models' `kind`) by its pooling type (llama.cpp's numbers; none: generation)
FILE_KINDS = {1: "embedding", 2: "embedding", 3: "embedding", 4: "rerank"}

# what a model file is for, by its pooling type (None: generation), and where to ask it
KINDS = {"mean": "an embedding model", "cls": "an embedding model", "last": "an embedding model",
         "rank": "a reranking model", None: "a generative (chat and completion) model"}
ROUTES = {"mean": "/v1/embeddings", "cls": "/v1/embeddings", "last": "/v1/embeddings", "rank": "/v1/rerank",
          None: "/v1/chat/completions, /v1/completions, /v1/responses or /v1/messages"}


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
    # its LoRA adapter files (--lora, POST /v1/load_lora_adapter): adapter id = index, None once unloaded
    adapters: list[str | None] = field(default_factory=list)
    lora_scales: dict[int, float] = field(default_factory=dict)  # the scales a request naming none runs with

    @property
    def vision(self) -> bool:
        return bool(self.mmproj or self.mmproj_hub)


def refuse_kind(entry: Entry, wanted: str) -> None:
    """A 400 unless `entry`'s loaded model is of the `wanted` kind ("generate", "embed", "rank")."""
    pooling = entry.lm.pooling
    kind = "rank" if pooling == "rank" else "generate" if pooling is None else "embed"
    if kind != wanted:
        raise BadRequest(f"model {entry.id} is {KINDS[pooling]}: use {ROUTES[pooling]}", param="model",
                         code="wrong_model_kind")


def adapter_ids(entry: Entry) -> list[int]:
    """The ids of the model's LoRA adapters now (those unloaded at run time left out)."""
    return [i for i, path in enumerate(entry.adapters) if path is not None]


def refuse_unknown_adapters(entry: Entry, ids: list[int], param: str) -> None:
    """A 400 naming the first of `ids` that is not one of the model's LoRA adapters (--lora)."""
    have = adapter_ids(entry)
    unknown = [i for i in ids if i not in have]
    if unknown:
        raise BadRequest(f"no LoRA adapter {unknown[0]} on {entry.id}: it has "
                         f"{', '.join(map(str, have)) or 'none'} (GET /lora-adapters)", param=param)


def _ollama_forms(name: str) -> list[str]:
    """The ids an Ollama-style name may mean: `x:latest` is x, `hf.co/<repo>...` is <repo>..."""
    out = []
    if name.endswith(":latest"):
        out.append(name[: -len(":latest")])
    if name.startswith("hf.co/"):
        out += [name[len("hf.co/"):], *_ollama_forms(name[len("hf.co/"):])]
    return out


class Catalog:
    """The models offered (`entries`, in the order registered) and the other names they
    answer to (`aliases`)."""

    def __init__(self, settings):
        self.settings = settings
        self.entries: OrderedDict[str, Entry] = OrderedDict()
        self.aliases: dict[str, str] = {}
        self.adapter_names: dict[str, tuple[str, int]] = {}  # `<model>+<adapter>` -> (model id, adapter id)
        self.fallback: str | None = None  # the one model named at startup (see `named`)
        self._reach: tuple[bool, float] | None = None  # (the Hub answers, when probed)

    def add(self, spec: str, alias: str | None = None, mmproj: str | None = None) -> Entry:
        """Register a model by local path, Hub id (see server.models.resolve), or `default`; a Hub
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
            raise ModelNotFound(spec, "no such file or directory" if spec.lower().endswith(".gguf") or os.sep in spec
                                else "neither a file here nor a Hub id (<repo>:<file>.gguf)")
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
        self.fetch(entry)
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
                entry.error = e.message
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
        entry.error = error.message if isinstance(error, APIError) else public(str(error))
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

    def fetch(self, entry: Entry) -> None:
        """Fetch a Hub entry's file and vision file (from the cache when offline), and describe it."""
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
            "architecture": d["architecture"],
            "parameters": d["parameters"],
            "kind": "embedding" if self.settings.pooling else FILE_KINDS.get(d["pooling_type"] or 0, "chat"),
        }

    def attach_adapters(self, entry: Entry, adapters: list[tuple[str, float]]) -> None:
        """The model's LoRA adapters (file, scale), loaded with it; each also listed as
        `<model id>+<file name without .gguf>`, which means that adapter alone at scale 1."""
        for path, scale in adapters:
            if not os.path.isfile(path):
                raise ModelNotFound(path, "no such LoRA adapter file (--lora)")
            adapter_id = self.add_adapter(entry, path, scale)
            name = f"{entry.id}+{os.path.basename(path).removesuffix('.gguf')}"
            self.name_adapter(entry, name if name not in self.adapter_names else f"{name}-{adapter_id}", adapter_id)

    def add_adapter(self, entry: Entry, path: str, scale: float = 0.0) -> int:
        """An adapter file of the model: its id (the next, never given before), run at `scale`
        by requests that name no adapters (0: only where a request names it; an adapter
        loaded at run time is served under a name, `name_adapter`, once it has loaded)."""
        adapter_id = len(entry.adapters)
        entry.adapters.append(os.path.abspath(path))
        entry.lora_scales[adapter_id] = scale
        return adapter_id

    def name_adapter(self, entry: Entry, name: str, adapter_id: int) -> None:
        self.adapter_names[name] = (entry.id, adapter_id)

    def remove_adapter(self, name: str) -> None:
        """An adapter unloaded at run time (its id is never given again)."""
        model_id, adapter_id = self.adapter_names.pop(name)
        entry = self.entries[model_id]
        entry.adapters[adapter_id] = None
        entry.lora_scales.pop(adapter_id, None)

    def adapter_names_of(self, model_id: str) -> list[str]:
        """The names its LoRA adapters are served under (`<model>+<adapter>`), in their order."""
        return [name for name, (base, _) in self.adapter_names.items() if base == model_id]

    def adapter_named(self, model_id: str | None) -> int | None:
        """The adapter id a model name means (`<model>+<adapter>`), or None."""
        got = self.adapter_names.get(model_id or "")
        return None if got is None else got[1]

    def get(self, model_id: str) -> Entry:
        """The entry of an id or alias, also as Ollama's clients write names: with `:latest`
        after it, or `hf.co/` before a Hub id."""
        entry = None
        for name in (model_id, *_ollama_forms(model_id)):
            entry = self.entries.get(name) or self.entries.get(self.aliases.get(name, "")) \
                or self.entries.get(self.adapter_names.get(name, ("",))[0])
            if entry is not None:
                break
        if entry is None and model_id == "default" and DEFAULT_MODEL_ID in self.entries:
            entry = self.entries[DEFAULT_MODEL_ID]
        if entry is None:
            served = list(self.entries)
            listed = ", ".join(served[:10]) + (f" and {len(served) - 10} more (GET /v1/models)" if len(served) > 10 else "")
            raise ModelNotFound(model_id, f"this server has {listed}" if served else "this server has none")
        return entry

    def sole(self) -> Entry | None:
        """The model that answers requests naming none: the one model named at startup, or
        the only one listed; None where there are several."""
        if self.fallback in self.entries:
            return self.entries[self.fallback]
        return next(iter(self.entries.values())) if len(self.entries) == 1 else None

    def named(self, model_id: str | None, kind: str | None = None) -> Entry:
        """The entry a request names. As llama-server does, a request naming no model, or
        one this server does not have, goes to the one model served (`sole`; replies name
        it), or for an endpoint of one `kind` ("embedding", "rerank") to the one model of that
        kind (text-embedding-3-small asked of a server with one embedding model among chat
        ones); --strict-model-names keeps an unknown name a 404. Several models and none
        named: a 400."""
        if model_id is not None:
            try:
                return self.get(model_id)
            except ModelNotFound:
                if self.settings.strict_model_names:
                    raise
                entry = self.sole() or self._sole_kind(kind)
                if entry is None:
                    raise
                return entry
        entry = self.sole() or self._sole_kind(kind)
        if entry is None:
            raise BadRequest(f"name the model: this server has {len(self.entries)}", param="model")
        return entry

    def _sole_kind(self, kind: str | None) -> Entry | None:
        """The one model of this kind the catalog knows, if there is exactly one."""
        if kind is None:
            return None
        of_kind = [e for e in self.entries.values() if (e.info or {}).get("kind") == kind and e.error is None]
        return of_kind[0] if len(of_kind) == 1 else None

    def answering(self, req, kind: str | None = None) -> None:
        """Make a request's `model` the id of the model that answers it (named; `kind`: the
        endpoint's), so that its reply names that model (an adapter's name, `<model>+<adapter>`, stays)."""
        entry = self.named(req.model, kind)
        req.model = req.model if self.adapter_named(req.model) is not None else entry.id
