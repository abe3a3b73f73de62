"""Anthropic's Messages API with the official `anthropic` SDK against a real server: each
reply equals the chat completion of the same conversation (greedy), blocks and all;
streaming as Anthropic's event sequence; thinking with a budget on a thinking template;
tool round trips (forced and auto); stop sequences; images; count_tokens; and every
error in Anthropic's envelope with its SDK exception."""

from __future__ import annotations

import base64
import io
import json
import os
import threading

import anthropic
import httpx
import jsonschema
import numpy as np
import openai
import pytest
from PIL import Image

from server_harness import THINKING_TEMPLATE, TOOL_TEMPLATE, TOOLS, server
from tiny_models import tiny_chat_model
from tiny_vision import tiny_gemma3_vlm

KEY = "secret"
GREEDY = {"temperature": 0}  # the newest SDK has no temperature argument: the server still takes it
CLAUDE_TOOLS = [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
                 "input_schema": t["function"]["parameters"]} for t in TOOLS]
SCHEMAS = {t["name"]: t["input_schema"] for t in CLAUDE_TOOLS}


@pytest.fixture(scope="module")
def folder(tmp_path_factory, gemma_path):
    d = tmp_path_factory.mktemp("messages")
    tiny_chat_model(d, "think.gguf", 5, THINKING_TEMPLATE, think=True)
    tiny_chat_model(d, "tools.gguf", 7, TOOL_TEMPLATE)
    tiny_gemma3_vlm(d, text_mix="Q8_0", vision_ftype="F16")
    os.link(gemma_path, d / "gemma.gguf")
    (d / "broken.gguf").write_bytes(b"GGUF" + bytes(60))
    return d


@pytest.fixture(scope="module")
def base(folder):
    # float32 prompts: a reply compared with the chat reply to the same prompt (from the prefix
    # cache) has its bits (AMX's bfloat16 prompts would not)
    with server(str(folder), "--max-loaded", "4", "--ctx-size", "2048", "--parallel", "1", "--max-queue", "1",
                "--max-body-bytes", "100000", "--prefill-dtype", "float32", env={"GGUF_SERVE_API_KEY": KEY}) as b:
        yield b


@pytest.fixture(scope="module")
def claude(base):
    return anthropic.Anthropic(base_url=base, api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def gpt(base):
    return openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0)


