"""The native CPU kernels: every type and every ISA path against the exact float64
product, within the error that 8-bit activation quantization allows; SIMD paths
against the scalar one; the many-row path and dequantize against gguf_io."""

import platform
from dataclasses import replace

import numpy as np
import pytest
import torch

from gguf_serve.engine import kernels, load_model
from gguf_serve.engine.kernels import cpu, reference
from gguf_serve.gguf_io import GGMLType, GGUFReader, dequantize

from helpers import random_packed
from kernel_cases import ISAS, K, TYPES, act_block, activation_bound, restore_isa, weights  # noqa: F401 (restore_isa: the fixture)


def test_the_library_is_built_by_the_install():
    assert cpu.load() is not None, "pip install should have compiled engine/kernels/csrc/"
    assert all(cpu.supports(t) for t in TYPES)
    assert not cpu.supports(GGMLType.NVFP4)  # those keep the torch path


@pytest.mark.parametrize("isa", ISAS)
def test_every_type_has_a_kernel_for_every_isa(isa):
    cpu.set_isa(isa)
    assert {t.name: cpu.path_isa(t) for t in TYPES} == {t.name: isa for t in TYPES}


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("gtype", TYPES, ids=lambda t: t.name)
def test_error_within_activation_quantization_bound(gtype, isa):
    rng = np.random.default_rng(int(gtype))
    rows, cols = 37, 1024
    packed = weights(rng, gtype, rows, cols)
    W = dequantize(packed, gtype, (rows, cols)).astype(np.float64)
    x = rng.standard_normal((3, cols)).astype(np.float32)
    exact = x.astype(np.float64) @ W.T
    cpu.set_isa(isa)
    y = K.mul_mat_rows(torch.from_numpy(packed), torch.from_numpy(x), int(gtype), rows).numpy()
    bound = activation_bound(W, x.astype(np.float64), act_block(gtype))
    assert np.all(np.abs(y - exact) <= bound * 1.001 + 1e-4)
    assert np.abs(y - exact).max() > 0  # activations really are quantized


