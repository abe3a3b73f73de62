"""Prometheus metrics (text format at GET /metrics). Names follow Prometheus
conventions: a `gguf_serve_` prefix, base units in the name, `_total` on counters.

| metric | type | labels | meaning |
|---|---|---|---|
| gguf_serve_requests_total | counter | endpoint, status | HTTP requests answered |
| gguf_serve_queue_depth | gauge | model | requests waiting for sequence slots |
| gguf_serve_requests_running | gauge | model | requests being generated now |
| gguf_serve_sequences_running | gauge | model | sequences (choices) in the running batch |
| gguf_serve_batch_tokens | histogram | model | tokens per forward step (decoding sequences + prompt chunks) |
| gguf_serve_prefix_cache_hit_tokens_total | counter | model | prompt tokens taken from the prefix cache, not prefilled |
| gguf_serve_kv_slots | gauge | model, state | KV cache sequence slots: running, cached (a finished prefix kept), free |
| gguf_serve_prompt_tokens_total | counter | model | prompt tokens processed |
| gguf_serve_generated_tokens_total | counter | model | tokens generated |
| gguf_serve_time_to_first_token_seconds | histogram | model | submit → first token |
| gguf_serve_time_per_output_token_seconds | histogram | model | time between tokens |
| gguf_serve_model_load_seconds | histogram | model | time to load a model |
| gguf_serve_models_loaded | gauge | | models loaded now |
| gguf_serve_model_memory_bytes | gauge | | bytes the loaded models hold (files and caches) |
| gguf_serve_model_requests | gauge | model | requests holding the model: waiting for its load, or served |
| gguf_serve_model_unloads_total | counter | reason | models unloaded: to make room, idle, asked |
| gguf_serve_kv_cache_usage_ratio | gauge | model | KV cells the running sequences hold over all cells (0-1) |

The Gateway API Inference Extension's model-server protocol (llm-d's endpoint picker
reads vLLM's names; deploy/README.md): the same values under them, labelled `model_name`.

| metric | type | labels | meaning |
|---|---|---|---|
| vllm:num_requests_waiting | gauge | model_name | gguf_serve_queue_depth |
| vllm:num_requests_running | gauge | model_name | gguf_serve_requests_running |
| vllm:kv_cache_usage_perc | gauge | model_name | gguf_serve_kv_cache_usage_ratio (a 0-1 ratio, as vLLM's) |
| vllm:cache_config_info | gauge (1) | model_name, block_size, num_gpu_blocks | the cache in blocks of BLOCK_SIZE cells |
| vllm:lora_requests_info | gauge (time) | max_lora, running_lora_adapters, waiting_lora_adapters | adapters in use |
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

BLOCK_SIZE = 16  # cells a "block" in vllm:cache_config_info (vLLM's default; the prefix cache itself matches any length)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("gguf_serve_requests", "HTTP requests answered", ["endpoint", "status"], registry=r)
        self.queue_depth = Gauge("gguf_serve_queue_depth", "Requests waiting for sequence slots", ["model"], registry=r)
        self.running = Gauge("gguf_serve_requests_running", "Requests being generated now", ["model"], registry=r)
        self.sequences_running = Gauge("gguf_serve_sequences_running", "Sequences in the running batch", ["model"],
                                       registry=r)
        self.batch_tokens = Histogram("gguf_serve_batch_tokens", "Tokens per forward step", ["model"],
                                      buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512), registry=r)
        self.prefix_hit_tokens = Counter("gguf_serve_prefix_cache_hit_tokens",
                                         "Prompt tokens taken from the prefix cache", ["model"], registry=r)
        self.checkpoints = Gauge("gguf_serve_state_checkpoints", "State checkpoints held (recurrent states, sliding "
                                 "windows)", ["model"], registry=r)
        self.checkpoint_bytes = Gauge("gguf_serve_state_checkpoint_bytes", "Bytes the state checkpoints hold",
                                      ["model"], registry=r)
        self.checkpoint_hits = Counter("gguf_serve_state_checkpoint_hits", "Sequences that went on from a state "
                                       "checkpoint", ["model"], registry=r)
        self.drafted = Counter("gguf_serve_speculative_drafted_tokens", "Tokens drafted for speculative decoding",
                               ["model"], registry=r)
        self.accepted = Counter("gguf_serve_speculative_accepted_tokens", "Drafted tokens the model confirmed",
                                ["model"], registry=r)
        self.kv_slots = Gauge("gguf_serve_kv_slots", "KV cache sequence slots by state", ["model", "state"],
                              registry=r)
        self.prompt_tokens = Counter("gguf_serve_prompt_tokens", "Prompt tokens processed", ["model"], registry=r)
        self.generated_tokens = Counter("gguf_serve_generated_tokens", "Tokens generated", ["model"], registry=r)
        self.ttft = Histogram("gguf_serve_time_to_first_token_seconds", "From submission to the first token",
                              ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("gguf_serve_time_per_output_token_seconds", "Time between generated tokens",
                              ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.load_time = Histogram("gguf_serve_model_load_seconds", "Time to load a model", ["model"],
                                   buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600), registry=r)
        self.models_loaded = Gauge("gguf_serve_models_loaded", "Models loaded now", registry=r)
        self.model_memory = Gauge("gguf_serve_model_memory_bytes", "Bytes the loaded models hold (files and "
                                  "caches)", registry=r)
        self.model_memory_parts = Gauge("gguf_serve_model_memory_part_bytes", "Bytes a loaded model holds, by part: "
                                        "files, kv, checkpoints (their budget), adapters, draft, disk_writes (at "
                                        "most)", ["model", "part"], registry=r)
        self.prompt_disk = Counter("gguf_serve_prompt_cache_disk", "The prompt cache's disk tier: files written, "
                                   "read back (hits), dropped as damaged", ["model", "event"], registry=r)
        self.prompt_disk_bytes = Gauge("gguf_serve_prompt_cache_disk_bytes", "Bytes of the model's files in the "
                                       "disk tier", ["model"], registry=r)
        self.model_requests = Gauge("gguf_serve_model_requests", "Requests holding the model: waiting for its load, "
                                    "or being served", ["model"], registry=r)
        self.unloads = Counter("gguf_serve_model_unloads", "Models unloaded, by reason", ["reason"], registry=r)
        self.kv_usage = Gauge("gguf_serve_kv_cache_usage_ratio", "KV cells the running sequences hold over all cells",
                              ["model"], registry=r)
        # the model-server protocol's names (vLLM's), for Gateway API Inference Extension routers
        self.vllm_waiting = Gauge("vllm:num_requests_waiting", "Requests waiting", ["model_name"], registry=r)
        self.vllm_running = Gauge("vllm:num_requests_running", "Requests running", ["model_name"], registry=r)
        self.vllm_kv_usage = Gauge("vllm:kv_cache_usage_perc", "KV cache usage, 0-1", ["model_name"], registry=r)
        self.vllm_cache_config = Gauge("vllm:cache_config_info", "KV cache layout",
                                       ["model_name", "block_size", "num_gpu_blocks"], registry=r)
        self.vllm_lora = Gauge("vllm:lora_requests_info", "LoRA adapters in use (the value: when last set)",
                               ["max_lora", "running_lora_adapters", "waiting_lora_adapters"], registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
