"""The server end to end: a real `gguf-serve` process on 127.0.0.1 and the official
`openai` client (raw httpx where the SDK hides the wire)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time

import httpx
import openai
import pytest

from server_harness import free_port, ids, no_end, scrape, serve_command, server, until, value

@pytest.fixture(scope="module")
def srv(tiny_path):
    # a name not served is a 404 here (without the setting, the one model answers it:
    # test_llama_server_conventions.py); prompts in float32 (the integer tiles), so that a
    # request answered from the prefix cache has the bits it had the first time (with AMX's
    # bfloat16 prompts its last prompt token would differ by bfloat16's rounding)
    with server(tiny_path, "--max-queue", "2", "--parallel", "2", "--strict-model-names", "--prefill-dtype",
                "float32") as base:
        yield base


@pytest.fixture
def client(srv):
    return openai.OpenAI(base_url=f"{srv}/v1", api_key="unused", max_retries=0)


def test_models_lists_the_file(client, srv, tiny_path):
    models = client.models.list().data
    name = os.path.basename(tiny_path)  # listed by its file name; the path as typed is accepted too
    assert models[0].id == name and models[0].created == int(os.path.getmtime(tiny_path))
    for asked in (tiny_path, name):
        m = httpx.get(f"{srv}/v1/models/{asked}").json()
        assert m["id"] == name and m["loaded"] is True and m["context_length"] == 256 and m["quantization"]
    r = httpx.get(f"{srv}/v1/models/unknown.gguf")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_chat_non_streaming_thinking_off(client, tiny_path):
    r = client.chat.completions.create(
        model=tiny_path, messages=[{"role": "user", "content": "the cat"}], max_tokens=6, temperature=0,
        logit_bias=no_end(tiny_path, **{str(ids(tiny_path)["<think>"]): -100}),
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    c = r.choices[0]
    assert c.finish_reason == "length" and c.message.role == "assistant"
    assert c.message.content and getattr(c.message, "reasoning_content", None) is None
    assert r.usage.completion_tokens == 6 and r.usage.prompt_tokens > 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + 6


def test_stream_equals_non_stream_and_reports_usage(client, tiny_path):
    kw = dict(model=tiny_path, messages=[{"role": "user", "content": "in the end"}], max_tokens=8, temperature=0,
              logit_bias=no_end(tiny_path), extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    full = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8


def test_raw_sse_shape(srv, tiny_path):
    body = {"model": tiny_path, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "stream": True,
            "logit_bias": no_end(tiny_path)}
    with httpx.stream("POST", f"{srv}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"


def test_thinking_on_puts_reasoning_apart_and_length_leaves_content_empty(client, tiny_path):
    t = ids(tiny_path)
    r = client.chat.completions.create(
        model=tiny_path, messages=[{"role": "user", "content": "think"}], max_tokens=5, temperature=0,
        logit_bias=no_end(tiny_path, **{str(t["</think>"]): -100}))  # the template opens <think>; never closed
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "length"
    assert m.content == ""
    assert m.reasoning_content  # the thinking text, apart from the answer
    assert r.usage.completion_tokens_details.reasoning_tokens == 5


def test_thinking_closes_then_answers(client, tiny_path):
    t = ids(tiny_path)
    # force </think> as the first token, then keep it from coming again
    chunks = list(client.chat.completions.create(
        model=tiny_path, messages=[{"role": "user", "content": "go"}], max_tokens=1, temperature=0,
        logit_bias=no_end(tiny_path, **{str(t["</think>"]): 100}), stream=True))
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert reasoning == "" and content == ""  # the closing tag itself is in neither


@pytest.mark.parametrize("extra", [{"reasoning_effort": "none"}, {"chat_template_kwargs": {"enable_thinking": False}}])
def test_request_turns_thinking_off(client, tiny_path, extra):
    r = client.chat.completions.create(model=tiny_path, messages=[{"role": "user", "content": "a"}], max_tokens=3,
                                       temperature=0, logit_bias=no_end(tiny_path), extra_body=extra)
    assert getattr(r.choices[0].message, "reasoning_content", None) is None
    assert r.usage.completion_tokens_details.reasoning_tokens == 0


def test_multi_turn_with_reasoning_content(client, tiny_path):
    """A past turn's reasoning_content reaches the template (this one renders it): the same
    conversation without it is a shorter prompt."""
    def ask(reasoning: str | None):
        turn = {"role": "assistant", "content": "b", **({"reasoning_content": reasoning} if reasoning else {})}
        return client.chat.completions.create(
            model=tiny_path, temperature=0, max_tokens=2, logit_bias=no_end(tiny_path),
            messages=[{"role": "user", "content": "a"}, turn, {"role": "user", "content": "c"}])
    r, without = ask("because the sky is blue"), ask(None)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens > without.usage.prompt_tokens + 4


def test_seed_and_n(client, tiny_path):
    kw = dict(model=tiny_path, messages=[{"role": "user", "content": "s"}], max_tokens=6, temperature=1.0, seed=11,
              logit_bias=no_end(tiny_path), n=2, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    assert len(a.choices) == 2 and a.usage.completion_tokens == 12
    assert a.choices[0].message.content != a.choices[1].message.content  # each choice samples on its own
    with pytest.raises(openai.BadRequestError) as e:  # more choices than sequence slots (--parallel 2)
        client.chat.completions.create(**{**kw, "n": 3})
    assert e.value.body["param"] == "n" and "--parallel" in e.value.body["message"]


def test_stop_strings(client, tiny_path):
    base = client.chat.completions.create(model=tiny_path, messages=[{"role": "user", "content": "q"}], max_tokens=8,
                                          temperature=0, logit_bias=no_end(tiny_path),
                                          extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    text = base.choices[0].message.content
    stop = text[3:5]
    r = client.chat.completions.create(model=tiny_path, messages=[{"role": "user", "content": "q"}], max_tokens=8,
                                       temperature=0, logit_bias=no_end(tiny_path), stop=[stop],
                                       extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == text[:text.find(stop)]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_stream_chunks_have_openai_nulls_and_a_fingerprint(srv, tiny_path, path):
    body = {"model": tiny_path, "max_tokens": 3, "stream": True, "logit_bias": no_end(tiny_path),
            "stream_options": {"include_usage": True}}
    body.update({"messages": [{"role": "user", "content": "x"}]} if "chat" in path else {"prompt": "x"})
    with httpx.stream("POST", f"{srv}{path}", json=body, timeout=60) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert all(c["system_fingerprint"] == "gguf-serve" for c in chunks)
    with_choices = [c for c in chunks if c["choices"]]
    assert all("finish_reason" in c["choices"][0] and "logprobs" in c["choices"][0] for c in with_choices)
    assert [c["choices"][0]["finish_reason"] for c in with_choices][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in with_choices[:-1])
    usage = chunks[-1]["usage"]
    assert set(usage["prompt_tokens_details"]) == {"cached_tokens"}  # objects, also when zero
    # reasoning tokens always; the prediction counts where speculative decoding drafted for this (sampled,
    # unseeded) reply, which its random draws decide
    assert {"reasoning_tokens"} <= set(usage["completion_tokens_details"]) <= {
        "reasoning_tokens", "accepted_prediction_tokens", "rejected_prediction_tokens"}


def test_tokenize_and_detokenize(srv, tiny_path):
    r = httpx.post(f"{srv}/tokenize", json={"model": tiny_path, "content": "the cat sat"}).json()
    ids_ = r["tokens"]
    assert ids_ and all(isinstance(t, int) for t in ids_)
    back = httpx.post(f"{srv}/detokenize", json={"model": tiny_path, "tokens": ids_}).json()
    assert back["content"] == "the cat sat"
    pieces = httpx.post(f"{srv}/tokenize", json={"model": tiny_path, "content": "the cat sat",
                                                  "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == ids_ and "".join(p["piece"] for p in pieces) == "the cat sat"
    bad = httpx.post(f"{srv}/detokenize", json={"model": tiny_path, "tokens": [1, 10 ** 9]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens.1"
    assert httpx.post(f"{srv}/tokenize", json={"model": "nope", "content": "x"}).status_code == 404


def test_completions_endpoint(client, tiny_path):
    r = client.completions.create(model=tiny_path, prompt="the", max_tokens=4, temperature=0, logit_bias=no_end(tiny_path))
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 4
    s = list(client.completions.create(model=tiny_path, prompt="the", max_tokens=4, temperature=0,
                                       logit_bias=no_end(tiny_path), stream=True))
    assert "".join(c.choices[0].text for c in s if c.choices) == r.choices[0].text


@pytest.mark.parametrize("body,status,param,code", [
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, 400, "tools.0", None),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": "sometimes"}, 400, "tool_choice", None),
    ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {}}},
     400, "response_format", None),
    ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}}},
     400, "response_format", None),
    ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}, 400, "response_format",
     "unsupported_parameter"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs", None),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": 5}, 400, "temperature", None),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "what is this"}, {
        "type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}, 400, "messages.0.content.1",
     "unsupported_parameter"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"}]}, 400, "messages.1.tool_calls.0.function.arguments",
     None),
    ({"messages": []}, 400, "messages", None),
    ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages.0.role", None),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1000}, 400, "messages", "context_length_exceeded"),
])
def test_errors_in_openai_shape(srv, tiny_path, body, status, param, code):
    r = httpx.post(f"{srv}/v1/chat/completions", json={"model": tiny_path, **body}, timeout=30)
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param and err["code"] == code
    if code == "context_length_exceeded":
        assert "maximum context length is 256 tokens" in err["message"] and "1000 in the completion" in err["message"]


BAD_VALUES = [  # (endpoint, fields, param): values the server once took unchecked, then failed on (500)
    ("chat", {"logit_bias": {"99999": 1}}, "logit_bias"),
    ("chat", {"logit_bias": {"-1": 1}}, "logit_bias"),
    ("chat", {"logit_bias": {"5": float("nan")}}, "logit_bias.5"),
    ("chat", {"logit_bias": {"5": float("inf")}}, "logit_bias.5"),
    ("completions", {"logit_bias": {"5": -1e300}}, "logit_bias.5"),
    ("chat", {"repetition_penalty": 5e-324}, "repetition_penalty"),
    ("completions", {"seed": 2 ** 64}, "seed"),
    ("chat", {"seed": -(2 ** 63) - 1}, "seed"),
    ("chat", {"messages": [{"role": "user", "content": "a\ud800b"}]}, "messages.0.content"),
    ("chat", {"model": "x\ud800"}, "model"),
    ("completions", {"prompt": "\udfff"}, "prompt"),
    ("completions", {"prompt": ""}, "prompt"),
    ("completions", {"prompt": [""]}, "prompt"),
    ("completions", {"max_tokens": 1000}, "prompt"),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("endpoint,fields,param", BAD_VALUES)
def test_bad_values_are_400_naming_the_field_before_anything_runs(srv, tiny_path, endpoint, fields, param, stream):
    body = {"model": tiny_path, "max_tokens": 2, "stream": stream, **(
        {"messages": [{"role": "user", "content": "x"}]} if endpoint == "chat" else {"prompt": "the"})}
    body.update(fields)
    content = json.dumps(body)  # ASCII JSON: a lone surrogate as its escape; NaN, Infinity as json.dumps writes them
    r = httpx.post(f"{srv}/v1/{'chat/completions' if endpoint == 'chat' else 'completions'}", content=content,
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param
    if "\\ud" in content or "\\udfff" in content:
        assert err["message"] == f"{param}: the string is not valid Unicode (a lone surrogate)"
    assert httpx.get(f"{srv}/health").status_code == 200


def test_a_body_that_is_not_json_says_so_and_where(srv):
    r = httpx.post(f"{srv}/v1/chat/completions", content=b'{"model": "x",\n "messages": [',
                   headers={"content-type": "application/json"})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] is None, r.text
    assert err["message"].startswith("the request body is not valid JSON: ") and "line 2, column 15" in err["message"]


def test_a_body_without_json_says_what_to_send(srv, tiny_path):
    """curl's -d without a JSON content type, no body at all, a JSON array: each a 400 that
    says what the server wants, not pydantic's words."""
    body = json.dumps({"model": tiny_path, "messages": [{"role": "user", "content": "x"}]}).encode()
    form = httpx.post(f"{srv}/v1/chat/completions", content=body,
                      headers={"content-type": "application/x-www-form-urlencoded"}).json()["error"]["message"]
    assert "Content-Type: application/json" in form and "application/x-www-form-urlencoded" in form
    empty = httpx.post(f"{srv}/v1/chat/completions").json()["error"]["message"]
    assert empty == "the request needs a JSON body (Content-Type: application/json)"
    array = httpx.post(f"{srv}/v1/chat/completions", json=[1, 2])
    assert array.status_code == 400 and array.json()["error"]["message"] == "the body must be a JSON object ({...})"


