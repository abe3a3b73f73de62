"""Ollama's API on the same port, through the official `ollama` Python client and
LangChain's ChatOllama, on tiny random models: the model list, show, ps, chat (plain,
streamed, with tools, with images), generate, embed, pull and delete; and the probe
sequence VS Code's Copilot runs before it chats over /v1 with a name from /api/tags."""

from __future__ import annotations

import base64
import json

import httpx
import ollama
import pytest
from langchain_ollama import ChatOllama

from server_harness import no_end, server
from tiny_models import tiny_embedding_model
from tiny_vision import data_url, tiny_gemma3_vlm

ADD = {"type": "function", "function": {"name": "add", "description": "Add two numbers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"], "additionalProperties": False}}}
OFF = {"num_predict": 4, "temperature": 0}


@pytest.fixture(scope="module")
def base(tiny_path, tools_path):
    with server(tiny_path, tools_path, "--ctx-size", "1024") as b:
        yield b


@pytest.fixture(scope="module")
def client(base):
    return ollama.Client(host=base)


def test_the_model_list_show_and_version(client, base):
    names = [m.model for m in client.list().models]
    assert names == ["tiny-qwen3.gguf:latest", "tiny-tools.gguf:latest"]
    m = client.list().models[1]
    assert m.details.format == "gguf" and m.details.family == "qwen3" and m.size > 0 and len(m.digest) == 64
    shown = client.show("tiny-tools.gguf:latest")
    assert shown.modelinfo["general.architecture"] == "qwen3" and shown.modelinfo["general.parameter_count"] > 0
    assert "tools" in shown.capabilities and "completion" in shown.capabilities and shown.template
    assert "thinking" in client.show("tiny-qwen3.gguf").capabilities
    version = tuple(int(p) for p in httpx.get(f"{base}/api/version").json()["version"].split("."))
    assert version >= (0, 6, 4)
    with pytest.raises(ollama.ResponseError) as e:
        client.show("llama3.2")
    assert e.value.status_code == 404 and "llama3.2" in e.value.error


def test_chat_plain_and_streamed(client):
    r = client.chat(model="tiny-qwen3.gguf", messages=[{"role": "user", "content": "hi"}], options=OFF, think=False)
    assert r.done and r.done_reason in ("stop", "length") and isinstance(r.message.content, str)
    assert 1 <= r.eval_count <= 4 and r.prompt_eval_count > 0 and r.total_duration > 0
    chunks = list(client.chat(model="tiny-qwen3.gguf", messages=[{"role": "user", "content": "hi"}], options=OFF,
                              think=False, stream=True))
    assert chunks[-1].done and not any(c.done for c in chunks[:-1])
    assert "".join(c.message.content for c in chunks) == r.message.content  # greedy: the same text
    thinking = client.chat(model="tiny-qwen3.gguf", messages=[{"role": "user", "content": "hi"}],
                           options={"num_predict": 6, "temperature": 0}, think=True)
    assert thinking.message.thinking  # the reasoning apart from the answer


def test_tools_reach_the_prompt_and_calls_come_back_in_ollamas_shape(client, base, tools_path):
    msgs = [{"role": "user", "content": "1 + 2"}]
    plain = client.chat(model="tiny-tools.gguf", messages=msgs, options={"num_predict": 1})
    with_tools = client.chat(model="tiny-tools.gguf", messages=msgs, tools=[ADD], options={"num_predict": 1})
    assert with_tools.prompt_eval_count > plain.prompt_eval_count + 10
    # a call (forced with the tool_choice extension: Ollama has no way to ask for one), as NDJSON
    # lines the client's own types read
    with httpx.stream("POST", f"{base}/api/chat", timeout=120, json={
            "model": "tiny-tools.gguf", "messages": msgs, "tools": [ADD], "tool_choice": "required",
            "options": {"num_predict": 200, "seed": 3}}) as r:  # seeded: a sampled call that ends
        lines = [ollama.ChatResponse.model_validate(json.loads(line)) for line in r.iter_lines() if line]
    calls = [c for line in lines for c in (line.message.tool_calls or [])]
    assert calls and calls[0].function.name == "add" and set(calls[0].function.arguments) == {"a", "b"}
    # the call and its result go back as Ollama sends them: the next prompt holds both
    history = msgs + [{"role": "assistant", "content": "", "tool_calls": [{"function": {
        "name": "add", "arguments": calls[0].function.arguments}}]}, {"role": "tool", "content": "3", "tool_name": "add"}]
    again = client.chat(model="tiny-tools.gguf", messages=history, tools=[ADD], options={"num_predict": 1})
    assert again.prompt_eval_count > with_tools.prompt_eval_count + 10


def test_generate_raw_streamed_and_a_load(client):
    r = client.generate(model="tiny-qwen3.gguf", prompt="the cat", options=OFF, think=False)
    assert r.done and isinstance(r.response, str) and 1 <= r.eval_count <= 4
    raw = client.generate(model="tiny-qwen3.gguf", prompt="the cat", raw=True, options=OFF)
    assert raw.prompt_eval_count < r.prompt_eval_count  # no chat template around it
    chunks = list(client.generate(model="tiny-qwen3.gguf", prompt="the cat", raw=True, options=OFF, stream=True))
    assert "".join(c.response for c in chunks) == raw.response and chunks[-1].done
    assert client.generate(model="tiny-qwen3.gguf", prompt="").done_reason == "load"


