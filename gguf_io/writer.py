"""GGUF writer: metadata of every value type, tensors from numpy arrays, packed blocks
or callables, written in one streaming pass to a temporary file that replaces the
target only when complete.

Phases: while open, `add` metadata and `add_tensor` tensors (a callable source is not
called yet); `write()` (or leaving the `with` block) lays out the header, then pulls
each tensor's bytes in order, so no more than one tensor sits in memory at a time.
"""

from __future__ import annotations

import os
import struct
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Sequence, Union

import numpy as np

from .constants import (
    GGML_MAX_DIMS,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    INT_RANGES,
    TYPE_INFO,
    VALUE_FORMATS,
    GGMLType,
    GGUFValueType,
    Keys,
    ValueSpec,
)
from .quants import quantize

MAX_TENSOR_NAME_BYTES = 63  # ggml's GGML_MAX_NAME minus the terminator

_DTYPE_TO_GGML = {
    np.dtype("float32"): GGMLType.F32,
    np.dtype("float16"): GGMLType.F16,
    np.dtype("float64"): GGMLType.F64,
    np.dtype("int8"): GGMLType.I8,
    np.dtype("int16"): GGMLType.I16,
    np.dtype("int32"): GGMLType.I32,
    np.dtype("int64"): GGMLType.I64,
}

_DTYPE_TO_VALUE = {dtype.newbyteorder("="): vt for vt, (_, dtype) in VALUE_FORMATS.items()}

TensorSource = Union[np.ndarray, Callable[[], np.ndarray]]


@dataclass
class _Tensor:
    name: str
    shape: tuple[int, ...]  # torch order
    ggml_type: GGMLType
    nbytes: int
    source: TensorSource


def infer_spec(value: Any) -> ValueSpec:
    """The metadata type llama.cpp expects for a Python value."""
    if isinstance(value, (bool, np.bool_)):
        return GGUFValueType.BOOL
    if isinstance(value, np.generic):
        return _DTYPE_TO_VALUE[value.dtype.newbyteorder("=")]
    if isinstance(value, int):
        if 0 <= value < 2**32:
            return GGUFValueType.UINT32
        if -(2**31) <= value < 2**31:
            return GGUFValueType.INT32
        return GGUFValueType.INT64 if value < 2**63 else GGUFValueType.UINT64
    if isinstance(value, float):
        return GGUFValueType.FLOAT32
    if isinstance(value, str):
        return GGUFValueType.STRING
    if isinstance(value, np.ndarray):
        return (GGUFValueType.ARRAY, _DTYPE_TO_VALUE[value.dtype.newbyteorder("=")])
    if isinstance(value, (list, tuple)):
        return (GGUFValueType.ARRAY, _element_spec(list(value)))
    raise TypeError(f"no GGUF type for a value of type {type(value).__name__}")


def _element_spec(items: list) -> ValueSpec:
    if not items:
        return GGUFValueType.INT32
    if all(isinstance(v, str) for v in items):
        return GGUFValueType.STRING
    if all(isinstance(v, (bool, np.bool_)) for v in items):
        return GGUFValueType.BOOL
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in items):
        lo, hi = min(items), max(items)
        return GGUFValueType.INT32 if -(2**31) <= lo and hi < 2**31 else GGUFValueType.INT64
    if all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in items):
        return GGUFValueType.FLOAT32
    if all(isinstance(v, (list, tuple, np.ndarray)) for v in items):
        return infer_spec(items[0])
    raise TypeError("array elements must share one type")


