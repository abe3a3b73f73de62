"""The native CPU kernels (engine/kernels/csrc/: quants.c, arch/, matmul.c, ...), built by the package's own
build and loaded with ctypes: activation rows are quantized once to 8-bit blocks and
multiplied against the packed weight blocks with integer dot products, threads over
output rows (one pool).

The process's are only the loaded library, the CPU's ISA levels and torch's thread count
when the library first loads (the default for `threads`). A model's settings are a
`CpuKernels` built at load from the engine's configuration (engine.config, through
kernels.settings): threads, the code path (scalar, avx2, avx512 on x86-64; scalar, neon
on AArch64; by default the best the CPU runs), repacking, the dtype of long prefills'
matmuls and with it the row limit of the integer dots. Its methods and the bound
callables (MulMat, MulMatGroup, LinearF32, RowLookup) read only their own settings; its
code path applies to the calls a thread makes inside `using_isa` (a model's forward
pass, engine.threads), the process's (`set_isa`, for direct calls) elsewhere."""

from __future__ import annotations

import contextlib
import ctypes
import enum
import importlib.machinery
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...gguf_io import GGMLType
from ..options import ENV, PREFILL_DTYPES
from . import reference
from ..errors import KernelError
from .interface import KernelOps

log = logging.getLogger("gguf_serve.kernels")

LIB_NAME = "_gguf_cpu"

_lib: ctypes.CDLL | None = None
_isa_names: list[str] = []  # the library's ISA levels, lowest first
_tried = False
_default_threads = 0  # torch's thread count when the library loaded: `threads` when none is configured


def library_path() -> Path | None:
    here = Path(__file__).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        p = here / f"{LIB_NAME}{suffix}"
        if p.exists():
            return p
    return None


def load() -> ctypes.CDLL | None:
    """The compiled library, or None (with one warning) when it was not built."""
    global _lib, _tried
    if _tried:
        return _lib
    _tried = True
    path = library_path()
    if path is None:
        log.warning("native CPU kernels are not built (no %s library next to %s); using the portable torch "
                    "kernels, which are much slower. Reinstall with a C compiler available to build them.",
                    LIB_NAME, Path(__file__).parent)
        return None
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        log.warning("native CPU kernels failed to load (%s); using the portable torch kernels", e)
        return None
    lib.gc_mul_mat.restype = ctypes.c_int
    lib.gc_mul_mat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                               ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]
    lib.gc_dequantize.restype = ctypes.c_int
    lib.gc_dequantize.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                  ctypes.c_int]
    lib.gc_best_isa.restype = ctypes.c_int
    for name in ("gc_supports", "gc_set_isa", "gc_use_isa", "gc_path_isa", "gc_set_tiles", "gc_set_x8", "gc_set_amx",
                 "gc_set_vnni", "gc_use_amx", "gc_amx_takes", "gc_set_ftz"):  # int f(int): the switches and the per-type asks
        getattr(lib, name).restype = ctypes.c_int
        getattr(lib, name).argtypes = [ctypes.c_int]
    lib.gc_mul_mat_id.restype = ctypes.c_int
    lib.gc_mul_mat_id.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                  ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                  ctypes.c_void_p, ctypes.c_int]
    lib.gc_isa_name.restype = ctypes.c_char_p
    lib.gc_isa_name.argtypes = [ctypes.c_int]
    lib.gc_linear_f32.restype = None
    lib.gc_linear_f32.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                                  ctypes.c_void_p, ctypes.c_int]
    lib.gc_lora_down.restype = lib.gc_lora_up.restype = None
    lib.gc_lora_down.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                                 ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    lib.gc_lora_up.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                               ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    lib.gc_mul_mat_id2.restype = ctypes.c_int
    lib.gc_mul_mat_id2.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int64,
                                   ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                   ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]
    lib.gc_repack.restype = ctypes.c_int
    lib.gc_repack.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]
    lib.gc_mul_mat_multi.restype = ctypes.c_int
    lib.gc_mul_mat_multi.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                     ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]
    while (name := lib.gc_isa_name(len(_isa_names))) is not None:
        _isa_names.append(name.decode())
    _lib = lib
    global _default_threads
    _default_threads = torch.get_num_threads()
    return _lib


def default_threads() -> int:
    """The kernels' threads where none is configured: torch's count when the library loaded."""
    load()
    return _default_threads or torch.get_num_threads()


