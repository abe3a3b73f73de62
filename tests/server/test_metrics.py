"""/metrics after a few requests: the counters and histograms moved."""

import os

import httpx
import openai

from server_harness import no_end, scrape, server, value


def test_metrics_move(tiny_path):
    name = os.path.basename(tiny_path)  # the model's id: its file name
    with server(tiny_path) as base:
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
