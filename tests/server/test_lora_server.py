"""LoRA adapters over HTTP, as llama-server serves them: --lora FILE[:SCALE], GET and POST
/lora-adapters, a request's `lora` field, and each adapter as a model of its own
(`<model>+<adapter>`, listed in /v1/models). What a request gets is what the engine gives
with those adapters at those scales."""

from __future__ import annotations

import subprocess

import httpx
import pytest

from gguf_serve.engine import SamplingParams, load_model

from server_harness import free_port, serve_command, server
from tiny_lora import lora_adapter
from tiny_models import random_model, spec, write_gguf

PROMPT = [1, 5, 9, 200, 17]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lora-server")
    s = spec("llama")
    dense = write_gguf(s, random_model(s), folder / "base.gguf", "Q8_0")
    first, _ = lora_adapter(dense, folder / "a", "f32", seed=1)
    second, _ = lora_adapter(dense, folder / "b", "f32", rank=8, alpha=4.0, seed=2, targets=("q_proj", "v_proj"))
    return str(folder / "base.gguf"), first, second


def engine_tokens(base: str, adapters: list[str], chosen: tuple) -> list[int]:
    lm = load_model(base, device="cpu")
    for path in adapters:
        lm.load_adapter(path)
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    return [s.token_id for s in lm.generate(PROMPT, greedy, lora=chosen) if s.token_id is not None]


