"""/metrics after a few requests: the counters and histograms moved."""

import os

import httpx
import openai

from server_harness import THINKING_TEMPLATE, no_end, scrape, server, value
from tiny_models import tiny_chat_model


def test_metrics_move(tiny_path):
    name = os.path.basename(tiny_path)  # the model's id: its file name
    with server(tiny_path, "--strict-model-names") as base:  # "nope" is a 404
        before = scrape(base)
        assert value(before, "gguf_serve_models_loaded") == 1
        assert value(before, "gguf_serve_model_load_seconds_count", model=name) == 1
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="x")
        for _ in range(3):
            c.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                      extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        httpx.post(f"{base}/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "x"}]})
        after = scrape(base)
        assert value(after, "gguf_serve_requests_total", endpoint="/v1/chat/completions", status="200") == 3
        assert value(after, "gguf_serve_requests_total", endpoint="/v1/chat/completions", status="404") == 1
        assert value(after, "gguf_serve_prompt_tokens_total", model=name) > 0
        generated = value(after, "gguf_serve_generated_tokens_total", model=name)
        assert 3 <= generated <= 12
        assert value(after, "gguf_serve_time_to_first_token_seconds_count", model=name) == 3
        assert value(after, "gguf_serve_time_per_output_token_seconds_count", model=name) == generated - 3
        assert value(after, "gguf_serve_queue_depth", model=name) == 0
        assert value(after, "gguf_serve_requests_running", model=name) == 0


def test_concurrent_streams_share_forward_steps_and_a_next_turn_reuses_its_prefix(tiny_path):
    name = os.path.basename(tiny_path)
    import threading

    with server(tiny_path, "--parallel", "4") as base:
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
        counts = []

        def stream(i):
            s = c.completions.create(model=name, prompt=f"story number {i}", max_tokens=40, temperature=0,
                                     stream=True, logit_bias=no_end(tiny_path))
            counts.append(sum(1 for ch in s if ch.choices and ch.choices[0].text is not None))

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        m = scrape(base)
        steps = value(m, "gguf_serve_batch_tokens_count", model=name)
        one = value(m, "gguf_serve_batch_tokens_bucket", model=name, le="1.0")
        tokens = value(m, "gguf_serve_batch_tokens_sum", model=name)
        assert len(counts) == 4
        assert steps < 4 * 40 and one < steps  # steps carried several sequences' tokens
        assert tokens >= 4 * 39
        assert value(m, "gguf_serve_sequences_running", model=name) == 0
        slots = {s: value(m, "gguf_serve_kv_slots", model=name, state=s) for s in ("running", "cached", "free")}
        assert slots["running"] == 0 and slots["cached"] + slots["free"] == 4 and slots["cached"] >= 1

        msgs = [{"role": "user", "content": "tell me about the sea"}]
        kw = dict(model=name, max_tokens=6, temperature=0, extra_body={"chat_template_kwargs": {
            "enable_thinking": False}})
        first = c.chat.completions.create(messages=msgs, **kw)
        before = value(scrape(base), "gguf_serve_prefix_cache_hit_tokens_total", model=name)
        msgs += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "and the mountains?"}]
        second = c.chat.completions.create(messages=msgs, **kw)
        hit = value(scrape(base), "gguf_serve_prefix_cache_hit_tokens_total", model=name) - before
        assert second.usage.prompt_tokens_details.cached_tokens == hit
        # the second turn prefilled what is new: the template renders the earlier assistant turn without the
        # empty think block its generation prompt had, so the shared prefix ends there (29 of 35 tokens here)
        assert first.usage.prompt_tokens - 8 <= hit < first.usage.prompt_tokens


def test_a_hybrid_models_next_turn_goes_on_from_a_state_checkpoint(tmp_path):
    """Qwen3.5's recurrent layers hold only the end of a sequence; the second turn of a
    thinking chat (whose template drops the first reply's thinking) goes on from the
    checkpoint kept a few tokens before the first prompt's end, not from scratch."""
    path = tiny_chat_model(tmp_path, "tiny-qwen35.gguf", 5, THINKING_TEMPLATE, think=True, arch="qwen35")
    name = os.path.basename(path)
    with server(path) as base:
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
        msgs = [{"role": "system", "content": "You are a careful assistant. " * 8},
                {"role": "user", "content": "tell me about the sea"}]
        kw = dict(model=name, max_tokens=12, temperature=0, logit_bias=no_end(path))
        first = c.chat.completions.create(messages=msgs, **kw)
        m = scrape(base)
        assert value(m, "gguf_serve_state_checkpoints", model=name) >= 1
        assert value(m, "gguf_serve_state_checkpoint_bytes", model=name) > 0
        msgs += [{"role": "assistant", "content": first.choices[0].message.content or "ok"},
                 {"role": "user", "content": "and the mountains?"}]
        second = c.chat.completions.create(messages=msgs, **kw)
        assert value(scrape(base), "gguf_serve_state_checkpoint_hits_total", model=name) == 1
        # CHECKPOINT_BEFORE_END (4) tokens before the first prompt's end
        assert second.usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens - 4


