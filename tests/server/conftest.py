"""Fixtures of the server tests: tiny Qwen3-shaped models with a thinking chat template,
a Hermes tool template and a Qwen3.5-style XML tool template (thinking too)."""

import pytest

from server_harness import THINKING_TEMPLATE, TOOL_TEMPLATE, XML_TOOL_TEMPLATE
from tiny_models import tiny_chat_model


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return tiny_chat_model(tmp_path_factory.mktemp("srv"), "tiny-qwen3.gguf", 5, THINKING_TEMPLATE, think=True)


@pytest.fixture(scope="module")
def tools_path(tmp_path_factory):
    return tiny_chat_model(tmp_path_factory.mktemp("tools"), "tiny-tools.gguf", 7, TOOL_TEMPLATE)


@pytest.fixture(scope="module")
def xml_tools_path(tmp_path_factory):
    return tiny_chat_model(tmp_path_factory.mktemp("tools"), "tiny-xml-tools.gguf", 11, XML_TOOL_TEMPLATE, think=True)
