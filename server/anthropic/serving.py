"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) over the chat path:
the request becomes a chat completion request (system, text, image and audio blocks, tool_use
and tool_result blocks, thinking blocks, tools and tool_choice, thinking, stop
sequences, structured output), the reply's pieces become content blocks (thinking,
text, tool_use), streamed as Anthropic's events or folded into one message. Errors
take Anthropic's envelope (server.core.errors)."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any, AsyncIterator

from ..chat.protocol import ChatCompletionRequest
from ..chat.serving import OverChat
from ..chat.wire import Tally
from ..core.errors import APIError, BadRequest, InternalError
from ..core.protocol import item_id
from .protocol import CountTokensRequest, MessagesRequest

log = logging.getLogger("gguf_serve.server")

STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use", "stop": "end_turn"}
EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}


def _blocks(content) -> list[dict]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def _text_of(block: dict, where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise BadRequest(f"{where}.text: a text block needs its text", param=f"{where}.text")
    return text


def _image_part(block: dict, where: str) -> dict:
    """An image block as the chat path's image_url part (a data URL, or a URL the server
    fetches only with --image-urls)."""
    source = block.get("source") or {}
    kind = source.get("type")
    if kind == "base64":
        media, data = source.get("media_type"), source.get("data")
        if not isinstance(media, str) or not isinstance(data, str):
            raise BadRequest(f"{where}.source: a base64 image needs media_type and data", param=f"{where}.source")
        return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}
    if kind == "url" and isinstance(source.get("url"), str):
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    raise BadRequest(f"{where}.source: an image's source is base64 (media_type, data) or url, not {kind!r}",
                     param=f"{where}.source")


def _audio_part(block: dict, where: str) -> dict:
    """An audio block as the chat path's input_audio part: OpenAI's shape as it is
    ({"type": "input_audio", "input_audio": {"data", "format"}}), or one shaped as an image
    block ({"type": "audio", "source": {"type": "base64", "media_type": "audio/wav", "data"}})."""
    if block.get("type") == "input_audio":
        return {"type": "input_audio", "input_audio": block.get("input_audio")}
    source = block.get("source") or {}
    media, data = source.get("media_type"), source.get("data")
    if source.get("type") != "base64" or not isinstance(data, str) or not isinstance(media, str):
        raise BadRequest(f"{where}.source: an audio block's source is base64 (media_type, data)",
                         param=f"{where}.source")
    return {"type": "input_audio", "input_audio": {"data": data, "format": media}}


def _tool_result(block: dict, where: str) -> dict:
    """A tool_result block as the chat path's tool message (its text; an error flagged)."""
    if not isinstance(block.get("tool_use_id"), str):
        raise BadRequest(f"{where}.tool_use_id: a tool_result names the tool_use it answers",
                         param=f"{where}.tool_use_id")
    content = block.get("content", "")
    texts = []
    for k, part in enumerate(_blocks(content) if content else []):
        if part.get("type") != "text":
            raise BadRequest(f"{where}.content.{k}: a tool result holds text here, not {part.get('type')!r}",
                             param=f"{where}.content.{k}")
        texts.append(_text_of(part, f"{where}.content.{k}"))
    text = "\n".join(texts)
    if block.get("is_error"):
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": text}


