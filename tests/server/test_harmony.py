"""gpt-oss's harmony format: the reply split by channel (analysis → reasoning, final and
preambles → content, messages to functions.NAME → tool calls, streamed), its own template
fed what it expects (reasoning level, earlier reasoning, one call per message), forced
calls and JSON answers in the format, and a tiny gpt-oss model served end to end."""

import json

import pytest

from gguf_serve.engine import writes_harmony as is_harmony
from gguf_serve.server.chat.harmony import HarmonySplitter, for_template, forced_grammar, reasoning_effort, tools_for_template
from gguf_serve.server.chat.tool_parse import ToolCallSplitter

from server_harness import TOOLS, accepts
from tiny_models import HARMONY_TOKENS, tiny_chat_model

CALL_WEATHER = ('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
                '{"city":"Paris","unit":"c"}')
RECORDED = [  # (generated text, as gpt-oss writes it up to the token that ends generation; reasoning, content, calls)
    ("<|channel|>analysis<|message|>User greets. Reply briefly.<|end|><|start|>assistant<|channel|>final"
     "<|message|>Hello! How can I help?", "User greets. Reply briefly.", "Hello! How can I help?", []),
    ("<|channel|>analysis<|message|>Need the weather: call the tool.<|end|><|start|>assistant" + CALL_WEATHER,
     "Need the weather: call the tool.", "", [("get_weather", {"city": "Paris", "unit": "c"})]),
    # the recipient before the channel, as the template renders earlier calls
    ('<|channel|>analysis<|message|>Add them.<|end|><|start|>assistant to=functions.add<|channel|>commentary json'
     '<|message|>{"a": 1, "b": 2}', "Add them.", "", [("add", {"a": 1, "b": 2})]),
    # a preamble to the user on the commentary channel, then the call
    ("<|channel|>commentary<|message|>Checking the weather now.<|end|><|start|>assistant" + CALL_WEATHER,
     "", "Checking the weather now.", [("get_weather", {"city": "Paris", "unit": "c"})]),
    # no analysis at all
    ("<|channel|>final<|message|>42 < 43, and <b>bold</b> stays.", "", "42 < 43, and <b>bold</b> stays.", []),
    # not harmony (a model or prompt outside the format): content as written
    ("Hi there", "", "Hi there", []),
    # reasoning cut off by max_tokens stays reasoning
    ("<|channel|>analysis<|message|>Thinking about", "Thinking about", "", []),
]


def split(pieces, tools=TOOLS):
    h, t = HarmonySplitter(), ToolCallSplitter(tools)
    reasoning, content, calls, deltas = "", "", [], []
    for p in pieces:
        r, c = h.feed(p)
        c, k = t.feed(c)
        reasoning, content, calls, deltas = reasoning + r, content + c, calls + k, deltas + t.take_deltas()
    r, c = h.flush()
    c, k = t.feed(c)
    c2, k2 = t.flush()
    deltas += t.take_deltas()
    return reasoning + r, content + c + c2, [(x.name, json.loads(x.arguments)) for x in calls + k + k2], deltas


@pytest.mark.parametrize("text,reasoning,content,calls", RECORDED)
def test_recorded_replies_split_in_every_chunking(text, reasoning, content, calls):
    chunkings = [[text], list(text)] + [[text[:i], text[i:]] for i in range(1, len(text), 3)]
    for pieces in chunkings:
        got = split(pieces)
        assert got[:3] == (reasoning, content, calls), pieces
        if calls:  # streamed: the name first, then the arguments, which add up to the call's
            named = [d for d in got[3] if d["function"].get("name")]
            assert [d["function"]["name"] for d in named] == [calls[0][0]]
            args = "".join(d["function"].get("arguments", "") for d in got[3])
            assert json.loads(args) == calls[0][1]


def test_reasoning_effort_levels():
    assert [reasoning_effort(e, None) for e in ("low", "medium", "high", "minimal", "none", "xhigh")] == \
        ["low", "medium", "high", "low", "low", "high"]
    assert reasoning_effort(None, False) == "low"  # --reasoning off: the least gpt-oss does
    assert reasoning_effort(None, None) is None and reasoning_effort(None, True) is None  # its default, medium


@pytest.fixture(scope="module")
def gpt_oss_template():
    from converter import llama_cpp_src

    return open(f"{llama_cpp_src()}/models/templates/openai-gpt-oss-120b.jinja").read()


@pytest.fixture(scope="module")
def oss(tmp_path_factory, gpt_oss_template):
    folder = tmp_path_factory.mktemp("oss")
    return tiny_chat_model(folder, "tiny-gpt-oss.gguf", 0, gpt_oss_template, arch="gpt-oss",
                           extra_tokens=HARMONY_TOKENS)


