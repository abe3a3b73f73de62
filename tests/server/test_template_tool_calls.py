"""Tool calls as each chat template writes them, read back: for the templates of llama.cpp's
`models/templates` (the sdist's), each template renders an assistant turn holding calls
(one, two, one without arguments, nested JSON, a string with quotes and a newline) and the
server's reader for that template (a hand-written family, or the syntax derived from the
template's render of probe calls, server.chat.derived_calls) gives back the same calls,
read whole and streamed a character at a time; with `tool_choice` required the derived
syntax's grammar admits exactly such a reply. The templates that do are listed: a change
that loses one fails here."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from gguf_serve.engine.chat_format import ChatFormat
from gguf_serve.engine.text import END_OF_GENERATION_TEXTS
from gguf_serve.server.chat import derived_calls
from gguf_serve.server.chat.prepare import template_tool_calls
from gguf_serve.server.chat.tools import for_template
from gguf_serve.server.chat.tool_parse import DerivedFamily, ToolCallSplitter, syntax_for

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "the weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                     "filter": {"type": "object"}}, "required": ["city"]}}},
         {"type": "function", "function": {"name": "now", "description": "the time", "parameters": {
             "type": "object", "properties": {}}}}]
CASES = {
    "one": [("get_weather", {"city": "Paris", "days": 3})],
    "two": [("get_weather", {"city": "Paris", "days": 3}), ("get_weather", {"city": "Rome", "days": 1})],
    "no arguments": [("now", {})],
    "nested JSON": [("get_weather", {"city": "Oslo", "filter": {"tags": ["rain", "wind"], "min": {"c": -3}}})],
    "quotes and a newline": [("get_weather", {"city": "He said \"hi\"\nthen left", "days": 2})],
}
# the templates whose every case reads back
READ_BACK = {  # all 56 that write calls, of the 66 that mention tools (gpt-oss's harmony apart)
    "Apertus-8B-Instruct", "Apriel-1.6-15b-Thinker-fixed", "Bielik-11B-v3.0-Instruct", "ByteDance-Seed-OSS",
    "Cohere2MoE", "CohereForAI-c4ai-command-r7b-12-2024-tool_use", "GigaChat3-10B-A1.8B", "GigaChat3.1-10B-A1.8B",
    "GLM-4.6", "GLM-4.7-Flash", "LFM2.5-8B-A1B",
    "Kimi-K3", "LFM2.5-Instruct", "MiMo-VL", "MiniMax-M1", "MiniMax-M2", "Mistral-Small-3.2-24B-Instruct-2506",
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "NVIDIA-Nemotron-Nano-v2", "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "Qwen-QwQ-32B", "Qwen-Qwen2.5-7B-Instruct", "Qwen-Qwen3-0.6B",
    "Qwen3-Coder", "Qwen3.5-4B", "Reka-Edge", "Spark2.5", "StepFun3.5-Flash",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "deepseek-ai-DeepSeek-V3.1", "deepseek-ai-DeepSeek-V3.2",
    "deepseek-ai-DeepSeek-V4", "deepseek-ai-DeepSeek-V4-Flash-0731", "google-gemma-4-31B-it",
    "google-gemma-4-31B-it-interleaved", "ibm-granite-granite-4.0", "ibm-granite-granite-4.1",
    "inclusionai-ling-3.0-flash", "meetkai-functionary-medium-v3.1", "muse-glimmer", "meta-llama-Llama-3.1-8B-Instruct",
    "meta-llama-Llama-3.2-3B-Instruct", "meta-llama-Llama-3.3-70B-Instruct", "moonshotai-Kimi-K2",
    "mistralai-Ministral-3-14B-Reasoning-2512", "mistralai-Mistral-Nemo-Instruct-2407", "openbmb-MiniCPM5-1B",
    "poolside-Laguna-S-2.1", "poolside-Laguna-XS-2.1", "poolside-Laguna-XS.2", "tencent-Hy3", "unsloth-Apriel-1.5",
    "unsloth-mistral-Devstral-Small-2507", "upstage-Solar-Open-100B",
}


def templates() -> dict[str, str]:
    src = os.environ.get("LLAMA_CPP_SRC")
    folder = Path(src) / "models" / "templates" if src else None
    if folder is None or not folder.is_dir():
        return {}
    return {p.stem: p.read_text() for p in sorted(folder.glob("*.jinja"))  # harmony's: test_harmony.py
            if "tool" in p.read_text() and "<|channel|>" not in p.read_text()}


TEMPLATES = templates()
TOK = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), bos_token="<s>", eos_token="</s>")


def render(template: str, messages: list[dict], generation_prompt: bool, tools=TOOLS) -> str:
    return TOK.apply_chat_template(messages, chat_template=template, tokenize=False, tools=tools,
                                   add_generation_prompt=generation_prompt)


def family_for(template: str):
    """The reader the server gives this template (ChatServing._derived_syntax's choice)."""
    chat = ChatFormat.of(template, TOK, {})
    if chat.harmony:
        return chat.calls.family

    async def probe(messages, generation_prompt):
        return render(template, messages, generation_prompt, derived_calls.PROBE_TOOLS)
    derived = syntax_for(chat.calls.family, chat.renders_tools, asyncio.run(derived_calls.probe_replies(probe)))
    if derived is not None:
        return DerivedFamily.of(derived)
    return chat.calls.family if chat.renders_tools else None


def reply(template: str, calls: list[tuple[str, dict]], family) -> str:
    """The assistant turn the template renders for these calls, the messages prepared as the
    server prepares them for it (tools.for_template: Mistral's call ids, LFM2's calls)."""
    user = [{"role": "user", "content": "hi"}]
    wire = [{"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
            for i, (n, a) in enumerate(calls)]
    messages = user + [{"role": "assistant", "content": "", "tool_calls": template_tool_calls(wire, 1)}]
    if not isinstance(family, DerivedFamily):
        for_template(messages, family, ChatFormat.of(template, TOK, {}).renders_calls)
    else:
        derived_calls.with_ids(messages, family.syntax)
    text = derived_calls.reply_of(render(template, user, True), render(template, messages, False))
    ends = [i for e in END_OF_GENERATION_TEXTS if (i := text.find(e)) >= 0]
    return text[:min(ends)] if ends else text  # a reply ends before its end-of-generation token


def read(family, text: str, streamed: bool) -> list[tuple[str, dict]]:
    splitter = ToolCallSplitter(TOOLS, family)
    calls = []
    for piece in (list(text) if streamed else [text]):
        calls += splitter.feed(piece)[1]
    calls += splitter.flush()[1]
    return [(c.name, json.loads(c.arguments)) for c in calls]


def reads_back(name: str) -> bool:
    """Every case the template renders reads back (a template that renders one call a turn,
    as Llama 3.x's and GigaChat 3's, is not asked for two), and it renders the first."""
    template = TEMPLATES[name]
    try:
        family = family_for(template)
    except Exception:  # a template that cannot render the probes: no reader
        return False
    if family is None:
        return False
    rendered = 0
    for case, calls in CASES.items():
        try:
            text = reply(template, calls, family)
        except Exception:  # the template refuses these calls (it says so): not a case for it
            if case == "one":
                return False
            continue
        if case == "two" and "Rome" not in text:  # a template that writes the first call only (GigaChat 3's)
            continue
        rendered += 1
        if any(read(family, text, streamed) != calls for streamed in (False, True)):
            return False
    return rendered > 0


@pytest.mark.skipif(not TEMPLATES, reason="LLAMA_CPP_SRC is not set (.ci/run unpacks llama.cpp's templates)")
def test_every_listed_template_reads_its_own_calls_back():
    passing = {name for name in TEMPLATES if reads_back(name)}
    assert READ_BACK <= passing, sorted(READ_BACK - passing)
    print(f"{len(passing)} of {len(TEMPLATES)} templates read their calls back; not: {sorted(set(TEMPLATES) - passing)}")


@pytest.fixture(scope="module")
def tiny_lm(tiny_path):
    from gguf_serve.engine import load_model

    return load_model(tiny_path, n_ctx=256, n_seq=1)


@pytest.mark.skipif(not TEMPLATES, reason="LLAMA_CPP_SRC is not set (.ci/run unpacks llama.cpp's templates)")
@pytest.mark.parametrize("name", ["deepseek-ai-DeepSeek-V3.2", "MiniMax-M2", "Apertus-8B-Instruct", "ByteDance-Seed-OSS",
                                  "Kimi-K3", "GigaChat3-10B-A1.8B", "MiniMax-M3", "muse-glimmer"])
def test_a_derived_syntaxs_grammar_admits_its_own_render_and_not_another(name, tiny_lm):
    """tool_choice required in a derived syntax: the grammar (a tiny model's vocabulary)
    takes the template's own render of a call, as a model it forces would write it, to an
    accepting end, and refuses the Hermes form of the same call."""
    from llguidance import LLMatcher

    from gguf_serve.engine.grammar import grammar_tokenizer
    from gguf_serve.server.chat.tool_grammar import derived_grammar

    template = TEMPLATES[name]
    family = family_for(template)
    assert isinstance(family, DerivedFamily)
    tok = grammar_tokenizer(tiny_lm)

    def accepts(text: str) -> bool:
        m = LLMatcher(tok, derived_grammar(TOOLS, None, family.syntax))
        ids = tiny_lm.tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids
        return m.consume_tokens(ids) and m.is_accepting()

    own = reply(template, CASES["one"], family)
    own = own[own.find(family.open if family.syntax.section_open.strip() else family.syntax.call_open):]
    close = family.syntax.section_close.strip() or family.syntax.call_close.strip()
    own = own[:own.rfind(close) + len(close)]  # the turn's end after it is the end-of-generation token
    assert accepts(own), own
    assert not accepts('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>')


def forced_accepts(lm, syntax, text: str) -> bool:
    from llguidance import LLMatcher

    from gguf_serve.engine.grammar import grammar_tokenizer
    from gguf_serve.server.chat.tool_grammar import derived_grammar

    m = LLMatcher(grammar_tokenizer(lm), derived_grammar(TOOLS, None, syntax))
    return m.consume_tokens(lm.tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids) \
        and m.is_accepting()


@pytest.mark.skipif(not TEMPLATES, reason="LLAMA_CPP_SRC is not set (.ci/run unpacks llama.cpp's templates)")
def test_numbered_calls_and_one_call_templates_are_forced_as_they_write(tiny_lm):
    """Kimi K3 numbers its calls (index="1", "2"): a forced reply of two calls takes each its
    own number; GigaChat 3 writes one call a turn: its forced reply takes one, not two."""
    kimi = family_for(TEMPLATES["Kimi-K3"])
    two = reply(TEMPLATES["Kimi-K3"], CASES["two"], kimi)
    two = two[two.find(kimi.open):two.rfind(kimi.syntax.section_close) + len(kimi.syntax.section_close)]
    assert 'index="2"' in two and forced_accepts(tiny_lm, kimi.syntax, two), two
    assert not forced_accepts(tiny_lm, kimi.syntax, two.replace('index="2"', 'index="x"'))
    giga = family_for(TEMPLATES["GigaChat3-10B-A1.8B"])
    assert giga.syntax.one_call
    one = reply(TEMPLATES["GigaChat3-10B-A1.8B"], CASES["one"], giga).rstrip()
    one = one[:one.rfind("}") + 1]
    assert forced_accepts(tiny_lm, giga.syntax, one), one
    assert not forced_accepts(tiny_lm, giga.syntax, one + one)


# a template of its own kind (no hand-written family reads it): calls as <invoke name=…> with <arg> pairs
INVOKE_TEMPLATE = (
    "{%- if tools -%}<|tools|>{{ tools | tojson }}<|end|>{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}<|user|>{{ m.content }}<|end|>"
    "{%- elif m.role == 'assistant' -%}<|bot|>{{ m.content or '' }}"
    "{%- if m.tool_calls -%}<calls>{%- for c in m.tool_calls -%}<invoke name=\"{{ c.function.name }}\">"
    "{%- for k, v in c.function.arguments.items() -%}<arg name=\"{{ k }}\">{{ v }}</arg>{%- endfor -%}"
    "</invoke>{%- endfor -%}</calls>{%- endif -%}<|end|>"
    "{%- elif m.role == 'tool' -%}<|tool|>{{ m.content }}<|end|>{%- endif -%}"
    "{%- endfor -%}{%- if add_generation_prompt -%}<|bot|>{%- endif -%}")
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"enum": [1, 2, 3]}},
    "required": ["city", "days"]}}}