@pytest.mark.parametrize("method,path,status", [("POST", "/v1/audio/speech", 404), ("GET", "/v1/nothing/here", 404),
                                                ("DELETE", "/v1/models", 405)])
def test_paths_not_served_answer_in_openais_envelope_naming_them(srv, method, path, status):
    r = httpx.request(method, f"{srv}{path}", json={})
    err = r.json()["error"]
    assert r.status_code == status and f"{method} {path}" in err["message"], r.text
    assert err["type"] == "invalid_request_error" and err["code"] == ("unknown_url" if status == 404 else None)


def test_a_vanishing_temperature_is_greedy_not_an_error(client, tiny_path):
    kw = dict(model=tiny_path, messages=[{"role": "user", "content": "the cat"}], max_tokens=4,
              logit_bias=no_end(tiny_path))
    tiny = client.chat.completions.create(temperature=1e-300, **kw).choices[0].message.content
    assert tiny == client.chat.completions.create(temperature=0, **kw).choices[0].message.content


def test_unknown_model_and_unknown_fields(client, tiny_path):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="no/such:model.gguf", messages=[{"role": "user", "content": "x"}])
    assert e.value.body["code"] == "model_not_found"
    r = client.chat.completions.create(model=tiny_path, messages=[{"role": "user", "content": "x"}], max_tokens=1,
                                       extra_body={"some_future_field": 1})  # ignored, not an error
    assert r.choices


