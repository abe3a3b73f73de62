"""Who runs on the cores, decided once per model at load, and a model's kernel settings
applied to its forward passes.

With the native CPU kernels, their thread pool owns the cores: torch's own pool would
spin next to it on the same cores (stepping a model with both at 2 threads ran 6x
slower). So torch runs its ops on one thread, except in forward passes of more than the
model's row limit (`CpuKernels.gemv_max_rows`) tokens, whose matmuls are torch BLAS on
dequantized tiles and get torch's threads for their duration. The kernels' pool has the
model's thread count (engine.config: `threads`, else torch's count). Inside `run` the
calling thread's native calls take the model's code path (CpuKernels.using_isa): each
model keeps its own ISA, whichever was loaded last. Elsewhere torch runs on the
configured threads, or keeps its own."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from .kernels import KernelSettings


@dataclass
class ThreadPolicy:
    native: bool  # the native CPU kernels own the cores
    threads: int  # the kernels' threads (and torch's inside long prefills)
    kernels: KernelSettings  # the model's kernel settings

    @classmethod
    def decide(cls, device: torch.device, kernels: KernelSettings) -> "ThreadPolicy":
        if device.type != "cpu" or kernels.cpu is None:
            if kernels.threads:
                torch.set_num_threads(kernels.threads)
            return cls(False, torch.get_num_threads(), kernels)
        policy = cls(True, kernels.cpu.threads, kernels)
        torch.set_num_threads(1)
        return policy

    def describe(self) -> str:
        if self.native:
            k = self.kernels.cpu
            amx = " (AMX: prompts of 17 tokens and up in bfloat16; GGUF_SERVE_PREFILL_DTYPE=float32 keeps float32)" \
                if k.amx_types else ""
            return (f"native kernels ({k.isa}{amx}) on {self.threads} thread(s), torch ops on 1 (all {self.threads} "
                    f"in prefills over {k.gemv_max_rows} tokens)")
        return f"torch on {torch.get_num_threads()} thread(s)"

    @contextlib.contextmanager
    def run(self, n_tokens: int):
        """A forward pass of `n_tokens`: torch's threads as above, the model's code path."""
        if not self.native:
            yield
            return
        k = self.kernels.cpu
        previous = k.use_isa()
        try:
            if n_tokens <= k.gemv_max_rows or self.threads <= 1:
                if torch.get_num_threads() != 1:
                    torch.set_num_threads(1)  # someone changed it since load
                yield
                return
            torch.set_num_threads(self.threads)
            try:
                yield
            finally:
                torch.set_num_threads(1)
        finally:
            k.restore_isa(previous)
