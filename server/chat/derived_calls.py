"""Tool calls read the way a model's own chat template writes them, for the templates the
hand-written families (engine.chat_format) do not read: DeepSeek's, Kimi's, MiniMax's,
Seed-OSS's, Command-R's and the others of their kind.

The template is asked to render an assistant turn with probe calls (`probes`): one call,
two calls, one call with two arguments, each name, key and value a string found nowhere
else. Where the probes land gives the syntax (`derive`): what comes before each call's
name, between the name and the arguments, after the arguments; what wraps the calls; and
the arguments' form: a JSON object, or key/value pairs with their own markers (values as
text, typed by the tool's schema). A reply is then read with that syntax (`Derived.parse`),
whitespace between markers taken loosely. A template whose probes do not give a syntax that
reads its own render back gets none (`derive` returns None)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ...engine import END_OF_GENERATION_TEXTS, TemplateError

PASSING = ("busy", "timeout", "memory")  # a render's failures that say nothing of the template's syntax

NAME_A, NAME_B = "probe_fn_alpha", "probe_fn_beta"
KEY_A, KEY_B = "probe_key_one", "probe_key_two"
VAL_A, VAL_B = "probe value one", "probe value two"
TEXT = "probe reply text"  # an answer without calls: what follows it ends the turn
KEY_SLOT = "\x00key\x00"  # in a value's close that names its key (MiniMax M3's `</city>`): the key
NAME_SLOT = "\x00name\x00"  # in what follows a call's name, where it writes the name again

PROBE_TOOLS = [{"type": "function", "function": {
    "name": n, "description": "a probe", "parameters": {"type": "object", "properties": {
        KEY_A: {"type": "string"}, KEY_B: {"type": "string"}}, "required": [KEY_A]}}} for n in (NAME_A, NAME_B)]


CLOSERS = ">]})\"'"  # characters that end a marker rather than start one


def _call(name: str, args: dict, i: int) -> dict:
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}


def probes() -> dict[str, list[dict]]:
    """The assistant turns' tool_calls to render (arguments as mappings, as templates read them)."""
    return {"one": [_call(NAME_A, {KEY_A: VAL_A}, 0)],
            "two": [_call(NAME_A, {KEY_A: VAL_A}, 0), _call(NAME_B, {KEY_B: VAL_B}, 1)],
            "pairs": [_call(NAME_A, {KEY_A: VAL_A, KEY_B: VAL_B}, 0)]}


def _common_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def reply_of(prompt: str, rendered: str) -> str:
    """What a rendered conversation adds after the generation prompt of the one before it:
    the assistant's turn (from the start of the marker it parts in, where the prompt ended
    with another one, such as a `<think>` the reply does not have)."""
    n = _common_prefix(prompt, rendered)
    if n < len(prompt):  # they part inside the prompt's end: go back to a boundary
        while n > 0 and not rendered[n - 1].isspace() and rendered[n - 1] not in ">]}":
            n -= 1
    return rendered[n:]


def _common_suffix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


def _loose(literal: str) -> str:
    """A literal as a regex whose whitespace runs (and its ends) match any whitespace."""
    parts = [re.escape(p) for p in re.split(r"\s+", literal.strip()) if p]
    return r"\s*" + r"\s*".join(parts) + r"\s*" if parts else r"\s*"


def _numbered(literal: str) -> str:
    """A name's end as a regex, loose as `_loose`, whose numbers are each call's own (Kimi K3's
    `" index="1"`, which the next call writes as 2) and whose NAME_SLOT is the name again."""
    pieces = (r"\d+" if p.isdigit() else r"\s*" if p.isspace() else r"[\w.\-:/]+" if p == NAME_SLOT else re.escape(p)
              for p in re.split(f"(\\d+|\\s+|{NAME_SLOT})", literal.strip()) if p)
    return r"\s*" + "".join(pieces) + r"\s*"


def _whole(literal: str) -> str:
    """The shared start of two texts, without a special token's part at its end (`<|eo` of
    `<|eom|>` and `<|eot|>`): a marker is whole or not there."""
    cut = literal.rfind("<|")
    return literal[:cut] if cut >= 0 and "|>" not in literal[cut:] else literal


