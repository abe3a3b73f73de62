"""Kernels for packed GGUF weights, chosen once per (settings, device, type).

Every implementation offers the interface of ggml's hub kernel
`ggml-org/ggml-quantization`: `mul_mat_vec`, `dequantize`, `get_rows` (and, for MoE,
`mul_mat_id`). `reference` is the portable torch implementation that runs on any
device and is the ground truth for the fast ones.

A model's kernel settings are one `KernelSettings`, built at load from plain values
(load_model passes its EngineConfig's: the kernels know nothing of the engine's
configuration object) and handed to its packed weights, its dense ops and its thread
policy; two models in one process keep their own. Selection order: the implementation
the settings force (`kernels`: `reference`, `hub`, `cpu`, `triton`; GGUF_SERVE_KERNELS
through EngineConfig), then the native CPU kernels for CPU weights of a type they take,
on CUDA our Triton kernels (kernels.triton_ops) for a type they take (and Triton's
attention, kernels.triton_attention, as the dense ops), on MPS the hub
kernel when it loads, then the reference. One log line per settings object
says which was chosen and why. The process's are only what is the process's: the
loaded library and the CPU's ISA levels (kernels.cpu), the hub kernel once loaded.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from ...gguf_io import GGMLType
from ..options import ENV, KERNEL_CHOICES
from . import cpu, hub_kernel, triton_attention, triton_ops
from .cpu_ops import CpuOps
from .interface import REFERENCE, KernelOps
from .ops import TORCH_OPS

log = logging.getLogger("gguf_serve.kernels")

ENV_OVERRIDE = ENV["kernels"]  # the environment's name for the `kernels` setting

_HUB: list = []  # [KernelOps | None] once tried: the process's (one loaded module)


@dataclass(frozen=True, eq=False)
class KernelSettings:
    """One model's kernel settings: the implementation forced (None: the best per device
    and type), the threads asked for (None: the default) and the native CPU kernels with
    their threads, code path, repacking, row limit and prefill dtype (`cpu`; None where the
    library is not built or another implementation is forced). Choices are cached here."""

    forced: str | None = None
    threads: int | None = None
    cpu: cpu.CpuKernels | None = None
    _chosen: dict = field(default_factory=dict, repr=False)  # (device type, type) -> KernelOps; "ops" -> dense ops

    @property
    def native_cpu(self) -> bool:
        """Whether CPU weights get the native kernels (built, and not overridden by
        `forced`); the engine then also routes small CPU ops to them."""
        return self.cpu is not None

    def select(self, device: torch.device | str, ggml_type: GGMLType) -> KernelOps:
        """The kernels for weights of `ggml_type` on `device` (decided once per pair)."""
        dev = torch.device(device).type
        key = (dev, GGMLType(ggml_type))
        got = self._chosen.get(key)
        if got is None:
            got = self._chosen[key] = self._choose(dev, key[1])
        return got

    def _native(self) -> KernelOps:
        if "native" not in self._chosen:
            self._chosen["native"] = self.cpu.ops(f"cpu-native ({self.cpu.isa})")
        return self._chosen["native"]

    def _choose(self, dev: str, ggml_type: GGMLType) -> KernelOps:
        forced = self.forced
        if forced:
            why = "forced by the kernels setting"
            if forced == "reference":
                ops = REFERENCE
            elif forced == "hub":
                ops = hub_ops()
                if ops is None:
                    raise RuntimeError("kernels=hub, but the hub kernel could not be loaded (see the log)")
            elif forced == "cpu" and self.cpu is not None:
                ops = self._native()
            elif forced == "triton":
                if not triton_ops.AVAILABLE:
                    raise RuntimeError("kernels=triton, but the triton package is not installed (pip install triton)")
                if not triton_ops.usable_on(dev):
                    raise RuntimeError(f"kernels=triton runs on CUDA devices; on {dev} only under Triton's "
                                       "interpreter (TRITON_INTERPRET=1 at start: slow, for tests)")
                ops = triton_ops.TRITON if triton_ops.supports(ggml_type) else REFERENCE
                if ops is REFERENCE:
                    why = "no Triton kernel for this type"
            else:
                raise ValueError(f"kernels={forced!r} ({ENV_OVERRIDE}): no such kernel implementation here; "
                                 f"known: reference, hub{', cpu' if self.cpu is not None else ''}, triton")
        elif dev == "cpu" and self.cpu is not None and cpu.supports(ggml_type):
            ops, why = self._native(), "native kernel available"
        elif dev == "cuda" and triton_ops.usable_on(dev) and triton_ops.supports(ggml_type):
            ops, why = triton_ops.TRITON, "our Triton kernels"
        elif dev == "mps" and (hub := hub_ops()) is not None:
            ops, why = hub, "ggml Metal kernels from the hub"
        else:
            ops, why = REFERENCE, "hub kernel unavailable on mps" if dev == "mps" else \
                "triton is not installed" if dev == "cuda" and not triton_ops.AVAILABLE else \
                "no native kernel for this device and type"
        log.info("kernels for %s %s: %s (%s)", dev, ggml_type.name, ops.name, why)
        return ops

    def describe(self) -> str:
        """The implementations chosen so far and the types each serves ("triton for Q4_K, Q6_K")."""
        by: dict[str, list[str]] = {}
        for key, ops in self._chosen.items():
            if isinstance(key, tuple):
                by.setdefault(ops.name, []).append(key[1].name)
        return "; ".join(f"{name} for {', '.join(sorted(types))}" for name, types in by.items()) or "none yet"

    def ops_for(self, device: torch.device | str):
        """The dense ops (kernels.ops) for a device: on CUDA (unless another implementation is
        forced), or wherever `kernels=triton` is forced and Triton runs, the Triton ones
        (kernels.triton_attention); the native CPU ones with these settings where the native
        kernels are in use; else the torch implementation (a forced `reference`: all of it)."""
        dev = torch.device(device).type
        if triton_ops.usable_on(dev) and (self.forced == "triton" or (dev == "cuda" and self.forced is None)):
            return triton_attention.TRITON_OPS
        if dev != "cpu" or self.cpu is None:
            return TORCH_OPS
        if "ops" not in self._chosen:
            self._chosen["ops"] = CpuOps(self.cpu)
            log.info("dense ops for cpu: %s", self._chosen["ops"].name)
        return self._chosen["ops"]


def settings(kernels: str | None = None, threads: int | None = None, isa: str | None = None, repack: bool = True,
             prefill_dtype: str | None = None) -> KernelSettings:
    """A model's kernel settings from EngineConfig's kernels, threads, cpu_isa, cpu_repack
    and prefill_dtype: the native CPU kernels' where the library is built and `kernels`
    is None or "cpu"."""
    if kernels is not None and kernels not in KERNEL_CHOICES:
        raise ValueError(f"kernels={kernels!r} ({ENV_OVERRIDE}): no such kernel implementation; "
                         f"known: {', '.join(KERNEL_CHOICES)}")
    native = cpu.CpuKernels.make(threads, isa, repack, prefill_dtype) if kernels in (None, "cpu") else None
    return KernelSettings(kernels, threads, native)


def hub_ops() -> KernelOps | None:
    """The hub kernel's ops, loaded once (None when it cannot be had)."""
    if not _HUB:
        mod = hub_kernel.load()
        _HUB.append(hub_kernel.ops_from_module(mod, f"hub:{hub_kernel.HUB_REPO}") if mod is not None else None)
    return _HUB[0]


def reset() -> None:
    """Forget the hub kernel's load (tried again on next use); every other choice is a
    KernelSettings' own."""
    _HUB.clear()
