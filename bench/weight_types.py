"""Decode and prefill speed per weight type, side by side with llama.cpp's llama-bench in
one run: one synthetic llama-shaped file per type (every layer matrix of that type) and
the two low-bit mixes (bench/synthetic_types.py), through `generate()` as
bench/cpu_speed.py measures it (each run a fresh process; the two engines take turns;
medians), with the same thread count.

    python bench/weight_types.py [--threads 2] [--repeat 2] [--decode 16] [--prompt 32]
                          [--files type-IQ3_S,iq3-m,...] [--llama-bench PATH]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from cpu_speed import find_llama_bench, measure, report  # noqa: E402
from synthetic_types import WRITERS  # noqa: E402

DEFAULT = ["type-" + t for t in ("Q4_K", "Q8_0", "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S",
                                 "IQ1_M", "TQ1_0", "TQ2_0", "Q1_0", "Q2_0", "F16", "BF16")] + ["iq3-m", "ud-low-bit"]


def file_path(name: str) -> str:
    path = os.path.join(tempfile.gettempdir(), f"gguf-serve-synthetic-{name}.gguf")
    if not os.path.exists(path):
        print(f"writing {path} ...", flush=True)
        WRITERS[name](path + ".part")
        os.replace(path + ".part", path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2, help="runs of each engine, taking turns; medians are printed")
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--files", default=",".join(DEFAULT), help=f"comma-separated, of: {', '.join(WRITERS)}")
    ap.add_argument("--llama-bench", help="path of llama.cpp's llama-bench (else $LLAMA_BENCH or PATH)")
    args = ap.parse_args()
    bench = find_llama_bench(args.llama_bench)
    if bench is None:
        print("llama-bench not found (see bench/README.md): printing gguf-serve's figures only")
    rows = []
    for name in args.files.split(","):
        path = file_path(name)
        o, r = measure(path, args.threads, args.decode, [args.prompt], args.repeat, bench)
        rows.append((name, o, r))
        report(name, path, o, r, [args.prompt], args.threads)
    k = f"prefill{args.prompt}"
    print(f"\n| file | decode tok/s ours / llama-bench | prefill {args.prompt} tok/s ours / llama-bench |")
    print("|---|---|---|")
    for name, o, r in rows:
        if "error" in o or not r or "error" in r:
            print(f"| {name} | {o.get('error') or r.get('error', 'no llama-bench')} | |")
            continue
        print(f"| {name} | {o['decode']:.2f} / {r['decode']:.2f} ({o['decode'] / r['decode']:.2f}x) "
              f"| {o[k]:.1f} / {r[k]:.1f} ({o[k] / r[k]:.2f}x) |")


if __name__ == "__main__":
    main()
