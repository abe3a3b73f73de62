"""The prompt cache's disk tier through HTTP: time to first token of a long
conversation's second and third turns when the server was restarted, or its model
unloaded, between them (`--cache-disk`), beside the same turns with the state in RAM
(warm) and a cold prefill.

The synthetic Qwen3.5-4B-shaped Q4_K_M file (bench/synthetic.py: random weights, a
byte-level vocabulary, a thinking template), a system prompt of about `--prompt-tokens`
tokens, three questions with the answers a client keeps, `--tokens` a reply. Runs, each
server its own process:

- warm: one server, the three turns (turn 1 is the cold prefill);
- disk: a server asked turn 1, stopped (SIGTERM: its kept slot is written); a new one
  asked turn 2 (the restart), then its model unloaded (written again) and turn 3 asked
  (the reload).

    python bench/cache_disk.py [--threads 2] [--repeat 2] [--prompt-tokens 4000]
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

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from chat_turns import ANSWERS, PROSE, QUESTIONS, synthetic_path, turn  # noqa: E402
from server_speed import free_port, wait_ready  # noqa: E402


def messages(prompt_chars: int, upto: int) -> list[dict]:
    text = (PROSE + "\n\n") * (prompt_chars // len(PROSE) + 1)
    msgs = [{"role": "system", "content": "You are a careful reader. Answer questions about this text briefly.\n\n"
             + text[:prompt_chars]}]
    for i in range(upto + 1):
        msgs.append({"role": "user", "content": QUESTIONS[i]})
        if i < upto:
            msgs.append({"role": "assistant", "content": ANSWERS[i]})
    return msgs


class Server:
    def __init__(self, path: str, threads: int, *extra: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.path = path
        cmd = [sys.executable, "-m", "gguf_serve.server.cli", path, "--port", str(self.port), "--threads",
               str(threads), "--parallel", "2", "--ctx-size", "8192", *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_ready(self.url, self.proc, timeout=600)
        turn(self.url, path, [{"role": "user", "content": "hello"}], 2)  # loaded, warmed up

    def ask(self, msgs, tokens):
        return turn(self.url, self.path, msgs, tokens)

    def unload(self) -> float:
        start = time.perf_counter()
        httpx.post(f"{self.url}/models/unload", json={"model": self.path}, timeout=300).raise_for_status()
        return time.perf_counter() - start

    def stop(self) -> float:
        start = time.perf_counter()
        self.proc.terminate()
        self.proc.wait(timeout=300)
        return time.perf_counter() - start


def folder_bytes(folder: str) -> int:
    return sum(f.stat().st_size for f in Path(folder).rglob("*.prompt"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=4000)
    ap.add_argument("--tokens", type=int, default=16)
    args = ap.parse_args()
    path = synthetic_path("qwen35-4b")
    chars = args.prompt_tokens  # the byte-level vocabulary: about a token a character
    rows: dict[str, list[float]] = {}
    notes = []
    for _ in range(args.repeat):
        warm = Server(path, args.threads)
        got = [warm.ask(messages(chars, t), args.tokens) for t in range(3)]
        warm.stop()
        rows.setdefault("cold prefill (turn 1)", []).append(got[0]["ttft_ms"])
        rows.setdefault("turn 2, warm in RAM", []).append(got[1]["ttft_ms"])
        rows.setdefault("turn 3, warm in RAM", []).append(got[2]["ttft_ms"])
        prompt_tokens = got[0]["prompt"]

        folder = tempfile.mkdtemp(prefix="gguf-serve-cache-disk-")
        try:
            first = Server(path, args.threads, "--cache-disk", folder)
            first.ask(messages(chars, 0), args.tokens)
            stop_s = first.stop()
            written = folder_bytes(folder)
            again = Server(path, args.threads, "--cache-disk", folder)
            t2 = again.ask(messages(chars, 1), args.tokens)
            unload_s = again.unload()
            t3 = again.ask(messages(chars, 2), args.tokens)
            again.stop()
            rows.setdefault("turn 2 after a restart (disk)", []).append(t2["ttft_ms"])
            rows.setdefault("turn 3 after an unload (disk)", []).append(t3["ttft_ms"])
            notes.append(f"prompt {prompt_tokens} tokens; turn 2 from disk: {t2['cached']} of {t2['prompt']} cached, "
                         f"turn 3: {t3['cached']} of {t3['prompt']}; {written / 2**20:.0f} MiB written, the stop "
                         f"took {stop_s:.1f} s, the unload {unload_s:.1f} s")
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    print(f"\nQwen3.5-4B shape Q4_K_M (synthetic), thinking; {args.threads} threads; medians of {args.repeat}; "
          f"{os.cpu_count()} CPUs")
    med = {k: statistics.median(v) for k, v in rows.items()}
    for k, v in med.items():
        print(f"{k:34s} {v:10.0f} ms")
    print(f"{'restart / warm (turn 2)':34s} {med['turn 2 after a restart (disk)'] / med['turn 2, warm in RAM']:10.2f}x")
    print(f"{'reload / warm (turn 3)':34s} {med['turn 3 after an unload (disk)'] / med['turn 3, warm in RAM']:10.2f}x")
    cold = med["cold prefill (turn 1)"] / med["turn 2 after a restart (disk)"]
    print(f"{'cold / restart (turn 2)':34s} {cold:10.1f}x")
    for n in notes:
        print(n)


if __name__ == "__main__":
    main()
