"""GGUF file → the engine's model: weights stay packed in the memory map (its pages
faulted in at load, so that the first request does not pay for them), the
architecture's family builds its forward over them, and the KV cache is allocated
once, sized from the context and the number of sequence slots (by default from the
memory available; one log line says what was chosen). Nothing is dequantized here."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ..gguf_io import GGUFReader, Keys
from . import kernels
from .batch import Batch
from .cache import KVCache, bytes_per_token, checkpoint_bytes, fixed_bytes
from .chat import FALLBACK_TEMPLATES, chat_template_for, fallback_name
from .chat_format import ChatFormat
from .config import MAX_BATCH, EngineConfig  # noqa: F401 (MAX_BATCH: callers know it here)
from .fetch import download, parse
from .generate import generate
from .graphs import StepGraphs
from .kv_rows import kv_types
from .lora import Adapter, attach, detach, read_adapter
from .models import Architecture, Model, TextParams, architecture_for
from .modules import Weights
from .sampling import file_sampling
from .threads import ThreadPolicy
from .tokenizer import load_tokenizer
from .vision import load_vision, vision_products, whole_media_tokens
from .errors import DraftMismatch

log = logging.getLogger("gguf_serve.engine")

KV_MEMORY_SHARE = 0.25  # default KV cache: at most this share of the memory available at load
DEFAULT_PARALLEL = 8  # sequence slots by default (running sequences and the prefix cache)...
MIN_DEFAULT_CTX = 8192  # ...fewer where each would hold less context than this
CHECKPOINT_MEMORY_SHARE = 0.1  # state checkpoints by default: at most this share of the memory available...
CHECKPOINT_MAX_DEFAULT = 8 << 30  # ...and at most this (llama-server's --cache-ram default)


def pick_device(device: str | torch.device = "auto") -> torch.device:
    if str(device) != "auto":
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


# the KV cache's rows by default where they are not the compute dtype's: float16 beside
# float32 compute on CPU (llama.cpp's default: half the memory and the bytes each decode
# step reads at depth; the native attention converts as it reads)
DEFAULT_CACHE_TYPE = {torch.float32: "f16"}


def default_dtype(device: torch.device) -> torch.dtype:
    return {"cuda": torch.bfloat16, "mps": torch.float16}.get(device.type, torch.float32)


@dataclass
class LoadedModel:
    """What `load_model` returns: the model and its KV cache, tokenizer, chat template (and
    the chat format read from it and the vocabulary, `chat_format`),
    the hyperparameters read from the file (`params`, the architecture's Params), and the reader (whose vocabulary lists,
    VOCABULARY_KEYS, are dropped once the tokenizer holds them)."""

    model: Model
    cache: KVCache
    tokenizer: Any
    chat_template: str | None
    params: TextParams
    gguf: GGUFReader
    architecture: Architecture
    device: torch.device
    dtype: torch.dtype
    threads: ThreadPolicy  # who runs on the cores; applies the model's kernel settings to its forward passes
    config: EngineConfig  # the settings it was loaded with
    draft: "LoadedModel | None" = None  # the draft model speculative decoding runs beside it (--draft-model)
    vision: Any = None  # engine.vision.VisionModel: the vision file images go through (--mmproj)
    chat_format: ChatFormat = ChatFormat()  # its template's and vocabulary's chat format, read once at load
    sampling: dict = field(default_factory=dict)  # the sampling the file recommends (SamplingParams fields)
    linears: dict = field(default_factory=dict, repr=False)  # its matrices by tensor name (what adapters attach to)
    adapters: dict[int, Adapter] = field(default_factory=dict)  # LoRA adapters loaded for it, by id
    graphs: StepGraphs | None = None  # its decode steps' CUDA graphs (engine.graphs; None: every step eager)

    def load_adapter(self, path: str, adapter_id: int | None = None) -> Adapter:
        """A LoRA adapter file read, checked against this model and attached (engine.lora);
        requests name it by its id (Batch.lora): `adapter_id`, or the next after the
        highest one loaded (an id is never reused while a cache may hold its rows)."""
        if adapter_id is None:
            adapter_id = max(self.adapters, default=-1) + 1
        if adapter_id in self.adapters:
            raise ValueError(f"LoRA adapter id {adapter_id} is taken")
        adapter = read_adapter(path, self.gguf, adapter_id, self.device)
        attach(self.linears, adapter, self.kernels.cpu if self.device.type == "cpu" else None)
        self.adapters[adapter.id] = adapter
        log.info("LoRA adapter %d: %s (%d matrices, alpha %g, %.1f MB)", adapter.id, path, len(adapter.names),
                 adapter.alpha, adapter.nbytes / 1e6)
        return adapter

    def unload_adapter(self, adapter_id: int) -> None:
        detach(self.linears, adapter_id)
        self.adapters.pop(adapter_id, None)

    @property
    def kernels(self) -> kernels.KernelSettings:
        """The model's own kernel settings (threads, code path, repacking, row limit,
        prefill dtype, the implementation forced), built from `config` at load."""
        return self.threads.kernels

    @property
    def n_ctx(self) -> int:
        """Tokens a sequence can hold (prompt and completion)."""
        return self.cache.n_ctx

    @property
    def pooling(self) -> str | None:
        """"mean", "cls", "last" (an embedding file), "rank" (a reranker), None (generative)."""
        return self.model.pool.pooling if self.model.pool is not None else None

    def forward(self, batch: Batch) -> torch.Tensor:
        """The batch forward: tokens of several sequences (slots of `cache`) at their
        positions → float32 logits for the batch's rows."""
        with torch.inference_mode(), self.threads.run(batch.n_tokens):
            logits = self.graphs.forward(batch) if self.graphs is not None else None
            if logits is None:
                logits = self.model.forward(batch, self.cache)
        if batch.n_tokens > TRIM_AFTER_TOKENS and self.device.type == "cpu":
            trim_heap()  # a long prompt's activations and dequantized tiles: ~40 MB on Gemma at 512 tokens
        return logits

    def generate(self, *args, **kwargs):
        return generate(self, *args, **kwargs)


