"""Kernels for packed GGUF weights, chosen once per (device, type).

Every implementation offers the interface of ggml's hub kernel
`ggml-org/ggml-quantization`: `mul_mat_vec`, `dequantize`, `get_rows` (and, for MoE,
`mul_mat_id`). `reference` is the portable torch implementation that runs on any
device and is the ground truth for the fast ones.

Selection order: the implementation the engine's configuration forces (`kernels`:
`reference`, `hub`, or a registered one such as `cpu`; GGUF_SERVE_KERNELS), then a
registered native kernel for the device and type, then on MPS the hub kernel when it
loads, then the reference. One log line says which was chosen and why. `configure`
applies the settings, given as plain values (load_model passes its EngineConfig's): the
kernels know nothing of the engine's configuration object.
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

from ...gguf_io import GGMLType
from ..options import ENV
from . import cpu, hub_kernel
from .cpu_ops import cpu_ops
from .interface import REFERENCE, KernelOps
from .ops import TORCH_OPS

log = logging.getLogger("gguf_serve.kernels")

ENV_OVERRIDE = ENV["kernels"]  # the environment's name for the `kernels` setting

# name -> (supports(device_type, ggml_type) -> bool, KernelOps); filled by native back-ends
_REGISTRY: dict[str, tuple[Callable[[str, GGMLType], bool], KernelOps]] = {}
_CHOSEN: dict[tuple[str, GGMLType], KernelOps] = {}
_HUB: list = []  # [KernelOps | None] once tried
_FORCED: list[str | None] = [None]  # the configured `kernels` setting
_NATIVE_TRIED: list[bool] = []  # whether the native CPU library was looked for


def configure(kernels: str | None = None, threads: int | None = None, isa: str | None = None, repack: bool = True,
              prefill_dtype: str | None = None) -> None:
    """Apply the kernel settings (EngineConfig's kernels, threads, cpu_isa, cpu_repack,
    prefill_dtype): the forced implementation (None: the best per device and type; choices
    made under another one are forgotten) and the native CPU kernels' settings (cpu.configure)."""
    if kernels != _FORCED[0]:
        _FORCED[0] = kernels
        _CHOSEN.clear()
    _register_native_cpu()
    if "cpu" in _REGISTRY:
        cpu.configure(threads, isa, repack, prefill_dtype)


def hub_ops() -> KernelOps | None:
    """The hub kernel's ops, loaded once (None when it cannot be had)."""
    if not _HUB:
        mod = hub_kernel.load()
        _HUB.append(hub_kernel.ops_from_module(mod, f"hub:{hub_kernel.HUB_REPO}") if mod is not None else None)
    return _HUB[0]


def reset() -> None:
    """Forget every choice and the forced implementation (until the next configure)."""
    _CHOSEN.clear()
    _HUB.clear()
    _FORCED[0] = None


def register(name: str, supports: Callable[[str, GGMLType], bool], ops: KernelOps) -> None:
    """Make a kernel implementation available to `select`."""
    _REGISTRY[name] = (supports, ops)
    _CHOSEN.clear()


def _register_native_cpu() -> None:
    """Register the native CPU kernels once, where the library was built."""
    if _NATIVE_TRIED:
        return
    _NATIVE_TRIED.append(True)
    if cpu.load() is None:
        return
    ops = KernelOps(f"cpu-native ({cpu.best_isa()})", cpu.mul_mat, cpu.get_rows, cpu.dequantize, cpu.mul_mat_id,
                    native_cpu=True)
    register("cpu", lambda dev, t: dev == "cpu" and cpu.supports(t), ops)


def native_cpu_in_use() -> bool:
    """Whether CPU weights get the native kernels (built, and not overridden by the
    configured `kernels`); the engine then also routes small CPU ops to them."""
    _register_native_cpu()
    forced = _FORCED[0]
    return "cpu" in _REGISTRY and (not forced or forced == "cpu")


def select(device: torch.device | str, ggml_type: GGMLType) -> KernelOps:
    """The kernels for weights of `ggml_type` on `device` (decided once per pair)."""
    dev = torch.device(device).type
    key = (dev, GGMLType(ggml_type))
    if key in _CHOSEN:
        return _CHOSEN[key]
    _register_native_cpu()
    forced = _FORCED[0]
    if forced:
        if forced == "reference":
            ops, why = REFERENCE, "forced by the kernels setting"
        elif forced == "hub":
            ops = hub_ops()
            if ops is None:
                raise RuntimeError("kernels=hub, but the hub kernel could not be loaded (see the log)")
            why = "forced by the kernels setting"
        elif forced in _REGISTRY:
            ops, why = _REGISTRY[forced][1], "forced by the kernels setting"
        else:
            raise ValueError(f"kernels={forced!r} ({ENV_OVERRIDE}): no such kernel implementation here; "
                             f"known: reference, hub{''.join(', ' + n for n in sorted(_REGISTRY))}")
    else:
        ops, why = REFERENCE, "no native kernel for this device and type"
        for name, (supports, candidate) in _REGISTRY.items():
            if supports(dev, key[1]):
                ops, why = candidate, "native kernel available"
                break
        else:
            if dev == "mps":
                hub = hub_ops()
                if hub is not None:
                    ops, why = hub, "ggml Metal kernels from the hub"
                else:
                    why = "hub kernel unavailable on mps"
    log.info("kernels for %s %s: %s (%s)", dev, key[1].name, ops.name, why)
    _CHOSEN[key] = ops
    return ops


def ops_for(device: torch.device | str):
    """The dense ops (kernels.ops) for a device: the native CPU ones where the native
    kernels are in use, else the torch implementation."""
    if torch.device(device).type == "cpu" and native_cpu_in_use():
        ops = cpu_ops()
        log.info("dense ops for cpu: %s", ops.name)
        return ops
    return TORCH_OPS
