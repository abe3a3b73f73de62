"""The prompt cache's disk tier (--cache-disk DIR): what a kept slot held, written to a
file when the slot is evicted from RAM or its model unloads, and read back into a slot
when a later prompt (in this process or one started later) starts with its tokens.

A file holds a sequence's token ids and its cache state (KVCache.export_points): every
position's keys and values in the layers that keep them all, and the lossy layers'
state (recurrent, a ring shorter than the context) at the sequence's end and at its
latest checkpoints, the only positions such a model can go on from. Files live in a
folder per model identity (its file's size, modification time and first MiB, its
architecture and cache layout), and each names the adapters (their files' identity and
scales) its state was computed with: a changed model or adapter file never finds them.

Written atomically (a temporary file renamed), each tensor with its CRC-32, checked on
read: a damaged or truncated file is deleted and the prompt prefilled as if there were
none. The folder stays within its byte budget, least recently used files (by
modification time, set again on each read) deleted first, whichever model wrote them.
Writes run on a thread of their own from copies taken between steps (at most
MAX_PENDING bytes of them at once, or one larger copy; the model's memory counts them);
reads run on the scheduler's thread, in the step
that admits the prompt."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import struct
import tempfile
import threading
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

log = logging.getLogger("gguf_serve.engine")

MAGIC, VERSION = b"GGUF-SERVE-PROMPT", 1
SUFFIX = ".prompt"
MIN_TOKENS = 256  # shorter sequences are cheaper to prefill again than to keep
MAX_PENDING = 256 << 20  # bytes of copies waiting to be written (or one copy, when larger); an eviction beyond
# it is not written
DEFAULT_BUDGET = 10 << 30  # the folder's default size: at most this, and half the disk's free space


class DiskCacheError(ValueError):
    """A cache file that cannot be served: damaged, truncated, or not this tier's."""


@dataclass
class Entry:
    """One file: the tokens its state stands for, the adapters it was computed under, and
    the positions a sequence can go on from (empty: any it holds)."""

    path: str
    tokens: np.ndarray
    adapters: str
    points: tuple[int, ...]
    nbytes: int
    header: dict = field(repr=False, default_factory=dict)


@dataclass
class DiskStats:
    written: int = 0
    hits: int = 0
    dropped: int = 0  # damaged files found and deleted
    skipped: int = 0  # evictions not written: too many bytes waiting


def file_identity(path: str, head: int = 1 << 20) -> str:
    """A file's size, modification time and first `head` bytes, hashed."""
    st = os.stat(path)
    h = hashlib.sha256(f"{st.st_size}:{st.st_mtime_ns}:".encode())
    with open(path, "rb") as f:
        h.update(f.read(head))
    return h.hexdigest()


def cache_identity(lm) -> dict:
    """What a state file must match to be read into a model's cache: the model's kind and
    the cache's layout (a slot file's identity)."""
    return {"architecture": lm.architecture.name, "vocab_size": lm.model.vocab_size,
            "layout": [list(x) for x in lm.cache.layout()]}


def model_identity(lm) -> dict:
    """What the files of a model's folder must match: its file and the cache's layout."""
    return {"file": file_identity(lm.gguf.path), **cache_identity(lm)}


