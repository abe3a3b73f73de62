"""Reasoning control and the split of streamed text into reasoning and answer."""

import pytest

from gguf_serve.engine import BRACKET_THINK, CHANNEL_THOUGHT, reasoning_markers, template_has_switch
from gguf_serve.server.chat.reasoning import ReasoningSplitter, enable_thinking, starts_in_reasoning


@pytest.mark.parametrize("kwargs,effort,flag,expected", [
    ({"enable_thinking": False}, "high", "on", False),   # request kwargs win over everything
    ({"enable_thinking": True}, "none", "off", True),
    (None, "none", "on", False),                        # then reasoning_effort
    (None, "low", "off", True),
    (None, None, "on", True),                           # then the server flag
    (None, None, "off", False),
    (None, None, "auto", None),                         # then the template's default
    ({"other": 1}, None, "auto", None),
])
def test_precedence(kwargs, effort, flag, expected):
    assert enable_thinking(kwargs, effort, flag) == expected


def test_prompt_that_opens_the_block():
    assert starts_in_reasoning("<|im_start|>assistant\n<think>\n")
    assert not starts_in_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not starts_in_reasoning("<|im_start|>assistant\n")


def _run(splitter, pieces):
    r, c = [], []
    for p in pieces:
        a, b = splitter.feed(p)
        r.append(a), c.append(b)
    a, b = splitter.flush()
    return "".join(r) + a, "".join(c) + b


def test_template_opened_block_then_answer_split_across_pieces():
    s = ReasoningSplitter(in_reasoning=True)
    assert _run(s, ["Let me", " think.", "</th", "ink>\n\nThe", " answer."]) == ("Let me think.", "The answer.")


def test_model_opened_block():
    s = ReasoningSplitter(in_reasoning=False)
    assert _run(s, ["<think>", "\nhmm", "</think>", "\n\nYes"]) == ("hmm", "Yes")


def test_think_tag_inside_an_answer_stays_content():
    s = ReasoningSplitter(in_reasoning=False)
    assert _run(s, ["Use ", "<think>", " tags"]) == ("", "Use <think> tags")


def test_disabled_splitter_passes_everything_as_content():
    s = ReasoningSplitter(in_reasoning=True, enabled=False)
    assert _run(s, ["<think>a</think>b"]) == ("", "<think>a</think>b")


def test_unfinished_reasoning_never_becomes_content():
    s = ReasoningSplitter(in_reasoning=True)
    assert _run(s, ["still thinking", " </thi"]) == ("still thinking </thi", "")


def test_mistral_bracket_blocks_split_in_every_chunking():
    """Mistral's reasoning models write [THINK]…[/THINK] before the answer."""
    text = "[THINK]Paris is the capital.[/THINK]It is Paris."
    for pieces in [[text], list(text)] + [[text[:i], text[i:]] for i in range(1, len(text))]:
        s = ReasoningSplitter(in_reasoning=False, markers=BRACKET_THINK)
        assert _run(s, pieces) == ("Paris is the capital.", "It is Paris."), pieces
    s = ReasoningSplitter(in_reasoning=False)  # <think> markers leave the brackets in the answer
    assert _run(s, [text]) == ("", text)


def test_each_template_picks_its_markers():
    from converter import llama_cpp_src

    folder = f"{llama_cpp_src()}/models/templates"
    ministral = open(f"{folder}/mistralai-Ministral-3-14B-Reasoning-2512.jinja").read()
    assert reasoning_markers(ministral) == BRACKET_THINK
    assert not starts_in_reasoning("[SYSTEM_PROMPT]…[THINK]draft[/THINK]…[/SYSTEM_PROMPT][INST]hi[/INST]", BRACKET_THINK)
    for name in ("Qwen3.5-4B.jinja", "GLM-4.6.jinja"):
        assert reasoning_markers(open(f"{folder}/{name}").read()) == ("<think>", "</think>")
    gemma4 = open(f"{folder}/google-gemma-4-31B-it.jinja").read()
    assert reasoning_markers(gemma4) == CHANNEL_THOUGHT and template_has_switch(gemma4)
    # thinking off: the template closes an empty thought channel in the prompt; on, the model opens one
    assert not starts_in_reasoning("<|turn>user\nhi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>", CHANNEL_THOUGHT)


def test_gemma4_thought_channel_splits_in_every_chunking():
    text = "<|channel>thought\nThe user says hi.<channel|>Hello!"
    for pieces in [[text], list(text)] + [[text[:i], text[i:]] for i in range(1, len(text))]:
        s = ReasoningSplitter(in_reasoning=False, markers=CHANNEL_THOUGHT)
        assert _run(s, pieces) == ("The user says hi.", "Hello!"), pieces
    assert reasoning_markers(None) == ("<think>", "</think>")
