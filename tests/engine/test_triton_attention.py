"""Attention over the KV cache as Triton kernels (engine.kernels.triton_attention) and the
cache's quantized rows on the device (engine.kernels.device_rows), run through Triton's
interpreter on the CPU (tests/conftest.py sets TRITON_INTERPRET=1): the decode kernel
equals torch's attention over the same cache for full layers, windows, rings, chunks, soft
caps, sinks, grouped heads, long caches split across programs and every quantized row type;
tiny models' decode steps through the Triton path give the reference path's logits."""

from __future__ import annotations

import pytest
import torch

from gguf_serve.engine import EngineConfig, load_model
from gguf_serve.engine.batch import Batch
from gguf_serve.engine.kernels import device_rows, triton_attention, triton_ops
from gguf_serve.engine.kernels.ops import TORCH_OPS
from gguf_serve.engine.kv_rows import KV_TYPES
from gguf_serve.gguf_io.quants import dequantize, quantize

from oracles import prompt_logits
from tiny_models import random_model, spec, write_gguf

pytestmark = pytest.mark.skipif(not triton_ops.AVAILABLE, reason="the triton package is not installed "
                                "(the test extra installs it)")

QUANTIZED = [name for name, t in KV_TYPES.items() if t.quantized]


def _both(q, k, v, batch, n_cells, window=0, softcap=None, sinks=None, types=None, chunk=0, scale=0.125):
    """torch's attention and the Triton ops' over the same cache."""
    want = TORCH_OPS.attention(q, k, v, batch, n_cells, window, scale, softcap, sinks=sinks, types=types,
                               chunk=chunk)
    batch.memo.clear()
    got = triton_attention.TRITON_OPS.attention(q, k, v, batch, n_cells, window, scale, softcap, sinks=sinks,
                                                types=types, chunk=chunk)
    batch.memo.clear()
    return want, got


