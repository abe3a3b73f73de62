"""GGUF reader: memory-maps a file (or a set of shards), parses the header, the
metadata and the tensor table, and hands out zero-copy views of tensor bytes.

Opening reads the header and tables only; tensor bytes are touched when a caller
reads them. Every way a file can be malformed raises `GGUFError` naming the key, the
tensor or the byte offset at fault, and no count read from the file is trusted
before it is checked against the bytes that remain.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .constants import (
    ValueSpec,
    GGML_MAX_DIMS,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGUF_VERSIONS,
    TYPE_INFO,
    VALUE_FORMATS,
    GGMLType,
    GGUFValueType,
    Keys,
)
from .errors import GGUFError
from .quants import dequantize

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_MAX_ARRAY_NESTING = 8
_MIN_KV_BYTES = 8 + 4 + 1  # empty key, type, one-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # empty name, n_dims=0, type, offset
SHARD_PATTERN = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


@dataclass
class TensorInfo:
    """One tensor of the table. `shape` is in torch order (outermost first)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: GGMLType
    offset: int  # absolute byte offset in `path`
    nbytes: int
    path: str
    _base: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def data(self) -> np.ndarray:
        """Zero-copy uint8 view of the packed bytes, shaped (*shape[:-1], row_bytes)."""
        raw = self._base[self.offset : self.offset + self.nbytes]
        if not self.shape:
            return raw
        return raw.reshape(*self.shape[:-1], self.ggml_type.row_nbytes(self.shape[-1]))

    def array(self) -> np.ndarray:
        """Zero-copy typed view for unquantized types (BF16 as raw uint16)."""
        dtype = TYPE_INFO[self.ggml_type].dtype
        if dtype is None:
            raise TypeError(f"tensor {self.name!r} is {self.ggml_type.name}, a quantized type: use dequantize()")
        return self._base[self.offset : self.offset + self.nbytes].view(dtype).reshape(self.shape)

    def dequantize(self) -> np.ndarray:
        return dequantize(self.data, self.ggml_type, self.shape)


class _Parser:
    """Sequential, bounds-checked reads over one mapped file."""

    def __init__(self, buf: mmap.mmap | bytes, size: int, path: str):
        self.buf = buf
        self.size = size
        self.path = path
        self.pos = 0

    def fail(self, message: str, offset: int | None = None) -> GGUFError:
        return GGUFError(message, path=self.path, offset=self.pos if offset is None else offset)

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise self.fail(f"file truncated: {what} needs {n} bytes, {self.size - self.pos} remain")

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return v

    def string(self, what: str, strict: bool) -> str:
        start = self.pos
        n = self.u64(f"length of {what}")
        if n > self.size - self.pos:
            raise self.fail(f"{what}: string length {n} exceeds the {self.size - self.pos} bytes left", start)
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8", "strict" if strict else "surrogateescape")
        except UnicodeDecodeError as e:
            raise self.fail(f"{what} is not valid UTF-8 ({e.reason} at {e.start})", start) from None

    def count(self, what: str, min_item_bytes: int) -> int:
        start = self.pos
        n = self.u64(what)
        if n * min_item_bytes > self.size - self.pos:
            raise self.fail(f"{what} is {n}, more than the {self.size - self.pos} remaining bytes can hold", start)
        return n

    def value_type(self, what: str) -> GGUFValueType:
        start = self.pos
        code = self.u32(what)
        try:
            return GGUFValueType(code)
        except ValueError:
            raise self.fail(f"{what}: unknown value type code {code}", start) from None

    def value(self, vtype: GGUFValueType, key: str) -> tuple[Any, ValueSpec]:
        """Returns (value, its type spec)."""
        if vtype == GGUFValueType.STRING:
            return self.string(f"value of {key!r}", strict=False), vtype
        if vtype == GGUFValueType.ARRAY:
            return self.array(key, 0)
        fmt, dtype = VALUE_FORMATS[vtype]
        self.need(dtype.itemsize, f"value of {key!r}")
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += dtype.itemsize
        return v, vtype

    def array(self, key: str, depth: int) -> tuple[list, ValueSpec]:
        """An array whose element type comes next; returns (list, (ARRAY, element spec))."""
        if depth >= _MAX_ARRAY_NESTING:
            raise self.fail(f"value of {key!r}: arrays nested deeper than {_MAX_ARRAY_NESTING}")
        etype = self.value_type(f"array element type of {key!r}")
        if etype == GGUFValueType.STRING:
            n = self.count(f"array length of {key!r}", 8)
            return self._strings(n, key), (GGUFValueType.ARRAY, etype)
        if etype == GGUFValueType.ARRAY:
            n = self.count(f"array length of {key!r}", 12)
            items, spec = [], (GGUFValueType.ARRAY, (GGUFValueType.ARRAY, GGUFValueType.UINT8))
            for i in range(n):
                sub, sub_spec = self.array(key, depth + 1)
                if i == 0:
                    spec = (GGUFValueType.ARRAY, sub_spec)
                items.append(sub)
            return items, spec
        dtype = VALUE_FORMATS[etype][1]
        n = self.count(f"array length of {key!r}", dtype.itemsize)
        arr = np.frombuffer(self.buf, dtype=dtype, count=n, offset=self.pos)
        self.pos += n * dtype.itemsize
        if etype == GGUFValueType.BOOL:
            return [bool(b) for b in arr.view(np.uint8)], (GGUFValueType.ARRAY, etype)
        return arr.tolist(), (GGUFValueType.ARRAY, etype)

    def _strings(self, n: int, key: str) -> list[str]:
        buf, size, pos = self.buf, self.size, self.pos
        unpack = _U64.unpack_from
        out: list[str] = []
        append = out.append
        for i in range(n):
            if pos + 8 > size:
                self.pos = pos
                raise self.fail(f"file truncated in element {i} of array {key!r}")
            (length,) = unpack(buf, pos)
            pos += 8
            if length > size - pos:
                raise self.fail(f"element {i} of array {key!r}: string length {length} exceeds the file", pos - 8)
            append(buf[pos : pos + length].decode("utf-8", "surrogateescape"))
            pos += length
        self.pos = pos
        return out


