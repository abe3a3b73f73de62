"""The engine's settings, decided once. `EngineConfig` holds every knob the engine reads:
where it runs and in which dtype, the KV cache's size (context, sequences) and the
batch, the CPU kernels' settings (threads, which implementation, the code path,
repacking, the dtype of long prefills' matmuls), and where derived data is kept.
`load_model` builds the model's kernel settings from it (kernels.settings) before building the model.

Where the settings come from: the server reads its options once (command line over
GGUF_SERVE_* environment over defaults, server.settings) and passes the EngineConfig it
builds from them; the engine then reads nothing else. Only a library caller who passes
no configuration gets the environment read for it (`EngineConfig.resolve`: the arguments
given over GGUF_SERVE_* over the defaults). Nothing in the engine reads the environment
otherwise, or caches a setting at import. The choices and variable names are
engine.options'.

The kernels' settings are each model's own (kernels.KernelSettings, built from these at
load): a model loaded later with other threads, code path, repacking or prefill dtype
leaves the models loaded before it as they were."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # the annotation only: the settings read this module without loading torch
    import torch

from .options import CACHE_TYPES, ENV, KERNEL_CHOICES, POOLING_CHOICES, PREFILL_DTYPES, SPEC_CHOICES, VISION_DTYPES

MAX_BATCH = 512  # tokens per forward pass; longer prompts run in chunks of this size


@dataclass(frozen=True)
class EngineConfig:
    device: str = "auto"  # auto: cuda, else mps, else cpu
    dtype: torch.dtype | None = None  # None: bfloat16 on cuda, float16 on mps, float32 on cpu
    n_ctx: int | None = None  # tokens per sequence; None: the trained context, as far as memory holds it
    n_seq: int | None = None  # sequence slots; None: up to 8, as far as memory holds them
    max_batch: int = MAX_BATCH
    threads: int | None = None  # the CPU kernels' threads; None: torch's thread count when the model loads
    kernels: str | None = None  # force an implementation (reference, hub, cpu); None: the best per device and type
    cpu_isa: str | None = None  # force a CPU code path (scalar, avx2, avx512; scalar, neon); None: the best
    cpu_repack: bool = True  # repack weights at load where this CPU's kernels read another layout faster
    prefill_dtype: str | None = None  # long prefills' BLAS dtype (float32, bfloat16); None: bfloat16 with AMX
    cuda_graphs: bool = True  # on CUDA, decode steps replayed from CUDA graphs captured per step shape (engine.graphs)
    # MiB for state checkpoints (recurrent states, sliding windows) that let a prompt reuse a
    # sequence's history; None: a share of the memory available at load; 0: none
    cache_ram: int | None = None
    # the folder of the prompt cache's disk tier (engine.scheduler.disk; --cache-disk): kept slots
    # evicted or unloaded are written there and read back by a later prompt; None: none
    cache_disk: str | None = None
    cache_disk_size: int | None = None  # MiB the folder may hold; None: 10 GiB or half the free space, less
    spec: str = "auto"  # speculative decoding's drafter (SPEC_CHOICES); auto: the best the model has
    draft_model: str | None = None  # a smaller model of the same vocabulary that drafts (spec "draft")
    mmproj: str | None = None  # the model's vision file (llama.cpp's mmproj GGUF): images in chat messages
    # the KV cache's key and value rows (CACHE_TYPES, llama-server's --cache-type-k/-v); None: f16 beside
    # float32 compute (CPU), else the compute dtype's (loader.DEFAULT_CACHE_TYPE)
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    # the dtype the vision tower's F16/BF16 matrices multiply in on CPU (VISION_DTYPES); None:
    # bfloat16 where the CPU computes it natively (AVX512-BF16, AMX), else float32
    vision_dtype: str | None = None
    # the folder where loads keep what they derive from a file for later loads (a SentencePiece
    # vocabulary's merges); None: ~/.cache/gguf-serve
    cache_dir: str | None = None
    # the chat template: Jinja text, or a built-in's name (engine.chat.FALLBACK_TEMPLATES); None: the file's
    chat_template: str | None = None
    # the pooling of the file's embeddings (POOLING_CHOICES; llama-server's --pooling); None: the file's
    # pooling type, a generative file none
    pooling: str | None = None

    def __post_init__(self) -> None:
        if self.kernels is not None and self.kernels not in KERNEL_CHOICES:
            raise ValueError(f"kernels={self.kernels!r} ({ENV['kernels']}): no such kernel implementation; "
                             f"known: {', '.join(KERNEL_CHOICES)}")
        if self.prefill_dtype is not None and self.prefill_dtype not in PREFILL_DTYPES:
            raise ValueError(f"prefill_dtype={self.prefill_dtype!r} ({ENV['prefill_dtype']}): expected "
                             f"{' or '.join(PREFILL_DTYPES)}")
        if self.vision_dtype is not None and self.vision_dtype not in VISION_DTYPES:
            raise ValueError(f"vision_dtype={self.vision_dtype!r} ({ENV['vision_dtype']}): expected "
                             f"{' or '.join(VISION_DTYPES)}")
        if self.pooling is not None and self.pooling not in POOLING_CHOICES:
            raise ValueError(f"pooling={self.pooling!r}: expected {', '.join(POOLING_CHOICES)}")
        for name in ("n_ctx", "n_seq", "max_batch", "threads"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        if self.spec not in SPEC_CHOICES:
            raise ValueError(f"spec={self.spec!r} ({ENV['spec']}): no such speculative decoding mode; known: "
                             f"{', '.join(SPEC_CHOICES)}")
        for name in ("cache_type_k", "cache_type_v"):
            v = getattr(self, name)
            if v is not None and v not in CACHE_TYPES:
                raise ValueError(f"{name}={v!r} ({ENV[name]}): no such cache type; known: {', '.join(CACHE_TYPES)}")
        for name in ("cache_ram", "cache_disk_size"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ValueError(f"{name} must be >= 0 (MiB), got {v}")

    @classmethod
    def resolve(cls, config: "EngineConfig | None" = None, **given: Any) -> "EngineConfig":
        """The settings a load runs with: the arguments given (those not None) over `config`
        as it is, or, where no configuration is passed (a library caller), over the
        environment (ENV) and the defaults (`from_env`). A configuration passed is taken
        whole: the server's was built from its own options, which read the environment
        once, so the environment never overrides what its command line said."""
        explicit = {k: v for k, v in given.items() if v is not None}
        unknown = set(given) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"unknown engine settings: {', '.join(sorted(unknown))}")
        base = config if config is not None else cls.from_env(skip=explicit)
        return replace(base, **explicit)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, skip=()) -> "EngineConfig":
        """The defaults with the GGUF_SERVE_* variables set in `environ` (the process's when
        None) over them, those of the settings in `skip` left unread."""
        environ = os.environ if environ is None else environ
        values = {name: _parse(name, environ[var]) for name, var in ENV.items()
                  if name not in skip and environ.get(var)}
        return cls(**values)


def _parse(name: str, raw: str) -> Any:
    if name in ("threads", "cache_ram", "cache_disk_size"):
        return int(raw)
    if name in ("cpu_repack", "cuda_graphs"):
        return raw.strip().lower() not in ("0", "false", "no", "off")
    if name in ("cache_type_k", "cache_type_v"):
        return raw.strip().lower()
    return raw.strip()
