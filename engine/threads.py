"""Who runs on the cores, decided once at load.

With the native CPU kernels, their thread pool owns the cores: torch's own pool would
spin next to it on the same cores (stepping a model with both at 2 threads ran 6x
slower). So torch runs its ops on one thread, except in forward passes of more than
`kernels.cpu.GEMV_MAX_ROWS` tokens, whose matmuls are torch BLAS on dequantized
tiles and get torch's threads for their duration. The kernels' pool has the
configured thread count (engine.config: `threads`, else torch's count). Elsewhere torch
runs on the configured threads, or keeps its own."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from .kernels import cpu


@dataclass
class ThreadPolicy:
    native: bool  # the native CPU kernels own the cores
    threads: int  # the kernels' threads (and torch's inside long prefills)

    @classmethod
    def decide(cls, device: torch.device, native_cpu: bool, threads: int | None = None) -> "ThreadPolicy":
        if device.type != "cpu" or not native_cpu:
            if threads:
                torch.set_num_threads(threads)
            return cls(False, torch.get_num_threads())
        policy = cls(True, cpu.threads())
        torch.set_num_threads(1)
        return policy

    def describe(self) -> str:
        if self.native:
            return f"native kernels on {self.threads} thread(s), torch ops on 1 (all {self.threads} in long prefills)"
        return f"torch on {torch.get_num_threads()} thread(s)"

    @contextlib.contextmanager
    def run(self, n_tokens: int):
        if not self.native or n_tokens <= cpu.GEMV_MAX_ROWS or self.threads <= 1:
            if self.native and torch.get_num_threads() != 1:
                torch.set_num_threads(1)  # someone changed it since load
            yield
            return
        torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            torch.set_num_threads(1)