def test_a_template_of_its_own_kind_gets_its_calls_forced_and_read_on_a_real_server(tiny_path, tmp_path):
    """A chat template whose calls no hand-written family reads: the server derives its syntax
    from the template, renders the tools through it, and with tool_choice required the tiny
    model's reply, forced into that syntax, comes back as a tool call (whole and streamed),
    its arguments valid for the schema; the call sent back in the next turn renders as the
    template writes it."""
    import httpx
    import jsonschema
    import openai

    from server_harness import server

    path = tmp_path / "invoke.jinja"
    path.write_text(INVOKE_TEMPLATE)
    with server(tiny_path, "--chat-template-file", str(path), "--ctx-size", "1024") as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="x")
        kw = dict(model=tiny_path, messages=[{"role": "user", "content": "weather?"}], tools=[WEATHER],
                  tool_choice="required", parallel_tool_calls=False, max_tokens=300, temperature=0)
        r = client.chat.completions.create(**kw)
        (call,) = r.choices[0].message.tool_calls
        assert call.function.name == "get_weather" and r.choices[0].finish_reason == "tool_calls"
        jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
        chunks = list(client.chat.completions.create(**kw, stream=True))
        streamed = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        assert streamed[0].function.name == "get_weather"
        assert "".join(tc.function.arguments or "" for tc in streamed) == call.function.arguments
        history = kw["messages"] + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                                    {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
        prompt = httpx.post(f"{base}/apply-template", json={"model": tiny_path, "messages": history,
                                                             "tools": [WEATHER]}).json()["prompt"]
        assert '<calls><invoke name="get_weather"><arg name="city">' in prompt and "<|tool|>sunny" in prompt


def test_a_pythonic_call_with_a_newline_in_a_string_reads():
    """LFM2's template writes a string's newline as it is (`[f(a='x<newline>y')]`), which
    Python's own syntax refuses: the reader takes it as the escape it stands for."""
    from gguf_serve.server.chat.tool_parse import parse_pythonic

    (call,) = parse_pythonic("[get_weather(city='He said \"hi\"\nthen left', days=2)]")
    assert json.loads(call.arguments) == {"city": 'He said "hi"\nthen left', "days": 2}
    assert parse_pythonic("[get_weather(city='unclosed\n)]") is None