def encode_value(value: Any, spec: ValueSpec, key: str = "") -> bytes:
    """Bytes of a value of type `spec`, without the leading type code."""
    if isinstance(spec, tuple):
        _, elem = spec
        items = value.tolist() if isinstance(value, np.ndarray) else list(value)
        etype = elem[0] if isinstance(elem, tuple) else elem
        head = struct.pack("<IQ", etype, len(items))
        if etype == GGUFValueType.STRING:
            parts = [head]
            for s in items:
                b = s.encode("utf-8", "surrogateescape")
                parts.append(struct.pack("<Q", len(b)))
                parts.append(b)
            return b"".join(parts)
        if etype == GGUFValueType.ARRAY:
            return head + b"".join(encode_value(v, elem, key) for v in items)
        dtype = VALUE_FORMATS[GGUFValueType(etype)][1]
        if etype in INT_RANGES and items:
            lo, hi = INT_RANGES[GGUFValueType(etype)]
            if min(items) < lo or max(items) > hi:
                raise ValueError(f"metadata {key!r}: array values do not fit {GGUFValueType(etype).name}")
        return head + np.asarray(items, dtype=dtype).tobytes()
    spec = GGUFValueType(spec)
    if spec == GGUFValueType.STRING:
        b = str(value).encode("utf-8", "surrogateescape")
        return struct.pack("<Q", len(b)) + b
    if spec == GGUFValueType.ARRAY:
        raise ValueError(f"metadata {key!r}: give arrays as (ARRAY, element type)")
    if spec in INT_RANGES:
        lo, hi = INT_RANGES[spec]
        if not lo <= int(value) <= hi:
            raise ValueError(f"metadata {key!r}: {value} does not fit {spec.name}")
        value = int(value)
    return struct.pack(VALUE_FORMATS[spec][0], value)


