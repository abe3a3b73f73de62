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
    out = {}
    for arch in ("gemma3", "qwen35"):
        s = spec(arch)
        path = tmp_path_factory.mktemp(arch) / f"{arch}.gguf"
        write_gguf(s, random_model(s, seed=3), path, "Q8_0")
        out[arch] = str(path)
    yield out
    del os.environ[kernels.ENV_OVERRIDE]


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


# ------------------------------------------------------------------ state checkpoints

def test_checkpoints_make_earlier_positions_exact_until_overwritten():
    # one checkpoint: a linear layer's states (4 * (3 * 12 + 2 * 3 * 5) bytes) and the sliding layer's
    # three cells before a position (2 * 2 * 8 * 3 * 4 bytes); the ring (4 + 4 cells) is shorter than the context
    c = KVCache(LAYERS, n_seq=2, n_ctx=100, max_batch=4, checkpoint_budget=1300)
    assert c.checkpoint_size == 4 * (3 * 12 + 2 * 3 * 5) + 2 * 2 * 8 * 3 * 4 == 648
    s = c.allocate()
    c.begin(Batch.of([(s, [0] * 4, 0)]))
    assert not c.can_restart_at(s, 2) and c.restart_point(s, 3) == 0
    with pytest.raises(CacheError, match="taken at its end"):
        c.save(s, 2)
    assert c.save(s, 4)
    for p in (4, 8):
        c.begin(Batch.of([(s, [0] * 4, p)]))
    assert c.save(s)  # at 12
    assert c.checkpoints(s) == [4, 12] and c.can_restart_at(s, 4) and not c.can_restart_at(s, 5)
    assert c.restart_point(s, 11) == 4 and c.restart_point(s, 40) == 12
    # a third does not fit the budget: the least recently used goes
    c.begin(Batch.of([(s, [0] * 4, 12)]))
    c.save(s)
    assert c.checkpoints(s) == [12, 16] and c.checkpoint_stats.evicted == 1 and c.checkpoint_stats.held == 2
    assert c.checkpoint_stats.bytes == 2 * 648
    # going on from 12 restores it (a hit) and drops the checkpoint beyond: its tokens are overwritten
    c.begin(Batch.of([(s, [0] * 2, 12)]))
    assert c.checkpoints(s) == [12] and c.checkpoint_stats.hits == 1 and c.lengths[s] == 14
    assert not c.can_restart_at(s, 16)
    # a rewind restores now; freeing the slot drops its checkpoints
    c.rewind(s, 12)
    assert c.lengths[s] == 12
    with pytest.raises(CacheError, match="cannot go back to 8"):
        c.rewind(s, 8)
    c.free(s)
    assert c.checkpoint_stats.held == 0 and c.checkpoint_stats.bytes == 0
    # nothing to keep for full attention alone, or with no budget
    full = KVCache([attention(2, 8)], n_seq=1, n_ctx=100, max_batch=4, checkpoint_budget=1 << 20)
    s = full.allocate()
    full.begin(Batch.of([(s, [0] * 4, 0)]))
    assert full.checkpoint_size == 0 and not full.save(s) and full.can_restart_at(s, 2)
    assert not KVCache(LAYERS, n_seq=1, n_ctx=100, max_batch=4).save(0)


def test_a_ring_written_after_a_rewind_remembers_what_it_lost():
    """A sliding ring overwritten by a longer history stays lost after the sequence is cut back."""
    c = KVCache([attention(1, 4), attention(1, 4, window=4)], n_seq=1, n_ctx=100, max_batch=4)  # ring of 8
    s = c.allocate()
    for p in range(0, 20, 4):
        c.begin(Batch.of([(s, [0] * 4, p)]))
    c.rewind(s, 16)
    c.begin(Batch.of([(s, [0], 16)]))  # 17 tokens now; positions before 12 were overwritten at 20
    assert not c.can_restart_at(s, 14) and c.can_restart_at(s, 15)


def _tokens(n, seed):
    return torch.randint(0, 250, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("arch", ["gemma3", "qwen35"])
def test_a_checkpoint_gives_the_state_of_a_cold_prefill(tiny_models, arch):
    """Going on from a checkpoint, in its own slot or copied into another, gives the logits
    of a cold prefill of the same tokens (gemma3: rings of 8 + 4 cells, a history of 40)."""
    lm = load_model(tiny_models[arch], device="cpu", n_seq=3, max_batch=4, config=None)
    lm.cache.checkpoint_budget = 1 << 30
    history, turn = _tokens(40, 6), _tokens(6, 7)
    a, b, cold = lm.cache.allocate(), lm.cache.allocate(), lm.cache.allocate()
    for p in range(0, 40, 4):
        lm.forward(Batch.of([(a, history[p:p + 4], p)], want="none"))
        if p + 4 == 24:
            assert lm.cache.save(a)
    assert not lm.cache._natural_restart(a, 24)  # lost without the checkpoint
    lm.cache.copy_prefix(a, b, 24)
    lm.cache.rewind(a, 24)
    want = lm.forward(Batch.of([(cold, history[:24], 0)], want="none"))
    want = lm.forward(Batch.of([(cold, turn, 24)], want="all"))
    assert torch.equal(lm.forward(Batch.of([(a, turn, 24)], want="all")), want)
    assert torch.equal(lm.forward(Batch.of([(b, turn, 24)], want="all")), want)
