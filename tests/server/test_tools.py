"""Tools: the parser on recorded generations of each format (fed in every chunking), and
the server with the real openai client on a tiny random model with a Qwen3-style tool
template and on one whose template has no tools (the fallback): `tool_choice`
required / named forces schema-valid calls, streamed and not; a multi-turn exchange
with tool results renders."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from gguf_serve.server.tools import ToolCallSplitter, parse_call

from server_harness import server
from tiny_models import random_model, spec, write_gguf

TOOL_TEMPLATE = (
    "{%- if tools %}{{ '<|im_start|>system\\n# Tools\\n<tools>\\n' }}"
    "{%- for t in tools %}{{ t | tojson }}{{ '\\n' }}{%- endfor %}"
    "{{ '</tools>\\nCall one as <tool_call>\\n{\"name\": ..., \"arguments\": ...}\\n</tool_call><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}{{ '<|im_start|>assistant\\n' + (m.content or '') }}"
    "{%- for c in m.tool_calls %}{{ '<tool_call>\\n{\"name\": \"' + c.function.name + '\", \"arguments\": ' }}"
    "{{ c.function.arguments | tojson }}{{ '}\\n</tool_call>' }}{%- endfor %}{{ '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}{{ '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                     "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 999},
                                     "b": {"type": "integer", "minimum": 0, "maximum": 999}},
    "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}

RECORDED = [  # (generated text, content, calls) as the families write them
    ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>',
     "Let me check.\n", [("get_weather", {"city": "Paris", "unit": "c"})]),
    ('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n<tool_call>\n'
     '{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>',
     "", [("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})]),
    ("<tool_call>\n<function=add>\n<parameter=a>\n12\n</parameter>\n<parameter=b>\n30\n</parameter>\n</function>\n"
     "</tool_call>", "", [("add", {"a": 12, "b": 30})]),  # Qwen3.5 / Qwen3-Coder: values typed by the schema
    ("<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n<parameter=unit>\nc\n</parameter>\n"
     "</function>\n</tool_call>", "", [("get_weather", {"city": "42", "unit": "c"})]),
    ("no call here, just < and <tool text", "no call here, just < and <tool text", []),
    ("<tool_call>\nnot json\n</tool_call> after", "<tool_call>\nnot json\n</tool_call> after", []),
    ('unclosed at the end: <tool_call>\n{"name": "add", "arguments": {"a": 5, "b": 6}}',
     "unclosed at the end: ", [("add", {"a": 5, "b": 6})]),
]


def run_splitter(pieces):
    """(content, calls) fed in these pieces; the stream deltas are checked against the calls."""
    sp = ToolCallSplitter(TOOLS)
    content, calls, deltas = "", [], []
    for p in pieces:
        c, k = sp.feed(p)
        content, calls, deltas = content + c, calls + k, deltas + sp.take_deltas()
    c, k = sp.flush()
    calls, deltas = calls + k, deltas + sp.take_deltas()
    streamed: dict[int, dict] = {}
    for d in deltas:
        if d["index"] not in streamed:  # the first delta of a call names it
            assert d["type"] == "function" and d["function"]["arguments"] == ""
            streamed[d["index"]] = {"id": d["id"], "name": d["function"]["name"], "args": "", "parts": 0}
        else:
            streamed[d["index"]]["args"] += d["function"]["arguments"]
            streamed[d["index"]]["parts"] += 1
    assert len(streamed) == len(calls)
    for i, call in enumerate(calls):
        st = streamed[i]
        assert (st["id"], st["name"]) == (call.id, call.name)
        assert json.loads(st["args"]) == json.loads(call.arguments)
    return content + c, [(x.name, json.loads(x.arguments)) for x in calls], [st["parts"] for st in streamed.values()]


@pytest.mark.parametrize("text,content,calls", RECORDED)
def test_the_parser_in_every_chunking(text, content, calls):
    chunkings = [[text], list(text)] + [[text[:i], text[i:]] for i in range(1, len(text))]
    chunkings += [[text[:i], text[i:j], text[j:]] for i in range(1, len(text), 7) for j in range(i + 1, len(text), 5)]
    for pieces in chunkings:
        got_content, got_calls, _ = run_splitter(pieces)
        assert got_calls == calls, pieces
        assert got_content.strip() == content.strip(), pieces
    parts = run_splitter(list(text))[2]  # fed a character at a time: JSON arguments come in many fragments
    assert all(n > 5 for n in parts) if "<function=" not in text else all(n == 1 for n in parts)
    assert parse_call('{"name": 3}', TOOLS) is None and parse_call("[]", TOOLS) is None


@pytest.fixture(scope="module")
def tools_path(tmp_path_factory):
    s = spec("qwen3")
    path = tmp_path_factory.mktemp("tools") / "tiny-tools.gguf"
    write_gguf(s, random_model(s, seed=7), path, "Q8_0", chat_template=TOOL_TEMPLATE)
    return str(path)


@pytest.fixture(scope="module")
def base(tools_path, tiny_path):
    with server(tools_path, tiny_path, "--ctx-size", "2048") as b:  # the tools take ~600 prompt tokens
        yield b


def client(base):
    return openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)


def check_calls(calls, names):
    assert calls
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_") and c.function.name in names
        jsonschema.validate(json.loads(c.function.arguments), PARAMS[c.function.name])


@pytest.mark.parametrize("model", ["tiny-tools.gguf", "tiny-qwen3.gguf"])  # its template; the fallback
def test_required_tool_choice_gives_valid_calls(base, model):
    c = client(base)
    for seed in range(3):
        # parallel calls allowed: one or more blocks, until the model ends them (or max_tokens does)
        r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "weather in Paris?"}],
                                      tools=TOOLS, tool_choice="required", max_tokens=400, seed=seed,
                                      extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        ch = r.choices[0]
        assert ch.finish_reason in ("tool_calls", "length") and ch.message.content is None
        check_calls(ch.message.tool_calls, {"get_weather", "add"})
        r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "weather in Paris?"}],
                                      tools=TOOLS, tool_choice="required", max_tokens=400, seed=seed,
                                      parallel_tool_calls=False,
                                      extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls" and ch.message.content is None and len(ch.message.tool_calls) == 1
        check_calls(ch.message.tool_calls, {"get_weather", "add"})
    r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "1 + 2"}], tools=TOOLS,
                                  tool_choice={"type": "function", "function": {"name": "add"}}, max_tokens=400,
                                  parallel_tool_calls=False,
                                  extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert len(r.choices[0].message.tool_calls) == 1
    check_calls(r.choices[0].message.tool_calls, {"add"})


def test_streamed_calls_name_first_then_arguments(base):
    c = client(base)
    stream = c.chat.completions.create(model="tiny-tools.gguf", messages=[{"role": "user", "content": "add"}],
                                       tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}},
                                       max_tokens=400, stream=True, seed=2, parallel_tool_calls=False)
    calls, finish, fragments = {}, None, 0
    for chunk in stream:
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        finish = ch.finish_reason or finish
        for d in ch.delta.tool_calls or []:
            if d.index not in calls:
                assert d.id and d.type == "function" and d.function.name == "add"  # the first fragment names it
                calls[d.index] = ""
            calls[d.index] += d.function.arguments or ""
            fragments += bool(d.function.arguments)
        assert not (ch.delta.content or "").strip().startswith("<tool_call>")
    assert finish == "tool_calls" and calls and fragments > 3  # the arguments came as they were generated
    for args in calls.values():
        jsonschema.validate(json.loads(args), PARAMS["add"])


def test_a_tool_result_goes_back_to_the_model(base):
    c = client(base)
    first = c.chat.completions.create(model="tiny-tools.gguf", messages=[{"role": "user", "content": "weather?"}],
                                      tools=TOOLS, tool_choice="required", max_tokens=400, seed=0,
                                      parallel_tool_calls=False)
    call = first.choices[0].message.tool_calls[0]
    msgs = [{"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 degrees"}]
    r = c.chat.completions.create(model="tiny-tools.gguf", messages=msgs, tools=TOOLS, max_tokens=5)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert r.usage.prompt_tokens > first.usage.prompt_tokens + 10  # the call and its result were rendered
    bad = c.chat.completions.with_raw_response
    with pytest.raises(openai.BadRequestError) as e:
        bad.create(model="tiny-tools.gguf", messages=msgs, tools=TOOLS,
                   tool_choice={"type": "function", "function": {"name": "nope"}}, max_tokens=5)
    assert e.value.body["param"] == "tool_choice"
    with pytest.raises(openai.BadRequestError) as e:
        bad.create(model="tiny-tools.gguf", messages=msgs, tools=[{"type": "function"}], max_tokens=5)
    assert e.value.body["param"] == "tools.0"


def test_tool_choice_none_renders_no_tools(base):
    c = client(base)
    with_tools = c.chat.completions.create(model="tiny-tools.gguf", messages=[{"role": "user", "content": "x"}],
                                           tools=TOOLS, max_tokens=1)
    none = c.chat.completions.create(model="tiny-tools.gguf", messages=[{"role": "user", "content": "x"}],
                                     tools=TOOLS, tool_choice="none", max_tokens=1)
    assert none.usage.prompt_tokens < with_tools.usage.prompt_tokens
