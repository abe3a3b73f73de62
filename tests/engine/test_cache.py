"""The engine's KV cache: sizes per layer kind, slot bookkeeping, the checks a batch
must pass, exact restarts and forks, and the default size chosen from memory."""

import pytest
import torch

from gguf_serve.engine import load_model, loader
from gguf_serve.engine.batch import Batch
from gguf_serve.engine.cache import CacheError, KVCache, attention, bytes_per_token, linear

from tiny_models import random_model, spec, write_gguf

LAYERS = [attention(2, 8), attention(2, 8, window=4), linear(12, 4, 2, 3, 5)]


def test_buffers_per_layer_kind_and_their_size():
    c = KVCache(LAYERS, n_seq=3, n_ctx=100, max_batch=16)
    assert c.k[0].shape == (3, 2, 100, 8)  # full attention: a cell per position
    assert c.k[1].shape == (3, 2, 20, 8)  # sliding: window + max_batch cells
    assert c.conv[2].shape == (3, 3, 12) and c.state[2].shape == (3, 2, 3, 5)  # conv: (slots, kernel - 1, channels)
    assert c.k[2] is None and c.conv[0] is None
    assert bytes_per_token(LAYERS, torch.float32) == 2 * 2 * 8 * 4
    assert c.nbytes == 4 * (2 * 3 * 2 * 100 * 8 + 2 * 3 * 2 * 20 * 8 + 3 * 12 * 3 + 3 * 2 * 3 * 5)
    assert "3 sequence(s) x 100 tokens, 0.1 KiB per token" in c.describe()
    assert KVCache(LAYERS, 1, n_ctx=10, max_batch=16).k[1].shape[2] == 10  # a ring no longer than the context


def test_slots_are_allocated_and_freed():
    c = KVCache(LAYERS, n_seq=2, n_ctx=50, max_batch=8)
    a, b = c.allocate(), c.allocate()
    assert {a, b} == {0, 1} and c.free_slots == 0
    with pytest.raises(CacheError, match="all 2 sequence slots are in use"):
        c.allocate()
    c.free(a)
    with pytest.raises(CacheError, match=f"slot {a} is not allocated"):
        c.free(a)
    with pytest.raises(CacheError, match="slot 7 out of range 0..1"):
        c.free(7)
    assert c.allocate() == a


def test_batches_that_do_not_fit_are_refused_and_change_nothing():
    c = KVCache([attention(1, 4), attention(1, 4, window=4)], n_seq=2, n_ctx=40, max_batch=8)
    s = c.allocate()
    c.begin(Batch.of([(s, [1, 2, 3], 0)]))
    assert c.lengths[s] == 3
    with pytest.raises(CacheError, match="holds 3 tokens and cannot go on from position 5"):
        c.begin(Batch.of([(s, [1], 5)]))  # a gap
    with pytest.raises(CacheError, match="is not allocated"):
        c.begin(Batch.of([(1 - s, [1], 0)]))
    with pytest.raises(CacheError, match="exceeds max_batch 8"):
        c.begin(Batch.of([(s, list(range(9)), 3)]))
    c.begin(Batch.of([(s, list(range(8)), 3)]))
    c.begin(Batch.of([(s, list(range(8)), 11)]))
    with pytest.raises(CacheError, match="would reach 43 tokens; the context is 40"):
        c.begin(Batch.of([(s, list(range(8)), 35)]))
    assert c.lengths[s] == 19


def test_restart_points_are_only_the_exact_ones():
    c = KVCache([attention(1, 4), attention(1, 4, window=4)], n_seq=1, n_ctx=100, max_batch=4)  # ring of 8
    s = c.allocate()
    for p in range(0, 20, 4):
        c.begin(Batch.of([(s, [0] * 4, p)]))
    # 20 tokens; the ring holds positions 12..19, and going on from p needs p-3..p-1
    assert c.can_restart_at(s, 20) and c.can_restart_at(s, 0) and c.can_restart_at(s, 15)
    assert not c.can_restart_at(s, 14) and not c.can_restart_at(s, 21)
    lin = KVCache([attention(1, 4), linear(4, 4, 1, 2, 2)], n_seq=1, n_ctx=100, max_batch=4)
    s = lin.allocate()
    lin.begin(Batch.of([(s, [0] * 4, 0)]))
    assert not lin.can_restart_at(s, 2)  # a recurrent state exists only at the end


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    import os

    from gguf_serve.engine import kernels

    os.environ[kernels.ENV_OVERRIDE] = "reference"
    kernels.reset()
    out = {}
    for arch in ("gemma3", "qwen35"):
        s = spec(arch)
        path = tmp_path_factory.mktemp(arch) / f"{arch}.gguf"
        write_gguf(s, random_model(s, seed=3), path, "Q8_0")
        out[arch] = str(path)
    yield out
    del os.environ[kernels.ENV_OVERRIDE]
    kernels.reset()