def test_bad_json_and_oversized_body(srv, tiny_path):
    r = httpx.post(f"{srv}/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    big = b'{"model": "x", "messages": [{"role": "user", "content": "' + b"a" * (17 * 1024 * 1024) + b'"}]}'
    r = httpx.post(f"{srv}/v1/chat/completions", content=big, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]

    def chunks():  # no Content-Length: chunked transfer encoding, counted while it is read
        for i in range(0, len(big), 1 << 20):
            yield big[i:i + (1 << 20)]

    r = httpx.post(f"{srv}/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"},
                   timeout=60)
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(f"{srv}/health").status_code == 200


def test_health_and_models_answer_during_a_long_generation(srv, tiny_path):
    done = threading.Event()

    def long_requests():  # three requests of two choices: one runs in both slots, the others wait their turn
        ts = [threading.Thread(target=httpx.post, args=(f"{srv}/v1/chat/completions",), kwargs=dict(
            timeout=120, json={"model": tiny_path, "messages": [{"role": "user", "content": "x"}], "max_tokens": 230,
                               "n": 2, "logit_bias": no_end(tiny_path),
                               "speculative": "off"})) for _ in range(3)]  # drafts could end it too soon
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        done.set()

    threading.Thread(target=long_requests, daemon=True).start()
    time.sleep(0.1)
    t = time.perf_counter()
    assert httpx.get(f"{srv}/health", timeout=5).status_code == 200
    assert httpx.get(f"{srv}/v1/models", timeout=5).status_code == 200
    assert time.perf_counter() - t < 1.0
    assert not done.is_set()  # the generation was really still running
    done.wait(120)