def test_ps_pull_and_delete(client):
    client.chat(model="tiny-tools.gguf", messages=[{"role": "user", "content": "x"}], options={"num_predict": 1})
    loaded = {m.model: m for m in client.ps().models}
    assert "tiny-tools.gguf:latest" in loaded and loaded["tiny-tools.gguf:latest"].context_length == 1024
    assert client.pull("tiny-tools.gguf").status == "success"
    with pytest.raises(ollama.ResponseError) as e:
        client.pull("llama3.2:latest")
    assert e.value.status_code == 404
    client.delete("tiny-tools.gguf")  # unloaded; still listed, loaded again on its next request
    assert "tiny-tools.gguf:latest" not in {m.model for m in client.ps().models}
    assert "tiny-tools.gguf:latest" in {m.model for m in client.list().models}


def test_a_bad_request_is_ollamas_error(base):
    r = httpx.post(f"{base}/api/chat", json={"model": "tiny-qwen3.gguf", "messages": [{"role": "user"}],
                                             "format": 7})
    assert r.status_code == 400 and set(r.json()) == {"error"}


def test_langchains_chat_ollama(base):
    llm = ChatOllama(model="tiny-tools.gguf", base_url=base, num_predict=4, temperature=0)
    reply = llm.invoke("hello")
    assert isinstance(reply.content, str) and reply.usage_metadata["output_tokens"] <= 4
    chunks = list(llm.stream("hello"))
    assert "".join(c.content for c in chunks) == reply.content
    bound = llm.bind_tools([ADD]).invoke("add 1 and 2")
    assert isinstance(bound.content, str)


def test_copilots_probe_then_chat_over_v1(base, tools_path):
    """VS Code's Copilot: /api/version, /api/tags, /api/show of each model (it keeps those
    whose capabilities hold "tools"), then /v1/chat/completions naming the model as
    /api/tags does."""
    assert httpx.get(f"{base}/api/version").status_code == 200
    names = [m["name"] for m in httpx.get(f"{base}/api/tags").json()["models"]]
    usable = [n for n in names if "tools" in httpx.post(f"{base}/api/show", json={"model": n}).json()["capabilities"]]
    assert usable == ["tiny-tools.gguf:latest"]
    r = httpx.post(f"{base}/v1/chat/completions", timeout=60, json={
        "model": usable[0], "messages": [{"role": "user", "content": "hi"}], "tools": [ADD], "max_tokens": 2,
        "logit_bias": no_end(tools_path)})
    assert r.status_code == 200 and r.json()["model"] == "tiny-tools.gguf"


def test_images(tmp_path_factory):
    vlm = tiny_gemma3_vlm(tmp_path_factory.mktemp("vlm"), text_mix="Q8_0", vision_ftype="F16")
    with server(vlm.text_path, "--ctx-size", "1024") as b:
        c = ollama.Client(host=b)
        png = base64.b64decode(data_url(1).split(",", 1)[1])
        text = c.chat(model="tiny-gemma3-vl.gguf", messages=[{"role": "user", "content": "look"}],
                      options={"num_predict": 1})
        seen = c.chat(model="tiny-gemma3-vl.gguf", messages=[{"role": "user", "content": "look", "images": [png]}],
                      options={"num_predict": 1})
        assert seen.prompt_eval_count >= text.prompt_eval_count + vlm.n_tokens
        assert "vision" in c.show("tiny-gemma3-vl.gguf").capabilities


def test_embed(tmp_path):
    path, _ = tiny_embedding_model(tmp_path, "emb.gguf", "qwen3-embedding")
    with server(str(path), "--ctx-size", "256") as b:
        c = ollama.Client(host=b)
        out = c.embed(model="emb.gguf", input=["the cat", "a dog"])
        assert len(out.embeddings) == 2 and out.prompt_eval_count > 0
        assert abs(sum(v * v for v in out.embeddings[0]) - 1) < 1e-4
        one = c.embeddings(model="emb.gguf", prompt="the cat")
        assert one.embedding == pytest.approx(out.embeddings[0], abs=1e-5)
        assert c.show("emb.gguf").capabilities == ["embedding"]


def test_generate_context_carries_the_conversation(client):
    """/api/generate gives back `context` (the prompt's and the reply's tokens); sent with
    the next prompt, it comes before that turn, which Ollama's older clients rely on."""
    first = client.generate(model="tiny-qwen3.gguf", prompt="the cat", options=OFF, think=False)
    ended = first.done_reason == "stop"  # an end-of-generation token: counted, not the reply's
    assert len(first.context) == first.prompt_eval_count + first.eval_count - ended
    second = client.generate(model="tiny-qwen3.gguf", prompt="and then", context=first.context, options=OFF,
                             think=False)
    assert second.prompt_eval_count > len(first.context) and list(second.context[:len(first.context)]) == \
        list(first.context)
    raw = client.generate(model="tiny-qwen3.gguf", prompt=" more", raw=True, context=first.context, options=OFF)
    assert raw.prompt_eval_count > len(first.context)  # the context, then " more" with no template