def isas() -> list[str]:
    """The code paths of this architecture's build, lowest first (index = ISA level)."""
    load()
    return list(_isa_names)


def isa_level(name: str | None) -> int:
    """The level a model's `cpu_isa` asks for (None: the best this CPU runs), clamped to
    what the CPU runs (with a warning)."""
    names, best = isas(), isas().index(best_isa())
    if name is not None and name not in names:
        raise ValueError(f"cpu_isa={name!r} ({ENV['cpu_isa']}): expected one of {', '.join(names)}")
    level = names.index(name) if name else best
    if level > best:
        log.warning("cpu_isa=%s is not supported by this CPU; using %s", name, names[best])
    return min(level, best)


def set_isa(name: str | None) -> str:
    """Select the process's code path (one of isas(); None: the best this CPU runs): the one
    of direct kernel calls (tests, benchmarks) outside a model's forward pass."""
    lib = load()
    if lib is None:
        raise RuntimeError("native CPU kernels are not available")
    return isas()[lib.gc_set_isa(isa_level(name))]


def set_tiles(on: bool) -> None:
    """Q4_K matmuls of 8 or more activation rows through the repacked tiles (the default)
    or the row-wise dots only (for tests and comparisons)."""
    load().gc_set_tiles(int(bool(on)))


def set_x8(on: bool) -> None:
    """32-block matmuls of 8 or more activation rows (that take no tiles) through the
    AVX-512 VNNI eight-row dots (the default, where the CPU has them) or the four-row and
    one-row dots only (for tests and comparisons)."""
    load().gc_set_x8(int(bool(on)))


def set_amx(on: bool | None = None) -> bool:
    """Prompt-sized matmuls (17 rows and up) of the types arch/x86_amx.c takes in bfloat16
    on AMX (the default, where the CPU has AMX-BF16) or through the integer tiles (False,
    for tests and comparisons); None only asks. Returns whether the AMX path is on here."""
    return bool(load().gc_set_amx(-1 if on is None else int(bool(on))))


def set_vnni(on: bool) -> None:
    """Prompt-sized matmuls of the 256-block types that AMX does not take through
    arch/x86_strips.c's VPDPBUSD strips where the CPU has AVX-512 VNNI (the default) or
    through the integer tiles (for tests and comparisons)."""
    load().gc_set_vnni(int(bool(on)))


def set_ftz(on: bool) -> None:
    """Native kernels with float32 denormals flushed to zero (the default; the caller's
    own floating-point mode is restored after each call) or with IEEE denormals (for
    tests and comparisons)."""
    load().gc_set_ftz(int(bool(on)))


def best_isa() -> str:
    lib = load()
    return isas()[lib.gc_best_isa()] if lib else "none"


def path_isa(ggml_type: GGMLType) -> str:
    """The code path mul_mat takes for this type under the calling thread's selection."""
    got = load().gc_path_isa(int(ggml_type))
    if got < 0:
        raise ValueError(f"no native kernel for {GGMLType(ggml_type).name}")
    return isas()[got]


def supports(ggml_type: GGMLType) -> bool:
    lib = load()
    return bool(lib and lib.gc_supports(int(ggml_type)))


def _f32(x: torch.Tensor) -> torch.Tensor:
    """x as float32 and contiguous, without a copy (or a cast call) when it already is"""
    return x if x.dtype is torch.float32 and x.is_contiguous() else x.float().contiguous()


class Status(enum.IntEnum):
    """gc_status (csrc/gc.h): what the library's status-returning calls return."""

    OK = 0
    UNSUPPORTED = -1  # a type, shape or layout the kernels do not take
    NO_MEMORY = -2  # scratch memory could not be allocated
    BAD_EXPERT = -3  # an expert index outside 0..n_experts - 1


def check(rc: int, fn: str, what: str) -> None:
    """Raise for a status other than OK: MemoryError for NO_MEMORY, KernelError otherwise,
    each naming the call `fn`, the status and `what` it was given."""
    if rc == Status.OK:
        return
    name = Status(rc).name if rc in Status._value2member_map_ else f"unknown status {rc}"
    if rc == Status.NO_MEMORY:
        raise MemoryError(f"{fn}: {name} (scratch for {what})")
    raise KernelError(f"{fn}: {name} for {what}")


