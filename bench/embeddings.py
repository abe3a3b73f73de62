"""Embeddings per second through HTTP, side by side with llama.cpp's llama-server
(`--embedding --pooling` the file's) on the same file: a synthetic Qwen3-Embedding-0.6B
Q8_0 (`--file qwen3-embedding`: byte-level vocabulary, a character a token, EOS appended,
last-token pooling) or BERT-base Q8_0 (`--file bert-base`: bge-base's shape, a WordPiece
vocabulary of letters, about a token a character, mean pooling; bench/synthetic.py),
`POST /v1/embeddings` with 64 inputs of about 128 tokens each in one request, the same
thread count, each server with its defaults otherwise. The servers take turns,
`--repeat` rounds; medians printed, with the cosine between the two servers' vectors
(the same model: they should agree).

    python bench/embeddings.py [--file qwen3-embedding|bert-base] [--threads 2] [--repeat 3] [--inputs 64]
        [--tokens 128] [--llama-server PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import httpx
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_speed import free_port, llama_server, wait_ready  # noqa: E402
from synthetic import write_bert, write_qwen3_embedding  # noqa: E402

FILES = {  # path, writer, llama-server's pooling, label
    "qwen3-embedding": ("/tmp/gguf-serve-synthetic-qwen3-embedding-0.6b.gguf", write_qwen3_embedding, "last",
                        "synthetic Qwen3-Embedding-0.6B Q8_0"),
    "bert-base": ("/tmp/gguf-serve-synthetic-bert-base.gguf", write_bert, "mean", "synthetic BERT-base Q8_0"),
}


def texts(n: int, tokens: int) -> list[str]:
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz "))
    return ["".join(rng.choice(letters, tokens)) for _ in range(n)]


def run(cmd: list[str], url: str, model: str, inputs: list[str], repeat: int) -> tuple[float, np.ndarray]:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(url, proc)
        body = {"model": model, "input": inputs, "encoding_format": "float"}
        httpx.post(url + "/v1/embeddings", json={**body, "input": inputs[:2]}, timeout=600).raise_for_status()
        times, vectors = [], None
        for _ in range(repeat):
            t = time.perf_counter()
            r = httpx.post(url + "/v1/embeddings", json=body, timeout=900)
            times.append(time.perf_counter() - t)
            r.raise_for_status()
            vectors = np.array([d["embedding"] for d in sorted(r.json()["data"], key=lambda d: d["index"])])
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return statistics.median(times), vectors


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", choices=sorted(FILES), default="qwen3-embedding")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--inputs", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--llama-server", help="path of llama.cpp's llama-server (else $LLAMA_SERVER or PATH)")
    args = ap.parse_args()
    server = llama_server(args.llama_server)
    path, writer, pooling, label = FILES[args.file]
    if not os.path.exists(path):
        writer(path)
    inputs = texts(args.inputs, args.tokens)
    got = {}
    for _ in range(args.repeat):  # turns, so that drifts hit both
        port = free_port()
        t, ours = run([sys.executable, "-m", "gguf_serve.server.cli", path, "--port", str(port),
                       "--threads", str(args.threads)], f"http://127.0.0.1:{port}", os.path.basename(path), inputs, 1)
        got.setdefault("gguf-serve", []).append(t)
        if server:
            port = free_port()
            t, theirs = run([server, "-m", path, "--port", str(port), "-t", str(args.threads), "--embedding",
                             "--pooling", pooling, "-c", "8192"], f"http://127.0.0.1:{port}", "x", inputs, 1)
            got.setdefault("llama-server", []).append(t)
    print(f"/v1/embeddings: {args.inputs} inputs of {args.tokens} tokens in one request, {args.threads} threads, "
          f"{label} (medians of {args.repeat})")
    rates = {name: args.inputs / statistics.median(ts) for name, ts in got.items()}
    for name, rate in rates.items():
        print(f"{name:14s} {statistics.median(got[name]):7.2f} s  {rate:7.2f} embeddings/s")
    if server:
        cos = float(np.mean(np.sum(ours * theirs, 1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)))
        print(f"gguf-serve / llama-server: {rates['gguf-serve'] / rates['llama-server']:.3f}x; "
              f"mean cosine between their vectors {cos:.5f}")


if __name__ == "__main__":
    main()