def default_budget(folder: str) -> int:
    os.makedirs(folder, exist_ok=True)
    return min(DEFAULT_BUDGET, shutil.disk_usage(folder).free // 2)


class DiskCache:
    def __init__(self, folder: str, ident: dict, lossy: bool, budget: int | None = None,
                 adapter_path: Callable[[int], str | None] = lambda i: None, min_tokens: int = MIN_TOKENS):
        """`ident`: the model's identity (model_identity); `lossy`: whether its cache can go
        on only from an end or a checkpoint (KVCache.lossy); `adapter_path`: an adapter's
        file by its id (None: not loaded), asked when a key names it."""
        self.root = os.path.abspath(folder)
        self.ident, self.lossy, self.min_tokens = ident, lossy, min_tokens
        key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:24]
        self.folder = os.path.join(self.root, key)
        os.makedirs(self.folder, exist_ok=True)
        self.budget = budget if budget is not None else default_budget(self.root)
        self.adapter_path = adapter_path
        self._adapter_ids: dict[str, str] = {}
        self.index: dict[str, Entry] = {}
        self.stats = DiskStats()
        self._lock = threading.Lock()
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="cache-disk")
        self._pending: list[Future] = []
        self._pending_bytes = 0
        self.max_pending = MAX_PENDING
        self._scan()

    @classmethod
    def for_model(cls, lm, folder: str, budget: int | None = None) -> "DiskCache":
        def adapter_path(i: int) -> str | None:  # the adapters loaded when asked: they load and unload at run time
            a = lm.adapters.get(i)
            return a.path if a is not None else None

        return cls(folder, model_identity(lm), lm.cache.lossy(), budget, adapter_path)

    @property
    def nbytes(self) -> int:
        """The bytes of this model's files."""
        with self._lock:
            return sum(e.nbytes for e in self.index.values())

    def describe(self) -> str:
        return (f"prompt cache on disk: {self.folder}, {len(self.index)} file(s) of this model "
                f"({self.nbytes / 2**20:.0f} MiB); the folder holds at most {self.budget / 2**30:.1f} GiB")

    # ------------------------------------------------------------------ keys

    def adapters(self, key: tuple) -> str | None:
        """The adapters of a prefix-cache key ((id, scale), ...) as their files' identity;
        None where one is no longer loaded."""
        parts = []
        for adapter_id, scale in key:
            path = self.adapter_path(adapter_id)
            if path is None:
                return None
            if path not in self._adapter_ids:
                self._adapter_ids[path] = file_identity(path)
            parts.append(f"{self._adapter_ids[path]}*{float(scale)!r}")
        return ";".join(parts)

    # ------------------------------------------------------------------ lookup

    def find(self, prompt: list[int], adapters: str) -> tuple[Entry | None, int]:
        """The file whose state covers most of `prompt` (one token always left to feed), and
        the position to go on from; (None, 0) where none does."""
        if len(prompt) <= self.min_tokens // 2 or not self.index:
            return None, 0
        want = np.asarray(prompt[:len(prompt) - 1], dtype=np.int64)
        best, best_n = None, 0
        with self._lock:
            entries = list(self.index.values())
        for e in entries:
            if e.adapters != adapters:
                continue
            m = min(len(e.tokens), len(want))
            diff = np.flatnonzero(e.tokens[:m] != want[:m])
            n = int(diff[0]) if diff.size else m
            if e.points:
                n = max((p for p in e.points if p <= n), default=0)
            if n > best_n:
                best, best_n = e, n
        return best, best_n

    def covered(self, tokens: list[int], adapters: str) -> bool:
        """Whether a file already holds this sequence's state (and can go on from its end)."""
        n = len(tokens)
        want = np.asarray(tokens, dtype=np.int64)
        with self._lock:
            entries = list(self.index.values())
        return any(e.adapters == adapters and len(e.tokens) >= n and np.array_equal(e.tokens[:n], want)
                   and (not e.points or n in e.points) for e in entries)

    def wants(self, tokens: list[int] | None, adapters: str) -> bool:
        return bool(tokens) and len(tokens) >= self.min_tokens and min(tokens) >= 0 and not self.covered(
            tokens, adapters)

    # ------------------------------------------------------------------ writing

    def room(self, nbytes: int, wait: bool = False) -> bool:
        """Whether copies of `nbytes` may wait to be written now (`wait`: waiting for the
        writes under way where they hold too much); counted as skipped where not."""
        if wait and self._pending_bytes and self._pending_bytes + nbytes > self.max_pending:
            self.flush()
        with self._lock:
            if self._pending_bytes and self._pending_bytes + nbytes > self.max_pending:
                self.stats.skipped += 1
                return False
        return True

    def put(self, tokens: list[int], adapters: str, full: dict[int, tuple], points: dict[int, dict[int, tuple]]):
        """Write a sequence's state (KVCache.export_points' copies, taken where `room`
        said so) on the writer's thread."""
        nbytes = sum(t.numel() * t.element_size() for parts in (full, *points.values()) for pair in parts.values()
                     for t in pair)
        with self._lock:
            self._pending_bytes += nbytes
        future = self._writer.submit(self._write, list(tokens), adapters, full, points, nbytes)
        self._pending = [f for f in self._pending if not f.done()] + [future]

    def flush(self) -> None:
        """Wait for the writes under way."""
        for f in list(self._pending):
            f.exception()
        self._pending = []

    def close(self) -> None:
        self.flush()
        self._writer.shutdown(wait=True)

    def _write(self, tokens, adapters, full, points, nbytes) -> None:
        try:
            self._write_file(tokens, adapters, full, points)
        except Exception:  # a full disk, a folder gone: the cache goes on without this file
            log.exception("prompt cache: writing a file to %s failed", self.folder)
        finally:
            with self._lock:
                self._pending_bytes -= nbytes

    def _write_file(self, tokens, adapters, full, points) -> None:
        name = hashlib.sha256(adapters.encode() + np.asarray(tokens, dtype=np.int64).tobytes()).hexdigest()[:32]
        path = os.path.join(self.folder, name + SUFFIX)
        header = write_state(path, {"model": self.ident, "adapters": adapters}, tokens, full, points, self.lossy)
        entry = self._entry(path, header)
        with self._lock:
            self.index[path] = entry
            superseded = [e for e in self.index.values() if not self.lossy and e is not entry and
                          e.adapters == adapters and len(e.tokens) < len(tokens) and
                          np.array_equal(e.tokens, entry.tokens[:len(e.tokens)])]
            self.stats.written += 1
        for e in superseded:  # a shorter file of the same sequence (the last turn of this conversation)
            self._drop(e, damaged=False)
        self._keep_within_budget()

    def _keep_within_budget(self) -> None:
        files = []
        for folder, _, names in os.walk(self.root):
            for n in names:
                if n.endswith(SUFFIX):
                    p = os.path.join(folder, n)
                    try:
                        st = os.stat(p)
                    except FileNotFoundError:
                        continue
                    files.append((st.st_mtime_ns, st.st_size, p))
        total = sum(size for _, size, _ in files)
        for _, size, p in sorted(files):
            if total <= self.budget:
                break
            with self._lock:
                e = self.index.get(p)
            if e is not None:
                self._drop(e, damaged=False)
            else:
                _unlink(p)  # another model's
            total -= size

    # ------------------------------------------------------------------ reading

    def read(self, entry: Entry, pos: int) -> tuple[dict[int, tuple], dict[int, tuple]]:
        """A file's state at `pos` (one of its points, or any position where it has none):
        the full layers' keys and values of every position it holds, and the lossy layers'
        at `pos`; DiskCacheError, the file deleted, where it is damaged."""
        try:
            if entry.points and pos not in entry.points:
                raise DiskCacheError(f"no state at {pos}")
            full, lossy = read_tensors(entry.path, entry.header, pos)
        except (OSError, ValueError, RuntimeError, KeyError, TypeError) as e:
            self._drop(entry, damaged=True)
            raise DiskCacheError(f"prompt cache file {os.path.basename(entry.path)} is damaged ({e}); dropped") \
                from None
        with self._lock:
            self.stats.hits += 1
        try:
            os.utime(entry.path)  # recently used: evicted last
        except OSError:
            pass
        return full, lossy

    # ------------------------------------------------------------------ the folder

    def _scan(self) -> None:
        for name in os.listdir(self.folder):
            path = os.path.join(self.folder, name)
            if name.startswith(".writing-"):
                _unlink(path)  # a write cut short by the process's end
            elif name.endswith(SUFFIX):
                try:
                    header = read_header(path)
                    if header["model"] != self.ident:
                        raise DiskCacheError("another model's")
                    entry = self._entry(path, header)
                except (OSError, ValueError, KeyError, TypeError):
                    _unlink(path)
                    self.stats.dropped += 1
                    continue
                self.index[path] = entry

    def _entry(self, path: str, header: dict) -> Entry:
        """An index entry; the header it keeps is what reading the file needs (its tensor
        table), not its tokens again."""
        return Entry(path, np.asarray(header["tokens"], dtype=np.int64), header["adapters"],
                     tuple(int(p) for p in header["points"]), os.path.getsize(path),
                     {k: v for k, v in header.items() if k != "tokens"})

    def _drop(self, entry: Entry, damaged: bool) -> None:
        with self._lock:
            if self.index.pop(entry.path, None) is not None:
                self.stats.dropped += damaged
        _unlink(entry.path)


