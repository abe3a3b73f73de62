"""Our Triton kernels compiled for an NVIDIA Hopper GPU (sm_90) on a machine without one:
Triton's front end, its LLVM passes and the ptxas its wheel ships, down to a cubin, which
is what the interpreter the other tests use never does (a construct only the compiler
refuses shows here). Run in a process of its own, without TRITON_INTERPRET:

    python3 tests/triton_compile.py        # prints one line per kernel, exits 1 on a failure

Compiled: get_rows for every type (every type's decoder), the product's smallest decode
tile and a prompt tile, the grouped expert product, and the cache attention over float and
quantized rows."""

from __future__ import annotations

import os
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from gguf_serve.engine.kernels import triton_attention, triton_ops
from gguf_serve.gguf_io import TYPE_INFO, GGMLType

TARGET = GPUTarget("cuda", 90, 32)

MUL_MAT = dict(x="*bf16", w="*u8", y="*bf16", tables="*fp32", M="i32", N="i32", row_bytes="i32", stride_x="i32",
               stride_y="i32", BLOCKS="i32")
MUL_MAT_ID = dict(x="*bf16", w="*u8", y="*bf16", tables="*fp32", tiles="*i32", order="*i64", N="i32",
                  expert_bytes="i64", row_bytes="i32", slots="i32", stride_x="i32", stride_y="i32", BLOCKS="i32")
ROWS = dict(w="*u8", ids="*i64", y="*bf16", tables="*fp32", cols="i32", row_bytes="i32")
ATTEND = dict(q="*bf16", k="*bf16", v="*bf16", tables="*fp32", part_m="*fp32", part_l="*fp32", part_o="*fp32",
              slots="*i64", positions="*i64", ends="*i64", stride_qt="i32", stride_qh="i32", stride_ks="i64",
              stride_kh="i64", stride_kc="i32", stride_vs="i64", stride_vh="i64", stride_vc="i32", n_cells="i32",
              window="i32", chunk="i32", scale="fp32", softcap="fp32", split_cells="i32", n_splits="i32")


def compile_one(fn, signature: dict, constants: dict) -> None:
    sig = {**signature, **{name: "constexpr" for name in constants}}
    src = ASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index(k),): v for k, v in constants.items()})
    kernel = triton.compile(src, target=TARGET)
    if "cubin" not in kernel.asm:
        raise RuntimeError("no cubin")


def kernels():
    """(name, jit function, signature, constants) of each compilation."""
    for t in triton_ops.TYPES:
        info = TYPE_INFO[t]
        yield f"get_rows {t.name}", triton_ops._rows, ROWS, dict(TYPE=int(t), QK=info.block_size, TS=info.type_size)
    for t, bm, bn in ((GGMLType.Q4_K, 16, 16), (GGMLType.Q4_K, 64, 64), (GGMLType.Q6_K, 16, 32),
                      (GGMLType.IQ4_XS, 16, 16)):
        info = TYPE_INFO[t]
        yield f"mul_mat {t.name} {bm}x{bn}", triton_ops._mul_mat, MUL_MAT, dict(
            TYPE=int(t), QK=info.block_size, TS=info.type_size, BLOCK_M=bm, BLOCK_N=bn, EXACT=False)
    info = TYPE_INFO[GGMLType.Q4_K]
    yield "mul_mat_id Q4_K", triton_ops._mul_mat_id, MUL_MAT_ID, dict(
        TYPE=int(GGMLType.Q4_K), QK=info.block_size, TS=info.type_size, BLOCK_M=16, BLOCK_N=32, EXACT=False)
    for d, rows, kt, ts in ((128, "*bf16", 0, 0), (256, "*fp16", 0, 0), (128, "*u8", int(GGMLType.Q8_0), 34),
                            (64, "*u8", int(GGMLType.IQ4_NL), 18)):
        yield f"attention head {d} rows {rows[1:]} type {kt}", triton_attention._attend, {**ATTEND, "k": rows, "v": rows}, \
            dict(GROUP=4, GP=16, D=d, DP=d, BLOCK_N=32 if d <= 128 else 16, KTYPE=kt, KTS=ts, VTYPE=kt, VTS=ts,
                 EXACT=False)


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("run without TRITON_INTERPRET: the interpreter's functions do not compile")
    failed = 0
    for name, fn, signature, constants in kernels():
        try:
            compile_one(fn, signature, constants)
            print(f"ok {name}", flush=True)
        except Exception as e:  # every kernel is tried; the first line of each failure is printed
            failed += 1
            print(f"FAILED {name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
