"""Tool calls taken out of a model's text, in each family's form (server.chat.tools): whole
(`parse_calls`, `parse_call`) or as the text streams (`ToolCallSplitter`, which hands
on the content around the calls and the calls' OpenAI deltas as they form: Hermes
arguments in fragments, Mistral and Llama calls whole when the reply ends). Inside the
Hermes markers a call is JSON, Qwen3.5's `<function=…>` XML, or GLM-4.5's
`NAME<arg_key>K</arg_key><arg_value>V</arg_value>…` (the last two whole at the close,
values typed by the tool's schema)."""

from __future__ import annotations

import ast
import json
import re
import uuid

from dataclasses import dataclass

from ...engine import HERMES, LFM2, MISTRAL, Family, held_back
from .derived_calls import KEY_A, NAME_A, PROBE_TOOLS, VAL_A, Derived, derive, marker_of, without_turn_end
from .tools import ToolCall, functions, mistral_id


@dataclass(frozen=True)
class DerivedFamily(Family):
    """A template's own call syntax, read from its render of probe calls (server.chat.
    derived_calls): its calls run to the end of the reply and come whole there."""

    syntax: Derived | None = None

    @classmethod
    def of(cls, syntax: Derived) -> "DerivedFamily":
        return cls("derived", marker_of(syntax), None, syntax=syntax)

    def calls(self, text: str, tools: list[dict]) -> tuple[str, list[ToolCall]] | None:
        """(the content around them, the calls) of a reply's text from the marker on, or None."""
        got = self.syntax.parse(text) if self.syntax is not None else None
        if not got or not got[1]:
            return None
        names = {f.get("name") for f in functions(tools)}
        found = [(_tool_name(n, names), a) for n, a in got[1]]
        if self.syntax.args == "json":
            return got[0], [ToolCall(n, json.dumps(a, ensure_ascii=False)) for n, a in found]
        return got[0], [_typed_call(n, list(a.items()), tools) for n, a in found]


def _tool_name(written: str, names: set) -> str:
    """A call's function name as a template writes it, as the tool's: Kimi's
    `functions.NAME:INDEX` is NAME."""
    if written in names:
        return written
    bare = re.sub(r":\d+$", "", written.removeprefix("functions."))
    return bare if bare in names else written


def _typed(value, schema: dict | None):
    """A value written as text, typed by its schema; an object or list read from tags
    (derived_calls: MiniMax M3's), each member typed by its own."""
    schema = schema if isinstance(schema, dict) else {}
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        return {k: _typed(v, props.get(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v, schema.get("items")) for v in value]
    kind = schema.get("type")
    if kind == "string":
        return value
    try:
        return json.loads(value)
    except ValueError:
        pass
    try:  # a template that writes a mapping as Python does ({'a': 1}, True)
        literal = ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return value
    return literal if isinstance(literal, (dict, list, int, float, bool)) else value


def _typed_call(name: str, pairs: list[tuple[str, str]], tools: list[dict]) -> ToolCall:
    """A call written as (parameter, raw text) pairs, each value typed by the tool's schema."""
    params = next((f.get("parameters") or {} for f in functions(tools) if f.get("name") == name), {})
    props = params.get("properties") or {}
    return ToolCall(name, json.dumps({k: _typed(v, props.get(k)) for k, v in pairs}, ensure_ascii=False))


_XML_PARAM = re.compile(r"<parameter=([^>\s]+)>\n?(.*?)\n?</parameter>", re.S)
_GLM_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)
_GLM_BODY = re.compile(r"([^\s<>{}\[\]\"]+)\s*((?:<arg_key>.*?</arg_key>\s*<arg_value>.*?</arg_value>\s*)*)", re.S)


_GEMMA4_CALL = re.compile(r"call:([^\s{]+)\s*(\{.*\})", re.S)
_GEMMA4_QUOTE = '<|"|>'
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BARE_KEY = re.compile(r"([A-Za-z_][\w.\-]*)\s*:")


def gemma4_json(text: str) -> str:
    """Gemma 4's argument notation as JSON: strings between <|"|> marks, keys bare (JSON
    strings and keys pass as they are). ValueError for an unclosed string."""
    out, i, last = [], 0, ""
    while i < len(text):
        if text.startswith(_GEMMA4_QUOTE, i):
            j = text.find(_GEMMA4_QUOTE, i + len(_GEMMA4_QUOTE))
            if j < 0:
                raise ValueError("unclosed <|\"|> string")
            out.append(json.dumps(text[i + len(_GEMMA4_QUOTE):j], ensure_ascii=False))
            i, last = j + len(_GEMMA4_QUOTE), '"'
            continue
        m = _JSON_STRING.match(text, i) if text[i] == '"' else None
        if m:
            out.append(m.group(0))
            i, last = m.end(), '"'
            continue
        m = _BARE_KEY.match(text, i) if last in ("{", ",") else None
        if m:
            out.append(json.dumps(m.group(1)) + ":")
            i, last = m.end(), ":"
            continue
        out.append(text[i])
        if not text[i].isspace():
            last = text[i]
        i += 1
    return "".join(out)


def _literal(node):
    """A Python literal of a pythonic call's argument (JSON's true, false and null too)."""
    if isinstance(node, ast.Name) and node.id in ("true", "false", "null"):
        return {"true": True, "false": False, "null": None}[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values)}
    return ast.literal_eval(node)


