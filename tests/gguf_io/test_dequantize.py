"""dequantize against the oracles: gguf-py bit for bit, llama.cpp's own ggml where
installed, and a scalar transcription of ggml-common.h for types gguf-py lacks."""

import ctypes

import gguf
import gguf.quants
import numpy as np
import pytest

from gguf_serve.gguf_io import GGMLType, GGUFReader, TYPE_INFO, dequantize
from gguf_serve.gguf_io.constants import NON_WEIGHT_TYPES

from helpers import ggml_lib, no_llama_cpp, random_packed

QUANTIZED = [t for t in GGMLType if TYPE_INFO[t].quantized]
GGUF_PY_TYPES = {int(t) for t in gguf.GGMLQuantizationType}


def _gguf_py_can(t: GGMLType) -> bool:
    if int(t) not in GGUF_PY_TYPES:
        return False
    return gguf.GGMLQuantizationType(int(t)) in gguf.quants._type_traits or t in (GGMLType.F16, GGMLType.F32)


def _bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("gtype", [t for t in GGMLType if _gguf_py_can(t)], ids=lambda t: t.name)
def test_random_blocks_bit_identical_to_gguf_py(gtype):
    rng = np.random.default_rng(int(gtype))
    rows, bpr = 8, 4
    raw = random_packed(rng, gtype, rows, bpr)
    shape = (rows, bpr * gtype.block_size)
    ours = dequantize(raw, gtype, shape)
    with np.errstate(all="ignore"):
        ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(int(gtype)))
    assert ours.shape == shape and ours.dtype == np.float32
    assert np.array_equal(_bits(ours), _bits(ref))  # NaN payloads included


def test_every_gemma_tensor_bit_identical_to_gguf_py(gemma_path):
    ours = GGUFReader(gemma_path)
    ref = gguf.GGUFReader(gemma_path)
    assert [t.name for t in ref.tensors] == list(ours.tensors)
    seen = set()
    for rt in ref.tensors:
        t = ours.tensors[rt.name]
        assert int(t.ggml_type) == int(rt.tensor_type)
        assert t.shape == tuple(int(d) for d in reversed(rt.shape.tolist()))
        expected = gguf.quants.dequantize(rt.data, rt.tensor_type)
        got = t.dequantize()
        assert np.array_equal(_bits(got), _bits(expected.reshape(got.shape))), rt.name
        seen.add(t.ggml_type.name)
    assert seen == {"F32", "Q4_K", "Q5_0", "Q6_K", "Q8_0"}


# Scalar transcriptions of the block layouts in ggml-common.h, for the types
# gguf-py cannot dequantize: slow loops, written independently of the vectorized code.

def _scalar_q8_k(block: bytes) -> list[float]:
    d = np.frombuffer(block[0:4], "<f4")[0]
    return [float(d * np.float32(np.int8(np.uint8(block[4 + i]).view(np.int8)))) for i in range(256)]


def _scalar_q8_1(block: bytes) -> list[float]:
    d = np.float32(np.frombuffer(block[0:2], "<f2")[0])
    return [float(d * np.float32(np.uint8(block[4 + i]).view(np.int8))) for i in range(32)]


def _scalar_q1_0(block: bytes) -> list[float]:
    d = np.float32(np.frombuffer(block[0:2], "<f2")[0])
    return [float(d if (block[2 + j // 8] >> (j % 8)) & 1 else -d) for j in range(128)]


def _scalar_q2_0(block: bytes) -> list[float]:
    d = np.float32(np.frombuffer(block[0:2], "<f2")[0])
    return [float(np.float32((block[2 + j // 4] >> (2 * (j % 4))) & 3) - 1) * d for j in range(64)]


@pytest.mark.parametrize("gtype,scalar", [
    (GGMLType.Q8_K, _scalar_q8_k), (GGMLType.Q8_1, _scalar_q8_1),
    (GGMLType.Q1_0, _scalar_q1_0), (GGMLType.Q2_0, _scalar_q2_0),
], ids=lambda v: getattr(v, "name", ""))
def test_types_gguf_py_lacks_match_scalar_reference(gtype, scalar):
    rng = np.random.default_rng(7)
    raw = random_packed(rng, gtype, 1, 6)
    # keep scales finite so the comparison is about layout, not NaN propagation
    for b in range(6):
        o = b * gtype.type_size
        if gtype == GGMLType.Q8_K:
            raw[0, o:o + 4] = np.frombuffer(np.float32(rng.standard_normal()).tobytes(), np.uint8)
        else:
            raw[0, o:o + 2] = np.frombuffer(np.float16(rng.standard_normal()).tobytes(), np.uint8)
    got = dequantize(raw, gtype, (1, 6 * gtype.block_size)).reshape(-1)
    expected = []
    for b in range(6):
        expected += scalar(raw[0, b * gtype.type_size:(b + 1) * gtype.type_size].tobytes())
    np.testing.assert_array_equal(got, np.array(expected, dtype=np.float32))


class _TypeTraits(ctypes.Structure):
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


@pytest.mark.parametrize("gtype", [t for t in QUANTIZED if t not in NON_WEIGHT_TYPES], ids=lambda t: t.name)
def test_random_blocks_match_llama_cpp_ggml(gtype):
    """Cross-check against llama.cpp's C dequantizers (run where llama-cpp-python is installed)."""
    lib = ggml_lib()
    if lib is None:
        no_llama_cpp()
    lib.ggml_get_type_traits.restype = ctypes.POINTER(_TypeTraits)
    traits = lib.ggml_get_type_traits(int(gtype)).contents
    assert traits.to_float, f"ggml has no dequantizer for {gtype.name}"
    assert (traits.blck_size, traits.type_size) == (gtype.block_size, gtype.type_size)
    to_float = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(traits.to_float)
    rng = np.random.default_rng(100 + int(gtype))
    raw = random_packed(rng, gtype, 1, 16)
    n = 16 * gtype.block_size
    out = np.zeros(n, dtype=np.float32)
    to_float(raw.ctypes.data, out.ctypes.data, n)
    got = dequantize(raw, gtype, (n,))
    finite = np.isfinite(out)
    np.testing.assert_array_equal(got[finite], out[finite])
    assert np.array_equal(np.isfinite(got), finite)


def test_dequantize_checks_sizes():
    with pytest.raises(ValueError, match="Q4_0 tensor of shape \\(2, 32\\) needs 36 bytes"):
        dequantize(np.zeros(35, np.uint8), GGMLType.Q4_0, (2, 32))
    with pytest.raises(ValueError, match="multiple of 256"):
        dequantize(np.zeros(144, np.uint8), GGMLType.Q4_K, (1, 100))


def test_float_types():
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    assert np.array_equal(dequantize(x.view(np.uint8), GGMLType.F32, x.shape), x)
    assert np.array_equal(dequantize(x.astype(np.float16).view(np.uint8), GGMLType.F16, x.shape),
                          x.astype(np.float16).astype(np.float32))
    bf = (x.view(np.uint32) >> 16).astype(np.uint16)
    assert np.array_equal(dequantize(bf.view(np.uint8), GGMLType.BF16, x.shape).view(np.uint32),
                          bf.astype(np.uint32) << 16)
    assert np.array_equal(dequantize(x.astype(np.float64).view(np.uint8), GGMLType.F64, x.shape), x)
