"""/metrics after a few requests: the counters and histograms moved."""

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from server_harness import server


def scrape(base) -> dict:
    r = httpx.get(f"{base}/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_move(tiny_path):
    with server(tiny_path) as base:
        before = scrape(base)
        assert value(before, "gguf_serve_models_loaded") == 1
        assert value(before, "gguf_serve_model_load_seconds_count", model=tiny_path) == 1
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="x")
        for _ in range(3):
            c.chat.completions.create(model=tiny_path, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                      extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        httpx.post(f"{base}/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "x"}]})
        after = scrape(base)
        assert value(after, "gguf_serve_requests_total", endpoint="/v1/chat/completions", status="200") == 3
        assert value(after, "gguf_serve_requests_total", endpoint="/v1/chat/completions", status="404") == 1
        assert value(after, "gguf_serve_prompt_tokens_total", model=tiny_path) > 0
        generated = value(after, "gguf_serve_generated_tokens_total", model=tiny_path)
        assert 3 <= generated <= 12
        assert value(after, "gguf_serve_time_to_first_token_seconds_count", model=tiny_path) == 3
        assert value(after, "gguf_serve_time_per_output_token_seconds_count", model=tiny_path) == generated - 3
        assert value(after, "gguf_serve_queue_depth", model=tiny_path) == 0
        assert value(after, "gguf_serve_requests_running", model=tiny_path) == 0
