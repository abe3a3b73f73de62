"""ggml's quantization kernels from the kernel hub (`kernels` library), used on MPS
(the ggml Metal kernels) and wherever it is forced. The hub kernel exports the same
interface as `reference`; rows beyond what its GEMV takes go through its
dequantize in bounded chunks plus a dense matmul."""

from __future__ import annotations

import logging

import torch

from ...gguf_io import GGMLType
from . import reference
from .interface import KernelOps

log = logging.getLogger("gguf_serve.kernels")

HUB_REPO = "ggml-org/ggml-quantization"
HUB_VERSION = 1
HUB_GEMV_ROWS = 8  # rows the hub kernel's own GEMV takes (its mul_mat_vec serves decode); more: dequantize + matmul


def load(repo: str = HUB_REPO):
    """The hub kernel module, or None with the reason logged once."""
    try:
        from kernels import get_kernel  # not a project import: the hub loader, needed only on MPS or when forced

        return get_kernel(repo, version=HUB_VERSION)
    except Exception as e:  # any failure to fetch, resolve or import means "not available"
        log.info("hub kernel %s unavailable: %s", repo, e)
        return None


def ops_from_module(mod, name: str):
    """KernelOps over a module with the ggml-quantization interface."""
    gemv_types = {int(t) for t in getattr(mod, "GEMV_TYPES", ())}

    def mul_mat(weight: torch.Tensor, x: torch.Tensor, ggml_type: GGMLType, out_features: int) -> torch.Tensor:
        cols = x.shape[-1]
        lead = x.shape[:-1]
        x2 = x.reshape(-1, cols)
        if x2.shape[0] <= HUB_GEMV_ROWS and int(ggml_type) in gemv_types:
            return mod.mul_mat_vec(weight, x2, int(ggml_type), out_features).reshape(*lead, out_features)
        out = reference.matmul_by_tiles(weight, x2, out_features, reference.rows_per_chunk(cols),
                                        lambda rows, n: mod.dequantize(rows, int(ggml_type), n, cols, x.dtype))
        return out.reshape(*lead, out_features)

    def get_rows(weight, indices, ggml_type, cols, dtype):
        return mod.get_rows(weight, indices, int(ggml_type), cols, dtype)

    def dequantize(weight, ggml_type, rows, cols, dtype):
        return mod.dequantize(weight, int(ggml_type), rows, cols, dtype)

    return KernelOps(name, mul_mat, get_rows, dequantize)