@pytest.mark.parametrize("endpoint", ["chat/completions", "completions"])
def test_a_huge_prompt_is_refused_fast_and_health_answers_meanwhile(srv, tiny_path, endpoint):
    """8 MB of text (under the body limit) would take ~16 s to tokenize, holding the GIL:
    it is measured in pieces instead, refused once it is sure to be over the context."""
    text = "a few words " * 700_000
    body = {"messages": [{"role": "user", "content": text}]} if endpoint.startswith("chat") else {"prompt": text}
    out = {}

    def post():
        t = time.perf_counter()
        out["r"] = httpx.post(f"{srv}/v1/{endpoint}", timeout=120, json={"model": tiny_path, **body})
        out["t"] = time.perf_counter() - t

    th = threading.Thread(target=post)
    th.start()
    worst = 0.0
    while th.is_alive():
        t = time.perf_counter()
        assert httpx.get(f"{srv}/health", timeout=30).status_code == 200
        worst = max(worst, time.perf_counter() - t)
        time.sleep(0.02)
    err = out["r"].json()["error"]
    assert out["r"].status_code == 400 and err["code"] == "context_length_exceeded"
    assert err["param"] == ("messages" if endpoint.startswith("chat") else "prompt") and "more than" in err["message"]
    assert out["t"] < 3.0 and worst < 0.3, (out["t"], worst)


