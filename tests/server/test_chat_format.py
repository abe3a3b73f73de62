"""A model's chat format is read once, when it loads (LoadedModel.chat_format): its fields
for the tiny thinking, Hermes tool, XML tool and harmony templates, and the request path
asking it rather than the template."""

import asyncio
import dataclasses
from types import SimpleNamespace

import pytest

from gguf_serve.engine import HERMES, THINK_CLOSE, THINK_OPEN, ChatFormat, TemplateWorkers, load_model
from gguf_serve.engine import chat_format as chat_format_module
from gguf_serve.engine.text import end_of_generation_ids
from gguf_serve.server.chat.protocol import ChatCompletionRequest
from gguf_serve.server.chat.serving import ChatServing
from gguf_serve.server.core.pools import Pools
from gguf_serve.server.settings import ServerSettings

from tiny_models import HARMONY_TOKENS, tiny_chat_model


def fields(path):
    lm = load_model(path, device="cpu")
    return lm, lm.chat_format, lm.tokenizer.backend_tokenizer.token_to_id


def test_thinking_template(tiny_path):
    lm, f, to_id = fields(tiny_path)
    assert isinstance(f, ChatFormat) and f.markers == (THINK_OPEN, THINK_CLOSE)
    assert (f.think_open, f.think_close) == (to_id(THINK_OPEN), to_id(THINK_CLOSE)) and f.think_open is not None
    assert f.thinks and f.has_switch and not f.harmony
    assert not f.renders_tools and f.calls.family is HERMES and f.calls.open_token is None
    assert to_id("<|im_end|>") in f.end_ids and end_of_generation_ids(lm) == set(f.end_ids)


def test_tool_templates(tools_path, xml_tools_path):
    _, f, to_id = fields(tools_path)
    assert f.renders_tools and f.renders_calls and f.calls.family is HERMES and not f.calls.xml
    assert not f.has_switch and not f.harmony and f.calls.open_token == to_id("<tool_call>")
    _, f, _ = fields(xml_tools_path)
    assert f.renders_tools and f.calls.xml and f.has_switch and f.thinks


def test_harmony_template(tmp_path):
    from converter import llama_cpp_src

    template = open(f"{llama_cpp_src()}/models/templates/openai-gpt-oss-120b.jinja").read()
    lm, f, to_id = fields(tiny_chat_model(tmp_path, "tiny-gpt-oss.gguf", 0, template, arch="gpt-oss",
                                          extra_tokens=HARMONY_TOKENS))
    assert f.harmony and {to_id("<|return|>"), to_id("<|call|>")} <= f.end_ids and to_id("<|end|>") not in f.end_ids
    # the same vocabulary under a template that writes no harmony: <|end|> ends generation, as any end of turn
    plain = ChatFormat.of("<|im_start|>{{ m }}", lm.tokenizer, lm.gguf.metadata)
    assert not plain.harmony and to_id("<|end|>") in plain.end_ids


def test_requests_ask_the_format_read_at_load(tiny_path, monkeypatch):
    """Two requests see the one ChatFormat the load made; nothing re-reads the template for
    it (the detection raises once the model is loaded), and a format that says the model
    does not think is obeyed although its template does."""
    lm = load_model(tiny_path, device="cpu")
    loaded = lm.chat_format

    def no_detection(*args, **kwargs):
        raise AssertionError("the chat format was read again")

    for name in ("reasoning_markers", "call_format", "template_has_switch", "template_renders_tools",
                 "writes_harmony", "family_of"):
        monkeypatch.setattr(chat_format_module, name, no_detection)
    monkeypatch.setattr(ChatFormat, "of", no_detection)
    service = ChatServing(None, ServerSettings(), TemplateWorkers(1), Pools())
    entry = SimpleNamespace(id="tiny", lm=lm, path=None)

    def prepare():
        req = ChatCompletionRequest(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)

        async def once():  # each in its own loop, with its own template worker
            try:
                return await service._prepare_chat(entry, req)
            finally:
                await service.templates.aclose()
        return asyncio.run(once())

    first, second = prepare(), prepare()
    assert first.entry.lm.chat_format is second.entry.lm.chat_format is loaded
    assert first.split == second.split and first.split.enabled and first.split.in_reasoning
    assert first.split.markers == loaded.markers and not first.split.harmony
    lm.chat_format = dataclasses.replace(loaded, thinks=False)
    assert not prepare().split.enabled


@pytest.mark.parametrize("template", [None, ""])
def test_no_template(template, tiny_path):
    lm = load_model(tiny_path, device="cpu")
    f = ChatFormat.of(template, lm.tokenizer, lm.gguf.metadata)
    assert not f.has_switch and not f.harmony and not f.renders_tools and f.markers == (THINK_OPEN, THINK_CLOSE)
    assert f.thinks  # the vocabulary has <think>
