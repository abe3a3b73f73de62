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

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
CALL_WHITESPACE = r"\x20?"  # in forced calls' JSON: at most a space between tokens (calls stay one line)

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

    def openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


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


_JSON_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(?=[{\[])')
_XML_HEAD = re.compile(r"\s*<function=([^>\s]+)>")


class _CallStream:
    """An open block's call as it is generated, as OpenAI stream deltas: the id, type
    and name once the name is out, then the JSON arguments in fragments as they come
    (the Hermes form with `name` first and an object or array value; otherwise, or in
    the XML form, the arguments whole once the block closes)."""

    def __init__(self, index: int):
        self.index, self.id = index, f"call_{uuid.uuid4().hex[:24]}"
        self.name: str | None = None
        self.args_at = -1  # where the arguments start in the body; -1: sent whole at the end
        self.sent = 0  # characters of the arguments sent
        self.depth, self.in_str, self.esc, self.closed = 0, False, False, False

    def _start(self, name: str) -> dict:
        self.name = name
        return {"index": self.index, "id": self.id, "type": "function", "function": {"name": name, "arguments": ""}}

    def update(self, body: str) -> list[dict]:
        out = []
        if self.name is None:
            m = _JSON_HEAD.match(body)
            if m:
                try:
                    out.append(self._start(json.loads(f'"{m.group(1)}"')))
                    self.args_at = m.end()
                except ValueError:
                    return out
            else:
                m = _XML_HEAD.match(body)
                if not m:
                    return out
                out.append(self._start(m.group(1)))
        if self.args_at < 0 or self.closed:
            return out
        text, end = body[self.args_at:], self.sent
        for ch in text[self.sent:]:  # up to the end of the arguments' value (brackets outside strings)
            end += 1
            if self.in_str:
                self.esc, self.in_str = (False, True) if self.esc else (ch == "\\", ch != '"')
            elif ch == '"':
                self.in_str = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.closed = True
                    break
        if end > self.sent:
            out.append({"index": self.index, "function": {"arguments": text[self.sent:end]}})
            self.sent = end
        return out

    def finish(self, call: ToolCall) -> list[dict]:
        """The block closed as `call`: what its stream has not said yet."""
        call.id = self.id
        out = [] if self.name is not None else [self._start(call.name)]
        if self.args_at < 0 or not self.sent:
            out.append({"index": self.index, "function": {"arguments": call.arguments}})
        return out


class ToolCallSplitter:
    """Streamed content in, (content, calls) out: text outside the markers is content
    (held back while it may be the start of a marker), each closed block a call. A
    block that does not parse stays content. `take_deltas()` gives the calls as OpenAI
    stream deltas as they form (names first, then argument fragments)."""

    def __init__(self, tools: list[dict]):
        self.tools = tools
        self.pending = ""
        self.in_call = False
        self.n_calls = 0
        self.stream: _CallStream | None = None
        self.deltas: list[dict] = []

    def take_deltas(self) -> list[dict]:
        out, self.deltas = self.deltas, []
        return out

    def _close(self, body: str) -> ToolCall | None:
        call = parse_call(body, self.tools)
        if call is not None:
            self.deltas += self.stream.finish(call)
            self.n_calls += 1
        self.stream = None
        return call

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
                self.stream = _CallStream(self.n_calls)
            j = self.pending.find(TOOL_CLOSE)
            if j < 0:
                # the body so far, less what may be the start of the closing marker
                self.deltas += self.stream.update(self.pending[:len(self.pending) - held_back(self.pending,
                                                                                               [TOOL_CLOSE])])
                break
            body, self.pending, self.in_call = self.pending[:j], self.pending[j + len(TOOL_CLOSE):], False
            self.deltas += self.stream.update(body)
            call = self._close(body)
            if call is None:
                out.append(TOOL_OPEN + body + TOOL_CLOSE)
            else:
                calls.append(call)
                self.pending = self.pending.lstrip("\n")
        return "".join(out), calls

    def flush(self) -> tuple[str, list[ToolCall]]:
        """The end of the reply: an unclosed block is a call if its body parses."""
        text, self.pending = self.pending, ""
        if self.in_call:
            self.in_call = False
            self.deltas += self.stream.update(text)
            call = self._close(text)
            return ("", [call]) if call is not None else (TOOL_OPEN + text, [])
        return text, []


def template_writes_xml(template: str | None) -> bool:
    """Whether the template's calls are the Qwen3.5 / Qwen3-Coder XML body."""
    return bool(template) and "<function=" in template


NL = "\n"


def _lark_str(text: str) -> str:
    return json.dumps(text)  # a JSON string literal is a lark string literal


def _is_text(schema: dict) -> bool:
    """A parameter written as raw text in the XML form (a string, or an enum of strings)."""
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if values is not None:
        return all(isinstance(v, str) for v in values)
    return schema.get("type") == "string"


def _xml_value(rule: str, schema: dict) -> str:
    """The lark rule of one XML parameter's value: raw text for strings, else JSON."""
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if values is not None and _is_text(schema):
        return f"{rule}: " + " | ".join(_lark_str(v) for v in values)
    if _is_text(schema):
        most = schema.get("maxLength")
        return f"{rule}: /[^<\\n]{{{schema.get('minLength', 1)},{most if most is not None else 200}}}/"
    return f"{rule}: %json {json.dumps({**schema, 'x-guidance': {'whitespace_pattern': CALL_WHITESPACE}})}"


def _xml_call(k: int, f: dict) -> list[str]:
    """Rules for one function's XML call: its parameters in schema order, the required ones
    always, the others optionally."""
    params = f.get("parameters") or {}
    required = set(params.get("required") or [])
    rules, parts = [], []
    for j, (p, schema) in enumerate((params.get("properties") or {}).items()):
        value = f"v{k}_{j}"
        rules.append(_xml_value(value, schema if isinstance(schema, dict) else {}))
        part = f"{_lark_str(f'<parameter={p}>' + NL)} {value} {_lark_str(NL + '</parameter>' + NL)}"
        parts.append(part if p in required else f"({part})?")
    head, tail = _lark_str(f"{TOOL_OPEN}{NL}<function={f['name']}>{NL}"), _lark_str(f"</function>{NL}{TOOL_CLOSE}")
    return [f"c{k}: {head} {' '.join(parts)} {tail}"] + rules


def required_grammar(tools: list[dict], name: str | None, parallel: bool, xml: bool = False) -> str:
    """A grammar for replies that are tool calls only: one (or, with `parallel`, several)
    blocks naming one of the tools (or `name`) with arguments matching its parameters:
    Hermes JSON blocks, or with `xml` the Qwen3.5 form."""
    from llguidance import LLMatcher

    chosen = [f for f in functions(tools) if name is None or f.get("name") == name]
    if not chosen:
        raise ValueError(f"tool_choice names {name!r}, which is not among the tools")
    repeat = ' ("\\n" call)*' if parallel else ""
    if xml:
        rules = [f"start: call{repeat}", "call: " + " | ".join(f"c{k}" for k in range(len(chosen)))]
        for k, f in enumerate(chosen):
            rules += _xml_call(k, f)
        return LLMatcher.grammar_from_lark("\n".join(rules) + "\n")
    options = []
    for f in chosen:
        params = f.get("parameters") or {"type": "object"}
        options.append({"type": "object", "properties": {"name": {"const": f["name"]}, "arguments": params},
                        "required": ["name", "arguments"], "additionalProperties": False})
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    schema = {**schema, "x-guidance": {"whitespace_pattern": CALL_WHITESPACE}}
    lark = (f"start: call{repeat}\n"
            f'call: "{TOOL_OPEN}\\n" body "\\n{TOOL_CLOSE}"\n'
            f"body: %json {json.dumps(schema)}\n")
    return LLMatcher.grammar_from_lark(lark)
