"""POST /v1/responses through the official openai client (`responses.create`,
`responses.stream`, `responses.parse`) on tiny random models: the thinking model
(reasoning items), the Hermes tool template and the Qwen3.5-style XML one (function
calls forced by `tool_choice`, so valid only through the grammar), and what a stateless
server must refuse."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from server_harness import ids, no_end, server

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": False}, "strict": True}
ADD = {"type": "function", "name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 999},
                                     "b": {"type": "integer", "minimum": 0, "maximum": 999}},
    "required": ["a", "b"], "additionalProperties": False}}
TOOLS = [WEATHER, ADD]
PARAMS = {t["name"]: t["parameters"] for t in TOOLS}
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


class Pet(BaseModel):
    name: str = Field(max_length=8)
    legs: int = Field(ge=0, le=8)
    kind: Literal["cat", "dog"]


@pytest.fixture(scope="module")
def base(tiny_path, tools_path, xml_tools_path):
    with server(tiny_path, tools_path, xml_tools_path, "--ctx-size", "2048") as b:
        yield b


@pytest.fixture
def client(base):
    return openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)


def test_a_string_input_gives_reasoning_then_a_message(client, tiny_path):
    never_closes = no_end(tiny_path, **{str(ids(tiny_path)["</think>"]): -100})
    r = client.responses.create(model="tiny-qwen3.gguf", input="hello", instructions="Be brief.",
                                max_output_tokens=6, extra_body={"logit_bias": never_closes})
    # thinking is on by default in this template: six tokens of reasoning, cut short (the
    # bias keeps the random model from closing the block by chance)
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "incomplete"
    assert r.incomplete_details.reason == "max_output_tokens"
    assert [o.type for o in r.output] == ["reasoning"] and r.output[0].id.startswith("rs_")
    assert r.output[0].content[0].text and r.output_text == ""
    assert r.usage.output_tokens == 6 and r.usage.output_tokens_details.reasoning_tokens == 6
    assert r.instructions == "Be brief." and r.store is False
    r = client.responses.create(model="tiny-qwen3.gguf", input=[{"role": "user", "content": "hello"}],
                                reasoning={"effort": "none"}, max_output_tokens=6,
                                extra_body={"logit_bias": no_end(tiny_path, **{str(ids(tiny_path)["<think>"]): -100})})
    # (no <think> of its own: the random model would open a reasoning block one time in 320; and
    # its six tokens are text even where they are bytes of no whole character, sent as U+FFFD)
    assert [o.type for o in r.output] == ["message"] and r.output[0].role == "assistant"
    assert r.output_text and r.output[0].content[0].type == "output_text"
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.usage.input_tokens > 0 and r.usage.total_tokens == r.usage.input_tokens + 6


def test_the_stream_is_the_reply_event_by_event(client, tiny_path):
    bias = no_end(tiny_path, **{str(ids(tiny_path)["</think>"]): 6})
    kwargs = dict(model="tiny-qwen3.gguf", input="hi", max_output_tokens=12, extra_body={"logit_bias": bias, "seed": 3})
    with client.responses.stream(**kwargs) as stream:
        events = list(stream)
    final = events[-1].response  # incomplete (max_output_tokens): the SDK's get_final_response wants completed
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[1].type == "response.in_progress"
    assert events[-1].type in ("response.completed", "response.incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    kinds = [o.type for o in final.output]
    assert kinds == ["reasoning", "message"]  # the bias on </think> closes the block within 12 tokens
    assert final.output_text == text and final.output[0].content[0].text == reasoning
    added = [e.item.id for e in events if e.type == "response.output_item.added"]
    done = [e.item.id for e in events if e.type == "response.output_item.done"]
    assert added == done == [o.id for o in final.output]
    same = client.responses.create(**kwargs)  # not streamed, same seed: the same reply
    assert same.output_text == final.output_text and same.output[0].content[0].text == reasoning


@pytest.mark.parametrize("model", ["tiny-tools.gguf", "tiny-xml-tools.gguf"])
def test_a_required_function_call_then_its_output(client, model):
    r = client.responses.create(model=model, input="weather in Paris?", tools=TOOLS, tool_choice="required",
                                parallel_tool_calls=False, max_output_tokens=300, extra_body=NO_THINK)
    calls = [o for o in r.output if o.type == "function_call"]
    assert r.status == "completed" and len(calls) == 1 and r.output_text == ""
    call = calls[0]
    assert call.id.startswith("fc_") and call.call_id.startswith("call_") and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), PARAMS[call.name])
    # the call and its output go back as items; the next turn's prompt holds both
    items = [{"role": "user", "content": "weather in Paris?"}, call.model_dump(exclude_none=True),
             {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 degrees"}]
    again = client.responses.create(model=model, input=items, tools=TOOLS, max_output_tokens=3, extra_body=NO_THINK)
    assert again.usage.input_tokens > r.usage.input_tokens + 10
    named = client.responses.create(model=model, input="1 + 2", tools=TOOLS, max_output_tokens=300,
                                    tool_choice={"type": "function", "name": "add"}, extra_body=NO_THINK)
    calls = [o for o in named.output if o.type == "function_call"]
    assert calls and all(c.name == "add" for c in calls)
    for c in calls:
        jsonschema.validate(json.loads(c.arguments), PARAMS["add"])


def test_streamed_arguments_come_in_fragments(client):
    with client.responses.stream(model="tiny-tools.gguf", input="add", tools=TOOLS, parallel_tool_calls=False,
                                 tool_choice={"type": "function", "name": "add"}, max_output_tokens=300) as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(deltas) > 3 and len(done) == 1 and "".join(deltas) == done[0].arguments
    jsonschema.validate(json.loads(done[0].arguments), PARAMS["add"])
    added = next(e for e in events if e.type == "response.output_item.added")
    assert added.item.type == "function_call" and added.item.name == "add"  # the name before the arguments
    assert [o.type for o in final.output] == ["function_call"] and final.output[0].arguments == done[0].arguments


@pytest.mark.parametrize("stream", [False, True])
def test_parse_gives_the_schema(client, tiny_path, stream):
    kwargs = dict(model="tiny-qwen3.gguf", input="a pet", text_format=Pet, max_output_tokens=200,
                  extra_body={**NO_THINK, "seed": 1})
    if stream:
        with client.responses.stream(**kwargs) as s:
            r = s.get_final_response()
    else:
        r = client.responses.parse(**kwargs)
    assert isinstance(r.output_parsed, Pet)
    jsonschema.validate(json.loads(r.output_text), Pet.model_json_schema())
    # with thinking on, the JSON follows the reasoning (which cannot end the reply)
    bias = {str(ids(tiny_path)["</think>"]): 3}
    r = client.responses.parse(model="tiny-qwen3.gguf", input="a pet", text_format=Pet, max_output_tokens=300,
                               extra_body={"logit_bias": bias, "seed": 4})
    assert r.status == "completed" and [o.type for o in r.output] == ["reasoning", "message"]
    assert isinstance(r.output_parsed, Pet)


def test_logprobs_on_the_answer(client, tiny_path):
    r = client.responses.create(model="tiny-qwen3.gguf", input="hi", max_output_tokens=5, top_logprobs=2,
                                include=["message.output_text.logprobs"],
                                extra_body={**NO_THINK, "logit_bias": no_end(tiny_path)})
    part = r.output[0].content[0]
    assert len(part.logprobs) == 5  # one per token, leading whitespace (not in the text) included
    assert all(len(lp.top_logprobs) == 2 and lp.logprob <= 0 for lp in part.logprobs)


@pytest.mark.parametrize("body,param", [
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "x", "conversation": "conv_1"}, "conversation"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input.0"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
     "input.0.content.0"),
    ({"input": [{"type": "message_of_another_kind", "id": "x"}]}, "input.0.type"),
    ({"input": "x", "tools": ["web_search"]}, "tools.0"),
    ({"input": "x", "tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "x", "schema": "{"}}}, "text.format"),
    ({"input": []}, "input"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input.0.role"),
    ({"input": "x", "truncation": "auto"}, "truncation"),
])
def test_what_a_stateless_server_refuses(base, body, param):
    for stream in (False, True):
        r = httpx.post(f"{base}/v1/responses", json={"model": "tiny-tools.gguf", "stream": stream, **body}, timeout=30)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param


def test_a_long_input_is_refused_before_the_stream(base):
    r = httpx.post(f"{base}/v1/responses", json={"model": "tiny-tools.gguf", "input": "word " * 3000,
                                                 "stream": True}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert r.json()["error"]["param"] == "input"


def test_a_thinking_budget_closes_the_block_and_the_answer_follows(client, base, tiny_path):
    t = ids(tiny_path)
    # left alone, it would think to the end; nor may it open a block again or write markup
    # that renders as nothing, so the answer after the budget is never empty by chance
    never_closes = no_end(tiny_path, **{str(t[m]): -100 for m in ("</think>", "<think>", "<|im_start|>")})
    r = client.chat.completions.create(model="tiny-qwen3.gguf", messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=20, logit_bias=never_closes,
                                       extra_body={"thinking_budget_tokens": 5, "seed": 2})
    m = r.choices[0].message
    assert r.usage.completion_tokens == 20 and r.usage.completion_tokens_details.reasoning_tokens == 6  # and </think>
    assert m.reasoning_content and m.content and r.choices[0].finish_reason == "length"
    r = client.responses.create(model="tiny-qwen3.gguf", input="hi", max_output_tokens=20,
                                reasoning={"effort": "low", "max_tokens": 3},
                                extra_body={"logit_bias": never_closes, "seed": 2})
    assert [o.type for o in r.output] == ["reasoning", "message"] and r.usage.output_tokens_details.reasoning_tokens == 4
    p = client.responses.parse(model="tiny-qwen3.gguf", input="a pet", text_format=Pet, max_output_tokens=200,
                               reasoning={"max_tokens": 8}, extra_body={"logit_bias": never_closes, "seed": 1})
    assert isinstance(p.output_parsed, Pet) and p.output[0].type == "reasoning"  # JSON once the budget closed it
    bad = httpx.post(f"{base}/v1/chat/completions", json={"model": "tiny-qwen3.gguf", "thinking_budget_tokens": -1,
                                                           "messages": [{"role": "user", "content": "x"}]})
    assert bad.status_code == 400


def test_the_servers_default_budget(tiny_path):
    never_closes = no_end(tiny_path, **{str(ids(tiny_path)["</think>"]): -100})
    with server(tiny_path, "--reasoning-budget", "2", "--ctx-size", "1024") as b:
        c = openai.OpenAI(base_url=f"{b}/v1", api_key="x", max_retries=0)
        r = c.chat.completions.create(model="tiny-qwen3.gguf", messages=[{"role": "user", "content": "hi"}],
                                      max_tokens=8, logit_bias=never_closes)
        assert r.usage.completion_tokens_details.reasoning_tokens == 3 and r.choices[0].message.content
        r = c.chat.completions.create(model="tiny-qwen3.gguf", messages=[{"role": "user", "content": "hi"}],
                                      max_tokens=8, logit_bias=never_closes, extra_body={"thinking_budget_tokens": 6})
        assert r.usage.completion_tokens_details.reasoning_tokens == 7  # the request's own budget wins


def test_a_call_cut_off_by_max_output_tokens_is_incomplete(client):
    kwargs = dict(model="tiny-tools.gguf", input="weather?", tools=TOOLS, tool_choice="required",
                  parallel_tool_calls=False, max_output_tokens=45, extra_body={"seed": 1})  # the name is out
    with client.responses.stream(**kwargs) as stream:
        events = list(stream)
    final = events[-1].response
    assert final.status == "incomplete"
    assert [o.type for o in final.output] == ["function_call"]  # its markup is not a message
    assert final.output[0].status == "incomplete" and final.output[0].arguments.startswith("{")
    added = [e.item.id for e in events if e.type == "response.output_item.added"]
    done = [e.item.id for e in events if e.type == "response.output_item.done"]
    assert sorted(added) == sorted(done)  # every item the stream opened, it closed


CODEX = json.loads((Path(__file__).parent / "codex_request.json").read_text())


@pytest.fixture(scope="module")
def roomy(tools_path):
    with server(tools_path, "--ctx-size", "16384") as b:  # Codex's tools are ~7k of the tiny model's tokens
        yield b


def test_codexs_first_request_runs(roomy):
    """Codex CLI's first request of a turn as it sent it (0.171.0, `codex exec`; its long
    texts shortened): a namespace of sub-agent tools, a hosted web_search, reasoning
    summaries, store false, encrypted reasoning asked for, a prompt cache key, client
    metadata. The namespace's tools reach the prompt, web_search does not, and the stream
    runs to its end."""
    body = dict(CODEX, model="tiny-tools.gguf", max_output_tokens=8)
    assert {t["type"] for t in body["tools"]} == {"function", "namespace", "web_search"}
    with httpx.stream("POST", f"{roomy}/v1/responses", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1]["type"] in ("response.completed", "response.incomplete")

    def input_tokens(tools):
        r = httpx.post(f"{roomy}/v1/responses", json=dict(body, tools=tools, stream=False, max_output_tokens=1),
                       timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["usage"]["input_tokens"]
    full = input_tokens(body["tools"])
    assert input_tokens([t for t in body["tools"] if t["type"] != "web_search"]) == full  # left out either way
    assert input_tokens([t for t in body["tools"] if t["type"] != "namespace"]) < full - 50  # its five tools


def test_namespace_and_custom_tools_come_back_as_the_client_named_them(roomy):
    """A call to a namespace's tool comes back under its own name with the namespace (as
    OpenAI's API gives it to Codex); a custom (free-text) tool's call as a custom_tool_call
    with its input; both go back as input items and reach the next prompt."""
    client = openai.OpenAI(base_url=f"{roomy}/v1", api_key="x", max_retries=0)
    spawn = next(t for t in CODEX["tools"] if t["type"] == "namespace")
    patch = {"type": "custom", "name": "apply_patch", "description": "Apply a patch",
             "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}
    r = client.responses.create(model="tiny-tools.gguf", input="spawn one", tools=[spawn, patch, ADD],
                                tool_choice={"type": "function", "name": "spawn_agent", "namespace": "multi_agent_v1"},
                                parallel_tool_calls=False, max_output_tokens=300, temperature=0,
                                extra_body=NO_THINK)  # greedy: a sampled random model's strings can outrun 300 tokens
    call = next(o for o in r.output if o.type == "function_call").model_dump(exclude_none=True)
    assert call["name"] == "spawn_agent" and call["namespace"] == "multi_agent_v1"
    json.loads(call["arguments"])
    r = client.responses.create(model="tiny-tools.gguf", input="patch it", tools=[spawn, patch],
                                tool_choice={"type": "custom", "name": "apply_patch"}, parallel_tool_calls=False,
                                max_output_tokens=300, extra_body=NO_THINK)
    custom = next(o for o in r.output if o.type == "custom_tool_call").model_dump(exclude_none=True)
    assert custom["name"] == "apply_patch" and isinstance(custom["input"], str) and custom["call_id"].startswith("call_")
    items = [{"role": "user", "content": "go"}, call,
             {"type": "function_call_output", "call_id": call["call_id"], "output": "agent 7 started"},
             custom, {"type": "custom_tool_call_output", "call_id": custom["call_id"], "output": "patched"},
             {"type": "web_search_call", "id": "ws_1", "status": "completed"}]
    short = client.responses.create(model="tiny-tools.gguf", input=items[:1], tools=[spawn, patch],
                                    max_output_tokens=1, extra_body=NO_THINK)
    again = client.responses.create(model="tiny-tools.gguf", input=items, tools=[spawn, patch, {"type": "web_search"}],
                                    max_output_tokens=1, extra_body=NO_THINK)
    assert again.usage.input_tokens > short.usage.input_tokens + 10
