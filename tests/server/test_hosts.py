"""A browser's way in (issue 39): DNS rebinding (a page of another site whose name now
points at 127.0.0.1 sends that name as Host) gets a 403, and so does a cross-site page's
POST (its Origin); --allowed-hosts and --cors-origins open what the user names, with the
CORS headers a browser needs. Non-browser clients (no Origin, an IP or localhost as
Host) are served as before."""

from __future__ import annotations

import httpx
import pytest

from server_harness import server


@pytest.fixture(scope="module")
def base(tiny_path):
    with server(tiny_path) as b:
        yield b


def test_a_foreign_host_is_refused_and_local_names_are_served(base):
    port = base.rsplit(":", 1)[1]
    r = httpx.get(f"{base}/v1/models", headers={"Host": f"attacker.example:{port}"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed"
    assert "attacker.example" in r.json()["error"]["message"]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"LOCALHOST.:{port}", f"app.localhost:{port}",
                 f"[::1]:{port}", "127.1", f"10.1.2.3:{port}"):  # any IP literal: a rebinding page has a name
        assert httpx.get(f"{base}/v1/models", headers={"Host": host}).status_code == 200, host
    assert httpx.get(f"{base}/health", headers={"Host": "attacker.example"}).status_code == 403
    r = httpx.post(f"{base}/v1/messages", headers={"Host": "attacker.example"}, json={})
    assert r.status_code == 403 and r.json()["type"] == "error"  # Anthropic's envelope on its path
    assert r.json()["error"]["type"] == "permission_error"


def test_a_cross_site_post_is_refused_and_the_pages_own_is_served(base, tiny_path):
    body = {"model": "tiny-qwen3.gguf", "content": "hello"}
    r = httpx.post(f"{base}/tokenize", json=body, headers={"Origin": "https://evil.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
    assert httpx.post(f"{base}/tokenize", json=body, headers={"Origin": "null"}).status_code == 403
    assert httpx.post(f"{base}/tokenize", json=body, headers={"Origin": base}).status_code == 200  # the chat page
    assert httpx.post(f"{base}/tokenize", json=body).status_code == 200  # not a browser
    r = httpx.get(f"{base}/v1/models", headers={"Origin": "https://evil.example"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers  # the page cannot read it
    r = httpx.options(f"{base}/tokenize", headers={"Origin": "https://evil.example",
                                                   "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in r.headers  # no CORS unless asked for


def test_allowed_hosts_and_cors_origins_open_what_they_name(tiny_path):
    with server(tiny_path, "--allowed-hosts", ".example.test", "--allowed-hosts", "gguf.internal",
                "--cors-origins", "https://app.example") as b:
        for host, status in (("example.test", 200), ("a.b.example.test", 200), ("gguf.internal:80", 200),
                             ("badexample.test", 403), ("other.internal", 403)):
            assert httpx.get(f"{b}/v1/models", headers={"Host": host}).status_code == status, host
        pre = httpx.options(f"{b}/v1/chat/completions", headers={
            "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "https://app.example"
        body = {"model": "tiny-qwen3.gguf", "content": "hello"}
        r = httpx.post(f"{b}/tokenize", json=body, headers={"Origin": "https://app.example"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"
        assert httpx.post(f"{b}/tokenize", json=body, headers={"Origin": "https://evil.example"}).status_code == 403
    with server(tiny_path, "--host", "0.0.0.0", "--allowed-hosts", "*", "--cors-origins", "*") as b:
        assert httpx.get(f"{b}/v1/models", headers={"Host": "anything.example"}).status_code == 200
        r = httpx.post(f"{b}/tokenize", json={"model": "tiny-qwen3.gguf", "content": "x"},
                       headers={"Origin": "https://any.example"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"