def test_its_template_renders_what_the_parser_reads(oss, gpt_oss_template):
    """The level in the system prompt, the tools, an earlier call with its reasoning (two calls
    in one message become two turns, each with its result), and each rendered call read back
    by the splitter as the call it was."""
    from gguf_serve.engine.chat import render
    from gguf_serve.engine.tokenizer import load_tokenizer
    from gguf_serve.gguf_io import GGUFReader

    assert is_harmony(gpt_oss_template) and not is_harmony("<|im_start|>{{ m }}")
    tok = load_tokenizer(GGUFReader(oss))
    calls = [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris",
                                                                                                 "unit": "c"}}},
             {"id": "c2", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]
    messages = for_template([
        {"role": "user", "content": "weather and a sum?"},
        {"role": "assistant", "content": "", "reasoning_content": "Two tools.", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "3"}])
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "tool"]
    rendered = render(tok, gpt_oss_template, messages, tools=tools_for_template(TOOLS), reasoning_effort="high")
    assert "Reasoning: high" in rendered and "type get_weather = " in rendered
    assert "<|channel|>analysis<|message|>Two tools.<|end|>" in rendered  # reasoning kept before a call
    assert rendered.endswith("<|start|>assistant")
    got = []
    for name in ("get_weather", "add"):
        start = rendered.index(f"<|start|>assistant to=functions.{name}")
        end = rendered.index("<|call|>", start)
        got += split([rendered[start:end]])[2]
    assert got == [("get_weather", {"city": "Paris", "unit": "c"}), ("add", {"a": 1, "b": 2})]
    assert '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"sunny"' in rendered
    assert '<|start|>functions.add to=assistant<|channel|>commentary<|message|>"3"' in rendered


def test_forced_calls_and_json_answers_in_the_format(oss):
    from gguf_serve.engine.tokenizer import load_tokenizer
    from gguf_serve.gguf_io import GGUFReader

    tok = load_tokenizer(GGUFReader(oss))
    to_id = tok.backend_tokenizer.token_to_id
    any_call = forced_grammar(to_id, TOOLS)
    call = 'commentary to=functions.add <|constrain|>json<|message|>{"a": 1, "b": 2}'
    assert accepts(any_call, "<|channel|>" + call, tok)
    assert accepts(any_call, "<|channel|>analysis<|message|>I should add.<|end|><|start|>assistant<|channel|>" + call,
                   tok)
    assert not accepts(any_call, '<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 1}', tok)
    assert not accepts(any_call, "<|channel|>final<|message|>no call", tok)
    named = forced_grammar(to_id, TOOLS, "get_weather")
    assert not accepts(named, "<|channel|>" + call, tok)
    answer = forced_grammar(to_id, schema={"type": "object", "properties": {"n": {"type": "integer"}},
                                           "required": ["n"]})
    assert accepts(answer, '<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final<|message|>{"n": 3}',
                   tok)
    assert not accepts(answer, '<|channel|>final<|message|>{"n": "three"}', tok)
    with pytest.raises(ValueError, match="not among the tools"):
        forced_grammar(to_id, TOOLS, "nope")


def test_harmony_vocabulary_ends_generation_at_return_and_call_only(oss):
    from gguf_serve.engine import load_model
    from gguf_serve.engine.text import end_of_generation_ids

    lm = load_model(oss, device="cpu")
    to_id = lm.tokenizer.backend_tokenizer.token_to_id
    ends = end_of_generation_ids(lm)
    assert {to_id("<|return|>"), to_id("<|call|>")} <= ends and to_id("<|end|>") not in ends


def test_served_gpt_oss_forced_call_and_json_answer(oss):
    """A tiny gpt-oss file with its own template over HTTP (the OpenAI SDK): a named
    tool_choice gives that call, response_format a JSON answer, no harmony marker leaks.
    (logit_bias on <|end|> keeps the random model's analysis short: the grammar lets it
    reason first, and a random model seldom stops on its own.)"""
    import openai

    from gguf_serve.engine.tokenizer import load_tokenizer
    from gguf_serve.gguf_io import GGUFReader
    from server_harness import server

    bias = {str(load_tokenizer(GGUFReader(oss)).backend_tokenizer.token_to_id("<|end|>")): 30}

    with server(oss, "--ctx-size", "4096") as base:
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)
        r = c.chat.completions.create(model="tiny-gpt-oss.gguf", messages=[{"role": "user", "content": "Add 1 and 2."}],
                                      tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}},
                                      max_tokens=300, reasoning_effort="low", seed=1, logit_bias=bias)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls
        assert call.function.name == "add" and set(json.loads(call.function.arguments)) == {"a", "b"}
        assert "<|" not in (choice.message.content or "")
        r = c.chat.completions.create(
            model="tiny-gpt-oss.gguf", messages=[{"role": "user", "content": "A number?"}], max_tokens=300, seed=2, logit_bias=bias,
            response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": {
                "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}})
        message = r.choices[0].message
        assert r.choices[0].finish_reason == "stop"
        assert isinstance(json.loads(message.content)["n"], int)
        assert "<|" not in (getattr(message, "reasoning_content", None) or "")
