"""quantize: byte-identical to gguf-py where gguf-py quantizes; ggml's reference
algorithms for the k-quants, checked against llama.cpp where installed."""

import ctypes

import gguf
import gguf.quants
import numpy as np
import pytest

from gguf_serve.gguf_io import GGMLType, dequantize, quantize

from helpers import ggml_lib, no_llama_cpp

LEGACY = [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.BF16, GGMLType.F16,
          GGMLType.MXFP4]
KQUANTS = [GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K]

# Round-trip RMSE on unit Gaussians (relative to std 1): what each type's bits allow,
# with headroom. Measured: Q2_K .296, Q3_K .151, Q4_K .071, Q5_K .036, Q6_K .018,
# Q4_0 .086, Q4_1 .077, Q5_0 .043, Q5_1 .038, Q8_0 .0054, MXFP4 .115.
RMSE_BOUND = {
    GGMLType.Q2_K: 0.31, GGMLType.Q3_K: 0.16, GGMLType.Q4_K: 0.075, GGMLType.Q5_K: 0.038,
    GGMLType.Q6_K: 0.019, GGMLType.Q4_0: 0.09, GGMLType.Q4_1: 0.08, GGMLType.Q5_0: 0.045,
    GGMLType.Q5_1: 0.04, GGMLType.Q8_0: 0.006, GGMLType.F16: 3e-4, GGMLType.BF16: 3e-3, GGMLType.MXFP4: 0.13,
}


def _data(kind: str, rows=32, cols=1024, seed=0):
    rng = np.random.default_rng(seed)
    x = {"normal": rng.standard_normal, "laplace": rng.laplace, "uniform": lambda size: rng.uniform(-1, 1, size)}[kind](size=(rows, cols))
    x = x.astype(np.float32)
    x[0, :256] = 0  # an all-zero super-block
    x[1, :32] = 3.5  # a constant block
    return x


def _rmse(x, t, q):
    return float(np.sqrt(np.mean((dequantize(q, t, x.shape) - x) ** 2)))


@pytest.mark.parametrize("gtype", LEGACY, ids=lambda t: t.name)
@pytest.mark.parametrize("kind", ["normal", "laplace", "uniform"])
def test_legacy_types_byte_identical_to_gguf_py(gtype, kind):
    x = _data(kind)
    ours = quantize(x, gtype)
    ref = gguf.quants.quantize(x, gguf.GGMLQuantizationType(int(gtype)))
    ref = np.ascontiguousarray(ref).view(np.uint8)  # gguf-py gives F16 as float16
    assert ours.shape == ref.shape
    assert np.array_equal(ours, ref)


@pytest.mark.parametrize("gtype", list(RMSE_BOUND), ids=lambda t: t.name)
def test_round_trip_error_bounds(gtype):
    x = _data("normal", seed=3)
    q = quantize(x, gtype)
    assert q.dtype == np.uint8 and q.shape == (x.shape[0], gtype.row_nbytes(x.shape[1]))
    assert _rmse(x, gtype, q) <= RMSE_BOUND[gtype]
    y = dequantize(q, gtype, x.shape)
    assert np.all(y[0, :256] == 0)
    low_bits = gtype in (GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.MXFP4)  # MXFP4: 3.5 rounds to 3 (the top code)
    np.testing.assert_allclose(y[1, :32], 3.5, rtol=0.15 if low_bits else 0.02)


# llama.cpp's own round-trip RMSE on `_data(kind, seed=11)`, recorded with
# ggml_quantize_chunk from llama-cpp-python 0.3.36 (test_error_no_worse_than_llama_cpp
# recomputes them live where llama.cpp is installed).
LLAMA_CPP_RMSE = {
    "normal": {GGMLType.Q2_K: 0.293413, GGMLType.Q3_K: 0.150773, GGMLType.Q4_K: 0.071263,
               GGMLType.Q5_K: 0.036050, GGMLType.Q6_K: 0.017690},
    "laplace": {GGMLType.Q2_K: 0.482171, GGMLType.Q3_K: 0.248195, GGMLType.Q4_K: 0.118116,
                GGMLType.Q5_K: 0.059968, GGMLType.Q6_K: 0.030487},
    "uniform": {GGMLType.Q2_K: 0.133476, GGMLType.Q3_K: 0.071826, GGMLType.Q4_K: 0.031383,
                GGMLType.Q5_K: 0.015854, GGMLType.Q6_K: 0.007628},
}


@pytest.mark.parametrize("gtype", KQUANTS, ids=lambda t: t.name)
@pytest.mark.parametrize("kind", ["normal", "laplace", "uniform"])
def test_kquant_error_no_worse_than_recorded_llama_cpp(gtype, kind):
    x = _data(kind, seed=11)
    assert _rmse(x, gtype, quantize(x, gtype)) <= LLAMA_CPP_RMSE[kind][gtype] * 1.001


@pytest.mark.parametrize("gtype", KQUANTS + LEGACY[:5] + [GGMLType.MXFP4], ids=lambda t: t.name)
@pytest.mark.parametrize("kind", ["normal", "laplace", "uniform"])
def test_error_no_worse_than_llama_cpp(gtype, kind):
    """Against llama.cpp's ggml_quantize_chunk (where llama-cpp-python is installed)."""
    lib = ggml_lib()
    if lib is None:
        no_llama_cpp()
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    x = _data(kind, seed=11)
    ref = np.zeros((x.shape[0], gtype.row_nbytes(x.shape[1])), np.uint8)
    lib.ggml_quantize_chunk(int(gtype), x.ctypes.data, ref.ctypes.data, 0, x.shape[0], x.shape[1], None)
    ours = quantize(x, gtype)
    # float summation order differs (numpy pairwise vs C sequential), so a few
    # near-tie blocks may choose differently; the error must not be worse beyond that.
    assert _rmse(x, gtype, ours) <= _rmse(x, gtype, ref) * 1.001
    assert np.mean(ours == ref) > 0.99


def test_quantize_rejects_partial_blocks_and_unsupported_types():
    with pytest.raises(ValueError, match="not a multiple of 256"):
        quantize(np.zeros((2, 100), np.float32), GGMLType.Q4_K)
    with pytest.raises(NotImplementedError, match="IQ2_XXS"):
        quantize(np.zeros((1, 256), np.float32), GGMLType.IQ2_XXS)