# Up to a model's `gemv_max_rows` activation rows, integer dot products (each weight block
# unpacked once for four rows where the type has a four-row kernel; Q4_0, Q4_1, Q5_0,
# Q5_1, Q8_0, IQ4_NL and the Q4_K, Q5_K and Q6_K k-quants from 8 rows in repacked tiles of
# eight weight rows, see gc_set_tiles); beyond, dequantize tiles of W and let torch's BLAS
# do the matmul, in bfloat16 where the CPU has AMX (oneDNN's bfloat16 GEMM is ~5x float32
# there; not measured against the tiles, so those machines keep the old bound of 256
# rows), else float32. On the AVX2 machine here, Gemma 3 270M's matrices at 512 rows
# (one prompt chunk), in one process: the tiles 2.2-3.5x faster than float32 BLAS on
# Q5_0 and Q6_K, 2.1-2.4x on Q4_K; Q8_0 about equal row-wise, 2.2x faster in tiles than
# row-wise.
TILE_ELEMENTS = 1 << 22  # weights per dequantized tile
GEMV_MAX_ROWS = {torch.float32: 1024, torch.bfloat16: 256}  # the row limit per prefill dtype


def _has_amx() -> bool:
    try:
        return bool(torch.cpu._is_amx_tile_supported())
    except AttributeError:  # a torch without the probe: stay with float32
        return False


def has_native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX): torch's bfloat16
    products then run several times its float32 ones (859 against 178 GFLOP/s on two Zen 5
    cores)."""
    try:
        avx512_bf16 = bool(torch.cpu._is_avx512_bf16_supported())
    except AttributeError:  # a torch without the probe
        avx512_bf16 = False
    return avx512_bf16 or _has_amx()


def prefill_dtype(name: str | None) -> torch.dtype:
    """The dtype of long prefills' BLAS matmuls for the `prefill_dtype` setting ("float32",
    "bfloat16"; None: bfloat16 where the CPU has AMX, else float32)."""
    if name is not None and name not in PREFILL_DTYPES:
        raise ValueError(f"prefill_dtype={name!r} ({ENV['prefill_dtype']}): expected {' or '.join(PREFILL_DTYPES)}")
    return getattr(torch, name) if name else (torch.bfloat16 if _has_amx() else torch.float32)


REPACKED = 0x100  # a type code with this bit: a layout gc_repack made, not a file's type


def type_name(code: int) -> str:
    """A type code's name: the GGUF type's, or for a repacked layout that type's and "x8"."""
    return f"{GGMLType(code & 0xFF).name}x8" if code & REPACKED else GGMLType(code).name


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def _check_mul_mat_id(rc: int, fn: str, n_experts: int, ids: torch.Tensor, what: str) -> None:
    if rc == Status.BAD_EXPERT:
        raise IndexError(f"{fn}: expert index out of range 0..{n_experts - 1} in {ids.tolist()}")
    check(rc, fn, what)


