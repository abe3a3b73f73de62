"""The kernel interface every implementation offers (ggml's hub kernel
`ggml-org/ggml-quantization`'s: `mul_mat_vec`, `dequantize`, `get_rows`, and for MoE
`mul_mat_id`), and the portable torch one, `REFERENCE`. A leaf of the kernels package:
the implementations build their KernelOps here and the selection (kernels/__init__)
chooses among them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from . import reference


@dataclass(frozen=True)
class KernelOps:
    name: str
    mul_mat: Callable  # (weight, x, ggml_type, out_features) -> y
    get_rows: Callable  # (weight, indices, ggml_type, cols, dtype) -> rows
    dequantize: Callable  # (weight, ggml_type, rows, cols, dtype) -> matrix
    mul_mat_id: Callable = reference.mul_mat_id  # (weight, x, ids, ggml_type, out_features) -> y
    cpu: Any = None  # the native CPU kernels' (kernels.cpu.CpuKernels, one model's settings): modules bind to them

    @property
    def native_cpu(self) -> bool:
        return self.cpu is not None


REFERENCE = KernelOps("reference", reference.mul_mat_vec, reference.get_rows, reference.dequantize,
                      reference.mul_mat_id)
