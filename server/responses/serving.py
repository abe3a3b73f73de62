"""POST /v1/responses, stateless (nothing is stored). A Responses request becomes the
chat request it means (instructions and input items as messages, function tools,
`text.format` as a response_format, `reasoning.effort` as the thinking switch) and
runs through the chat path; its pieces come back as Responses output items (a
`reasoning` item, a `message`, `function_call`s) and as the stream's events. The
non-streaming reply is the streamed one folded: one path.

Logprobs (`include: ["message.output_text.logprobs"]` or `top_logprobs`) are given for
the answer's tokens; reasoning and tool-call tokens have none."""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from typing import AsyncIterator

from ..chat.protocol import ChatCompletionRequest
from ..chat.serving import OverChat
from ..chat.wire import Tally, chat_logprobs
from ..core.errors import APIError, BadRequest
from ..core.protocol import item_id
from .protocol import ResponsesRequest

log = logging.getLogger("gguf_serve.server")

TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")
MEDIA_PARTS = ("input_image", "input_audio")
LOGPROBS = "message.output_text.logprobs"

# Hosted tools (OpenAI runs them on its side) and the items of their calls: this server
# cannot run them, so they are left out of the prompt (logged) rather than refused: Codex
# sends web_search with every request.
HOSTED_TOOLS = ("web_search", "web_search_preview", "file_search", "code_interpreter", "computer_use_preview",
                "computer_use", "image_generation", "local_shell", "mcp", "tool_search", "shell", "apply_patch")
HOSTED_ITEMS = ("web_search_call", "file_search_call", "computer_call", "computer_call_output",
                "code_interpreter_call", "image_generation_call", "local_shell_call", "local_shell_call_output",
                "mcp_call", "mcp_list_tools", "mcp_approval_request", "mcp_approval_response", "tool_search_call",
                "tool_search_output", "shell_call", "shell_call_output", "apply_patch_call",
                "apply_patch_call_output")
CUSTOM_INPUT = {"type": "object", "properties": {"input": {"type": "string", "description": "the tool's whole input, "
                                                           "as free text"}}, "required": ["input"]}


def _text(content, where: str) -> str:
    """The text of an item's content: a string or text parts; other parts are refused."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise BadRequest("content must be a string or a list of parts", param=where)
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS:
            out.append(part.get("text") or "")
        elif kind == "refusal":
            out.append(part.get("refusal") or "")
        else:
            raise BadRequest(f"content parts of type {kind!r} are not supported (text only)",
                             param=f"{where}.{j}", code="unsupported_parameter")
    return "".join(out)


def _content(content, where: str):
    """A message item's content for chat: its text, or with input_image or input_audio
    parts, chat parts (text, image_url, input_audio); other parts are refused."""
    if not isinstance(content, list) or not any(isinstance(p, dict) and p.get("type") in MEDIA_PARTS
                                                for p in content):
        return _text(content, where)
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "input_image":
            if not isinstance(part.get("image_url"), str):
                raise BadRequest("an input_image part needs image_url (a data: URL or an http(s) URL); file_id "
                                 "needs stored files, which this server does not keep", param=f"{where}.{j}",
                                 code="invalid_image")
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"],
                                                             "detail": part.get("detail") or "auto"}})
        elif kind == "input_audio":  # checked with the chat path's own (server.chat.audio)
            parts.append({"type": "input_audio", "input_audio": part.get("input_audio")})
        else:
            parts.append({"type": "text", "text": _text([part], f"{where}.{j}")})
    return parts


def _messages(req: ResponsesRequest) -> list[dict]:
    """The chat messages of a request, each with `_from`: the field it came from (for errors)."""
    messages = [{"role": "system", "content": req.instructions, "_from": "instructions"}] if req.instructions else []
    if isinstance(req.input, str):
        return messages + [{"role": "user", "content": req.input, "_from": "input"}]
    reasoning = ""  # a reasoning item goes with the assistant turn after it
    for i, item in enumerate(req.input):
        where = f"input.{i}"
        if not isinstance(item, dict):
            raise BadRequest("an input item must be an object", param=where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise BadRequest(f"role {role!r} is not user, system, developer or assistant", param=f"{where}.role")
            msg = {"role": role, "content": _content(item.get("content"), f"{where}.content"), "_from": where}
            if role == "assistant" and reasoning:
                msg["reasoning_content"], reasoning = reasoning, ""
            messages.append(msg)
        elif kind in ("function_call", "custom_tool_call"):
            name, call_id = item.get("name"), item.get("call_id")
            args = item.get("arguments", "{}") if kind == "function_call" else item.get("input")
            if not isinstance(name, str) or not isinstance(args, str) or not isinstance(call_id, str):
                raise BadRequest(f"a {kind} item needs name, {'arguments' if kind == 'function_call' else 'input'} "
                                 f"and call_id strings", param=where)
            if kind == "custom_tool_call":
                args = json.dumps({"input": args}, ensure_ascii=False)
            call = {"id": call_id, "type": "function",
                    "function": {"name": flat_name(name, item.get("namespace")), "arguments": args}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # several calls (and text) in one turn
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call],
                                 **({"reasoning_content": reasoning} if reasoning else {})})
                reasoning = ""
        elif kind in ("function_call_output", "custom_tool_call_output"):
            if not isinstance(item.get("call_id"), str):
                raise BadRequest("a function_call_output item needs its call_id", param=f"{where}.call_id")
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output, f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            reasoning += _text(parts, f"{where}.content")
        elif kind in HOSTED_ITEMS:
            log.info("responses: %s, a hosted tool's %r item, is left out", where, kind)
        elif kind == "item_reference":
            raise BadRequest("this server stores nothing, so items cannot be referenced by id; send them whole",
                             param=where, code="unsupported_parameter")
        else:
            raise BadRequest(f"input items of type {kind!r} are not supported (messages, function_call, "
                             f"function_call_output and reasoning are)", param=f"{where}.type",
                             code="unsupported_parameter")
    return messages


def flat_name(name: str, namespace: str | None) -> str:
    """The function name a namespace's tool has in the prompt (its calls come back with the
    namespace again)."""
    return f"{namespace}__{name}" if namespace else name


def _tool_entries(req: ResponsesRequest) -> list[tuple[int, dict, str | None]]:
    """(index, tool, namespace) for each function or custom tool, a namespace's tools in it."""
    out = []
    for j, t in enumerate(req.tools or []):
        if not isinstance(t, dict):
            raise BadRequest("a tool must be an object", param=f"tools.{j}")
        if t.get("type") == "namespace":
            if not isinstance(t.get("name"), str) or not isinstance(t.get("tools"), list):
                raise BadRequest("a namespace tool needs a name and a list of tools", param=f"tools.{j}")
            out += [(j, inner, t["name"]) for inner in t["tools"] if isinstance(inner, dict)
                    and inner.get("type") in ("function", "custom")]
        elif t.get("type") in ("function", "custom"):
            out.append((j, t, None))
    return out