def png(seed: int = 0) -> str:
    a = np.random.default_rng(seed).integers(0, 255, (40, 60, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def as_chat(message) -> dict:
    """An Anthropic reply's blocks as the chat reply's fields."""
    out = {"reasoning": None, "content": None, "calls": []}
    for b in message.content:
        if b.type == "thinking":
            out["reasoning"] = b.thinking
        elif b.type == "text":
            out["content"] = b.text
        elif b.type == "tool_use":
            out["calls"].append((b.name, b.input))
    return out


def chat_fields(r) -> dict:
    m = r.choices[0].message
    return {"reasoning": m.reasoning_content or None, "content": (m.content or "").strip() or None,
            "calls": [(c.function.name, json.loads(c.function.arguments)) for c in m.tool_calls or []]}


@pytest.mark.parametrize("thinking,kwargs,budget", [
    ({"type": "enabled", "budget_tokens": 4}, {"enable_thinking": True}, 4),
    ({"type": "disabled"}, {"enable_thinking": False}, None),
    (None, None, None),  # the server's --reasoning (auto: the template's default, thinking)
])
def test_create_equals_the_chat_reply(claude, gpt, thinking, kwargs, budget):
    extra = {"thinking": thinking} if thinking else {}
    c = gpt.chat.completions.create(model="think.gguf", max_tokens=24, temperature=0,
                                    messages=[{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": "hi there"}],
                                    extra_body={"chat_template_kwargs": kwargs, "thinking_budget_tokens": budget})
    r = claude.messages.create(model="think.gguf", max_tokens=24, extra_body=GREEDY, system="Be brief.",
                               messages=[{"role": "user", "content": "hi there"}], **extra)
    assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_") and r.model == "think.gguf"
    assert as_chat(r) == chat_fields(c)
    assert (r.content[0].type == "thinking") is (thinking is None or thinking["type"] == "enabled")
    assert r.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[c.choices[0].finish_reason]
    assert r.usage.output_tokens == c.usage.completion_tokens
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == c.usage.prompt_tokens
    assert r.usage.cache_read_input_tokens > 0  # the chat's prompt before it: from the prefix cache


def test_stream_is_anthropics_event_sequence_and_folds_to_the_reply(base, claude):
    body = dict(model="think.gguf", max_tokens=30, thinking={"type": "enabled", "budget_tokens": 6},
                messages=[{"role": "user", "content": "tell me"}])
    folded = claude.messages.create(**body, extra_body=GREEDY)
    with claude.messages.stream(**body, extra_body=GREEDY) as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    assert [b.to_dict() for b in final.content] == [b.to_dict() for b in folded.content]
    assert final.stop_reason == folded.stop_reason
    assert final.usage.output_tokens == folded.usage.output_tokens
    with httpx.stream("POST", f"{base}/v1/messages", json={**body, **GREEDY, "stream": True},
                      headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    names = [e["type"] for e in events]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    assert events[0]["message"]["content"] == [] and events[0]["message"]["stop_reason"] is None
    open_block = None
    for e in events[2:-2]:  # blocks one after another: start, deltas, stop
        if e["type"] == "content_block_start":
            assert open_block is None
            open_block = e["index"]
        elif e["type"] == "content_block_delta":
            assert e["index"] == open_block and e["delta"]["type"] in ("thinking_delta", "text_delta")
        else:
            assert e["type"] == "content_block_stop" and e["index"] == open_block
            open_block = None
    assert open_block is None and "content_block_delta" in kinds
    assert events[-2]["delta"]["stop_reason"] == folded.stop_reason
    assert events[-2]["usage"]["output_tokens"] == folded.usage.output_tokens


def test_forced_tool_round_trip(claude, gpt):
    first = claude.messages.create(model="tools.gguf", max_tokens=200, extra_body=GREEDY, tools=CLAUDE_TOOLS,
                                   tool_choice={"type": "tool", "name": "add", "disable_parallel_tool_use": True},
                                   messages=[{"role": "user", "content": "1 + 2"}])
    assert first.stop_reason == "tool_use" and [b.type for b in first.content] == ["tool_use"]
    call = first.content[0]
    assert call.name == "add" and call.id
    jsonschema.validate(call.input, SCHEMAS["add"])
    c = gpt.chat.completions.create(model="tools.gguf", max_tokens=200, temperature=0, tools=TOOLS,
                                    tool_choice={"type": "function", "function": {"name": "add"}},
                                    parallel_tool_calls=False, messages=[{"role": "user", "content": "1 + 2"}])
    assert as_chat(first)["calls"] == chat_fields(c)["calls"] and c.choices[0].finish_reason == "tool_calls"
    with claude.messages.stream(model="tools.gguf", max_tokens=200, extra_body=GREEDY, tools=CLAUDE_TOOLS,
                                tool_choice={"type": "tool", "name": "add", "disable_parallel_tool_use": True},
                                messages=[{"role": "user", "content": "1 + 2"}]) as s:
        deltas = [e for e in s if e.type == "input_json"]
        streamed = s.get_final_message()
    assert len(deltas) > 2 and streamed.content[0].input == call.input  # the input came as generated
    # the same tools render the same prompt through either API: the stream, after the chat
    # completion, found all of it but the last token in the prefix cache
    assert streamed.usage.cache_read_input_tokens == c.usage.prompt_tokens - 1
    history = [{"role": "user", "content": "1 + 2"},
               {"role": "assistant",
                "content": [{"type": "tool_use", "id": call.id, "name": "add", "input": call.input}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "3"},
                                            {"type": "text", "text": "thanks"}]}]
    second = claude.messages.create(model="tools.gguf", max_tokens=8, extra_body=GREEDY, tools=CLAUDE_TOOLS,
                                    messages=history)
    chat_history = [{"role": "user", "content": "1 + 2"},
                    {"role": "assistant", "content": "", "tool_calls": [
                        {"id": call.id, "type": "function",
                         "function": {"name": "add", "arguments": json.dumps(call.input)}}]},
                    {"role": "tool", "tool_call_id": call.id, "content": "3"},
                    {"role": "user", "content": "thanks"}]
    c2 = gpt.chat.completions.create(model="tools.gguf", max_tokens=8, temperature=0, tools=TOOLS,
                                     messages=chat_history)
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens == c2.usage.prompt_tokens
    assert as_chat(second) == chat_fields(c2)
    assert claude.messages.count_tokens(model="tools.gguf", tools=CLAUDE_TOOLS,
                                        messages=history).input_tokens == c2.usage.prompt_tokens


def test_auto_and_any_tool_choice(claude):
    for seed in range(3):
        r = claude.messages.create(model="tools.gguf", max_tokens=200, tools=CLAUDE_TOOLS, extra_body={"seed": seed},
                                   tool_choice={"type": "auto"}, messages=[{"role": "user", "content": "weather?"}])
        assert r.stop_reason in ("end_turn", "max_tokens", "tool_use")
        for b in r.content:
            if b.type == "tool_use":
                jsonschema.validate(b.input, SCHEMAS[b.name])
        r = claude.messages.create(model="tools.gguf", max_tokens=200, tools=CLAUDE_TOOLS, extra_body={"seed": seed},
                                   tool_choice={"type": "any", "disable_parallel_tool_use": True},
                                   messages=[{"role": "user", "content": "weather?"}])
        assert r.stop_reason == "tool_use" and [b.type for b in r.content] == ["tool_use"]
        jsonschema.validate(r.content[0].input, SCHEMAS[r.content[0].name])
    r = claude.messages.create(model="tools.gguf", max_tokens=4, tools=CLAUDE_TOOLS, tool_choice={"type": "none"},
                               messages=[{"role": "user", "content": "weather?"}])
    assert all(b.type == "text" for b in r.content)


def test_thinking_blocks_sent_back_are_rendered_as_the_template_wants(claude, gpt):
    turns = [{"role": "user", "content": "hi"},
             {"role": "assistant", "content": [{"type": "thinking", "thinking": "they greet me", "signature": "x"},
                                               {"type": "text", "text": "Hello!"}]},
             {"role": "user", "content": "again"}]
    with_thinking = claude.messages.count_tokens(model="think.gguf", messages=turns).input_tokens
    without = claude.messages.count_tokens(model="think.gguf", messages=[
        turns[0], {"role": "assistant", "content": "Hello!"}, turns[2]]).input_tokens
    c = gpt.chat.completions.create(model="think.gguf", max_tokens=1, messages=[
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello!", "reasoning_content": "they greet me"},
        {"role": "user", "content": "again"}])
    assert with_thinking == c.usage.prompt_tokens > without  # the template writes the reasoning back


def test_stop_sequences_and_prefill(claude):
    plain = claude.messages.create(model="gemma.gguf", max_tokens=24, extra_body=GREEDY,
                                   messages=[{"role": "user", "content": "Count: one, two,"}])
    text = plain.content[0].text
    stop = text[len(text) // 2:len(text) // 2 + 3]
    assert stop.strip() and text.find(stop) > 0
    r = claude.messages.create(model="gemma.gguf", max_tokens=24, extra_body=GREEDY, stop_sequences=["@@@", stop],
                               messages=[{"role": "user", "content": "Count: one, two,"}])
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop
    assert r.content[0].text == text[:text.find(stop)].lstrip()
    # a final assistant message is a prefill: the reply goes on from it
    prefilled = claude.messages.create(model="gemma.gguf", max_tokens=8, extra_body=GREEDY, messages=[
        {"role": "user", "content": "Count: one, two,"}, {"role": "assistant", "content": text[:10]}])
    assert prefilled.content and (text[:10] + prefilled.content[0].text).startswith(text[:12].rstrip())


def test_an_image_block_is_the_chat_image(claude, gpt):
    data = png(3)
    r = claude.messages.create(model="tiny-gemma3-vl.gguf", max_tokens=6, extra_body=GREEDY, messages=[
        {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                  "data": data}},
                                     {"type": "text", "text": "what is it?"}]}])
    c = gpt.chat.completions.create(model="tiny-gemma3-vl.gguf", max_tokens=6, temperature=0, messages=[
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}},
                                     {"type": "text", "text": "what is it?"}]}])
    assert as_chat(r) == chat_fields(c)
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == c.usage.prompt_tokens > 16  # the image's tokens
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.create(model="tiny-gemma3-vl.gguf", max_tokens=2, messages=[
            {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "image", "source": {
                "type": "base64", "media_type": "image/png", "data": "bm90IGFuIGltYWdl"}}]}])
    assert "messages.0.content.1" in bad.value.message


