"""Decode and prefill speed deep into a context, side by side with llama-bench's `-d`, in
one run: after a prompt of DEPTH tokens, tok/s of the next N decoded tokens, and of
prefilling P more prompt tokens, for the real Gemma 3 270M file and the synthetic Qwen3-4B
Q4_K_M shape (bench/synthetic.py), with the KV cache in f16 (llama.cpp's default) and q8_0
(`-ctk q8_0 -ctv q8_0`; ours --cache-type-k/-v).

    python bench/depth.py [--threads 2] [--repeat 2] [--files gemma,qwen3-4b]
                          [--depths 4096,16384] [--types f16,q8_0] [--prefill 512]
                          [--llama-bench PATH]

Ours runs in a fresh process per (file, cache type) through the scheduler that serves
`generate()` and the HTTP server, with its prefix cache on (as the server has it): per
depth a request with the prompt (random ids, prefilled in chunks as a server does) and N
greedy steps, decode rate = steps over the time from the first to the last; then a
request whose prompt is that prompt plus P new tokens, whose time to its first token is
the prefill of P tokens at that depth (the prefix cache supplies the rest). llama-bench
runs `-p 0 -n N -d DEPTH` and `-p P -n 0 -d DEPTH` (with `-ctk T -ctv T -r 1`) per
repetition; the two take turns and the medians are printed. Our time to prefill the
depth itself is printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from cpu_speed import file_path, find_llama_bench, medians  # noqa: E402

N_DECODE = {"gemma": 64, "qwen3-4b": 16}

CHILD = r"""
import json, sys, threading, time
path, threads, n_decode, cache_type = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
depths = [int(d) for d in sys.argv[5].split(",")]
n_more = int(sys.argv[6])
import torch
torch.set_num_threads(threads)
from gguf_serve.engine import load_model
from gguf_serve.engine.config import EngineConfig
from gguf_serve.engine.sampling import SamplingParams
from gguf_serve.engine.scheduler import Request, Scheduler
lm = load_model(path, device="cpu", n_ctx=max(depths) + n_decode + n_more + 64, n_seq=1,
                config=EngineConfig(threads=threads, cache_type_k=cache_type, cache_type_v=cache_type))
greedy = lambda n: SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, speculative="off")
sched = Scheduler(lm)  # the prefix cache on, as the server has it
def stamps_of(ids, n):  # a request's steps' times, from its start
    stamps = []
    req = Request(list(ids), [greedy(n)], lambda item: stamps.append(time.perf_counter()), threading.Event())
    t0 = time.perf_counter()
    sched.add(req)
    while sched.busy:
        sched.step()
    return t0, stamps[:-1]  # the last call is the end of the request
stamps_of(list(range(1000, 1008)), 4)  # warm-up
out = {}
for depth in depths:
    ids = [1000 + ((i + depth) * 7919) % 20000 for i in range(depth)]  # no prefix shared with another depth's
    t0, stamps = stamps_of(ids, n_decode + 1)
    out[f"prefill{depth}_s"] = stamps[0] - t0
    out[f"decode{depth}"] = n_decode / (stamps[-1] - stamps[0])
    if n_more:
        sched.prefix_hit_tokens = 0
        more = [1000 + (i * 104729) % 20000 for i in range(depth, depth + n_more)]
        t0, stamps = stamps_of(ids + more, 1)
        out[f"more{depth}"] = n_more / (stamps[0] - t0)
        out[f"reused{depth}"] = sched.prefix_hit_tokens
print(json.dumps(out))
"""


def run_ours(path: str, threads: int, n_decode: int, cache_type: str, depths: list[int], n_more: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    p = subprocess.run([sys.executable, "-c", CHILD, path, str(threads), str(n_decode), cache_type,
                        ",".join(map(str, depths)), str(n_more)], capture_output=True, text=True, timeout=7200,
                       env=env)
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": (p.stderr.strip().splitlines() or ["no output"])[-1][:300]}


def run_llama(bench: str, path: str, threads: int, n_decode: int, cache_type: str, depths: list[int],
              n_more: int) -> dict:
    out = {}
    for depth in depths:
        for key, p_n in (("decode", (0, n_decode)), ("more", (n_more, 0))):
            if not p_n[0] and not p_n[1]:
                continue
            cmd = [bench, "-m", path, "-t", str(threads), "-p", str(p_n[0]), "-n", str(p_n[1]), "-d", str(depth),
                   "-ctk", cache_type, "-ctv", cache_type, "-r", "1", "-o", "json"]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=7200)
            try:
                rows = json.loads(p.stdout)
                field = "n_gen" if key == "decode" else "n_prompt"
                out[f"{key}{depth}"] = next(r["avg_ts"] for r in rows if r.get(field))
            except (json.JSONDecodeError, StopIteration):
                return {"error": (p.stderr.strip().splitlines() or ["no output"])[-1][:300]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2, help="runs of each engine, taking turns; medians are printed")
    ap.add_argument("--files", default="gemma,qwen3-4b")
    ap.add_argument("--depths", default="4096,16384")
    ap.add_argument("--types", default="f16,q8_0", help="KV cache types, each for keys and values")
    ap.add_argument("--prefill", type=int, default=512, help="prompt tokens prefilled after each depth (0: none)")
    ap.add_argument("--llama-bench", help="path of llama.cpp's llama-bench (else $LLAMA_BENCH or PATH)")
    args = ap.parse_args()
    bench = find_llama_bench(args.llama_bench)
    if bench is None:
        print("llama-bench not found (see bench/README.md): printing gguf-serve's figures only")
    depths = [int(d) for d in args.depths.split(",")]
    summary = []
    for name in args.files.split(","):
        path, n_decode = file_path(name), N_DECODE.get(name, 16)
        for ty in args.types.split(","):
            ours, ref = [], []
            for _ in range(args.repeat):
                ours.append(run_ours(path, args.threads, n_decode, ty, depths, args.prefill))
                if bench:
                    ref.append(run_llama(bench, path, args.threads, n_decode, ty, depths, args.prefill))
            o, r = medians(ours), medians(ref) if ref else {}
            print(f"\n{name}, KV cache {ty}, {args.threads} threads, {n_decode} tokens decoded after each depth")
            if "error" in o:
                print(f"  gguf-serve failed: {o['error']}")
                continue
            if r and "error" in r:
                print(f"  llama-bench failed: {r['error']}")
                r = {}
            print(f"  {'depth':>8s} {'':14s} {'gguf-serve':>10s} {'llama-bench':>11s}")
            for d in depths:
                for key, what in (("decode", "decode tok/s"), ("more", f"prefill {args.prefill}")):
                    k = f"{key}{d}"
                    if k not in o:
                        continue
                    ratio = f"{o[k] / r[k]:6.2f}x" if k in r else ""
                    ref_s = f"{r[k]:11.2f}" if k in r else f"{'-':>11s}"
                    note = f"  (our prefill of the depth: {o[f'prefill{d}_s']:.1f} s)" if key == "decode" else \
                        f"  ({o.get(f'reused{d}', 0):.0f} tokens from the prefix cache)"
                    print(f"  {d:8d} {what:14s} {o[k]:10.2f} {ref_s} {ratio}{note}")
                    if k in r:
                        summary.append(f"  {name} {ty} depth {d} {what}: {o[k] / r[k]:.2f}x "
                                       f"({o[k]:.1f} vs {r[k]:.1f} tok/s)")
    if summary:
        print("\nsummary (gguf-serve / llama-bench -d, medians):")
        print("\n".join(summary))


if __name__ == "__main__":
    main()
