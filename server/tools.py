"""Tool calls: the OpenAI `tools` rendered through the chat template, the model's calls
taken out of its text, and `tool_choice` `required` / a named function enforced with a
grammar. One format family per template, chosen from its markers:

- Hermes / Qwen 2.5-3: `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, with the
  Qwen3.5 / Qwen3-Coder body (`<tool_call><function=NAME><parameter=P>value</parameter>
  </function></tool_call>`, values typed by the tool's schema) inside the same markers;
- Mistral: `[TOOL_CALLS]` then a JSON list of calls (v3) or `NAME[ARGS]{…}` per call
  (v11 and later), to the end of the reply; tool call ids of 9 letters and digits, as
  its templates demand;
- Llama 3.x: a reply that is a JSON object `{"name": …, "parameters": {…}}` naming one
  of the tools (after `<|python_tag|>` or bare), several joined by `;`.

A template that renders no tools of its own gets them in a system message asking for
the Hermes form (the generic fallback). Hermes calls stream their JSON arguments in
fragments; Mistral and Llama calls come whole when the reply ends."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from ..engine.generate import held_back
from ..engine.grammar import closed_objects

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
    complete: bool = True  # False: cut off at the end of the reply (arguments as far as they came)

    def __post_init__(self):
        self.id = self.id or f"call_{uuid.uuid4().hex[:24]}"

    def openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


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
MISTRAL = Family("mistral", "[TOOL_CALLS]", None)
LLAMA3 = Family("llama3", "<|python_tag|>", None, leading=True)


def family_of(template: str | None) -> Family:
    """The call format of a chat template (Hermes for one that renders no tools: the fallback)."""
    template = template or ""
    if MISTRAL.open in template:
        return MISTRAL
    if TOOL_OPEN not in template and (LLAMA3.open in template or "<|start_header_id|>ipython" in template
                                      or "ipython<|end_header_id|>" in template):
        return LLAMA3
    return HERMES


def template_renders_tools(template: str | None) -> bool:
    if not template or "tools" not in template:
        return False
    family = family_of(template)
    return family is not HERMES or TOOL_OPEN in template


def mistral_id(call_id: str | None) -> str:
    """A tool call id as Mistral's templates demand it: 9 letters and digits (others mapped
    to one, the same every time)."""
    if isinstance(call_id, str) and re.fullmatch(r"[A-Za-z0-9]{9}", call_id):
        return call_id
    digest = uuid.uuid5(uuid.NAMESPACE_OID, str(call_id)).hex
    return digest[:9]


def for_template(messages: list[dict], family: Family) -> None:
    """Adapt rendered messages to the family's template (Mistral's call ids)."""
    if family is not MISTRAL:
        return
    for m in messages:
        for c in m.get("tool_calls") or []:
            c["id"] = mistral_id(c.get("id"))
        if m.get("tool_call_id") is not None:
            m["tool_call_id"] = mistral_id(m["tool_call_id"])


def render_fallback(messages: list[dict], tools: list[dict]) -> None:
    """For a template that renders no tools: the tools in the system message, and earlier
    calls and results as text the template can render."""
    system = fallback_system(tools)
    if messages and messages[0]["role"] == "system":
        messages[0] = {**messages[0], "content": messages[0]["content"] + "\n\n" + system}
    else:
        messages.insert(0, {"role": "system", "content": system})
    for m in messages:
        if m.get("tool_calls"):
            calls = "\n".join(f"{TOOL_OPEN}\n{json.dumps(c['function'])}\n{TOOL_CLOSE}" for c in m.pop("tool_calls"))
            m["content"] = (m["content"] + "\n" if m["content"] else "") + calls
        if m["role"] == "tool":
            m.pop("tool_call_id", None)
            m.update(role="user", content=f"<tool_response>\n{m['content']}\n</tool_response>")


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


def _call_object(obj, names: set[str] | None) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    if names is not None and obj["name"] not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if not isinstance(args, (dict, str)):
        return None
    call_id = obj.get("id") if isinstance(obj.get("id"), str) and obj["id"] else ""
    return ToolCall(obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False), call_id)


def _json_values(text: str) -> list | None:
    """The JSON values of `text`, one after another (separated by whitespace or `;`)."""
    decoder, out, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i] in " \t\r\n;":
            i += 1
        if i == len(text):
            return out
        try:
            value, i = decoder.raw_decode(text, i)
        except ValueError:
            return None
        out.append(value)


def parse_calls(body: str, tools: list[dict], family: Family) -> list[ToolCall] | None:
    """The calls in an open-ended block (Mistral, Llama 3.x): None unless all of it is calls."""
    names = {f.get("name") for f in functions(tools)}
    body = body.strip()
    if family is MISTRAL and body and not body.startswith(("[", "{")):  # v11: NAME[ARGS]{...} per call
        calls = []
        for part in body.split(MISTRAL.open):
            m = re.fullmatch(r"\s*([^\[\s]+)(?:\[CALL_ID\]([A-Za-z0-9]+))?\[ARGS\](.*)", part, re.S)
            if not m:
                return None
            try:
                args = json.loads(m.group(3))
            except ValueError:
                return None
            call = _call_object({"name": m.group(1), "arguments": args, "id": m.group(2)}, None)
            if call is None:
                return None
            calls.append(call)
        return _mistral_ids(calls) or None
    values = _json_values(body.replace(MISTRAL.open, " ") if family is MISTRAL else body)
    if not values:
        return None
    if len(values) == 1 and isinstance(values[0], list):
        values = values[0]
    calls = [_call_object(v, names if family.leading else None) for v in values]
    if not calls or any(c is None for c in calls):
        return None
    return _mistral_ids(calls) if family is MISTRAL else calls


def _mistral_ids(calls: list[ToolCall]) -> list[ToolCall]:
    for c in calls:  # the model's own id if it wrote one, else a new one of 9 characters
        c.id = mistral_id(c.id) if not c.id.startswith("call_") else uuid.uuid4().hex[:9]
    return calls


_JSON_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(?=[{\[])')
_XML_HEAD = re.compile(r"\s*<function=([^>\s]+)>")


class _CallStream:
    """An open block's call as it is generated, as OpenAI stream deltas: the id, type
    and name once the name is out, then the JSON arguments in fragments as they come
    (the Hermes form with `name` first and an object or array value; otherwise, or in
    the XML form, the arguments whole once the block closes)."""

    def __init__(self, index: int, call_id: str | None = None):
        self.index, self.id = index, call_id or f"call_{uuid.uuid4().hex[:24]}"
        self.name: str | None = None
        self.args_at = -1  # where the arguments start in the body; -1: sent whole at the end
        self.sent = 0  # characters of the arguments sent
        self.depth, self.in_str, self.esc, self.closed = 0, False, False, False
        self.args = ""  # the arguments streamed so far

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
            self.args = text[:end]
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

    def __init__(self, tools: list[dict], family: Family = HERMES):
        self.tools, self.family = tools, family
        self.pending = ""
        self.in_call = False
        self.at_start = family.leading  # nothing but whitespace seen yet: a JSON object may be a call
        self.marker = family.open  # what opened the block being read
        self.n_calls = 0
        self.stream: _CallStream | None = None
        self.deltas: list[dict] = []

    def take_deltas(self) -> list[dict]:
        """The deltas formed since the last call, one per call (a call's fragments joined:
        clients read one delta per call index in a chunk)."""
        out: list[dict] = []
        for d in self.deltas:
            if out and out[-1]["index"] == d["index"]:
                f = out[-1]["function"]
                f["arguments"] = f.get("arguments", "") + d["function"].get("arguments", "")
            else:
                out.append({**d, "function": dict(d["function"])})
        self.deltas = []
        return out

    def _close(self, body: str) -> ToolCall | None:
        call = parse_call(body, self.tools)
        if call is not None:
            self.deltas += self.stream.finish(call)
            self.n_calls += 1
        self.stream = None
        return call

    def _open(self, i: int, marker: str, out: list) -> None:
        out.append(self.pending[:i])
        self.pending, self.in_call, self.marker = self.pending[i + len(marker):], True, marker
        self.stream = _CallStream(self.n_calls)

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self.pending += text
        out, calls = [], []
        opener, closer = self.family.open, self.family.close
        if self.at_start and self.pending.strip():
            self.at_start = False
            if self.pending.lstrip().startswith("{"):  # the reply is a call, or JSON content
                self._open(0, "", out)
        while True:
            if not self.in_call:
                i = self.pending.find(opener)
                if i < 0:
                    keep = held_back(self.pending, [opener]) if not self.at_start else len(self.pending)
                    out.append(self.pending[:len(self.pending) - keep])
                    self.pending = self.pending[len(self.pending) - keep:]
                    break
                self._open(i, opener, out)
            if closer is None:  # the calls run to the end of the reply
                break
            j = self.pending.find(closer)
            if j < 0:
                # the body so far, less what may be the start of the closing marker
                self.deltas += self.stream.update(self.pending[:len(self.pending) - held_back(self.pending,
                                                                                               [closer])])
                break
            body, self.pending, self.in_call = self.pending[:j], self.pending[j + len(closer):], False
            self.deltas += self.stream.update(body)
            call = self._close(body)
            if call is None:
                out.append(opener + body + closer)
            else:
                calls.append(call)
                self.pending = self.pending.lstrip("\n")
        return "".join(out), calls

    def flush(self) -> tuple[str, list[ToolCall]]:
        """The end of the reply: an unclosed block is a call if its body parses."""
        text, self.pending = self.pending, ""
        if not self.in_call:
            return text, []
        self.in_call = False
        if self.family.close is None:
            calls = parse_calls(text, self.tools, self.family)
            if calls is None:  # not calls after all: content, as written
                return self.marker + text, []
            for k, call in enumerate(calls):
                self.deltas += _CallStream(self.n_calls + k, call.id).finish(call)
            self.n_calls += len(calls)
            return "", calls
        stream = self.stream
        self.deltas += stream.update(text)
        call = self._close(text)
        if call is not None:
            return "", [call]
        if stream.name is not None:  # named and begun, then cut off: a call, marked incomplete
            self.n_calls += 1
            return "", [ToolCall(stream.name, stream.args, stream.id, complete=False)]
        return self.marker + text, []


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


def _parameters(f: dict) -> dict:
    """A function's parameters schema for a forced call: any object when it gives none,
    its objects closed to unlisted keys (`closed_objects`)."""
    return closed_objects(f.get("parameters") or {"type": "object"})


def _xml_call(k: int, f: dict) -> list[str]:
    """Rules for one function's XML call: its parameters in schema order, the required ones
    always, the others optionally."""
    params = _parameters(f)
    required = set(params.get("required") or [])
    rules, parts = [], []
    for j, (p, schema) in enumerate((params.get("properties") or {}).items()):
        value = f"v{k}_{j}"
        rules.append(_xml_value(value, schema if isinstance(schema, dict) else {}))
        part = f"{_lark_str(f'<parameter={p}>' + NL)} {value} {_lark_str(NL + '</parameter>' + NL)}"
        parts.append(part if p in required else f"({part})?")
    head, tail = _lark_str(f"{TOOL_OPEN}{NL}<function={f['name']}>{NL}"), _lark_str(f"</function>{NL}{TOOL_CLOSE}")
    return [f"c{k}: {head} {' '.join(parts)} {tail}"] + rules


@dataclass(frozen=True)
class CallFormat:
    """A template's call format in full: its family, and within it the body's form (Qwen3.5's
    XML, Mistral's `NAME[ARGS]{…}`) and the opening marker's token id when it is one token."""

    family: Family = HERMES
    xml: bool = False
    named_args: bool = False
    open_token: int | None = None


def call_format(template: str | None, token_id) -> CallFormat:
    """`token_id(text)`: the vocabulary's id of a one-token text, else None."""
    if not template_renders_tools(template):
        return CallFormat()
    family = family_of(template)
    return CallFormat(family, xml=family is HERMES and template_writes_xml(template),
                      named_args=family is MISTRAL and "[ARGS]" in template, open_token=token_id(family.open))


def _options(chosen: list[dict], args_key: str) -> dict:
    options = [{"type": "object", "properties": {"name": {"const": f["name"]},
                                                 args_key: _parameters(f)},
                "required": ["name", args_key], "additionalProperties": False} for f in chosen]
    return options[0] if len(options) == 1 else {"anyOf": options}


def _with_ws(schema: dict) -> dict:
    return {**schema, "x-guidance": {"whitespace_pattern": CALL_WHITESPACE}}


def required_grammar(tools: list[dict], name: str | None, parallel: bool, fmt: CallFormat = CallFormat()) -> str:
    """A grammar for replies that are tool calls only: one (or, with `parallel`, several)
    calls in the template's format, naming one of the tools (or `name`), with arguments
    matching its parameters."""
    from llguidance import LLMatcher

    chosen = [f for f in functions(tools) if name is None or f.get("name") == name]
    if not chosen:
        raise ValueError(f"tool_choice names {name!r}, which is not among the tools")
    family = fmt.family
    marker = f"<[{fmt.open_token}]>" if fmt.open_token is not None else _lark_str(family.open)
    if family is MISTRAL and fmt.named_args:
        rules = [f"start: call{' call*' if parallel else ''}",
                 "call: " + " | ".join(f"c{k}" for k in range(len(chosen)))]
        for k, f in enumerate(chosen):
            params = _with_ws(_parameters(f))
            rules.append(f"c{k}: {marker} {_lark_str(f['name'] + '[ARGS]')} a{k}")
            rules.append(f"a{k}: %json {json.dumps(params)}")
        return LLMatcher.grammar_from_lark("\n".join(rules) + "\n")
    if family is MISTRAL:
        array = {"type": "array", "items": _options(chosen, "arguments"), "minItems": 1,
                 **({} if parallel else {"maxItems": 1})}
        return LLMatcher.grammar_from_lark(f"start: {marker} body\nbody: %json {json.dumps(_with_ws(array))}\n")
    if family is LLAMA3:
        repeat = ' ("; " call)*' if parallel else ""
        return LLMatcher.grammar_from_lark(f"start: call{repeat}\n"
                                           f"call: %json {json.dumps(_with_ws(_options(chosen, 'parameters')))}\n")
    repeat = ' ("\\n" call)*' if parallel else ""
    if fmt.xml:
        rules = [f"start: call{repeat}", "call: " + " | ".join(f"c{k}" for k in range(len(chosen)))]
        for k, f in enumerate(chosen):
            rules += _xml_call(k, f)
        return LLMatcher.grammar_from_lark("\n".join(rules) + "\n")
    lark = (f"start: call{repeat}\n"
            f'call: "{TOOL_OPEN}\\n" body "\\n{TOOL_CLOSE}"\n'
            f"body: %json {json.dumps(_with_ws(_options(chosen, 'arguments')))}\n")
    return LLMatcher.grammar_from_lark(lark)