def _messages(req: CountTokensRequest) -> tuple[list[dict], list[str]]:
    """The chat messages, and for each the part of the request it came from (for errors)."""
    out, origins = [], []
    if req.system:
        if isinstance(req.system, str):
            system = req.system
        else:
            system = "\n\n".join(_text_of(b, f"system.{j}") for j, b in enumerate(req.system))
        if system:
            out.append({"role": "system", "content": system})
            origins.append("system")
    for i, m in enumerate(req.messages):
        where = f"messages.{i}"
        if m.role == "system":  # mid-conversation instructions: at their place, in a user turn (templates
            text = "\n\n".join(_text_of(b, f"{where}.content.{j}")  # allow a system message only first)
                               for j, b in enumerate(_blocks(m.content)))
            if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
                out[-1]["content"].append({"type": "text", "text": text})
            else:
                out.append({"role": "user", "content": [{"type": "text", "text": text}]})
                origins.append(where)
            continue
        if m.role == "user":
            parts: list[dict] = []
            for j, b in enumerate(_blocks(m.content)):
                kind, at = b.get("type"), f"{where}.content.{j}"
                if kind == "text":
                    parts.append({"type": "text", "text": _text_of(b, at)})
                elif kind == "image":
                    parts.append(_image_part(b, at))
                elif kind in ("audio", "input_audio"):
                    parts.append(_audio_part(b, at))
                elif kind == "tool_result":
                    if parts:  # text before a result: its own user turn, in order
                        out.append({"role": "user", "content": parts})
                        origins.append(where)
                        parts = []
                    out.append(_tool_result(b, at))
                    origins.append(at)
                else:
                    raise BadRequest(f"{at}: {kind!r} blocks are not supported in user messages (text, image, "
                                     f"audio and tool_result are)", param=f"{at}.type")
            if parts:
                out.append({"role": "user", "content": parts})
                origins.append(where)
            continue
        text, thinking, calls = [], [], []
        for j, b in enumerate(_blocks(m.content)):
            kind, at = b.get("type"), f"{where}.content.{j}"
            if kind == "text":
                text.append(_text_of(b, at))
            elif kind == "thinking":
                thinking.append(str(b.get("thinking", "")))
            elif kind == "redacted_thinking":
                continue  # encrypted by another server: nothing this model can read
            elif kind == "tool_use":
                if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str):
                    raise BadRequest(f"{at}: a tool_use block needs its id and name", param=at)
                calls.append({"id": b["id"], "type": "function",
                              "function": {"name": b["name"], "arguments": json.dumps(b.get("input") or {})}})
            else:
                raise BadRequest(f"{at}: {kind!r} blocks are not supported in assistant messages (text, thinking "
                                 f"and tool_use are)", param=f"{at}.type")
        msg: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
        if thinking:
            msg["reasoning_content"] = "".join(thinking)
        if calls:
            msg["tool_calls"] = calls
        out.append(msg)
        origins.append(where)
    merged, kept = [], []  # consecutive user turns as one (Anthropic merges them; some templates insist on turns)
    for m, o in zip(out, origins):
        if merged and m["role"] == "user" and merged[-1]["role"] == "user":
            merged[-1]["content"] = merged[-1]["content"] + m["content"]
            continue
        merged.append(m)
        kept.append(o)
    return merged, kept


def _tools(req: CountTokensRequest) -> tuple[list[dict] | None, Any, bool | None]:
    """(tools, tool_choice, parallel_tool_calls) in the chat path's terms."""
    tools = None
    if req.tools:
        tools = []
        for j, t in enumerate(req.tools):
            if t.get("type") not in (None, "custom"):
                raise BadRequest(f"tools.{j}: {t.get('type')!r} is one of Anthropic's server tools; this server runs "
                                 f"client tools only (name, description, input_schema)", param=f"tools.{j}.type")
            if not isinstance(t.get("name"), str):
                raise BadRequest(f"tools.{j}.name: a tool needs a name", param=f"tools.{j}.name")
            # the keys in the order OpenAI's clients send them, so that the same tools render the
            # same prompt (and share its prefix cache) through either API
            fn = {"name": t["name"]}
            if t.get("description"):
                fn["description"] = t["description"]
            fn["parameters"] = t.get("input_schema") or {"type": "object", "properties": {}}
            tools.append({"type": "function", "function": fn})
    choice, parallel = None, None
    tc = req.tool_choice
    if tc is not None:
        kind = tc.get("type")
        if kind == "auto":
            choice = "auto"
        elif kind == "any":
            choice = "required"
        elif kind == "none":
            choice = "none"
        elif kind == "tool" and isinstance(tc.get("name"), str):
            choice = {"type": "function", "function": {"name": tc["name"]}}
        else:
            raise BadRequest("tool_choice: its type is auto, any, tool (with a name) or none", param="tool_choice.type")
        if tc.get("disable_parallel_tool_use"):
            parallel = False
    return tools, choice, parallel