@dataclass(frozen=True)
class Derived:
    """A template's call syntax. `args` is "json" (a JSON object after `name_end`) or "pairs"
    (`pair_open` KEY `key_end` VALUE `pair_close`, repeated)."""

    section_open: str
    call_open: str
    name_end: str
    call_close: str
    section_close: str
    args: str
    separator: str = ""  # between one call's close and the next one's open
    ids: int = 0  # the form of call ids the template takes (ID_FORMS)
    one_call: bool = False  # the template writes one call a turn (GigaChat 3's), drops the others
    pair_open: str = ""
    key_end: str = ""
    pair_close: str = ""

    @property
    def marker(self) -> str:
        """What starts the calls in a reply: the first literal a model writes for them."""
        return (self.section_open.strip() or self.call_open.strip())

    def parse(self, text: str) -> tuple[str, list[tuple[str, dict]]] | None:
        """(the content around the calls, [(name, arguments)]) of a reply, or None where it
        holds no calls in this syntax (or calls that do not read)."""
        start = None
        if self.section_open.strip():
            start = re.search(_loose(self.section_open) + _loose(self.call_open), text)
        start = start or re.search(_loose(self.call_open), text)
        if start is None:
            return None
        content, pos, calls = text[:start.start()], start.end(), []
        wrap = self.section_open.strip()
        if wrap and content.strip() and wrap.endswith(content.strip()):  # the wrapper's end, before a call
            content = ""
        call_open, call_close = re.compile(_loose(self.call_open)), re.compile(_loose(self.call_close))
        name_end = re.compile(_numbered(self.name_end))
        separator = re.compile(f"(?:{_loose(self.separator)})?")
        while True:
            end = name_end.search(text, pos)
            if end is None:
                return None
            name = re.sub(r":\d+$", "", text[pos:end.start()].strip())  # Kimi's NAME:INDEX
            if not re.fullmatch(r"[\w.\-:/]+", name):
                return None
            pos = end.end()
            if self.args == "json":
                try:
                    args, stop = json.JSONDecoder().raw_decode(text, pos)
                except ValueError:
                    return None
                if not isinstance(args, dict):
                    return None
                pos = stop
            else:
                args, pos = self._pairs(text, pos)
            close = call_close.match(text, pos)
            if close is None:
                return None
            calls.append((name, args))
            pos = close.end()
            nxt = call_open.match(text, separator.match(text, pos).end())
            if nxt is None:
                break
            pos = nxt.end()
        close = re.compile(_loose(self.section_close)).match(text, pos) if self.section_close.strip() else None
        if close is not None:
            pos = close.end()
        return content + text[pos:], calls

    def _pairs(self, text: str, pos: int) -> tuple[dict, int]:
        pairs, pos = self._pair_list(text, pos)
        return dict(pairs), pos

    def _pair_list(self, text: str, pos: int) -> tuple[list[tuple[str, object]], int]:
        """The key/value pairs from `pos` on, and where they end. A value that is pairs itself
        (MiniMax M3 writes an object's members as tags, an array's as `item` tags) is read
        as an object, or a list where every key is `item`."""
        out = []
        pair_open, key_end = re.compile(_loose(self.pair_open)), re.compile(_attributes(self.key_end))
        keyed = KEY_SLOT in self.pair_close  # the close names its key: values may be tags themselves
        while True:
            start = pair_open.match(text, pos)
            if start is None or not self.pair_open.strip():
                return out, pos
            key_at = key_end.search(text, start.end())
            if key_at is None:
                return out, pos
            key = text[start.end():key_at.start()].strip()
            close = self.pair_close.strip().replace(KEY_SLOT, key)
            opening = self.pair_open.strip() + key + self.key_end.strip() if keyed else None
            stop = _closing(text, key_at.end(), close, opening)
            if stop is None or not key:
                return out, pos
            value: object = text[key_at.end():stop[0]].strip("\n")
            if value.startswith("<![CDATA[") and value.endswith("]]>"):  # MiniCPM's text with markup in it
                value = value[len("<![CDATA["):-len("]]>")]
            elif keyed and pair_open.match(value):
                members, end = self._pair_list(value, 0)
                if members and not value[end:].strip():
                    value = ([v for _, v in members] if {k for k, _ in members} == {"item"}
                             else dict(members))
            out.append((key, value))
            pos = stop[1]
            ws = re.compile(r"\s*").match(text, pos)
            pos = ws.end() if pair_open.match(text, ws.end()) else pos


