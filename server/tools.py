"""Tool calls: the OpenAI `tools` rendered through the chat template, the model's calls
taken out of its text, and `tool_choice` `required` / a named function enforced with a
grammar.

The format family implemented is Hermes / Qwen 2.5-3 (`<tool_call>{"name": …,
"arguments": {…}}</tool_call>`), with the Qwen3.5 / Qwen3-Coder body
(`<tool_call><function=NAME><parameter=P>value</parameter></function></tool_call>`,
values typed by the tool's schema) recognized inside the same markers. A template that
renders no tools of its own gets them in a system message asking for the Hermes form
(the generic fallback). Llama 3.x and Mistral formats are not implemented yet."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from ..engine.generate import held_back
from ..engine.grammar import JSON_WHITESPACE

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"

FALLBACK_SYSTEM = (
    "You can call these functions. To call one, reply with nothing but\n"
    "<tool_call>\n{\"name\": <function name>, \"arguments\": <arguments as a JSON object>}\n</tool_call>\n"
    "(one such block per call). The functions, as JSON schemas:\n")


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON object, as text
    id: str = ""

    def __post_init__(self):
        self.id = self.id or f"call_{uuid.uuid4().hex[:24]}"

    def openai(self, index: int | None = None) -> dict:
        d = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return d if index is None else {"index": index, **d}


def template_renders_tools(template: str | None) -> bool:
    return bool(template) and "tools" in template and TOOL_OPEN in template


def functions(tools: list[dict]) -> list[dict]:
    """The function specs of OpenAI `tools` entries (other tool types refused by the caller)."""
    return [t["function"] for t in tools if t.get("type") == "function" and isinstance(t.get("function"), dict)]


def fallback_system(tools: list[dict]) -> str:
    return FALLBACK_SYSTEM + "\n".join(json.dumps(f, ensure_ascii=False) for f in functions(tools))


def _typed(value: str, schema: dict | None):
    kind = (schema or {}).get("type")
    if kind == "string":
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def parse_call(body: str, tools: list[dict]) -> ToolCall | None:
    """One call from the text between the markers; None if it is not one."""
    body = body.strip()
    m = re.match(r"<function=([^>\s]+)>(.*?)(?:</function>|$)", body, re.S)
    if m:
        name = m.group(1)
        params = next((f.get("parameters") or {} for f in functions(tools) if f.get("name") == name), {})
        props = params.get("properties") or {}
        args = {}
        for p in re.finditer(r"<parameter=([^>\s]+)>\n?(.*?)\n?</parameter>", m.group(2), re.S):
            args[p.group(1)] = _typed(p.group(2), props.get(p.group(1)))
        return ToolCall(name, json.dumps(args, ensure_ascii=False))
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return ToolCall(obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))


class ToolCallSplitter:
    """Streamed content in, (content, calls) out: text outside the markers is content
    (held back while it may be the start of a marker), each closed block a call. A
    block that does not parse stays content."""

    def __init__(self, tools: list[dict]):
        self.tools = tools
        self.pending = ""
        self.in_call = False

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self.pending += text
        out, calls = [], []
        while True:
            if not self.in_call:
                i = self.pending.find(TOOL_OPEN)
                if i < 0:
                    keep = held_back(self.pending, [TOOL_OPEN])
                    out.append(self.pending[:len(self.pending) - keep])
                    self.pending = self.pending[len(self.pending) - keep:]
                    break
                out.append(self.pending[:i])
                self.pending, self.in_call = self.pending[i + len(TOOL_OPEN):], True
            j = self.pending.find(TOOL_CLOSE)
            if j < 0:
                break
            body, self.pending, self.in_call = self.pending[:j], self.pending[j + len(TOOL_CLOSE):], False
            call = parse_call(body, self.tools)
            if call is None:
                out.append(TOOL_OPEN + body + TOOL_CLOSE)
            else:
                calls.append(call)
                self.pending = self.pending.lstrip("\n") if calls else self.pending
        return "".join(out), calls

    def flush(self) -> tuple[str, list[ToolCall]]:
        """The end of the reply: an unclosed block is a call if its body parses."""
        text, self.pending = self.pending, ""
        if self.in_call:
            self.in_call = False
            call = parse_call(text, self.tools)
            return ("", [call]) if call is not None else (TOOL_OPEN + text, [])
        return text, []


def required_grammar(tools: list[dict], name: str | None, parallel: bool) -> str:
    """A grammar for replies that are tool calls only: one (or, with `parallel`, several)
    Hermes blocks whose JSON names one of the tools (or `name`) with arguments matching its
    parameters."""
    from llguidance import LLMatcher

    options = []
    for f in functions(tools):
        if name is not None and f.get("name") != name:
            continue
        params = f.get("parameters") or {"type": "object"}
        options.append({"type": "object", "properties": {"name": {"const": f["name"]}, "arguments": params},
                        "required": ["name", "arguments"], "additionalProperties": False})
    if not options:
        raise ValueError(f"tool_choice names {name!r}, which is not among the tools")
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    schema = {**schema, "x-guidance": {"whitespace_pattern": JSON_WHITESPACE}}
    repeat = ' ("\\n" call)*' if parallel else ""
    lark = (f"start: call{repeat}\n"
            f'call: "{TOOL_OPEN}\\n" body "\\n{TOOL_CLOSE}"\n'
            f"body: %json {json.dumps(schema)}\n")
    return LLMatcher.grammar_from_lark(lark)