def test_adapters_by_flag_field_name_and_global_scale(files):
    base, first, second = files
    expected = {c: engine_tokens(base, [first, second], c)
                for c in [((0, 1.0), (1, 0.5)), ((1, 1.0),), ((0, 0.5),), ()]}
    with server(base, "--lora", first, "--lora", f"{second}:0.5") as url:
        def tokens(**body) -> list[int]:
            r = httpx.post(f"{url}/completion", json={"prompt": PROMPT, "n_predict": 8, "temperature": 0,
                                                      "ignore_eos": True, "return_tokens": True, **body}, timeout=60)
            assert r.status_code == 200, r.text
            return r.json()["tokens"]

        listed = httpx.get(f"{url}/lora-adapters").json()
        assert [(a["id"], a["scale"]) for a in listed] == [(0, 1.0), (1, 0.5)]
        assert listed[0]["path"].endswith("lora-f32.gguf")
        assert tokens() == expected[((0, 1.0), (1, 0.5))]  # the --lora scales
        assert tokens(lora=[{"id": 1, "scale": 1.0}]) == expected[((1, 1.0),)]  # the request's, the others off
        ids = [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]]
        assert ids == ["base.gguf", "base.gguf+lora-f32", "base.gguf+lora-f32-1"], ids  # two files of one name
        assert [m["name"] for m in httpx.get(f"{url}/api/tags").json()["models"]] == [f"{i}:latest" for i in ids]
        # an adapter as a model of its own: alone at scale 1, and the reply names it
        assert tokens(model="base.gguf+lora-f32-1") == expected[((1, 1.0),)]
        r = httpx.post(f"{url}/v1/completions", json={"model": "base.gguf+lora-f32-1", "prompt": "hi",
                                                      "max_tokens": 2}, timeout=60)
        assert r.status_code == 200 and r.json()["model"] == "base.gguf+lora-f32-1", r.text
        # POST sets the scales a request naming none runs with: the listed ones, the others 0
        assert [a["scale"] for a in httpx.post(f"{url}/lora-adapters", json=[{"id": 0, "scale": 0.5}]).json()] \
            == [0.5, 0.0]
        assert tokens() == expected[((0, 0.5),)]
        assert httpx.post(f"{url}/lora-adapters", json=[]).status_code == 200
        assert tokens() == expected[()]
        bad = httpx.post(f"{url}/completion", json={"prompt": PROMPT, "n_predict": 2, "lora": [{"id": 7, "scale": 1}]})
        assert bad.status_code == 400 and "no LoRA adapter 7" in bad.text
        assert httpx.post(f"{url}/lora-adapters", json=[{"id": 9, "scale": 1}]).status_code == 400
        chat = httpx.post(f"{url}/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "lora": [{"id": 0, "scale": 1.0}]})
        assert chat.status_code == 200, chat.text


def test_an_adapter_for_another_model_stops_the_start_with_the_reason(files, tmp_path):
    """As llama-server: the named model cannot load with its adapter, and the start says why."""
    _, first, _ = files
    other = spec("qwen3")
    other_base = tmp_path / "other.gguf"
    write_gguf(other, random_model(other), other_base, "F32")
    run = subprocess.run(serve_command(str(other_base), "--lora", first, "--port", str(free_port())),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "an adapter for 'llama', and the model is 'qwen3'" in run.stdout + run.stderr
    missing = subprocess.run(serve_command(str(other_base), "--lora", str(tmp_path / "nope.gguf"), "--port",
                                           str(free_port())), capture_output=True, text=True, timeout=120)
    assert missing.returncode != 0 and "no such LoRA adapter file" in missing.stdout + missing.stderr


def test_adapters_loaded_and_unloaded_at_run_time(files, tmp_path):
    """vLLM's POST /v1/load_lora_adapter and /v1/unload_lora_adapter (with --lora-runtime):
    the adapter is served as the model its lora_name names, gives what the engine gives
    with it, counts in the model's memory, and goes; ids are not given twice; what is
    refused, with the server going on."""
    base, first, second = files
    expected = {c: engine_tokens(base, [first, second], c) for c in [((0, 1.0),), ((1, 1.0),), ()]}
    with server(base, "--lora", first) as url:
        r = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": second})
        assert r.status_code == 501 and "--lora-runtime" in r.text
    with server(base, "--lora", first, "--lora-runtime") as url:
        def tokens(model) -> list[int]:
            r = httpx.post(f"{url}/completion", json={"model": model, "prompt": PROMPT, "n_predict": 8,
                                                      "temperature": 0, "ignore_eos": True, "return_tokens": True},
                           timeout=60)
            assert r.status_code == 200, r.text
            return r.json()["tokens"]

        def memory() -> int:
            return next(m for m in httpx.get(f"{url}/v1/models").json()["data"] if m["id"] == "base.gguf")[
                "memory_bytes"]

        before = memory()
        r = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": second}, timeout=60)
        assert r.status_code == 200 and "added" in r.text, r.text
        assert "sql" in [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]]
        assert memory() > before
        assert tokens("sql") == expected[((1, 1.0),)]  # id 1: the --lora adapter is 0
        assert tokens("base.gguf") == expected[((0, 1.0),)]  # the --lora scale, the runtime one off
        assert [a["id"] for a in httpx.get(f"{url}/lora-adapters").json()] == [0, 1]

        r = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "sql"}, timeout=60)
        assert r.status_code == 200 and "removed" in r.text, r.text
        assert "sql" not in [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]] and memory() == before
        assert [a["id"] for a in httpx.get(f"{url}/lora-adapters").json()] == [0]
        bad = httpx.post(f"{url}/completion", json={"prompt": PROMPT, "n_predict": 2, "lora": [{"id": 1, "scale": 1}]})
        assert bad.status_code == 400 and "no LoRA adapter 1" in bad.text
        # loaded again: a new id (2), the same tokens
        assert httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": second},
                          timeout=60).status_code == 200
        assert [a["id"] for a in httpx.get(f"{url}/lora-adapters").json()] == [0, 2]
        assert tokens("sql") == expected[((1, 1.0),)]

        for body, words in [({"lora_name": "sql", "lora_path": second}, "taken"),
                            ({"lora_name": "base.gguf", "lora_path": second}, "taken"),
                            ({"lora_name": "y", "lora_path": str(tmp_path / "none.gguf")}, "no such LoRA adapter"),
                            ({"lora_name": "y", "lora_path": base}, "not a LoRA adapter")]:
            r = httpx.post(f"{url}/v1/load_lora_adapter", json=body, timeout=60)
            assert r.status_code == 400 and words in r.text, r.text
        r = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "nothing"})
        assert r.status_code == 400 and "no LoRA adapter named" in r.text
        assert tokens("base.gguf+lora-f32") == expected[((0, 1.0),)]
