"""The engine's option choices and their environment variables, each written once.

EngineConfig checks its settings against these tuples; the server's settings type
their options with the `Literal` types below (built from the same tuples), and the
command line's choices and help are generated from those; the kernels name the
environment variable in their errors. A leaf module without torch: the command line's
`--help` reads it without loading the engine."""

from __future__ import annotations

from typing import Literal

DEVICE_CHOICES = ("auto", "cpu", "cuda", "mps")  # the server's; the engine also takes any torch device ("cuda:1")
SPEC_MODES = ("off", "ngram", "mtp", "draft")  # the drafters a setting or a request may name
SPEC_CHOICES = ("auto", *SPEC_MODES)  # auto: the best drafter the model has
KERNEL_CHOICES = ("reference", "hub", "cpu", "triton")
PREFILL_DTYPES = ("float32", "bfloat16")
VISION_DTYPES = ("float32", "bfloat16")
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")  # KV cache rows (engine.kv_rows)
POOLING_CHOICES = ("none", "mean", "cls", "last", "rank")  # llama-server's --pooling (none: every token's vector)

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
    "cuda_graphs": "GGUF_SERVE_CUDA_GRAPHS",
    "prefill_dtype": "GGUF_SERVE_PREFILL_DTYPE",
    "cache_ram": "GGUF_SERVE_CACHE_RAM",
    "cache_disk": "GGUF_SERVE_CACHE_DISK",
    "cache_disk_size": "GGUF_SERVE_CACHE_DISK_SIZE",
    "spec": "GGUF_SERVE_SPEC",
    "draft_model": "GGUF_SERVE_DRAFT_MODEL",
    "mmproj": "GGUF_SERVE_MMPROJ",
    "cache_type_k": "GGUF_SERVE_CACHE_TYPE_K",
    "cache_type_v": "GGUF_SERVE_CACHE_TYPE_V",
    "vision_dtype": "GGUF_SERVE_VISION_DTYPE",
    "cache_dir": "GGUF_SERVE_CACHE",
}

# llama.cpp's sampler names (common/sampling.cpp) and what each is off at; "infill" and
# "adaptive_p" are taken and have no sampler here. The chain's order is this one
# (SAMPLER_CHAIN), whatever order a request lists them in.
SAMPLER_CHAIN = ("penalties", "dry", "top_n_sigma", "typ_p", "temperature", "xtc", "top_k", "top_p", "min_p")
SAMPLER_OFF = {"penalties": {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0},
               "dry": {"dry_multiplier": 0.0}, "top_n_sigma": {"top_n_sigma": -1.0}, "top_k": {"top_k": 0},
               "typ_p": {"typical_p": 1.0}, "top_p": {"top_p": 1.0}, "min_p": {"min_p": 0.0},
               "xtc": {"xtc_probability": 0.0}, "temperature": {"temperature": 1.0, "dynatemp_range": 0.0},
               "infill": {}, "adaptive_p": {}}
SAMPLER_LETTERS = dict(zip("edskypmxtia", ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p",
                                           "xtc", "temperature", "infill", "adaptive_p")))
SAMPLER_ALIASES = {**{n: n for n in SAMPLER_OFF}, **{n.replace("_", "-"): n for n in SAMPLER_OFF},
                   **{n.replace("_", ""): n for n in SAMPLER_OFF}, "nucleus": "top_p", "temp": "temperature",
                   "typ": "typ_p", "typical_p": "typ_p", "typical": "typ_p"}


def sampler_names(value: list[str] | str) -> list[str]:
    """llama.cpp's `samplers` as canonical names: a list of names (or its ';'-joined string,
    as the file key general.sampling.sequence holds them), or a string of letters ("kpt")."""
    if isinstance(value, str):
        value = value.split(";") if ";" in value or value in SAMPLER_ALIASES else list(value)
    out = []
    for v in value:
        name = SAMPLER_ALIASES.get(v) or (SAMPLER_LETTERS.get(v) if len(v) == 1 else None)
        if name is None:
            raise ValueError(f"unknown sampler {v!r}; known: {', '.join(SAMPLER_OFF)} (or their letters "
                             f"{''.join(SAMPLER_LETTERS)})")
        out.append(name)
    return out
