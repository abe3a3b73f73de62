"""/openapi.json describes what the server does: schemathesis generates requests from it
(valid and invalid, bounded) against a real server, and every answer must be one the
document lists, in the content type and shape it lists, and never a 5xx."""

from __future__ import annotations

import json

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (content_type_conformance, not_a_server_error, response_schema_conformance,
                                 status_code_conformance)

from gguf_serve.server.app import create_app
from gguf_serve.server.settings import ServerSettings
from server_harness import server


@pytest.fixture(scope="module")
def srv(tiny_path, tmp_path_factory):
    with server(tiny_path, "--max-queue", "4", "--max-tokens", "8", "--lora-runtime", "--slot-save-path",
                str(tmp_path_factory.mktemp("slots"))) as b:
        yield b


@pytest.fixture(scope="module")
def api(srv):
    return schemathesis.openapi.from_url(f"{srv}/openapi.json")


schema = schemathesis.pytest.from_fixture("api")


def test_no_422_and_every_error_in_the_envelope(srv):
    doc = httpx.get(f"{srv}/openapi.json").json()
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert "422" not in op["responses"], (method, path)
            if path.startswith("/v1/chat") or path in ("/v1/completions", "/v1/responses", "/v1/messages"):
                assert set(op["responses"]) == {"200", "400", "401", "403", "404", "408", "413", "429", "499", "500",
                                                "503"}
                assert set(op["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
                envelope = "/AnthropicError" if path == "/v1/messages" else "/ErrorResponse"
                assert op["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith(envelope)
    assert "HTTPValidationError" not in doc["components"]["schemas"]


# The statuses each route's code can return, read from it: the API key (401, every path but
# /health), the body limit (413, /v1/ paths), naming a model (400 none named where several
# are served, 404 unknown), loading it (403 a Hub repository that refuses us, 500 a file
# that stays failed, 503 loading, no room past --load-wait, a transient load failure, the
# Hub not answering), the model's queue (429), unloading one in use (409), a client gone
# before a reply that is not streamed (499), /health while loading (503).
# Every path: 403 from the Host and Origin check (a browser's); every POST: 408, a body too slow.
MODEL = {200, 400, 401, 403, 404, 408, 500, 503}
GENERATING = MODEL | {413, 429, 499}
ROUTE_STATUSES = {
    ("get", "/metrics"): {200, 401, 403},
    ("get", "/health"): {200, 403, 503},
    ("get", "/v1/models"): {200, 401, 403},
    ("get", "/v1/models/{model_id}"): {200, 401, 403, 404},
    ("post", "/models/load"): MODEL,
    ("post", "/models/unload"): {200, 400, 401, 403, 404, 408, 409},
    ("post", "/v1/load_lora_adapter"): MODEL | {501},
    ("post", "/v1/unload_lora_adapter"): MODEL | {409, 501},
    ("post", "/tokenize"): MODEL,
    ("post", "/detokenize"): MODEL,
    ("post", "/v1/chat/completions"): GENERATING,
    ("post", "/v1/completions"): GENERATING,
    ("post", "/v1/responses"): GENERATING,
    ("post", "/v1/messages"): GENERATING,
    ("post", "/v1/audio/transcriptions"): GENERATING,
    ("post", "/v1/messages/count_tokens"): MODEL | {413},
    ("post", "/v1/embeddings"): MODEL | {413, 429},
    ("post", "/v1/rerank"): MODEL | {413, 429},
    ("post", "/embedding"): MODEL | {413, 429},
    # Ollama's API (its own error envelope)
    ("get", "/api/version"): {200, 401, 403},
    ("get", "/api/tags"): {200, 401, 403},
    ("get", "/api/ps"): {200, 401, 403},
    ("post", "/api/show"): MODEL,
    ("post", "/api/chat"): GENERATING,
    ("post", "/api/generate"): GENERATING,
    ("post", "/api/embed"): MODEL | {413, 429},
    ("post", "/api/embeddings"): MODEL | {429},
    ("post", "/api/pull"): MODEL,
    ("delete", "/api/delete"): MODEL | {409},
    # llama-server's own
    ("post", "/completion"): GENERATING,
    ("post", "/infill"): GENERATING,
    ("post", "/apply-template"): MODEL,
    ("get", "/props"): {200, 400, 401, 403, 404},
    ("get", "/slots"): {200, 400, 401, 403, 404, 501, 503},
    ("get", "/lora-adapters"): {200, 400, 401, 403, 404},
    ("post", "/lora-adapters"): {200, 400, 401, 403, 404, 408},
    ("post", "/slots/{id_slot}"): MODEL | {429, 501},
}


def test_every_status_a_route_returns_is_declared():
    """Each route's document lists every status its code can return (the table above),
    and every route in the document is in the table (a new route is added to it)."""
    doc = create_app(ServerSettings(models=[])).openapi()
    routes = {(method, path): {int(s) for s in op["responses"]} for path, ops in doc["paths"].items()
              for method, op in ops.items()}
    assert set(routes) == set(ROUTE_STATUSES)
    for route, statuses in ROUTE_STATUSES.items():
        assert statuses <= routes[route], (route, sorted(statuses - routes[route]))
        for status in routes[route] - {200}:
            assert doc["paths"][route[1]][route[0]]["responses"][str(status)]["description"], (route, status)


@schema.parametrize()
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
def test_the_document_is_what_the_server_does(case):
    case.call_and_validate(checks=[not_a_server_error, status_code_conformance, content_type_conformance,
                                   response_schema_conformance])


FIELDS = {  # request fields by endpoint, for bodies that name the served model
    "/v1/chat/completions": ["messages", "max_tokens", "temperature", "top_p", "logit_bias", "seed", "stop", "n",
                             "stream", "tools", "tool_choice", "response_format", "logprobs", "top_logprobs",
                             "thinking_budget_tokens", "stream_options"],
    "/v1/completions": ["prompt", "max_tokens", "temperature", "logit_bias", "seed", "stop", "n", "stream",
                        "logprobs", "echo", "stream_options"],
    "/v1/responses": ["input", "instructions", "max_output_tokens", "tools", "tool_choice", "text", "reasoning",
                      "stream", "include", "top_logprobs"],
    "/v1/messages": ["messages", "max_tokens", "system", "temperature", "top_p", "top_k", "stop_sequences",
                     "stream", "tools", "tool_choice", "thinking", "metadata", "output_config"],
    "/v1/messages/count_tokens": ["messages", "system", "tools", "tool_choice", "thinking"],
    "/v1/embeddings": ["input", "encoding_format", "dimensions"],
    "/v1/rerank": ["query", "documents", "top_n", "return_documents"],
    "/models/load": ["keep_alive"],
    "/tokenize": ["content", "add_special", "with_pieces"],
    "/detokenize": ["tokens"],
}


def test_random_requests_never_reach_a_5xx(srv, tiny_path):
    """Random bodies (bytes, JSON of any shape, the served model with random fields), bounded
    in number: every answer below 500, every error in OpenAI's envelope, the server healthy."""
    from hypothesis import given, strategies as st

    json_values = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats()
                               | st.text(max_size=20) | st.just("lone \ud800 surrogate"), lambda inner: st.lists(inner, max_size=4)
                               | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
    bodies = st.one_of(
        st.binary(max_size=200).map(lambda b: ("bytes", b)),
        json_values.map(lambda v: ("json", v)),
        st.sampled_from(sorted(FIELDS)).flatmap(lambda path: st.fixed_dictionaries(
            {"model": st.just("tiny-qwen3.gguf")},
            optional={f: json_values for f in FIELDS[path]}).map(lambda d: (path, d))))
    paths = st.sampled_from(sorted(FIELDS))
    seen = {"answers": 0}

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(paths, bodies)
    def probe(path, body):
        kind, payload = body
        if kind in FIELDS:
            path = kind
        with httpx.Client(timeout=60) as c:
            if kind == "bytes":
                r = c.post(f"{srv}{path}", content=payload, headers={"content-type": "application/json"})
            else:  # NaN and Infinity too, which Python's JSON parser accepts
                r = c.post(f"{srv}{path}", content=json.dumps(payload), headers={"content-type": "application/json"})
        seen["answers"] += 1
        assert r.status_code < 500, (path, payload, r.text[:300])
        if r.status_code >= 400:
            body = r.json()
            err = body["error"]
            assert isinstance(err["message"], str) and isinstance(err["type"], str)
            if path.startswith("/v1/messages"):  # Anthropic's envelope
                assert body["type"] == "error" and set(err) == {"type", "message"}
            else:
                assert "param" in err

    probe()
    assert seen["answers"] >= 150
    assert httpx.get(f"{srv}/health", timeout=10).status_code == 200
    r = httpx.post(f"{srv}/v1/completions", json={"model": "tiny-qwen3.gguf", "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1  # still generating


STREAMS = {  # a streamed request per generating path
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0},
    "/v1/completions": {"prompt": "hi", "max_tokens": 3, "temperature": 0},
    "/v1/responses": {"input": "hi", "max_output_tokens": 3, "temperature": 0},
    "/v1/messages": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0},
}


def _events(text: str) -> list[dict]:
    """A text/event-stream body parsed into events as SSE clients (and schemathesis) do."""
    out = []
    for block in text.strip().split("\n\n"):
        event = {"event": "message"}
        for line in block.splitlines():
            field, _, value = line.partition(": ")
            event[field] = event[field] + "\n" + value if field == "data" and "data" in event else value
        out.append(event)
    return out


@pytest.mark.parametrize("path", sorted(STREAMS))
def test_each_streamed_event_has_a_schema_and_fits_it(srv, path):
    """The document gives each stream's per-event schema (not a bare string): every event
    of a real stream fits it, and each event's JSON data fits the schema it names."""
    import jsonschema

    doc = httpx.get(f"{srv}/openapi.json").json()
    event_schema = doc["paths"][path]["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"]
    assert event_schema["type"] == "object" and event_schema["required"] == ["data"]
    data = event_schema["properties"]["data"]
    json_data = next((a for a in data.get("anyOf", [data]) if "contentSchema" in a))  # or [DONE], the last
    data_schema = {**json_data["contentSchema"], "components": doc["components"]}
    r = httpx.post(f"{srv}{path}", json={"model": "tiny-qwen3.gguf", "stream": True, **STREAMS[path]}, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = _events(r.text)
    assert len(events) >= 2  # at least one object, then [DONE] or the closing Responses event
    for e in events:
        jsonschema.validate(e, event_schema)
        if e["data"] != "[DONE]":
            jsonschema.validate(json.loads(e["data"]), data_schema)
