"""Tool-call formats: the OpenAI `tools` rendered through the chat template, and the form
the model writes its calls in (the calls are taken out of its text by tool_parse, and
`tool_choice` `required` / a named function enforced by tool_grammar). One format family
per template, chosen from its markers:

- Hermes / Qwen 2.5-3: `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, with the
  Qwen3.5 / Qwen3-Coder body (`<tool_call><function=NAME><parameter=P>value</parameter>
  </function></tool_call>`, values typed by the tool's schema) inside the same markers;
- Mistral: `[TOOL_CALLS]` then a JSON list of calls (v3) or `NAME[ARGS]{…}` per call
  (v11 and later), to the end of the reply; tool call ids of 9 letters and digits, as
  its templates demand;
- Llama 3.x: a reply that is a JSON object `{"name": …, "parameters": {…}}` naming one
  of the tools (after `<|python_tag|>` or bare), several joined by `;`;
- Gemma 4: `<|tool_call>call:NAME{key:value,…}<tool_call|>`, keys bare and strings between
  `<|"|>` marks (JSON otherwise);
- LFM2: `<|tool_call_start|>[get_weather(city="Paris"), add(a=1, b=2)]<|tool_call_end|>`,
  Python calls with keyword arguments, several in one block.

A template that renders no tools of its own gets them in a system message asking for
the Hermes form (the generic fallback). Hermes calls stream their JSON arguments in
fragments; Mistral and Llama calls come whole when the reply ends. The families and a
template's format (`family_of`, `call_format`) are the engine's (engine.chat_format): a
model's is read once at load, `LoadedModel.chat_format.calls`."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from ...engine import LFM2, MISTRAL, TOOL_CLOSE, TOOL_OPEN, Family


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


def mistral_id(call_id: str | None) -> str:
    """A tool call id as Mistral's templates demand it: 9 letters and digits (others mapped
    to one, the same every time)."""
    if isinstance(call_id, str) and re.fullmatch(r"[A-Za-z0-9]{9}", call_id):
        return call_id
    digest = uuid.uuid5(uuid.NAMESPACE_OID, str(call_id)).hex
    return digest[:9]


def pythonic_call(name: str, arguments: dict) -> str:
    """A call as LFM2 writes one: NAME(key=value, ...), values as Python literals."""
    return f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in arguments.items()) + ")"


def for_template(messages: list[dict], family: Family, renders_calls: bool = False) -> None:
    """Adapt rendered messages to the family's template (Mistral's call ids; for an LFM2
    template that does not render calls, `renders_calls` False, an assistant's calls
    written into its content in LFM2's own form)."""
    if family is LFM2 and not renders_calls:
        for m in messages:
            calls = m.pop("tool_calls", None)
            if calls:
                text = ", ".join(pythonic_call(c["function"]["name"], c["function"]["arguments"]) for c in calls)
                m["content"] = (m.get("content") or "") + f"{LFM2.open}[{text}]{LFM2.close}"
        return
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