def test_measuring_in_pieces_refuses_only_what_is_over(gemma_path):
    """The piecewise count is a sure lower bound: a text just inside the context passes,
    one a little over is refused (Gemma's tokenizer, which merges across spaces)."""
    import asyncio
    from types import SimpleNamespace

    from gguf_serve.engine.tokenizer import load_tokenizer
    from gguf_serve.gguf_io import GGUFReader
    from gguf_serve.server.core.errors import ContextLengthExceeded
    from gguf_serve.server.chat.serving import MEASURE_PIECE, ChatServing
    from gguf_serve.server.core.pools import Pools
    from gguf_serve.server.settings import ServerSettings

    tok = load_tokenizer(GGUFReader(gemma_path))
    para = ("The   quick brown fox, said 42 times:\n\n  «jumps» over 1234567 lazy dogs... 日本語の文章。\t"
            "    indented code();  ") * 4000
    assert len(para) > 4 * MEASURE_PIECE
    n = len(tok.backend_tokenizer.encode(para, add_special_tokens=False).ids)
    service = ChatServing(None, ServerSettings(), None, Pools())  # (measuring renders nothing)
    for ctx, refused in ((n + 1, False), (n - 200, True)):
        entry = SimpleNamespace(lm=SimpleNamespace(n_ctx=ctx, tokenizer=tok))
        try:
            asyncio.run(service._measure(entry, para, "prompt"))
            assert not refused
        except ContextLengthExceeded:
            assert refused


def test_disconnect_cancels_and_full_queue_is_429(srv, tiny_path, gemma_path):
    body = {"model": tiny_path, "messages": [{"role": "user", "content": "x"}], "max_tokens": 200, "stream": True,
            "logit_bias": no_end(tiny_path)}
    with httpx.stream("POST", f"{srv}/v1/chat/completions", json=body, timeout=60) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 3:
                break  # hang up mid-stream
    # the worker is free again quickly: a short request finishes fast
    t = time.perf_counter()
    short = httpx.post(f"{srv}/v1/chat/completions", timeout=60, json={
        "model": tiny_path, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1})
    assert short.status_code == 200 and time.perf_counter() - t < 10
    # --parallel 2, --max-queue 2: two running, two waiting, the next is refused with Retry-After. On the
    # Gemma file (300 tokens take seconds) so that none has ended before the last arrives, however fast the
    # machine (the tiny model's 200 tokens took less than the 250 ms the six requests take to arrive)
    results = []
    long = {"model": gemma_path, "prompt": "Once upon a time", "max_tokens": 300, "ignore_eos": True}
    with server(gemma_path, "--max-queue", "2", "--parallel", "2", "--ctx-size", "512") as busy:
        def req():
            results.append(httpx.post(f"{busy}/v1/completions", timeout=120, json=long))

        streams = []

        def streamed():  # refused streams get the 429 as their status, not as an event after a 200
            with httpx.stream("POST", f"{busy}/v1/completions", timeout=120, json={**long, "stream": True}) as r:
                r.read()
                results.append(r), streams.append(r)

        threads = [threading.Thread(target=f) for f in (req, req, req, streamed, streamed, streamed)]
        for th in threads:
            th.start()
            time.sleep(0.05)
        for th in threads:
            th.join(120)
    codes = sorted(r.status_code for r in results)
    assert codes == [200] * 4 + [429] * 2
    for r in results:
        if r.status_code == 429:
            assert r.headers["retry-after"] == "1" and r.json()["error"]["type"] == "rate_limit_error"
        else:
            assert r.status_code == 200 and "rate_limit_error" not in r.text
    assert any(r.status_code == 429 and "event-stream" not in r.headers.get("content-type", "") for r in streams)