def _newlines_escaped(text: str) -> str:
    """Python source with the line breaks inside its quoted strings written as escapes (LFM2's
    template writes a string's newline as it is, which a Python string cannot hold)."""
    out, quote, i = [], None, 0
    while i < len(text):
        c = text[i]
        if quote is not None and c == "\\" and i + 1 < len(text):
            out.append(text[i:i + 2])
            i += 2
            continue
        if c in "'\"" and quote in (None, c):
            quote = None if quote else c
        out.append({"\n": "\\n", "\r": "\\r"}.get(c, c) if quote else c)
        i += 1
    return "".join(out)


def parse_pythonic(body: str) -> list[ToolCall] | None:
    """LFM2's calls: a Python list of calls with keyword arguments (`[f(a=1), g(b="x")]`, or
    one call bare); None unless all of it is calls."""
    try:
        tree = ast.parse(body.strip(), mode="eval").body
    except (SyntaxError, ValueError):
        try:
            tree = ast.parse(_newlines_escaped(body.strip()), mode="eval").body
        except (SyntaxError, ValueError):
            return None
    calls = []
    for node in tree.elts if isinstance(tree, ast.List) else [tree]:
        if not isinstance(node, ast.Call) or node.args or any(k.arg is None for k in node.keywords):
            return None
        name = ast.unparse(node.func)
        if not re.fullmatch(r"[\w.\-]+", name):
            return None
        try:
            args = {k.arg: _literal(k.value) for k in node.keywords}
        except (ValueError, TypeError, SyntaxError):
            return None
        calls.append(ToolCall(name, json.dumps(args, ensure_ascii=False)))
    return calls or None


def parse_call(body: str, tools: list[dict]) -> ToolCall | None:
    """One call from the text between the markers; None if it is not one."""
    body = body.strip()
    m = _GEMMA4_CALL.fullmatch(body)
    if m:  # Gemma 4: call:NAME{key:value,...}
        try:
            args = json.loads(gemma4_json(m.group(2)))
        except ValueError:
            return None
        return ToolCall(m.group(1), json.dumps(args, ensure_ascii=False)) if isinstance(args, dict) else None
    m = re.match(r"<function=([^>\s]+)>(.*?)(?:</function>|$)", body, re.S)
    if m:
        return _typed_call(m.group(1), _XML_PARAM.findall(m.group(2)), tools)
    m = _GLM_BODY.fullmatch(body)
    if m and (m.group(2) or m.group(1) in {f.get("name") for f in functions(tools)}):
        # GLM-4.5: NAME, then <arg_key>K</arg_key><arg_value>V</arg_value> pairs
        return _typed_call(m.group(1), _GLM_ARG.findall(m.group(2)), tools)
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

    def _close(self, body: str) -> list[ToolCall]:
        """The calls of a closed block (LFM2's may hold several), their deltas queued; [] if it holds none."""
        if self.family is LFM2:
            found = parse_pythonic(body) or []
        else:
            found = [c for c in [parse_call(body, self.tools)] if c is not None]
        for k, call in enumerate(found):
            self.deltas += (self.stream.finish(call) if k == 0 else _CallStream(self.n_calls + k, call.id).finish(call))
        self.n_calls += len(found)
        self.stream = None
        return found

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
            found = self._close(body)
            if not found:
                out.append(opener + body + closer)
            else:
                calls += found
                self.pending = self.pending.lstrip("\n")
        return "".join(out), calls

    def flush(self) -> tuple[str, list[ToolCall]]:
        """The end of the reply: an unclosed block is a call if its body parses."""
        text, self.pending = self.pending, ""
        if not self.in_call:
            return text, []
        self.in_call = False
        if self.family.close is None:
            rest = ""
            if isinstance(self.family, DerivedFamily):
                got = self.family.calls(self.marker + text, self.tools)
                rest, calls = got if got is not None else ("", None)
            else:
                calls = parse_calls(text, self.tools, self.family)
            if calls is None:  # not calls after all: content, as written
                return self.marker + text, []
            for k, call in enumerate(calls):
                self.deltas += _CallStream(self.n_calls + k, call.id).finish(call)
            self.n_calls += len(calls)
            return rest, calls
        stream = self.stream
        self.deltas += stream.update(text)
        found = self._close(text)
        if found:
            return "", found
        if stream.name is not None:  # named and begun, then cut off: a call, marked incomplete
            self.n_calls += 1
            return "", [ToolCall(stream.name, stream.args, stream.id, complete=False)]
        return self.marker + text, []


def reads_probes(family: Family, replies: dict[str, str]) -> bool:
    """Whether `family`'s reader gives back the probe call a template rendered
    (server.chat.derived_calls.probe_replies): a hand-written family that reads one call
    keeps the template, its own rules for several apart."""
    if "one" not in replies:  # not rendered: the template refuses the probe's call
        return True
    splitter = ToolCallSplitter(PROBE_TOOLS, family)
    got = splitter.feed(without_turn_end(replies["one"], replies))[1] + splitter.flush()[1]
    try:
        return [(c.name, json.loads(c.arguments)) for c in got] == [(NAME_A, {KEY_A: VAL_A})]
    except ValueError:
        return False


def syntax_for(family: Family, renders_tools: bool, replies: dict[str, str]) -> Derived | None:
    """The derived syntax a template's calls are read in, or None where its hand-written
    family reads its own render of the probes (or nothing can be derived)."""
    if renders_tools and reads_probes(family, replies):
        return None
    return derive(replies)
