"""Decode speed deep into a context, side by side with llama-bench's `-d`, in one run:
after a prompt of DEPTH tokens, tok/s of the next N decoded tokens, for the real Gemma 3
270M file and the synthetic Qwen3-4B Q4_K_M shape (bench/synthetic.py), with the KV cache
in f16 (llama.cpp's default) and q8_0 (`-ctk q8_0 -ctv q8_0`; ours --cache-type-k/-v).

    python bench/depth.py [--threads 2] [--repeat 2] [--files gemma,qwen3-4b]
                          [--depths 4096,16384] [--types f16,q8_0] [--llama-bench PATH]

Ours runs through `generate()` in a fresh process per (file, cache type): one sequence
whose context holds the deepest prompt; per depth the prompt (random ids, prefilled in
chunks as a server does) then N greedy steps, decode rate = steps over the time from the
first to the last. llama-bench runs `-p 0 -n N -d DEPTH -ctk T -ctv T -r 1` per
repetition; the two take turns and the medians are printed. The time to prefill the
prompt is printed for both (theirs from the same run: llama-bench reports only the
decode, so prefill is not compared here; bench/cpu_speed.py does that).
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
import json, sys, time
path, threads, n_decode, cache_type = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
depths = [int(d) for d in sys.argv[5].split(",")]
import torch
torch.set_num_threads(threads)
from gguf_serve.engine import load_model
from gguf_serve.engine.config import EngineConfig
from gguf_serve.engine.kernels import cpu
from gguf_serve.engine.sampling import SamplingParams
cpu.set_threads(threads)
lm = load_model(path, device="cpu", n_ctx=max(depths) + n_decode + 64, n_seq=1,
                config=EngineConfig(cache_type_k=cache_type, cache_type_v=cache_type))
greedy = lambda n: SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, speculative="off")
list(lm.generate(list(range(1000, 1008)), greedy(4)))  # warm-up
out = {}
for depth in depths:
    ids = [1000 + (i * 7919) % 20000 for i in range(depth)]
    stamps = []
    t0 = time.perf_counter()
    for step in lm.generate(ids, greedy(n_decode + 1)):
        stamps.append(time.perf_counter())
    out[f"prefill{depth}_s"] = stamps[0] - t0
    out[f"decode{depth}"] = n_decode / (stamps[-1] - stamps[0])
print(json.dumps(out))
"""


def run_ours(path: str, threads: int, n_decode: int, cache_type: str, depths: list[int]) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    p = subprocess.run([sys.executable, "-c", CHILD, path, str(threads), str(n_decode), cache_type,
                        ",".join(map(str, depths))], capture_output=True, text=True, timeout=7200, env=env)
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": (p.stderr.strip().splitlines() or ["no output"])[-1][:300]}


def run_llama(bench: str, path: str, threads: int, n_decode: int, cache_type: str, depths: list[int]) -> dict:
    out = {}
    for depth in depths:
        cmd = [bench, "-m", path, "-t", str(threads), "-p", "0", "-n", str(n_decode), "-d", str(depth),
               "-ctk", cache_type, "-ctv", cache_type, "-r", "1", "-o", "json"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=7200)
        try:
            rows = json.loads(p.stdout)
            out[f"decode{depth}"] = next(r["avg_ts"] for r in rows if r.get("n_gen"))
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
                ours.append(run_ours(path, args.threads, n_decode, ty, depths))
                if bench:
                    ref.append(run_llama(bench, path, args.threads, n_decode, ty, depths))
            o, r = medians(ours), medians(ref) if ref else {}
            print(f"\n{name}, KV cache {ty}, {args.threads} threads, {n_decode} tokens decoded after each depth")
            if "error" in o:
                print(f"  gguf-serve failed: {o['error']}")
                continue
            if r and "error" in r:
                print(f"  llama-bench failed: {r['error']}")
                r = {}
            print(f"  {'depth':>8s} {'gguf-serve':>10s} {'llama-bench':>11s}  (decode tok/s; our prefill of the depth)")
            for d in depths:
                k = f"decode{d}"
                ratio = f"{o[k] / r[k]:6.2f}x" if k in r else ""
                ref_s = f"{r[k]:11.2f}" if k in r else f"{'-':>11s}"
                print(f"  {d:8d} {o[k]:10.2f} {ref_s} {ratio}  ({o[f'prefill{d}_s']:.1f} s)")
                if k in r:
                    summary.append(f"  {name} {ty} depth {d}: {o[k] / r[k]:.2f}x ({o[k]:.1f} vs {r[k]:.1f} tok/s)")
    if summary:
        print("\nsummary (gguf-serve / llama-bench -d, medians):")
        print("\n".join(summary))


if __name__ == "__main__":
    main()
