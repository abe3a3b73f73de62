"""The server's configuration, each option defined once here and read once, at startup:
the command line (server.cli builds its options and their help from these fields) over
GGUF_SERVE_<OPTION> environment variables over the defaults. The engine's part becomes
an engine.config.EngineConfig, built explicitly (`engine_config`), for every model it
loads; the engine reads no environment of its own then. The engine's options take their
choices from engine.options' tuples."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import ByteSize, Field, PrivateAttr
from pydantic_settings import BaseSettings, SettingsConfigDict

from .models.presets import read_presets
from ..engine import (MAX_AUDIO_BYTES, MAX_AUDIO_SECONDS, CacheType, DeviceChoice, EngineConfig, KernelChoice,
                      PoolingChoice, PrefillDtype, SpecChoice, VisionDtype)


class ServerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GGUF_SERVE_", extra="ignore", protected_namespaces=())

    models: list[str] = Field(default_factory=list, description=(
        "local .gguf paths or Hub IDs (<repo>:<file>.gguf, <repo>@<rev>:<file>.gguf, <repo>:<QUANT>, <repo>); none: "
        "the Hub cache's models and the embedded Gemma 3 270M, loaded on first request"))
    alias: list[str] = Field(default_factory=list, description=(
        "the id a named model is listed as (repeat for each model, in order); default: a local file's name, a Hub "
        "file's <repo>:<file>"))
    host: str = Field(default="127.0.0.1", description=(
        "address to listen on; several, comma-separated (127.0.0.1,::1)"))
    port: int = Field(default=8000, description="port")
    strict_model_names: bool = Field(default=False, description=(
        "refuse a request naming a model not served (404); default: with one model served, requests naming no "
        "model or another name go to it, as llama-server does (the reply names it)"))
    reasoning: Literal["on", "off", "auto"] = Field(default="auto", description=(
        "thinking for models whose template has the switch: on, off, or the template's default (auto)"))
    reasoning_budget: Optional[int] = Field(default=None, ge=0, description=(
        "thinking tokens a reply may spend before the server closes its reasoning block (default: no limit; a "
        "request's thinking_budget_tokens overrides it)"))
    api_key: Optional[str] = Field(default=None, description=(
        "require 'Authorization: Bearer KEY' (or x-api-key) on every path but /health and the chat page's files; "
        "several keys comma-separated"))
    api_key_file: Optional[str] = Field(default=None, description=(
        "read the API keys from this file, one a line (e.g. a mounted secret)"))
    ssl_keyfile: Optional[str] = Field(default=None, json_schema_extra={"flags": ["--ssl-key-file"]}, description=(
        "serve HTTPS with this PEM private key (with --ssl-certfile)"))
    ssl_certfile: Optional[str] = Field(default=None, json_schema_extra={"flags": ["--ssl-cert-file"]}, description=(
        "serve HTTPS with this PEM certificate (chain)"))
    device: DeviceChoice = Field(default="auto", description="where to run")
    ctx_size: Optional[int] = Field(default=None, ge=1, description=(
        "tokens per sequence, prompt + completion (default: the trained context, as far as a quarter of the memory "
        "available holds it)"))
    parallel: Optional[int] = Field(default=None, ge=1, description=(
        "sequences decoded together in one batch, each with its KV cache slot (default: 8, fewer if the memory "
        "would give each < 8192 tokens)"))
    max_tokens: int = Field(default=4096, ge=1, json_schema_extra={"flags": ["--n-predict", "-n"]}, description=(
        "completion tokens for a request that sets no limit (chat, completions, Responses), within the context "
        "left (also --n-predict)"))
    temp: Optional[float] = Field(default=None, ge=0.0, json_schema_extra={"flags": ["--temperature"]}, description=(
        "temperature for requests that set none (default: 1)"))
    top_k: Optional[int] = Field(default=None, ge=0, description="top-k for requests that set none (default: off)")
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0, description=(
        "top-p for requests that set none (default: 1)"))
    min_p: Optional[float] = Field(default=None, ge=0.0, le=1.0, description=(
        "min-p for requests that set none (default: off)"))
    repeat_penalty: Optional[float] = Field(default=None, gt=0.0, description=(
        "repetition penalty for requests that set none (default: 1, off)"))
    seed: Optional[int] = Field(default=None, ge=0, description=(
        "sampling seed for requests that set none (default: random)"))
    models_preset: Optional[str] = Field(default=None, description=(
        "an INI file of sampling defaults per model, as llama-server's: a [model id] section each, [*] for all, "
        "keys as the options' names (temp = 0.6, top-k = 20); the command line's options come first, then the "
        "model's section, [*], and the file's own recommended sampling (its general.sampling.* keys)"))
    threads: Optional[int] = Field(default=None, ge=1, description="CPU threads for the kernels (default: torch's)")
    kernels: Optional[KernelChoice] = Field(default=None, description=(
        "force a kernel implementation (default: the native CPU kernels on a CPU, our Triton kernels on CUDA, "
        "else the portable reference)"))
    cpu_isa: Optional[str] = Field(default=None, description=(
        "force a CPU code path: scalar, avx2, avx512 (x86-64) or scalar, neon (AArch64); default: the best this CPU "
        "runs"))
    cpu_repack: bool = Field(default=True, description=(
        "repack weights at load into the layout this CPU's kernels read fastest (memory stays the file's size)"))
    cuda_graphs: bool = Field(default=True, description=(
        "on an NVIDIA GPU, replay decode steps from CUDA graphs captured per step shape (--no-cuda-graphs: every "
        "step launched one kernel at a time)"))
    prefill_dtype: Optional[PrefillDtype] = Field(default=None, description=(
        "dtype of long prefills' matmuls (default: bfloat16 where the CPU has AMX, else float32)"))
    cache_ram: Optional[int] = Field(default=None, ge=0, description=(
        "MiB for state checkpoints that let a new turn reuse a hybrid or sliding-window model's history (default: "
        "a tenth of the memory available, at most 8192; 0: none)"))
    cache_disk: Optional[str] = Field(default=None, description=(
        "a folder for a disk tier of the prompt cache: a long conversation's cached state evicted from RAM, or "
        "held when its model unloads or the server stops, is written there and read back when a later prompt "
        "(after a restart too) starts with it; keyed by the model file and adapters, checked on read (default: "
        "none)"))
    cache_disk_size: Optional[int] = Field(default=None, ge=1, description=(
        "MiB the --cache-disk folder may hold, least recently used files deleted first (default: 10 GiB, or half "
        "the disk's free space where less)"))
    cache_type_k: Optional[CacheType] = Field(
        default=None, json_schema_extra={"flags": ["-ctk"]}, description=(
            "the KV cache's key rows: f16 (default on CPU), bf16, f32, or q8_0 / q5_1 / q5_0 / q4_1 / q4_0 / iq4_nl "
            "(CPU only: from half to a quarter of f16's memory and of the bytes a decode step reads at depth)"))
    cache_type_v: Optional[CacheType] = Field(
        default=None, json_schema_extra={"flags": ["-ctv"]}, description="the KV cache's value rows, as --cache-type-k")
    spec: SpecChoice = Field(default="auto", description=(
        "speculative decoding: drafts verified in one batch forward, output unchanged (auto: the draft model if one "
        "is given, else the file's multi-token-prediction head where it has one, else n-gram lookup over the prompt "
        "and output; off: none); a request's `speculative` field overrides it"))
    draft_model: Optional[str] = Field(default=None, description=(
        "a smaller model with the same vocabulary that drafts for speculative decoding (a local .gguf or a Hub ID)"))
    mmproj: Optional[str] = Field(default=None, description=(
        "the vision file (a local mmproj .gguf or <repo>:<file>.gguf) of the first model named; default: the one "
        "beside each model (its directory, or its Hub repository, as llama-server's -hf finds it)"))
    lora: list[str] = Field(default_factory=list, description=(
        "a LoRA adapter (a GGUF file from llama.cpp's convert_lora_to_gguf.py) for the first model named, as "
        "FILE or FILE:SCALE (default scale 1); repeat it or separate by commas; each is also served as the model "
        "<model>+<adapter file name>, and requests choose by its id in `lora` (GET /lora-adapters)"))
    lora_scaled: list[str] = Field(default_factory=list, description="FILE:SCALE adapters (llama-server's; as --lora)")
    lora_init_without_apply: bool = Field(default=False, description=(
        "load the adapters at scale 0: a request applies them by its `lora` field, its model name, or after a "
        "POST /lora-adapters"))
    lora_runtime: bool = Field(default=False, description=(
        "POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's): adapters loaded from files this server "
        "can read, by any client the API key lets in, each served as the model its lora_name names"))
    vision_dtype: Optional[VisionDtype] = Field(default=None, description=(
        "the dtype a vision file's F16/BF16 matrices multiply in on CPU (default: bfloat16 where the CPU computes "
        "it natively, AVX512-BF16 or AMX: several times faster; else float32)"))
    cache: Optional[str] = Field(default=None, description=(
        "the folder where loads keep what they derive from a file for the next load (a SentencePiece vocabulary's "
        "merges; default: ~/.cache/gguf-serve)"))
    no_mmproj: bool = Field(default=False, description="serve text only: load no vision file, even where one is found")
    image_urls: bool = Field(default=False, description=(
        "fetch http(s) image URLs in messages (public addresses only, within --max-image-bytes and "
        "--image-url-timeout); default: data URLs only"))
    image_url_timeout: float = Field(default=10.0, gt=0, description=(
        "seconds an image URL's fetch may take, all of it (redirects, a slow host)"))
    image_urls_allow_private: bool = Field(default=False, description=(
        "let image URLs reach loopback, private and link-local addresses (this machine, its network, cloud "
        "metadata): off, a request cannot make the server fetch from them"))
    image_urls_redirects: bool = Field(default=False, description=(
        "follow an image URL's redirects to other hosts (each checked as the URL is); off: same host only"))
    max_image_bytes: int = Field(default=20 * 1024 * 1024, ge=1, description="largest image accepted, encoded")
    max_images: Optional[int] = Field(default=None, ge=1, description=(
        "images one request may hold, refused before any is decoded (default: the context over 256, a Gemma 3 "
        "image's tokens)"))
    max_audio_bytes: int = Field(default=MAX_AUDIO_BYTES, ge=1, description="largest audio clip accepted, encoded")
    max_audio_seconds: float = Field(default=MAX_AUDIO_SECONDS, gt=0, description=(
        "longest audio clip accepted, in seconds (from its header, before it is decoded)"))
    max_audio: Optional[int] = Field(default=None, ge=1, description=(
        "audio clips one request may hold, refused before any is decoded (default: the context over 750, 30 s of "
        "Gemma 4 audio)"))
    offline: bool = Field(default=False, description="never touch the network (HF_HUB_OFFLINE)")
    max_queue: int = Field(default=16, ge=1, description="requests that may wait per model before 429")
    max_loaded: int = Field(default=2, ge=1, json_schema_extra={"flags": ["--models-max"]}, description=(
        "models loaded at once; to load another, the least recently used idle one is unloaded (also --models-max)"))
    memory_budget: Optional[ByteSize] = Field(default=None, description=(
        "memory the loaded models may hold together (files and KV caches; e.g. 12GiB); to load another, idle "
        "ones are unloaded until it fits (default: the memory available at startup less 1 GiB)"))
    load_wait: float = Field(default=120.0, gt=0, description=(
        "seconds a request waits for its model to load, or for the models in use to free room, before a 503 "
        "with Retry-After"))
    idle_unload: Optional[float] = Field(default=None, ge=0, description=(
        "unload a model after this many seconds without requests (default: never; a request's keep_alive "
        "overrides it for its model)"))
    template_timeout: float = Field(default=10.0, gt=0, description=(
        "seconds a chat template may take to render a request's messages (and to wait for a free worker); past "
        "it the request gets a 500 naming the template, and nothing else waits on it"))
    template_workers: int = Field(default=2, ge=1, description=(
        "processes that render chat templates, shared by every model (each limited to 1 GiB more memory)"))
    max_connections: Optional[int] = Field(default=None, ge=1, description=(
        "connections held at once: past it, the one waiting longest for its request head is closed, or the new "
        "one refused with a 503 (default: what the open-file limit, raised at start, leaves room for, at most "
        "4096); a request head must arrive within 10 s"))
    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1, description="largest request body accepted")
    allowed_hosts: list[str] = Field(default_factory=list, description=(
        "Host names browsers may reach the server by, besides IP addresses, localhost and this machine's name "
        "(repeat; .example.com: a domain and its subdomains; *: any); checked where the server listens on a "
        "loopback address or where this is given: a page of another site that rebinds its name here gets a 403"))
    cors_origins: list[str] = Field(default_factory=list, description=(
        "origins whose pages may call the API from a browser (repeat; *: any): CORS headers for them, and their "
        "POSTs accepted; default: none but the server's own (the chat page)"))
    chat_template: Optional[str] = Field(default=None, description=(
        "the chat template of every model served: a built-in's name (chatml, llama3, llama2, gemma) or Jinja text "
        "(default: each file's own)"))
    chat_template_file: Optional[str] = Field(default=None, description=(
        "read the chat template (Jinja) from this file"))
    pooling: Optional[PoolingChoice] = Field(default=None, description=(
        "serve the models as embedding models pooled this way (mean, cls, last), or as rerankers (rank), as "
        "llama-server's --embedding --pooling (default: each file's own pooling type, a BERT-family file with a "
        "classification head a reranker; a generative file generates)"))
    access_log: bool = Field(default=False, description=(
        "log each request (client, method, path, status), as uvicorn's access log"))
    sse_ping_interval: float = Field(default=5.0, ge=0, description=(
        "seconds a stream may stay silent (a long prompt's prefill, a queue) before it gets a line that clients "
        "skip and proxies see as traffic: an SSE comment, an empty chunk in Ollama's NDJSON (0: never)"))
    slots: bool = Field(default=True, description=(
        "GET /slots: what each sequence slot holds, as llama-server lists it (--no-slots: a 501)"))
    slot_save_path: Optional[str] = Field(default=None, description=(
        "the folder POST /slots/ID?action=save|restore writes slots' states to and reads them from (a restarted "
        "server takes them back); default: none, slot actions are a 501"))
    webui: bool = Field(default=True, description=(
        "serve the chat page at / (public, like /health; the API it calls keeps --api-key); --no-webui: none"))
    metrics_public: bool = Field(default=False, description=(
        "answer GET /metrics without the API key, for scrapers that cannot send one (an inference gateway's "
        "endpoint picker: deploy/README.md); it names models and traffic"))

    _presets: dict = PrivateAttr(default_factory=dict)  # --models-preset's sections, read once

    def model_post_init(self, __context) -> None:
        if self.api_key_file and not self.api_key:
            with open(self.api_key_file) as f:
                self.api_key = ",".join(k for line in f if (k := line.strip()) and not k.startswith("#")) or None
        if bool(self.ssl_keyfile) != bool(self.ssl_certfile):
            raise ValueError("--ssl-keyfile and --ssl-certfile go together")
        if self.chat_template_file and not self.chat_template:
            with open(self.chat_template_file) as f:
                self.chat_template = f.read()
        if self.models_preset:
            self._presets = read_presets(self.models_preset)

    @property
    def presets(self) -> dict[str, dict]:
        return self._presets

    @property
    def api_keys(self) -> list[str]:
        """The keys a request may carry (--api-key's comma-separated, --api-key-file's lines)."""
        return [k.strip() for k in (self.api_key or "").split(",") if k.strip()]

    def adapters(self) -> list[tuple[str, float]]:
        """The adapters --lora and --lora-scaled name, as (file, scale) in the order given."""
        out = []
        for item in [x for v in (*self.lora, *self.lora_scaled) for x in v.split(",") if x.strip()]:
            path, _, scale = item.strip().rpartition(":")
            try:
                out.append((path, float(scale)) if path else (item.strip(), 1.0))
            except ValueError:  # a path with a colon in it, and no scale
                out.append((item.strip(), 1.0))
        return [(p, 0.0 if self.lora_init_without_apply else s) for p, s in out]

    def engine_config(self, mmproj: str | None = None) -> EngineConfig:
        """The engine's settings for a model this server loads (`mmproj`: its vision file)."""
        return EngineConfig(device=self.device, n_ctx=self.ctx_size, n_seq=self.parallel, threads=self.threads,
                            kernels=self.kernels, cpu_isa=self.cpu_isa, cpu_repack=self.cpu_repack,
                            cuda_graphs=self.cuda_graphs,
                            prefill_dtype=self.prefill_dtype, cache_ram=self.cache_ram,
                            cache_disk=self.cache_disk, cache_disk_size=self.cache_disk_size,
                            cache_type_k=self.cache_type_k, cache_type_v=self.cache_type_v, spec=self.spec,
                            draft_model=self.draft_model, mmproj=None if self.no_mmproj else mmproj,
                            vision_dtype=self.vision_dtype, cache_dir=self.cache,
                            chat_template=self.chat_template, pooling=self.pooling)
