"""gpt-oss's chat format (OpenAI's harmony): a reply is a run of messages, each a header
and a body,

    <|channel|>analysis<|message|>…reasoning…<|end|>
    <|start|>assistant<|channel|>final<|message|>…answer…<|return|>

or, for a tool call, `<|start|>assistant<|channel|>commentary to=functions.NAME
<|constrain|>json<|message|>{…arguments…}<|call|>` (the recipient may also come before
the channel). The analysis channel is the reasoning; the final channel, and commentary
addressed to no one (a preamble), the answer; a message to `functions.NAME` a call.
`<|return|>` and `<|call|>` end generation, `<|end|>` only a message (engine.chat_format).

Here: the template's inputs (reasoning_effort from the request, earlier reasoning as
`thinking`, one call per assistant message as its template assumes), the split of the
streamed reply, and the grammar of a forced reply (tool_choice required or named,
response_format) in the format."""

from __future__ import annotations

import json
import re

from ...engine import TOOL_CLOSE, TOOL_OPEN, held_back
from .tool_grammar import _lark_str, _parameters, _with_ws, chosen_functions

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
CONSTRAIN, CALL, RETURN = "<|constrain|>", "<|call|>", "<|return|>"
MARKERS = (START, END, MESSAGE, CHANNEL, CONSTRAIN, CALL, RETURN)
MAX_HEADER = 200  # characters before <|message|>; past it, the model is not writing harmony

# OpenAI's reasoning_effort values → the levels gpt-oss's system prompt knows (it always reasons)
EFFORTS = {"none": "low", "minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high"}