def test_non_streaming_clients_that_hang_up_are_cancelled(gemma_path):
    """Four clients hang up while they wait for whole answers: the two running leave the batch, the two
    waiting never start (the real Gemma file; they hang up once the server shows two running and two
    queued, and the test waits on its counters, not on a clock)."""
    with server(gemma_path, "--parallel", "2") as base:
        name = os.path.basename(gemma_path)
        body = json.dumps({"model": gemma_path, "prompt": "The history of Paris", "max_tokens": 200,
                           "ignore_eos": True}).encode()
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        clients = [socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1]))) for _ in range(4)]
        for c in clients:
            c.sendall(head + body)

        def gauges():
            m = scrape(base)
            return value(m, "gguf_serve_requests_running", model=name), value(m, "gguf_serve_queue_depth", model=name)

        assert until(lambda: gauges() == (2, 2), 60), gauges()
        for c in clients:
            c.close()
        assert until(lambda: value(scrape(base), "gguf_serve_requests_total", endpoint="/v1/completions",
                                   status="499") == 4, 60)
        assert until(lambda: gauges() == (0, 0), 30), gauges()
        m = scrape(base)
        forwarded = value(m, "gguf_serve_batch_tokens_sum", model=name)
        assert 0 < forwarded < 300  # not 4 x 200
        assert value(m, "gguf_serve_sequences_running", model=name) == 0
        assert value(m, "gguf_serve_kv_slots", model=gemma_path, state="running") == 0
        assert value(m, "gguf_serve_requests_total", endpoint="/v1/completions", status="499") == 4
        ok = httpx.post(f"{base}/v1/completions", timeout=60, json={"model": gemma_path, "prompt": "Hi",
                                                                   "max_tokens": 3})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3


def test_api_key(tiny_path):
    with server(tiny_path, "--api-key", "sekret") as base:
        r = httpx.get(f"{base}/v1/models")
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert httpx.get(f"{base}/health").status_code == 200  # health stays open
        ok = openai.OpenAI(base_url=f"{base}/v1", api_key="sekret").models.list()
        assert ok.data[0].id == os.path.basename(tiny_path)
        for path in ("/metrics", "/docs", "/redoc", "/openapi.json"):  # they name models and traffic
            assert httpx.get(f"{base}{path}").status_code == 401
            assert httpx.get(f"{base}{path}", headers={"Authorization": "Bearer wrong"}).status_code == 401
            assert httpx.get(f"{base}{path}", headers={"Authorization": "Bearer sekret"}).status_code == 200
        for header in ("bearer sekret", "BEARER sekret", "Bearer  sekret"):  # the scheme in any case (RFC 9110)
            assert httpx.get(f"{base}/v1/models", headers={"Authorization": header}).status_code == 200
        for header in ("sekret", "Basic sekret", "Bearer sekret2", "Bearer"):
            assert httpx.get(f"{base}/v1/models", headers={"Authorization": header}).status_code == 401


def test_metrics_public_opens_metrics_alone(tiny_path):
    """--metrics-public: /metrics answers without the key (an inference gateway's endpoint
    picker scrapes it without one); everything else keeps it."""
    with server(tiny_path, "--api-key", "sekret", "--metrics-public") as base:
        assert httpx.get(f"{base}/metrics").status_code == 200
        for path in ("/v1/models", "/docs", "/openapi.json", "/slots"):
            assert httpx.get(f"{base}{path}").status_code == 401


