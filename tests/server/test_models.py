"""Many models in one server: loading on first request, unloading the least recently
used idle model for room (a count and a memory budget), never a model a request holds,
bounded waits (503 + Retry-After), idle unloading and keep_alive, /models/load and
/models/unload, and the memory handed back."""

from __future__ import annotations

import os
import threading
import time

import httpx
import openai
import pytest

from server_harness import THINKING_TEMPLATE, no_end, rss_mib, scrape, server, until, value
from tiny_models import tiny_chat_model


@pytest.fixture(scope="module")
def folder(tmp_path_factory, gemma_path):
    """A served directory: two tiny models and the Gemma file (linked, not copied)."""
    d = tmp_path_factory.mktemp("many")
    tiny_chat_model(d, "a.gguf", 5, THINKING_TEMPLATE, think=True)
    tiny_chat_model(d, "b.gguf", 7, THINKING_TEMPLATE, think=True)
    os.link(gemma_path, d / "gemma.gguf")
    return d


def statuses(base) -> dict[str, str]:
    return {m["id"]: m["status"] for m in httpx.get(f"{base}/v1/models").json()["data"]}


def rotate(base, models: list[str], clients: int, rounds: int, bound: float) -> tuple[list, list, float]:
    """`clients` threads, each asking the models in turn (chat streamed, completions folded):
    (errors other than a documented 503, the 503s, the longest request in seconds)."""
    c = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=bound + 60)
    errors, busy, longest = [], [], [0.0]

    def client(k: int) -> None:
        for r in range(rounds):
            model = models[(k + r) % len(models)]
            t = time.monotonic()
            try:
                if r % 2:
                    text = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
                        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=6, stream=True)
                        if ch.choices)
                    assert isinstance(text, str)
                else:
                    assert c.completions.create(model=model, prompt="hello", max_tokens=6).usage.completion_tokens >= 1
            except openai.APIStatusError as e:
                if e.status_code == 503 and e.response.headers.get("retry-after"):
                    busy.append(e.message)
                else:
                    errors.append(f"{model}: {e.status_code} {e.message}")
            except Exception as e:  # noqa: BLE001 - every failure is reported
                errors.append(f"{model}: {e!r}")
            longest[0] = max(longest[0], time.monotonic() - t)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors, busy, longest[0]


def test_three_clients_rotating_over_three_models_with_room_for_two(folder):
    """The reported failure: --max-loaded 2 unloaded a model under its running requests
    (500 'NoneType' object has no attribute 'tokenizer'). Now a held model stays: every
    request is answered, at most two models are ever loaded, the holds end at zero."""
    with server(str(folder), "--models-max", "2", "--ctx-size", "512", "--parallel", "2") as base:
        seen, stop = [], threading.Event()

        def watch():
            while not stop.is_set():
                seen.append(sum(s == "loaded" for s in statuses(base).values()))
                time.sleep(0.05)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            errors, busy, _ = rotate(base, ["a.gguf", "b.gguf", "gemma.gguf"], clients=3, rounds=6, bound=120)
        finally:
            stop.set()
            watcher.join()
        assert errors == [] and busy == []
        assert seen and max(seen) <= 2
        # a request's hold ends as its response's last bytes go out: the client may read them first
        deadline = time.monotonic() + 10
        while True:
            after = scrape(base)
            gauges = [value(after, g, model=m) for m in ("a.gguf", "b.gguf", "gemma.gguf")
                      for g in ("gguf_serve_model_requests", "gguf_serve_queue_depth")]
            if gauges == [0] * 6 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert gauges == [0] * 6
        assert value(after, "gguf_serve_model_unloads_total", reason="room") >= 3  # the rotation made room
        for m in ("a.gguf", "b.gguf", "gemma.gguf"):
            assert value(after, "gguf_serve_requests_running", model=m) == 0


