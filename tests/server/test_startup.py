"""Starting and stopping. With models that cannot be served: every named model bad → the
process exits non-zero with the reason; some bad → the good ones are served and the bad
ones reported; a directory → every .gguf under it. Ctrl-C ends a running generation and
the process, cleanly."""

from __future__ import annotations

import json
import os
import socket
import shutil
import signal
import subprocess
import threading
import time

import httpx
import openai

from server_harness import free_port, serve_command, server, spawn


def corrupt(path) -> str:
    with open(path, "wb") as f:
        f.write(b"GGUF\x03\x00\x00\x00" + b"\xff" * 64)  # a header that goes nowhere
    return str(path)


def test_a_bad_model_alone_exits_non_zero_with_the_reason(tmp_path):
    bad = corrupt(tmp_path / "bad.gguf")
    cmd = serve_command(bad, "--port", str(free_port()))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert p.returncode == 1
    line = [x for x in p.stderr.splitlines() if x.startswith("gguf-serve: no model could be served")]
    assert len(line) == 1 and "bad.gguf" in line[0], p.stderr[-2000:]
    missing = subprocess.run(cmd[:-3] + [str(tmp_path / "nope.gguf"), "--port", str(free_port())],
                             capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert missing.returncode == 1 and "nope.gguf" in missing.stderr


def test_good_models_are_served_beside_a_bad_one(tiny_path, tmp_path):
    bad = corrupt(tmp_path / "bad.gguf")
    other = str(tmp_path / "other.gguf")
    shutil.copy(tiny_path, other)
    with server(tiny_path, bad, other, "--max-loaded", "2") as base:
        health = httpx.get(f"{base}/health").json()
        assert health["status"] == "ok" and list(health["failed"]) == [bad] and "bad.gguf" in health["failed"][bad]
        models = {m["id"]: m for m in httpx.get(f"{base}/v1/models").json()["data"]}
        assert models[os.path.basename(tiny_path)]["error"] is None and models["other.gguf"]["error"] is None
        assert "bad.gguf" in models[bad]["error"]
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
        assert c.completions.create(model="other.gguf", prompt="a", max_tokens=2).usage.completion_tokens >= 1
        r = httpx.post(f"{base}/v1/completions", json={"model": bad, "prompt": "a", "max_tokens": 2})
        assert r.status_code == 500 and "bad.gguf" in r.json()["error"]["message"]


def test_a_directory_serves_every_gguf_under_it(tiny_path, tmp_path):
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    shutil.copy(tiny_path, tmp_path / "a.gguf")
    shutil.copy(tiny_path, tmp_path / "sub" / "deeper" / "b.gguf")
    corrupt(tmp_path / "sub" / "c.gguf")
    (tmp_path / "notes.txt").write_text("not a model")
    with server(str(tmp_path)) as base:
        models = {m["id"]: m for m in httpx.get(f"{base}/v1/models").json()["data"]}
        assert {"a.gguf", "sub/deeper/b.gguf", "sub/c.gguf"} <= set(models)
        assert models["a.gguf"]["loaded"] is False and "c.gguf" in models["sub/c.gguf"]["error"]
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
        r = c.completions.create(model="sub/deeper/b.gguf", prompt="a", max_tokens=2)
        assert r.usage.completion_tokens >= 1


def test_a_drafter_the_model_cannot_have_stops_the_start_with_the_reason(tiny_path, tmp_path):
    """--spec mtp for a file without a multi-token-prediction head, a --draft-model that is
    missing or of another vocabulary: exit 1 with a line that says so."""
    from tiny_models import random_model, spec, write_gguf

    s = spec("qwen3")
    s.config.vocab_size = 300
    other = tmp_path / "other-vocab.gguf"
    write_gguf(s, random_model(s, seed=1), other, "Q8_0")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for args, says in ((["--spec", "mtp"], "'mtp' is not available"),
                       (["--draft-model", str(tmp_path / "nope.gguf")], "no such GGUF file"),
                       (["--draft-model", str(other)], "its vocabulary is not the model's")):
        p = subprocess.run(serve_command(tiny_path, *args, "--port", str(free_port())), capture_output=True,
                           text=True, timeout=120, env=env)
        line = [x for x in p.stderr.splitlines() if x.startswith("gguf-serve: no model could be served")]
        assert p.returncode == 1 and len(line) == 1 and says in line[0], p.stderr[-2000:]


def test_cache_types_from_the_command_line(gemma_path):
    """llama-server's -ctk/-ctv: the model loads with those rows, says so in its load line,
    and answers; a type there is none of is refused before anything loads."""
    from server_harness import OUTPUTS

    with server(gemma_path, "-ctk", "q8_0", "--cache-type-v", "q4_0", "--ctx-size", "2048", "--parallel", "2") as base:
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
        r = c.completions.create(model=os.path.basename(gemma_path), prompt="The capital of France is",
                                 max_tokens=8, temperature=0)
        assert r.usage.completion_tokens == 8 and r.choices[0].text.strip()
        assert "KiB per token (k q8_0, v q4_0)" in OUTPUTS[base]()
    p = subprocess.run(serve_command(gemma_path, "-ctk", "q3_k", "--port", str(free_port())), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and "q3_k" in p.stderr and "cache-type-k" in p.stderr


def test_ctrl_c_during_a_generation_ends_it_and_exits(gemma_path):
    """A 2,000-token stream (~30 s) is running: Ctrl-C ends it at its next step, closes the
    stream with a finish reason, and the process exits within seconds."""
    proc, base = spawn(gemma_path)
    try:
        chunks, started = [], threading.Event()

        def stream():
            body = {"model": gemma_path, "prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": True,
                    "stream": True}
            with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        chunks.append(json.loads(line[6:]))
                        if len(chunks) >= 5:
                            started.set()

        t = threading.Thread(target=stream)
        t.start()
        assert started.wait(60)
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        took = time.perf_counter() - t0
        assert took < 10 and proc.returncode == 0, (took, proc.returncode, proc.stdout.read()[-3000:])
        t.join(10)
        assert len(chunks) < 1000 and chunks[-1]["choices"][0]["finish_reason"] == "length"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_ctrl_c_shuts_down_cleanly(tiny_path):
    """Ctrl-C: exit 0, no traceback, and a last line that says so; with --access-log each
    request was logged on its way."""
    proc, base = spawn(tiny_path, "--access-log")
    assert httpx.get(f"{base}/v1/models").status_code == 200
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "Traceback" not in out and out.rstrip().endswith("gguf-serve: stopped")
    assert '"GET /v1/models HTTP/1.1" 200' in out
    # the load's log lines stand on lines of their own, not after its progress bar
    assert not [line for line in out.replace("\r", "\n").splitlines() if "step/s" in line and " INFO " in line]


def test_a_busy_port_stops_the_start_before_anything_loads(tiny_path):
    """The port is taken: the start ends at once (before the model loads) with a line that
    names the address and --port."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        p = subprocess.run(serve_command(tiny_path, "--port", str(port)), capture_output=True, text=True, timeout=120,
                           env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert p.returncode == 1
    assert f"cannot listen on 127.0.0.1 port {port}" in p.stderr and "--port" in p.stderr, p.stderr[-2000:]
    assert "loading" not in p.stdout