def test_server_flag_reasoning_off(tiny_path):
    with server(tiny_path, "--reasoning", "off") as base:
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="x")
        r = c.chat.completions.create(model=tiny_path, messages=[{"role": "user", "content": "a"}], max_tokens=3,
                                      temperature=0, logit_bias=no_end(tiny_path))
        assert getattr(r.choices[0].message, "reasoning_content", None) is None and r.choices[0].message.content
        r = c.chat.completions.create(model=tiny_path, messages=[{"role": "user", "content": "a"}], max_tokens=3,
                                      temperature=0, logit_bias=no_end(tiny_path, **{str(ids(tiny_path)["</think>"]): -100}),
                                      extra_body={"chat_template_kwargs": {"enable_thinking": True}})  # request wins
        assert r.choices[0].message.reasoning_content and r.choices[0].message.content == ""


def test_embedded_gemma_answers_a_chat_request():
    with server() as base:  # no model named: the embedded default
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="x")
        assert [m.id for m in c.models.list().data] == ["embedded:gemma-3-270m-q4_k_m.gguf"]
        r = c.chat.completions.create(model="embedded:gemma-3-270m-q4_k_m.gguf", max_tokens=8, temperature=0,
                                      messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert r.choices[0].message.content.strip() and r.usage.completion_tokens >= 1


def test_hub_model_id_downloads_then_resolves_offline(tiny_path, tmp_path):
    from hub_server import HubServer

    repo, filename = "tiny-org/tiny-qwen3-GGUF", "tiny-qwen3-Q8_0.gguf"
    model_id = f"{repo}:{filename}"
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    with HubServer() as hub:
        hub.add_repo(repo, {filename: tiny_path})
        with server(model_id, env={**env, "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0"}) as base:
            c = openai.OpenAI(base_url=f"{base}/v1", api_key="x")
            assert [m.id for m in c.models.list().data] == [model_id]
            r = c.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                          logit_bias=no_end(tiny_path))
            assert r.usage.completion_tokens == 2 and r.model == model_id
        assert any("/resolve/" in q for q in hub.requests)  # the real client downloaded from here
    # the Hub is gone: offline, the cached file resolves without the network
    with server(model_id, env={**env, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "1"}) as base:
        assert httpx.get(f"{base}/v1/models").json()["data"][0]["id"] == model_id


def test_a_server_cap_for_chat_requests_without_max_tokens(tiny_path):
    with server(tiny_path, "--max-tokens", "5") as base:
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
        r = c.chat.completions.create(model=tiny_path, messages=[{"role": "user", "content": "go"}],
                                      logit_bias=no_end(tiny_path), extra_body={"chat_template_kwargs": {
                                          "enable_thinking": False}})
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
        r = c.chat.completions.create(model=tiny_path, messages=[{"role": "user", "content": "go"}], max_tokens=9,
                                      logit_bias=no_end(tiny_path), extra_body={"chat_template_kwargs": {
                                          "enable_thinking": False}})
        assert r.usage.completion_tokens == 9  # a request's own limit wins
        assert httpx.get(f"{base}/v1/models").json()["data"][0]["chat_template"] is True


def test_local_files_are_listed_by_name_or_alias(tiny_path, tmp_path):
    import shutil as _sh

    copies = []
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        copies.append(str(tmp_path / d / os.path.basename(tiny_path)))
        _sh.copy(tiny_path, copies[-1])
    with server(tiny_path, *copies, "--alias", "mine", "--max-loaded", "3") as base:
        listed = [m["id"] for m in httpx.get(f"{base}/v1/models").json()["data"]]
        # the alias; the file name; the path as typed where the name is taken
        assert listed == ["mine", os.path.basename(tiny_path), copies[1]]
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="x")
        for model in ("mine", tiny_path, os.path.basename(tiny_path), copies[0], copies[1]):
            r = c.completions.create(model=model, prompt="a", max_tokens=1, logit_bias=no_end(tiny_path))
            assert r.usage.completion_tokens == 1