def _closing(text: str, pos: int, close: str, opening: str | None) -> tuple[int, int] | None:
    """(start, end) of a value's close from `pos`: the first, or where the close names its key
    (a tag's: `opening` is the tag's own), the one that matches it, past nested tags of its name."""
    if opening is None:  # the first close (a line break where the template writes none)
        close = close or "\n"
        i = text.find(close, pos)
        return (i, i + len(close)) if i >= 0 else None
    depth = 0
    for m in re.finditer(re.escape(close) + "|" + re.escape(opening), text[pos:]):
        if m.group() == opening:
            depth += 1
        elif depth == 0:
            return pos + m.start(), pos + m.end()
        else:
            depth -= 1
    return None


def derive(replies: dict[str, str]) -> Derived | None:
    """The syntax the rendered probe replies show (their text after the generation prompt,
    keyed as `probes`), or None where they show none this reads."""
    one, two, pairs = replies.get("one", ""), replies.get("two", ""), replies.get("pairs", "")
    i_name = one.find(NAME_A)
    i_key, i_val = one.find(KEY_A), one.find(VAL_A)
    if min(i_name, i_key, i_val) < 0 or not i_name < i_key < i_val:
        return None
    # the arguments: a JSON object holding the probe's, or key/value pairs
    args, a_start, a_end = "pairs", i_key, i_val + len(VAL_A)
    for p in [m.start() for m in re.finditer(r"\{", one[i_name:i_key + 1])]:
        try:
            obj, stop = json.JSONDecoder().raw_decode(one, i_name + p)
        except ValueError:
            continue
        if obj == {KEY_A: VAL_A}:
            args, a_start, a_end = "json", i_name + p, stop
            break
    fields: dict = {}
    if args == "pairs":
        j_val, j_key_b = pairs.find(VAL_A), pairs.find(KEY_B)
        if min(j_val, j_key_b) < 0 or j_key_b < j_val:
            return None
        between = pairs[j_val + len(VAL_A):j_key_b]  # pair_close + [separator] + pair_open
        head = one[i_name + len(NAME_A):i_key]  # name_end + pair_open
        pair_open = _opening(head[len(head) - _common_suffix(head, between):])  # the name's close is not the pair's
        if not pair_open.strip():
            return None
        tail = one[i_val + len(VAL_A):]  # pair_close + call_close + ...
        closing = between[:len(between) - len(pair_open)]
        pair_close = closing[:_common_prefix(closing, tail)]
        fields = dict(pair_open=pair_open, key_end=one[i_key + len(KEY_A):i_val],
                      pair_close=pair_close.replace(KEY_A, KEY_SLOT))
        name_end = head[:len(head) - len(pair_open)]
        a_end = i_val + len(VAL_A) + len(pair_close)
    else:
        name_end = one[i_name + len(NAME_A):a_start]
    name_end = name_end.replace(NAME_A, NAME_SLOT)  # a name written twice (muse-glimmer's `to=` and `<invoke>`)
    index = re.match(r":\d+", name_end)  # Kimi's NAME:INDEX: the index is the call's, not the syntax's
    if index:
        name_end = name_end[index.end():]
    # the calls: what comes before each name, after each call's arguments, around them all
    before = one[:i_name]  # section_open + call_open
    after = one[a_end:]  # call_close + section_close + the turn's end
    turn_end = turn_end_of(replies)
    one_call = two == one  # a template that writes the first call only: no second to part the pieces by
    if one_call:
        call_open, closing = before, after[:len(after) - len(turn_end)] if turn_end and after.endswith(turn_end) else after
    else:
        j_b = two.find(NAME_B)
        j_end_a = two.find(one[a_start:a_end]) + (a_end - a_start) if one[a_start:a_end] in two else -1
        if j_b < 0 or j_end_a < 0 or j_end_a > j_b:
            return None
        between = two[j_end_a:j_b]  # call_close + separator + call_open
        call_open = _opening(before[len(before) - _common_suffix(before, between):])  # the wrapper's close is not it
        closing = between[:len(between) - len(call_open)]  # call_close + separator
    call_close = _whole(after[:_common_prefix(after, closing)])
    if not call_open.strip() or not call_close.strip():
        return None
    rest = after[len(call_close):]
    if turn_end.strip() and rest.endswith(turn_end):
        section_close = rest[:len(rest) - len(turn_end)]
    elif turn_end.strip() and turn_end.strip() in rest:
        section_close = rest[:rest.find(turn_end.strip())]
    else:  # the text probe shows no end of its own: all that follows the calls
        section_close = rest
    d = Derived(section_open=before[:len(before) - len(call_open)], call_open=call_open, name_end=name_end,
                call_close=call_close, section_close=section_close.rstrip(), args=args,
                separator=closing[len(call_close):], ids=int(replies.get("ids", "0")), one_call=one_call, **fields)
    got = d.parse(one)
    return d if got is not None and got[1] == [(NAME_A, {KEY_A: VAL_A})] else None


