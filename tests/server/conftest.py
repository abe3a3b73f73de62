"""Fixtures of the server tests: tiny Qwen3-shaped models with a thinking chat template,
a Hermes tool template and a Qwen3.5-style XML tool template (thinking too)."""

import pytest

from server_harness import THINKING_TEMPLATE, TOOL_TEMPLATE, XML_TOOL_TEMPLATE
from tiny_models import random_model, spec, write_gguf


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    s = spec("qwen3")
    path = tmp_path_factory.mktemp("srv") / "tiny-qwen3.gguf"
    write_gguf(s, random_model(s, seed=5), path, "Q8_0", think=True, chat_template=THINKING_TEMPLATE)
    return str(path)


@pytest.fixture(scope="module")
def tools_path(tmp_path_factory):
    s = spec("qwen3")
    path = tmp_path_factory.mktemp("tools") / "tiny-tools.gguf"
    write_gguf(s, random_model(s, seed=7), path, "Q8_0", chat_template=TOOL_TEMPLATE)
    return str(path)


@pytest.fixture(scope="module")
def xml_tools_path(tmp_path_factory):
    s = spec("qwen3")
    path = tmp_path_factory.mktemp("tools") / "tiny-xml-tools.gguf"
    write_gguf(s, random_model(s, seed=11), path, "Q8_0", think=True, chat_template=XML_TOOL_TEMPLATE)
    return str(path)
