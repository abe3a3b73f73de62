"""A model's chat format, read once from its chat template and vocabulary when it loads
(`ChatFormat`, on `LoadedModel.chat_format`): how it marks reasoning and whether its
template can switch reasoning off, the form it writes tool calls in, whether it speaks
OpenAI's harmony (gpt-oss), and the tokens that end its generation. Requests ask the
ChatFormat; nothing re-reads the template for these.

Tool-call families, one per template, chosen from its markers:

- Hermes / Qwen 2.5-3: `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, with the
  Qwen3.5 / Qwen3-Coder XML body and GLM-4.5's key/value pairs inside the same markers;
- Mistral: `[TOOL_CALLS]` then a JSON list of calls (v3) or `NAME[ARGS]{…}` per call (v11 on);
- Llama 3.x: a reply that is a JSON object naming a tool (after `<|python_tag|>` or bare);
- Gemma 4: `<|tool_call>call:NAME{key:value,…}<tool_call|>`;
- LFM2: `<|tool_call_start|>[f(a=1), g(b="x")]<|tool_call_end|>`.

A template that renders no tools of its own gets them from the server as a system
message asking for the Hermes form (the generic fallback)."""

from __future__ import annotations

from dataclasses import dataclass

from ..gguf_io import Keys
from .text import END_OF_GENERATION_TEXTS, HARMONY_ENDS

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
BRACKET_THINK = ("[THINK]", "[/THINK]")  # Mistral's reasoning models (Magistral, Ministral 3 Reasoning)
CHANNEL_THOUGHT = ("<|channel>thought", "<channel|>")  # Gemma 4's thought channel


@dataclass(frozen=True)
class Family:
    """How a template's model writes calls: `open` starts one; `close` ends it (None: the
    calls run to the end of the reply); `leading`: a reply that starts as a JSON object
    may be a call without the marker."""

    name: str
    open: str
    close: str | None
    leading: bool = False


HERMES = Family("hermes", TOOL_OPEN, TOOL_CLOSE)
GEMMA4 = Family("gemma4", "<|tool_call>", "<tool_call|>")  # call:NAME{key:value,...}, strings in <|"|>
LFM2 = Family("lfm2", "<|tool_call_start|>", "<|tool_call_end|>")  # [f(a=1), g(b="x")]: Python calls
MISTRAL = Family("mistral", "[TOOL_CALLS]", None)
LLAMA3 = Family("llama3", "<|python_tag|>", None, leading=True)


def family_of(template: str | None) -> Family:
    """The call format of a chat template (Hermes for one that renders no tools: the fallback)."""
    template = template or ""
    if MISTRAL.open in template:
        return MISTRAL
    if GEMMA4.open in template:
        return GEMMA4
    if LFM2.open in template or "List of tools: [" in template:  # LFM2.5-Instruct's lists the tools only
        return LFM2
    if TOOL_OPEN not in template and (LLAMA3.open in template or "<|start_header_id|>ipython" in template
                                      or "ipython<|end_header_id|>" in template):
        return LLAMA3
    return HERMES


def template_renders_tools(template: str | None) -> bool:
    if not template or "tools" not in template:
        return False
    family = family_of(template)
    return family is not HERMES or TOOL_OPEN in template


def template_writes_xml(template: str | None) -> bool:
    """Whether the template's calls are the Qwen3.5 / Qwen3-Coder XML body."""
    return bool(template) and "<function=" in template


@dataclass(frozen=True)
class CallFormat:
    """A template's call format in full: its family, and within it the body's form (Qwen3.5's
    XML, GLM-4.5's key/value pairs, Mistral's `NAME[ARGS]{…}`) and the opening marker's
    token id when it is one token."""

    family: Family = HERMES
    xml: bool = False
    named_args: bool = False
    open_token: int | None = None
    arg_pairs: bool = False  # GLM-4.5: NAME, then <arg_key>/<arg_value> pairs, inside the Hermes markers


