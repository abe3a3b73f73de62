"""Connections bounded (issue 39): under systemd's default of 1,024 open files, 1,100
clients sending their request heads a byte at a time do not stop a normal request from
being answered (the connection waiting longest for its head makes room); a head still
incomplete after 10 s is closed; a streamed reply whose client stops reading stops being
generated."""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import tempfile
import threading
import time

import httpx
import pytest

from server_harness import free_port, no_end, scrape, serve_command, server, until, value


@pytest.fixture
def limited(tiny_path):
    """A server that cannot open more than 1,024 files (systemd's LimitNOFILE default)."""
    port = free_port()
    limit = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))  # noqa: E731
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(serve_command(tiny_path, "--port", str(port)), preexec_fn=limit, stdout=log,
                            stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        assert until(lambda: _healthy(base), 120), "the server did not start"
        yield base, port, proc, log
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _healthy(base) -> bool:
    try:
        return httpx.get(f"{base}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_slow_request_heads_do_not_keep_a_request_out(limited):
    base, port, proc, log = limited
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))  # this test's own 1,100 sockets
    slow = []
    try:
        for _ in range(1100):
            s = socket.socket()
            s.setblocking(False)
            try:
                s.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
            slow.append(s)
        head = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        for i in range(3):  # a byte a second from each
            for s in slow:
                try:
                    s.send(head[i:i + 1])
                except OSError:
                    pass  # closed by the server already: room was made
            time.sleep(1)
        t = time.monotonic()
        r = httpx.get(f"{base}/v1/models", timeout=10)
        assert r.status_code == 200 and time.monotonic() - t < 5
        assert proc.poll() is None
        open_now = sum(1 for s in slow if _open(s))
        assert open_now < 1024  # the server closed slow heads to stay within its files
        log.seek(0)
        assert b"Too many open files" not in log.read()  # and never ran out of them
    finally:
        for s in slow:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _open(s: socket.socket) -> bool:
    try:
        return s.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def test_a_request_head_not_done_in_10_s_is_closed(tiny_path):
    with server(tiny_path) as base:
        port = int(base.rsplit(":", 1)[1])
        s = socket.create_connection(("127.0.0.1", port))
        s.settimeout(20)
        t = time.monotonic()
        s.send(b"GET /v1/models HTTP/1.1\r\n")
        closed = False
        while time.monotonic() - t < 18:
            try:
                s.send(b"X-Slow: 1\r\n")
            except OSError:
                closed = True
                break
            s.settimeout(1)
            try:
                if s.recv(1024) == b"":
                    closed = True
                    break
            except socket.timeout:
                pass
        assert closed and 9 < time.monotonic() - t < 15
        s.close()
        assert httpx.get(f"{base}/v1/models").status_code == 200


def test_an_unread_stream_stops_generating(tiny_path):
    with server(tiny_path, "--ctx-size", "32768", "--spec", "off") as base:
        port = int(base.rsplit(":", 1)[1])
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", port))
        body = json.dumps({"model": "tiny-qwen3.gguf", "prompt": "hello", "max_tokens": 30000, "stream": True,
                           "logit_bias": no_end(tiny_path)}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        model = "tiny-qwen3.gguf"
        assert until(lambda: value(scrape(base), "gguf_serve_requests_running", model=model) == 1, 30)
        # never read: the reply fills the socket, then the unread steps; the generation is cancelled
        assert until(lambda: value(scrape(base), "gguf_serve_requests_running", model=model) == 0, 120)
        generated = value(scrape(base), "gguf_serve_generated_tokens_total", model=model)
        assert generated < 30000
        s.close()
        assert httpx.post(f"{base}/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 2}
                          ).status_code == 200


def test_a_silent_stream_gets_pings_and_clients_read_through_them(tiny_path):
    """With one sequence slot, a streamed request waits while another generates 240 tokens:
    its stream, silent meanwhile, carries `: ping` comment lines every 0.01 s, and the openai
    SDK reads through them to the reply it gets without them; Ollama's NDJSON stream carries
    empty chunks, which its client reads through likewise."""
    import openai

    bias = no_end(tiny_path)
    body = {"model": tiny_path, "prompt": "hi", "max_tokens": 4, "temperature": 0, "logit_bias": bias}
    with server(tiny_path, "--parallel", "1", "--sse-ping-interval", "0.01") as base:
        def behind_a_long_request(call):
            long = threading.Thread(target=lambda: httpx.post(f"{base}/v1/completions", timeout=120, json={
                "model": tiny_path, "prompt": "the", "max_tokens": 240, "logit_bias": bias}))
            long.start()
            assert until(lambda: any(s["is_processing"] for s in httpx.get(f"{base}/slots").json()))
            try:
                return call()
            finally:
                long.join()

        def raw():
            with httpx.stream("POST", f"{base}/v1/completions", json={**body, "stream": True}, timeout=120) as r:
                return [line for line in r.iter_lines() if line]

        lines = behind_a_long_request(raw)
        assert ": ping" in lines and lines[-1] == "data: [DONE]"
        assert all(line == ": ping" or line.startswith("data: ") for line in lines)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="x")
        text = behind_a_long_request(lambda: "".join(
            c.choices[0].text for c in client.completions.create(**body, stream=True) if c.choices))
        assert text == client.completions.create(**body).choices[0].text
        # Ollama's NDJSON: empty chunks keep it alive, and its client adds them as nothing
        import ollama

        gen = {"model": tiny_path, "prompt": "hi", "raw": True, "options": {"temperature": 0, "num_predict": 4}}

        def ndjson():
            with httpx.stream("POST", f"{base}/api/generate", json=gen, timeout=120) as r:
                return [json.loads(line) for line in r.iter_lines() if line]

        chunks = behind_a_long_request(ndjson)
        assert {**chunks[0], "created_at": ""} == {"model": "tiny-qwen3.gguf", "created_at": "", "response": "",
                                                   "done": False}, chunks  # sent while the other generates
        assert chunks[-1]["done"] is True
        streamed = behind_a_long_request(lambda: "".join(
            c.response for c in ollama.Client(host=base).generate(**gen, stream=True)))
        assert streamed == ollama.Client(host=base).generate(**gen).response != ""
