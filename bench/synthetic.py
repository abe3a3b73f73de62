"""A synthetic Qwen3-4B-shaped Q4_K_M GGUF file written by our own writer: the real
model's shapes, tensor names and quantization mix, with random blocks (scales set to
small finite values), so that speed at real model sizes is measured without a download.

    python bench/synthetic.py OUT.gguf
"""

from __future__ import annotations

import sys

import numpy as np

from gguf_serve.gguf_io import GGMLType, GGUFValueType as V, GGUFWriter

QWEN3_4B = dict(vocab=151936, hidden=2560, layers=36, heads=32, kv_heads=8, head_dim=128, ffn=9728, ctx=40960)

# byte offsets of the float16 scale fields in each block, per type
SCALE_FIELDS = {GGMLType.Q4_K: (0, 2), GGMLType.Q6_K: (208,), GGMLType.Q8_0: (0,)}


def random_blocks(rng: np.random.Generator, gtype: GGMLType, rows: int, cols: int):
    def make():
        raw = rng.integers(0, 256, size=(rows, gtype.row_nbytes(cols)), dtype=np.uint8)
        blocks = raw.reshape(-1, gtype.type_size)
        scale = np.frombuffer(np.float16(0.0005).tobytes(), np.uint8)
        for off in SCALE_FIELDS[gtype]:
            blocks[:, off:off + 2] = scale
        return raw
    return make


def write(path: str, shapes: dict = QWEN3_4B, seed: int = 0) -> None:
    s = shapes
    rng = np.random.default_rng(seed)
    arch = "qwen3"
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = [f"t{i}" for i in range(s["vocab"] - len(specials))] + specials
    with GGUFWriter(path) as w:
        w.add("general.architecture", arch)
        w.add("general.name", "synthetic Qwen3-4B")
        w.add("general.file_type", 15)  # MOSTLY_Q4_K_M
        for key, value in {"context_length": s["ctx"], "embedding_length": s["hidden"], "block_count": s["layers"],
                           "feed_forward_length": s["ffn"], "attention.head_count": s["heads"],
                           "attention.head_count_kv": s["kv_heads"], "attention.key_length": s["head_dim"],
                           "attention.value_length": s["head_dim"]}.items():
            w.add(f"{arch}.{key}", value)
        w.add(f"{arch}.rope.freq_base", 1000000.0)
        w.add(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
        w.add("tokenizer.ggml.model", "gpt2")
        w.add("tokenizer.ggml.pre", "qwen2")
        w.add("tokenizer.ggml.tokens", tokens, (V.ARRAY, V.STRING))
        w.add("tokenizer.ggml.token_type", [1] * (len(tokens) - 3) + [3, 3, 3], (V.ARRAY, V.INT32))
        w.add("tokenizer.ggml.merges", [], (V.ARRAY, V.STRING))
        w.add("tokenizer.ggml.eos_token_id", len(tokens) - 1)
        w.add("tokenizer.ggml.bos_token_id", len(tokens) - 3)
        w.add("tokenizer.ggml.add_bos_token", False)
        h, hd, kv, ff = s["hidden"], s["head_dim"], s["kv_heads"], s["ffn"]
        w.add_tensor("token_embd.weight", random_blocks(rng, GGMLType.Q4_K, s["vocab"], h), ggml_type=GGMLType.Q4_K,
                     shape=(s["vocab"], h))
        w.add_tensor("output_norm.weight", np.ones(h, np.float32))
        w.add_tensor("output.weight", random_blocks(rng, GGMLType.Q6_K, s["vocab"], h), ggml_type=GGMLType.Q6_K,
                     shape=(s["vocab"], h))
        for i in range(s["layers"]):
            down = GGMLType.Q6_K if i % 2 == 0 else GGMLType.Q4_K  # Q4_K_M: Q6_K in about half the layers
            mats = {"attn_q": (GGMLType.Q4_K, s["heads"] * hd, h), "attn_k": (GGMLType.Q4_K, kv * hd, h),
                    "attn_v": (GGMLType.Q6_K, kv * hd, h), "attn_output": (GGMLType.Q4_K, h, s["heads"] * hd),
                    "ffn_gate": (GGMLType.Q4_K, ff, h), "ffn_up": (GGMLType.Q4_K, ff, h), "ffn_down": (down, h, ff)}
            for name, (t, rows, cols) in mats.items():
                w.add_tensor(f"blk.{i}.{name}.weight", random_blocks(rng, t, rows, cols), ggml_type=t, shape=(rows, cols))
            for norm, n in (("attn_norm", h), ("ffn_norm", h), ("attn_q_norm", hd), ("attn_k_norm", hd)):
                w.add_tensor(f"blk.{i}.{norm}.weight", np.ones(n, np.float32))


if __name__ == "__main__":
    write(sys.argv[1])
