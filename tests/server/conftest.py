"""Fixtures of the server tests: a tiny Qwen3-shaped model with a thinking chat template."""

import pytest

from server_harness import THINKING_TEMPLATE
from tiny_models import random_model, spec, write_gguf


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    s = spec("qwen3")
    path = tmp_path_factory.mktemp("srv") / "tiny-qwen3.gguf"
    write_gguf(s, random_model(s, seed=5), path, "Q8_0", think=True, chat_template=THINKING_TEMPLATE)
    return str(path)
