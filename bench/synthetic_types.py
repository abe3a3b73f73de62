"""Synthetic files for the speed of each weight type (bench/weight_types.py), written by our own
writer with random blocks of any type whose weights have mean zero and a spread of
1/sqrt(columns), as a trained layer's (random_blocks_of):

- type-NAME: one file per type, a llama shape (16 layers, hidden 2048, ffn 6144, 16 / 8
  heads x 128, a 32,000-token vocabulary), every layer matrix of that type, the embedding
  and the head Q6_K.
- ud-low-bit: an Unsloth-Dynamic-style low-bit mix of Qwen3-30B-A3B's shape cut to 12 of
  its 48 layers: experts' gate and up IQ2_XXS, down IQ3_XXS; attention IQ3_S, its value
  rows Q4_K; the embedding Q2_K, the head Q5_K.
- iq3-m: llama.cpp's stock IQ3_M mix on the Qwen3-4B shape: IQ3_S, with attn_v and
  attn_output Q4_K, ffn_down Q4_K in the first eighth of the layers, the head Q6_K.

    python bench/synthetic_types.py NAME OUT.gguf
"""

from __future__ import annotations

import sys
from functools import lru_cache

import numpy as np

from gguf_serve.gguf_io import GGMLType, GGUFWriter, dequantize
from synthetic import QWEN3_4B, QWEN3_30B_A3B_12L, _header, _moe_keys

G = GGMLType
# byte offsets of a block's float16 factors: d, and a minimum's factor where there is one
F16_AT = {G.Q4_0: (0,), G.Q4_1: (0, 2), G.Q5_0: (0,), G.Q5_1: (0, 2), G.Q8_0: (0,), G.IQ4_NL: (0,), G.Q2_K: (80, 82),
          G.Q3_K: (108,), G.Q4_K: (0, 2), G.Q5_K: (0, 2), G.Q6_K: (208,), G.IQ4_XS: (0,), G.IQ2_XXS: (0,),
          G.IQ2_XS: (0,), G.IQ2_S: (0,), G.IQ3_XXS: (0,), G.IQ3_S: (0,), G.IQ1_S: (0,), G.TQ1_0: (52,),
          G.TQ2_0: (64,), G.Q1_0: (0,), G.Q2_0: (0,), G.IQ1_M: ()}
LLAMA = dict(vocab=32000, hidden=2048, layers=16, heads=16, kv_heads=8, head_dim=128, ffn=6144, ctx=4096,
             rope_base=10000.0)


def _set_factors(blocks: np.ndarray, gtype: GGMLType, d: float, dmin: float) -> None:
    at = F16_AT[gtype]
    for off, v in zip(at, (d, dmin)):
        blocks[:, off:off + 2] = np.frombuffer(np.float16(v).tobytes(), np.uint8)
    if gtype == G.IQ1_M:  # the half factor in the top nibbles of the four scale words
        h = int(np.float16(d).view(np.uint16))
        for k in range(4):
            blocks[:, 49 + 2 * k] = (blocks[:, 49 + 2 * k] & 0x0F) | (((h >> (4 * k)) & 0xF) << 4)


@lru_cache(maxsize=None)
def _factors(gtype: GGMLType) -> tuple[float, float]:
    """(d, dmin) that give unit spread and (about) zero mean on random bits, measured on
    4096 random blocks through gguf_io's dequantizer"""
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, size=(4096, gtype.type_size), dtype=np.uint8)

    def stats(d, dmin):
        _set_factors(raw, gtype, d, dmin)
        w = dequantize(raw, gtype, (4096, gtype.block_size))
        return float(w.mean()), float(w.std())

    ratio = 0.0
    if len(F16_AT[gtype]) == 2:  # a minimum: pick dmin so that the mean is about zero
        mean_d, mean_m = stats(1.0, 0.0)[0], stats(0.0, 1.0)[0]
        ratio = -mean_d / mean_m if mean_m else 0.0
    std = stats(1.0, ratio)[1]
    return 1.0 / std, ratio / std


