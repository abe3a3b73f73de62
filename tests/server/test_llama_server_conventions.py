"""What llama-server's users and their scripts take for granted, on a real server with a
tiny random model: requests without `model` or naming another model answer with the one
model served (and say which), the routes without /v1, several listen addresses, the
server's own sampling defaults and token limit for every generating endpoint, a chat
template given on the command line, and a generative file served as an embedding one
(--pooling)."""

from __future__ import annotations

import httpx
import pytest

from server_harness import no_end, server

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def one(tiny_path):
    with server(tiny_path, "--ctx-size", "256", "--temp", "0", "--n-predict", "5", "--host", "127.0.0.1,::1") as b:
        yield b


def test_no_model_or_another_name_goes_to_the_one_served(one, tiny_path):
    bias = {"logit_bias": no_end(tiny_path)}
    for body in ({}, {"model": "gpt-3.5-turbo"}, {"model": "tiny-qwen3.gguf"}):
        r = httpx.post(f"{one}/v1/chat/completions", json={"messages": HI, "max_tokens": 2, **bias, **body}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "tiny-qwen3.gguf"
    r = httpx.post(f"{one}/v1/completions", json={"model": "gpt-3.5-turbo-instruct", "prompt": "a", **bias}, timeout=60)
    assert r.status_code == 200 and r.json()["model"] == "tiny-qwen3.gguf"
    r = httpx.post(f"{one}/v1/responses", json={"input": "a", "max_output_tokens": 2, **bias}, timeout=60)
    assert r.status_code == 200 and r.json()["model"] == "tiny-qwen3.gguf"
    # an embedding request to a generative model: the model answers that it does not embed
    r = httpx.post(f"{one}/v1/embeddings", json={"model": "text-embedding-3-small", "input": "a"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "wrong_model_kind"


def test_the_routes_without_v1(one, tiny_path):
    assert [m["id"] for m in httpx.get(f"{one}/models").json()["data"]] == ["tiny-qwen3.gguf"]
    bias = {"logit_bias": no_end(tiny_path)}
    assert httpx.post(f"{one}/chat/completions", json={"messages": HI, "max_tokens": 1, **bias},
                      timeout=60).json()["object"] == "chat.completion"
    assert httpx.post(f"{one}/completions", json={"prompt": "a", "max_tokens": 1, **bias},
                      timeout=60).json()["object"] == "text_completion"
    assert httpx.post(f"{one}/embeddings", json={"input": "a"}, timeout=60).status_code == 400  # routed, refused


def test_several_listen_addresses(one):
    port = one.rsplit(":", 1)[1]
    assert httpx.get(f"http://[::1]:{port}/health", timeout=10).status_code == 200
    assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200


def test_the_servers_sampling_defaults_and_token_limit(one, tiny_path):
    """--temp 0: requests that set no temperature are greedy (the same text each time, the
    text a request asking for temperature 0 gets); one that sets 1.5 samples. --n-predict 5:
    chat, completions and Responses without a limit stop at five tokens."""
    bias = {"logit_bias": no_end(tiny_path)}

    def text(**body):
        r = httpx.post(f"{one}/v1/completions", json={"prompt": "the cat", **bias, **body}, timeout=60).json()
        return r["choices"][0]["text"], r["usage"]["completion_tokens"]
    default, n = text()
    assert n == 5 and text() == (default, 5) and text(temperature=0) == (default, 5)
    assert len({text(temperature=1.5, seed=s)[0] for s in range(4)}) > 1
    chat = httpx.post(f"{one}/v1/chat/completions", json={"messages": HI, **bias}, timeout=60).json()
    assert chat["usage"]["completion_tokens"] == 5
    resp = httpx.post(f"{one}/v1/responses", json={"input": "a", **bias, "reasoning": {"effort": "none"}},
                      timeout=60).json()
    assert resp["usage"]["output_tokens"] == 5


def test_strict_model_names_and_several_models(tiny_path, tools_path):
    with server(tiny_path, "--ctx-size", "256", "--strict-model-names") as b:
        r = httpx.post(f"{b}/v1/chat/completions", json={"model": "gpt-4o", "messages": HI, "max_tokens": 1},
                       timeout=60)
        assert r.status_code == 404
        assert httpx.post(f"{b}/v1/chat/completions", json={"messages": HI, "max_tokens": 1},
                          timeout=60).status_code == 200  # none named: still the one served
    with server(tiny_path, tools_path, "--ctx-size", "256") as b:
        r = httpx.post(f"{b}/v1/chat/completions", json={"messages": HI, "max_tokens": 1}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "model"
        r = httpx.post(f"{b}/v1/chat/completions", json={"model": "gpt-4o", "messages": HI, "max_tokens": 1},
                       timeout=60)
        assert r.status_code == 404


def test_a_chat_template_from_the_command_line(one, tiny_path, tmp_path):
    """--chat-template-file: the prompt is what that template renders (here the bare
    contents: as many tokens as the text alone); --chat-template chatml: a built-in."""
    bare = tmp_path / "bare.jinja"
    bare.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    text = "the cat sat on the mat"
    with server(tiny_path, "--ctx-size", "256", "--chat-template-file", str(bare)) as b:
        n = httpx.post(f"{b}/tokenize", json={"content": text}, timeout=30).json()["tokens"]
        r = httpx.post(f"{b}/v1/chat/completions", json={"messages": [{"role": "user", "content": text}],
                                                         "max_tokens": 1}, timeout=60).json()
        assert r["usage"]["prompt_tokens"] == len(n)
    with server(tiny_path, "--ctx-size", "256", "--chat-template", "chatml") as b:
        r = httpx.post(f"{b}/v1/chat/completions", json={"messages": [{"role": "user", "content": text}],
                                                         "max_tokens": 1}, timeout=60).json()
        chatml = f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
        want = httpx.post(f"{b}/tokenize", json={"content": chatml}, timeout=30).json()["tokens"]
        assert r["usage"]["prompt_tokens"] == len(want) > len(n) + 2
    own = httpx.post(f"{one}/v1/chat/completions", json={"messages": [{"role": "user", "content": text}],
                                                         "max_tokens": 1}, timeout=60).json()
    assert own["usage"]["prompt_tokens"] != len(want)  # the file's own template renders otherwise


def test_pooling_serves_a_generative_file_as_an_embedding_one(tiny_path):
    with server(tiny_path, "--ctx-size", "256", "--pooling", "mean") as b:
        r = httpx.post(f"{b}/v1/embeddings", json={"input": ["the cat", "a dog"]}, timeout=60)
        assert r.status_code == 200, r.text
        vectors = [d["embedding"] for d in r.json()["data"]]
        assert len(vectors) == 2 and len(vectors[0]) > 8 and vectors[0] != vectors[1]
        r = httpx.post(f"{b}/v1/chat/completions", json={"messages": HI, "max_tokens": 1}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["code"] == "wrong_model_kind"


def test_pooling_none_gives_every_tokens_vector_at_slash_embedding(tiny_path):
    with server(tiny_path, "--ctx-size", "256", "--pooling", "none") as b:
        n = len(httpx.post(f"{b}/tokenize", json={"content": "the cat sat"}, timeout=30).json()["tokens"])
        r = httpx.post(f"{b}/embedding", json={"content": ["the cat sat", "a dog"]}, timeout=60)
        assert r.status_code == 200, r.text
        rows = r.json()
        assert [x["index"] for x in rows] == [0, 1] and len(rows[0]["embedding"]) == n
        assert all(abs(sum(v * v for v in row) - 1) < 1e-4 for row in rows[0]["embedding"])  # each token's, L2
        raw = httpx.post(f"{b}/embedding", json={"content": "the cat sat", "embd_normalize": -1}, timeout=60).json()
        assert abs(sum(v * v for v in raw[0]["embedding"][0]) - 1) > 1e-3
        r = httpx.post(f"{b}/v1/embeddings", json={"input": "a"}, timeout=60)
        assert r.status_code == 400 and "/embedding" in r.json()["error"]["message"]
    with server(tiny_path, "--ctx-size", "256", "--pooling", "mean") as b:
        rows = httpx.post(f"{b}/embedding", json={"content": "the cat sat"}, timeout=60).json()
        pooled = httpx.post(f"{b}/v1/embeddings", json={"input": "the cat sat"}, timeout=60).json()
        assert rows[0]["embedding"] == [pytest.approx(pooled["data"][0]["embedding"], abs=1e-5)]