def test_soak_three_models_with_a_memory_budget_for_two(tmp_path, gemma_path):
    """Three Gemma files (~330 MiB each loaded: file, KV cache, tokenizer) and a
    --memory-budget that holds two: clients rotating among them
    get answers (or documented 503s), none waits past its bound, the models loaded never
    hold more than the budget, the process's memory stays within it, the gauges go back
    to zero."""
    for name in ("g1.gguf", "g2.gguf", "g3.gguf"):
        os.link(gemma_path, tmp_path / name)
    bound = 30
    with server(str(tmp_path), "--max-loaded", "3", "--memory-budget", "800MiB", "--load-wait", str(bound),
                "--ctx-size", "512", "--parallel", "2") as base:
        before = rss_mib(base)
        peak, held, stop = [before], [0], threading.Event()

        def watch():
            while not stop.is_set():
                peak.append(rss_mib(base))
                models = httpx.get(f"{base}/v1/models").json()["data"]
                held[0] = max(held[0], sum(m["memory_bytes"] or 0 for m in models if m["status"] == "loaded"))
                time.sleep(0.05)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            errors, busy, longest = rotate(base, ["g1.gguf", "g2.gguf", "g3.gguf"], clients=3, rounds=6, bound=bound)
        finally:
            stop.set()
            watcher.join()
        assert errors == []
        print(f"soak: peak +{max(peak) - before:.0f} MiB, held {held[0] / 2**20:.0f} MiB, longest {longest:.1f} s, "
              f"{len(busy)} 503s")
        assert all("--load-wait" in m for m in busy)
        assert longest < bound + 20  # the wait's bound, then a short generation
        assert 0 < held[0] <= 800 * 2**20
        # MiB: the budget bounds the process's growth, but for one load's passing peak (its
        # tokenizer's build: ~120 MiB for Gemma's 262k vocabulary)
        assert max(peak) - before <= 800 + 150
        after = scrape(base)
        assert value(after, "gguf_serve_model_unloads_total", reason="room") >= 3
        assert value(after, "gguf_serve_models_loaded") == 2
        for m in ("g1.gguf", "g2.gguf", "g3.gguf"):
            assert value(after, "gguf_serve_model_requests", model=m) == 0
            assert value(after, "gguf_serve_requests_running", model=m) == 0


