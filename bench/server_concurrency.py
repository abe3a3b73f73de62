"""Many clients at once through HTTP, side by side with llama.cpp's llama-server: the
table of issue 12. Both servers get the real Gemma 3 270M file, the same threads, 8
sequence slots (`--parallel 8` / `-np 8`, 4096 tokens each) and the same requests:

- 1 stream: time to first token and decode tok/s (`/v1/completions`, streamed, greedy,
  ignore_eos, `--tokens` tokens);
- 4 and 8 concurrent streams (different prompts): aggregate tok/s (all tokens over the
  wall time from the first request to the last token) and mean time to first token;
- a chat with a ~1,200-token system prompt, three turns (`/v1/chat/completions`,
  streamed, 24 tokens a reply): time to first token of the first turn and of the third,
  whose prompt repeats the first two turns (a prefix cache pays only for the new turn).

Each server runs in its own process on 127.0.0.1, one after the other, `--repeat`
rounds (so that the machine's drifts hit both); medians printed, with ratios.

    python bench/server_concurrency.py [--threads 2] [--repeat 3] [--tokens 128] [--llama-server PATH]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from server_speed import free_port, setup, wait_ready  # noqa: E402

SLOTS, SLOT_CTX = 8, 4096
PROSE = (Path(__file__).parent / "data" / "prose.txt").read_text()


def stream(url: str, path: str, body: dict, out: list) -> None:
    """One streamed request; appends {start, stamps (perf_counter time of each piece), text}."""
    stamps, pieces, tokens = [], [], None
    start = time.perf_counter()
    body = {**body, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", url + path, json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            c = (chunk.get("choices") or [{}])[0]
            piece = c.get("text") or (c.get("delta") or {}).get("content")
            if piece:
                stamps.append(time.perf_counter())
                pieces.append(piece)
    out.append({"start": start, "stamps": stamps, "text": "".join(pieces), "tokens": tokens or len(stamps)})


def completion(prompt: str, tokens: int, model: str) -> dict:
    return {"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True,
            "ignore_eos": True}


def concurrent(url: str, model: str, n: int, tokens: int) -> dict:
    out: list = []
    t0 = time.perf_counter()
    threads = [threading.Thread(target=stream, args=(url, "/v1/completions", completion(
        f"Story number {i}. {PROSE[:200 + 40 * i]}", tokens, model), out)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    end = max(r["stamps"][-1] for r in out)
    total = sum(r["tokens"] for r in out)
    return {"aggregate": total / (end - t0), "ttft_ms": statistics.mean((r["stamps"][0] - r["start"]) * 1e3
                                                                         for r in out)}


def one_stream(url: str, model: str, tokens: int) -> dict:
    out: list = []
    stream(url, "/v1/completions", completion("The history of the city of Paris begins", tokens, model), out)
    s = out[0]["stamps"]
    return {"ttft_ms": (s[0] - out[0]["start"]) * 1e3, "decode": (out[0]["tokens"] - 1) / (s[-1] - s[0])}


def chat(url: str, model: str) -> dict:
    system = ("You are a careful reader. Answer questions about this text briefly.\n\n" + PROSE + "\n\n" + PROSE)
    msgs = [{"role": "system", "content": system}]
    ttft = []
    for question in ("What is the text about?", "Who is named in it?", "Summarize it in one line."):
        msgs.append({"role": "user", "content": question})
        out: list = []
        stream(url, "/v1/chat/completions", {"model": model, "messages": msgs, "max_tokens": 24, "temperature": 0,
                                             "stream": True}, out)
        ttft.append((out[0]["stamps"][0] - out[0]["start"]) * 1e3)
        msgs.append({"role": "assistant", "content": out[0]["text"]})
    return {"chat_first_ms": ttft[0], "chat_third_ms": ttft[2]}


def run_server(cmd: list[str], port: int, model: str, tokens: int) -> dict:
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(url, proc)
        concurrent(url, model, 2, 8)  # warm-up
        r = one_stream(url, model, tokens)
        for n in (4, 8):
            c = concurrent(url, model, n, tokens)
            r[f"agg{n}"], r[f"ttft{n}_ms"] = c["aggregate"], c["ttft_ms"]
        r.update(chat(url, model))
        return r
    finally:
        proc.terminate()
        proc.wait(timeout=30)


ROWS = [("1 stream: time to first token (ms)", "ttft_ms", False),
        ("1 stream: decode (tok/s)", "decode", True),
        ("4 concurrent streams: aggregate (tok/s)", "agg4", True),
        ("8 concurrent streams: aggregate (tok/s)", "agg8", True),
        ("8 concurrent streams: mean time to first token (ms)", "ttft8_ms", False),
        ("chat, ~1,200-token system prompt: first turn TTFT (ms)", "chat_first_ms", False),
        ("the same chat, third turn TTFT (ms)", "chat_third_ms", False)]


def main() -> None:
    args, path, server = setup()
    runs: dict[str, list[dict]] = {}
    for _ in range(args.repeat):
        port = free_port()
        runs.setdefault("gguf-serve", []).append(run_server(
            [sys.executable, "-m", "gguf_serve.server.cli", path, "--port", str(port), "--threads", str(args.threads),
             "--parallel", str(SLOTS), "--ctx-size", str(SLOT_CTX)], port, path, args.tokens))
        if server:
            port = free_port()
            runs.setdefault("llama-server", []).append(run_server(
                [server, "-m", path, "--port", str(port), "-t", str(args.threads), "-np", str(SLOTS),
                 "-c", str(SLOTS * SLOT_CTX)], port, "gemma", args.tokens))
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    print(f"Gemma 3 270M Q4_K_M, {args.threads} threads, {SLOTS} slots x {SLOT_CTX} tokens, {args.tokens} tokens "
          f"a stream; medians of {args.repeat}")
    names = list(med)
    print(f"{'':56s}" + "".join(f"{n:>14s}" for n in names) + ("   ours/llama (higher is better)" if server else ""))
    for label, key, higher in ROWS:
        line = f"{label:56s}" + "".join(f"{med[n][key]:14.1f}" for n in names)
        if server:
            a, b = med["gguf-serve"][key], med["llama-server"][key]
            line += f"   {a / b if higher else b / a:.2f}x"
        print(line)


if __name__ == "__main__":
    main()