def write_state(path: str, header: dict, tokens: list[int], full: dict[int, tuple], points: dict[int, dict],
                lossy: bool) -> dict:
    """Write a sequence's state (KVCache.export_points' parts: `full` by layer, the lossy
    layers' `points` by position then layer) to `path` atomically, `header` (what it must
    match to be read back) beside its tokens, points and tensor table; the header written."""
    tensors = [(i, part, None, t) for i, pair in sorted(full.items()) for part, t in zip("kv", pair)]
    tensors += [(i, part, p, t) for p, layers in sorted(points.items()) for i, pair in sorted(layers.items())
                for part, t in zip("ab", pair)]
    blobs, table, offset = [], [], 0
    for layer, part, point, t in tensors:
        raw = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
        table.append({"layer": layer, "part": part, "point": point, "dtype": str(t.dtype).removeprefix("torch."),
                      "shape": list(t.shape), "offset": offset, "nbytes": raw.nbytes, "crc": zlib.crc32(raw)})
        blobs.append(raw)
        offset += raw.nbytes
    header = {**header, "tokens": [int(t) for t in tokens], "points": sorted(points) if lossy else [],
              "tensors": table}
    head = json.dumps(header).encode()
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".writing-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + struct.pack("<IQI", VERSION, len(head), zlib.crc32(head)) + head)
            for raw in blobs:
                f.write(memoryview(raw))
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    header["_start"] = len(MAGIC) + 16 + len(head)
    return header


