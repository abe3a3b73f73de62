"""Tools: the parser on recorded generations of each format (fed in every chunking), and
the server with the real openai client on a tiny random model with a Qwen3-style tool
template and on one whose template has no tools (the fallback): `tool_choice`
required / named forces schema-valid calls, streamed and not; a multi-turn exchange
with tool results renders."""

from __future__ import annotations

import json

import httpx

import jsonschema
import openai
import pytest

from gguf_serve.server.chat.tool_grammar import required_grammar
from gguf_serve.server.chat.tool_parse import ToolCallSplitter, parse_call
from gguf_serve.engine import GEMMA4, HERMES, LFM2, LLAMA3, MISTRAL, CallFormat, call_format, family_of
from gguf_serve.server.chat.tools import for_template

from server_harness import TOOLS, accepts, server
from tiny_models import tiny_chat_model

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
    ("Checking.<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>unit</arg_key>\n"
     "<arg_value>c</arg_value>\n</tool_call>", "Checking.", [("get_weather", {"city": "Paris", "unit": "c"})]),  # GLM-4.5
    ("<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>12</arg_value>\n<arg_key>b</arg_key>\n<arg_value>30</arg_value>\n"
     "</tool_call><tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>7</arg_value>\n</tool_call>", "",
     [("add", {"a": 12, "b": 30}), ("get_weather", {"city": "7"})]),  # values typed by the schema
    ("<tool_call>hello</tool_call>", "<tool_call>hello</tool_call>", []),  # a bare word that names no tool
    ("no call here, just < and <tool text", "no call here, just < and <tool text", []),
    ("<tool_call>\nnot json\n</tool_call> after", "<tool_call>\nnot json\n</tool_call> after", []),
    ('unclosed at the end: <tool_call>\n{"name": "add", "arguments": {"a": 5, "b": 6}}',
     "unclosed at the end: ", [("add", {"a": 5, "b": 6})]),
]


def one_per_call(deltas: list[dict]) -> list[dict]:
    """What one chunk carries: at most one delta per call (clients read them by index)."""
    assert len({d["index"] for d in deltas}) == len(deltas)
    return deltas


def run_splitter(pieces, family=HERMES, ids=None):
    """(content, calls) fed in these pieces; the stream deltas are checked against the calls."""
    sp = ToolCallSplitter(TOOLS, family)
    content, calls, deltas = "", [], []
    for p in pieces:
        c, k = sp.feed(p)
        content, calls, deltas = content + c, calls + k, deltas + one_per_call(sp.take_deltas())
    c, k = sp.flush()
    calls, deltas = calls + k, deltas + one_per_call(sp.take_deltas())
    streamed: dict[int, dict] = {}
    for d in deltas:
        if d["index"] not in streamed:  # the first delta of a call names it
            assert d["type"] == "function" and d["function"]["name"]
            streamed[d["index"]] = {"id": d["id"], "name": d["function"]["name"], "args": "", "parts": 0}
        else:
            assert "id" not in d and "name" not in d["function"]
        streamed[d["index"]]["args"] += d["function"]["arguments"]
        streamed[d["index"]]["parts"] += bool(d["function"]["arguments"])
    assert len(streamed) == len(calls)
    for i, call in enumerate(calls):
        st = streamed[i]
        assert (st["id"], st["name"]) == (call.id, call.name)
        assert json.loads(st["args"]) == json.loads(call.arguments)
    if ids is not None:
        ids += [c.id for c in calls]
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
    whole = "<function=" in text or "<arg_key>" in text  # the XML bodies come whole at the close
    assert all(n == 1 for n in parts) if whole else all(n > 5 for n in parts)
    assert parse_call('{"name": 3}', TOOLS) is None and parse_call("[]", TOOLS) is None


