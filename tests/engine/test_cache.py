"""The generation KV cache: full-attention layers append into a buffer with spare room;
the results must equal transformers' DynamicCache exactly, through buffer growth,
crop and reset, and other layer kinds (sliding window, linear attention) stay as
transformers builds them."""

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from gguf_serve.engine import cache as kv
from gguf_serve.engine import load_model

from tiny_models import random_model, spec, write_gguf


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = {}
    for arch in ("qwen3", "gemma3", "qwen35"):
        s = spec(arch)
        path = tmp_path_factory.mktemp(arch) / f"{arch}.gguf"
        write_gguf(s, random_model(s, seed=3), path, "Q8_0")
        out[arch] = load_model(str(path), device="cpu")
    return out


def _decode(lm, cache, ids, steps):
    """Logits of a prefill of `ids` and `steps` greedy decode steps."""
    logits = []
    with torch.inference_mode():
        out = lm.model(input_ids=ids, cache=cache, use_cache=True)
        logits.append(out.logits[0, -1])
        for _ in range(steps):
            tok = out.logits[:, -1:].argmax(-1)
            out = lm.model(input_ids=tok, cache=cache, use_cache=True)
            logits.append(out.logits[0, -1])
    return torch.stack(logits)


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "qwen35"])
def test_append_cache_equals_dynamic_cache_through_growth(models, arch, monkeypatch):
    monkeypatch.setattr(kv, "MIN_CAPACITY", 4)  # grows at 4 -> 22 -> 46 positions below
    lm = models[arch]
    ids = torch.randint(0, 250, (1, 11), generator=torch.Generator().manual_seed(4))
    cache = kv.new_cache(lm.model.config)
    kinds = {type(layer).__name__ for layer in cache.layers}
    assert "AppendLayer" in kinds and not kinds & {"DynamicLayer", "DynamicSlidingWindowLayer"}
    if arch == "gemma3":  # window 8: its buffer (16 positions) fills and moves several times
        assert "AppendSlidingWindowLayer" in kinds
    if arch == "qwen35":
        assert "LinearAttentionLayer" in kinds  # other kinds stay transformers' own
    ours = _decode(lm, cache, ids, 30)
    ref = _decode(lm, DynamicCache(config=lm.model.config), ids, 30)
    assert torch.equal(ours, ref)
    append = [layer for layer in cache.layers if type(layer) is kv.AppendLayer]
    assert all(layer.get_seq_length() == 41 and layer._kbuf.shape[-2] == 46 for layer in append)
    sliding = [layer for layer in cache.layers if isinstance(layer, kv.AppendSlidingWindowLayer)]
    assert all(layer.keys.shape[-2] == 7 and layer._kbuf.shape[-2] == 16 for layer in sliding)


def test_buffers_stop_at_the_longest_sequence_generation_can_reach(models):
    lm = models["qwen3"]
    ids = torch.randint(0, 250, (1, 11), generator=torch.Generator().manual_seed(5))
    cache = kv.new_cache(lm.model.config, max_length=15)
    ours = _decode(lm, cache, ids, 4)  # 11 + 4 = 15 positions: one buffer of 15, no regrowth
    assert torch.equal(ours, _decode(lm, DynamicCache(config=lm.model.config), ids, 4))
    append = [layer for layer in cache.layers if type(layer) is kv.AppendLayer]
    assert append and all(layer._kbuf.shape[-2] == 15 for layer in append)
    with torch.inference_mode():  # past the cap (generate never goes there): still correct
        lm.model(input_ids=ids[:, :2], cache=cache, use_cache=True)
    assert all(layer.get_seq_length() == 17 and layer._kbuf.shape[-2] == 17 for layer in append)


def test_sliding_window_layer_matches_transformers_step_by_step():
    ours, ref = kv.AppendSlidingWindowLayer(sliding_window=5), kv.DynamicSlidingWindowLayer(sliding_window=5)
    g = torch.Generator().manual_seed(0)
    for n in (3, 1, 1, 7, 1, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1, 12, 1, 1):
        k, v = torch.randn(1, 2, n, 4, generator=g), torch.randn(1, 2, n, 4, generator=g)
        got, want = ours.update(k, v), ref.update(k, v)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert torch.equal(ours.keys, ref.keys) and ours.get_mask_sizes(1) == ref.get_mask_sizes(1)
    ours.reset()
    ref.reset()
    k = torch.randn(1, 2, 2, 4, generator=g)
    assert torch.equal(ours.update(k, k)[0], ref.update(k, k)[0])


def test_append_layer_appends_in_place_and_survives_crop_and_reset():
    layer = kv.AppendLayer()
    a, b = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 1, 8)
    k, v = layer.update(a, a + 1)
    buf = layer._kbuf
    k2, _ = layer.update(b, b + 1)
    assert layer._kbuf is buf  # no copy of what was cached
    assert torch.equal(k2, torch.cat([a, b], dim=-2))
    layer.crop(-2)  # drop the last two positions, as DynamicLayer does
    assert layer.get_seq_length() == 4
    k3, v3 = layer.update(b, b + 1)
    assert torch.equal(k3, torch.cat([a[..., :4, :], b], dim=-2)) and torch.equal(v3, k3 + 1)
    layer.reset()
    k4, _ = layer.update(b, b)
    assert torch.equal(k4, b)
    ref = DynamicLayer()
    ref.update(a, a)
    assert isinstance(layer, DynamicLayer) and layer.get_mask_sizes(1) == (2, 0) and ref.get_mask_sizes(1) == (6, 0)