CASES = {  # name: (head_dim, query heads, cells, items (slot, tokens, first position), window, chunk, softcap, sinks)
    "full": (64, 4, 40, [(0, 1, 10), (2, 3, 30)], 0, 0, None, False),
    "window": (64, 4, 40, [(0, 1, 10), (2, 3, 30)], 5, 0, None, False),
    "ring": (64, 4, 8, [(0, 1, 20), (1, 2, 5), (2, 3, 30)], 6, 0, None, False),
    "chunk": (64, 4, 40, [(0, 1, 17), (2, 3, 30)], 0, 8, None, False),
    "softcap": (64, 4, 40, [(0, 1, 10), (2, 3, 30)], 0, 0, 30.0, False),
    "sinks and a window": (64, 4, 40, [(0, 1, 10), (2, 3, 30)], 4, 0, None, True),
    "head size 80, 3 heads a group": (80, 6, 40, [(1, 1, 0), (2, 16, 20)], 0, 0, None, False),
    "split cells": (96, 4, 1100, [(0, 1, 1049), (2, 2, 300)], 0, 0, None, False),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_decode_attention_equals_torchs_over_the_same_cache(case):
    d, h, cells, items, window, chunk, cap, with_sinks = CASES[case]
    g = torch.Generator().manual_seed(len(case))
    k, v = torch.randn(3, 2, cells, d, generator=g), torch.randn(3, 2, cells, d, generator=g)
    batch = Batch.of([(slot, [1] * n, pos) for slot, n, pos in items], want="all")
    q = torch.randn(batch.n_tokens, h, d, generator=g)
    sinks = torch.randn(h, generator=g) if with_sinks else None
    want, got = _both(q, k, v, batch, cells, window, cap, sinks, chunk=chunk)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", QUANTIZED)
def test_quantized_rows_on_the_device_are_gguf_ios_and_attention_reads_them_in_the_kernel(name):
    t = KV_TYPES[name]
    g = torch.Generator().manual_seed(t.ggml)
    x = torch.randn(3, 2, 48, 64, generator=g) * 3
    x[0, 0, 0, :32] = 0  # an all-zero block: a zero scale
    rows = device_rows.quantize(x, t.ggml)
    assert torch.equal(rows, torch.from_numpy(quantize(x.numpy(), t.ggml)))
    assert torch.equal(device_rows.dequantize(rows, t.ggml, 64, torch.float32),
                       torch.from_numpy(dequantize(rows.numpy(), t.ggml, (3, 2, 48, 64))))
    vrows = device_rows.quantize(x.flip(2), t.ggml)
    batch = Batch.of([(0, [1], 40), (1, [1, 2, 3], 20)], want="all")
    q = torch.randn(batch.n_tokens, 4, 64, generator=g)
    want, got = _both(q, rows, vrows, batch, 48, types=(t, t))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_prompts_and_media_stay_with_torchs_attention():
    """Many tokens of a sequence (a prompt) and images that see each other go through SDPA."""
    g = torch.Generator().manual_seed(3)
    k, v = torch.randn(2, 2, 40, 64, generator=g), torch.randn(2, 2, 40, 64, generator=g)
    batch = Batch.of([(0, list(range(1, 31)), 0)], want="all")
    q = torch.randn(30, 4, 64, generator=g)
    want, got = _both(q, k, v, batch, 40)
    assert torch.equal(got, want)
    batch = Batch.of([(1, [1, 2, 3, 4], 0)], want="all")
    batch.media_spans[1] = [(1, 3)]
    q = torch.randn(4, 4, 64, generator=g)
    want = TORCH_OPS.attention(q, k, v, batch, 40, 0, 0.125, media_both_ways=True)
    batch.memo.clear()
    got = triton_attention.TRITON_OPS.attention(q, k, v, batch, 40, 0, 0.125, media_both_ways=True)
    assert torch.equal(got, want)


def _stepped_pair(lm, ref, prompts, steps):
    """Logits of `steps` joint decode steps of several sequences after their prompts, through
    both models (each its own cache)."""
    out = []
    for model in (lm, ref):
        slots = [model.cache.allocate() for _ in prompts]
        try:
            model.forward(Batch.of([(s, p, 0) for s, p in zip(slots, prompts)], want="none"))
            logits = []
            for i in range(steps):
                items = [(s, [(7 * i + 3 * j) % 200 + 1], len(p) + i) for j, (s, p) in enumerate(zip(slots, prompts))]
                logits.append(model.forward(Batch.of(items, want="last")))
            out.append(torch.stack(logits))
        finally:
            for s in slots:
                model.cache.free(s)
    return out


MODELS = {  # arch: cache type; each adds a case: full attention with a q8_0 cache, sliding rings shorter than the
    # context, sinks with windows, gated attention between recurrent layers (F32 weights: torch's products,
    # the same in both paths, so that the cache holds the same rows and only the attention differs)
    "llama": "q8_0",
    "gemma3": None,
    "gpt-oss": None,
    "qwen35": "q4_0",
}


@pytest.mark.parametrize("arch", MODELS)
def test_decode_steps_through_the_triton_path_equal_the_reference_paths(arch, tmp_path):
    cache_type = MODELS[arch]
    s = spec(arch)
    path = tmp_path / f"{arch}.gguf"
    write_gguf(s, random_model(s), path, "F32")
    common = dict(device="cpu", n_ctx=64, max_batch=4, cache_type_k=cache_type, cache_type_v=cache_type)
    lm = load_model(str(path), config=EngineConfig(kernels="triton", **common))
    ref = load_model(str(path), config=EngineConfig(kernels="reference", **common))
    assert lm.model.ops is triton_attention.TRITON_OPS and ref.model.ops is not triton_attention.TRITON_OPS
    got, want = _stepped_pair(lm, ref, [[5, 9, 200, 17, 3, 8], [11, 12, 13]], 8)  # past gemma3's ring of 12
    # float32 sums in another order, carried from step to step through the cache's rows
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    torch.testing.assert_close(prompt_logits(lm, [1, 5, 9]), prompt_logits(ref, [1, 5, 9]), rtol=1e-4, atol=1e-4)
