"""Helpers shared by the tests: small GGUF files written here, llama.cpp's ggml where installed."""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

from gguf_serve.gguf_io import GGMLType, GGUFWriter, TYPE_INFO


# byte offsets of the float16 fields (d, and m / dmin) inside one block
F16_FIELDS = {
    GGMLType.Q4_0: (0,), GGMLType.Q4_1: (0, 2), GGMLType.Q5_0: (0,), GGMLType.Q5_1: (0, 2), GGMLType.Q8_0: (0,),
    GGMLType.IQ4_NL: (0,), GGMLType.Q2_K: (80, 82), GGMLType.Q3_K: (108,), GGMLType.Q4_K: (0, 2),
    GGMLType.Q5_K: (0, 2), GGMLType.Q6_K: (208,), GGMLType.IQ4_XS: (0,),
    GGMLType.IQ2_XXS: (0,), GGMLType.IQ2_XS: (0,), GGMLType.IQ2_S: (0,), GGMLType.IQ3_XXS: (0,), GGMLType.IQ3_S: (0,),
    GGMLType.IQ1_S: (0,), GGMLType.TQ1_0: (52,), GGMLType.TQ2_0: (64,), GGMLType.Q1_0: (0,), GGMLType.Q2_0: (0,),
    GGMLType.F16: (0,), GGMLType.IQ1_M: (), GGMLType.BF16: (),
}


