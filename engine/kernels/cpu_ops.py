"""The dense ops on CPU with the native library: each op here replaces a chain of
small torch ops (a decode step runs hundreds of them) with one native call, on
float32 contiguous CPU tensors; anything else falls back to the torch op it
overrides (kernels.ops.TorchOps, the reference these are tested against)."""

from __future__ import annotations

import torch

from . import cpu
from .ops import TorchOps


def _native(*ts: torch.Tensor) -> bool:
    return all(t.dtype is torch.float32 and t.device.type == "cpu" for t in ts)


class CpuOps(TorchOps):
    name = "cpu-native"

    def rms_norm(self, x, w, eps):
        if _native(x, w):
            return cpu.rms_norm(x, w, eps, False)
        return super().rms_norm(x, w, eps)


CPU_OPS = CpuOps()