@pytest.mark.parametrize("arch", ["gemma3", "qwen35"])
def test_a_slot_copied_whole_goes_on_exactly_like_its_source(tiny_models, arch):
    lm = load_model(tiny_models[arch], device="cpu", n_seq=2)
    ids = torch.randint(0, 250, (30,), generator=torch.Generator().manual_seed(4)).tolist()
    a, b = lm.cache.allocate(), lm.cache.allocate()
    lm.forward(Batch.of([(a, ids[:20], 0)]))
    lm.cache.copy_prefix(a, b, 20)
    assert lm.cache.lengths[b] == 20
    out_a = lm.forward(Batch.of([(a, ids[20:], 20)]))
    out_b = lm.forward(Batch.of([(b, ids[20:], 20)]))
    assert torch.equal(out_a, out_b)


def test_restarting_a_sequence_at_position_zero_forgets_it(tiny_models):
    lm = load_model(tiny_models["qwen35"], device="cpu")
    ids = torch.randint(0, 250, (12,), generator=torch.Generator().manual_seed(5)).tolist()
    s = lm.cache.allocate()
    first = lm.forward(Batch.of([(s, ids, 0)]))
    lm.forward(Batch.of([(s, ids[:3], 12)]))  # the recurrent and conv states move on
    assert torch.equal(lm.forward(Batch.of([(s, ids, 0)])), first)


def test_default_context_comes_from_the_memory_available(tiny_models, monkeypatch, caplog):
    import logging

    from gguf_serve.engine.cache import fixed_bytes

    lm = load_model(tiny_models["gemma3"], device="cpu")
    # the tiny model's trained context fits easily, for the default number of sequences
    assert lm.n_ctx == 256 and lm.cache.n_seq == loader.DEFAULT_PARALLEL == 8
    specs = lm.model.cache_specs()
    per_token, fixed = bytes_per_token(specs, torch.float32), fixed_bytes(specs, 100_000, 512, torch.float32)
    budget = 2 * (fixed + 5000 * per_token)  # two sequences of 5000 tokens
    monkeypatch.setattr(loader, "available_memory", lambda: int(budget / loader.KV_MEMORY_SHARE))
    ctx, seqs, why = loader.cache_size(specs, 100_000, None, 2, torch.float32, 512)
    assert (ctx, seqs) == (4864, 2) and "raise with n_ctx" in why  # 5000 rounded down to 256s
    assert loader.cache_size(specs, 4000, None, 2, torch.float32, 512)[:2] == (4000, 2)  # trained fits
    assert loader.cache_size(specs, 100_000, 123, 3, torch.float32, 512) == (123, 3, "as asked")
    # by default 8 sequences, halved until each holds MIN_DEFAULT_CTX (8192) tokens: 2 x 9984 here
    budget = 2 * (fixed + 10_000 * per_token)
    monkeypatch.setattr(loader, "available_memory", lambda: int(budget / loader.KV_MEMORY_SHARE))
    assert loader.cache_size(specs, 100_000, None, None, torch.float32, 512)[:2] == (9984, 2)
    assert loader.cache_size(specs, 100_000, 5000, None, torch.float32, 512)[:2] == (5000, 2)  # n_ctx asked
    assert loader.cache_size(specs, 100_000, 40_000, None, torch.float32, 512)[:2] == (40_000, 1)
    monkeypatch.setattr(loader, "available_memory", lambda: 1000)
    assert loader.cache_size(specs, 100_000, None, None, torch.float32, 512)[:2] == (256, 1)  # never below 256
    with caplog.at_level(logging.INFO, logger="gguf_serve.engine"):
        load_model(tiny_models["gemma3"], device="cpu", n_seq=2, n_ctx=64)
    line = [r.getMessage() for r in caplog.records if r.getMessage().startswith("KV cache")][-1]
    assert "2 sequence(s) x 64 tokens" in line and "as asked" in line
