"""Files as users have them, of the types the native kernels gained for issue 40 (the
i-quants, ternary, 1- and 2-bit, F16, BF16): a tiny llama model whose matrices are
quantized by llama.cpp's own quantizer (ggml_quantize_chunk from llama-cpp-python, with an
importance matrix where the type needs one), loaded by both engines: our logits for a
prompt equal llama.cpp's, and the load names no type as taking the reference path."""

import ctypes
import logging

import numpy as np
import pytest
import torch

from gguf_serve.engine import load_model
from gguf_serve.engine.config import EngineConfig
from gguf_serve.gguf_io import GGMLType, GGUFWriter

from helpers import ggml_lib, no_llama_cpp, write_llama_header
from oracles import llama_cpp_logits, prompt_logits

G = GGMLType
TYPES = [G.IQ2_XXS, G.IQ2_XS, G.IQ2_S, G.IQ3_XXS, G.IQ3_S, G.IQ1_S, G.IQ1_M, G.TQ1_0, G.TQ2_0, G.Q1_0, G.Q2_0, G.IQ4_XS, G.F16,
         G.BF16]
N_VOCAB, D, FF, HEADS, KV = 300, 256, 512, 4, 2



def ggml_quantize(lib, gtype: GGMLType, x: np.ndarray) -> np.ndarray:
    """llama.cpp's quantizer on rows x (rows, cols), an importance matrix of ones"""
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_void_p]
    x = np.ascontiguousarray(x, np.float32)
    out = np.zeros((x.shape[0], gtype.row_nbytes(x.shape[1])), np.uint8)
    imatrix = np.ones(x.shape[1], np.float32)
    lib.ggml_quantize_chunk(int(gtype), x.ctypes.data, out.ctypes.data, 0, x.shape[0], x.shape[1], imatrix.ctypes.data)
    return out


def write_model(path, gtype: GGMLType, lib) -> None:
    rng = np.random.default_rng(int(gtype))
    with GGUFWriter(path) as w:
        write_llama_header(w, f"tiny-llama-{gtype.name}", d=D, ff=FF, heads=HEADS, kv=KV, layers=2, n_vocab=N_VOCAB)

        def mat(name, rows, cols, scale=1.0):
            x = rng.standard_normal((rows, cols)).astype(np.float32) * np.float32(scale / np.sqrt(cols))
            w.add_tensor(name, ggml_quantize(lib, gtype, x), ggml_type=gtype, shape=(rows, cols))

        mat("token_embd.weight", N_VOCAB, D, scale=np.sqrt(D))
        mat("output.weight", N_VOCAB, D, scale=4.0)
        w.add_tensor("output_norm.weight", np.ones(D, np.float32))
        for i in range(2):
            p = f"blk.{i}."
            for name, rows, cols in (("attn_q", D, D), ("attn_k", KV * D // HEADS, D), ("attn_v", KV * D // HEADS, D),
                                     ("attn_output", D, D), ("ffn_gate", FF, D), ("ffn_up", FF, D), ("ffn_down", D, FF)):
                mat(p + name + ".weight", rows, cols)
            w.add_tensor(p + "attn_norm.weight", np.ones(D, np.float32))
            w.add_tensor(p + "ffn_norm.weight", np.ones(D, np.float32))


@pytest.mark.parametrize("gtype", TYPES, ids=lambda t: t.name)
def test_llama_cpp_quantized_files_give_llama_cpp_logits(tmp_path, gtype, caplog):
    lib = ggml_lib()
    if lib is None:
        no_llama_cpp()
    path = str(tmp_path / f"tiny-{gtype.name}.gguf")
    write_model(path, gtype, lib)
    with caplog.at_level(logging.INFO, logger="gguf_serve"):
        lm = load_model(path, device="cpu")
    chosen = [r.getMessage() for r in caplog.records if r.getMessage().startswith("kernels for cpu")]
    assert chosen and not any("reference" in m for m in chosen), chosen
    ids = [1] + torch.randint(3, N_VOCAB, (11,), generator=torch.Generator().manual_seed(3)).tolist()
    ours = prompt_logits(lm, ids)
    exact = prompt_logits(load_model(path, device="cpu", config=EngineConfig.resolve(kernels="reference")), ids)
    ref = llama_cpp_logits(path, ids)
    assert ours.shape == ref.shape
    # Both quantize the activations to 8 bits per block (llama.cpp: Q8_K, Q8_0; F16 and BF16: to
    # their own type), so each is held to the float product of the same weights (the reference
    # kernels: gguf_io's dequantization, float32): ours no farther from it than llama.cpp's.
    scale = float(exact.abs().max())
    ours_err, ref_err = float((ours - exact).abs().max()) / scale, float((ref - exact).abs().max()) / scale
    assert ours_err <= 1.5 * ref_err + 1e-3, (ours_err, ref_err)
    assert float((ours - ref).abs().max()) / scale < 4e-2
