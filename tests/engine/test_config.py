"""The engine's settings are decided once: EngineConfig from arguments over the
environment over the defaults where no configuration is passed (a library caller), a
configuration passed taken whole (the server's), read when a model loads (not at
import), applied by load_model and kept on the model; the server's options are the
same settings."""

import subprocess
import sys

import pytest
import torch

from gguf_serve.engine import kernels, load_model
from gguf_serve.engine.config import ENV, EngineConfig
from gguf_serve.engine.kernels import cpu

from tiny_models import random_model, spec, write_gguf


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    s = spec("qwen35")
    path = tmp_path_factory.mktemp("cfg") / "tiny.gguf"
    write_gguf(s, random_model(s, seed=2), path, "K")
    return str(path)


@pytest.fixture(autouse=True)
def _defaults_only(monkeypatch):
    """These tests compare with the defaults: without the suite's float32 cache types and
    vision towers (conftest)."""
    for name in ("cache_type_k", "cache_type_v", "vision_dtype"):
        monkeypatch.delenv(ENV[name], raising=False)


def test_arguments_win_over_the_environment_which_wins_over_the_defaults(monkeypatch):
    assert EngineConfig.resolve() == EngineConfig()
    monkeypatch.setenv(ENV["threads"], "3")
    monkeypatch.setenv(ENV["cpu_repack"], "0")
    monkeypatch.setenv(ENV["kernels"], "reference")
    c = EngineConfig.resolve(n_ctx=64)
    assert (c.threads, c.cpu_repack, c.kernels, c.n_ctx) == (3, False, "reference", 64)
    assert EngineConfig.resolve(threads=1).threads == 1
    given = EngineConfig(threads=2, kernels="cpu")  # a configuration passed is taken whole: no environment read
    c = EngineConfig.resolve(given, n_ctx=64)
    assert (c.threads, c.kernels, c.cpu_repack, c.n_ctx) == (2, "cpu", True, 64)
    assert EngineConfig.resolve(EngineConfig()) == EngineConfig()  # the defaults passed stay the defaults


def test_a_bad_environment_value_is_not_read_for_a_setting_given(monkeypatch):
    monkeypatch.setenv(ENV["kernels"], "bogus")
    assert EngineConfig.resolve(kernels="cpu").kernels == "cpu"
    with pytest.raises(ValueError, match=r"kernels='bogus' \(GGUF_SERVE_KERNELS\)"):
        EngineConfig.resolve()


@pytest.mark.parametrize("bad,match", [({"kernels": "fast"}, "kernels='fast'"), ({"n_ctx": 0}, "n_ctx must be"),
                                       ({"prefill_dtype": "fp8"}, "prefill_dtype='fp8'")])
def test_bad_settings_are_refused_naming_the_setting(bad, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(**bad)
    with pytest.raises(TypeError, match="unknown engine settings: bogus"):
        EngineConfig.resolve(bogus=1)


def test_the_environment_is_read_at_load_not_at_import(gemma_path, monkeypatch):
    """Gemma's Q5_0 matrices are repacked where the CPU has a repacked layout (x86-64
    with AVX2); GGUF_SERVE_CPU_REPACK=0 set after the engine was imported and used turns
    it off for the next load."""
    if cpu.load() is None or cpu.best_isa() not in ("avx2", "avx512"):
        pytest.skip("no repacked layout on this CPU (x86-64 with AVX2 only)")
    repacked = load_model(gemma_path, device="cpu", n_seq=1, n_ctx=64)
    assert any(m.repacked for layer in repacked.model.layers for m in _linears(layer))
    monkeypatch.setenv(ENV["cpu_repack"], "0")
    plain = load_model(gemma_path, device="cpu", n_seq=1, n_ctx=64)
    assert not any(m.repacked for layer in plain.model.layers for m in _linears(layer))
    assert plain.config.cpu_repack is False and repacked.config.cpu_repack is True


def test_load_model_applies_the_config_and_keeps_it(tiny):
    cfg = EngineConfig(device="cpu", n_ctx=48, n_seq=2, max_batch=16, threads=1, kernels="reference")
    lm = load_model(tiny, config=cfg)
    assert lm.config == cfg and lm.n_ctx == 48 and lm.cache.n_seq == 2 and lm.cache.max_batch == 16
    assert lm.model.ops.name == "torch" and lm.model.head.kernels is kernels.REFERENCE  # forced
    native = load_model(tiny, config=EngineConfig(device="cpu", n_seq=1, threads=1))
    if cpu.load() is not None:
        assert native.model.ops.name == "cpu-native" and native.kernels.cpu.threads == 1
        assert native.model.ops.threads == 1 and native.model.head.kernels.cpu is native.kernels.cpu
        assert native.threads.threads == 1 and torch.get_num_threads() == 1


def _linears(layer):
    return layer.mixer.qkv.linears + layer.mlp.gate_up.linears


def test_every_server_option_is_one_setting_with_its_help():
    """The CLI's options are generated from ServerSettings: each field has one flag, its
    description as help, and its environment variable named."""
    from gguf_serve.server.settings import ServerSettings

    out = subprocess.run([sys.executable, "-m", "gguf_serve.server.cli", "--help"], capture_output=True, text=True,
                         timeout=60).stdout
    flat = " ".join(out.split())
    for name, field in ServerSettings.model_fields.items():
        if name == "models":
            continue
        assert f"--{name.replace('_', '-')}" in out, name
        assert f"GGUF_SERVE_{name.upper()}" in flat, name
        assert " ".join(field.description.split()[:4]) in flat, name
    s = ServerSettings(threads=2, cpu_repack=False, ctx_size=128, parallel=2, kernels="reference")
    assert s.engine_config() == EngineConfig(n_ctx=128, n_seq=2, threads=2, kernels="reference", cpu_repack=False)
