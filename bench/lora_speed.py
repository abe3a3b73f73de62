"""What LoRA adapters cost, over HTTP, side by side with llama-server in one run, on the
synthetic Qwen3-4B Q4_K_M shape with rank-16 adapters on every attention and feed-forward
matrix (bench/synthetic.py: write_qwen3, write_qwen3_lora):

- 8 concurrent streams on our server: none with an adapter, then 4 adapters in use (two
  streams each, by the request's `lora` field, all in one batch): aggregate decode tok/s
  and their ratio (issue 44: within 15 %);
- one stream with an adapter: ours (`--lora`) against `llama-server --lora` (both apply it
  to every request), decode tok/s, and both without it.

    python bench/lora_speed.py [--threads 2] [--tokens 32] [--repeat 3] [--llama-server PATH]

Decode tok/s of a stream: its tokens after the first over the time from its first to its
last; aggregate: all streams' tokens over the time from the first stream's first token to
the last stream's last. Medians of the repeats, the configurations taking turns."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import httpx

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import synthetic  # noqa: E402  (bench/synthetic.py, beside this script)
from server_speed import free_port, wait_ready  # noqa: E402


class Server:
    def __init__(self, cmd: list[str], port: int):
        self.base = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
        wait_ready(self.base, self.proc, timeout=900)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def streams(base: str, bodies: list[dict]) -> tuple[float, float]:
    """(aggregate decode tok/s, the first stream's decode tok/s) of these streamed
    /completion requests run at once."""
    stamps: list[list[float]] = [[] for _ in bodies]

    def one(i: int) -> None:
        with httpx.stream("POST", f"{base}/completion", json={**bodies[i], "stream": True}, timeout=900) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith("data: ") and '"content"' in line and '"stop":false' in line.replace(" ", ""):
                    stamps[i].append(time.perf_counter())

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if any(len(s) < 2 for s in stamps):
        raise RuntimeError("a stream gave fewer than two tokens")
    start, end = min(s[0] for s in stamps), max(s[-1] for s in stamps)
    total = sum(len(s) - 1 for s in stamps)
    return total / (end - start), (len(stamps[0]) - 1) / (stamps[0][-1] - stamps[0][0])


def body(tokens: int, i: int = 0, lora: list | None = None) -> dict:
    out = {"prompt": f"Story {i}: once upon a time", "n_predict": tokens, "temperature": 0, "ignore_eos": True}
    if lora is not None:
        out["lora"] = lora
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER"))
    ap.add_argument("--folder", default=os.path.join(tempfile.gettempdir(), "gguf-serve-lora-bench"))
    args = ap.parse_args()
    os.makedirs(args.folder, exist_ok=True)
    model = os.path.join(tempfile.gettempdir(), "gguf-serve-synthetic-qwen3-4b.gguf")  # cpu_speed.py's
    if not os.path.exists(model):
        synthetic.write_qwen3(model)
    adapters = [os.path.join(args.folder, f"adapter{i}.gguf") for i in range(4)]
    for i, path in enumerate(adapters):
        if not os.path.exists(path):
            synthetic.write_qwen3_lora(path, seed=i + 1)
    ours = [sys.executable, "-m", "gguf_serve.server.cli", model, "--threads", str(args.threads), "--ctx-size", "4096"]

    # 8 streams: none with an adapter, then 4 adapters two streams each, on one server
    port = free_port()
    server = Server(ours + ["--parallel", "8", "--lora-init-without-apply", "--port", str(port)]
                    + [x for a in adapters for x in ("--lora", a)], port)
    plain, mixed = [], []
    try:
        streams(server.base, [body(4, i) for i in range(8)])  # warm-up
        for _ in range(args.repeat):
            plain.append(streams(server.base, [body(args.tokens, i) for i in range(8)])[0])
            mixed.append(streams(server.base, [body(args.tokens, i, [{"id": i % 4, "scale": 1.0}])
                                               for i in range(8)])[0])
    finally:
        server.close()
    p, m = statistics.median(plain), statistics.median(mixed)
    print(f"8 streams, aggregate decode: no adapter {p:.2f} tok/s, 4 adapters in use {m:.2f} tok/s ({m / p:.2f}x)")

    # one stream with an adapter, ours against llama-server's
    rows = {}
    for name, cmd in (("gguf-serve", lambda port, lora: ours + ["--parallel", "1", "--port", str(port)]
                       + (["--lora", adapters[0]] if lora else [])),
                      ("llama-server", lambda port, lora: [args.llama_server, "-m", model, "-t", str(args.threads),
                                                           "-c", "4096", "-np", "1", "--port", str(port)]
                       + (["--lora", adapters[0]] if lora else []))):
        if name == "llama-server" and not args.llama_server:
            continue
        for lora in (False, True):
            port = free_port()
            server = Server(cmd(port, lora), port)
            try:
                streams(server.base, [body(4)])
                rows[(name, lora)] = statistics.median(streams(server.base, [body(args.tokens)])[1]
                                                       for _ in range(args.repeat))
            finally:
                server.close()
    print("\n| one stream, decode tok/s | no adapter | with the adapter |")
    print("|---|---|---|")
    for name in ("gguf-serve", "llama-server"):
        if (name, True) in rows:
            print(f"| {name} | {rows[(name, False)]:.2f} | {rows[(name, True)]:.2f} |")
    if ("llama-server", True) in rows:
        print(f"\nwith the adapter, ours / llama-server's: {rows[('gguf-serve', True)] / rows[('llama-server', True)]:.2f}x")


if __name__ == "__main__":
    main()