def _thinking(req: CountTokensRequest) -> tuple[dict, int | None, str | None]:
    """(template kwargs, thinking budget, reasoning effort) from `thinking` and
    `output_config.effort`; without `thinking`, the server's --reasoning decides."""
    kwargs, budget, effort = {}, None, None
    t = req.thinking
    if t is not None:
        kind = t.get("type")
        if kind == "enabled":
            budget = t.get("budget_tokens")
            if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
                raise BadRequest("thinking.budget_tokens: a number of tokens is required with type 'enabled'",
                                 param="thinking.budget_tokens")
            kwargs["enable_thinking"] = True
        elif kind == "adaptive":
            kwargs["enable_thinking"] = True
        elif kind == "disabled":
            kwargs["enable_thinking"] = False
        else:
            raise BadRequest("thinking.type: enabled (with budget_tokens), adaptive or disabled",
                             param="thinking.type")
    level = (req.output_config or {}).get("effort")
    if level is not None:
        if level not in EFFORTS:
            raise BadRequest(f"output_config.effort: one of {', '.join(EFFORTS)}", param="output_config.effort")
        effort = EFFORTS[level]
    return kwargs, budget, effort


def _response_format(req: CountTokensRequest) -> dict | None:
    fmt = (req.output_config or {}).get("format") or req.output_format
    if fmt is None:
        return None
    if fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise BadRequest("output_config.format: {\"type\": \"json_schema\", \"schema\": {...}}",
                         param="output_config.format")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"], "strict": True}}


def to_chat(req: CountTokensRequest) -> ChatCompletionRequest:
    messages, origins = _messages(req)
    if not any(m["role"] != "system" for m in messages):
        raise BadRequest("messages: at least one user message is needed", param="messages")
    tools, choice, parallel = _tools(req)
    kwargs, budget, effort = _thinking(req)
    last = req.messages[-1]
    if last.role == "assistant" and not messages[-1].get("tool_calls"):
        kwargs["continue_final_message"] = True  # a prefill: the reply goes on from it
    fields: dict[str, Any] = dict(model=req.model, messages=messages, tools=tools, tool_choice=choice,
                                  parallel_tool_calls=parallel, response_format=_response_format(req),
                                  chat_template_kwargs=kwargs or None, thinking_budget_tokens=budget,
                                  reasoning_effort=effort, keep_alive=req.keep_alive)
    if isinstance(req, MessagesRequest):
        fields.update(max_completion_tokens=req.max_tokens, stop=req.stop_sequences or None,
                      temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                      user=(req.metadata or {}).get("user_id"), seed=req.seed, ignore_eos=req.ignore_eos)
    chat = ChatCompletionRequest(**{k: v for k, v in fields.items() if v is not None})
    chat._origins = origins
    chat._fit_max_tokens = True
    return chat


# the chat fields an error may name, as the Messages fields they came from
RENAMED = {"max_completion_tokens": "max_tokens", "stop": "stop_sequences", "response_format": "output_config",
           "thinking_budget_tokens": "thinking.budget_tokens", "reasoning_effort": "output_config.effort"}