def tool_names(req: ResponsesRequest) -> dict[str, tuple[str, str | None, bool]]:
    """Each prompt function name -> (the tool's name, its namespace, whether it is a custom
    (free-text) tool): how a call the model makes goes back to the client."""
    return {flat_name(t.get("name"), ns): (t.get("name"), ns, t.get("type") == "custom")
            for _, t, ns in _tool_entries(req) if isinstance(t.get("name"), str)}


def _tools(req: ResponsesRequest) -> tuple[list[dict] | None, object]:
    """The chat tools: function tools as they are, a namespace's tools flattened (its name
    before theirs), custom tools as functions of one `input` string; hosted tools left out."""
    tools = None
    if req.tools is not None:
        tools = []
        for j, t in enumerate(req.tools):
            kind = t.get("type") if isinstance(t, dict) else None
            if kind not in ("function", "custom", "namespace"):
                if kind not in HOSTED_TOOLS:
                    log.info("responses: tools.%d of type %r is not one this server knows; left out", j, kind)
                else:
                    log.info("responses: tools.%d, the hosted tool %r, is left out (this server cannot run it)", j,
                             kind)
        for j, t, ns in _tool_entries(req):
            if not isinstance(t.get("name"), str):
                raise BadRequest("a function tool needs its name", param=f"tools.{j}")
            f = {k: t[k] for k in ("description", "parameters", "strict") if t.get(k) is not None}
            if t.get("type") == "custom":
                fmt = t.get("format") or {}
                grammar = f"\nIts input follows this {fmt.get('syntax', '')} grammar:\n{fmt['definition']}" \
                    if fmt.get("type") == "grammar" and isinstance(fmt.get("definition"), str) else ""
                f = {"description": (t.get("description") or "") + grammar, "parameters": CUSTOM_INPUT}
            tools.append({"type": "function", "function": {"name": flat_name(t["name"], ns), **f}})
    choice = req.tool_choice
    if isinstance(choice, dict):
        if choice.get("type") in HOSTED_TOOLS:
            choice = "auto"
        elif choice.get("type") not in ("function", "custom") or not isinstance(choice.get("name"), str):
            raise BadRequest("tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'name': ...}",
                             param="tool_choice")
        else:
            choice = {"type": "function", "function": {"name": flat_name(choice["name"], choice.get("namespace"))}}
    return tools, choice