def test_lru_unloads_beyond_the_count_limit_and_no_switch_is_logged_once(tiny_path, tmp_path):
    import shutil as _sh

    import server_harness

    other = str(tmp_path / "other.gguf")
    _sh.copy(tiny_path, other)
    with server(tiny_path, other, "--max-loaded", "1") as base:
        loaded = {m["id"]: m["loaded"] for m in httpx.get(f"{base}/v1/models").json()["data"]}
        tiny = os.path.basename(tiny_path)
        assert loaded["other.gguf"] is True and loaded[tiny] is False  # loading the second unloaded the first
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="x")
        c.chat.completions.create(model=tiny_path, max_tokens=1, messages=[{"role": "user", "content": "x"}])
        loaded = {m["id"]: m["loaded"] for m in httpx.get(f"{base}/v1/models").json()["data"]}
        assert loaded == {tiny: True, "other.gguf": False}
    with server(env={"GGUF_SERVE_REASONING": "on"}) as base:  # Gemma's fallback template has no switch
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="x")
        for _ in range(2):
            r = c.chat.completions.create(model="default", max_tokens=2, reasoning_effort="high",
                                          messages=[{"role": "user", "content": "hi"}])
            assert r.usage.completion_tokens >= 1 and r.choices[0].finish_reason in ("stop", "length")
        log = server_harness.OUTPUTS[base]()
        assert log.count("has no thinking switch; the reasoning setting is ignored") == 1


def test_api_key_from_a_mounted_secret_file(tiny_path, tmp_path):
    """The keys of a file, one a line (llama-server's --api-key-file; `#` lines are comments),
    or --api-key's comma-separated: each opens the API, as a bearer token or x-api-key; others
    do not. With a certificate and key, the same server answers over HTTPS."""
    secret = tmp_path / "api-key"
    secret.write_text("from-a-file\n# a comment\nsecond-key\n\n")
    with server(tiny_path, env={"GGUF_SERVE_API_KEY_FILE": str(secret)}) as base:
        assert httpx.get(f"{base}/v1/models").status_code == 401
        assert httpx.get(f"{base}/v1/models", headers={"Authorization": "Bearer from-a-file"}).status_code == 200
        assert httpx.get(f"{base}/v1/models", headers={"x-api-key": "second-key"}).status_code == 200
        for wrong in ("# a comment", "from-a-file,second-key", "second"):
            assert httpx.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {wrong}"}).status_code == 401
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"], check=True, capture_output=True)
    port = free_port()
    proc = subprocess.Popen(serve_command(tiny_path, "--api-key", "k1,k2", "--ssl-keyfile", str(key), "--ssl-cert-file",
                                          str(cert), "--port", str(port)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        https = f"https://127.0.0.1:{port}"
        assert until(lambda: _answers(f"{https}/health"), 60)
        assert httpx.get(f"{https}/v1/models", verify=False, headers={"Authorization": "Bearer k2"}).status_code == 200
        assert httpx.get(f"{https}/v1/models", verify=False, headers={"Authorization": "Bearer k3"}).status_code == 401
    finally:
        proc.terminate()
        out = proc.communicate(timeout=20)[0]
    assert f"OpenAI API at {https}/v1" in out


def _answers(url) -> bool:
    try:
        return httpx.get(url, verify=False, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_base_models_chat_reply_stops_at_256_tokens_unless_asked(gemma_path):
    """The embedded Gemma 3 270M has no chat template: a chat reply that sets no max_tokens
    stops at 256 tokens (it would rarely end its turn), not the server's --max-tokens; one
    that sets it gets it."""
    with server(gemma_path, "--max-tokens", "400", "--ctx-size", "1024") as base:
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="x")
        kw = dict(model=gemma_path, messages=[{"role": "user", "content": "Tell me a story."}],
                  extra_body={"ignore_eos": True})
        assert c.chat.completions.create(**kw).usage.completion_tokens == 256
        assert c.chat.completions.create(**kw, max_tokens=300).usage.completion_tokens == 300
