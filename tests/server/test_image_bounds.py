"""Images bounded before work (issue 39): too many, too many pixels together or too many
tokens for the context are refused from their headers, before any is decoded; a data
URL's media type must be what its bytes are. Image URLs (--image-urls): loopback and
private addresses refused in every spelling and through redirects, a redirect to
another host refused, a slow host cut at --image-url-timeout without holding up
anyone else, and errors that do not tell what answered."""

from __future__ import annotations

import base64
import io
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from PIL import Image

from server_harness import free_port, server
from tiny_vision import data_url, image, tiny_gemma3_vlm, user

MODEL = "tiny-gemma3-vl.gguf"


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    return tiny_gemma3_vlm(tmp_path_factory.mktemp("vlm"), text_mix="Q8_0", vision_ftype="F16")


def png(size, color=(200, 30, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


def big_png_url() -> str:
    return "data:image/png;base64," + base64.b64encode(png((5000, 5000))).decode()  # 25 M pixels, ~80 KB


def chat(base, messages, timeout=60):
    return httpx.post(f"{base}/v1/chat/completions", timeout=timeout,
                      json={"model": MODEL, "messages": messages, "max_tokens": 2})


def error(r, status=400):
    assert r.status_code == status, r.text
    return r.json()["error"]


def test_many_large_images_are_refused_before_decoding(vlm):
    big = big_png_url()
    with server(vlm.text_path, "--ctx-size", "1024") as base:  # --max-images from the context: 1024 / 256 = 4
        e = error(chat(base, [user(*[image(big)] * 40)]))
        assert e["param"] == "messages.0.content.5" and "at most 4 images (--max-images)" in e["message"]
    with server(vlm.text_path, "--ctx-size", "1024", "--max-images", "64") as base:
        t = time.monotonic()
        e = error(chat(base, [user(*[image(big)] * 40)]))
        # the seventh reaches 175 M pixels: refused from the headers (40 decodes would take half a minute)
        assert e["param"] == "messages.0.content.7" and "160000000" in e["message"]
        assert time.monotonic() - t < 10
        assert chat(base, [user(image(data_url(1)))]).status_code == 200


def test_the_images_tokens_are_counted_against_the_context_first(vlm):
    with server(vlm.text_path, "--ctx-size", "40", "--max-images", "8") as base:  # 16 tokens an image
        e = error(chat(base, [user(*[image(data_url(i)) for i in range(4)])]))
        assert e["code"] == "context_length_exceeded" and e["param"] == "messages.0.content.3"
        assert "take 48" in e["message"]


def test_a_data_urls_media_type_is_what_its_bytes_are(vlm):
    raw = base64.b64encode(png((32, 32))).decode()
    with server(vlm.text_path, "--ctx-size", "1024") as base:
        e = error(chat(base, [user(image(f"data:text/html;base64,{raw}"))]))
        assert e["param"] == "messages.0.content.1" and "image type" in e["message"]
        e = error(chat(base, [user(image(f"data:image/jpeg;base64,{raw}"))]))
        assert "says image/jpeg, but its bytes are a PNG" in e["message"]
        assert chat(base, [user(image(f"data:image/png;base64,{raw}"))]).status_code == 200


class Host:
    """An image host on 127.0.0.1 (the tests' own, in a thread): /img.png, /slow.png (a byte
    every half second), /here (a redirect to /img.png), /away (a redirect to `away`),
    /missing (404); `hits` counts the requests it got."""

    def __init__(self, away: str = ""):
        self.hits, self.away, data = 0, away, png((48, 32))
        host = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                host.hits += 1
                if self.path in ("/here", "/away"):
                    self.send_response(302)
                    self.send_header("Location", "/img.png" if self.path == "/here" else host.away)
                    self.end_headers()
                elif self.path in ("/img.png", "/slow.png"):
                    self.send_response(200)
                    self.send_header("Content-Type", "image/png")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    for i in range(0, len(data), 1 if self.path == "/slow.png" else len(data)):
                        try:
                            self.wfile.write(data[i:i + (1 if self.path == "/slow.png" else len(data))])
                            self.wfile.flush()
                        except OSError:
                            return
                        if self.path == "/slow.png":
                            time.sleep(0.5)
                else:
                    self.send_error(404)

        self.port = free_port()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


@pytest.fixture
def host():
    h = Host()
    yield h
    h.close()


def test_local_addresses_are_refused_however_spelled(vlm, host):
    p = host.port
    with server(vlm.text_path, "--image-urls") as base:
        for url in (f"http://127.0.0.1:{p}/img.png", f"http://127.1:{p}/img.png", f"http://2130706433:{p}/img.png",
                    f"http://localhost:{p}/img.png", f"http://[::1]:{p}/img.png", f"http://0.0.0.0:{p}/img.png",
                    f"http://[::ffff:127.0.0.1]:{p}/img.png", "http://169.254.169.254/latest/meta-data/",
                    "http://10.0.0.1/x.png", "http://192.168.1.1/x.png", "http://100.64.0.1/x.png"):
            e = error(chat(base, [user(image(url))]))
            assert e["param"] == "messages.0.content.1" and "local or private address" in e["message"], url
        assert host.hits == 0  # nothing was fetched


def test_redirects_slow_hosts_and_what_errors_say(vlm, host):
    other = Host()
    host.away = f"http://localhost:{other.port}/img.png"  # another host (name), the same machine
    p = host.port
    try:
        with server(vlm.text_path, "--image-urls", "--image-urls-allow-private", "--image-url-timeout", "4",
                    "--parallel", "8", "--ctx-size", "1024") as base:
            assert chat(base, [user(image(f"http://127.0.0.1:{p}/img.png"))]).status_code == 200
            assert chat(base, [user(image(f"http://127.0.0.1:{p}/here"))]).status_code == 200  # same host
            e = error(chat(base, [user(image(f"http://127.0.0.1:{p}/away"))]))
            assert "redirects to another host" in e["message"] and other.hits == 0
            e = error(chat(base, [user(image(f"http://127.0.0.1:{p}/missing"))]))
            assert "HTTP 404" in e["message"]
            closed = free_port()  # nothing listens: the error says no more than that it failed
            e = error(chat(base, [user(image(f"http://127.0.0.1:{closed}/img.png"))]))
            assert e["message"].endswith("the image could not be fetched from its URL")
            # six requests on a host that sends a byte every half second: cut at 4 s, and meanwhile a
            # text request is answered (no thread waits on the host)
            slow = []
            threads = [threading.Thread(target=lambda: slow.append(chat(base, [user(image(
                f"http://127.0.0.1:{p}/slow.png"))]))) for _ in range(6)]
            for t in threads:
                t.start()
            r = chat(base, [{"role": "user", "content": "hi"}])
            assert r.status_code == 200 and all(t.is_alive() for t in threads)
            for t in threads:
                t.join(30)
            assert len(slow) == 6 and all("within 4 s (--image-url-timeout)" in error(r)["message"] for r in slow)
    finally:
        other.close()