def _response_format(req: ResponsesRequest) -> dict | None:
    fmt = req.text.format if req.text else None
    if not fmt or fmt.get("type") in (None, "text"):
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {k: fmt.get(k) for k in ("name", "schema", "strict")}}
    raise BadRequest(f"text.format type {fmt.get('type')!r} is not text, json_object or json_schema",
                     param="text.format")


def to_chat(req: ResponsesRequest) -> ChatCompletionRequest:
    """The chat request a Responses request means (errors name the Responses fields)."""
    for field, why in (("previous_response_id", "send the whole conversation as input"),
                       ("conversation", "send the whole conversation as input"),
                       ("prompt", "send the instructions and input themselves")):
        if getattr(req, field) is not None:
            raise BadRequest(f"this server stores nothing, so '{field}' cannot be used: {why}", param=field,
                             code="unsupported_parameter")
    if req.background:
        raise BadRequest("background responses are not supported", param="background", code="unsupported_parameter")
    if req.truncation == "auto":
        raise BadRequest("truncation 'auto' is not supported: the input must fit the context", param="truncation",
                         code="unsupported_parameter")
    messages = _messages(req)
    if not messages:
        raise BadRequest("the input is empty", param="input")
    origins = [m.pop("_from", "input") for m in messages]
    tools, choice = _tools(req)
    logprobs = LOGPROBS in (req.include or []) or req.top_logprobs is not None
    fields = dict(model=req.model, messages=messages, tools=tools, tool_choice=choice,
                  parallel_tool_calls=req.parallel_tool_calls, response_format=_response_format(req),
                  max_completion_tokens=req.max_output_tokens, temperature=req.temperature, top_p=req.top_p,
                  reasoning_effort=req.reasoning.effort if req.reasoning else None,
                  thinking_budget_tokens=req.reasoning.max_tokens if req.reasoning else None,
                  logprobs=logprobs or None, top_logprobs=req.top_logprobs if logprobs else None,
                  logit_bias=req.logit_bias, seed=req.seed, stop=req.stop, top_k=req.top_k, min_p=req.min_p,
                  repetition_penalty=req.repetition_penalty, presence_penalty=req.presence_penalty,
                  frequency_penalty=req.frequency_penalty, chat_template_kwargs=req.chat_template_kwargs,
                  ignore_eos=req.ignore_eos, speculative=req.speculative, user=req.user,
                  keep_alive=req.keep_alive)
    chat = ChatCompletionRequest(**{k: v for k, v in fields.items() if v is not None})
    chat._origins = origins
    return chat


# the chat fields an error may name, as the Responses fields they came from
RENAMED = {"messages": "input", "response_format": "text.format", "max_completion_tokens": "max_output_tokens",
           "reasoning_effort": "reasoning.effort", "thinking_budget_tokens": "reasoning.max_tokens"}