class GGUFWriter:
    """Writes one GGUF file atomically. Use as a context manager or call `write()`."""

    def __init__(self, path: str | os.PathLike, *, alignment: int | None = None, version: int = 3):
        self.path = os.fspath(path)
        self.version = version
        self.metadata: dict[str, tuple[Any, ValueSpec]] = {}
        self.tensors: dict[str, _Tensor] = {}
        self.alignment = GGUF_DEFAULT_ALIGNMENT
        self._written = False
        if alignment is not None:
            self.add(Keys.ALIGNMENT, alignment, GGUFValueType.UINT32)

    # ------------------------------------------------------------- building

    def _check_open(self) -> None:
        if self._written:
            raise RuntimeError(f"{self.path}: already written; nothing more can be added")

    def add(self, key: str, value: Any, spec: ValueSpec | None = None) -> None:
        """Add a metadata entry; its type is inferred unless `spec` is given."""
        self._check_open()
        if key in self.metadata:
            raise ValueError(f"duplicate metadata key {key!r}")
        spec = infer_spec(value) if spec is None else spec
        encode_value(value, spec, key)  # validate now, not at write time
        if key == Keys.ALIGNMENT:
            if spec != GGUFValueType.UINT32 or value <= 0 or value & (value - 1):
                raise ValueError(f"{Keys.ALIGNMENT} must be a power-of-two UINT32, got {value!r}")
            self.alignment = int(value)
        self.metadata[key] = (value, spec)

    def add_tensor(
        self,
        name: str,
        data: TensorSource,
        *,
        ggml_type: GGMLType | int | None = None,
        shape: Sequence[int] | None = None,
    ) -> None:
        """Add a tensor.

        - `data` a float/int numpy array, no `ggml_type`: stored in its own dtype.
        - `data` a float array and a `ggml_type`: quantized to that type while writing.
        - `data` uint8 bytes (packed blocks, or raw F32/F16/BF16 …) and a `ggml_type`: stored as is;
          `shape` (torch order) defaults to the rows implied by the byte count.
        - `data` a callable: called at write time; `ggml_type` and `shape` required.
        """
        self._check_open()
        if name in self.tensors:
            raise ValueError(f"duplicate tensor name {name!r}")
        if len(name.encode()) > MAX_TENSOR_NAME_BYTES:
            raise ValueError(f"tensor name {name!r} is longer than {MAX_TENSOR_NAME_BYTES} bytes")
        quantize_on_write = False
        if callable(data):
            if ggml_type is None or shape is None:
                raise ValueError(f"tensor {name!r}: a callable source needs ggml_type and shape")
            gtype, shp = GGMLType(ggml_type), tuple(int(d) for d in shape)
            quantize_on_write = None  # decided when called
        else:
            arr = np.asarray(data)
            if ggml_type is None:
                gtype = _DTYPE_TO_GGML.get(arr.dtype.newbyteorder("="))
                if gtype is None:
                    raise ValueError(f"tensor {name!r}: no ggml type for dtype {arr.dtype}; pass ggml_type")
                shp = arr.shape if shape is None else tuple(shape)
            else:
                gtype = GGMLType(ggml_type)
                info = TYPE_INFO[gtype]
                if arr.dtype == np.uint8:  # raw bytes of any type (no ggml type is stored as uint8)
                    rows = arr.shape[:-1] if arr.ndim else ()
                    last = arr.shape[-1] // info.type_size * info.block_size if arr.ndim else 0
                    shp = tuple(shape) if shape is not None else (*rows, last)
                else:
                    shp = arr.shape if shape is None else tuple(shape)
                    quantize_on_write = gtype != _DTYPE_TO_GGML.get(arr.dtype.newbyteorder("="))
            data = arr
        if len(shp) > GGML_MAX_DIMS:
            raise ValueError(f"tensor {name!r}: {len(shp)} dimensions, at most {GGML_MAX_DIMS}")
        info = TYPE_INFO[gtype]
        if shp and shp[-1] % info.block_size:
            raise ValueError(f"tensor {name!r}: row length {shp[-1]} is not a multiple of {gtype.name}'s block size {info.block_size}")
        n = int(np.prod(shp, dtype=np.int64)) if shp else 1
        nbytes = n // info.block_size * info.type_size
        if not callable(data) and not quantize_on_write and data.nbytes != nbytes:
            raise ValueError(f"tensor {name!r}: {gtype.name} of shape {shp} needs {nbytes} bytes, data has {data.nbytes}")
        self.tensors[name] = _Tensor(name, shp, gtype, nbytes, data)

    # -------------------------------------------------------------- writing

    def _header(self) -> bytes:
        parts = [GGUF_MAGIC, struct.pack("<IQQ", self.version, len(self.tensors), len(self.metadata))]
        for key, (value, spec) in self.metadata.items():
            kb = key.encode("utf-8")
            top = spec[0] if isinstance(spec, tuple) else spec
            parts += [struct.pack("<Q", len(kb)), kb, struct.pack("<I", top), encode_value(value, spec, key)]
        offset = 0
        for t in self.tensors.values():
            nb = t.name.encode("utf-8")
            dims = tuple(reversed(t.shape))
            parts += [struct.pack("<Q", len(nb)), nb, struct.pack("<I", len(dims)),
                      struct.pack(f"<{len(dims)}Q", *dims), struct.pack("<IQ", t.ggml_type, offset)]
            offset += -(-t.nbytes // self.alignment) * self.alignment
        return b"".join(parts)

    def _tensor_bytes(self, t: _Tensor) -> np.ndarray:
        data = t.source() if callable(t.source) else t.source
        arr = np.asarray(data)
        packed = arr.dtype == np.uint8
        if not packed and _DTYPE_TO_GGML.get(arr.dtype.newbyteorder("=")) != t.ggml_type:
            arr = quantize(arr.reshape(t.shape), t.ggml_type)
        raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        if raw.nbytes != t.nbytes:
            raise ValueError(f"tensor {t.name!r}: source gave {raw.nbytes} bytes, expected {t.nbytes}")
        return raw

    def write(self) -> None:
        self._check_open()
        self._written = True
        folder = os.path.dirname(os.path.abspath(self.path))
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".gguf", dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                header = self._header()
                f.write(header)
                f.write(b"\0" * (-len(header) % self.alignment))
                for t in self.tensors.values():
                    raw = self._tensor_bytes(t)
                    f.write(memoryview(raw))
                    f.write(b"\0" * (-raw.nbytes % self.alignment))
                    del raw
                f.flush()
                os.fsync(f.fileno())
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise

    def __enter__(self) -> "GGUFWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None and not self._written:
            self.write()