class _Blocks:
    """One reply's pieces in, its content blocks and their stream events out. A block
    opens with its first text and closes when the next opens or the reply ends;
    whitespace between blocks belongs to none."""

    def __init__(self):
        self.blocks: list[dict] = []
        self.open: int | None = None  # the open thinking or text block
        self.calls: dict[int, int] = {}  # a stream's call index -> its block, while the call is open
        self.json: dict[int, str] = {}  # a tool_use block's input as streamed
        self.blank = ""

    def _start(self, block: dict, events: list) -> int:
        self.blocks.append(block)
        i = len(self.blocks) - 1
        events.append({"type": "content_block_start", "index": i, "content_block": dict(block)})
        return i

    def close(self, events: list) -> None:
        if self.open is not None:
            events.append({"type": "content_block_stop", "index": self.open})
            self.open = None

    def _text(self, kind: str, text: str, events: list) -> None:
        text, self.blank = self.blank + text, ""
        if self.open is None or self.blocks[self.open]["type"] != kind:
            if not text.strip():
                self.blank = text
                return
            self.close(events)
            block = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else {
                "type": "text", "text": ""}
            self.open = self._start(block, events)
            text = text.lstrip()
        self.blocks[self.open][kind] += text
        delta = {"type": "thinking_delta", "thinking": text} if kind == "thinking" else {
            "type": "text_delta", "text": text}
        events.append({"type": "content_block_delta", "index": self.open, "delta": delta})

    def feed(self, p) -> list[dict]:
        events: list[dict] = []
        if p.reasoning:
            self._text("thinking", p.reasoning, events)
        if p.content:
            self._text("text", p.content, events)
        for d in p.tool_deltas:
            f = d.get("function") or {}
            if d["index"] not in self.calls:
                self.close(events)
                self.blank = ""
                self.calls[d["index"]] = self._start({"type": "tool_use", "id": d["id"], "name": f.get("name", ""),
                                                      "input": {}}, events)
            i = self.calls[d["index"]]
            if f.get("arguments"):
                self.json[i] = self.json.get(i, "") + f["arguments"]
                events.append({"type": "content_block_delta", "index": i,
                               "delta": {"type": "input_json_delta", "partial_json": f["arguments"]}})
        for call in p.tool_calls:  # closed: its input as parsed, its block done
            k = next((k for k, i in self.calls.items() if self.blocks[i]["id"] == call.id), None)
            if k is None:
                continue
            i = self.calls.pop(k)
            try:
                self.blocks[i]["input"] = json.loads(self.json.get(i) or call.arguments or "{}")
            except json.JSONDecodeError:
                self.blocks[i]["input"] = {}
            events.append({"type": "content_block_stop", "index": i})
        return events

    def finish(self) -> list[dict]:
        events: list[dict] = []
        self.close(events)
        for i in self.calls.values():
            events.append({"type": "content_block_stop", "index": i})
        self.calls.clear()
        return events


class MessagesServing(OverChat):
    """The /v1/messages endpoints over the chat path."""

    translate, renamed = staticmethod(to_chat), RENAMED

    async def count_tokens(self, req: CountTokensRequest) -> dict:
        return {"input_tokens": await self.service.through_chat(to_chat, req, RENAMED, use=self.service.count_chat)}

    @staticmethod
    def _usage(tally: Tally) -> dict:
        cached = tally.cached_tokens
        return {"input_tokens": tally.prompt_tokens - cached, "output_tokens": tally.completion_tokens,
                "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}

    async def _events(self, req: MessagesRequest, prep) -> AsyncIterator[dict]:
        tally, blocks = Tally(), _Blocks()
        tally.prompt_tokens = len(prep.prompt_ids)
        message = {"id": item_id("msg"), "type": "message", "role": "assistant", "model": req.model, "content": [],
                   "stop_reason": None, "stop_sequence": None, "usage": self._usage(tally)}
        yield {"type": "message_start", "message": message}
        yield {"type": "ping"}
        finish, stop_sequence = None, None
        async for p in self.service.pieces(prep, tally):
            for e in blocks.feed(p):
                yield e
            if p.finish_reason:
                finish, stop_sequence = p.finish_reason, p.stop_sequence
        for e in blocks.finish():
            yield e
        reason = "stop_sequence" if stop_sequence else STOP_REASONS.get(finish, "end_turn")
        message.update(content=blocks.blocks, stop_reason=reason, stop_sequence=stop_sequence,
                       usage=self._usage(tally))
        yield {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": stop_sequence},
               "usage": message["usage"]}
        yield {"type": "message_stop", "_message": message}

    async def create(self, req: MessagesRequest) -> dict:
        prep = await self._prepare(req)
        last = None
        async for e in self._events(req, prep):
            last = e
        return last["_message"]

    async def stream(self, req: MessagesRequest) -> tuple[AsyncIterator[str], threading.Event]:
        """The SSE lines (`event:` and `data:`), and the job's cancel flag. An error after
        the stream has started is an `error` event."""
        prep = await self._prepare(req)

        async def lines():
            try:
                async for e in self._events(req, prep):
                    e.pop("_message", None)
                    yield f"event: {e['type']}\ndata: {json.dumps(e, ensure_ascii=False)}\n\n"
            except APIError as e:
                yield f"event: error\ndata: {json.dumps(e.anthropic_body(), ensure_ascii=False)}\n\n"
            except Exception as e:  # noqa: BLE001 - the stream ends with the reason
                log.exception("message stream failed")
                yield f"event: error\ndata: {json.dumps(InternalError(str(e)).anthropic_body())}\n\n"
        return lines(), prep.job.cancel