def read_tensors(path: str, header: dict, pos: int) -> tuple[dict[int, tuple], dict[int, tuple]]:
    """A state file's full layers' keys and values and its lossy layers' state at `pos` (its
    header from read_header), each tensor's checksum checked; DiskCacheError where the
    file is truncated or damaged."""
    start = header["_start"]
    full: dict[int, list] = {}
    lossy: dict[int, list] = {}
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        for t in header["tensors"]:
            if t["point"] is not None and t["point"] != pos:
                continue
            if start + t["offset"] + t["nbytes"] > size:
                raise DiskCacheError("truncated")
            buf = torch.empty(t["nbytes"], dtype=torch.uint8)
            f.seek(start + t["offset"])
            if f.readinto(buf.numpy()) != t["nbytes"]:
                raise DiskCacheError("truncated")
            if zlib.crc32(buf.numpy()) != t["crc"]:
                raise DiskCacheError(f"layer {t['layer']}'s checksum differs")
            value = buf.view(getattr(torch, t["dtype"])).view(t["shape"])
            (lossy if t["point"] is not None else full).setdefault(t["layer"], [None, None])[t["part"] in "vb"] = value
    return {i: tuple(p) for i, p in full.items()}, {i: tuple(p) for i, p in lossy.items()}


def read_header(path: str) -> dict:
    """A state file's header (what it was written with, its tokens, points and tensor
    table), checked."""
    with open(path, "rb") as f:
        lead = f.read(len(MAGIC) + 16)
        if len(lead) < len(MAGIC) + 16 or not lead.startswith(MAGIC):
            raise DiskCacheError("not a prompt cache file")
        version, n, crc = struct.unpack("<IQI", lead[len(MAGIC):])
        if version != VERSION or n > 1 << 30:
            raise DiskCacheError(f"version {version}")
        head = f.read(n)
    if len(head) != n or zlib.crc32(head) != crc:
        raise DiskCacheError("its header is damaged")
    header = json.loads(head)
    header["_start"] = len(MAGIC) + 16 + n
    return header


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
