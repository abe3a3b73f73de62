"""The grammar that `tool_choice` `required` or a named function imposes on the reply:
one or more calls (or exactly one, for a named function) in the template's own form
(server.chat.tools.CallFormat): Hermes JSON, Qwen3.5 XML, GLM-4.5's key/value pairs, Mistral's
list or v11 form, Llama's JSON; arguments constrained by each tool's JSON schema (llguidance)."""

from __future__ import annotations

import json
import re

from ...engine import GEMMA4, LFM2, LLAMA3, MISTRAL, TOOL_CLOSE, TOOL_OPEN, CallFormat, closed_objects
from .derived_calls import KEY_SLOT, NAME_SLOT, Derived, attributed, marker_of
from .tools import functions


CALL_WHITESPACE = r"\x20?"  # in forced calls' JSON: at most a space between tokens (calls stay one line)


NL = "\n"


def _lark_str(text: str) -> str:
    return json.dumps(text)  # a JSON string literal is a lark string literal


def _is_text(schema: dict) -> bool:
    """A parameter written as raw text in the XML form (a string, or an enum of strings)."""
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if values is not None:
        return all(isinstance(v, str) for v in values)
    return schema.get("type") == "string"


def _xml_value(rule: str, schema: dict, close: str = "<") -> str:
    """The lark rule of one XML parameter's value: raw text for strings (without `<`, a line
    break or the first character of what closes it: MiniMax M3's `]<]minimax[>[`), else JSON."""
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if values is not None and _is_text(schema):
        return f"{rule}: " + " | ".join(_lark_str(v) for v in values)
    if _is_text(schema):
        most = schema.get("maxLength")
        stops = "".join(sorted({"<", close.strip()[:1] or "<"})).replace("\\", "\\\\").replace("]", "\\]")
        return f"{rule}: /[^{stops}\\n]{{{schema.get('minLength', 1)},{most if most is not None else 200}}}/"
    return f"{rule}: %json {json.dumps({**schema, 'x-guidance': {'whitespace_pattern': CALL_WHITESPACE}})}"


def _parameters(f: dict) -> dict:
    """A function's parameters schema for a forced call: any object when it gives none,
    its objects closed to unlisted keys (`closed_objects`)."""
    return closed_objects(f.get("parameters") or {"type": "object"})


def _xml_call(k: int, f: dict, pairs: bool = False) -> list[str]:
    """Rules for one function's XML call (Qwen3.5's `<function=…><parameter=…>`, or with
    `pairs` GLM-4.5's `NAME<arg_key>…</arg_key><arg_value>…</arg_value>`): its parameters in
    schema order, the required ones always, the others optionally."""
    params = _parameters(f)
    required = set(params.get("required") or [])
    rules, parts = [], []
    for j, (p, schema) in enumerate((params.get("properties") or {}).items()):
        value = f"v{k}_{j}"
        rules.append(_xml_value(value, schema if isinstance(schema, dict) else {}))
        before, after = ((f"<arg_key>{p}</arg_key>{NL}<arg_value>", f"</arg_value>{NL}") if pairs
                         else (f"<parameter={p}>{NL}", f"{NL}</parameter>{NL}"))
        part = f"{_lark_str(before)} {value} {_lark_str(after)}"
        parts.append(part if p in required else f"({part})?")
    if pairs:
        head, tail = _lark_str(f"{TOOL_OPEN}{f['name']}{NL}"), _lark_str(TOOL_CLOSE)
    else:
        head, tail = _lark_str(f"{TOOL_OPEN}{NL}<function={f['name']}>{NL}"), _lark_str(f"</function>{NL}{TOOL_CLOSE}")
    return [f"c{k}: {head} {' '.join(parts)} {tail}"] + rules


def _options(chosen: list[dict], args_key: str) -> dict:
    options = [{"type": "object", "properties": {"name": {"const": f["name"]},
                                                 args_key: _parameters(f)},
                "required": ["name", args_key], "additionalProperties": False} for f in chosen]
    return options[0] if len(options) == 1 else {"anyOf": options}


def _with_ws(schema: dict) -> dict:
    return {**schema, "x-guidance": {"whitespace_pattern": CALL_WHITESPACE}}


def chosen_functions(tools: list[dict], name: str | None) -> list[dict]:
    """The functions a forced reply may call: all of `tools`, or the one `name`d
    (ValueError if it is not among them)."""
    chosen = [f for f in functions(tools) if name is None or f.get("name") == name]
    if not chosen:
        raise ValueError(f"tool_choice names {name!r}, which is not among the tools")
    return chosen