_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([A-Za-z_]+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")


def reasoning_effort(requested: str | None, thinking: bool | None) -> str | None:
    """The template's reasoning level: the request's reasoning_effort mapped to low / medium /
    high, else low where reasoning is switched off (gpt-oss cannot stop reasoning; low is the
    least), None (the template's default, medium) otherwise."""
    if requested is not None:
        return EFFORTS.get(requested, "medium")
    return "low" if thinking is False else None


def for_template(messages: list[dict]) -> list[dict]:
    """Messages as gpt-oss's template reads them: earlier reasoning as `thinking` (with a
    call, the template keeps one of content and thinking: the reasoning, else the content),
    and an assistant message with several calls as one message per call, each followed by
    its result (the template names a tool result after the latest call)."""
    out: list[dict] = []
    results = {m.get("tool_call_id"): m for m in messages if m["role"] == "tool"}
    placed: set[int] = set()
    for m in messages:
        if m["role"] == "tool" and id(m) in placed:
            continue
        if m["role"] != "assistant":
            out.append(m)
            continue
        m = dict(m)
        if m.get("reasoning_content"):
            m["thinking"] = m.pop("reasoning_content")
        calls = m.get("tool_calls") or []
        if calls and m.get("thinking") and m.get("content"):
            m.pop("content")
        if len(calls) <= 1:
            out.append(m)
            continue
        for k, c in enumerate(calls):
            part = {"role": "assistant", "content": m.get("content") if k == 0 else "", "tool_calls": [c]}
            if k == 0 and m.get("thinking"):
                part["thinking"] = m["thinking"]
            out.append(part)
            result = results.get(c.get("id")) if k < len(calls) - 1 else None
            if result is not None:
                out.append(result)
                placed.add(id(result))
    return out


def tools_for_template(tools: list[dict]) -> list[dict]:
    """The request's tools as the template reads them: it writes each function's description
    as a comment and fails on one without; an empty one is given."""
    return [{**t, "function": {"description": "", **t["function"]}} if isinstance(t.get("function"), dict) else t
            for t in tools]


class HarmonySplitter:
    """Streamed harmony text in, (reasoning, content) out, as ReasoningSplitter gives them.
    A message to `functions.NAME` comes out in the content as a Hermes call
    (`<tool_call>{"name": NAME, "arguments": …}</tool_call>`, its arguments streamed as
    they come) for the ToolCallSplitter behind this one. A reply that is not harmony at
    all (no header within MAX_HEADER characters) is content as written."""

    def __init__(self):
        self.state = "header"  # header (up to <|message|>), body, or between (after a message's end)
        self.pending = ""
        self.kind = "content"  # the body's: reasoning, content or call
        self.seen = False  # a message has begun

    @property
    def in_reasoning(self) -> bool:
        return self.state == "body" and self.kind == "reasoning"

    def _begin(self, header: str, out: dict) -> None:
        channel = _CHANNEL.search(header)
        to = _RECIPIENT.search(header)
        self.seen = True
        if to and to.group(1).startswith("functions."):
            self.kind = "call"
            name = to.group(1)[len("functions."):]
            out["content"].append(f'{TOOL_OPEN}{{"name": {json.dumps(name)}, "arguments": ')
        elif channel and channel.group(1) == "analysis":
            self.kind = "reasoning"
        else:  # final, or a commentary preamble to the user
            self.kind = "content"

    def _end(self, out: dict) -> None:
        if self.kind == "call":
            out["content"].append(f"}}{TOOL_CLOSE}")
        self.kind = "content"

    def _emit(self, text: str, out: dict) -> None:
        out["reasoning" if self.kind == "reasoning" else "content"].append(text)

    def feed(self, text: str) -> tuple[str, str]:
        self.pending += text
        out = {"reasoning": [], "content": []}
        while self.pending:
            if self.state == "between":  # until the next message's <|start|>
                i = self.pending.find(START)
                if i < 0:
                    self.pending = self.pending[len(self.pending) - held_back(self.pending, [START]):]
                    break
                self.pending, self.state = self.pending[i + len(START):], "header"
            elif self.state == "header":
                i = self.pending.find(MESSAGE)
                if i < 0:
                    if len(self.pending) > MAX_HEADER and not self.seen:  # not harmony: plain text
                        self.state, self.kind = "body", "content"
                        continue
                    break
                header, self.pending = self.pending[:i], self.pending[i + len(MESSAGE):]
                self._begin(header, out)
                self.state = "body"
            else:
                ends = [(j, m) for m in (END, CALL, RETURN, START) if (j := self.pending.find(m)) >= 0]
                if not ends:
                    keep = held_back(self.pending, list(MARKERS))
                    self._emit(self.pending[:len(self.pending) - keep], out)
                    self.pending = self.pending[len(self.pending) - keep:]
                    break
                j, marker = min(ends)
                self._emit(self.pending[:j], out)
                self._end(out)
                self.pending = self.pending[j + (0 if marker == START else len(marker)):]
                self.state = "between"
        return "".join(out["reasoning"]), "".join(out["content"])

    def flush(self) -> tuple[str, str]:
        out = {"reasoning": [], "content": []}
        if self.state == "body":
            self._emit(self.pending, out)
            self._end(out)
        elif self.state == "header" and not self.seen and MESSAGE not in self.pending and CHANNEL not in self.pending:
            out["content"].append(self.pending)  # a short reply that never was harmony
        self.pending, self.state = "", "between"
        return "".join(out["reasoning"]), "".join(out["content"])


def forced_grammar(token_id, tools: list[dict] | None = None, name: str | None = None,
                   schema: dict | None = None) -> str:
    """A grammar (llguidance lark) for a reply that must be a call to one of `tools` (or the
    function `name`), or, with `schema`, a final answer that is JSON: the analysis message
    may come first, then the call's or the answer's message. `token_id(text)`: the
    vocabulary's id of a harmony marker."""
    from llguidance import LLMatcher

    tok = {m: f"<[{token_id(m)}]>" for m in (START, END, MESSAGE, CHANNEL, CONSTRAIN)}
    if any(v == "<[None]>" for v in tok.values()):
        raise ValueError("the vocabulary lacks harmony's marker tokens")
    rules = [f'start: analysis? body',
             f'analysis: {tok[CHANNEL]} "analysis" {tok[MESSAGE]} TEXT {tok[END]} {tok[START]} "assistant"',
             "TEXT: /(?s:.*)/"]
    if schema is not None or tools is None:
        s = _with_ws(schema if schema is not None else {"type": "object"})
        rules.append(f'body: {tok[CHANNEL]} "final" {tok[MESSAGE]} %json {json.dumps(s)}')
    else:
        chosen = chosen_functions(tools, name)
        rules.append("body: " + " | ".join(f"c{k}" for k in range(len(chosen))))
        for k, f in enumerate(chosen):
            params = _with_ws(_parameters(f))
            head = _lark_str(f"commentary to=functions.{f['name']} ")
            rules.append(f'c{k}: {tok[CHANNEL]} {head} {tok[CONSTRAIN]} "json" {tok[MESSAGE]} %json {json.dumps(params)}')
    return LLMatcher.grammar_from_lark("\n".join(rules) + "\n")
