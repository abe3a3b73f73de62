"""The native CPU kernels' multi-row dots: four and eight activation rows at a time and the
tiles, each against the one-row dots (a decode batch's rows keep the bits they have alone;
the tiles equal up to rounding and within the activation quantization's bound)."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from gguf_serve.engine.kernels import cpu
from gguf_serve.gguf_io import GGMLType, dequantize

from helpers import random_packed
from kernel_cases import FLOATS, ISAS, K, LOW_BIT, SIGNED32, act_block, activation_bound, restore_isa, weights  # noqa: F401 (restore_isa: the fixture)


def product(packed, x, gtype, rows, *, isa=None, tiles=True, x8=True, amx=False, vnni=True):
    """The kernels' product on one ISA level (None: the best) with the integer tiles, the
    eight-row dots, AVX-512 VNNI's strips and AMX's bfloat16 prompts (where the CPU has
    it) on or off, the defaults restored after."""
    try:
        cpu.set_isa(isa)
        cpu.set_tiles(tiles)
        cpu.set_x8(x8)
        cpu.set_amx(amx)
        cpu.set_vnni(vnni)
        return K.mul_mat(packed, x, gtype, rows)
    finally:
        cpu.set_tiles(True)
        cpu.set_x8(True)
        cpu.set_amx(True)
        cpu.set_vnni(True)
        cpu.set_isa(None)


X8 = [GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.Q4_1, GGMLType.Q5_1, GGMLType.IQ4_NL, GGMLType.MXFP4]


@pytest.mark.parametrize("n", [8, 13, 16, 23])
@pytest.mark.parametrize("gtype", X8, ids=lambda t: t.name)
def test_eight_row_dots_equal_the_four_row_ones(gtype, n):
    """With AVX-512 VNNI, 8 to 23 activation rows against the 32-block types (untiled
    there: up to 16 rows for all, up to 31 for Q8_0, IQ4_NL, MXFP4; the others' rows past
    their last whole tile) go eight at a time through one vpdpbusd per row pair, the rest
    four or one at a time: the same integer sums and the same float steps per row, so the
    same bits as the four-row and one-row dots."""
    if "avx512" not in cpu.isas():
        pytest.skip("the eight-row dots are AVX-512 VNNI code; this CPU has no AVX-512")
    rng = np.random.default_rng(14)
    rows, cols = 43, 640
    packed = torch.from_numpy(weights(rng, gtype, rows, cols))
    x = torch.randn(n, cols)
    rowwise = product(packed, x, gtype, rows, tiles=False, x8=False)
    assert torch.equal(product(packed, x, gtype, rows, tiles=False), rowwise)


DECODE_TYPES = [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.IQ4_NL,
                GGMLType.MXFP4, GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K,
                GGMLType.IQ4_XS] + LOW_BIT + FLOATS


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("gtype", DECODE_TYPES, ids=lambda t: t.name)
def test_decode_batches_give_each_row_its_bits_alone(gtype, isa):
    """Batch-invariant decode: up to 16 activation rows (a decode step of up to 16
    sequences) take the four- and eight-row dots, which do each row's arithmetic as the
    one-row dot does, so every row of the batch is bit for bit the row alone; on every
    ISA level, in the file's layout and the repacked one (Q5_0, MXFP4). From 17 rows the
    tiles sum in another order (equal up to rounding, test_tiles_equal_the_row_wise_dots)."""
    rng = np.random.default_rng(400 + int(gtype))
    rows, cols = 72, 1024
    packed = torch.from_numpy(weights(rng, gtype, rows, cols))
    try:
        cpu.set_isa(isa)
        rep = K.repacked(packed, gtype, rows, cols)
        for mm in [cpu.MulMat(K, packed, gtype, rows, cols)] + ([cpu.MulMat(K, packed, gtype, rows, cols, native=rep)]
                                                             if rep else []):
            x = torch.randn(16, cols) * 3
            alone = torch.cat([mm(x[i:i + 1]) for i in range(16)])
            for n in (2, 3, 4, 5, 7, 8, 9, 13, 16):
                assert torch.equal(mm(x[:n]), alone[:n]), (n, rep is not None)
    finally:
        cpu.set_isa(None)


@pytest.mark.parametrize("n", [1, 4, 8, 13])
@pytest.mark.parametrize("gtype", SIGNED32, ids=lambda t: t.name)
def test_signed_blocks_against_activations_of_one_sign(gtype, n):
    """Activations all positive (after a ReLU-like gate, or an embedding model's pooled
    inputs): the AVX-512 VNNI dots of the signed types take the weights' block sums back
    as integers; offsetting the weights by 128 through the activations' float sums
    instead cancelled 128 sum(x) against itself and lost up to 1e-3 of the result's
    scale. Equal to the AVX2 sign trick's exact integers within float rounding."""
    if "avx512" not in cpu.isas():
        pytest.skip("the VNNI dots are AVX-512 code; this CPU has no AVX-512")
    rng = np.random.default_rng(16)
    rows, cols = 40, 640
    packed = torch.from_numpy(weights(rng, gtype, rows, cols))
    x = torch.randn(n, cols).abs() + 3.0
    out = {}
    try:
        for isa in ("avx2", "avx512"):
            cpu.set_isa(isa)
            out[isa] = K.mul_mat(packed, x, gtype, rows)
    finally:
        cpu.set_isa(None)
    torch.testing.assert_close(out["avx512"], out["avx2"], rtol=1e-6, atol=1e-6 * float(out["avx2"].abs().max()))


