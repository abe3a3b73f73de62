"""Work a request or a model file brings is bounded (issue 39): a chat template that loops
or builds a huge string costs its own request a clear error within --template-timeout
and nothing else (another model answers meanwhile, /health says what is stuck, SIGTERM
still ends the process); Gemma's sliding rings survive a prompt sent again after a long
answer with drafts on (aider's 500)."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest

from server_harness import THINKING_TEMPLATE, no_end, server, spawn, until
from tiny_models import tiny_chat_model

LOOPING = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
DOUBLING = "{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bounds")
    return {"looping": tiny_chat_model(d, "looping.gguf", 5, LOOPING),
            "doubling": tiny_chat_model(d, "doubling.gguf", 5, DOUBLING),
            "good": tiny_chat_model(d, "good.gguf", 5, THINKING_TEMPLATE, think=True)}


def chat(base, model, timeout=60, **extra):
    return httpx.post(f"{base}/v1/chat/completions", timeout=timeout, json={
        "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra})


def test_a_looping_template_costs_its_requests_only(files):
    with server(files["looping"], files["good"], "--template-timeout", "3", "--template-workers", "2") as base:
        chat(base, "good.gguf")  # the other model loaded, its template worker started
        results = []
        looping = [threading.Thread(target=lambda: results.append(chat(base, "looping.gguf"))) for _ in range(4)]
        t0 = time.monotonic()
        for t in looping:
            t.start()
        # four renders of one template: one worker runs it, the others wait; /health says so
        assert until(lambda: httpx.get(f"{base}/health").status_code == 503, 2.5)
        busy = httpx.get(f"{base}/health").json()
        assert busy["status"] == "busy" and busy["busy"]["templates"]["waiting"] >= 1
        for _ in range(3):  # the other model answers meanwhile, at once
            t = time.monotonic()
            r = chat(base, "good.gguf", logit_bias=no_end(files["good"]))
            assert r.status_code == 200 and time.monotonic() - t < 1.0
        for t in looping:
            t.join(30)
        assert time.monotonic() - t0 < 8  # each within its 3 s deadline (waiting included), and a little
        # the first ran past its deadline (a 500 naming the template); those behind it waited theirs out (503)
        assert len(results) == 4 and all(r.status_code in (500, 503) for r in results)
        timed_out = [r.json()["error"] for r in results if r.status_code == 500]
        assert timed_out and all(e["code"] == "template_timeout" and "--template-timeout" in e["message"]
                                 for e in timed_out)
        assert all("retry-after" in r.headers for r in results if r.status_code == 503)
        assert until(lambda: httpx.get(f"{base}/health").status_code == 200, 5)
        assert chat(base, "good.gguf").status_code == 200


def test_a_template_that_builds_a_huge_string_is_refused_with_its_reason(files):
    with server(files["doubling"]) as base:
        t = time.monotonic()
        r = chat(base, "doubling.gguf")
        assert r.status_code == 400 and time.monotonic() - t < 10
        err = r.json()["error"]
        assert err["param"] == "messages" and ("MiB" in err["message"] or "characters" in err["message"])
        assert chat(base, "doubling.gguf").status_code == 400  # its worker came back


def test_sigterm_ends_the_server_while_a_template_loops(files):
    proc, base = spawn(files["looping"], "--template-timeout", "60")
    try:
        for _ in range(2):  # one renders (and loops), one waits for it: /health says so after a second
            threading.Thread(target=lambda: chat(base, "looping.gguf", timeout=90), daemon=True).start()
        assert until(lambda: httpx.get(f"{base}/health").status_code == 503, 10)
        t = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        assert time.monotonic() - t < 15
    finally:
        if proc.poll() is None:
            proc.kill()
