"""Per architecture: a tiny random transformers model written as GGUF the way llama.cpp
does; the engine's logits must equal the dense transformers model holding the same
(dequantized) weights, and transformers' own GGUF loader where it reads the file."""

import pytest
import torch

from gguf_serve.engine import load_model
from gguf_serve.engine.architectures import ARCHITECTURES, UnsupportedArchitecture
from gguf_serve.engine.modules import GgufEmbedding, GgufLinear
from gguf_serve.gguf_io import GGUFWriter

from tiny_models import random_model, spec, write_gguf

ARCHS = ["llama", "qwen2", "qwen3", "qwen3moe", "qwen35", "qwen35moe", "gemma3", "phi3"]
MIXES = ["F32", "F16", "Q8_0", "K"]
# float32 everywhere; differences come from summation order in chunked matmuls
TOL = {"F32": 2e-4, "F16": 2e-4, "Q8_0": 2e-4, "K": 2e-4}


@pytest.fixture(scope="module", autouse=True)
def exact_kernels():
    """These tests check the loader (names, shapes, transforms) with exact arithmetic:
    the reference kernels, not the native ones that quantize activations."""
    import os

    from gguf_serve.engine import kernels

    os.environ[kernels.ENV_OVERRIDE] = "reference"
    kernels.reset()
    yield
    del os.environ[kernels.ENV_OVERRIDE]
    kernels.reset()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cache = {}

    def build(arch, mix):
        if (arch, mix) not in cache:
            s = spec(arch)
            model = random_model(s, seed=ARCHS.index(arch))
            path = tmp_path_factory.mktemp(f"{arch}-{mix}") / f"tiny-{arch}-{mix}.gguf"
            dense = write_gguf(s, model, path, mix)
            cache[(arch, mix)] = (str(path), dense)
        return cache[(arch, mix)]
    return build


@pytest.mark.parametrize("mix", MIXES)
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_equal_dense_transformers(tiny, arch, mix):
    path, dense = tiny(arch, mix)
    lm = load_model(path, device="cpu")
    assert type(lm.model) is type(dense)
    packed = [m for m in lm.model.modules() if isinstance(m, GgufLinear)]
    assert len(packed) == sum(isinstance(m, torch.nn.Linear) for m in dense.modules())
    assert not any(isinstance(m, torch.nn.Linear) for m in lm.model.modules())
    ids = torch.randint(0, 250, (1, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = lm.model(input_ids=ids).logits
        ref = dense(input_ids=ids).logits
    torch.testing.assert_close(ours, ref, rtol=TOL[mix], atol=TOL[mix])


@pytest.mark.parametrize("arch", ARCHS)
def test_incremental_decoding_with_cache_matches_full_forward(tiny, arch):
    path, _ = tiny(arch, "Q8_0")
    lm = load_model(path, device="cpu")
    ids = torch.randint(0, 250, (1, 14), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = lm.model(input_ids=ids).logits[0, -1]
        out = lm.model(input_ids=ids[:, :10], use_cache=True)
        cache = out.past_key_values if getattr(out, "past_key_values", None) is not None else out.cache
        for t in range(10, 14):
            out = lm.model(input_ids=ids[:, t:t + 1], cache=cache, use_cache=True)
    torch.testing.assert_close(out.logits[0, -1], full, rtol=2e-4, atol=2e-4)


# transformers' GGUF loader ignores attention.key_length (our tiny qwen3 has head_dim 96,
# not hidden/heads) and expert_feed_forward_length (qwen3moe), and has no Gemma 3 text
# path for these files, so those are checked against the dense model only.
TRANSFORMERS_GGUF = ["llama", "qwen2", "phi3"]


@pytest.mark.parametrize("arch", TRANSFORMERS_GGUF)
def test_logits_equal_transformers_gguf_loader(tiny, arch):
    from transformers import AutoModelForCausalLM

    path, _ = tiny(arch, "Q8_0")
    import os
    ref = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                               dtype=torch.float32).eval()
    lm = load_model(path, device="cpu")
    ids = torch.randint(0, 250, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(lm.model(input_ids=ids).logits, ref(input_ids=ids).logits, rtol=2e-4, atol=2e-4)


def test_tied_head_shares_the_embedding_bytes(tiny):
    path, _ = tiny("gemma3", "K")
    lm = load_model(path, device="cpu")
    emb = lm.model.get_input_embeddings()
    assert isinstance(emb, GgufEmbedding) and isinstance(lm.model.lm_head, GgufLinear)
    assert lm.model.lm_head.packed.data_ptr() == emb.packed.data_ptr()
    assert "output.weight" not in lm.gguf.tensors


def test_packed_layers_are_views_of_the_file_never_dequantized_at_load(tiny, monkeypatch):
    import gguf_serve.engine.kernels.reference as ref

    path, _ = tiny("llama", "K")
    calls = []
    monkeypatch.setattr(ref, "dequantize_rows", lambda *a, **k: calls.append(a) or (_ for _ in ()).throw(AssertionError("dequantized at load")))
    lm = load_model(path, device="cpu")
    assert calls == []
    file_views = {t.data.ctypes.data for t in lm.gguf.tensors.values()}
    for name, m in lm.model.named_modules():
        if isinstance(m, (GgufLinear, GgufEmbedding)):
            assert m.packed.dtype == torch.uint8
            assert m.packed.data_ptr() in file_views, name  # a view of the map, not a copy


def test_unsupported_architecture_is_a_clear_error(tmp_path):
    path = tmp_path / "mamba.gguf"
    with GGUFWriter(path) as w:
        w.add("general.architecture", "mamba")
    with pytest.raises(UnsupportedArchitecture, match="architecture 'mamba' is not supported; supported: gemma3, llama"):
        load_model(path, device="cpu")
    assert set(ARCHITECTURES) >= {"llama", "qwen2", "qwen3", "gemma3", "phi3"}
