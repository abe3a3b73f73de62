"""Kernels for packed GGUF weights, chosen once per (device, type).

Every implementation offers the interface of ggml's hub kernel
`ggml-org/ggml-quantization`: `mul_mat_vec`, `dequantize`, `get_rows` (and, for MoE,
`mul_mat_id`). `reference` is the portable torch implementation that runs on any
device and is the ground truth for the fast ones.

Selection order: the environment override `GGUF_SERVE_KERNELS` (`reference`, `hub`,
or the name of a registered implementation), then a registered native kernel for
the device and type, then on MPS the hub kernel when it loads, then the reference.
One log line says which was chosen and why.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable

import torch

from ...gguf_io import GGMLType
from . import reference

log = logging.getLogger("gguf_serve.kernels")

ENV_OVERRIDE = "GGUF_SERVE_KERNELS"


@dataclass(frozen=True)
class KernelOps:
    name: str
    mul_mat: Callable  # (weight, x, ggml_type, out_features) -> y
    get_rows: Callable  # (weight, indices, ggml_type, cols, dtype) -> rows
    dequantize: Callable  # (weight, ggml_type, rows, cols, dtype) -> matrix
    mul_mat_id: Callable = reference.mul_mat_id  # (weight, x, ids, ggml_type, out_features) -> y


REFERENCE = KernelOps("reference", reference.mul_mat_vec, reference.get_rows, reference.dequantize,
                      reference.mul_mat_id)

# name -> (supports(device_type, ggml_type) -> bool, KernelOps); filled by native back-ends
_REGISTRY: dict[str, tuple[Callable[[str, GGMLType], bool], KernelOps]] = {}
_CHOSEN: dict[tuple[str, GGMLType], KernelOps] = {}
_HUB: list = []  # [KernelOps | None] once tried


def hub_ops() -> KernelOps | None:
    """The hub kernel's ops, loaded once (None when it cannot be had)."""
    if not _HUB:
        from . import hub_kernel

        mod = hub_kernel.load()
        _HUB.append(hub_kernel.ops_from_module(mod, f"hub:{hub_kernel.HUB_REPO}") if mod is not None else None)
    return _HUB[0]


def reset() -> None:
    """Forget every choice (tests change the environment between loads)."""
    _CHOSEN.clear()
    _HUB.clear()


def register(name: str, supports: Callable[[str, GGMLType], bool], ops: KernelOps) -> None:
    """Make a kernel implementation available to `select`."""
    _REGISTRY[name] = (supports, ops)
    _CHOSEN.clear()


def _register_native_cpu() -> None:
    from . import cpu

    if cpu.load() is None:
        return
    ops = KernelOps(f"cpu-native ({cpu.best_isa()})", cpu.mul_mat, cpu.get_rows, cpu.dequantize, cpu.mul_mat_id)
    register("cpu", lambda dev, t: dev == "cpu" and cpu.supports(t), ops)


_register_native_cpu()


def native_cpu_in_use() -> bool:
    """Whether CPU weights get the native kernels (built, and not overridden by
    GGUF_SERVE_KERNELS); the engine then also routes small CPU ops to them."""
    forced = os.environ.get(ENV_OVERRIDE)
    return "cpu" in _REGISTRY and (not forced or forced == "cpu")


def select(device: torch.device | str, ggml_type: GGMLType) -> KernelOps:
    """The kernels for weights of `ggml_type` on `device` (decided once per pair)."""
    dev = torch.device(device).type
    key = (dev, GGMLType(ggml_type))
    if key in _CHOSEN:
        return _CHOSEN[key]
    forced = os.environ.get(ENV_OVERRIDE)
    if forced:
        if forced == "reference":
            ops, why = REFERENCE, f"forced by {ENV_OVERRIDE}"
        elif forced == "hub":
            ops = hub_ops()
            if ops is None:
                raise RuntimeError(f"{ENV_OVERRIDE}=hub, but the hub kernel could not be loaded (see the log)")
            why = f"forced by {ENV_OVERRIDE}"
        elif forced in _REGISTRY:
            ops, why = _REGISTRY[forced][1], f"forced by {ENV_OVERRIDE}"
        else:
            raise ValueError(f"{ENV_OVERRIDE}={forced!r}: no such kernel implementation; "
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
    from .ops import TORCH_OPS

    if torch.device(device).type == "cpu" and native_cpu_in_use():
        from .cpu_ops import CPU_OPS

        log.info("dense ops for cpu: %s", CPU_OPS.name)
        return CPU_OPS
    return TORCH_OPS