def call_format(template: str | None, token_id) -> CallFormat:
    """`token_id(text)`: the vocabulary's id of a one-token text, else None."""
    if not template_renders_tools(template):
        return CallFormat()
    family = family_of(template)
    return CallFormat(family, xml=family is HERMES and template_writes_xml(template),
                      named_args=family is MISTRAL and "[ARGS]" in template, open_token=token_id(family.open),
                      arg_pairs=family is HERMES and "<arg_key>" in template)


def reasoning_markers(template: str | None) -> tuple[str, str]:
    """The (open, close) tags of a template's reasoning blocks: Mistral's `[THINK]` where the
    template writes those and no `<think>`, Gemma 4's thought channel, else `<think>`."""
    if template and BRACKET_THINK[0] in template and THINK_OPEN not in template:
        return BRACKET_THINK
    if template and CHANNEL_THOUGHT[0] in template and CHANNEL_THOUGHT[1] in template:
        return CHANNEL_THOUGHT
    return THINK_OPEN, THINK_CLOSE


def template_has_switch(template: str | None) -> bool:
    return bool(template) and "enable_thinking" in template


def writes_harmony(template: str | None) -> bool:
    """Whether a chat template writes the harmony format (gpt-oss's)."""
    return bool(template) and "<|channel|>" in template and "<|start|>assistant" in template


@dataclass(frozen=True)
class ChatFormat:
    """What a model's template and vocabulary say about its chat, decided once at load.

    `markers`: its reasoning tags, `think_open` / `think_close` their token ids (None where
    a tag is not one token); `thinks`: the vocabulary or template knows the open tag;
    `has_switch`: the template takes `enable_thinking`. `calls`: its tool-call format
    (HERMES, the fallback's, where `renders_tools` is False: the template renders none);
    `renders_calls`: the template writes earlier calls (`tool_calls`). `harmony`: gpt-oss's
    format, its template writing harmony and its vocabulary ending generation with
    <|return|> and <|call|>. `end_ids`: the tokens that end its generation."""

    markers: tuple[str, str] = (THINK_OPEN, THINK_CLOSE)
    think_open: int | None = None
    think_close: int | None = None
    thinks: bool = False
    has_switch: bool = False
    calls: CallFormat = CallFormat()
    renders_tools: bool = False
    renders_calls: bool = False
    harmony: bool = False
    end_ids: frozenset[int] = frozenset()

    @classmethod
    def of(cls, template: str | None, tokenizer, metadata: dict) -> "ChatFormat":
        """The format of a model with this template, tokenizer and (GGUF) metadata."""
        to_id = tokenizer.backend_tokenizer.token_to_id
        markers = reasoning_markers(template)
        think_open, think_close = (to_id(t) for t in markers)
        harmony = writes_harmony(template) and None not in {to_id(t) for t in HARMONY_ENDS}
        return cls(markers, think_open, think_close,
                   thinks=think_open is not None or bool(template and markers[0] in template),
                   has_switch=template_has_switch(template), calls=call_format(template, to_id),
                   renders_tools=template_renders_tools(template), renders_calls="tool_calls" in (template or ""),
                   harmony=harmony, end_ids=end_ids(metadata, to_id, harmony))


def end_ids(metadata: dict, to_id, harmony: bool) -> frozenset[int]:
    """EOS and every end-of-turn token the vocabulary has (llama.cpp's EOG set, in spirit).
    A harmony model (gpt-oss) ends generation with <|return|> and <|call|>; its <|end|>
    ends one message of a reply, not the reply (as llama.cpp does)."""
    ids = {metadata.get(k) for k in (Keys.TOKENIZER_EOS_ID, Keys.TOKENIZER_EOT_ID, Keys.TOKENIZER_EOM_ID)}
    ids |= {to_id(t) for t in END_OF_GENERATION_TEXTS}
    if harmony:
        ids = (ids - {to_id("<|end|>")}) | {to_id(t) for t in HARMONY_ENDS}
    return frozenset(i for i in ids if isinstance(i, int))