TILED = [GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1,
         GGMLType.Q8_0, GGMLType.IQ4_NL, GGMLType.MXFP4, GGMLType.IQ4_XS] + [t for t in LOW_BIT if t.block_size == 256] + FLOATS


# the tiles' code paths: each ISA level with tiles; on AVX-512 the 256-block types take
# arch/x86_strips.c's strips unless they are turned off ("avx512-tiles")
TILE_PATHS = [i for i in ISAS if i != "scalar"] + (["avx512-tiles"] if "avx512" in ISAS else [])


@pytest.mark.parametrize("path", TILE_PATHS)
@pytest.mark.parametrize("rows,n", [(43, 8), (43, 13), (43, 64), (43, 300), (2051, 13), (2051, 17)])
@pytest.mark.parametrize("gtype", TILED, ids=lambda t: t.name)
def test_tiles_equal_the_row_wise_dots(gtype, rows, n, path):
    """From 8 activation rows, these types' weight rows go through repacked tiles of eight;
    rows past the last whole tile (43 = 5 x 8 + 3) the row-wise dots. 300 activation rows
    meet the tiles in several cache-sized runs, 2051 weight rows give a thread more tiles
    than it packs at once. Same integer sums, so equal up to float rounding; and within
    the activation quantization's bound of the exact product. On each ISA level with tiles
    (the k-quants have their own AVX-512 tile layout; on AVX-512 the 256-block types take
    VNNI's strips of eight weight rows against sixteen activation rows from 17 rows, F16
    and BF16 float strips from 24: 17 leaves fifteen lanes of the second group empty, 300
    ends inside one, 43 weight rows end in a strip of three)."""
    rng = np.random.default_rng(13)
    isa, vnni = path.removesuffix("-tiles"), not path.endswith("-tiles")
    cols = 1024 if rows < 1000 else 256
    packed = torch.from_numpy(weights(rng, gtype, rows, cols))
    x = torch.randn(n, cols)
    rowwise = product(packed, x, gtype, rows, isa=isa, tiles=False)
    tiles = product(packed, x, gtype, rows, isa=isa, vnni=vnni)
    torch.testing.assert_close(tiles, rowwise, rtol=1e-5, atol=1e-6 * float(rowwise.abs().max()))
    if 32 <= n <= K.gemv_max_rows:  # the tiles did run: they sum in another order than the row-wise dots
        assert not torch.equal(tiles, rowwise)
    W = dequantize(packed.numpy(), gtype, (rows, cols)).astype(np.float64)
    bound = activation_bound(W, x.double().numpy(), 256 if gtype in (GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K) else 32)
    assert np.all(np.abs(tiles.numpy() - x.double().numpy() @ W.T) <= bound * 1.001 + 1e-4)



