"""The engine's option choices and their environment variables, each written once.

EngineConfig checks its settings against these tuples; the server's settings type
their options with the `Literal` types below (built from the same tuples), and the
command line's choices and help are generated from those; the kernels name the
environment variable in their errors. A leaf module: it imports only the KV row types."""

from __future__ import annotations

from typing import Literal

from .kv_rows import KV_TYPES

DEVICE_CHOICES = ("auto", "cpu", "cuda", "mps")  # the server's; the engine also takes any torch device ("cuda:1")
SPEC_MODES = ("off", "ngram", "mtp", "draft")  # the drafters a setting or a request may name
SPEC_CHOICES = ("auto", *SPEC_MODES)  # auto: the best drafter the model has
KERNEL_CHOICES = ("reference", "hub", "cpu")
PREFILL_DTYPES = ("float32", "bfloat16")
VISION_DTYPES = ("float32", "bfloat16")
CACHE_TYPES = tuple(KV_TYPES)  # the KV cache row types (engine.kv_rows)
POOLING_CHOICES = ("none", "mean", "cls", "last")  # llama-server's --pooling (none: every token's vector)

# Literal[tuple] is Literal of the tuple's items: the types follow the tuples
DeviceChoice = Literal[DEVICE_CHOICES]  # type: ignore[valid-type]
SpecChoice = Literal[SPEC_CHOICES]  # type: ignore[valid-type]
KernelChoice = Literal[KERNEL_CHOICES]  # type: ignore[valid-type]
PrefillDtype = Literal[PREFILL_DTYPES]  # type: ignore[valid-type]
VisionDtype = Literal[VISION_DTYPES]  # type: ignore[valid-type]
CacheType = Literal[CACHE_TYPES]  # type: ignore[valid-type]
PoolingChoice = Literal[POOLING_CHOICES]  # type: ignore[valid-type]

# the environment variables a library caller (and the tests) may set the engine's settings
# with, read by EngineConfig.resolve only where no configuration is passed; the server's
# options (server.settings) carry the same names and are read there, once
ENV = {
    "device": "GGUF_SERVE_DEVICE",
    "threads": "GGUF_SERVE_THREADS",
    "kernels": "GGUF_SERVE_KERNELS",
    "cpu_isa": "GGUF_SERVE_CPU_ISA",
    "cpu_repack": "GGUF_SERVE_CPU_REPACK",
    "prefill_dtype": "GGUF_SERVE_PREFILL_DTYPE",
    "cache_ram": "GGUF_SERVE_CACHE_RAM",
    "spec": "GGUF_SERVE_SPEC",
    "draft_model": "GGUF_SERVE_DRAFT_MODEL",
    "mmproj": "GGUF_SERVE_MMPROJ",
    "cache_type_k": "GGUF_SERVE_CACHE_TYPE_K",
    "cache_type_v": "GGUF_SERVE_CACHE_TYPE_V",
    "vision_dtype": "GGUF_SERVE_VISION_DTYPE",
    "cache_dir": "GGUF_SERVE_CACHE",
}