def resolve_path(path_or_id: str | os.PathLike) -> str:
    """A local .gguf path, or a Hub `<repo>[@<revision>]:<file>.gguf` fetched (with every
    shard of a split model) through huggingface_hub."""
    p = os.fspath(path_or_id)
    if os.path.exists(p):
        return p
    ref = parse(p)
    if ref is not None and ref.filename is not None:
        return download(ref.repo, ref.filename, ref.revision)
    raise FileNotFoundError(f"no such GGUF file: {p} (give a local path or <repo>:<file>.gguf)")


def available_memory() -> int:
    """Bytes of memory available now (MemAvailable on Linux, else half the physical memory)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def cache_size(specs, trained_ctx: int, n_ctx: int | None, n_seq: int | None, types, max_batch: int
               ) -> tuple[int, int, str]:
    """(n_ctx, n_seq, why): what was asked; by default DEFAULT_PARALLEL sequences with the
    trained context, as far as KV_MEMORY_SHARE of the available memory holds them, fewer
    sequences where each would get less than MIN_DEFAULT_CTX tokens."""
    budget = int(available_memory() * KV_MEMORY_SHARE)
    per_token = bytes_per_token(specs, types)

    def fits(seqs: int) -> int:  # tokens per sequence that `seqs` sequences can hold in the budget
        if not per_token:
            return trained_ctx
        return max(0, (budget // seqs - fixed_bytes(specs, trained_ctx, max_batch, types)) // per_token)

    if n_ctx and n_seq:
        return n_ctx, n_seq, "as asked"
    share = f"{KV_MEMORY_SHARE:.0%} of the {budget / KV_MEMORY_SHARE / 2**30:.1f} GiB available"
    if n_ctx:
        seqs = DEFAULT_PARALLEL
        while seqs > 1 and fits(seqs) < n_ctx:
            seqs //= 2
        return n_ctx, seqs, f"context as asked; {seqs} sequence(s): what {share} holds (raise with n_seq)"
    floor = min(trained_ctx, MIN_DEFAULT_CTX)
    seqs = n_seq or DEFAULT_PARALLEL
    if not n_seq:
        while seqs > 1 and fits(seqs) < floor:
            seqs //= 2
    ctx = fits(seqs)
    if ctx >= trained_ctx:
        return trained_ctx, seqs, f"{seqs} sequence(s) with the trained context"
    ctx = min(max(256, ctx // 256 * 256), trained_ctx)
    return ctx, seqs, (f"{seqs} sequence(s) of what {share} holds (trained: {trained_ctx}; raise with n_ctx, "
                       f"n_seq)")


def checkpoint_budget(cache_ram_mib: int | None, each: int) -> int:
    """Bytes for state checkpoints: as asked (MiB), else CHECKPOINT_MEMORY_SHARE of the
    memory available, at most CHECKPOINT_MAX_DEFAULT; 0 where the model needs none."""
    if not each:
        return 0
    if cache_ram_mib is not None:
        return cache_ram_mib << 20
    return min(int(available_memory() * CHECKPOINT_MEMORY_SHARE), CHECKPOINT_MAX_DEFAULT)


def _glibc_trim():
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


_MALLOC_TRIM = _glibc_trim()
# forwards of more tokens than this hand their freed heap back (glibc keeps freed pages
# in the heap; a long prompt's temporaries would stay resident while decoding)
TRIM_AFTER_TOKENS = 64


def trim_heap() -> None:
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _return_freed_memory() -> None:
    """Hand memory freed during load back to the system."""
    gc.collect()
    trim_heap()


LOAD_STAGES = ("reading the file", "building the model", "tokenizer")
# metadata lists the tokenizer copies: ~33 MB of Python objects for a 262k vocabulary
VOCABULARY_KEYS = (Keys.TOKENIZER_TOKENS, Keys.TOKENIZER_SCORES, Keys.TOKENIZER_TOKEN_TYPE, Keys.TOKENIZER_MERGES)


def load_model(path_or_id: str | os.PathLike, device: str | torch.device | None = None,
               dtype: torch.dtype | None = None, progress=None, *, n_ctx: int | None = None,
               n_seq: int | None = None, max_batch: int | None = None,
               config: EngineConfig | None = None) -> LoadedModel:
    """Load a GGUF model with its weights packed; see LoadedModel. The settings are
    `config` (engine.config.EngineConfig) with the arguments given over it and the
    environment for the rest (EngineConfig.resolve): `n_ctx` (tokens per sequence) and
    `n_seq` (sequence slots) size the KV cache; by default up to DEFAULT_PARALLEL
    sequences with the trained context, less if the memory available would not hold them
    (`cache_size`). `progress`, if given, is called with each of LOAD_STAGES as it starts."""
    cfg = EngineConfig.resolve(config, device=None if device is None else str(device), dtype=dtype, n_ctx=n_ctx,
                               n_seq=n_seq, max_batch=max_batch)
    step = progress or (lambda stage: None)
    path = resolve_path(path_or_id)
    step(LOAD_STAGES[0])
    reader = GGUFReader(path)
    arch = architecture_for(reader)
    reader.populate()  # the weights' pages now, not on the first request (llama.cpp: MAP_POPULATE)
    params = arch.read(reader)
    if cfg.pooling is not None:  # read as an embedding file (llama-server's --pooling)
        params = replace(params, pooling=cfg.pooling)
    dev = pick_device(cfg.device)
    dtype = cfg.dtype or default_dtype(dev)
    step(LOAD_STAGES[1])
    settings = kernels.settings(cfg.kernels, cfg.threads, cfg.cpu_isa, cfg.cpu_repack, cfg.prefill_dtype)
    weights = Weights(reader, dev, dtype, settings)
    with _code_path(settings):  # repacking at load follows the model's code path, as its calls do
        model = arch.build(params, weights, settings.ops_for(dev))
    weights.release_copies()
    specs = model.cache_specs()
    # an encoder's keys and values (both ways: BERT's family, EmbeddingGemma) stay in the compute dtype:
    # llama.cpp computes them without a cache, in float32 (in f16 rows nomic-bert's vectors moved by 1e-3)
    half = None if model.both_ways else DEFAULT_CACHE_TYPE.get(dtype)
    types = kv_types(dtype, cfg.cache_type_k or half, cfg.cache_type_v or half)
    if any(t.quantized for t in types) and dev.type != "cpu" and model.ops.name != "triton":
        raise ValueError(f"cache types {types[0].name}/{types[1].name}: a quantized KV cache runs on CPU, or on "
                         f"CUDA with Triton (device {dev}, {model.ops.name} ops); use f16, bf16 or f32")
    max_batch = cfg.max_batch
    if cfg.mmproj and (whole := whole_media_tokens(resolve_path(cfg.mmproj))) > max_batch:
        log.info("forward passes of up to %d tokens (not %d): an image of the mmproj file goes in one", whole,
                 max_batch)
        max_batch = whole
    ctx, seqs, why = cache_size(specs, params.context_length, cfg.n_ctx, cfg.n_seq, types, max_batch)
    budget = checkpoint_budget(cfg.cache_ram, checkpoint_bytes(specs, ctx, max_batch, types))
    cache = KVCache(specs, seqs, ctx, max_batch, dtype, dev, checkpoint_budget=budget, types=types)
    log.info("%s (%s): %s", cache.describe(), dtype, why)
    step(LOAD_STAGES[2])
    tokenizer = load_tokenizer(reader, cfg.cache_dir)
    template = chat_template_for(reader, arch, cfg.chat_template)
    if cfg.chat_template:
        log.info("%s: chat template %s (given)", path, cfg.chat_template if cfg.chat_template in FALLBACK_TEMPLATES
                 else f"of {len(cfg.chat_template)} characters")
    elif not reader.get(Keys.CHAT_TEMPLATE):
        log.info("%s has no chat template (a base model?); chat requests use the %r fallback", path,
                 fallback_name(reader, arch))
    for key in VOCABULARY_KEYS:
        reader.metadata.pop(key, None)
    _return_freed_memory()  # the tokenizer build's transient Python objects (~35 MB for Gemma's 262k vocabulary)
    threads = ThreadPolicy.decide(dev, settings)
    graphs, graphs_note = StepGraphs.make(model, cache, dev, cfg.cuda_graphs)
    log.info("loaded %s (%s) on %s in %s; %s; kernels: %s%s", path, arch.name, dev, dtype, threads.describe(),
             settings.describe(), f"; {graphs_note}" if graphs_note else "")
    lm = LoadedModel(model, cache, tokenizer, template, params, reader, arch, dev, dtype, threads, cfg,
                     chat_format=ChatFormat.of(template, tokenizer, reader.metadata),
                     sampling=file_sampling(reader.metadata), linears=weights.linears, graphs=graphs)
    if lm.sampling:
        log.info("%s recommends sampling %s (a request's own settings and the command line's come first)", path,
                 ", ".join(f"{k}={v}" for k, v in lm.sampling.items()))
    if cfg.mmproj:
        with _code_path(settings):
            lm.vision = load_vision(resolve_path(cfg.mmproj), reader, params.hidden, dev, dtype, settings,
                                    products=vision_products(cfg.vision_dtype, dev))
        lm.vision.bind(tokenizer)
        lm.vision.threads = threads
    if cfg.draft_model:
        lm.draft = load_draft(lm, cfg.draft_model)
    return lm


def _code_path(settings: kernels.KernelSettings):
    """The model's native code path on this thread for the duration (nothing without them)."""
    return settings.cpu.using_isa() if settings.cpu is not None else contextlib.nullcontext()


def load_draft(lm: LoadedModel, path_or_id: str) -> LoadedModel:
    """A draft model for `lm`: its KV cache as many sequences and tokens as lm's (its slots
    mirror lm's), no checkpoints, drafting nothing itself; refused (DraftMismatch) unless
    its vocabulary is lm's, token for token."""
    cfg = replace(lm.config, n_ctx=lm.cache.n_ctx, n_seq=lm.cache.n_seq, cache_ram=0, spec="off", draft_model=None,
                  mmproj=None, pooling=None)
    draft = load_model(path_or_id, config=cfg)
    ours, theirs = lm.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if lm.model.vocab_size != draft.model.vocab_size or ours != theirs:
        differ = sorted(set(ours.items()) ^ set(theirs.items()), key=lambda kv: kv[1])[:3]
        raise DraftMismatch(f"draft model {path_or_id}: its vocabulary is not the model's ({draft.model.vocab_size} vs "
                            f"{lm.model.vocab_size} tokens; first differences: {differ}); a draft model must share "
                            f"the target's tokenizer")
    log.info("draft model %s: %s", path_or_id, draft.cache.describe())
    return draft