def _map(path: str) -> tuple[mmap.mmap | bytes, int]:
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise GGUFError("file is empty", path=path)
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), size


MADV_POPULATE_READ = 22  # Linux 5.14+: fault the pages of a mapping in now (not in Python's mmap constants)
MADV_NOHUGEPAGE = getattr(mmap, "MADV_NOHUGEPAGE", 15)
PAGE = mmap.PAGESIZE
HUGE_PAGE = 2 << 20


def _gaps(spans: list[list[int]], size: int) -> list[tuple[int, int]]:
    """The parts of the 2 MB pages that sorted, disjoint `spans` touch which lie outside
    all of them (within [0, size))."""
    out: list[tuple[int, int]] = []
    for i, (a, b) in enumerate(spans):
        lo = max(a // HUGE_PAGE * HUGE_PAGE, spans[i - 1][1] if i else 0)
        hi = min(-(-b // HUGE_PAGE) * HUGE_PAGE, spans[i + 1][0] if i + 1 < len(spans) else size, size)
        if lo < a:
            out.append((lo, a))
        if b < hi:
            out.append((b, hi))
    return sorted(set(out))


class _File:
    """One parsed GGUF file (a whole model or one shard)."""

    def populate(self, start: int = 0, length: int | None = None) -> None:
        """Fault the pages of the map (or of [start, start + length), start a multiple of
        the page size) in now, from the page cache or the disk, so that the first pass
        over the weights does not: MADV_POPULATE_READ, else a read of one byte per page."""
        if not isinstance(self.buf, mmap.mmap):
            return
        length = self.size - start if length is None else length
        if length <= 0:
            return
        try:
            self.buf.madvise(MADV_POPULATE_READ, start, length)
            return
        except (OSError, ValueError, AttributeError):
            pass
        np.frombuffer(self.buf, dtype=np.uint8)[start : start + length : PAGE].max()

    def __init__(self, path: str):
        self.path = path
        self.buf, self.size = _map(path)
        p = _Parser(self.buf, self.size, path)
        p.need(4, "magic")
        magic = bytes(self.buf[0:4])
        if magic != GGUF_MAGIC:
            raise GGUFError(f"not a GGUF file: magic is {magic!r}, expected {GGUF_MAGIC!r}", path=path, offset=0)
        p.pos = 4
        version = p.u32("version")
        if version not in GGUF_VERSIONS:
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            if swapped in (1, 2, 3):
                raise GGUFError(
                    f"big-endian GGUF file (version {swapped} stored big-endian); only little-endian files are supported",
                    path=path, offset=4,
                )
            if version == 1:
                raise GGUFError("GGUF version 1 is obsolete and not supported; convert the model again", path=path, offset=4)
            raise GGUFError(f"unsupported GGUF version {version}, expected one of {GGUF_VERSIONS}", path=path, offset=4)
        self.version = version
        n_tensors = p.count("tensor count", _MIN_TENSOR_INFO_BYTES)
        n_kv = p.count("metadata key/value count", _MIN_KV_BYTES)

        self.metadata: dict[str, Any] = {}
        self.metadata_types: dict[str, ValueSpec] = {}
        for i in range(n_kv):
            start = p.pos
            key = p.string(f"key of metadata entry {i}", strict=True)
            if key in self.metadata:
                raise GGUFError(f"duplicate metadata key {key!r}", path=path, offset=start)
            vtype = p.value_type(f"value type of {key!r}")
            value, spec = p.value(vtype, key)
            self.metadata[key] = value
            self.metadata_types[key] = spec

        self.alignment = GGUF_DEFAULT_ALIGNMENT
        if Keys.ALIGNMENT in self.metadata:
            a = self.metadata[Keys.ALIGNMENT]
            if self.metadata_types[Keys.ALIGNMENT] != GGUFValueType.UINT32 or a <= 0 or a & (a - 1):
                raise GGUFError(f"{Keys.ALIGNMENT!r} must be a power-of-two UINT32, got {a!r}", path=path)
            self.alignment = a

        infos = []
        names = set()
        for i in range(n_tensors):
            start = p.pos
            name = p.string(f"name of tensor {i}", strict=True)
            if name in names:
                raise GGUFError(f"duplicate tensor name {name!r}", path=path, offset=start)
            names.add(name)
            n_dims = p.u32(f"dimension count of tensor {name!r}")
            if n_dims > GGML_MAX_DIMS:
                raise GGUFError(f"tensor {name!r} has {n_dims} dimensions, at most {GGML_MAX_DIMS} allowed", path=path, offset=start)
            dims = [p.u64(f"dimension {d} of tensor {name!r}") for d in range(n_dims)]
            code_at = p.pos
            code = p.u32(f"type of tensor {name!r}")
            try:
                gtype = GGMLType(code)
            except ValueError:
                raise GGUFError(f"tensor {name!r} has unknown ggml type code {code}", path=path, offset=code_at) from None
            rel = p.u64(f"data offset of tensor {name!r}")
            infos.append((name, dims, gtype, rel, start))

        self.data_offset = -(-p.pos // self.alignment) * self.alignment
        if infos and self.data_offset > self.size:
            raise GGUFError(f"file truncated: tensor data would start at byte {self.data_offset}", path=path, offset=self.size)

        self.tensors: OrderedDict[str, TensorInfo] = OrderedDict()
        base = np.frombuffer(self.buf, dtype=np.uint8) if infos else None
        spans = []
        for name, dims, gtype, rel, start in infos:
            info = TYPE_INFO[gtype]
            n = 1
            for d in dims:
                n *= d
            if dims and dims[0] % info.block_size:
                raise GGUFError(
                    f"tensor {name!r} ({gtype.name}): row length {dims[0]} is not a multiple of the block size {info.block_size}",
                    path=path, offset=start,
                )
            nbytes = n // info.block_size * info.type_size
            if rel % self.alignment:
                raise GGUFError(f"tensor {name!r}: data offset {rel} is not aligned to {self.alignment}", path=path, offset=start)
            absolute = self.data_offset + rel
            if nbytes > self.size or absolute > self.size - nbytes:
                raise GGUFError(
                    f"tensor {name!r}: data [{absolute}, {absolute + nbytes}) lies beyond the end of the file ({self.size} bytes)",
                    path=path, offset=start,
                )
            spans.append((absolute, nbytes, name))
            self.tensors[name] = TensorInfo(name, tuple(reversed(dims)), gtype, absolute, nbytes, path, base)
        spans.sort()
        for (a0, n0, name0), (a1, _, name1) in zip(spans, spans[1:]):
            if a0 + n0 > a1:
                raise GGUFError(f"tensors {name0!r} and {name1!r} overlap at byte {a1}", path=path, offset=a1)


class GGUFReader:
    """A GGUF model: one file, or all shards of a split model opened as one.

    `metadata` maps keys to Python values (arrays as lists); `tensors` maps names to
    `TensorInfo` in file order. Opening parses tables only.
    """

    def __init__(self, path: str | os.PathLike):
        path = str(path)
        first = _File(path)
        files = [first]
        n_split = first.metadata.get(Keys.SPLIT_COUNT, 1)
        if isinstance(n_split, int) and not isinstance(n_split, bool) and n_split > 1:
            files = self._open_shards(first, n_split)
        self.files = files
        head = files[0]
        self.path = head.path
        self.version = head.version
        self.metadata = head.metadata
        self.metadata_types = head.metadata_types
        self.alignment = head.alignment
        self.data_offset = head.data_offset
        self.tensors: OrderedDict[str, TensorInfo] = OrderedDict()
        for f in files:
            for name, t in f.tensors.items():
                if name in self.tensors:
                    raise GGUFError(f"tensor {name!r} appears in more than one shard", path=f.path)
                self.tensors[name] = t

    def populate(self) -> None:
        """Fault the whole mapped file in now (see _File.populate); the engine does this
        at load, as llama.cpp's MAP_POPULATE does."""
        for f in self.files:
            f.populate()

    def release(self, infos: list[TensorInfo]) -> None:
        """Drop the process's mapping of the whole pages inside these tensors' bytes: for
        tensors a consumer has copied (the CPU kernels' repacked layouts), whose pages
        would otherwise count twice. The map is a read-only file map, so the bytes stay
        the file's and come back from the page cache if read again. Where the kernel maps
        the file in 2 MB pages, unmapping part of one unmaps all of it: those ranges are
        first marked for small pages, and the neighbours' parts of such 2 MB pages are
        mapped again (as at load, populate())."""
        for f in self.files:
            if not isinstance(f.buf, mmap.mmap):
                continue
            spans = sorted((-(-t.offset // PAGE) * PAGE, (t.offset + t.nbytes) // PAGE * PAGE)
                           for t in infos if t.path == f.path)
            merged: list[list[int]] = []
            for a, b in spans:
                if b <= a:
                    continue
                if merged and a <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], b)
                else:
                    merged.append([a, b])
            try:
                for a, b in merged:
                    f.buf.madvise(MADV_NOHUGEPAGE, a, b - a)
                    f.buf.madvise(mmap.MADV_DONTNEED, a, b - a)
            except (OSError, ValueError, AttributeError):  # not Linux: the pages stay
                continue
            for lo, hi in _gaps(merged, f.size):
                f.populate(lo, hi - lo)

    @staticmethod
    def _open_shards(first: _File, n_split: int) -> list[_File]:
        m = SHARD_PATTERN.match(os.path.basename(first.path))
        if m is None:
            raise GGUFError(
                f"file declares {Keys.SPLIT_COUNT}={n_split} but its name does not follow "
                "'<name>-00001-of-0000N.gguf'", path=first.path)
        if int(m["count"]) != n_split:
            raise GGUFError(f"name says {int(m['count'])} shards, {Keys.SPLIT_COUNT} says {n_split}", path=first.path)
        folder = os.path.dirname(first.path)
        paths = [os.path.join(folder, f"{m['prefix']}-{i:05d}-of-{n_split:05d}.gguf") for i in range(1, n_split + 1)]
        files = []
        for i, p in enumerate(paths):
            if os.path.abspath(p) == os.path.abspath(first.path):
                f = first
            elif not os.path.exists(p):
                raise GGUFError(f"shard {i + 1} of {n_split} is missing: {p}", path=first.path)
            else:
                f = _File(p)
            if f.metadata.get(Keys.SPLIT_NO) != i or f.metadata.get(Keys.SPLIT_COUNT) != n_split:
                raise GGUFError(
                    f"expected shard {Keys.SPLIT_NO}={i} of {n_split}, got "
                    f"{Keys.SPLIT_NO}={f.metadata.get(Keys.SPLIT_NO)!r} of {f.metadata.get(Keys.SPLIT_COUNT)!r}",
                    path=p)
            files.append(f)
        expected = files[0].metadata.get(Keys.SPLIT_TENSORS_COUNT)
        total = sum(len(f.tensors) for f in files)
        if expected is not None and expected != total:
            raise GGUFError(f"{Keys.SPLIT_TENSORS_COUNT}={expected} but the shards hold {total} tensors", path=files[0].path)
        return files

    @property
    def architecture(self) -> str | None:
        return self.metadata.get(Keys.ARCHITECTURE)

    def get(self, key: str, default: Any = None) -> Any:
        """Metadata value; `{arch}` in `key` is replaced by the file's architecture."""
        if "{arch}" in key:
            key = key.format(arch=self.architecture)
        return self.metadata.get(key, default)

    def close(self) -> None:
        """Drop references to the maps; views already handed out stay valid."""
        for f in self.files:
            f.buf = None
        self.files = []

    def __enter__(self) -> "GGUFReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFReader({self.path!r}, v{self.version}, {len(self.metadata)} keys, {len(self.tensors)} tensors)"


def shard_paths(path: str | os.PathLike) -> list[Path]:
    """All files of the model at `path` (one, or every shard), in order."""
    return [Path(f.path) for f in GGUFReader(path).files]