def random_blocks_of(rng: np.random.Generator, gtype: GGMLType, shape: tuple[int, ...]):
    """A callable producing random packed blocks of `shape` for any type with a block
    factor (and F16, BF16): weights of mean about zero and spread 1/sqrt(columns)."""
    cols, rows = shape[-1], int(np.prod(shape[:-1]))
    target = 1.0 / np.sqrt(cols)

    def make():
        if gtype in (G.F16, G.BF16):
            v = (rng.standard_normal((rows, cols), dtype=np.float32) * target).astype(np.float32)
            if gtype == G.F16:
                return v.astype(np.float16).view(np.uint8).reshape(*shape[:-1], -1)
            return (v.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(*shape[:-1], -1)
        raw = rng.integers(0, 256, size=(rows, gtype.row_nbytes(cols)), dtype=np.uint8)
        d, dmin = _factors(gtype)
        _set_factors(raw.reshape(-1, gtype.type_size), gtype, d * target, dmin * target)
        return raw.reshape(*shape[:-1], -1)
    return make


def _mat(w, rng, name, gtype, shape):
    w.add_tensor(name, random_blocks_of(rng, gtype, shape), ggml_type=gtype, shape=shape)


def _layer_attention(w, rng, p, s, types):
    h, hd = s["hidden"], s["head_dim"]
    _mat(w, rng, p + "attn_q.weight", types["attn_q"], (s["heads"] * hd, h))
    _mat(w, rng, p + "attn_k.weight", types["attn_k"], (s["kv_heads"] * hd, h))
    _mat(w, rng, p + "attn_v.weight", types["attn_v"], (s["kv_heads"] * hd, h))
    _mat(w, rng, p + "attn_output.weight", types["attn_output"], (h, s["heads"] * hd))
    for norm in ("attn_norm", "ffn_norm"):
        w.add_tensor(p + norm + ".weight", np.ones(h, np.float32))


def write_dense(path: str, arch: str, s: dict, types, embd: GGMLType, head: GGMLType, name: str) -> None:
    """`types(layer)`: the type of each of the layer's matrices, by llama.cpp's short name"""
    rng = np.random.default_rng(0)
    h, ff = s["hidden"], s["ffn"]
    with GGUFWriter(path) as w:
        _header(w, arch, name, s)
        _mat(w, rng, "token_embd.weight", embd, (s["vocab"], h))
        w.add_tensor("output_norm.weight", np.ones(h, np.float32))
        _mat(w, rng, "output.weight", head, (s["vocab"], h))
        for i in range(s["layers"]):
            p, t = f"blk.{i}.", types(i)
            _layer_attention(w, rng, p, s, t)
            if arch == "qwen3":
                for norm in ("attn_q_norm", "attn_k_norm"):
                    w.add_tensor(p + norm + ".weight", np.ones(s["head_dim"], np.float32))
            _mat(w, rng, p + "ffn_gate.weight", t["ffn_gate"], (ff, h))
            _mat(w, rng, p + "ffn_up.weight", t["ffn_up"], (ff, h))
            _mat(w, rng, p + "ffn_down.weight", t["ffn_down"], (h, ff))


MATS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def write_type(path: str, gtype: GGMLType) -> None:
    write_dense(path, "llama", LLAMA, lambda i: dict.fromkeys(MATS, gtype), G.Q6_K, G.Q6_K, f"synthetic {gtype.name}")


def write_iq3_m(path: str) -> None:
    s = QWEN3_4B

    def types(i):
        t = dict.fromkeys(MATS, G.IQ3_S)
        t.update(attn_v=G.Q4_K, attn_output=G.Q4_K)
        if i < s["layers"] // 8:
            t["ffn_down"] = G.Q4_K
        return t
    write_dense(path, "qwen3", s, types, G.IQ3_S, G.Q6_K, "synthetic Qwen3-4B IQ3_M")


def write_ud_low_bit(path: str) -> None:
    s, rng = QWEN3_30B_A3B_12L, np.random.default_rng(0)
    arch, h, e, eff = "qwen3moe", s["hidden"], s["experts"], s["expert_ffn"]
    with GGUFWriter(path) as w:
        _header(w, arch, "synthetic Qwen3-30B-A3B UD low-bit, 12 of 48 layers", s)
        _moe_keys(w, arch, s)
        _mat(w, rng, "token_embd.weight", G.Q2_K, (s["vocab"], h))
        w.add_tensor("output_norm.weight", np.ones(h, np.float32))
        _mat(w, rng, "output.weight", G.Q5_K, (s["vocab"], h))
        for i in range(s["layers"]):
            p = f"blk.{i}."
            _layer_attention(w, rng, p, s, dict(attn_q=G.IQ3_S, attn_k=G.IQ3_S, attn_v=G.Q4_K, attn_output=G.IQ3_S))
            for norm in ("attn_q_norm", "attn_k_norm"):
                w.add_tensor(p + norm + ".weight", np.ones(s["head_dim"], np.float32))
            w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((e, h)) * 0.02).astype(np.float32))
            _mat(w, rng, p + "ffn_gate_exps.weight", G.IQ2_XXS, (e, eff, h))
            _mat(w, rng, p + "ffn_up_exps.weight", G.IQ2_XXS, (e, eff, h))
            _mat(w, rng, p + "ffn_down_exps.weight", G.IQ3_XXS, (e, h, eff))


WRITERS = {"ud-low-bit": write_ud_low_bit, "iq3-m": write_iq3_m}
WRITERS.update({f"type-{t.name}": (lambda path, t=t: write_type(path, t)) for t in (*F16_AT, G.F16, G.BF16)})

if __name__ == "__main__":
    WRITERS[sys.argv[1]](sys.argv[2])
