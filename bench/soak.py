"""A soak of the server as issue 39 left it: `--clients` clients (32) for `--seconds`
(300) of mixed traffic on the real Gemma 3 270M file and a small synthetic Qwen3-Embedding
file: streamed chat completions, completions, Anthropic messages (streamed or not) and
embeddings, a fifth of the streams cut by their client after a few events. It prints the
statuses the clients saw (no 5xx is the aim), the requests the server counted by route
against the clients' own counts, and the server's resident memory after a warm-up and at
the end (flat is the aim).

    python bench/soak.py [--clients 32] [--seconds 300] [--threads 2] [--ctx-size 4096] [--cache-ram MiB]

Clients wait a second after a 429 or 503 (Retry-After). Memory is sampled each second:
the KV cache's pages are touched as slots fill, and Gemma's sliding-window checkpoints
(about 8 MiB each) fill --cache-ram as prompts come, so it grows at first and should then
stay put.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gguf_serve.server.models.default_model import default_model_path

sys.path.insert(0, str(Path(__file__).parent))
from server_speed import free_port, wait_ready  # noqa: E402
from synthetic import QWEN3_EMBEDDING_06B, write_qwen3_embedding  # noqa: E402

SMALL_EMBEDDING = dict(QWEN3_EMBEDDING_06B, hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64, ffn=512)
PROSE = (Path(__file__).parent / "data" / "prose.txt").read_text().split()


def words(rng: random.Random, n: int) -> str:
    start = rng.randrange(len(PROSE) - n)
    return " ".join(PROSE[start:start + n])


def one(client: httpx.Client, rng: random.Random, gemma: str) -> tuple[str, int]:
    """One request of a random kind; (route, status). A fifth of the streams are cut."""
    kind = rng.choice(["chat", "completions", "messages", "embeddings"])
    cut = rng.random() < 0.2
    if kind == "embeddings":
        body = {"model": "embedding.gguf", "input": [words(rng, rng.randint(3, 60)) for _ in range(rng.randint(1, 4))]}
        return "/v1/embeddings", client.post("/v1/embeddings", json=body).status_code
    prompt = words(rng, rng.randint(5, 200))
    if kind == "completions":
        body = {"model": gemma, "prompt": prompt, "max_tokens": rng.randint(1, 48)}
        return "/v1/completions", client.post("/v1/completions", json=body).status_code
    if kind == "chat":
        path, body = "/v1/chat/completions", {"model": gemma, "messages": [{"role": "user", "content": prompt}],
                                               "max_tokens": rng.randint(1, 64), "stream": True}
    else:
        path, body = "/v1/messages", {"model": gemma, "messages": [{"role": "user", "content": prompt}],
                                      "max_tokens": rng.randint(1, 64), "stream": rng.random() < 0.5}
    if not body["stream"]:
        return path, client.post(path, json=body).status_code
    with client.stream("POST", path, json=body) as r:
        for i, _ in enumerate(r.iter_lines()):
            if cut and i >= 3:
                break  # the client goes: the connection closes with the stream half read
    return path, r.status_code


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def counted(base: str) -> collections.Counter:
    """The server's requests by (route, status), from /metrics."""
    out = collections.Counter()
    for fam in text_string_to_metric_families(httpx.get(f"{base}/metrics").text):
        for s in fam.samples:
            if s.name == "gguf_serve_requests_total":
                out[(s.labels["endpoint"], s.labels["status"])] += int(s.value)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx-size", type=int, default=4096, help="the server's --ctx-size (its KV cache's size)")
    ap.add_argument("--cache-ram", type=int, help="the server's --cache-ram, MiB of state checkpoints (default its own: "
                                                   "a tenth of the memory available, filled as prompts come)")
    args = ap.parse_args()
    folder = tempfile.mkdtemp(prefix="gguf-serve-soak-")
    gemma = os.path.join(folder, "gemma.gguf")
    os.symlink(default_model_path(), gemma)
    write_qwen3_embedding(os.path.join(folder, "embedding.gguf"), SMALL_EMBEDDING)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "gguf_serve.server.cli", folder, "--port", str(port),
                             "--threads", str(args.threads), "--ctx-size", str(args.ctx_size),
                             *(["--cache-ram", str(args.cache_ram)] if args.cache_ram is not None else [])],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_ready(base, proc)
        with httpx.Client(base_url=base, timeout=600) as c:  # warm-up: both models loaded, every path once
            for i in range(8):
                one(c, random.Random(i), "gemma.gguf")
        before_counts, before_rss = counted(base), rss_mib(proc.pid)
        seen, lock, stop = collections.Counter(), threading.Lock(), time.monotonic() + args.seconds

        def client(i: int) -> None:
            rng = random.Random(1000 + i)
            with httpx.Client(base_url=base, timeout=600) as c:
                while time.monotonic() < stop:
                    route, status = one(c, rng, "gemma.gguf")
                    with lock:
                        seen[(route, str(status))] += 1
                    if status in (429, 503):  # as clients do: wait as Retry-After says (1 s)
                        time.sleep(1)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        for t in threads:
            t.start()
        samples = [before_rss]
        while any(t.is_alive() for t in threads):
            samples.append(rss_mib(proc.pid))
            time.sleep(1)
        after_rss = rss_mib(proc.pid)
        quarters = [samples[len(samples) * k // 4] for k in (1, 2, 3)]
        server = counted(base) - before_counts
        server = collections.Counter({k: v for k, v in server.items() if k[0] in {r for r, _ in seen}})
        print(f"{args.clients} clients, {args.seconds:g} s: {sum(seen.values())} requests")
        for key in sorted(set(seen) | set(server)):
            print(f"  {key[0]:24} {key[1]}: clients {seen[key]:5}  server {server[key]:5}")
        fives = sum(v for (r, s), v in seen.items() if s.startswith("5"))
        print(f"5xx: {fives}; counts equal: {seen == server}")
        print(f"resident memory (MiB): {before_rss:.0f} after the warm-up, {' / '.join(f'{q:.0f}' for q in quarters)} "
              f"at a quarter, half and three quarters, {after_rss:.0f} at the end, peak {max(samples):.0f}")
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    main()
