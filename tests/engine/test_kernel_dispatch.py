"""Kernel selection: the environment override, and the hub-kernel path exercised
without a Mac by publishing the torch reference as a local kernel (LOCAL_KERNELS)."""

import json
import logging
import textwrap

import pytest
import torch

from gguf_serve.engine import kernels, load_model
from gguf_serve.engine.kernels import hub_kernel as hub
from gguf_serve.gguf_io import GGMLType

from oracles import prompt_logits
from tiny_models import random_model, spec, write_gguf


@pytest.fixture
def clean_kernels():
    kernels.reset()
    yield
    kernels.reset()


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    s = spec("llama")
    path = tmp_path_factory.mktemp("k") / "tiny.gguf"
    write_gguf(s, random_model(s), path, "K")
    return str(path)


def publish_reference_as_local_kernel(folder):
    """A local kernel repository whose module re-exports the reference implementation
    under the hub kernel's interface, counting calls."""
    variant = folder / "build" / "torch-cpu"
    variant.mkdir(parents=True)
    (variant / "metadata.json").write_text(json.dumps({
        "name": "ggml-quantization", "id": "ggml_quantization_local", "version": 1, "license": "MIT",
        "backend": {"type": "cpu"}, "python-depends": []}))
    (variant / "__init__.py").write_text(textwrap.dedent("""
        from gguf_serve.engine.kernels import reference as _ref
        from gguf_serve.gguf_io import GGMLType
        CALLS = {"mul_mat_vec": 0, "dequantize": 0, "get_rows": 0}
        GEMV_TYPES = [int(t) for t in (GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.Q8_0)]

        def mul_mat_vec(weight, x, ggml_type, out_features):
            assert x.shape[0] <= 8
            CALLS["mul_mat_vec"] += 1
            return _ref.mul_mat_vec(weight, x, GGMLType(ggml_type), out_features)

        def dequantize(weight, ggml_type, rows, cols, dtype):
            CALLS["dequantize"] += 1
            return _ref.dequantize(weight, GGMLType(ggml_type), rows, cols, dtype)

        def get_rows(weight, indices, ggml_type, cols, dtype):
            CALLS["get_rows"] += 1
            return _ref.get_rows(weight, indices, GGMLType(ggml_type), cols, dtype)
    """))
    return folder


def test_hub_path_with_a_local_kernel(tmp_path, monkeypatch, clean_kernels, tiny_path, caplog):
    repo = publish_reference_as_local_kernel(tmp_path / "ggml-quantization")
    monkeypatch.setenv("LOCAL_KERNELS", f"{hub.HUB_REPO}={repo}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv(kernels.ENV_OVERRIDE, "reference")
    ref_lm = load_model(tiny_path, device="cpu")
    ids = [1, 5, 9, 200, 17]
    expected_prefill = prompt_logits(ref_lm, ids)
    kernels.reset()
    monkeypatch.setenv(kernels.ENV_OVERRIDE, "hub")
    with caplog.at_level(logging.INFO, logger="gguf_serve.kernels"):
        lm = load_model(tiny_path, device="cpu")
        got = prompt_logits(lm, ids)  # 5 rows: the GEMV path
        got_long = prompt_logits(lm, ids * 3)  # 15 rows: dequantize + matmul
        expected_long = prompt_logits(ref_lm, ids * 3)
    torch.testing.assert_close(got, expected_prefill)
    torch.testing.assert_close(got_long, expected_long)
    mod = kernels.hub_ops()
    assert mod is not None and mod.name == f"hub:{hub.HUB_REPO}"
    import sys
    calls = sys.modules["ggml_quantization_local"].CALLS
    assert calls["mul_mat_vec"] > 0 and calls["dequantize"] > 0 and calls["get_rows"] > 0
    assert any("hub:ggml-org/ggml-quantization (forced by the kernels setting)" in r.getMessage() for r in caplog.records)


def test_override_names_what_is_known(monkeypatch, clean_kernels):
    from gguf_serve.engine.config import EngineConfig

    monkeypatch.setenv(kernels.ENV_OVERRIDE, "bogus")
    with pytest.raises(ValueError, match=r"kernels='bogus' \(GGUF_SERVE_KERNELS\): no such kernel implementation; "
                                         r"known: reference, hub, cpu"):
        EngineConfig.resolve()


def test_cpu_defaults_native_where_supported_else_reference_one_log_line_each(monkeypatch, clean_kernels, caplog):
    from gguf_serve.engine.kernels import cpu

    monkeypatch.delenv(kernels.ENV_OVERRIDE, raising=False)
    settings = kernels.settings()
    with caplog.at_level(logging.INFO, logger="gguf_serve.kernels"):
        a = settings.select("cpu", GGMLType.Q6_K)
        b = settings.select("cpu", GGMLType.Q6_K)
        c = settings.select("cpu", GGMLType.NVFP4)
    assert a is b and a.name == f"cpu-native ({cpu.best_isa()})" and a.cpu is settings.cpu
    assert c is kernels.REFERENCE
    lines = [r.getMessage() for r in caplog.records if "kernels for" in r.getMessage()]
    assert lines == [f"kernels for cpu Q6_K: cpu-native ({cpu.best_isa()}) (native kernel available)",
                     "kernels for cpu NVFP4: reference (no native kernel for this device and type)"]


def test_hub_unavailable_offline_falls_back(monkeypatch, clean_kernels, tmp_path):
    monkeypatch.delenv("LOCAL_KERNELS", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert hub.load() is None
    with pytest.raises(RuntimeError, match="hub kernel could not be loaded"):
        kernels.settings(kernels="hub").select("cpu", GGMLType.Q4_K)


def test_hub_kernel_unavailable_is_a_warning_with_its_cause_where_wanted(monkeypatch, tmp_path, caplog):
    """Forced or on MPS (the only callers of hub_ops) the hub kernel's absence is a
    warning naming the cause; a probe that only asks is told at INFO."""
    monkeypatch.delenv("LOCAL_KERNELS", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with caplog.at_level(logging.INFO, logger="gguf_serve.kernels"):
        assert hub.load() is None
        assert hub.load(wanted=False) is None
    levels = [(r.levelno, r.getMessage()) for r in caplog.records if "hub kernel" in r.getMessage()]
    assert [lv for lv, _ in levels] == [logging.WARNING, logging.INFO]
    assert all(f"hub kernel {hub.HUB_REPO} unavailable (" in m and "Error" in m for _, m in levels)