def test_a_wait_past_the_bound_is_a_503_and_the_generating_model_is_never_unloaded(folder):
    """With room for one model and that one generating, a request for another waits
    --load-wait seconds and gets 503 with Retry-After naming the model in use; the
    generation runs to its end; then the other model loads."""
    with server(str(folder), "--max-loaded", "1", "--load-wait", "1", "--ctx-size", "512", "--parallel", "2") as base:
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
        c.completions.create(model="gemma.gguf", prompt="x", max_tokens=1)
        stream = c.completions.create(model="gemma.gguf", prompt="Once upon a time", max_tokens=400, stream=True,
                                      stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        first = next(iter(stream))  # generating now
        with pytest.raises(openai.APIStatusError) as refused:
            c.completions.create(model="a.gguf", prompt="hello", max_tokens=2)
        assert refused.value.status_code == 503
        assert refused.value.response.headers["retry-after"] == "5"
        assert "gemma.gguf (1 request(s))" in refused.value.message and "--load-wait" in refused.value.message
        chunks = [first, *stream]
        assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
        # all of it, not cut off (counted in tokens: a chunk may carry several, when drafts hold, or none)
        assert chunks[-1].usage.completion_tokens == 400
        r = c.completions.create(model="a.gguf", prompt="hello", max_tokens=2, logit_bias=no_end(folder / "a.gguf"))
        assert r.usage.completion_tokens == 2
        assert statuses(base) == {"a.gguf": "loaded", "b.gguf": "unloaded", "gemma.gguf": "unloaded"}


def test_idle_unload_and_keep_alive(folder):
    """A request's keep_alive (Ollama's: seconds or a duration, negative for ever, 0 at once)
    reaches the idle reaper for its model: 0 unloads it at once, "1s" a second later, while
    --idle-unload's 600 s keeps the others. The reaper's clock itself is checked in
    test_residency.py (a test clock); here the test waits on the models' states."""
    with server(str(folder), "--idle-unload", "600", "--ctx-size", "256", "--parallel", "1") as base:
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
        c.completions.create(model="a.gguf", prompt="hi", max_tokens=1, extra_body={"keep_alive": "1h"})
        c.completions.create(model="b.gguf", prompt="hi", max_tokens=1, extra_body={"keep_alive": "-1"})
        c.chat.completions.create(model="b.gguf", messages=[{"role": "user", "content": "x"}], max_tokens=1,
                                  extra_body={"keep_alive": 0})
        assert until(lambda: statuses(base)["b.gguf"] == "unloaded", 10)
        c.completions.create(model="a.gguf", prompt="hi", max_tokens=1, extra_body={"keep_alive": "1s"})
        assert until(lambda: statuses(base)["a.gguf"] == "unloaded", 10)
        assert value(scrape(base), "gguf_serve_model_unloads_total", reason="idle") == 2
        c.completions.create(model="b.gguf", prompt="hi", max_tokens=1)  # the default: 600 s
        assert statuses(base)["b.gguf"] == "loaded"
        with pytest.raises(openai.BadRequestError) as bad:
            c.completions.create(model="a.gguf", prompt="hi", max_tokens=1, extra_body={"keep_alive": "5 minutes"})
        assert bad.value.body["param"] == "keep_alive"
        assert "duration such as '5m'" in bad.value.message


def test_load_and_unload_endpoints_and_the_memory_handed_back(folder):
    """llama-server's router endpoints: /models/load and /models/unload change the status
    /v1/models gives; unloading a model in use is a 409; and an unload hands the
    memory back (the process's RSS within 50 MB of where it was before the load)."""
    bad = folder / "broken.gguf"
    bad.write_bytes(b"GGUF" + bytes(60))
    try:
        with server(str(folder), "--max-loaded", "3", "--ctx-size", "512", "--parallel", "2") as base:
            models = {m["id"]: m for m in httpx.get(f"{base}/v1/models").json()["data"]}
            assert models["broken.gguf"]["status"] == "failed" and models["broken.gguf"]["error"]
            assert models["gemma.gguf"]["status"] == "unloaded" and models["gemma.gguf"]["size_bytes"] > 2e8
            r = httpx.post(f"{base}/models/load", json={"model": "a.gguf"})
            assert r.status_code == 200 and r.json() == {"success": True, "model": "a.gguf", "status": "loaded"}
            assert httpx.post(f"{base}/models/unload", json={"model": "a.gguf"}).json()["status"] == "unloaded"
            before = rss_mib(base)  # with the engine's modules imported by the first load
            for _ in range(2):
                r = httpx.post(f"{base}/models/load", json={"model": "gemma.gguf"}, timeout=120)
                assert r.json()["status"] == "loaded"
                loaded = {m["id"]: m for m in httpx.get(f"{base}/v1/models").json()["data"]}["gemma.gguf"]
                assert loaded["memory_bytes"] > loaded["size_bytes"]  # the file and its KV cache
                c = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
                stream = c.completions.create(model="gemma.gguf", prompt="Once", max_tokens=300, stream=True,
                                              extra_body={"ignore_eos": True})
                next(iter(stream))
                busy = httpx.post(f"{base}/models/unload", json={"model": "gemma.gguf"})
                assert busy.status_code == 409 and "in use by 1 request(s)" in busy.json()["error"]["message"]
                for _ in stream:
                    pass
                assert rss_mib(base) - before > 200  # the model's pages are resident
                r = httpx.post(f"{base}/models/unload", json={"model": "gemma.gguf"})
                assert r.status_code == 200 and r.json()["status"] == "unloaded"
                assert rss_mib(base) - before < 50
            assert httpx.post(f"{base}/models/load", json={"model": "nope.gguf"}).status_code == 404
            r = httpx.post(f"{base}/models/load", json={"model": "broken.gguf"})
            assert r.status_code in (400, 500) and "broken.gguf" in r.json()["error"]["message"]
    finally:
        bad.unlink()
