"""Resident memory under many distinct conversations (issue 44): the synthetic
Qwen3.5-4B-shaped file (recurrent layers: every prompt keeps state checkpoints), the
prompt cache's disk tier on with a small folder budget, `--clients` clients (4) each
holding conversations of three turns over a system prompt of its own (about
`--prompt-tokens` tokens), for `--seconds` (300). Every conversation is new, so kept
slots are evicted (written to disk), checkpoints fill --cache-ram and are dropped, and
the folder's oldest files go.

It prints what the server logged its model holds, by part (/metrics'
gguf_serve_model_memory_part_bytes), the server's resident memory once loaded and idle,
its peak during the soak and at the end, and whether the peak stayed within the idle
memory plus the parts that fill with traffic (KV cache, checkpoints, copies waiting to be
written).

    python bench/memory_soak.py [--clients 4] [--seconds 300] [--threads 2] [--prompt-tokens 600]
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).parent))
from chat_turns import ANSWERS, PROSE, QUESTIONS, synthetic_path  # noqa: E402
from server_speed import free_port, wait_ready  # noqa: E402

WORDS = PROSE.split()


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def parts(url: str) -> dict[str, float]:
    out = {}
    for fam in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for s in fam.samples:
            if s.name == "gguf_serve_model_memory_part_bytes":
                out[s.labels["part"]] = s.value
            elif s.name in ("gguf_serve_prompt_cache_disk_total", "gguf_serve_state_checkpoints",
                            "gguf_serve_prompt_cache_disk_bytes"):
                out[s.name.removeprefix("gguf_serve_") + (f"_{s.labels['event']}" if "event" in s.labels else "")] \
                    = s.value
    return out


def client(url: str, model: str, seed: int, chars: int, stop: float, counts: dict) -> None:
    rng = random.Random(seed)
    while time.time() < stop:
        start = rng.randrange(len(WORDS))
        text = " ".join(WORDS[(start + i) % len(WORDS)] for i in range(chars // 5))  # a system prompt of its own
        msgs = [{"role": "system", "content": f"Conversation {rng.random()}. Read this.\n\n{text}"}]
        for i, q in enumerate(QUESTIONS):
            if time.time() >= stop:
                return
            msgs.append({"role": "user", "content": q})
            r = httpx.post(f"{url}/v1/chat/completions", json={"model": model, "messages": msgs, "max_tokens": 8,
                                                              "temperature": 0}, timeout=600)
            counts[r.status_code] = counts.get(r.status_code, 0) + 1
            if i < len(ANSWERS):
                msgs.append({"role": "assistant", "content": ANSWERS[i]})
        counts["conversations"] = counts.get("conversations", 0) + 1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=600)
    ap.add_argument("--disk-mib", type=int, default=1024)
    args = ap.parse_args()
    path = synthetic_path("qwen35-4b")
    folder = tempfile.mkdtemp(prefix="gguf-serve-soak-disk-")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "gguf_serve.server.cli", path, "--port", str(port), "--threads", str(args.threads),
           "--parallel", "4", "--ctx-size", "4096", "--cache-disk", folder, "--cache-disk-size", str(args.disk_mib)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(url, proc, timeout=600)
        httpx.post(f"{url}/v1/chat/completions", json={"model": path, "max_tokens": 2, "messages": [
            {"role": "user", "content": "hello"}]}, timeout=600).raise_for_status()
        time.sleep(2)
        idle = rss(proc.pid)
        held = parts(url)
        counts: dict = {}
        stop = time.time() + args.seconds
        threads = [threading.Thread(target=client, args=(url, path, i, args.prompt_tokens, stop, counts))
                   for i in range(args.clients)]
        for t in threads:
            t.start()
        peak = idle
        while any(t.is_alive() for t in threads):
            peak = max(peak, rss(proc.pid))
            time.sleep(0.5)
        end = rss(proc.pid)
        after = parts(url)
    finally:
        proc.terminate()
        proc.wait(timeout=120)
        shutil.rmtree(folder, ignore_errors=True)

    mib = 2**20
    filling = sum(held.get(k, 0) for k in ("kv", "checkpoints", "disk_writes"))
    print(f"\nQwen3.5-4B shape Q4_K_M (synthetic); {args.clients} clients x 3-turn conversations over their own "
          f"~{args.prompt_tokens}-token system prompts, {args.seconds:.0f} s; --parallel 4 --ctx-size 4096 "
          f"--cache-disk-size {args.disk_mib}")
    print("the model holds (logged): " + ", ".join(f"{k} {held[k] / mib:.0f} MiB" for k in
                                                   ("files", "kv", "checkpoints", "adapters", "disk_writes")
                                                   if k in held)
          + f" = {sum(v for k, v in held.items() if k in ('files', 'kv', 'checkpoints', 'adapters', 'draft', 'disk_writes')) / mib:.0f} MiB")
    print(f"requests by status: {counts}; disk tier: " + ", ".join(f"{k} {v:.0f}" for k, v in after.items()
                                                                 if k.startswith("prompt") or k.startswith("state")))
    print(f"resident: idle after load {idle / mib:.0f} MiB, peak {peak / mib:.0f} MiB, end {end / mib:.0f} MiB; "
          f"peak - idle = {(peak - idle) / mib:.0f} MiB against kv + checkpoints + disk_writes = "
          f"{filling / mib:.0f} MiB: {'within' if peak - idle <= filling else 'OVER'}")


if __name__ == "__main__":
    main()
