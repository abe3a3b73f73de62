"""Helpers shared by the tests: small GGUF files written here, llama.cpp's ggml where installed."""

from __future__ import annotations

import ctypes
import os

import numpy as np

from gguf_serve.gguf_io import GGMLType, GGUFWriter, TYPE_INFO


def random_packed(rng: np.random.Generator, gtype: GGMLType, rows: int, blocks_per_row: int) -> np.ndarray:
    """Random bytes for `rows` rows of `gtype`, with finite float16 scales where a type has them."""
    info = TYPE_INFO[gtype]
    raw = rng.integers(0, 256, size=(rows, blocks_per_row * info.type_size), dtype=np.uint8)
    return raw


def write_small_model(path, rng=None, *, alignment=None, extra_metadata=None) -> dict:
    """A small llama-shaped file with a few tensors of different types; returns what was written."""
    rng = rng or np.random.default_rng(0)
    tensors = {
        "token_embd.weight": rng.standard_normal((16, 64)).astype(np.float32),
        "blk.0.attn_norm.weight": rng.standard_normal(64).astype(np.float32),
        "blk.0.attn_q.weight": (rng.standard_normal((64, 64)).astype(np.float32), GGMLType.Q8_0),
        "blk.0.ffn_up.weight": (rng.standard_normal((32, 256)).astype(np.float32), GGMLType.Q4_K),
        "output.weight": rng.standard_normal((16, 64)).astype(np.float16),
    }
    meta = {
        "general.architecture": "llama",
        "general.name": "tiny",
        "llama.context_length": 128,
        "llama.embedding_length": 64,
        "tokenizer.ggml.tokens": ["<s>", "</s>", "a", "b"],
        "tokenizer.ggml.scores": [0.0, 0.0, -1.0, -2.0],
    }
    meta.update(extra_metadata or {})
    with GGUFWriter(path, alignment=alignment) as w:
        for k, v in meta.items():
            w.add(k, v)
        for name, t in tensors.items():
            if isinstance(t, tuple):
                w.add_tensor(name, t[0], ggml_type=t[1])
            else:
                w.add_tensor(name, t)
    return {"metadata": meta, "tensors": tensors}


def ggml_lib():
    """llama.cpp's libggml-base (from llama-cpp-python) where installed, else None."""
    try:
        import llama_cpp
    except ImportError:
        return None
    lib_dir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    for name in ("libggml-base.so", "libggml-base.dylib"):
        p = os.path.join(lib_dir, name)
        if os.path.exists(p):
            return ctypes.CDLL(p)
    return None


class _GGUFInitParams(ctypes.Structure):
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]


def llama_cpp_gguf_counts(path) -> tuple[int, int] | None:
    """(n_kv, n_tensors) as llama.cpp's own gguf parser reads the file; None if it refuses.

    Raises LookupError where llama.cpp is not installed."""
    lib = ggml_lib()
    if lib is None:
        raise LookupError("llama-cpp-python is not installed")
    lib.gguf_init_from_file.restype = ctypes.c_void_p
    lib.gguf_init_from_file.argtypes = [ctypes.c_char_p, _GGUFInitParams]
    lib.gguf_get_n_kv.restype = ctypes.c_int64
    lib.gguf_get_n_kv.argtypes = [ctypes.c_void_p]
    lib.gguf_get_n_tensors.restype = ctypes.c_int64
    lib.gguf_get_n_tensors.argtypes = [ctypes.c_void_p]
    lib.gguf_free.argtypes = [ctypes.c_void_p]
    ctx = lib.gguf_init_from_file(os.fsencode(str(path)), _GGUFInitParams(True, None))
    if not ctx:
        return None
    try:
        return lib.gguf_get_n_kv(ctx), lib.gguf_get_n_tensors(ctx)
    finally:
        lib.gguf_free(ctx)
