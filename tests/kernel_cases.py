"""What the native CPU kernels' tests share: the types and ISA levels they cover, the
kernels object for direct calls, weights of every type, and the bound 8-bit activation
quantization puts on a product (tests/engine/test_cpu_kernels.py, test_cpu_rows.py)."""

import numpy as np
import pytest

from gguf_serve.engine.kernels import cpu
from gguf_serve.gguf_io import GGMLType, quantize

from helpers import random_packed

# the codebook, ternary, 1- and 2-bit types, and the float files' (no quantizer here: random blocks)
LOW_BIT = [GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ2_S, GGMLType.IQ3_XXS, GGMLType.IQ3_S, GGMLType.IQ1_S,
           GGMLType.IQ1_M, GGMLType.TQ1_0, GGMLType.TQ2_0, GGMLType.Q1_0, GGMLType.Q2_0]
FLOATS = [GGMLType.F16, GGMLType.BF16]
TYPES = [GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q8_0, GGMLType.Q5_K, GGMLType.Q5_0, GGMLType.Q4_0, GGMLType.Q4_1,
         GGMLType.Q5_1, GGMLType.Q3_K, GGMLType.Q2_K, GGMLType.IQ4_NL, GGMLType.IQ4_XS, GGMLType.MXFP4] + LOW_BIT + FLOATS
ISAS = cpu.isas()[:cpu.isas().index(cpu.best_isa()) + 1] if cpu.load() is not None else ["scalar"]
# direct calls: the default settings, on the process's code path (cpu.set_isa)
K = cpu.CpuKernels.make() if cpu.load() is not None else None


SIGNED32 = [GGMLType.Q8_0, GGMLType.IQ4_NL, GGMLType.MXFP4]


@pytest.fixture(autouse=True)
def restore_isa():
    yield
    if cpu.load() is not None:
        cpu.set_isa(None)


def weights(rng, t, rows, cols):
    if t in (GGMLType.IQ4_NL, GGMLType.IQ4_XS, *LOW_BIT, *FLOATS):  # no quantizer: random blocks with sane scales
        return random_packed(rng, t, rows, cols // t.block_size, f16_scale=0.02)
    return quantize(rng.standard_normal((rows, cols)).astype(np.float32), t)


def act_block(t: GGMLType) -> int:
    """The block of the 8-bit activations a type's dots take (1: float32 activations,
    whose bound is then one step of 127 per element, far looser than float32's)."""
    return 256 if t.block_size == 256 else 1 if t in FLOATS else 32


def activation_bound(W: np.ndarray, x: np.ndarray, block: int) -> np.ndarray:
    """|y - exact| per output: each x block is rounded to 127 levels of its absmax, so an
    element moves at most absmax/254; the dot moves at most that times sum |w|."""
    xb = x.reshape(x.shape[0], -1, block)
    half_step = np.abs(xb).max(axis=-1) / 254.0  # (n_x, blocks)
    wb = np.abs(W).reshape(W.shape[0], -1, block).sum(axis=-1)  # (rows, blocks)
    return half_step @ wb.T