FOUR_ROW = [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.IQ4_NL, GGMLType.MXFP4,
            GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K]


@pytest.mark.parametrize("gtype", FOUR_ROW, ids=lambda t: t.name)
def test_four_row_dots_equal_one_row_dots_on_every_isa(gtype):
    """Four to seven activation rows (below the tiles) take each ISA's four-row dots (AVX2's
    sign trick; AVX-512 VNNI's unsigned bytes with the offset through the block sums) plus
    one-row dots for the rest: equal to one row at a time up to summation order, on every
    bit pattern a block can hold."""
    rng = np.random.default_rng(300 + int(gtype))
    rows, cols = 19, 1024
    packed = torch.from_numpy(random_packed(rng, gtype, rows, cols // gtype.block_size, f16_scale=0.02))
    x = torch.randn(7, cols)
    W = dequantize(packed.numpy(), gtype, (rows, cols)).astype(np.float64)
    bound = activation_bound(W, x.double().numpy(), act_block(gtype))
    try:
        cpu.set_tiles(False)
        for isa in ISAS:
            cpu.set_isa(isa)
            single = torch.cat([K.mul_mat_rows(packed, x[i:i + 1], int(gtype), rows) for i in range(7)])
            for n in (4, 7):
                got = K.mul_mat_rows(packed, x[:n], int(gtype), rows)
                torch.testing.assert_close(got, single[:n], rtol=1e-5, atol=1e-5 * float(single.abs().max()))
                assert np.all(np.abs(got.numpy() - x[:n].double().numpy() @ W.T) <= bound[:n] * 1.001 + 1e-4), isa
    finally:
        cpu.set_tiles(True)


AMX = [GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.IQ4_NL,
       GGMLType.IQ4_XS] + LOW_BIT + FLOATS
NO_AMX = "this CPU has no AMX-BF16 (Sapphire Rapids and later): the integer tiles above take its prompts"


@pytest.mark.parametrize("rows,n,cols", [(43, 17, 1024), (64, 40, 512), (2051, 33, 256), (96, 100, 768)])
@pytest.mark.parametrize("gtype", AMX, ids=lambda t: t.name)
def test_amx_prompts_are_the_bfloat16_product(gtype, rows, n, cols):
    """Where the CPU has AMX, 17 and more activation rows against these types take
    bfloat16 tiles: each weight (dequantized in float32) and each activation rounded once to
    bfloat16, the products summed in float32, so the bfloat16 product computed here in
    float64 up to float32 rounding, and within bfloat16's rounding of the exact product.
    43 and 2051 weight rows end in a short strip of 32, 17, 33 and 100 activation rows in
    a padded block of 16; 64 BF16 rows are read as the file holds them."""
    if not cpu.set_amx(True):
        pytest.skip(NO_AMX)
    rng = np.random.default_rng(17 + int(gtype))
    packed = torch.from_numpy(weights(rng, gtype, rows, cols))
    x = torch.randn(n, cols)
    got = product(packed, x, gtype, rows, amx=True).double()
    W = torch.from_numpy(dequantize(packed.numpy(), gtype, (rows, cols)).astype(np.float32))
    Wb, xb = W.to(torch.bfloat16).double(), x.to(torch.bfloat16).double()
    mag = xb.abs() @ Wb.abs().T
    assert ((got - xb @ Wb.T).abs() <= 2.0 ** -16 * mag + 1e-30).all()
    exact = x.double() @ W.double().T
    assert ((got - exact).abs() <= 2.0 ** -8 * (x.double().abs() @ W.double().abs().T) + 1e-30).all()
    assert not torch.equal(got, product(packed, x, gtype, rows).double())  # the integer tiles: other sums


@pytest.mark.parametrize("n", [17, 40, 300])
@pytest.mark.parametrize("gtype", [GGMLType.Q1_0, GGMLType.Q2_0], ids=lambda t: t.name)
def test_vnni_strips_take_the_sub_256_block_types(gtype, n):
    """Q1_0 (blocks of 128) and Q2_0 (64) have no tiles: their prompts' rows went through
    the row-wise dots on every CPU. On AVX-512 VNNI, matrices whose rows are whole
    256-blocks take the strips (activations quantized per 256, so within that bound),
    equal to the row-wise dots up to that quantization and faster (bench/weight_types.py)."""
    if "avx512" not in ISAS:
        pytest.skip("the VNNI strips are AVX-512 code; this CPU has no AVX-512")
    rng = np.random.default_rng(21)
    rows, cols = 37, 1024
    packed = torch.from_numpy(weights(rng, gtype, rows, cols))
    x = torch.randn(n, cols)
    strips = product(packed, x, gtype, rows, isa="avx512")
    rowwise = product(packed, x, gtype, rows, isa="avx512", vnni=False)
    W = dequantize(packed.numpy(), gtype, (rows, cols)).astype(np.float64)
    exact = x.double().numpy() @ W.T
    assert np.all(np.abs(strips.numpy() - exact) <= activation_bound(W, x.double().numpy(), 256) * 1.001 + 1e-4)
    assert np.all(np.abs(rowwise.numpy() - exact) <= activation_bound(W, x.double().numpy(), 32) * 1.001 + 1e-4)
    assert not torch.equal(strips, rowwise)  # the strips ran: another activation quantization


def test_a_float32_prefill_keeps_the_integer_tiles():
    """A model whose prefill dtype is float32 (GGUF_SERVE_PREFILL_DTYPE) keeps its prompts'
    products off AMX's bfloat16: the integer products' bits (VNNI's strips on AVX-512)."""
    if not cpu.set_amx(True):
        pytest.skip(NO_AMX)
    rng = np.random.default_rng(5)
    packed = torch.from_numpy(weights(rng, GGMLType.Q4_K, 64, 512))
    x = torch.randn(40, 512)
    tiles = product(packed, x, GGMLType.Q4_K, 64)
    with replace(K, prefill_dtype=torch.float32).using_isa():
        assert torch.equal(K.mul_mat(packed, x, GGMLType.Q4_K, 64), tiles)
    with replace(K, prefill_dtype=torch.bfloat16).using_isa():
        assert not torch.equal(K.mul_mat(packed, x, GGMLType.Q4_K, 64), tiles)


@pytest.mark.parametrize("gtype", [t for t in LOW_BIT if t.block_size == 256] + [GGMLType.Q1_0], ids=lambda t: t.name)
def test_low_bit_rows_give_the_same_bits_on_avx2_and_avx512(gtype):
    """AVX-512 takes the grid types a block at a time (gathered grid points, sign masks on
    the activations) and Q1_0's bits as masks: the same integer sums and float steps as the
    AVX2 bodies, so the same bits, one row or four."""
    if "avx512" not in ISAS:
        pytest.skip("this CPU has no AVX-512")
    rng = np.random.default_rng(40 + int(gtype))
    packed = torch.from_numpy(weights(rng, gtype, 37, 1024))
    x = torch.randn(4, 1024)
    out = {}
    for isa in ("avx2", "avx512"):
        cpu.set_isa(isa)
        out[isa] = torch.cat([K.mul_mat_rows(packed, x[i:i + 1], int(gtype), 37) for i in range(4)])
        assert torch.equal(K.mul_mat_rows(packed, x, int(gtype), 37), out[isa])
    assert torch.equal(out["avx2"], out["avx512"])
