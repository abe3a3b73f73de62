"""Speculative decoding through HTTP, side by side with llama.cpp's llama-server: one
stream, greedy, `--tokens` tokens of `/v1/completions` (streamed, ignore_eos) on the real
Gemma 3 270M file, for

- copy: a prompt whose continuation repeats text it holds (a function to copy with one
  name changed: the output is the prompt's code again);
- story: free text, where drafts rarely hold;

and eight concurrent streams (different story prompts), aggregate tok/s. gguf-serve runs
with speculation (its default: n-gram lookup) and with `--spec off`; llama-server without
speculation and with each of its n-gram modes (`--spec-type ngram-simple`, `ngram-map-k`,
`ngram-map-k4v`, `ngram-mod`, `ngram-cache`). Each configuration is a fresh server
process, the configurations take turns, `--repeat` rounds; medians printed with ratios.

    python bench/spec_decode.py [--threads 2] [--repeat 2] [--tokens 256] [--llama-server PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from server_speed import free_port, sse_chunks, wait_ready  # noqa: E402

SLOTS, SLOT_CTX = 8, 4096
MODEL = ["model"]  # the id requests name: the file's path (gguf-serve lists it so; llama-server takes any)
LLAMA_NGRAM_MODES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")

CODE = '''def moving_average(values, window):
    """The mean of each run of `window` consecutive values."""
    if window <= 0:
        raise ValueError("window must be positive")
    out = []
    total = 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            out.append(total / window)
    return out


def running_maximum(values):
    """The largest value seen so far, at each position."""
    best = None
    out = []
    for v in values:
        best = v if best is None or v > best else best
        out.append(best)
    return out
'''
COPY = ("Here is a Python module.\n\n```python\n" + CODE + "```\n\nThe same module, unchanged, for the "
        "review:\n\n```python\n")
STORIES = ["Once upon a time, in a village at the edge of a great forest, there lived",
           "The old lighthouse keeper climbed the stairs one last time and",
           "It was the coldest winter anyone could remember, and the river",
           "When the train finally stopped in the middle of the desert,",
           "My grandmother kept a small wooden box on the kitchen shelf, and",
           "The robot had been switched off for a hundred years when",
           "Nobody in the town knew where the stranger had come from, but",
           "On the first day of the expedition, the map turned out to be"]


def gemma_path() -> str:
    from gguf_serve.server.models.default_model import default_model_path

    return default_model_path()


def stream(url: str, prompt: str, tokens: int, out: list) -> None:
    body = {"model": MODEL[0], "prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    stamps, usage = [], {}
    start = time.perf_counter()
    for chunk in sse_chunks(url, "/v1/completions", body):
        usage = chunk.get("usage") or usage
        if chunk.get("choices") and chunk["choices"][0].get("text"):
            stamps.append(time.perf_counter())
    n = usage.get("completion_tokens", len(stamps))
    details = usage.get("completion_tokens_details") or {}
    out.append({"start": start, "first": stamps[0], "last": stamps[-1], "tokens": n,
                "accepted": details.get("accepted_prediction_tokens") or 0,
                "rejected": details.get("rejected_prediction_tokens") or 0})


def one(url: str, prompt: str, tokens: int) -> dict:
    out: list = []
    stream(url, prompt, tokens, out)
    r = out[0]
    drafted = r["accepted"] + r["rejected"]
    return {"decode": (r["tokens"] - 1) / (r["last"] - r["first"]),
            "acceptance": r["accepted"] / drafted if drafted else 0.0}


def eight(url: str, tokens: int) -> float:
    out: list = []
    threads = [threading.Thread(target=stream, args=(url, p, tokens, out)) for p in STORIES]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(r["tokens"] for r in out) / (max(r["last"] for r in out) - t0)


def measure(cmd: list[str], port: int, tokens: int, concurrent: bool) -> dict:
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(url, proc)
        one(url, "Hello there", 8)  # warm-up
        copy, story = one(url, COPY, tokens), one(url, STORIES[0], tokens)
        r = {"copy": copy["decode"], "copy_acc": copy["acceptance"], "story": story["decode"],
             "story_acc": story["acceptance"]}
        if concurrent:
            r["agg8"] = eight(url, tokens)
        return r
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER") or shutil.which("llama-server"))
    args = ap.parse_args()
    path = gemma_path()
    MODEL[0] = path
    t = str(args.threads)
    ours = [sys.executable, "-m", "gguf_serve.server.cli", path, "--threads", t, "--parallel", str(SLOTS),
            "--ctx-size", str(SLOT_CTX)]
    configs = {"gguf-serve": (ours, True), "gguf-serve --spec off": (ours + ["--spec", "off"], True)}
    if args.llama_server:
        llama = [args.llama_server, "-m", path, "-t", t, "-np", str(SLOTS), "-c", str(SLOTS * SLOT_CTX)]
        configs["llama-server"] = (llama, False)
        for mode in LLAMA_NGRAM_MODES:
            configs[f"llama-server {mode}"] = (llama + ["--spec-type", mode], False)
    runs: dict[str, list[dict]] = {}
    for _ in range(args.repeat):
        for name, (cmd, concurrent) in configs.items():
            port = free_port()
            runs.setdefault(name, []).append(measure(cmd + ["--port", str(port)], port, args.tokens, concurrent))
    med = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in runs.items()}
    print(f"Gemma 3 270M Q4_K_M, {args.threads} threads, one stream, greedy, {args.tokens} tokens; medians of "
          f"{args.repeat}")
    print(f"{'':34s}{'copy tok/s':>12s}{'accepted':>10s}{'story tok/s':>13s}{'accepted':>10s}{'8 streams':>11s}")
    for n, m in med.items():
        agg = f"{m['agg8']:11.1f}" if "agg8" in m else f"{'':11s}"
        print(f"{n:34s}{m['copy']:12.1f}{m['copy_acc']:9.0%} {m['story']:13.1f}{m['story_acc']:9.0%} {agg}")
    ours_on, ours_off = med["gguf-serve"], med["gguf-serve --spec off"]
    print(f"\nspeculation on / off (ours): copy {ours_on['copy'] / ours_off['copy']:.2f}x, story "
          f"{ours_on['story'] / ours_off['story']:.2f}x, 8 streams {ours_on['agg8'] / ours_off['agg8']:.2f}x")
    if args.llama_server:
        base = med["llama-server"]
        best = max(LLAMA_NGRAM_MODES, key=lambda m: med[f"llama-server {m}"]["copy"])
        print(f"ours / llama-server without speculation: copy {ours_on['copy'] / base['copy']:.2f}x, story "
              f"{ours_on['story'] / base['story']:.2f}x")
        print(f"ours / llama-server {best} (its best n-gram mode on copy): copy "
              f"{ours_on['copy'] / med[f'llama-server {best}']['copy']:.2f}x")


if __name__ == "__main__":
    main()