@pytest.mark.parametrize("gtype", TYPES, ids=lambda t: t.name)
def test_simd_paths_equal_scalar_up_to_summation_order(gtype):
    rng = np.random.default_rng(100 + int(gtype))
    rows, cols = 50, 512
    packed = torch.from_numpy(weights(rng, gtype, rows, cols))
    x = torch.randn(2, cols)
    out = {}
    for isa in ISAS:
        cpu.set_isa(isa)
        out[isa] = K.mul_mat_rows(packed, x, int(gtype), rows)
    for isa in ISAS[1:]:
        torch.testing.assert_close(out[isa], out["scalar"], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("gtype", TYPES, ids=lambda t: t.name)
def test_simd_paths_equal_scalar_on_random_blocks(gtype):
    """Every bit pattern a block can hold (not only what our quantizer writes): random
    quants, scales, masks and signs, with sane float16 factors."""
    rng = np.random.default_rng(200 + int(gtype))
    rows, cols = 24, 1024
    packed = torch.from_numpy(random_packed(rng, gtype, rows, cols // gtype.block_size, f16_scale=0.02))
    x = torch.randn(3, cols)
    W = dequantize(packed.numpy(), gtype, (rows, cols)).astype(np.float64)
    exact = x.double().numpy() @ W.T
    bound = activation_bound(W, x.double().numpy(), act_block(gtype))
    out = {}
    for isa in ISAS:
        cpu.set_isa(isa)
        out[isa] = K.mul_mat_rows(packed, x, int(gtype), rows)
        assert np.all(np.abs(out[isa].numpy() - exact) <= bound * 1.001 + 1e-4), isa
    for isa in ISAS[1:]:
        torch.testing.assert_close(out[isa], out["scalar"], rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("gtype", TYPES, ids=lambda t: t.name)
def test_native_dequantize_bit_identical_to_gguf_io(gtype):
    rng = np.random.default_rng(7)
    for packed in (weights(rng, gtype, 9, 512), random_packed(rng, gtype, 9, 512 // gtype.block_size, f16_scale=0.5)):
        got = K.dequantize(torch.from_numpy(packed), gtype, 9, 512, torch.float32).numpy()
        assert np.array_equal(got.view(np.uint32), dequantize(packed, gtype, (9, 512)).view(np.uint32))


@pytest.mark.parametrize("gtype", [GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q8_0, GGMLType.IQ4_NL, GGMLType.IQ2_XXS,
                                   GGMLType.IQ3_S, GGMLType.TQ2_0, GGMLType.F16], ids=lambda t: t.name)
def test_mul_mat_id_one_native_call_equals_expert_by_expert(gtype):
    rng = np.random.default_rng(11)
    experts, rows, cols = 6, 40, 512
    w = torch.from_numpy(np.stack([weights(rng, gtype, rows, cols) for _ in range(experts)]))
    ids = torch.tensor([[0, 3], [3, 5], [1, 3], [5, 0]])  # expert 3 shared by three tokens, 2 and 4 unused
    for x in (torch.randn(4, cols), torch.randn(4, 2, cols)):  # one row per token / per selection
        got = K.mul_mat_id(w, x, ids, gtype, rows)
        loop = reference.mul_mat_id(w, x, ids, gtype, rows, mul_mat=K.mul_mat)  # one GEMV per expert
        assert got.shape == (4, 2, rows)
        assert torch.equal(got, loop)  # the same dots on the same quantized rows
        W = [dequantize(w[e].numpy(), gtype, (rows, cols)).astype(np.float64) for e in range(experts)]
        for t in range(4):
            for k in range(2):
                xr = (x[t] if x.dim() == 2 else x[t, k]).double().numpy()[None]
                Wk = W[int(ids[t, k])]
                bound = activation_bound(Wk, xr, act_block(gtype))[0]
                assert np.all(np.abs(got[t, k].numpy() - xr[0] @ Wk.T) <= bound * 1.001 + 1e-4)


@pytest.mark.parametrize("gtype", [GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q8_0, GGMLType.Q5_0, GGMLType.IQ1_M,
                                   GGMLType.IQ3_XXS, GGMLType.BF16], ids=lambda t: t.name)
def test_get_rows_equals_the_reference_lookup(gtype):
    rng = np.random.default_rng(5)
    table = torch.from_numpy(weights(rng, gtype, 30, 512))
    idx = torch.tensor([[3, 0, 29], [3, 7, 7]])
    for dtype in (torch.float32, torch.bfloat16):
        got = K.get_rows(table, idx, gtype, 512, dtype)
        assert got.shape == (2, 3, 512) and got.dtype == dtype
        assert torch.equal(got, reference.get_rows(table, idx, gtype, 512, dtype))
    with pytest.raises(IndexError):
        K.get_rows(table, torch.tensor([30]), gtype, 512, torch.float32)


def test_mul_mat_id_rejects_bad_expert_indices_and_shapes():
    w = torch.from_numpy(np.stack([weights(np.random.default_rng(e), GGMLType.Q8_0, 8, 64) for e in range(3)]))
    with pytest.raises(IndexError, match="expert index out of range 0..2"):
        K.mul_mat_id(w, torch.randn(1, 64), torch.tensor([[0, 3]]), GGMLType.Q8_0, 8)
    with pytest.raises(IndexError):
        K.mul_mat_id(w, torch.randn(1, 64), torch.tensor([[-1, 0]]), GGMLType.Q8_0, 8)
    with pytest.raises(ValueError, match="does not match ids"):
        K.mul_mat_id(w, torch.randn(2, 64), torch.tensor([[0, 1]]), GGMLType.Q8_0, 8)


@pytest.mark.parametrize("prefill_dtype", [torch.float32, torch.bfloat16])
def test_many_rows_integer_and_tiled_paths(monkeypatch, prefill_dtype):
    """Up to gemv_max_rows rows the integer dots (four rows at a time where the type has
    a four-row kernel, then the rest one by one) equal the one-row results up to
    summation order; beyond, dequantized tiles and torch's matmul."""
    rng = np.random.default_rng(3)
    packed = torch.from_numpy(weights(rng, GGMLType.Q4_K, 40, 512))
    W = torch.from_numpy(dequantize(packed.numpy(), GGMLType.Q4_K, (40, 512)))
    xs = torch.randn(40, 512)
    single = torch.cat([K.mul_mat(packed, xs[i:i + 1], GGMLType.Q4_K, 40) for i in range(40)])
    tol = 1e-6 * float(single.abs().max())  # float32 rounding of sums that may cancel
    cpu.set_amx(False)  # the integer tiles at 40 rows (AMX's bfloat16: test_cpu_rows.py)
    try:
        for n in (2, 4, 7, 9, 40):
            torch.testing.assert_close(K.mul_mat(packed, xs[:n], GGMLType.Q4_K, 40), single[:n], rtol=1e-5, atol=tol)
    finally:
        cpu.set_amx(True)
    # > gemv_max_rows: dequantized tiles (three here, the last one short) + torch's matmul
    monkeypatch.setattr(cpu, "TILE_ELEMENTS", 16 * 512)
    many = replace(K, gemv_max_rows=16, prefill_dtype=prefill_dtype, amx_types=frozenset()).mul_mat(
        packed, xs, GGMLType.Q4_K, 40)
    assert many.dtype == torch.float32
    exact = xs.double() @ W.double().T
    if prefill_dtype == torch.float32:
        torch.testing.assert_close(many.double(), exact, rtol=1e-5, atol=1e-4)
    else:  # x, W and the result each rounded to bfloat16 (8 significant bits)
        bound = 3 * 2.0 ** -8 * (xs.double().abs() @ W.double().abs().T)
        assert ((many.double() - exact).abs() <= bound).all()
        assert (many.double() - exact).abs().max() > 0  # it did take the bfloat16 path


def test_real_gemma_tensors(gemma_path):
    r = GGUFReader(gemma_path)
    rng = np.random.default_rng(0)
    for name in ["blk.3.attn_q.weight", "blk.3.ffn_down.weight", "blk.3.ffn_up.weight", "blk.0.attn_v.weight"]:
        t = r.tensors[name]
        rows, cols = t.shape
        W = t.dequantize().astype(np.float64)
        x = rng.standard_normal((1, cols)).astype(np.float32)
        y = K.mul_mat(torch.from_numpy(np.ascontiguousarray(t.data)), torch.from_numpy(x), t.ggml_type, rows).numpy()
        bound = activation_bound(W, x.astype(np.float64), act_block(t.ggml_type))
        assert np.all(np.abs(y - x.astype(np.float64) @ W.T) <= bound * 1.001 + 1e-4), name


def _last_logits(lm, ids):
    from gguf_serve.engine.batch import Batch

    slot = lm.cache.allocate()
    try:
        return lm.forward(Batch.of([(slot, ids, 0)]))[0]
    finally:
        lm.cache.free(slot)


def test_engine_uses_native_kernels_on_cpu_and_stays_close_to_exact(gemma_path):
    lm = load_model(gemma_path, device="cpu")
    ids = lm.tokenizer("The capital of France is the city of Paris, which is")["input_ids"]
    short = _last_logits(lm, ids[:6])  # 6 rows: the integer-dot path
    linears = [m for layer in lm.model.layers for m in layer.mixer.qkv.linears + [layer.mixer.o]]
    linears += [lm.model.head]
    assert all(layer.mixer.qkv.native is not None for layer in lm.model.layers)  # q/k/v in one native call
    assert len(linears) == 18 * 4 + 1
    assert {m.kernels.name for m in linears} == {f"cpu-native ({cpu.best_isa()})"}
    assert lm.model.ops.name == "cpu-native"
    import os
    os.environ[kernels.ENV_OVERRIDE] = "reference"
    try:
        exact_lm = load_model(gemma_path, device="cpu")
        assert exact_lm.model.ops.name == "torch"
        exact = _last_logits(exact_lm, ids[:6])
    finally:
        del os.environ[kernels.ENV_OVERRIDE]
    assert int(short.argmax()) == int(exact.argmax())
    assert torch.corrcoef(torch.stack([short, exact]))[0, 1] > 0.995


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "phi3", "gemma3", "qwen35", "smollm3", "olmo2", "olmo3",
                                  "mistral3", "lfm2"])
def test_every_dense_architecture_on_the_native_path_stays_close_to_transformers(arch, tmp_path):
    """The native kernels and dense ops (8-bit activations, the one-call attention with
    its rotary, q/k norms and windows) on each architecture's tiny Q8_0 file: a prompt,
    then decode steps one token at a time, each row's logits correlated > 0.99 with the
    dense transformers model and the same argmax on most rows."""
    from gguf_serve.engine.batch import Batch

    from tiny_models import random_model, spec, write_gguf

    s = spec(arch)
    dense = write_gguf(s, random_model(s, seed=7), tmp_path / "m.gguf", "Q8_0")
    lm = load_model(str(tmp_path / "m.gguf"), device="cpu")
    assert lm.model.ops.name == "cpu-native"
    ids = torch.randint(0, 250, (14,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = dense(input_ids=ids[None]).logits[0]
    slot = lm.cache.allocate()
    rows = [lm.forward(Batch.of([(slot, ids[:8].tolist(), 0)], want="all"))]
    rows += [lm.forward(Batch.of([(slot, [int(ids[t])], t)])) for t in range(8, 14)]
    ours = torch.cat(rows)
    corr = [float(torch.corrcoef(torch.stack([a, b]))[0, 1]) for a, b in zip(ours, ref)]
    assert min(corr) > 0.99, corr
    assert int((ours.argmax(-1) == ref.argmax(-1)).sum()) >= 12


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen35moe"])
def test_moe_engine_decodes_with_native_mul_mat_id(arch, tmp_path, monkeypatch):
    """A tiny mixture-of-experts model in the K mix: a decode step makes one native call
    for the gate and up experts together (Qwen3.5's fused tensor: one product over it, no
    pair call) and one for down, and its logits equal those of
    the expert-by-expert loop over the GEMV. (Not compared with the dense model: with random routers, 8-bit
    activations flip some top-k choices, and a flipped expert changes the output.)"""
    from gguf_serve.engine.batch import Batch

    from tiny_models import random_model, spec, write_gguf

    s = spec(arch)
    write_gguf(s, random_model(s, seed=5), tmp_path / "moe.gguf", "K")
    lm = load_model(str(tmp_path / "moe.gguf"), device="cpu")
    ids = torch.randint(0, 250, (9,), generator=torch.Generator().manual_seed(2)).tolist()

    def decode_step():
        slot = lm.cache.allocate()
        try:
            lm.forward(Batch.of([(slot, ids[:8], 0)]))
            calls.clear(), pairs.clear()
            return lm.forward(Batch.of([(slot, ids[8:], 8)]))[0]
        finally:
            lm.cache.free(slot)

    calls, pairs = [], []
    native = cpu.CpuKernels.mul_mat_id_rows  # the model's calls: a method of its CpuKernels
    monkeypatch.setattr(cpu.CpuKernels, "mul_mat_id_rows", lambda k, *a: calls.append(a[3]) or native(k, *a))
    experts = [layer.mlp.experts for layer in lm.model.layers if hasattr(layer.mlp, "experts")]
    for e in experts:
        e._pair = lambda *a, pair=e._pair: pairs.append(a[4]) or pair(*a)
    step = decode_step()
    fused = experts[0].gate_up is not None
    assert fused == (arch == "qwen35moe") and len(experts) == len(lm.model.layers)
    assert (len(calls), len(pairs)) == ((2 * len(experts), 0) if fused else (len(experts), len(experts)))
    for e in experts:
        e._pair = None
    monkeypatch.setattr(cpu.CpuKernels, "mul_mat_id_rows", lambda k, w, x, i, t, o: calls.append(t) or
                        reference.mul_mat_id(w, x, i, GGMLType(t), o, mul_mat=k.mul_mat))
    assert torch.equal(decode_step(), step)


@pytest.mark.parametrize("types", [(GGMLType.Q4_K, GGMLType.Q4_K), (GGMLType.Q4_K, GGMLType.Q6_K),
                                   (GGMLType.Q8_0, GGMLType.Q4_0), (GGMLType.Q8_0, GGMLType.Q4_K)],
                         ids=lambda ts: "+".join(t.name for t in ts))
@pytest.mark.parametrize("tokens", [1, 9])
def test_gate_and_up_experts_in_one_call_equal_two(types, tokens):
    """mul_mat_id2: two expert tensors read x with the same ids in one call, equal to a
    mul_mat_id for each; types that quantize activations differently are refused."""
    rng = np.random.default_rng(21)
    a, b = (torch.from_numpy(np.stack([weights(rng, t, 40, 512) for _ in range(6)])) for t in types)
    x = torch.randn(tokens, 512)
    ids = torch.stack([torch.randperm(6, generator=torch.Generator().manual_seed(i))[:3] for i in range(tokens)])
    both = K.mul_mat_id2(a, b, x, ids, types[0], types[1], 40)
    if (types[0].block_size == 256) != (types[1].block_size == 256):
        assert both is None
        return
    assert torch.equal(both[..., :40], K.mul_mat_id(a, x, ids, types[0], 40))
    assert torch.equal(both[..., 40:], K.mul_mat_id(b, x, ids, types[1], 40))


@pytest.mark.parametrize("gtype", [GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q5_0, GGMLType.IQ2_XS, GGMLType.IQ4_XS,
                                   GGMLType.BF16], ids=lambda t: t.name)
def test_mul_mat_id_experts_chosen_by_many_tokens(gtype):
    """Expert 1 chosen by 11 of 16 tokens, expert 3 by 6: their rows take the four-row
    dots (and from 8 tokens the repacked tiles), equal to one token at a time."""
    rng = np.random.default_rng(12)
    experts, rows, cols = 4, 24, 512
    w = torch.from_numpy(np.stack([weights(rng, gtype, rows, cols) for _ in range(experts)]))
    ids = torch.tensor([[1, 0], [1, 2], [3, 1], [1, 0], [2, 1], [1, 3], [0, 2], [3, 0],
                        [1, 3], [1, 0], [3, 1], [1, 2], [0, 3], [1, 2], [2, 1], [3, 0]])
    x = torch.randn(16, cols)
    one_by_one = torch.stack([torch.stack([K.mul_mat(w[int(e)], x[t:t + 1], gtype, rows)[0] for e in ids[t]])
                              for t in range(16)])
    for tiles in (True, False):
        cpu.set_tiles(tiles)
        try:
            got = K.mul_mat_id(w, x, ids, gtype, rows)
        finally:
            cpu.set_tiles(True)
        torch.testing.assert_close(got, one_by_one, rtol=1e-5, atol=1e-6 * float(one_by_one.abs().max()))


def test_a_group_of_matrices_is_one_call_equal_to_its_members(gemma_path):
    """q/k/v (two types, one input) in one native call: the same result as three calls."""
    from gguf_serve.engine.modules import LinearGroup, Weights

    w = Weights(GGUFReader(gemma_path), torch.device("cpu"), torch.float32, kernels.settings())
    members = [w.linear(f"blk.0.attn_{n}.weight", rows, 640) for n, rows in (("q", 1024), ("k", 256), ("v", 256))]
    group = LinearGroup(members)
    assert group.native is not None
    x = torch.randn(3, 640)
    assert torch.equal(group(x), torch.cat([m(x) for m in members], dim=-1))


@pytest.mark.parametrize("gtype", [GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q8_0], ids=lambda t: t.name)
def test_tiny_activations_flush_to_zero_inside_the_kernels_only(gtype):
    """Activations of ~1e-36 (a SiLU gate far negative) times block scales are float32
    denormals: the kernels flush them (FTZ/DAZ) instead of paying a microcode assist per
    FMA. The products (~1e-35) then come out as zero, where IEEE denormals keep them; a
    difference no sum with a normal number can see. The calling thread's floating-point
    mode is its own again afterwards."""
    rng = np.random.default_rng(5)
    packed = torch.from_numpy(weights(rng, gtype, 24, 512))
    x = torch.randn(3, 512) * 1e-36
    W = dequantize(packed.numpy(), gtype, (24, 512)).astype(np.float64)
    exact = x.double().numpy() @ W.T
    flushed = K.mul_mat(packed, x, gtype, 24)
    try:
        cpu.set_ftz(False)
        ieee = K.mul_mat(packed, x, gtype, 24)
    finally:
        cpu.set_ftz(True)
    assert np.all(np.isfinite(flushed.numpy())) and np.abs(ieee.numpy() - exact).max() < 1e-36
    assert np.abs(exact).max() > 1e-36 and np.abs(flushed.numpy() - exact).max() < 1e-33
    if platform.machine() in ("x86_64", "AMD64"):  # FTZ/DAZ is the x86 builds' (NEON has no assists)
        assert float(flushed.abs().max()) == 0.0 < float(ieee.abs().max())
    tiny = torch.tensor([1e-38]) * 0.01  # a denormal result: kept unless the caller's mode leaked
    assert float(tiny) > 0.0 and float(np.float32(1e-38) * np.float32(0.01)) > 0.0


@pytest.mark.parametrize("n", [1, 5, 16, 17])
def test_float32_matrices_on_the_kernels_threads_equal_torch(n):
    """Routers and small gates that files keep in float32 take the native row dots for
    up to 16 rows (each weight row read once for all); more rows go to torch."""
    from gguf_serve.engine.modules import DenseLinear

    w, x, b = torch.randn(128, 2048), torch.randn(n, 2048), torch.randn(128)
    linear = DenseLinear("router", w, b, native=K)
    assert (cpu.LinearF32(K, w)(x) is None) == (n > 16)
    torch.testing.assert_close(linear(x), torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("rows,n", [(16, 1), (64, 3), (64, 8), (2048, 13), (64, 300)])
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("gtype", [GGMLType.Q5_0, GGMLType.MXFP4], ids=lambda t: t.name)
def test_repacked_rows_equal_the_files_rows(gtype, isa, rows, n):
    """Q5_0 and MXFP4 repacked in groups of eight rows (gc_repack) dequantize to the same
    floats as the file's rows, and their products (the eight-row dot at 1-7 activation rows,
    the tiles from 8) equal the file layout's up to float rounding, within the activation
    quantization's bound of the exact product; on every ISA level."""
    cpu.set_isa(isa)
    rng = np.random.default_rng(rows + n)
    cols = 640
    packed = torch.from_numpy(random_packed(rng, gtype, rows, cols // 32, f16_scale=0.02) if gtype == GGMLType.MXFP4
                              else weights(rng, gtype, rows, cols))
    rep = K.repacked(packed, gtype, rows, cols)
    if isa == "scalar" or cpu.best_isa() == "scalar":
        assert rep is None  # made only where the SIMD dot runs (read at every level)
        cpu.set_isa(None)
        rep = K.repacked(packed, gtype, rows, cols)
        cpu.set_isa(isa)
    if rep is None:
        pytest.skip("no repacked layout on this architecture")
    data, code = rep
    assert data.shape == packed.shape and not torch.equal(data, packed)
    lib = cpu.load()
    deq = torch.empty(rows, cols)
    assert lib.gc_dequantize(code, data.data_ptr(), rows, cols, deq.data_ptr(), 2) == 0
    assert torch.equal(deq, K.dequantize(packed, gtype, rows, cols, torch.float32))
    x = torch.randn(n, cols)
    ours = cpu.MulMat(K, packed, gtype, rows, cols, native=rep)(x)
    files = cpu.MulMat(K, packed, gtype, rows, cols)(x)
    torch.testing.assert_close(ours, files, rtol=1e-5, atol=1e-6 * float(files.abs().max()))
    W = deq.double().numpy()
    bound = activation_bound(W, x.double().numpy(), 32)
    assert np.all(np.abs(ours.numpy() - x.double().numpy() @ W.T) <= bound * 1.001 + 1e-4)


@pytest.mark.parametrize("n", [1, 3, 9, 16])
def test_repacked_experts_equal_the_files_experts(n):
    """gpt-oss's MXFP4 experts repacked as one matrix of all their rows: n tokens choosing
    4 of 6 experts (some chosen by one token, some by many: the eight-row dot, and the tiles
    from 8 tokens), gate and up in one call too, equal to the file layout's products up to
    float rounding, with any thread count (chunks that split an expert's groups)."""
    rng = np.random.default_rng(40 + n)
    experts, rows, cols = 6, 48, 256
    w = torch.from_numpy(random_packed(rng, GGMLType.MXFP4, experts * rows, cols // 32, f16_scale=0.02))
    rep = K.repacked(w, GGMLType.MXFP4, experts * rows, cols)
    if rep is None:
        pytest.skip("no repacked layout on this architecture")
    w, r = w.view(experts, rows, -1), rep[0].view(experts, rows, -1)
    ids = torch.stack([torch.randperm(experts, generator=torch.Generator().manual_seed(t))[:4] for t in range(n)])
    x = torch.randn(n, cols)
    files = K.mul_mat_id(w, x, ids, GGMLType.MXFP4, rows)
    tol = dict(rtol=1e-5, atol=1e-6 * float(files.abs().max()))
    for threads in (1, 2, 3):
        k = replace(K, threads=threads)
        torch.testing.assert_close(k.mul_mat_id(r, x, ids, rep[1], rows), files, **tol)
        both = k.mul_mat_id2(r, r, x, ids, rep[1], rep[1], rows)
        torch.testing.assert_close(both[..., :rows], files, **tol)
        torch.testing.assert_close(both[..., rows:], files, **tol)


@pytest.mark.parametrize("n", [1, 9])
def test_a_repacked_matrix_after_one_of_odd_rows_in_one_call(n):
    """In one native call a repacked matrix may start inside a thread's chunk at a row that
    is not a multiple of eight (after a matrix of 12 rows): its groups are computed whole
    and only their rows in the chunk are written, equal to the matrices called alone (up
    to float rounding at 9 rows, where such a group takes the eight-row dot and not the
    tiles)."""
    rng = np.random.default_rng(3)
    a = torch.from_numpy(weights(rng, GGMLType.Q8_0, 12, 256))
    b = torch.from_numpy(weights(rng, GGMLType.Q5_0, 40, 256))
    rep = K.repacked(b, GGMLType.Q5_0, 40, 256)
    if rep is None:
        pytest.skip("no repacked layout on this architecture")
    x = torch.randn(n, 256)
    alone = torch.cat([cpu.MulMat(K, a, GGMLType.Q8_0, 12, 256)(x),
                       cpu.MulMat(K, b, GGMLType.Q5_0, 40, 256, native=rep)(x)], 1)
    for threads in (1, 2, 3):
        group = cpu.MulMatGroup(replace(K, threads=threads), [a, rep[0]], [int(GGMLType.Q8_0), rep[1]], [12, 40], 256)
        torch.testing.assert_close(group(x), alone, rtol=1e-5, atol=1e-6 * float(alone.abs().max()))


def test_repack_only_where_it_applies(monkeypatch):
    rng = np.random.default_rng(4)
    q5 = torch.from_numpy(weights(rng, GGMLType.Q5_0, 12, 256))  # 12 rows: not whole groups of eight
    assert K.repacked(q5, GGMLType.Q5_0, 12, 256) is None
    q4k = torch.from_numpy(weights(rng, GGMLType.Q4_K, 16, 256))
    assert K.repacked(q4k, GGMLType.Q4_K, 16, 256) is None
    q5 = torch.from_numpy(weights(rng, GGMLType.Q5_0, 16, 256))
    assert K.repacked(q5, GGMLType.Q5_0, 16, 256) is not None or cpu.best_isa() == "scalar"
    off = cpu.CpuKernels.make(repack=False)  # as EngineConfig(cpu_repack=False) makes them at load
    assert off.repacked(q5, GGMLType.Q5_0, 16, 256) is None


def _rss_file_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile"))


def _mapped_pages(t) -> int:
    """Pages of a tensor's bytes mapped in this process (/proc/self/pagemap's present bit)."""
    import mmap
    import struct

    first, last = t.data.ctypes.data // mmap.PAGESIZE, (t.data.ctypes.data + t.nbytes - 1) // mmap.PAGESIZE
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        raw = f.read((last - first + 1) * 8)
    return sum(v >> 63 for v in struct.unpack(f"<{len(raw) // 8}Q", raw))


@pytest.mark.skipif(platform.system() != "Linux", reason="reads /proc/self")
def test_released_tensor_pages_leave_the_process_and_keep_their_bytes(gemma_path):
    """reader.release drops the mapping of tensors' pages (the repacked matrices' file
    copies): resident file memory falls by about their size, their neighbours stay mapped
    (the kernel maps this file in 2 MB pages, and unmapping part of one unmapped all of
    it, neighbours included), and reading them again gives the same bytes."""
    r = GGUFReader(gemma_path)
    r.populate()
    names = list(r.tensors)
    gone = [r.tensors[n] for n in ("token_embd.weight", "blk.3.ffn_gate.weight", "blk.3.ffn_up.weight")]
    kept = [r.tensors[n] for n in ("blk.3.attn_v.weight", "blk.3.ffn_down.weight", "blk.3.ffn_norm.weight",
                                   names[names.index("blk.3.ffn_up.weight") + 1], names[names.index("token_embd.weight") + 1])]
    assert all(_mapped_pages(t) > 0 for t in kept)
    before = [np.asarray(t.data[:2]).copy() for t in gone]
    rss = _rss_file_kb()
    r.release(gone)
    assert rss - _rss_file_kb() > 0.95 * sum(t.nbytes for t in gone) / 1024
    assert all(_mapped_pages(t) <= 2 for t in gone)  # whole pages inside the tensor: all but its two ends
    assert all(_mapped_pages(t) >= t.nbytes // 4096 for t in kept)
    assert all(np.array_equal(t.data[:2], b) for t, b in zip(gone, before))


def test_gemma_q5_0_matrices_are_repacked_and_decode_as_before(gemma_path, monkeypatch):
    """Loaded on a CPU with AVX2, Gemma's Q5_0 matrices (q/k/v, gate/up) are read in the
    repacked layout; the logits of a prompt and of each of its decode steps agree with the
    file's layout's (the same tokens win)."""
    from gguf_serve.engine.batch import Batch

    lm = load_model(gemma_path, device="cpu", n_seq=1)
    q5 = [m for layer in lm.model.layers for m in layer.mixer.qkv.linears + layer.mlp.gate_up.linears
          if m.ggml_type == GGMLType.Q5_0]
    assert q5
    if cpu.best_isa() == "scalar":
        pytest.skip("no repacked layout on this architecture")
    assert all(m.repacked for m in q5)
    from gguf_serve.engine.config import EngineConfig

    files = load_model(gemma_path, device="cpu", n_seq=1, config=EngineConfig.resolve(cpu_repack=False))
    assert not any(m.repacked for layer in files.model.layers for m in layer.mlp.gate_up.linears)
    ids = lm.tokenizer("The capital of France is the city of")["input_ids"]
    for model in (lm, files):
        model._slot = model.cache.allocate()
    try:
        out = []
        for model in (lm, files):
            steps = [model.forward(Batch.of([(model._slot, ids[:5], 0)]))[0]]
            steps += [model.forward(Batch.of([(model._slot, [t], 5 + i)]))[0] for i, t in enumerate(ids[5:9])]
            out.append(torch.stack(steps))
        # the same argmax at every step the winner leads by more than the layouts' rounding moves it (the
        # fifth token's top two are 0.05 apart: either layout's pick is a coin toss there), and logits as close
        # as that rounding lets them be: an activation rounded to the other 8-bit value in a later layer moves
        # logits by ~0.1-1 (each layout is as far from the exact model too), far less than the logits' spread
        top2 = out[1].topk(2, dim=-1).values
        clear = top2[:, 0] - top2[:, 1] > 0.5
        assert clear.sum() >= 3
        assert torch.equal(out[0].argmax(-1)[clear], out[1].argmax(-1)[clear])
        for a, b in zip(out[0], out[1]):
            assert torch.corrcoef(torch.stack([a, b]))[0, 1] > 0.995  # as the native kernels against the exact model
    finally:
        for model in (lm, files):
            model.cache.free(model._slot)


def test_a_decode_steps_embedding_rows_equal_the_gathered_lookup(gemma_path):
    """A few ids (a decode step) are dequantized row by row straight from the table; many
    (a prompt) through get_rows' gather: the same floats, the same scaling, the same error
    for an id out of range."""
    from gguf_serve.engine.modules import Weights

    w = Weights(GGUFReader(gemma_path), torch.device("cpu"), torch.float32, kernels.settings())
    emb = w.embedding("token_embd.weight", 262144, 640, scale=640 ** 0.5)
    assert emb._rows is not None
    ids = torch.tensor([2, 1000, 262143, 1000])
    few = emb(ids)
    many = emb(torch.cat([ids, torch.arange(20)]))[:4]
    assert torch.equal(few, many)
    table = w.info("token_embd.weight")
    expected = dequantize(table.data[[2, 1000, 262143, 1000]], table.ggml_type, (4, 640)) * np.float32(640 ** 0.5)
    assert np.array_equal(few.numpy(), expected)
    for bad in ([5, 262144], [-1]):
        with pytest.raises(IndexError, match="out of range"):
            emb(torch.tensor(bad))


def test_a_failing_native_call_names_the_call_and_its_status():
    """The library's status codes arrive with their names (gc.h's gc_status), not bare numbers."""
    w = torch.zeros(4, 64 * 4, dtype=torch.uint8)
    with pytest.raises(cpu.KernelError, match=r"gc_dequantize: UNSUPPORTED for F32, 4 x 64"):
        K.dequantize_rows(w, int(GGMLType.F32), 4, 64)
    with pytest.raises(cpu.KernelError, match=r"gc_mul_mat: UNSUPPORTED for Q4_K, 4 x 100"):
        K.mul_mat_rows(w, torch.zeros(1, 100), int(GGMLType.Q4_K), 4)
    assert [s.name for s in cpu.Status] == ["OK", "UNSUPPORTED", "NO_MEMORY", "BAD_EXPERT"]