def required_grammar(tools: list[dict], name: str | None, parallel: bool, fmt: CallFormat = CallFormat()) -> str:
    """A grammar for replies that are tool calls only: one (or, with `parallel`, several)
    calls in the template's format, naming one of the tools (or `name`), with arguments
    matching its parameters."""
    from llguidance import LLMatcher

    chosen = chosen_functions(tools, name)
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
    if family is GEMMA4:  # call:NAME then the arguments as a JSON object (Gemma 4's parser reads JSON too)
        repeat = " call*" if parallel else ""
        rules = [f"start: call{repeat}", "call: " + " | ".join(f"c{k}" for k in range(len(chosen)))]
        for k, f in enumerate(chosen):
            rules.append(f"c{k}: {marker} {_lark_str('call:' + f['name'])} a{k} {_lark_str(family.close)}")
            rules.append(f"a{k}: %json {json.dumps(_with_ws(_parameters(f)))}")
        return LLMatcher.grammar_from_lark("\n".join(rules) + "\n")
    if family is LFM2:  # [NAME(key=value, ...)]: values as JSON (Python literals too), required keys first
        more = ' (", " call)*' if parallel else ""
        rules = [f'start: {marker} "[" call{more} "]" {_lark_str(family.close)}',
                 "call: " + " | ".join(f"c{k}" for k in range(len(chosen)))]
        for k, f in enumerate(chosen):
            params = _parameters(f)
            props = params.get("properties") or {}
            required = [p for p in props if p in set(params.get("required") or [])]
            optional = [p for p in props if p not in required]
            items = []
            for j, p in enumerate(required + optional):
                rules.append(f"v{k}_{j}: %json {json.dumps(_with_ws(props[p] if isinstance(props[p], dict) else {}))}")
                items.append(f"{_lark_str(p + '=')} v{k}_{j}")
            req, opt = items[:len(required)], items[len(required):]
            if req:
                body = ' ", " '.join(req) + "".join(f' (", " {o})?' for o in opt)
            else:
                body = f"({opt[0]}" + "".join(f' (", " {o})?' for o in opt[1:]) + ")?" if opt else ""
            rules.append(f"c{k}: {_lark_str(f['name'] + '(')} {body} " + '")"')
        return LLMatcher.grammar_from_lark("\n".join(rules) + "\n")
    if family is LLAMA3:
        repeat = ' ("; " call)*' if parallel else ""
        return LLMatcher.grammar_from_lark(f"start: call{repeat}\n"
                                           f"call: %json {json.dumps(_with_ws(_options(chosen, 'parameters')))}\n")
    repeat = ' ("\\n" call)*' if parallel else ""
    if fmt.xml or fmt.arg_pairs:
        rules = [f"start: call{repeat}", "call: " + " | ".join(f"c{k}" for k in range(len(chosen)))]
        for k, f in enumerate(chosen):
            rules += _xml_call(k, f, pairs=fmt.arg_pairs)
        return LLMatcher.grammar_from_lark("\n".join(rules) + "\n")
    lark = (f"start: call{repeat}\n"
            f'call: "{TOOL_OPEN}\\n" body "\\n{TOOL_CLOSE}"\n'
            f"body: %json {json.dumps(_with_ws(_options(chosen, 'arguments')))}\n")
    return LLMatcher.grammar_from_lark(lark)


def _pieces(*parts: str) -> str:
    """Lark items in order, empty literals and items left out."""
    return " ".join(p for p in parts if p and p != '""')


def _numbered_lark(literal: str) -> str:
    """A name's end whose numbers are the call's own (derived_calls._numbered): any number."""
    return _pieces(*(r"/[0-9]+/" if p.isdigit() else _lark_str(p) for p in re.split(r"(\d+)", literal) if p))


def derived_grammar(tools: list[dict], name: str | None, d: Derived, parallel: bool = True) -> str:
    """A forced reply in a template's own syntax (server.chat.derived_calls): the wrapper from
    the calls' marker on, each call's pieces around its name, its arguments as the tool's JSON
    object or its key/value pairs (required keys always, the others optionally, in schema
    order), then the wrapper's close."""
    from llguidance import LLMatcher

    chosen = chosen_functions(tools, name)
    mark = marker_of(d)
    opener = d.section_open[d.section_open.find(mark):] if d.section_open.strip() and mark in d.section_open else ""
    more = f" ({_pieces(_lark_str(d.separator), 'call')})*" if parallel and name is None and not d.one_call else ""
    rules = [_pieces("start:", _lark_str(opener), f"call{more}", _lark_str(d.section_close if d.section_close.strip() else "")),
             "call: " + " | ".join(f"c{k}" for k in range(len(chosen)))]
    for k, f in enumerate(chosen):
        lead = _pieces(_lark_str(d.call_open + f["name"]), _numbered_lark(d.name_end.replace(NAME_SLOT, f["name"])))
        if d.args == "json":
            rules += [f"c{k}: {lead} a{k} {_lark_str(d.call_close)}",
                      f"a{k}: %json {json.dumps(_with_ws(_parameters(f)))}"]
            continue
        params = _parameters(f)
        required = set(params.get("required") or [])
        parts = []
        for j, (p, schema) in enumerate((params.get("properties") or {}).items()):
            value = f"v{k}_{j}"
            rules.append(_xml_value(value, schema if isinstance(schema, dict) else {}, d.pair_close))
            key = (f"{_lark_str(d.pair_open + p + d.key_end.lstrip()[0])} /[^>\\n]*>/" if attributed(d.key_end)
                   else _lark_str(d.pair_open + p + d.key_end))  # a tag with more attributes: any of them
            part = _pieces(key, value, _lark_str(d.pair_close.replace(KEY_SLOT, p)))
            parts.append(part if p in required else f"({part})?")
        rules.append(_pieces(f"c{k}:", lead, *parts, _lark_str(d.call_close)))
    return LLMatcher.grammar_from_lark("\n".join(rules) + "\n")