RECORDED_FAMILIES = [  # (family, generated text, content, calls)
    (MISTRAL, '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}, "id": "a1b2c3d4e"}]',
     "", [("get_weather", {"city": "Paris", "unit": "c"})]),
    (MISTRAL, 'Sure.[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "add", "arguments": '
              '{"a": 3, "b": 4}}]', "Sure.", [("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})]),
    (MISTRAL, '[TOOL_CALLS]get_weather[ARGS]{"city": "Rome", "unit": "f"}[TOOL_CALLS]add[ARGS]{"a": 5, "b": 6}',
     "", [("get_weather", {"city": "Rome", "unit": "f"}), ("add", {"a": 5, "b": 6})]),  # v11 and later
    (MISTRAL, "[TOOL_CALLS] not json", "[TOOL_CALLS] not json", []),
    (MISTRAL, "plain [TOOL text", "plain [TOOL text", []),
    (LLAMA3, '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}', "",
     [("get_weather", {"city": "Paris", "unit": "c"})]),
    (LLAMA3, '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}; {"name": "add", "parameters": '
             '{"a": 3, "b": 4}}', "", [("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})]),
    (LLAMA3, '  {"answer": 42}', '  {"answer": 42}', []),  # JSON that names no tool is the answer
    (LLAMA3, '{"name": "not_a_tool", "parameters": {}}', '{"name": "not_a_tool", "parameters": {}}', []),
    (LLAMA3, 'It is {"name": "add", "parameters": {"a": 1, "b": 2}}', 'It is {"name": "add", "parameters": '
             '{"a": 1, "b": 2}}', []),  # only a reply that is a call is one
    (GEMMA4, '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,unit:<|"|>c<|"|>}<tool_call|>', "",
     [("get_weather", {"city": "Paris", "unit": "c"})]),
    (GEMMA4, 'Sure.<|tool_call>call:add{a:1,b:2}<tool_call|><|tool_call>call:add{a:3,b:4}<tool_call|>', "Sure.",
     [("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})]),
    (GEMMA4, '<|tool_call>call:get_weather{city:<|"|>a, b: {c}<|"|>,unit:<|"|>f<|"|>}<tool_call|>', "",
     [("get_weather", {"city": "a, b: {c}", "unit": "f"})]),  # marks and braces inside a string
    (GEMMA4, "<|tool_call>call:add{a:1<tool_call|>", "<|tool_call>call:add{a:1<tool_call|>", []),
    (LFM2, '<|tool_call_start|>[get_weather(city="Paris", unit="c")]<|tool_call_end|>', "",
     [("get_weather", {"city": "Paris", "unit": "c"})]),
    (LFM2, "Sure.<|tool_call_start|>[add(a=1, b=2), add(a=3, b=4)]<|tool_call_end|>", "Sure.",
     [("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})]),  # several calls in one block
    (LFM2, "<|tool_call_start|>[add(1, 2)]<|tool_call_end|>", "<|tool_call_start|>[add(1, 2)]<|tool_call_end|>",
     []),  # positional arguments: not a call
    (LFM2, "<|tool_call_start|>[__import__('os')]<|tool_call_end|>",
     "<|tool_call_start|>[__import__('os')]<|tool_call_end|>", []),  # parsed, never run
]


# the families' own chat templates (llama.cpp keeps them in models/templates, in the sdist
# .ci/run unpacks as LLAMA_CPP_SRC): the call a template writes into an assistant turn is
# the call the parser reads back, in the family the server picks for that template
OWN_TEMPLATES = [("GLM-4.6.jinja", "<tool_call>", "</tool_call>"),
                 ("google-gemma-4-31B-it.jinja", "<|tool_call>", "<tool_call|>"),
                 ("LFM2.5-8B-A1B.jinja", "<|tool_call_start|>", "<|tool_call_end|>"),
                 ("ibm-granite-granite-4.0.jinja", "<tool_call>", "</tool_call>"),
                 ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", "[TOOL_CALLS]", None)]


@pytest.mark.parametrize("name,opens,closes", OWN_TEMPLATES)
def test_each_familys_own_template_writes_calls_the_parser_reads(tmp_path, name, opens, closes):
    from converter import llama_cpp_src
    from gguf_serve.engine.chat import render
    from gguf_serve.engine.tokenizer import load_tokenizer
    from gguf_serve.gguf_io import GGUFReader

    template = open(f"{llama_cpp_src()}/models/templates/{name}").read()
    tok = load_tokenizer(GGUFReader(tiny_chat_model(tmp_path, "tiny.gguf", 0, template)))
    call = {"id": "abcdefghi", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}
    messages = [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "abcdefghi", "content": "sunny"}]
    rendered = render(tok, template, messages, tools=TOOLS)
    start = rendered.index(opens, rendered.index("weather?"))
    end = rendered.index(closes, start) + len(closes) if closes else rendered.index(tok.eos_token, start)
    fmt = call_format(template, lambda text: None)
    assert fmt.family is family_of(template)
    _, calls, _ = run_splitter([rendered[start:end]], fmt.family)
    assert calls == [("get_weather", {"city": "Paris", "unit": "c"})]


@pytest.mark.parametrize("family,text,content,calls", RECORDED_FAMILIES)
def test_mistral_and_llama_calls_in_every_chunking(family, text, content, calls):
    chunkings = [[text], list(text)] + [[text[:i], text[i:]] for i in range(1, len(text))]
    for pieces in chunkings:
        ids: list = []
        got_content, got_calls, _ = run_splitter(pieces, family, ids)
        assert got_calls == calls and got_content == content, pieces
        if family is MISTRAL:  # its templates want 9 letters and digits
            assert all(len(i) == 9 and i.isalnum() for i in ids)
    if "a1b2c3d4e" in text:
        assert ids == ["a1b2c3d4e"]


def test_lfm2_instruct_template_gets_earlier_calls_in_lfm2s_own_form(tmp_path):
    """LFM2.5-Instruct's template lists the tools but renders no calls: an earlier call is
    written into the assistant's content as LFM2 writes it, and read back as that call."""
    from converter import llama_cpp_src
    from gguf_serve.engine.chat import render
    from gguf_serve.engine.tokenizer import load_tokenizer
    from gguf_serve.gguf_io import GGUFReader

    template = open(f"{llama_cpp_src()}/models/templates/LFM2.5-Instruct.jinja").read()
    assert family_of(template) is LFM2
    tok = load_tokenizer(GGUFReader(tiny_chat_model(tmp_path, "tiny.gguf", 0, template)))
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}
    messages = [{"role": "user", "content": "1+2?"}, {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "3"}]
    for_template(messages, LFM2, "tool_calls" in template)
    rendered = render(tok, template, messages, tools=TOOLS)
    start = rendered.index(LFM2.open)
    _, calls, _ = run_splitter([rendered[start:rendered.index(LFM2.close) + len(LFM2.close)]], LFM2)
    assert calls == [("add", {"a": 1, "b": 2})] and "List of tools: [" in rendered


def test_the_family_comes_from_the_template():
    assert family_of("{{ tools }}[AVAILABLE_TOOLS]...[TOOL_CALLS]") is MISTRAL
    assert family_of("<|start_header_id|>ipython<|end_header_id|>{{ tools }}<|python_tag|>") is LLAMA3
    assert family_of("{{ tools }}<tool_call>") is HERMES and family_of(None) is HERMES
    fmt = call_format("{% for t in tools %}[TOOL_CALLS]{{ c.name }}[ARGS]{% endfor %}", lambda t: 7)
    assert fmt.family is MISTRAL and fmt.named_args and fmt.open_token == 7
    assert call_format("no tools here", lambda t: 7) == CallFormat()


def test_forced_calls_in_the_mistral_and_llama_forms(tools_path):
    from gguf_serve.engine.tokenizer import load_tokenizer
    from gguf_serve.gguf_io import GGUFReader

    tok = load_tokenizer(GGUFReader(tools_path))
    v3 = required_grammar(TOOLS, None, False, CallFormat(MISTRAL))
    assert accepts(v3, '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}]', tok)
    assert not accepts(v3, '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}]', tok)  # b is required
    assert not accepts(v3, '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "add", '
                           '"arguments": {"a": 1, "b": 2}}]', tok)  # one call: parallel_tool_calls false
    v11 = required_grammar(TOOLS, "add", True, CallFormat(MISTRAL, named_args=True))
    assert accepts(v11, '[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}[TOOL_CALLS]add[ARGS]{"a": 3, "b": 4}', tok)
    assert not accepts(v11, '[TOOL_CALLS]get_weather[ARGS]{"city": "x", "unit": "c"}', tok)
    gemma4 = required_grammar(TOOLS, "add", False, CallFormat(GEMMA4))
    assert accepts(gemma4, '<|tool_call>call:add{"a": 1, "b": 2}<tool_call|>', tok)
    assert not accepts(gemma4, '<|tool_call>call:add{"a": 1}<tool_call|>', tok)
    assert parse_call('call:add{"a": 1, "b": 2}', TOOLS).arguments == '{"a": 1, "b": 2}'  # what it forces parses
    lfm2 = required_grammar(TOOLS, None, True, CallFormat(LFM2))
    assert accepts(lfm2, '<|tool_call_start|>[add(a=1, b=2), get_weather(city="Oslo", unit="c")]<|tool_call_end|>', tok)
    assert not accepts(lfm2, "<|tool_call_start|>[add(a=1)]<|tool_call_end|>", tok)
    llama = required_grammar(TOOLS, None, True, CallFormat(LLAMA3))
    assert accepts(llama, '{"name": "add", "parameters": {"a": 1, "b": 2}}; '
                          '{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "c"}}', tok)
    assert not accepts(llama, '{"name": "add", "arguments": {"a": 1, "b": 2}}', tok)


@pytest.mark.parametrize("closed", [False, True])
def test_a_call_inside_an_unclosed_reasoning_block_is_a_call(closed):
    """Qwen3.5 sometimes opens a call while still thinking: the call still counts."""
    from gguf_serve.server.chat.reasoning import ReasoningSplitter
    from gguf_serve.engine import TOOL_OPEN

    think = "I should look it up.\n" + ("</think>\n\n" if closed else "")
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>'
    text = think + call
    for pieces in [[text], list(text)] + [[text[:i], text[i:]] for i in range(1, len(text))]:
        rs, ts = ReasoningSplitter(in_reasoning=True, breaks=(TOOL_OPEN,)), ToolCallSplitter(TOOLS)
        reasoning, content, calls = "", "", []
        for p in pieces:
            r, c = rs.feed(p)
            c, k = ts.feed(c)
            reasoning, content, calls = reasoning + r, content + c, calls + k
        r, c = rs.flush()
        c, k = ts.feed(c)
        c2, k2 = ts.flush()
        reasoning, content, calls = reasoning + r, content + c + c2, calls + k + k2
        assert reasoning.strip() == "I should look it up." and not content.strip(), pieces
        assert [(x.name, json.loads(x.arguments)) for x in calls] == [("get_weather", {"city": "Paris", "unit": "c"})]
    r, c = ReasoningSplitter(in_reasoning=True).feed(text)  # without tools, only </think> ends it
    assert (call in c and call not in r) if closed else (call in r and not c)


WEATHER_XML = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\nc\n" \
              "</parameter>\n</function>\n</tool_call>"
WEATHER_JSON = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>'


def test_forced_calls_follow_the_templates_form(tools_path):
    from gguf_serve.engine.tokenizer import load_tokenizer
    from gguf_serve.gguf_io import GGUFReader

    tok = load_tokenizer(GGUFReader(tools_path))
    xml, hermes = required_grammar(TOOLS, None, False, CallFormat(xml=True)), required_grammar(TOOLS, None, False)
    assert accepts(xml, WEATHER_XML, tok) and not accepts(xml, WEATHER_JSON, tok)
    assert accepts(hermes, WEATHER_JSON, tok) and not accepts(hermes, WEATHER_XML, tok)
    for bad in (WEATHER_XML.replace("Paris", "Paris is far too long"), WEATHER_XML.replace("\nc\n", "\nk\n"),
                WEATHER_XML.replace("get_weather", "get_time"),
                WEATHER_XML.replace("<parameter=unit>\nc\n</parameter>\n", "")):  # a required one left out
        assert not accepts(xml, bad, tok)
    add = "<tool_call>\n<function=add>\n<parameter=a>\n12\n</parameter>\n<parameter=b>\n30\n</parameter>\n" \
          "</function>\n</tool_call>"
    assert accepts(xml, add, tok) and not accepts(xml, add.replace("12", '"12"'), tok)  # integers stay integers
    two = required_grammar(TOOLS, None, True, CallFormat(xml=True))
    assert accepts(two, WEATHER_XML + "\n" + add, tok) and not accepts(xml, WEATHER_XML + "\n" + add, tok)
    assert parse_call(WEATHER_XML[len("<tool_call>"):-len("</tool_call>")], TOOLS).arguments == \
        json.dumps({"city": "Paris", "unit": "c"})


WEATHER_GLM = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>unit</arg_key>\n" \
              "<arg_value>c</arg_value>\n</tool_call>"


def test_forced_calls_in_glms_form(tools_path):
    from gguf_serve.engine.tokenizer import load_tokenizer
    from gguf_serve.gguf_io import GGUFReader

    tok = load_tokenizer(GGUFReader(tools_path))
    assert call_format("{{ tools }}<tool_call>{{ name }}<arg_key>{{ k }}</arg_key>", lambda t: None).arg_pairs
    glm = required_grammar(TOOLS, None, False, CallFormat(arg_pairs=True))
    assert accepts(glm, WEATHER_GLM, tok) and not accepts(glm, WEATHER_JSON, tok) and not accepts(glm, WEATHER_XML, tok)
    for bad in (WEATHER_GLM.replace("Paris", "Paris is far too long"), WEATHER_GLM.replace(">c<", ">k<"),
                WEATHER_GLM.replace("<arg_key>unit</arg_key>\n<arg_value>c</arg_value>\n", "")):
        assert not accepts(glm, bad, tok)
    add = "<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>12</arg_value>\n<arg_key>b</arg_key>\n<arg_value>30" \
          "</arg_value>\n</tool_call>"
    assert accepts(glm, add, tok) and not accepts(glm, add.replace("12", '"12"'), tok)
    two = required_grammar(TOOLS, None, True, CallFormat(arg_pairs=True))
    assert accepts(two, WEATHER_GLM + "\n" + add, tok)
    _, calls, _ = run_splitter([WEATHER_GLM + "\n" + add])  # what the grammar lets through, the parser reads
    assert calls == [("get_weather", {"city": "Paris", "unit": "c"}), ("add", {"a": 12, "b": 30})]


MISTRAL_TEMPLATE = (  # Mistral v3's shape, with its check on call ids
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}{%- if tools and loop.last %}{{ '[AVAILABLE_TOOLS]' + tools | tojson + "
    "'[/AVAILABLE_TOOLS]' }}{%- endif %}{{ '[INST]' + m.content + '[/INST]' }}"
    "{%- elif m.role == 'assistant' and m.tool_calls %}{{ '[TOOL_CALLS][' }}{%- for c in m.tool_calls %}"
    "{%- if c.id is not string or c.id | length != 9 %}"
    "{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{%- endif %}"
    "{{ {'name': c.function.name, 'arguments': c.function.arguments, 'id': c.id} | tojson }}"
    "{%- endfor %}{{ ']<|endoftext|>' }}"
    "{%- elif m.role == 'tool' %}{{ '[TOOL_RESULTS]' + {'content': m.content, 'call_id': m.tool_call_id} | tojson + "
    "'[/TOOL_RESULTS]' }}"
    "{%- else %}{{ m.content }}{%- endif %}{%- endfor %}"
)


@pytest.fixture(scope="module")
def mistral_path(tmp_path_factory):
    return tiny_chat_model(tmp_path_factory.mktemp("tools"), "tiny-mistral.gguf", 13, MISTRAL_TEMPLATE)


@pytest.fixture(scope="module")
def base(tools_path, tiny_path, xml_tools_path, mistral_path):
    with server(tools_path, tiny_path, xml_tools_path, mistral_path, "--ctx-size", "2048") as b:  # the tools take ~600 prompt tokens
        yield b


def client(base):
    return openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)


def check_calls(calls, names):
    assert calls
    for c in calls:
        assert c.type == "function" and c.function.name in names
        assert c.id.startswith("call_") or (len(c.id) == 9 and c.id.isalnum())  # Mistral's own form
        jsonschema.validate(json.loads(c.function.arguments), PARAMS[c.function.name])


# Hermes, XML and Mistral templates, and one without tools (the fallback)
@pytest.mark.parametrize("model", ["tiny-tools.gguf", "tiny-xml-tools.gguf", "tiny-mistral.gguf", "tiny-qwen3.gguf"])
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


def test_a_tool_grammar_that_cannot_be_built_is_a_400_naming_tool_choice(base):
    """A forced call's grammar is built from the tool's schema: where that fails, the
    request field at fault is tool_choice's tools, not response_format."""
    bad = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=x)y"}}, "required": ["a"]}}}
    r = httpx.post(f"{base}/v1/chat/completions", json={"model": "tiny-tools.gguf", "tools": [bad], "max_tokens": 2,
                                                         "tool_choice": "required",
                                                         "messages": [{"role": "user", "content": "x"}]})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "tool_choice", r.text
    assert err["message"].startswith("tool_choice: ") and "look-around" in err["message"]


def test_mistral_call_ids_go_back_through_its_template(base):
    c = client(base)
    first = c.chat.completions.create(model="tiny-mistral.gguf", messages=[{"role": "user", "content": "weather?"}],
                                      tools=TOOLS, tool_choice="required", max_tokens=400, parallel_tool_calls=False)
    call = first.choices[0].message.tool_calls[0]
    assert len(call.id) == 9 and call.id.isalnum()
    check_calls([call], {"get_weather", "add"})
    for call_id in (call.id, "call_" + "ab" * 12):  # its own id, and one from another server (mapped)
        msgs = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": None, "tool_calls": [{**call.model_dump(), "id": call_id}]},
                {"role": "tool", "tool_call_id": call_id, "content": "sunny"}, {"role": "user", "content": "so?"}]
        r = c.chat.completions.create(model="tiny-mistral.gguf", messages=msgs, tools=TOOLS, max_tokens=3)
        assert r.usage.prompt_tokens > first.usage.prompt_tokens


def test_a_call_cut_off_is_a_call_marked_incomplete():
    """max_tokens ends a call after its name: the call, with the arguments so far (as OpenAI
    returns a cut-off call), never its markup as content; before the name, it stays text."""
    text = 'Sure. <tool_call>\n{"name": "add", "arguments": {"a": 5, "b'
    for pieces in [[text], list(text)]:
        sp = ToolCallSplitter(TOOLS)
        content, calls = "", []
        for p in pieces:
            c, k = sp.feed(p)
            content, calls = content + c, calls + k
        c, k = sp.flush()
        content, calls = content + c, calls + k
        assert content == "Sure. " and len(calls) == 1
        assert calls[0].name == "add" and not calls[0].complete and calls[0].arguments == '{"a": 5, "b'
    sp = ToolCallSplitter(TOOLS)
    c, k = sp.feed('<tool_call>\n{"na')
    c2, k2 = sp.flush()
    assert c + c2 == '<tool_call>\n{"na' and not k + k2
