"""Kernel settings per model: two models loaded in one process with different threads,
repacking, prefill dtype and code path (ISA) each keep their own. Their packed weights,
dense ops and thread policy carry the model's settings; a forward of each runs on them;
the first model's outputs are bitwise the same after the second is loaded; and a model's
logits on an ISA are bitwise those of the same model loaded alone (in a fresh process)
with that ISA."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gguf_serve.engine import load_model
from gguf_serve.engine.batch import Batch
from gguf_serve.engine.config import EngineConfig
from gguf_serve.engine.kernels import cpu, reference
from gguf_serve.gguf_io import GGMLType

pytestmark = pytest.mark.skipif(cpu.load() is None, reason="native CPU kernels not built")

PROMPT = [2, 818, 5279, 529, 7001, 563]  # Gemma ids: a six-token prompt (the integer dots)
LONG = 300  # a prompt chunk past bfloat16's row limit (256), within float32's (1024)
CHUNK = [(11 * i) % 3000 + 10 for i in range(64)]  # a prompt in tiles: long tasks that the pool's workers share


def _config(**kw) -> EngineConfig:
    return EngineConfig(device="cpu", n_seq=1, n_ctx=LONG + 16, cache_type_k="f32", cache_type_v="f32", **kw)


def _logits(lm, ids=PROMPT) -> torch.Tensor:
    """The prompt's logits (every row), then two decode steps' (one row each)."""
    slot = lm.cache.allocate()
    try:
        rows = [lm.forward(Batch.of([(slot, ids, 0)], want="all"))]
        for i, t in enumerate((1000, 2000)):
            rows.append(lm.forward(Batch.of([(slot, [t], len(ids) + i)])))
        return torch.cat(rows)
    finally:
        lm.cache.free(slot)


def _q5_0(lm) -> list:
    return [m for layer in lm.model.layers for m in layer.mixer.qkv.linears + layer.mlp.gate_up.linears
            if m.ggml_type == GGMLType.Q5_0]


@pytest.fixture(scope="module")
def two(gemma_path):
    """Model a (1 thread, repacked, float32 prefills), its logits, then model b (2 threads,
    not repacked, bfloat16 prefills) loaded after it."""
    a = load_model(gemma_path, config=_config(threads=1, cpu_repack=True, prefill_dtype="float32"))
    before = _logits(a)
    b = load_model(gemma_path, config=_config(threads=2, cpu_repack=False, prefill_dtype="bfloat16"))
    return a, b, before


def test_each_models_weights_ops_and_policy_carry_its_own_settings(two):
    a, b, _ = two
    for lm, threads, dtype, rows in ((a, 1, torch.float32, 1024), (b, 2, torch.bfloat16, 256)):
        k = lm.kernels.cpu
        assert (k.threads, k.prefill_dtype, k.gemv_max_rows) == (threads, dtype, rows)
        assert lm.threads.kernels is lm.kernels and lm.threads.threads == threads
        assert lm.model.ops.kernels is k and lm.model.ops.threads == threads  # the dense ops' calls
        linears = [m for layer in lm.model.layers for m in layer.mixer.qkv.linears + [layer.mixer.o]]
        assert all(m.kernels.cpu is k and m._call._threads == threads and m._call._max_rows == k.max_rows(m._call.type)
                   for m in linears + [lm.model.head])
        # the integer dots' bound, or float32's where the type's prompts take AMX's bfloat16 tiles
        assert {k.max_rows(m._call.type) for m in linears} <= {rows, 1024}
        assert all(layer.mixer.qkv.native._threads == threads and layer.mixer.qkv._max_rows == rows
                   for layer in lm.model.layers)
        assert lm.model.embed.kernels.cpu is k
        assert f"on {threads} thread(s)" in lm.threads.describe()
    assert a.kernels.cpu.repack and not b.kernels.cpu.repack
    if cpu.best_isa() != "scalar":  # x86-64 with AVX2: Gemma's Q5_0 matrices have a repacked layout
        assert _q5_0(a) and all(m.repacked for m in _q5_0(a))
    assert _q5_0(b) and not any(m.repacked for m in _q5_0(b))


def test_the_first_models_outputs_are_unchanged_by_loading_the_second(two):
    a, b, before = two
    assert torch.equal(_logits(a), before)
    theirs = _logits(b)  # b's forward between a's: a keeps its own settings after it too
    assert torch.equal(_logits(a), before)
    assert int(theirs[len(PROMPT) - 1].argmax()) == int(before[len(PROMPT) - 1].argmax())


def test_a_long_prefill_of_each_takes_its_own_path(two, monkeypatch):
    """300 tokens: b's row limit (bfloat16, 256) sends its matmuls to BLAS on dequantized
    tiles in bfloat16, on b's kernels; a's (float32, 1024) keeps the integer dots; and torch
    gets each model's threads only for a forward past its own limit."""
    a, b, _ = two
    tiles, dequantized = [], []  # the BLAS path's input dtypes; the kernels whose dequantization fed it
    by_tiles = reference.matmul_by_tiles
    monkeypatch.setattr(reference, "matmul_by_tiles",
                        lambda w, x, *args: tiles.append(x.dtype) or by_tiles(w, x, *args))
    native = cpu.CpuKernels.dequantize_rows
    monkeypatch.setattr(cpu.CpuKernels, "dequantize_rows", lambda k, *args: dequantized.append(k) or native(k, *args))
    threads = []
    ops = b.model.ops
    norm = type(ops).rms_norm
    monkeypatch.setattr(ops, "rms_norm", lambda *args: threads.append(torch.get_num_threads()) or norm(ops, *args))
    ids = [(7 * i) % 5000 + 10 for i in range(LONG)]
    _logits(a, ids)
    assert tiles == []
    dequantized.clear()
    _logits(b, ids)
    assert tiles and set(tiles) == {torch.bfloat16}
    assert dequantized and all(k is b.kernels.cpu for k in dequantized)
    assert threads[0] == 2 and threads[-1] == 1  # the prompt past 256 rows: torch on b's 2 threads; decode: 1