@dataclass(frozen=True, eq=False)
class CpuKernels:
    """The native CPU kernels with one model's settings (built at load by kernels.settings;
    `make` for direct calls): its calls read only these. `isa` applies to the calls a thread
    makes inside `using_isa` (the model's forward pass); the methods themselves do not set it."""

    lib: ctypes.CDLL = field(repr=False)
    threads: int  # the pool's threads in this model's calls
    isa: str  # the code path (one of isas()), clamped to what the CPU runs
    repack: bool = True  # matrices repacked at load where this CPU reads another layout faster
    prefill_dtype: torch.dtype = torch.float32  # long prefills' BLAS dtype
    gemv_max_rows: int = GEMV_MAX_ROWS[torch.float32]  # up to this many rows the integer dots, beyond BLAS
    amx_types: frozenset[int] = frozenset()  # the types whose prompts take AMX's bfloat16 tiles (set_amx)

    @classmethod
    def make(cls, threads: int | None = None, isa: str | None = None, repack: bool = True,
             prefill: str | None = None) -> "CpuKernels | None":
        """The settings EngineConfig's threads (None: default_threads()), cpu_isa (None: the
        best), cpu_repack and prefill_dtype (None: bfloat16 with AMX) give; None where the
        library is not built."""
        lib = load()
        if lib is None:
            return None
        dtype = prefill_dtype(prefill)
        level = isa_level(isa)
        amx = frozenset(int(t) for t in GGMLType if lib.gc_amx_takes(int(t))) \
            if dtype is torch.bfloat16 and isas()[level] == "avx512" else frozenset()
        return cls(lib, max(1, int(threads or default_threads())), isas()[level], bool(repack), dtype,
                   GEMV_MAX_ROWS[dtype], amx)

    def max_rows(self, ggml_type: int) -> int:
        """Up to how many activation rows a matrix of this type takes the native kernels
        (beyond, dequantized tiles and torch's BLAS): the types AMX takes keep the native
        path to float32's bound (AMX's tiles beat oneDNN's bfloat16 GEMM over dequantized
        tiles there, 2.2-2.4x on 6144 x 2048 Q4_K, IQ3_S and F16 at 512 rows, 1.2-1.6x at
        1024, 2 threads, Sapphire Rapids: docs/benchmarks.md)."""
        if self.prefill_dtype is torch.bfloat16 and int(ggml_type) in self.amx_types:
            return max(self.gemv_max_rows, GEMV_MAX_ROWS[torch.float32])
        return self.gemv_max_rows

    @property
    def level(self) -> int:
        """The ISA level of `isa` (an index of isas())."""
        return _isa_names.index(self.isa)

    def use_isa(self) -> int:
        """Make `isa` the calling thread's code path (and its pool tasks'); returns the
        thread's previous setting for `restore_isa`. Once per forward pass, not per call.
        Prompts take AMX's bfloat16 products (set_amx) only where the prefill dtype is
        bfloat16: a float32 prefill keeps the integer tiles too."""
        return self.lib.gc_use_isa(self.level), self.lib.gc_use_amx(int(self.prefill_dtype is torch.bfloat16))

    def restore_isa(self, previous: tuple[int, int]) -> None:
        self.lib.gc_use_isa(previous[0])
        self.lib.gc_use_amx(previous[1])

    @contextlib.contextmanager
    def using_isa(self):
        """The calling thread's calls on `isa` for the duration (restored after)."""
        previous = self.use_isa()
        try:
            yield
        finally:
            self.restore_isa(previous)

    def ops(self, name: str) -> KernelOps:
        """The kernel interface over these settings' calls (kernels.select hands it out)."""
        return KernelOps(name, self.mul_mat, self.get_rows, self.dequantize, self.mul_mat_id, cpu=self)

    def mul_mat_rows(self, weight: torch.Tensor, x: torch.Tensor, ggml_type: int, out_features: int) -> torch.Tensor:
        """y (n, out) = x (n, in) · W^T for packed rows W (out, row_bytes), float32, with
        gc_mul_mat; float32 contiguous input passes without a copy (or a cast call: decode
        makes hundreds of these calls a token)."""
        w = _contiguous(weight)
        x = _f32(x)
        n, cols = x.shape
        y = torch.empty(n, out_features, dtype=torch.float32)
        rc = self.lib.gc_mul_mat(ggml_type, w.data_ptr(), out_features, cols, x.data_ptr(), n, y.data_ptr(),
                                 self.threads)
        check(rc, "gc_mul_mat", f"{GGMLType(ggml_type).name}, {out_features} x {cols}, {n} rows")
        return y

    def dequantize_rows(self, weight: torch.Tensor, ggml_type: int, rows: int, cols: int) -> torch.Tensor:
        w = _contiguous(weight)
        y = torch.empty(rows, cols, dtype=torch.float32)
        rc = self.lib.gc_dequantize(ggml_type, w.data_ptr(), rows, cols, y.data_ptr(), self.threads)
        check(rc, "gc_dequantize", f"{GGMLType(ggml_type).name}, {rows} x {cols}")
        return y

    def mul_mat(self, weight: torch.Tensor, x: torch.Tensor, ggml_type: GGMLType, out_features: int) -> torch.Tensor:
        """The kernel interface's mul_mat for CPU tensors of any leading shape and dtype."""
        cols = x.shape[-1]
        n = x.numel() // cols if cols else 0
        if n <= self.max_rows(ggml_type):
            y = self.mul_mat_rows(weight, x.reshape(n, cols), int(ggml_type), out_features)
        else:
            dt = self.prefill_dtype
            y = reference.matmul_by_tiles(
                weight, x.reshape(-1, cols).to(dt), out_features, max(1, TILE_ELEMENTS // cols),
                lambda rows, r: self.dequantize_rows(rows, int(ggml_type), r, cols).to(dt))
        y = y.reshape(*x.shape[:-1], out_features)
        return y if y.dtype is x.dtype else y.to(x.dtype)

    def dequantize(self, weight: torch.Tensor, ggml_type: GGMLType, rows: int, cols: int,
                   dtype: torch.dtype) -> torch.Tensor:
        return self.dequantize_rows(weight, int(ggml_type), rows, cols).to(dtype)

    def get_rows(self, weight: torch.Tensor, indices: torch.Tensor, ggml_type: GGMLType, cols: int,
                 dtype: torch.dtype) -> torch.Tensor:
        """Embedding lookup: the selected packed rows, dequantized by the native kernels."""
        flat = indices.reshape(-1)
        rows = weight.index_select(0, flat)  # raises IndexError for an index out of range
        out = self.dequantize_rows(rows, int(ggml_type), flat.numel(), cols)
        return (out if out.dtype is dtype else out.to(dtype)).reshape(*indices.shape, cols)

    def repacked(self, weight: torch.Tensor, ggml_type: GGMLType, rows: int,
                 cols: int) -> tuple[torch.Tensor, int] | None:
        """The matrix's bytes in the layout this CPU's kernels read fastest, where its type
        has one (Q5_0 and MXFP4 in groups of eight rows, with AVX2 on the calling thread's
        code path; see gc_repack): (a new uint8 tensor of the same size, the type code
        MulMat and MulMatGroup then take). None where there is none, or where repacking
        is off (cpu_repack)."""
        if not self.repack:
            return None
        w = _contiguous(weight)
        out = torch.empty_like(w)
        code = self.lib.gc_repack(int(ggml_type), w.data_ptr(), rows, cols, out.data_ptr(), self.threads)
        return (out, code) if code >= 0 else None

    def mul_mat_id_rows(self, weight: torch.Tensor, x: torch.Tensor, ids: torch.Tensor, ggml_type: int,
                        out_features: int) -> torch.Tensor:
        """gc_mul_mat_id: weight (experts, out, row_bytes), x (T, in) or (T, K, in), ids (T, K)
        -> (T, K, out) float32, every selection in one native call."""
        w = _contiguous(weight)
        x = _f32(x)
        ids = ids.to(torch.int64).contiguous()
        t, k = ids.shape
        if x.shape[0] != t or (x.dim() == 3 and x.shape[1] != k) or x.dim() not in (2, 3):
            raise ValueError(f"mul_mat_id: x {tuple(x.shape)} does not match ids {tuple(ids.shape)}")
        y = torch.empty(t, k, out_features, dtype=torch.float32)
        rc = self.lib.gc_mul_mat_id(ggml_type, w.data_ptr(), w.shape[0], out_features, x.shape[-1], x.data_ptr(),
                                    int(x.dim() == 3), ids.data_ptr(), t, k, y.data_ptr(), self.threads)
        _check_mul_mat_id(rc, "gc_mul_mat_id", w.shape[0], ids, f"{type_name(ggml_type)}, {x.shape[-1]} columns")
        return y

    def mul_mat_id2(self, a: torch.Tensor, b: torch.Tensor, x: torch.Tensor, ids: torch.Tensor, type_a: GGMLType,
                    type_b: GGMLType, out_features: int) -> torch.Tensor | None:
        """Two expert tensors of the same shape that read x (T, in) with the same ids (an
        MoE's gate and up) in one native call: (T, k, 2 out), a's outputs first. None where
        the types quantize activations differently or the tokens are too many (call
        mul_mat_id for each)."""
        if ids.shape[0] > self.gemv_max_rows or x.dim() != 2 or x.shape[0] != ids.shape[0]:
            return None
        a, b = _contiguous(a), _contiguous(b)
        x = _f32(x)
        ids = ids.to(torch.int64).contiguous()
        t, k = ids.shape
        y = torch.empty(t, k, 2 * out_features, dtype=torch.float32)
        rc = self.lib.gc_mul_mat_id2(int(type_a), a.data_ptr(), int(type_b), b.data_ptr(), a.shape[0], out_features,
                                     x.shape[-1], x.data_ptr(), ids.data_ptr(), t, k, y.data_ptr(), self.threads)
        if rc == Status.UNSUPPORTED:
            return None
        _check_mul_mat_id(rc, "gc_mul_mat_id2", a.shape[0], ids, f"{x.shape[-1]} columns")
        return y

    def mul_mat_id(self, weight: torch.Tensor, x: torch.Tensor, ids: torch.Tensor, ggml_type: GGMLType,
                   out_features: int) -> torch.Tensor:
        """The kernel interface's mul_mat_id. Up to gemv_max_rows tokens (each expert then
        sees at most that many rows) one native call does every selection with integer
        dots; longer prompts go expert by expert through mul_mat (dequantized tiles +
        torch); a repacked layout's (only the native calls read it) in native calls of
        gemv_max_rows tokens."""
        step = self.gemv_max_rows
        if int(ggml_type) & REPACKED and ids.shape[0] > step:
            return torch.cat([self.mul_mat_id(weight, x[i:i + step], ids[i:i + step], ggml_type, out_features)
                              for i in range(0, ids.shape[0], step)])
        if ids.shape[0] <= step:
            y = self.mul_mat_id_rows(weight, x, ids, int(ggml_type), out_features)
            return y if y.dtype is x.dtype else y.to(x.dtype)
        return reference.mul_mat_id(weight, x, ids, ggml_type, out_features, mul_mat=self.mul_mat)


class MulMat:
    """One packed matrix bound to the native kernel: its pointer and sizes are kept, so a
    decode step's call is a dtype/shape check and the ctypes call (the generic
    `mul_mat` costs ~10 us more per call in Python). Larger inputs take `mul_mat` on the
    file's bytes; `native` (from repacked) is what the native call reads instead of them."""

    def __init__(self, kernels: CpuKernels, weight: torch.Tensor, ggml_type: GGMLType, rows: int, cols: int,
                 native: tuple[torch.Tensor, int] | None = None):
        self.weight = _contiguous(weight)
        self.ggml_type, self.rows, self.cols = GGMLType(ggml_type), rows, cols
        self._native, self.type = native or (self.weight, int(ggml_type))
        self._ptr = self._native.data_ptr()
        self._fn, self._threads, self._max_rows = kernels.lib.gc_mul_mat, kernels.threads, kernels.max_rows(self.type)
        self._mul_mat = kernels.mul_mat

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype is torch.float32 and x.dim() == 2 and x.shape[0] <= self._max_rows and x.is_contiguous():
            y = torch.empty(x.shape[0], self.rows, dtype=torch.float32)
            if self._fn(self.type, self._ptr, self.rows, self.cols, x.data_ptr(), x.shape[0], y.data_ptr(),
                        self._threads):
                raise RuntimeError(f"gc_mul_mat failed for {self.ggml_type.name}, {self.cols} columns")
            return y
        return self._mul_mat(self.weight, x, self.ggml_type, self.rows)


class LinearF32:
    """A float32 matrix (a router, a small gate) for a few rows at a time on the
    kernels' threads: torch's one-thread GEMV reads it at half the rate. Returns None
    for inputs it does not take (the caller then uses torch)."""

    MAX_ROWS = 16

    def __init__(self, kernels: CpuKernels, weight: torch.Tensor):
        self.weight = weight.contiguous()
        self.rows, self.cols = self.weight.shape
        self._fn, self._threads = kernels.lib.gc_linear_f32, kernels.threads

    def __call__(self, x: torch.Tensor) -> torch.Tensor | None:
        if not (x.dtype is torch.float32 and x.dim() == 2 and x.shape[0] <= self.MAX_ROWS and x.is_contiguous()):
            return None
        y = torch.empty(x.shape[0], self.rows, dtype=torch.float32)
        self._fn(self.weight.data_ptr(), self.rows, self.cols, x.data_ptr(), x.shape[0], y.data_ptr(), self._threads)
        return y


class LoraProducts:
    """A matrix's LoRA factors in float16 (A: stacked ranks x in; B^T: ranks x out) and the
    spans of their ranks (one adapter each), for a few rows at a time on the kernels'
    threads: h = x A^T (`down`, times a mask) and y += h B span by span (`up`, in place); each
    row's sums in one order whatever the other rows, and a span a row does not use (its h
    columns zero) adds nothing. `takes` says which inputs it takes (the caller uses torch
    for the others)."""

    MAX_ROWS = 16

    def __init__(self, kernels: CpuKernels, a: torch.Tensor, bt: torch.Tensor, ends: list[int]):
        self.a, self.bt = a.contiguous(), bt.contiguous()
        assert self.a.dtype is torch.float16 and self.bt.dtype is torch.float16 and ends[-1] == self.a.shape[0]
        self.r, self.cols = self.a.shape
        self.out = self.bt.shape[1]
        self.ends = torch.tensor(ends, dtype=torch.int64)
        self._down, self._up, self._threads = kernels.lib.gc_lora_down, kernels.lib.gc_lora_up, kernels.threads

    def takes(self, x: torch.Tensor, y: torch.Tensor) -> bool:
        """Whether it takes input rows x and output rows y (float32, y's rows may be apart: a
        fused projection's columns)."""
        return (x.dtype is torch.float32 and x.dim() == 2 and x.shape[0] <= self.MAX_ROWS and x.is_contiguous()
                and y.dtype is torch.float32 and y.dim() == 2 and y.stride(1) == 1)

    def down(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x A^T; with a mask (rows of x, ranks), times it, its zeros not computed."""
        h = torch.empty(x.shape[0], self.r, dtype=torch.float32)
        if mask is not None:
            assert mask.dtype is torch.float32 and mask.is_contiguous() and mask.shape == h.shape
        self._down(self.a.data_ptr(), self.r, self.cols, x.data_ptr(), x.shape[0],
                   None if mask is None else mask.data_ptr(), h.data_ptr(), self._threads)
        return h

    def up(self, y: torch.Tensor, h: torch.Tensor) -> None:
        assert y.dtype is torch.float32 and y.stride(1) == 1 and h.is_contiguous() and y.shape == (h.shape[0], self.out)
        self._up(self.bt.data_ptr(), self.r, self.out, h.data_ptr(), h.shape[0], self.ends.data_ptr(),
                 self.ends.numel(), y.data_ptr(), y.stride(0), self._threads)


class MulMatGroup:
    """Several packed matrices that read the same input (q/k/v, gate/up) as one native
    call: the input is quantized once and all their rows are one work list. Returns
    y (n, sum of rows); each matrix's output is a column range of it."""

    def __init__(self, kernels: CpuKernels, weights: list[torch.Tensor], types: list[int], rows: list[int],
                 cols: int):
        """`weights` and `types` as the native call reads them (a repacked matrix's own)."""
        self.weights = [_contiguous(w) for w in weights]
        self.cols, self.total = cols, sum(rows)
        self.max_rows = min(kernels.max_rows(t) for t in types)  # more rows: the caller goes matrix by matrix
        n = len(weights)
        self._n = n
        self._types = (ctypes.c_int * n)(*[int(t) for t in types])
        self._ptrs = (ctypes.c_void_p * n)(*[w.data_ptr() for w in self.weights])
        self._rows = (ctypes.c_int64 * n)(*rows)
        self._fn, self._threads = kernels.lib.gc_mul_mat_multi, kernels.threads

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not (x.dtype is torch.float32 and x.dim() == 2 and x.is_contiguous()):
            x = _f32(x.reshape(-1, self.cols))
        y = torch.empty(x.shape[0], self.total, dtype=torch.float32)
        rc = self._fn(self._n, self._types, self._ptrs, self._rows, self.cols, x.data_ptr(), x.shape[0], y.data_ptr(),
                      self._threads)
        check(rc, "gc_mul_mat_multi", f"{self._n} matrices of {self.cols} columns, {x.shape[0]} rows")
        return y


class RowLookup:
    """A packed table's rows (an embedding) dequantized straight from the table, one
    native call a row: for the few ids of a decode step this skips get_rows' gathered
    copy and its tensor ops (~50 us a token on Gemma's 262k x 640 Q8_0 table)."""

    MAX_IDS = 16  # more ids: get_rows (one gather, one multi-threaded dequantization)

    def __init__(self, kernels: CpuKernels, weight: torch.Tensor, ggml_type: GGMLType, cols: int):
        self.weight = _contiguous(weight)
        self.type, self.cols = int(ggml_type), cols
        self._ptr, self._row_bytes = self.weight.data_ptr(), self.weight.shape[1]
        self._fn = kernels.lib.gc_dequantize

    def __call__(self, ids: list[int]) -> torch.Tensor:
        """float32 (len(ids), cols); ids checked by the caller."""
        out = torch.empty(len(ids), self.cols, dtype=torch.float32)
        p, step = out.data_ptr(), 4 * self.cols
        for i, t in enumerate(ids):
            if self._fn(self.type, self._ptr + t * self._row_bytes, 1, self.cols, p + i * step, 1):
                raise RuntimeError(f"gc_dequantize failed for {GGMLType(self.type).name}, {self.cols} columns")
        return out