def _custom_input(arguments: str) -> str:
    """A custom tool's input from the call's `{"input": ...}` arguments (as they are when
    they do not parse: a call cut off)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value.get("input", "") if isinstance(value, dict) and isinstance(value.get("input", ""), str) else arguments


class _Items:
    """One reply's pieces in, its output items and the stream's events out. Items open
    as their first text arrives and close when the next one opens or the reply ends;
    whitespace between items belongs to none."""

    def __init__(self, tok, logprobs: bool, names: dict | None = None):
        self.tok, self.logprobs = tok, logprobs
        self.names = names or {}  # prompt function name -> (tool name, namespace, custom): tool_names
        self.items: list[dict] = []
        self.open: int | None = None  # the open message or reasoning item
        self.calls: dict[int, int] = {}  # a stream's call index -> its item's output index
        self.blank = ""  # whitespace held until text follows it
        self.blank_logprobs: list = []  # and its tokens' logprobs
        self.held_logprobs: list = []  # of tokens whose text has not come yet

    def _add(self, item: dict, events: list) -> int:
        self.items.append(item)
        events.append({"type": "response.output_item.added", "output_index": len(self.items) - 1,
                       "item": copy.deepcopy({k: v for k, v in item.items() if not k.startswith("_")})})
        return len(self.items) - 1

    def _part(self, item: dict) -> dict:
        if item["type"] == "reasoning":
            return {"type": "reasoning_text", "text": item["content"][0]["text"]}
        return copy.deepcopy(item["content"][0])

    def close(self, events: list, status: str = "completed") -> None:
        if self.open is None:
            return
        i, self.open = self.open, None
        item = self.items[i]
        item["status"] = status
        head = {"item_id": item["id"], "output_index": i, "content_index": 0}
        if item["type"] == "reasoning":
            events.append({"type": "response.reasoning_text.done", **head, "text": item["content"][0]["text"]})
        else:
            part = item["content"][0]
            events.append({"type": "response.output_text.done", **head, "text": part["text"],
                           "logprobs": part["logprobs"]})
        events.append({"type": "response.content_part.done", **head, "part": self._part(item)})
        events.append({"type": "response.output_item.done", "output_index": i, "item": copy.deepcopy(item)})

    def _open(self, kind: str, events: list) -> None:
        self.close(events)
        if kind == "reasoning":
            item = {"id": item_id("rs"), "type": "reasoning", "summary": [], "status": "in_progress",
                    "content": [{"type": "reasoning_text", "text": ""}]}
        else:
            item = {"id": item_id("msg"), "type": "message", "role": "assistant", "status": "in_progress",
                    "content": [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}]}
        self.open = self._add(item, events)
        events.append({"type": "response.content_part.added", "item_id": item["id"], "output_index": self.open,
                       "content_index": 0, "part": self._part(item)})

    def _text(self, kind: str, text: str, logprobs: list, events: list) -> None:
        text, self.blank = self.blank + text, ""
        logprobs, self.blank_logprobs = self.blank_logprobs + logprobs, []
        if self.open is None or self.items[self.open]["type"] != kind:
            if not text.strip():
                self.blank, self.blank_logprobs = text, logprobs
                return
            self._open(kind, events)
            text = text.lstrip()
        item = self.items[self.open]
        part = item["content"][0]
        part["text"] += text
        head = {"item_id": item["id"], "output_index": self.open, "content_index": 0, "delta": text}
        if kind == "reasoning":
            events.append({"type": "response.reasoning_text.delta", **head})
        else:
            part["logprobs"] += logprobs
            events.append({"type": "response.output_text.delta", **head, "logprobs": logprobs})

    def feed(self, p) -> list[dict]:
        """The events of one piece: its reasoning, its answer text, its calls as they form."""
        events: list[dict] = []
        lp = []
        if self.logprobs:  # a token's logprob waits for its text (half a character has none yet)
            self.held_logprobs += p.logprobs
            if p.content:
                lp = [e.model_dump() for e in chat_logprobs(self.tok, self.held_logprobs).content]
            if p.content or p.reasoning or p.tool_deltas:
                self.held_logprobs = []
        if p.reasoning:
            self._text("reasoning", p.reasoning, [], events)
        if p.content:
            self._text("message", p.content, lp, events)
        for d in p.tool_deltas:
            f = d.get("function") or {}
            if d["index"] not in self.calls:
                self.close(events)
                self.blank, self.blank_logprobs = "", []
                name, ns, custom = self.names.get(f.get("name", ""), (f.get("name", ""), None, False))
                if custom:  # its input comes whole when the call closes
                    item = {"id": item_id("ctc"), "type": "custom_tool_call", "call_id": d["id"], "name": name,
                            "input": "", "status": "in_progress", "_arguments": ""}
                else:
                    item = {"id": item_id("fc"), "type": "function_call", "call_id": d["id"], "name": name,
                            "arguments": "", "status": "in_progress"}
                if ns:
                    item["namespace"] = ns
                self.calls[d["index"]] = self._add(item, events)
            i = self.calls[d["index"]]
            if self.items[i]["type"] == "custom_tool_call":
                self.items[i]["_arguments"] += f.get("arguments") or ""
            elif f.get("arguments"):
                self.items[i]["arguments"] += f["arguments"]
                events.append({"type": "response.function_call_arguments.delta", "item_id": self.items[i]["id"],
                               "output_index": i, "delta": f["arguments"]})
        for call in p.tool_calls:  # closed: the arguments as streamed (else as parsed)
            i = next((i for i in self.calls.values() if self.items[i]["call_id"] == call.id), None)
            if i is None:
                continue
            item = self.items[i]
            status = "completed" if call.complete else "incomplete"
            if item["type"] == "custom_tool_call":
                item.update(input=_custom_input(item.pop("_arguments") or call.arguments), status=status)
                head = {"item_id": item["id"], "output_index": i}
                events.append({"type": "response.custom_tool_call_input.delta", **head, "delta": item["input"]})
                events.append({"type": "response.custom_tool_call_input.done", **head, "input": item["input"]})
            else:
                item.update(arguments=item["arguments"] or call.arguments, status=status)
                events.append({"type": "response.function_call_arguments.done", "item_id": item["id"],
                               "output_index": i, "name": item["name"], "arguments": item["arguments"]})
            events.append({"type": "response.output_item.done", "output_index": i, "item": copy.deepcopy(item)})
        return events

    def finish(self, status: str) -> list[dict]:
        events: list[dict] = []
        if not self.items:  # an empty answer is still a message
            self._open("message", events)
        # the logprobs of tokens that made no text (whitespace only, or never a whole character)
        left = self.blank_logprobs + self.held_logprobs
        if left and self.open is not None and self.items[self.open]["type"] == "message":
            self.items[self.open]["content"][0]["logprobs"] += [e.model_dump()
                                                                for e in chat_logprobs(self.tok, left).content]
        self.close(events, status)
        for i, item in enumerate(self.items):  # a call cut off (max_output_tokens) or that did not parse
            if item["type"] in ("function_call", "custom_tool_call") and item["status"] == "in_progress":
                if item["type"] == "custom_tool_call":
                    item["input"] = _custom_input(item.pop("_arguments"))
                item["status"] = "incomplete"
                events.append({"type": "response.output_item.done", "output_index": i, "item": copy.deepcopy(item)})
        return events


class ResponsesServing(OverChat):
    """The /v1/responses endpoint over the chat path."""

    translate, renamed = staticmethod(to_chat), RENAMED

    def _shell(self, req: ResponsesRequest, rid: str, created: float) -> dict:
        """The response object without its output, as the stream's first events carry it."""
        fmt = (req.text.format if req.text else None) or {"type": "text"}
        return {"id": rid, "object": "response", "created_at": created, "status": "in_progress", "error": None,
                "incomplete_details": None, "instructions": req.instructions,
                "max_output_tokens": req.max_output_tokens,
                "model": req.model, "output": [], "parallel_tool_calls": req.parallel_tool_calls is not False,
                "previous_response_id": None, "reasoning": {"effort": req.reasoning.effort if req.reasoning else None,
                                                            "summary": None},
                "store": False, "temperature": req.temperature if req.temperature is not None else 1.0,
                "text": {"format": fmt}, "tool_choice": req.tool_choice or "auto", "tools": req.tools or [],
                "top_p": req.top_p if req.top_p is not None else 1.0, "truncation": req.truncation or "disabled",
                "usage": None, "user": req.user, "metadata": req.metadata or {}}

    async def _events(self, req: ResponsesRequest, prep, streamed: bool) -> AsyncIterator[dict]:
        rid, created, tally = item_id("resp"), time.time(), Tally()
        response = self._shell(req, rid, created)
        yield {"type": "response.created", "response": dict(response)}
        yield {"type": "response.in_progress", "response": dict(response)}
        items = _Items(prep.tokenizer, prep.params[0].logprobs is not None, tool_names(req))
        finish = None
        try:
            async for p in self.service.pieces(prep, tally):
                for e in items.feed(p):
                    yield e
                finish = p.finish_reason or finish
        except Exception as e:  # streamed: the reply so far, marked failed, with the reason
            if not streamed:
                raise
            if not isinstance(e, APIError):
                log.exception("response failed")
            code = "rate_limit_exceeded" if getattr(e, "status", 500) == 429 else "server_error"
            response.update(status="failed", output=items.items, error={"code": code, "message": str(e)})
            yield {"type": "response.failed", "response": response}
            return
        status = "incomplete" if finish == "length" else "completed"
        for e in items.finish(status):
            yield e
        u = tally.usage()
        response.update(status=status, output=items.items, completed_at=time.time(),
                        incomplete_details={"reason": "max_output_tokens"} if status == "incomplete" else None,
                        usage={"input_tokens": u.prompt_tokens, "input_tokens_details": u.prompt_tokens_details,
                               "output_tokens": u.completion_tokens,
                               "output_tokens_details": u.completion_tokens_details,
                               "total_tokens": u.total_tokens})  # the chat usage, under the Responses names
        yield {"type": f"response.{status}", "response": response}

    async def stream(self, req: ResponsesRequest) -> tuple[AsyncIterator[str], threading.Event]:
        """The SSE lines (`event:` and `data:`, numbered), and the job's cancel flag."""
        prep = await self._prepare(req)

        async def lines():
            seq = 0
            async for e in self._events(req, prep, True):
                e["sequence_number"] = seq
                seq += 1
                yield f"event: {e['type']}\ndata: {json.dumps(e, ensure_ascii=False)}\n\n"
        return lines(), prep.job.cancel

    async def create(self, req: ResponsesRequest) -> dict:
        prep = await self._prepare(req)
        last = None
        async for e in self._events(req, prep, False):
            last = e
        return last["response"]
