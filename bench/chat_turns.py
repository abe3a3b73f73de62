"""Multi-turn chats through HTTP, side by side with llama.cpp's llama-server: time to
first token of each of three turns (`/v1/chat/completions`, streamed), where each turn's
prompt repeats the conversation so far with the replies as a client keeps them (the
answer, not the thinking). A prefix cache should make turns 2 and 3 pay only for what
is new; on a hybrid model (Qwen3.5's recurrent layers) or past a sliding window (Gemma
3) that takes state checkpoints, since the new prompt leaves the history inside the
last assistant header (the thinking it dropped).

- qwen35-4b: the synthetic Qwen3.5-4B-shaped Q4_K_M file (bench/synthetic.py: random
  weights, byte-level vocabulary, a thinking template), a ~400-token system prompt,
  thinking on, 16 tokens a reply.
- gemma: the real Gemma 3 270M file, a ~1,200-token system prompt (longer than its
  512-token sliding window), 24 tokens a reply.

Both servers: the same threads, 4 slots x 4096 tokens, their defaults otherwise
(llama-server's context checkpoints on). Each runs in its own process, one after the
other, `--repeat` rounds; medians printed with ratios.

    python bench/chat_turns.py [--files qwen35-4b,gemma] [--threads 2] [--repeat 2] [--llama-server PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from server_speed import free_port, sse_chunks, wait_ready  # noqa: E402

SLOTS, SLOT_CTX = 4, 4096
PROSE = (Path(__file__).parent / "data" / "prose.txt").read_text()
QUESTIONS = ("What is the text about?", "Who is named in it?", "Summarize it in one line.")
ANSWERS = ("It is about a journey along a river.", "A traveller and a ferryman.")


def gemma_path() -> str:
    from gguf_serve.server.models.default_model import default_model_path

    return default_model_path()


def synthetic_path(name: str) -> str:
    from synthetic import WRITERS

    path = os.path.join(tempfile.gettempdir(), f"gguf-serve-synthetic-{name}.gguf")
    if not os.path.exists(path):
        print(f"writing {path} ...", flush=True)
        WRITERS[name](path)
    return path


FILES = {
    "qwen35-4b": dict(path=lambda: synthetic_path("qwen35-4b"), system_chars=380, tokens=16,
                      label="Qwen3.5-4B shape Q4_K_M (synthetic), thinking, ~400-token system prompt"),
    "gemma": dict(path=gemma_path, system_chars=None, tokens=24,
                  label="Gemma 3 270M Q4_K_M, ~1,200-token system prompt (window 512)"),
}


def system_prompt(chars: int | None) -> str:
    text = PROSE + "\n\n" + PROSE if chars is None else PROSE[:chars]
    return "You are a careful reader. Answer questions about this text briefly.\n\n" + text


def turn(url: str, model: str, messages: list, tokens: int) -> dict:
    """One streamed turn: time to the first piece of text or thinking, and the usage."""
    body = {"model": model, "messages": messages, "max_tokens": tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    start, first, usage = time.perf_counter(), None, {}
    for chunk in sse_chunks(url, "/v1/chat/completions", body):
        usage = chunk.get("usage") or usage
        delta = ((chunk.get("choices") or [{}])[0].get("delta") or {})
        if first is None and (delta.get("content") or delta.get("reasoning_content")):
            first = time.perf_counter()
    details = usage.get("prompt_tokens_details") or {}
    return {"ttft_ms": ((first or time.perf_counter()) - start) * 1e3, "prompt": usage.get("prompt_tokens", 0),
            "cached": details.get("cached_tokens", 0)}


def conversation(url: str, model: str, spec: dict) -> list[dict]:
    msgs = [{"role": "system", "content": system_prompt(spec["system_chars"])}]
    out = []
    for i, question in enumerate(QUESTIONS):
        msgs.append({"role": "user", "content": question})
        out.append(turn(url, model, msgs, spec["tokens"]))
        if i < len(ANSWERS):
            msgs.append({"role": "assistant", "content": ANSWERS[i]})  # the answer a client keeps
    return out


def run_server(cmd: list[str], port: int, model: str, spec: dict) -> list[dict]:
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(url, proc, timeout=600)
        turn(url, model, [{"role": "user", "content": "hello"}], 2)  # warm-up
        return conversation(url, model, spec)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", default="qwen35-4b,gemma")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER") or shutil.which("llama-server"))
    args = ap.parse_args()
    for name in args.files.split(","):
        spec = FILES[name]
        path = spec["path"]()
        runs: dict[str, list[list[dict]]] = {}
        for _ in range(args.repeat):
            port = free_port()
            runs.setdefault("gguf-serve", []).append(run_server(
                [sys.executable, "-m", "gguf_serve.server.cli", path, "--port", str(port), "--threads",
                 str(args.threads), "--parallel", str(SLOTS), "--ctx-size", str(SLOT_CTX)], port, path, spec))
            if args.llama_server:
                port = free_port()
                runs.setdefault("llama-server", []).append(run_server(
                    [args.llama_server, "-m", path, "--port", str(port), "-t", str(args.threads), "-np", str(SLOTS),
                     "-c", str(SLOTS * SLOT_CTX), "--jinja"], port, "model", spec))
        print(f"\n{spec['label']}; {args.threads} threads; medians of {args.repeat}")
        med = {n: [statistics.median(r[t]["ttft_ms"] for r in rs) for t in range(3)] for n, rs in runs.items()}
        print(f"{'time to first token (ms)':28s}" + "".join(f"{f'turn {t + 1}':>12s}" for t in range(3))
              + f"{'turn 3 / turn 1':>18s}   prompt tokens (cached)")
        for n, rs in runs.items():
            r = rs[-1]
            print(f"{n:28s}" + "".join(f"{v:12.0f}" for v in med[n]) + f"{med[n][2] / med[n][0]:17.2f}x   "
                  + ", ".join(f"{t['prompt']} ({t['cached']})" for t in r))
        if "llama-server" in med:
            ours, theirs = med["gguf-serve"], med["llama-server"]
            print(f"{'llama-server / gguf-serve':28s}" + "".join(f"{b / a:11.2f}x" for a, b in zip(ours, theirs)))


if __name__ == "__main__":
    main()