def _alone(gemma_path: str, isa: str, folder) -> torch.Tensor:
    """The logits of Gemma loaded with `isa` in a fresh process, where it is the only model."""
    path = [str(Path(__file__).parent), *sys.path]  # this module's helpers
    code = (f"import sys, torch; sys.path[:0] = {json.dumps(path)}\n"
            "from test_kernel_settings import CHUNK, _config, _logits\n"
            "from gguf_serve.engine import load_model\n"
            f"lm = load_model({gemma_path!r}, config=_config(threads=2, cpu_isa={isa!r}))\n"
            "torch.save(torch.cat([_logits(lm), _logits(lm, CHUNK)]), sys.argv[1])\n")
    out = folder / f"{isa}.pt"
    subprocess.run([sys.executable, "-c", code, str(out)], check=True, timeout=300)
    return torch.load(out)


def test_each_model_runs_on_its_own_isa_bitwise_as_alone(gemma_path, monkeypatch, tmp_path):
    """Two models on two code paths (the best and the one below it: avx512 and avx2 on an
    AVX-512 machine) in one process: during each one's forward the calling thread's path is
    the model's, and each one's logits (its pool's threads too) are bitwise those of the
    model loaded alone with that ISA."""
    isas = cpu.isas()[:cpu.isas().index(cpu.best_isa()) + 1]
    if len(isas) < 2:
        pytest.skip("one code path on this CPU")
    low, high = isas[-2], isas[-1]
    lo = load_model(gemma_path, config=_config(threads=2, cpu_isa=low))
    first = torch.cat([_logits(lo), _logits(lo, CHUNK)])
    hi = load_model(gemma_path, config=_config(threads=2, cpu_isa=high))
    assert (lo.kernels.cpu.isa, hi.kernels.cpu.isa) == (low, high)
    assert f"({low})" in lo.threads.describe() and lo.model.head.kernels.name == f"cpu-native ({low})"
    paths = []
    for lm in (lo, hi):
        ops = lm.model.ops
        norm = type(ops).rms_norm
        monkeypatch.setattr(ops, "rms_norm", lambda *args, ops=ops, norm=norm: paths.append(
            cpu.path_isa(GGMLType.Q8_0)) or norm(ops, *args))
    ours_hi = torch.cat([_logits(hi), _logits(hi, CHUNK)])
    ours_lo = torch.cat([_logits(lo), _logits(lo, CHUNK)])
    assert set(paths[:len(paths) // 2]) == {high} and set(paths[len(paths) // 2:]) == {low}
    assert cpu.path_isa(GGMLType.Q8_0) == high  # outside a forward: the process's (the best)
    assert torch.equal(ours_lo, first)
    assert torch.equal(ours_lo, _alone(gemma_path, low, tmp_path))
    assert torch.equal(ours_hi, _alone(gemma_path, high, tmp_path))
    assert not torch.equal(ours_lo, ours_hi)  # the two paths do round differently