def _opening(text: str) -> str:
    """A marker shared by two places, from where it opens: the character before it that closes
    what came first (a tag's `>`, a bracket), or the end of a special token (`|>` of
    `<|tool_calls_section_begin|>`), belongs to that, not to the marker."""
    end = text.find("|>")
    if end >= 0 and "<|" not in text[:end]:
        return text[end + 2:]
    return text[1:] if text[:1] in CLOSERS else text


def attributed(literal: str) -> bool:
    """Whether a key's end closes a tag that carries more attributes after the name
    (DeepSeek's `" string="true">`, which says `"false"` for other values)."""
    return literal.endswith(">") and " " in literal.strip()


def _attributes(literal: str) -> str:
    """A key's end as a regex: with attributes (`attributed`), any attributes."""
    if attributed(literal):
        return r"\s*" + re.escape(literal.lstrip()[0]) + r"[^>]*>\s*"
    return _loose(literal)


def marker_of(d: Derived) -> str:
    """What a reply's calls start with, for the streamed splitter: the last mark of what wraps
    them (after a reasoning block's close the template writes before it), else the first of a
    call's opening; a lone bracket or brace is too common in text: then the whole wrapper."""
    source = d.section_open.strip() or d.call_open.strip()
    words = source.split()
    mark = words[-1] if d.section_open.strip() else words[0]
    return mark if len(mark) >= 4 else source


async def probe_replies(render) -> dict[str, str]:
    """The probes' replies as the template renders them: `render(messages, add_generation_prompt)`
    (an awaitable; PROBE_TOOLS go with every render)."""
    user = [{"role": "user", "content": "hi"}]
    prompt = await render(user, True)
    out = {"text": reply_of(prompt, await render(user + [{"role": "assistant", "content": TEXT}], False))}
    for key, calls in probes().items():
        for ids in ID_FORMS:  # the first form of call ids the template takes
            marked = [{**c, "id": ids(c["function"]["name"], i)} for i, c in enumerate(calls)]
            try:
                rendered = await render(user + [{"role": "assistant", "content": "", "tool_calls": marked}], False)
            except TemplateError as e:
                if e.kind in PASSING:  # no worker free, or out of time: no answer about the template
                    raise
                continue  # a template that refuses these ids, or two calls (Llama 3.x's): the next
            except Exception:
                continue
            out[key] = reply_of(prompt, rendered)
            out.setdefault("ids", str(ID_FORMS.index(ids)))
            break
    return out


# call ids as templates expect them: OpenAI's, Kimi's `functions.NAME:INDEX` (its template
# takes the name apart), Mistral's nine letters and digits
ID_FORMS = (lambda name, i: f"call_{i}", lambda name, i: f"functions.{name}:{i}", lambda name, i: f"a1b2c3d4{i}")


def turn_end_of(replies: dict[str, str]) -> str:
    """What the template writes after an answer (the text probe's), to the end of its turn."""
    text = replies.get("text", "")
    return text[text.find(TEXT) + len(TEXT):] if TEXT in text else ""


def without_turn_end(reply: str, replies: dict[str, str]) -> str:
    """A probe reply as a model writes it: without the turn's end (its end-of-generation token:
    what the text probe ends with, or the first of the usual ones)."""
    end = turn_end_of(replies)
    if end.strip() and reply.endswith(end):
        return reply[:len(reply) - len(end)]
    cuts = [i for e in END_OF_GENERATION_TEXTS if (i := reply.find(e)) >= 0]
    return reply[:min(cuts)] if cuts else reply


def with_ids(messages: list[dict], d: Derived) -> None:
    """An earlier turn's call ids in the form the template takes (d.ids), each tool result's
    reference with them."""
    if d.ids == 0:
        return
    form, renamed, n = ID_FORMS[d.ids], {}, 0
    for m in messages:
        for c in m.get("tool_calls") or []:
            renamed[c.get("id")] = c["id"] = form(c["function"]["name"], n)
            n += 1
        if m.get("tool_call_id") in renamed:
            m["tool_call_id"] = renamed[m["tool_call_id"]]