def _error(exc) -> dict:
    assert exc.body["type"] == "error" and set(exc.body["error"]) == {"type", "message"}
    return exc.body["error"]


def test_every_error_in_anthropics_envelope(base, claude, folder):
    ok = dict(model="think.gguf", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(**{**ok, "max_tokens": 0})
    assert _error(e.value)["type"] == "invalid_request_error" and "max_tokens" in e.value.message
    r = httpx.post(f"{base}/v1/messages", headers={"x-api-key": KEY},
                   json={"model": "think.gguf", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]  # required, as Anthropic has it
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(**{**ok, "messages": [{"role": "user",
                                                      "content": [{"type": "document", "source": {}}]}]})
    assert "messages.0.content.0" in e.value.message
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(**ok, tools=[{"type": "web_search_20250305", "name": "web_search"}])
    assert "server tools" in e.value.message
    with pytest.raises(anthropic.AuthenticationError) as e:
        anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0).messages.create(**ok)
    assert _error(e.value)["type"] == "authentication_error"
    assert anthropic.Anthropic(base_url=base, auth_token=KEY, max_retries=0).messages.create(**ok).content is not None
    with pytest.raises(anthropic.NotFoundError) as e:
        claude.messages.create(**{**ok, "model": "nope.gguf"})
    assert _error(e.value)["type"] == "not_found_error"
    with pytest.raises(anthropic.ContentTooLargeError) as e:
        claude.messages.create(**{**ok, "system": "x" * 120_000})
    assert _error(e.value)["type"] == "request_too_large"
    with pytest.raises(anthropic.InternalServerError) as e:
        claude.messages.create(**{**ok, "model": "broken.gguf"})
    assert e.value.status_code == 500 and _error(e.value)["type"] == "api_error"
    # --parallel 1 --max-queue 1: one running, one waiting, the third refused
    long = dict(model="gemma.gguf", max_tokens=300, ignore_eos=True, messages=[{"role": "user", "content": "go"}])
    codes = []

    def call():
        r = httpx.post(f"{base}/v1/messages", json=long, headers={"x-api-key": KEY}, timeout=120)
        codes.append((r.status_code, r.json()))

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    refused = [body for status, body in codes if status == 429]
    assert refused and refused[0]["error"]["type"] == "rate_limit_error"
    assert 200 in [status for status, _ in codes]
    assert claude.messages.create(**ok).content is not None  # and the server serves on


def test_a_model_busy_past_the_wait_is_overloaded(folder):
    with server(str(folder), "--max-loaded", "1", "--load-wait", "1", "--ctx-size", "512", "--parallel", "1") as base:
        claude = anthropic.Anthropic(base_url=base, api_key="x", max_retries=0)
        with claude.messages.stream(model="gemma.gguf", max_tokens=300, messages=[{"role": "user", "content": "go"}],
                                    extra_body={"ignore_eos": True}) as s:
            next(iter(s))
            with pytest.raises(anthropic.ServiceUnavailableError) as e:
                claude.messages.create(model="think.gguf", max_tokens=2, messages=[{"role": "user", "content": "x"}])
            assert _error(e.value)["type"] == "overloaded_error" and "--load-wait" in e.value.message
            assert e.value.response.headers["retry-after"] == "5"
            assert s.get_final_message().stop_reason == "max_tokens"


def test_what_claude_code_sends(base, gpt):
    """Claude Code's requests (`claude -p`, recorded): `?beta=true`, its beta headers, a
    system message in the middle of the conversation (read at its place, in the user turn:
    templates allow a system message only first), max_tokens 32000 over the context (a
    cap: cut to the context left, as llama-server does), adaptive thinking, effort,
    context_management, cache_control."""
    body = {"model": "think.gguf", "max_tokens": 32000, "thinking": {"type": "adaptive"},
            "output_config": {"effort": "high"}, "context_management": {"edits": [{"type": "clear_thinking_20251015"}]},
            "system": [{"type": "text", "text": "You are a CLI.", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi",
                                                        "cache_control": {"type": "ephemeral"}}]},
                         {"role": "system", "content": "Agents: none."}],
            "metadata": {"user_id": '{"session_id": "x"}'}, "temperature": 0}
    r = httpx.post(f"{base}/v1/messages?beta=true", json=body, timeout=60,
                   headers={"x-api-key": KEY, "anthropic-version": "2023-06-01",
                            "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14"})
    assert r.status_code == 200, r.text
    reply = r.json()
    c = gpt.chat.completions.create(model="think.gguf", temperature=0, max_tokens=reply["usage"]["output_tokens"],
                                    reasoning_effort="high", messages=[
                                        {"role": "system", "content": "You are a CLI."},
                                        {"role": "user", "content": [{"type": "text", "text": "hi"},
                                                                     {"type": "text", "text": "Agents: none."}]}])
    assert reply["usage"]["input_tokens"] + reply["usage"]["cache_read_input_tokens"] == c.usage.prompt_tokens
    used = reply["usage"]["input_tokens"] + reply["usage"]["cache_read_input_tokens"] + reply["usage"]["output_tokens"]
    assert used == 2048 if reply["stop_reason"] == "max_tokens" else used < 2048  # --ctx-size 2048: cut there


def test_claude_codes_billing_line_does_not_defeat_the_prefix_cache(claude):
    """Claude Code's first system block, `x-anthropic-billing-header: ...; cch=...;`, changes on
    every request: left in, every turn would prefill the whole conversation again. Taken out,
    the second turn reads the first one's prompt from the cache."""
    system = "You are a careful assistant who answers briefly. " * 12

    def turn(cch, messages):
        return claude.messages.create(model="tools.gguf", max_tokens=4, messages=messages, extra_body=GREEDY,
                                      system=[{"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.90."
                                                                       f"ab1; cc_entrypoint=cli; cch={cch};"},
                                              {"type": "text", "text": system}])

    first = [{"role": "user", "content": "hello there"}]
    one = turn("3f2a1", first)
    two = turn("9bc07", first + [{"role": "assistant", "content": one.content[0].text},
                                 {"role": "user", "content": "and again"}])
    assert one.usage.input_tokens > 100
    assert two.usage.cache_read_input_tokens >= one.usage.input_tokens - 8  # all but the first turn's reply header
