"""Our Triton kernels (engine.kernels.triton_ops, triton_iquants), run through Triton's
interpreter on the CPU (tests/conftest.py sets TRITON_INTERPRET=1): every type's decoding
(each of triton_ops.TYPES: the legacy types, Q2_K to Q6_K, the i-quants, TQ1_0, TQ2_0,
MXFP4) equals gguf_io's bit for bit, products equal the reference's to float32 rounding
at every row count, the grouped MoE product equals the reference's expert by expert, and
tiny models' logits (llama's, qwen3moe's) through the Triton path equal the reference path's."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from gguf_serve.engine import EngineConfig, kernels, load_model
from gguf_serve.engine.kernels import reference, triton_attention, triton_ops
from gguf_serve.gguf_io import TYPE_INFO, GGMLType

from oracles import prompt_logits
from tiny_models import random_model, spec, write_gguf

pytestmark = pytest.mark.skipif(not triton_ops.AVAILABLE, reason="the triton package is not installed "
                                "(the test extra installs it)")


HALF_AT = {GGMLType.Q2_K: (80, 82), GGMLType.Q3_K: (108,), GGMLType.Q6_K: (208,), GGMLType.TQ1_0: (52,),
           GGMLType.TQ2_0: (64,)}  # where a type's float16 scales sit, if not first


def random_blocks(t: GGMLType, rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    """Random blocks of type `t` whose scales are finite float16 (or, MXFP4, exponents near 1)."""
    rng = np.random.default_rng(seed)
    info = TYPE_INFO[t]
    n = cols // info.block_size
    b = rng.integers(0, 256, size=(rows, n, info.type_size), dtype=np.uint8)

    def half_at(off: int) -> None:
        values = rng.uniform(-0.05, 0.05, size=(rows, n)).astype(np.float16)
        b[:, :, off:off + 2] = values.view(np.uint8).reshape(rows, n, 2)

    if t == GGMLType.MXFP4:
        b[:, :, 0] = rng.integers(110, 130, size=(rows, n))
    elif t == GGMLType.IQ1_M:  # d's float16 bits are the top nibbles of the 4 scale words at 48
        d = rng.uniform(-0.05, 0.05, size=(rows, n)).astype(np.float16).view(np.uint16)
        for k in range(4):
            b[:, :, 49 + 2 * k] = (b[:, :, 49 + 2 * k] & 0x0F) | (((d >> (4 * k)) & 0xF) << 4).astype(np.uint8)
    elif t in HALF_AT:
        for off in HALF_AT[t]:
            half_at(off)
    else:
        half_at(0)
        if t in (GGMLType.Q4_1, GGMLType.Q5_1, GGMLType.Q4_K, GGMLType.Q5_K):
            half_at(2)
    return torch.from_numpy(b.reshape(rows, n * info.type_size).copy())


@pytest.mark.parametrize("t", triton_ops.TYPES, ids=lambda t: t.name)
def test_each_types_blocks_decode_as_gguf_io_and_multiply_as_the_reference(t):
    rows, cols = 24, 2 * 256
    w = random_blocks(t, rows, cols)
    expected = reference.dequantize(w, t, rows, cols, torch.float32)
    assert torch.equal(triton_ops.dequantize(w, t, rows, cols, torch.float32), expected)
    ids = torch.tensor([[3, 0], [23, 3]])
    assert torch.equal(triton_ops.get_rows(w, ids, t, cols, torch.float32), expected[ids])
    for m in (1, 3, 17):  # a decode step's rows, and more than one 16-row tile
        x = torch.randn(m, cols, generator=torch.Generator().manual_seed(m))
        y = x @ expected.T  # float32 sums in another order: equal to their rounding
        torch.testing.assert_close(triton_ops.mul_mat(w, x, t, rows), y, rtol=1e-5, atol=1e-5 * float(y.abs().max()))


def test_float_weights():
    """F16 and BF16 weights multiply as torch does."""
    x = torch.randn(3, 64)
    for t, dtype in ((GGMLType.F16, torch.float16), (GGMLType.BF16, torch.bfloat16)):
        dense = torch.randn(8, 64).to(dtype)
        packed = dense.view(torch.uint8).reshape(8, 128)
        torch.testing.assert_close(triton_ops.mul_mat(packed, x, t, 8), x @ dense.float().T)
        assert torch.equal(triton_ops.get_rows(packed, torch.tensor([7, 1]), t, 64, torch.float32),
                           dense.float()[[7, 1]])


@pytest.mark.parametrize("t", (GGMLType.Q4_K, GGMLType.IQ2_XS), ids=lambda t: t.name)
def test_mul_mat_id_runs_every_selection_in_one_launch_grouped_by_expert(t):
    """mul_mat_id equals the reference's expert-by-expert products: a token's row shared by
    its slots or one row per slot, a few selections, an unselected expert, and one expert's
    rows over two BLOCK_M tiles (20 of 40 selections: 16-row tiles)."""
    experts = torch.stack([random_blocks(t, 24, 256, seed=e) for e in range(4)])
    few = torch.tensor([[0, 3], [3, 2], [1, 0], [2, 2], [3, 1]])
    many = torch.stack([torch.ones(20, dtype=torch.int64), torch.arange(20) % 2 * 2], dim=1)  # experts 1, 0, 2
    for ids in (few, many):
        g = torch.Generator().manual_seed(len(ids))
        for x in (torch.randn(len(ids), 256, generator=g), torch.randn(len(ids), 2, 256, generator=g)):
            expected = reference.mul_mat_id(experts, x, ids, t, 24)
            torch.testing.assert_close(triton_ops.mul_mat_id(experts, x, ids, t, 24), expected, rtol=1e-5,
                                       atol=1e-5 * float(expected.abs().max()))


@pytest.fixture(scope="module", params=["llama", "qwen3moe"])  # qwen3moe: its experts through mul_mat_id
def k_mix_path(request, tmp_path_factory):
    s = spec(request.param)
    path = tmp_path_factory.mktemp("triton") / f"tiny-{request.param}-k.gguf"
    write_gguf(s, random_model(s), path, "K")  # Q4_K, Q5_K, Q6_K matrices, a Q8_0 embedding
    return str(path)


def test_a_models_logits_through_the_triton_path_equal_the_reference_paths(k_mix_path, caplog):
    ids = [1, 5, 9, 200, 17]
    ref = load_model(k_mix_path, config=EngineConfig(kernels="reference", device="cpu"))
    caplog.clear()  # the reference load's records (kept where a library has set the root logger to INFO)
    with caplog.at_level(logging.INFO):
        lm = load_model(k_mix_path, config=EngineConfig(kernels="triton", device="cpu"))
    chosen = [r.getMessage() for r in caplog.records if r.getMessage().startswith("kernels for cpu")]
    assert chosen and all(m.endswith("triton (forced by the kernels setting)") for m in chosen), chosen
    loaded = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("loaded "))
    assert loaded.endswith("kernels: triton for Q4_K, Q5_K, Q6_K, Q8_0"), loaded  # the load line says which
    for prompt in (ids, ids * 4):  # float32 sums in another order, through every layer: to 1e-4 of the logits
        expected = prompt_logits(ref, prompt)
        torch.testing.assert_close(prompt_logits(lm, prompt), expected, rtol=1e-4,
                                   atol=1e-4 * float(expected.abs().max()))


def test_the_selection_takes_triton_only_where_asked_or_on_cuda(monkeypatch):
    """A CPU never gets the Triton kernels unless they are forced; CUDA gets them by default,
    with the Triton dense ops (attention over the cache); a type they do not decode falls back
    to the reference; without the package, forcing them says what to install."""
    default = kernels.settings()
    assert default.select("cpu", GGMLType.Q4_K).name != "triton"
    assert default.ops_for("cpu") is not triton_attention.TRITON_OPS
    assert default.select("cuda", GGMLType.Q4_K) is triton_ops.TRITON  # (choosing needs no device)
    assert default.ops_for("cuda") is triton_attention.TRITON_OPS
    assert kernels.settings("reference").ops_for("cuda") is not triton_attention.TRITON_OPS  # torch's, all of it
    forced = kernels.settings("triton")
    assert forced.select("cpu", GGMLType.Q4_K) is triton_ops.TRITON
    assert forced.select("cpu", GGMLType.IQ1_M) is triton_ops.TRITON
    assert forced.select("cpu", GGMLType.NVFP4) is kernels.REFERENCE
    monkeypatch.setattr(triton_ops, "AVAILABLE", False)
    with pytest.raises(RuntimeError, match="pip install triton"):
        kernels.settings("triton").select("cpu", GGMLType.Q4_K)
