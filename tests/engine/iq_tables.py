"""engine/kernels/csrc/iq_tables.c, written from gguf_io's codebooks (the format's own
tables): `python tests/engine/iq_tables.py` rewrites it; test_cpu_iquants.py checks that
the file is what this writes."""

import os

import numpy as np

from gguf_serve.gguf_io.quants.grids import grid

PATH = os.path.join(os.path.dirname(__file__), "..", "..", "engine", "kernels", "csrc", "iq_tables.c")
HEAD = """/* The i-quant codebooks (ggml's lattice points, part of the GGUF format) and the sign and
 * bit-spreading tables the kernels read, written by tests/engine/iq_tables.py from
 * gguf_io's copies; do not edit by hand. Each grid entry holds its weights as bytes,
 * the first in the lowest byte. */

#include "iq.h"
"""


def _words(values: np.ndarray, bits: int) -> list[str]:
    width = bits // 4
    return [f"0x{int(v):0{width}x}" for v in values]


def _array(ctype: str, name: str, words: list[str], per_line: int) -> str:
    lines = [", ".join(words[i:i + per_line]) for i in range(0, len(words), per_line)]
    return f"const {ctype} {name}[{len(words)}] = {{\n    " + ",\n    ".join(lines) + ",\n};\n"


def render() -> str:
    parts = [HEAD]
    for name, width in (("iq2xxs", 8), ("iq2xs", 8), ("iq2s", 8), ("iq1s", 8), ("iq3xxs", 4), ("iq3s", 4)):
        g = grid(name).astype(np.int64).astype(np.uint8)  # iq1s: -1 as 0xff
        packed = np.ascontiguousarray(g).view(np.uint64 if width == 8 else np.uint32).reshape(-1)
        ctype = "uint64_t" if width == 8 else "uint32_t"
        parts.append(_array(ctype, f"grid_{name}", _words(packed, 8 * width), 8 if width == 8 else 12))
    # ggml's ksigns: 7 sign bits and their parity as the eighth, each set bit a 0xff byte
    signs = []
    for i in range(128):
        byte = i | ((bin(i).count("1") & 1) << 7)
        signs.append(sum(0xFF << (8 * j) for j in range(8) if byte >> j & 1))
    parts.append(_array("uint64_t", "ksigns_mask", _words(np.array(signs, np.uint64), 64), 8))
    ksigns = [i | ((bin(i).count("1") & 1) << 7) for i in range(128)]
    parts.append(_array("uint8_t", "ksigns_byte", _words(np.array(ksigns, np.uint8), 8), 16))
    spread = [sum(0xFF << (8 * j) for j in range(8) if b >> j & 1) for b in range(256)]
    parts.append(_array("uint64_t", "bits_mask", _words(np.array(spread, np.uint64), 64), 8))
    two = [sum((((b >> (2 * j)) & 3) - 1 & 0xFF) << (8 * j) for j in range(4)) for b in range(256)]
    parts.append(_array("uint32_t", "q2_0_bytes", _words(np.array(two, np.uint32), 32), 12))
    return "\n".join(parts)


if __name__ == "__main__":
    with open(PATH, "w") as f:
        f.write(render())