def random_packed(rng: np.random.Generator, gtype: GGMLType, rows: int, blocks_per_row: int,
                  f16_scale: float | None = None) -> np.ndarray:
    """Random bytes for `rows` rows of `gtype`. With `f16_scale`, the block's float16
    fields (F16_FIELDS) are set to ±f16_scale times a random factor in [0.5, 1) instead
    of random bits (which may be huge, inf or nan); MXFP4's exponent byte to a scale
    of 2^-9..2^-6."""
    info = TYPE_INFO[gtype]
    raw = rng.integers(0, 256, size=(rows, blocks_per_row * info.type_size), dtype=np.uint8)
    if f16_scale is not None and gtype == GGMLType.MXFP4:  # the E8M0 exponent byte: 2^-9..2^-6
        raw.reshape(-1, info.type_size)[:, 0] = rng.integers(118, 122, size=raw.size // info.type_size)
    elif f16_scale is not None:
        blocks = raw.reshape(-1, info.type_size)
        v = f16_scale * rng.uniform(0.5, 1.0, blocks.shape[0]) * rng.choice([-1, 1], blocks.shape[0])
        for off in F16_FIELDS[gtype]:
            blocks[:, off:off + 2] = v.astype(np.float16).view(np.uint8).reshape(-1, 2)
        if gtype == GGMLType.BF16:  # the float32 value's top half
            blocks[:, :] = (v.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(-1, 2)
        if gtype == GGMLType.IQ1_M:  # the half factor in the top nibbles of the four scale words (bytes 49, 51, 53, 55)
            h = v.astype(np.float16).view(np.uint16)
            for k in range(4):
                blocks[:, 49 + 2 * k] = (blocks[:, 49 + 2 * k] & 0x0F) | (((h >> (4 * k)) & 0xF) << 4).astype(np.uint8)
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


def no_llama_cpp() -> None:
    """What a cross-check against llama.cpp does where llama-cpp-python is missing: skip
    on a developer's machine, fail in CI (`.ci/run` builds it from the sdist), so that no
    cross-check skips there unnoticed."""
    if os.environ.get("CI"):
        pytest.fail("llama-cpp-python is not installed, and CI runs every cross-check (.ci/run builds it)")
    pytest.skip("llama-cpp-python is not installed (.ci/run builds it; cross-check skipped here)")


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


def write_llama_header(w: GGUFWriter, name: str, *, d: int, ff: int, heads: int, kv: int, layers: int,
                       n_vocab: int = 300) -> None:
    """A tiny llama file's metadata: llama.cpp's key names and a SentencePiece-style
    vocabulary (<unk>, <s>, </s>, the 256 byte tokens, then words)."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    tokens += [f"▁w{i}" for i in range(n_vocab - len(tokens))]
    w.add("general.architecture", "llama")
    w.add("general.name", name)
    w.add("general.file_type", 7)
    for key, value in {"context_length": 256, "embedding_length": d, "block_count": layers, "feed_forward_length": ff,
                       "attention.head_count": heads, "attention.head_count_kv": kv,
                       "rope.dimension_count": d // heads}.items():
        w.add(f"llama.{key}", value)
    w.add("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add("llama.rope.freq_base", 10000.0)
    w.add("tokenizer.ggml.model", "llama")
    w.add("tokenizer.ggml.tokens", tokens)
    w.add("tokenizer.ggml.scores", [0.0] * 259 + [-float(i) for i in range(n_vocab - 259)])
    w.add("tokenizer.ggml.token_type", [2, 3, 3] + [6] * 256 + [1] * (n_vocab - 259))
    w.add("tokenizer.ggml.bos_token_id", 1)
    w.add("tokenizer.ggml.eos_token_id", 2)
    w.add("tokenizer.ggml.unknown_token_id", 0)


def write_tiny_llama(path, qtype: GGMLType = GGMLType.Q8_0, seed: int = 0) -> None:
    """A one-layer llama model with a SentencePiece-style vocabulary, written by our
    writer following llama.cpp's key names, types and tensor names."""
    rng = np.random.default_rng(seed)
    n_vocab, d, ff, heads, kv = 300, 64, 128, 4, 2
    with GGUFWriter(path) as w:
        write_llama_header(w, "tiny-llama", d=d, ff=ff, heads=heads, kv=kv, layers=1, n_vocab=n_vocab)

        def mat(*shape):
            return (rng.standard_normal(shape) * 0.05).astype(np.float32)

        w.add_tensor("token_embd.weight", mat(n_vocab, d), ggml_type=qtype)
        w.add_tensor("output_norm.weight", np.ones(d, np.float32))
        w.add_tensor("output.weight", mat(n_vocab, d), ggml_type=qtype)
        w.add_tensor("blk.0.attn_norm.weight", np.ones(d, np.float32))
        w.add_tensor("blk.0.attn_q.weight", mat(d, d), ggml_type=qtype)
        w.add_tensor("blk.0.attn_k.weight", mat(kv * d // heads, d), ggml_type=qtype)
        w.add_tensor("blk.0.attn_v.weight", mat(kv * d // heads, d), ggml_type=qtype)
        w.add_tensor("blk.0.attn_output.weight", mat(d, d), ggml_type=qtype)
        w.add_tensor("blk.0.ffn_norm.weight", np.ones(d, np.float32))
        w.add_tensor("blk.0.ffn_gate.weight", mat(ff, d), ggml_type=qtype)
        w.add_tensor("blk.0.ffn_up.weight", mat(ff, d), ggml_type=qtype)
        w.add_tensor("blk.0.ffn_down.weight", mat(d, ff), ggml_type=qtype)


def copy_gguf(src, dst, *, metadata: dict | None = None, drop_tensor: str | None = None) -> str:
    """A copy of the GGUF file `src` at `dst`: the `metadata` keys set (a key the file has
    keeps its place and type; others are added) and `drop_tensor` left out."""
    from gguf_serve.gguf_io import GGUFReader

    r = GGUFReader(str(src))
    metadata = dict(metadata or {})
    with GGUFWriter(dst) as w:
        for k, v in r.metadata.items():
            w.add(k, metadata.pop(k, v), r.metadata_types[k])
        for k, v in metadata.items():
            w.add(k, v)
        for name, t in r.tensors.items():
            if name != drop_tensor:
                w.add_tensor(name, t.data, ggml_type=t.ggml_type, shape=t.shape)
    return str(dst)


def split_gguf(path, folder, name: str, n: int) -> list[str]:
    """Write the model at `path` as `n` shards named like llama.cpp's gguf-split does."""
    from gguf_serve.gguf_io import GGUFReader, GGUFValueType

    r = GGUFReader(path)
    names = list(r.tensors)
    per = -(-len(names) // n)
    out = []
    for s in range(n):
        p = os.path.join(folder, f"{name}-{s + 1:05d}-of-{n:05d}.gguf")
        with GGUFWriter(p) as w:
            if s == 0:
                for k, v in r.metadata.items():
                    w.add(k, v, r.metadata_types[k])
            w.add("split.no", s, GGUFValueType.UINT16)
            w.add("split.count", n, GGUFValueType.UINT16)
            w.add("split.tensors.count", len(names), GGUFValueType.INT32)
            for t in names[s * per:(s + 1) * per]:
                info = r.tensors[t]
                w.add_tensor(t, info.data, ggml_type=info.ggml_type, shape=info.shape)
        out.append(p)
    return out