def test_speculative_drafts_in_usage_and_metrics(tiny_path):
    """Speculative decoding is on by default (n-gram lookup): a reply that repeats its
    prompt is drafted; usage counts the drafts as OpenAI's predicted-output tokens and
    /metrics adds them up; a request can turn it off; a drafter the model lacks is a 400."""
    name = os.path.basename(tiny_path)
    # the reference kernels: exact arithmetic, so that rows verified together and decoded one by one agree (the
    # native ones quantize activations, and a rounding that differs with the batch can turn a near tie)
    with server(tiny_path, "--kernels", "reference") as base:
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
        kw = dict(model=name, prompt="abc abd " * 12, max_tokens=40, temperature=0, logit_bias=no_end(tiny_path))
        r = c.completions.create(**kw)
        d = r.usage.completion_tokens_details
        drafted = d.accepted_prediction_tokens + d.rejected_prediction_tokens
        assert drafted > 0
        m = scrape(base)
        assert value(m, "gguf_serve_speculative_drafted_tokens_total", model=name) == drafted
        assert value(m, "gguf_serve_speculative_accepted_tokens_total", model=name) == d.accepted_prediction_tokens
        off = c.completions.create(**kw, extra_body={"speculative": "off"})
        assert off.choices[0].text == r.choices[0].text  # greedy: the same tokens either way
        assert off.usage.completion_tokens_details.accepted_prediction_tokens is None
        bad = httpx.post(f"{base}/v1/completions", json={**kw, "speculative": "mtp"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "speculative"
        assert "'mtp' is not available" in bad.json()["error"]["message"]


def test_model_server_protocol_gauges_follow_the_load(tiny_path):
    """The Gateway API Inference Extension's gauges under vLLM's names (what llm-d's endpoint
    picker scrapes): with one sequence slot, a second request waits while a long reply runs
    (waiting 1, running 1, the KV cache partly used, in the same scrape); all back to 0
    when both end; the cache's layout and the LoRA series are there. (The ratio's counting,
    step by step: tests/engine/test_scheduler.py.)"""
    import threading
    import time

    name = os.path.basename(tiny_path)
    with server(tiny_path, "--parallel", "1", "--ctx-size", "256") as base:
        m = scrape(base)
        assert value(m, "vllm:cache_config_info", model_name=name, block_size="16", num_gpu_blocks="16") == 1
        assert value(m, "vllm:kv_cache_usage_perc", model_name=name) == 0
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
        stream = iter(c.completions.create(model=name, prompt="count to a hundred", max_tokens=240, temperature=0,
                                           stream=True, logit_bias=no_end(tiny_path)))
        next(stream)  # the reply has started
        second = threading.Thread(target=lambda: c.completions.create(model=name, prompt="hi", max_tokens=2))
        second.start()  # one sequence slot: it waits while the reply runs
        deadline = time.monotonic() + 60
        while True:
            m = scrape(base)
            if value(m, "vllm:num_requests_waiting", model_name=name) == 1:
                break
            assert time.monotonic() < deadline, "the second request never showed as waiting"
        assert value(m, "vllm:num_requests_running", model_name=name) == 1
        usage = value(m, "vllm:kv_cache_usage_perc", model_name=name)
        assert 5 / 256 < usage <= 1 and usage == value(m, "gguf_serve_kv_cache_usage_ratio", model=name)
        for _ in stream:
            pass
        second.join(60)
        end = scrape(base)
        assert value(end, "vllm:num_requests_running", model_name=name) == 0
        assert value(end, "vllm:num_requests_waiting", model_name=name) == 0
        assert value(end, "vllm:kv_cache_usage_perc", model_name=name) == 0  # a finished prefix counts as free
        assert value(end, "vllm:lora_requests_info", max_lora="0", running_lora_adapters="",
                     waiting_lora_adapters="") > 0
