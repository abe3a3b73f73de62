"""--cache-disk on real servers with a tiny model: a conversation's cached state written
when the server stops (SIGTERM) is read back by a server started later, and when its
model is unloaded and loaded again; the next turn reuses all of it and answers as a cold
start does; a damaged file is dropped and the prompt prefilled."""

from __future__ import annotations

import httpx
import pytest

from server_harness import THINKING_TEMPLATE, no_end, scrape, server, value
from tiny_models import tiny_chat_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_chat_model(tmp_path_factory.mktemp("disk"), "tiny-disk.gguf", 23, THINKING_TEMPLATE)


def complete(base, bias, prompt, n=6):
    r = httpx.post(f"{base}/completion", json={"prompt": prompt, "n_predict": n, "temperature": 0,
                                                "logit_bias": bias, "return_tokens": True}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_restarted_or_reloaded_server_goes_on_from_disk(tiny, tmp_path):
    bias = no_end(tiny)
    prompt = "the quick brown fox jumps over the lazy dog and runs far away " * 8  # past MIN_TOKENS
    folder = tmp_path / "cache"
    with server(tiny, "--parallel", "2", "--ctx-size", "1024") as base:  # no disk tier: the cold answers
        first = complete(base, bias, prompt)
        follow = [prompt, *first["tokens"], " and then"]
        cold = complete(base, bias, follow)
    held = first["tokens_evaluated"] + first["tokens_predicted"] - 1
    assert first["tokens_evaluated"] >= 256

    with server(tiny, "--parallel", "2", "--ctx-size", "1024", "--cache-disk", str(folder)) as base:
        assert complete(base, bias, prompt)["content"] == first["content"]
    assert len(list(folder.rglob("*.prompt"))) == 1  # written as the server stopped

    with server(tiny, "--parallel", "2", "--ctx-size", "1024", "--cache-disk", str(folder)) as base:  # a restart
        again = complete(base, bias, follow)
        assert again["timings"]["cache_n"] == held and again["content"] == cold["content"]
        model = httpx.get(f"{base}/v1/models").json()["data"][0]["id"]
        m = scrape(base)
        assert value(m, "gguf_serve_prompt_cache_disk_total", model=model, event="hits") == 1
        assert value(m, "gguf_serve_prompt_cache_disk_bytes", model=model) > 0
        assert value(m, "gguf_serve_model_memory_part_bytes", model=model, part="disk_writes") > 0
        assert value(m, "gguf_serve_model_memory_part_bytes", model=model, part="kv") > 0
        # unloaded and loaded again: the longer conversation now held is written, and read back
        assert httpx.post(f"{base}/models/unload", json={"model": model}, timeout=60).status_code == 200
        later = [*follow, *again["tokens"], " then"]
        reloaded = complete(base, bias, later)
        assert reloaded["timings"]["cache_n"] == again["tokens_evaluated"] + again["tokens_predicted"] - 1

    for f in folder.rglob("*.prompt"):  # damaged on disk: dropped, never served
        data = bytearray(f.read_bytes())
        data[-10] ^= 0xFF
        f.write_bytes(bytes(data))
    with server(tiny, "--parallel", "2", "--ctx-size", "1024", "--cache-disk", str(folder)) as base:
        again = complete(base, bias, follow)
        assert again["timings"]["cache_n"] == 0 and again["content"] == cold["content"]
