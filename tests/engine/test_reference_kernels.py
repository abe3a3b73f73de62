"""The portable torch kernels against gguf_io's dequantize (bit for bit) and against
dense float math for get_rows and mul_mat_vec."""

import numpy as np
import pytest
import torch

from gguf_serve.engine.kernels import reference as ref
from gguf_serve.gguf_io import GGMLType, GGUFReader, TYPE_INFO, dequantize, quantize

from helpers import random_packed

WEIGHT_TYPES = [t for t in GGMLType if TYPE_INFO[t].quantized and t not in (GGMLType.Q8_1, GGMLType.Q8_K)]


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    fa, fb = np.isfinite(a), np.isfinite(b)
    return bool(np.array_equal(fa, fb) and np.array_equal(a[fa].view(np.uint32), b[fb].view(np.uint32)))


@pytest.mark.parametrize("gtype", WEIGHT_TYPES, ids=lambda t: t.name)
def test_dequantize_bit_identical_to_gguf_io(gtype):
    rng = np.random.default_rng(int(gtype))
    rows, bpr = 5, 3
    raw = random_packed(rng, gtype, rows, bpr)
    cols = bpr * gtype.block_size
    got = ref.dequantize(torch.from_numpy(raw), gtype, rows, cols, torch.float32).numpy()
    with np.errstate(all="ignore"):
        expected = dequantize(raw, gtype, (rows, cols))
    assert _same(got, expected)


def test_torch_decoders_cover_the_common_types():
    common = {GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.Q2_K,
              GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.IQ4_NL, GGMLType.IQ4_XS,
              GGMLType.MXFP4}
    assert common <= set(ref.DECODERS)


@pytest.mark.parametrize("gtype", [GGMLType.Q4_K, GGMLType.Q8_0, GGMLType.Q5_0, GGMLType.Q6_K, GGMLType.F16, GGMLType.F32])
def test_mul_mat_vec_and_get_rows_match_dense(gtype, monkeypatch):
    monkeypatch.setattr(ref, "CHUNK_ELEMENTS", 3 * 512)  # force several chunks
    rng = np.random.default_rng(0)
    w = rng.standard_normal((37, 512)).astype(np.float32)
    packed = quantize(w, gtype)
    dense = torch.from_numpy(dequantize(packed, gtype, w.shape))
    wt = torch.from_numpy(np.ascontiguousarray(packed))
    x = torch.randn(2, 4, 512)
    y = ref.mul_mat_vec(wt, x, gtype, 37)
    torch.testing.assert_close(y, x @ dense.T, rtol=1e-5, atol=1e-4)
    idx = torch.tensor([[3, 0], [36, 3]])
    torch.testing.assert_close(ref.get_rows(wt, idx, gtype, 512, torch.float32), dense[idx])


def test_gemma_embedding_rows_from_the_memory_map(gemma_path):
    r = GGUFReader(gemma_path)
    t = r.tensors["token_embd.weight"]
    w = ref.as_tensor(t.data)
    assert w.data_ptr() == t.data.ctypes.data  # zero copy over the map
    idx = torch.tensor([2, 1000, 262143])
    rows = ref.get_rows(w, idx, t.ggml_type, t.shape[1], torch.float32)
    expected = dequantize(t.data[[2, 1000, 262143]], t.ggml_type, (3, t.shape[1]))
    assert np.array_equal(rows.numpy(), expected)


def test_mul_mat_id_matches_per_expert_dense():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((5, 24, 256)).astype(np.float32)
    packed = quantize(w, GGMLType.Q4_K)
    dense = torch.from_numpy(dequantize(packed, GGMLType.Q4_K, w.shape))
    wt = torch.from_numpy(packed)
    x = torch.randn(7, 256)
    ids = torch.tensor([[0, 3], [3, 4], [1, 0], [4, 4], [2, 1], [0, 2], [3, 1]])
    out = ref.mul_mat_id(wt, x, ids, GGMLType.Q4_K, 24)
    expected = torch.stack([torch.stack([x[t] @ dense[e].T for e in ids[t].tolist()]) for t in range(7)])
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-4)
    xk = torch.randn(7, 2, 256)  # one row per selection (the down projection's case)
    out = ref.mul_mat_id(wt, xk, ids, GGMLType.Q4_K, 24)
    expected = torch.stack([torch.stack([xk[t, k] @ dense[ids[t, k]].T for k in range(2)]) for t in range(7)])
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-4)
