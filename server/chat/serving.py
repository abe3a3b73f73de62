"""From an OpenAI request to the engine and back: the chat or completion prompt (its
templating, the context check; the settings themselves come from server.chat.prepare,
the messages' images and audio from server.chat.media), the worker queue, the reasoning
and tool-call split of what the model writes, and the response in its streamed or folded
form (wire details in server.chat.wire). The non-streaming reply is built by folding the
stream, so there is one generation path."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import AsyncIterator

from ...engine import (GrammarError, MediaError, TemplateError, TemplateWorkers, ThinkingBudget, encode, prompt_ids,
                       schema_of)
from ..core.errors import APIError, BadRequest, ContextLengthExceeded
from ..core.pools import Pools
from ..core.protocol import new_id, now
from ..models.catalog import refuse_kind, refuse_unknown_adapters
from ..models.residency import Residency
from ..models.presets import sampling_defaults
from ..models.worker import Job
from . import harmony
from .derived_calls import PASSING, PROBE_TOOLS, Derived, marker_of, probe_replies
from .media import ChatMedia
from .prepare import (Prepared, Split, constrain, origin_param, per_choice, refuse_parts, refuse_unsupported, render_chat,
                      template_tool_calls, tools_for, without_billing_header)
from .protocol import (ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, Choice, ChunkChoice, Completion,
                       CompletionChoice, CompletionRequest, Delta, ResponseMessage)
from .reasoning import enable_thinking, starts_in_reasoning
from .tool_parse import ToolCallSplitter, syntax_for
from .wire import SYSTEM_FINGERPRINT, Piece, Tally, chat_logprobs, completion_logprobs, reply_content

log = logging.getLogger("gguf_serve.server")
# chat replies of a model without a chat template (a base model, such as the embedded default)
# that set no max_tokens: it rarely ends a turn, and would write the server's whole --max-tokens
BASE_MODEL_MAX_TOKENS = 256


def sse_chunk(reply, progress: dict | None = None) -> str:
    """A chat completion or completion chunk as its `data:` line: OpenAI's chunks say
    `logprobs` and `finish_reason` are null until they are not; `progress` is llama-server's
    prompt_progress (return_progress)."""
    data = reply.model_dump(exclude_none=True)
    if progress is not None:
        data["prompt_progress"] = progress
    for ch in data["choices"]:
        ch.setdefault("logprobs", None)
        ch.setdefault("finish_reason", None)
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"

MEASURE_PIECE = 1 << 16  # characters tokenized at a time while a long prompt is measured


class ChatServing:
    """The chat and completions endpoints, and the generation path the Responses and
    Messages APIs run through (`through_chat`, `pieces`)."""

    def __init__(self, residency: Residency, settings, templates: TemplateWorkers, pools: Pools, metrics=None):
        self.residency = residency
        self.settings = settings
        self.templates = templates  # the chat templates' worker processes, shared by every model
        self.pools = pools  # tokenizing, grammars and media on bounded threads (server.core.pools)
        self.media = ChatMedia(settings, pools)  # images and audio in messages (server.chat.media)
        self.metrics = metrics
        self._warned_no_switch: set[str] = set()
        self._syntaxes: dict[tuple, Derived | None] = {}  # per loaded model: its template's derived call syntax

    async def _prepared(self, model: str | None, keep_alive: float | None, prepare, progress: bool = False,
                        lora: list | None = None) -> Prepared:
        """Hold the model, run `prepare(entry)` (a coroutine giving a Prepared) and queue
        its job (`progress`: its prompt's processing reported as it goes; `lora`: the
        request's adapters); the hold ends with the job (or here, if anything fails first)."""
        entry = await self.residency.hold(model, keep_alive)
        try:
            refuse_kind(entry, "generate")
            chosen = self.adapters_for(entry, model, lora)
            prep = await prepare(entry)
            job = Job(prep.prompt_ids, prep.params, asyncio.get_running_loop(), asyncio.Queue(), media=prep.media,
                      progress=progress, lora=chosen)
            job.done_callbacks.append(lambda: self.residency.release(entry))
            entry.worker.submit(job)  # Overloaded (429) when the queue is full
            prep.job = job
            return prep
        except BaseException:
            self.residency.release(entry)
            raise

    def adapters_for(self, entry, model: str | None, lora: list | None) -> tuple[tuple[int, float], ...]:
        """The LoRA adapters a request runs with: its `lora` list (the others off), else the
        one its model name means (`<model>+<adapter>`, at scale 1), else the model's scales
        (--lora, POST /lora-adapters)."""
        if lora is not None:
            refuse_unknown_adapters(entry, [c.id for c in lora], "lora")
            return tuple((c.id, c.scale) for c in lora if c.scale)
        named = self.residency.catalog.adapter_named(model)
        if named is not None:
            return ((named, 1.0),)
        return tuple((i, s) for i, s in entry.lora_scales.items() if s)

    async def _derived_syntax(self, entry) -> Derived | None:
        """The call syntax the model's template shows when it renders probe calls
        (server.chat.derived_calls), for a template that renders tools in a form no
        hand-written family reads; derived once per loaded model. None: the family's."""
        lm = entry.lm
        chat = lm.chat_format
        if chat.harmony or "tool" not in (lm.chat_template or ""):
            return None
        key = (entry.id, id(lm))
        if key not in self._syntaxes:
            async def render(messages, generation_prompt):
                return await self.templates.render(lm.chat_template, messages, max_chars=1 << 20,
                                                   special_tokens=lm.tokenizer.special_tokens_map,
                                                   tools=PROBE_TOOLS, add_generation_prompt=generation_prompt)
            try:
                self._syntaxes[key] = syntax_for(chat.calls.family, chat.renders_tools, await probe_replies(render))
            except TemplateError as e:
                if e.kind in PASSING:  # asked again on the next request
                    return None
                log.info("%s: its template does not render tool calls (%s): tools go in the system prompt",
                         entry.id, e)
                self._syntaxes[key] = None
            if self._syntaxes[key] is not None:
                log.info("%s: tool calls read in its template's own syntax (from %r)", entry.id,
                         marker_of(self._syntaxes[key]))
        return self._syntaxes[key]

    def sampling_defaults(self, entry) -> dict:
        """What a request to `entry` leaves out comes from (server.models.presets)."""
        return sampling_defaults(self.settings, self.settings.presets, entry)

    def _context(self, entry) -> int:
        return entry.lm.n_ctx  # the cache's, sized at load from --ctx-size or the memory available

    def _check_length(self, entry, n_prompt: int, max_tokens: int | None, param: str) -> None:
        if n_prompt == 0:  # nothing to condition on (a model that adds no BOS, an empty prompt)
            raise BadRequest(f"the {param} is empty", param=param)
        ctx = self._context(entry)
        if n_prompt >= ctx or (max_tokens is not None and n_prompt + max_tokens > ctx):
            want = n_prompt + (max_tokens or 0)
            raise ContextLengthExceeded(
                f"This model's maximum context length is {ctx} tokens. However, you requested {want} tokens "
                f"({n_prompt} in the {param}, {max_tokens or 0} in the completion).", param=param)

    async def _measure(self, entry, text: str, param: str) -> None:
        """Refuse a text far over the context before tokenizing all of it. The tokenizer
        holds the GIL while it works (seconds for megabytes, and /health would wait), so a
        long text is counted in pieces, each on a worker thread, the event loop running in
        between; once the count is sure to be over the context, it is refused. A text that
        fits is then tokenized whole (at most about a context's worth of work)."""
        if len(text) <= MEASURE_PIECE:
            return
        ctx, tok = self._context(entry), entry.lm.tokenizer.backend_tokenizer
        count, start, pieces = 0, 0, 0
        while start < len(text):
            end = min(len(text), start + MEASURE_PIECE)
            cut = text.rfind(" ", start + MEASURE_PIECE // 2, end) if end < len(text) else -1
            end = cut if cut > 0 else end  # at a space: a piece changes the count by a token or two
            count += len(await self.pools.prompts.run(tok.encode, text[start:end], add_special_tokens=False))
            start, pieces = end, pieces + 1
            at_least = count - 16 * pieces  # what the pieces' boundaries could have added, generously
            if at_least >= ctx:
                verb = "are" if param == "messages" else "is"
                raise ContextLengthExceeded(f"This model's maximum context length is {ctx} tokens. However, the "
                                            f"{param} alone {verb} more than {at_least} tokens.", param=param)

    # ------------------------------------------------------------- chat

    async def prepare_chat(self, req: ChatCompletionRequest) -> Prepared:
        """The request's prompt and settings, its job queued on the model's worker."""
        refuse_unsupported(req)
        return await self._prepared(req.model, req.keep_alive, lambda entry: self._prepare_chat(entry, req),
                                    progress=bool(req.stream and req.return_progress), lora=req.lora)

    async def through_chat(self, to_chat, req, renamed: dict[str, str], use=None):
        """`use` (default: prepare_chat) on the chat request `to_chat(req)` makes from another
        API's request (Responses, Messages); an error names its field in that request's terms."""
        chat = None
        try:
            chat = to_chat(req)
            return await (use or self.prepare_chat)(chat)
        except APIError as e:
            e.param = origin_param(e.param, getattr(chat, "_origins", None), renamed)
            raise

    async def render_prompt(self, req: ChatCompletionRequest) -> str:
        """The prompt a chat request renders to, generating nothing (/apply-template)."""
        refuse_unsupported(req)
        async with self.residency.holding(req.model, req.keep_alive) as entry:
            refuse_kind(entry, "generate")
            return (await self._prepare_chat(entry, req)).text

    async def count_chat(self, req: ChatCompletionRequest) -> int:
        """The prompt tokens of a chat request (as it would be prepared), generating nothing."""
        refuse_unsupported(req)
        async with self.residency.holding(req.model, req.keep_alive) as entry:
            refuse_kind(entry, "generate")
            return len((await self._prepare_chat(entry, req)).prompt_ids)

    async def _prepare_chat(self, entry, req: ChatCompletionRequest) -> Prepared:
        lm = entry.lm
        messages, pending = [], []
        self.media.count(lm, req.messages)
        for i, m in enumerate(req.messages):
            refuse_parts(m, i)
            msg = {"role": "system" if m.role == "developer" else m.role,
                   "content": await self.media.content(m, i, pending)}
            if msg["role"] == "system" and (content := without_billing_header(msg["content"])) != msg["content"]:
                if content is None:  # nothing but the billing line
                    continue
                msg["content"] = content
            if m.tool_calls:
                msg["tool_calls"] = template_tool_calls(m.tool_calls, i)
            if m.tool_call_id:
                msg["tool_call_id"] = m.tool_call_id
            if m.reasoning_content:
                msg["reasoning_content"] = m.reasoning_content
            messages.append(msg)
        kwargs = dict(req.chat_template_kwargs or {})
        thinking = enable_thinking(req.chat_template_kwargs, req.reasoning_effort, self.settings.reasoning)
        chat = lm.chat_format  # read once, when the model loaded
        if chat.harmony:  # gpt-oss: a reasoning level in its system prompt instead of a switch
            messages = harmony.for_template(messages)
            effort = harmony.reasoning_effort(req.reasoning_effort, thinking)
            if effort is not None:
                kwargs.setdefault("reasoning_effort", effort)
        elif thinking is not None:
            if chat.has_switch:
                kwargs["enable_thinking"] = thinking
            elif entry.id not in self._warned_no_switch:
                self._warned_no_switch.add(entry.id)
                log.info("%s: its chat template has no thinking switch; the reasoning setting is ignored", entry.id)
        items = await self.media.prepare(lm, pending)  # images and clips, in prompt order
        derived = await self._derived_syntax(entry) if req.tools and req.tool_choice != "none" else None
        tools, grammar_for_tools, family = tools_for(req, lm, messages, kwargs, derived)
        prompt = await render_chat(self.templates, lm, messages, kwargs)
        await self._measure(entry, prompt, "messages")
        try:
            ids, media = await self.pools.prompts.run(prompt_ids, lm, prompt, items)
        except MediaError as e:  # the template placed the media otherwise than given
            raise BadRequest(str(e), param="messages") from None
        max_tokens = req.max_completion_tokens or req.max_tokens
        if req._fit_max_tokens and max_tokens is not None:  # a cap, as llama-server takes Anthropic's max_tokens
            max_tokens = max(1, min(max_tokens, self._context(entry) - len(ids)))
        self._check_length(entry, len(ids), max_tokens, "messages")
        if max_tokens is None:  # the server's cap for requests that set none, within the context left
            cap = self.settings.max_tokens
            if not (entry.info or {}).get("chat_template", True) and not self.settings.chat_template:
                cap = min(cap, BASE_MODEL_MAX_TOKENS)  # a base model: it continues text, it does not end a turn
            max_tokens = min(cap, self._context(entry) - len(ids))
        params = per_choice(req, max_tokens, lm, (req.top_logprobs or 0) if req.logprobs else None,
                            self.sampling_defaults(entry))
        json_format = req.response_format if req.response_format and req.response_format.get("type") in (
            "json_object", "json_schema") else None
        if chat.harmony:
            await self._constrain_harmony(lm, params, grammar_for_tools, json_format)
            return Prepared(entry, ids, params, Split(harmony=True), tools=tools, family=family, media=media,
                            text=prompt)
        think_open, think_close = chat.think_open, chat.think_close
        split = Split(in_reasoning=starts_in_reasoning(prompt, chat.markers) and thinking is not False,
                      enabled=chat.thinks and thinking is not False, markers=chat.markers)
        # a grammar mask waits for the reasoning block to close, or lets one open first
        think = {"after": think_close, "optional": think_open, "waiting": split.in_reasoning} if split.enabled else {}
        if grammar_for_tools is not None:
            await self.pools.prompts.run(constrain, lm, grammar_for_tools, params, think, "tool_choice")
        elif json_format is not None:
            await self.pools.prompts.run(constrain, lm, json_format, params, think, "response_format")
        budget = req.thinking_budget_tokens
        budget = self.settings.reasoning_budget if budget is None else budget
        if budget is not None and split.enabled and think_close is not None:  # else: no block to close
            for p in params:
                p.logits_processor = ThinkingBudget(budget, think_close, think_open, split.in_reasoning,
                                                    inner=p.logits_processor)
        return Prepared(entry, ids, params, split, tools=tools, family=family, media=media, text=prompt)

    async def _constrain_harmony(self, lm, params, grammar_for_tools, json_format) -> None:
        """A harmony template's (gpt-oss) forced call or JSON answer: a grammar in the format
        itself (its reply is split by channels, so nothing waits for a reasoning block)."""
        if grammar_for_tools is not None:
            await self.pools.prompts.run(constrain, lm, grammar_for_tools, params, {}, "tool_choice")
        elif json_format is not None:
            try:
                grammar = harmony.forced_grammar(lm.tokenizer.backend_tokenizer.token_to_id,
                                                 schema=schema_of(json_format))
            except (GrammarError, ValueError) as e:
                raise BadRequest(str(e), param="response_format") from None
            await self.pools.prompts.run(constrain, lm, grammar, params, {}, "response_format")

    async def pieces(self, prep: Prepared, tally: Tally) -> AsyncIterator[Piece]:
        """The choices' pieces as the scheduler makes them (one prefill, the choices
        decoded side by side); cancels generation if abandoned."""
        tally.prompt_tokens = len(prep.prompt_ids)
        m, name = self.metrics, prep.entry.id
        job = prep.job
        breaks = (prep.family.open,) if prep.tools else ()  # a call ends an unclosed reasoning block
        splitters = [prep.split.splitter(breaks) for _ in prep.params]
        pending: list[list] = [[] for _ in prep.params]  # logprobs of tokens whose text is held back
        ids: list[list[int]] = [[] for _ in prep.params]  # tokens since the choice's last piece
        tools = [ToolCallSplitter(prep.tools, prep.family) if prep.tools else None for _ in prep.params]
        called = [False] * len(prep.params)
        last = [time.perf_counter()] * len(prep.params)
        first = [True] * len(prep.params)
        if m:
            m.prompt_tokens.labels(name).inc(len(prep.prompt_ids))
        try:
            while True:
                step = await job.out.get()
                if step is None:
                    break
                if isinstance(step, Exception):
                    raise step
                if step.progress is not None:  # llama-server's prompt_progress
                    done, cache = step.progress
                    yield Piece(index=0, progress={"total": step.prompt_tokens, "cache": cache, "processed": done,
                                                   "time_ms": (time.perf_counter() - tally.started) * 1e3})
                    continue
                i, splitter = step.index, splitters[step.index]
                tally.cached_tokens = step.cached_tokens
                if step.slot is not None and i == 0:
                    tally.slot = step.slot
                if step.drafted_tokens:
                    tally.drafts[i] = (step.drafted_tokens, step.accepted_tokens)
                if step.token_id is not None:
                    tally.first = tally.first or time.perf_counter()
                    tally.completion_tokens += 1
                    if m:
                        t = time.perf_counter()
                        (m.ttft if first[i] else m.tpot).labels(name).observe(t - last[i])
                        m.generated_tokens.labels(name).inc()
                        last[i], first[i] = t, False
                    if splitter.in_reasoning:
                        tally.reasoning_tokens += 1
                reasoning, content = splitter.feed(step.text)
                finish = step.finish_reason
                if step.token_id is not None and not (finish == "stop" and step.stop_sequence is None):
                    ids[i].append(step.token_id)  # (an end-of-generation token is not the reply's)
                if step.logprob is not None and finish != "stop":  # the token that stopped is not output
                    pending[i].append((step.token_id, step.logprob, step.top_logprobs or []))
                if finish is not None:
                    r2, c2 = splitter.flush()
                    reasoning, content = reasoning + r2, content + c2
                    finish = "length" if finish == "cancelled" else finish
                calls, deltas = [], []
                if tools[i] is not None:
                    content, calls = tools[i].feed(content)
                    if finish is not None:
                        c3, more = tools[i].flush()
                        content, calls = content + c3, calls + more
                    deltas = tools[i].take_deltas()
                    called[i] = called[i] or bool(calls)
                    if finish == "stop" and called[i]:
                        finish = "tool_calls"
                if reasoning or content or finish or calls or deltas:
                    yield Piece(i, content, reasoning, finish, pending[i], calls, deltas,
                                step.stop_sequence if finish == "stop" else None, ids[i])
                    pending[i], ids[i] = [], []
        finally:
            job.cancel.set()

    async def chat_stream(self, req: ChatCompletionRequest) -> tuple[AsyncIterator[str], threading.Event]:
        """The SSE lines, and the job's cancel flag (for the response to set on hang-up)."""
        prep = await self.prepare_chat(req)  # queued now: a refusal (429) is the response's status
        return self._chat_sse(req, prep), prep.job.cancel

    async def _chat_sse(self, req, prep) -> AsyncIterator[str]:
        cid, created, tally = new_id("chatcmpl"), now(), Tally()
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def chunk(choices, usage=None, timings=None, progress=None) -> str:
            return sse_chunk(ChatCompletionChunk(id=cid, created=created, model=req.model, choices=choices, usage=usage,
                                                 system_fingerprint=SYSTEM_FINGERPRINT, timings=timings), progress)

        tok = prep.tokenizer
        for i in range(len(prep.params)):
            yield chunk([ChunkChoice(index=i, delta=Delta(role="assistant", content=""))])
        async for p in self.pieces(prep, tally):
            if p.progress is not None:
                yield chunk([], progress=p.progress)
                continue
            delta = Delta(content=p.content or None, reasoning_content=p.reasoning or None)
            lp = chat_logprobs(tok, p.logprobs) if req.logprobs and p.logprobs else None
            if p.content or p.reasoning:
                yield chunk([ChunkChoice(index=p.index, delta=delta, logprobs=lp)])
                lp = None
            if p.tool_deltas:  # names first, then argument fragments as they are generated
                yield chunk([ChunkChoice(index=p.index, delta=Delta(tool_calls=p.tool_deltas))])
            if p.finish_reason:  # a choice's last chunk: the times so far (llama-server's `timings`)
                yield chunk([ChunkChoice(index=p.index, delta=Delta(), logprobs=lp, finish_reason=p.finish_reason)],
                            timings=tally.timings())
        if include_usage:
            yield chunk([], usage=tally.usage(), timings=tally.timings())
        yield "data: [DONE]\n\n"

    async def chat(self, req: ChatCompletionRequest) -> ChatCompletion:
        prep = await self.prepare_chat(req)
        tally = Tally()
        texts = [{"content": [], "reasoning": [], "finish": None, "logprobs": [], "calls": []} for _ in prep.params]
        async for p in self.pieces(prep, tally):
            t = texts[p.index]
            t["calls"] += p.tool_calls
            t["content"].append(p.content)
            t["reasoning"].append(p.reasoning)
            t["finish"] = p.finish_reason or t["finish"]
            t["logprobs"] += p.logprobs
        tok = prep.tokenizer
        choices = [Choice(index=i, message=ResponseMessage(content=reply_content(t),
                                                           reasoning_content="".join(t["reasoning"]) or None,
                                                           tool_calls=[c.openai() for c in t["calls"]] or None),
                          logprobs=chat_logprobs(tok, t["logprobs"]) if req.logprobs else None,
                          finish_reason=t["finish"]) for i, t in enumerate(texts)]
        return ChatCompletion(id=new_id("chatcmpl"), created=now(), model=req.model, choices=choices,
                              usage=tally.usage(), system_fingerprint=SYSTEM_FINGERPRINT, timings=tally.timings())

    # ------------------------------------------------------- completions

    async def prepare_completion(self, req: CompletionRequest) -> Prepared:
        refuse_unsupported(req)
        if isinstance(req.prompt, list) and req.prompt and isinstance(req.prompt[0], int):
            prompt = req.prompt  # token ids
        elif isinstance(req.prompt, list):
            if len(req.prompt) != 1:
                raise BadRequest("only one prompt string per request is supported", param="prompt")
            prompt = req.prompt[0]
        else:
            prompt = req.prompt
        return await self._prepared(req.model, req.keep_alive,
                                    lambda entry: self._prepare_completion(entry, req, prompt),
                                    progress=bool(req.stream and req.return_progress) or req._progress, lora=req.lora)

    async def _prepare_completion(self, entry, req: CompletionRequest, prompt: str | list[int]) -> Prepared:
        if isinstance(prompt, list):
            n = entry.lm.model.vocab_size
            bad = next((i for i, t in enumerate(prompt) if not 0 <= t < n), None)
            if bad is not None:
                raise BadRequest(f"token id {prompt[bad]} is outside the vocabulary (0..{n - 1})", param=f"prompt.{bad}")
            ids = prompt
        else:
            await self._measure(entry, prompt, "prompt")
            ids = await self.pools.prompts.run(encode, entry.lm.tokenizer, prompt)
        self._check_length(entry, len(ids), req.max_tokens, "prompt")
        max_tokens = req.max_tokens
        if max_tokens is None:  # the server's cap (--max-tokens, --n-predict), within the context left
            max_tokens = min(self.settings.max_tokens, self._context(entry) - len(ids))
        params = per_choice(req, max_tokens, entry.lm, req.logprobs, self.sampling_defaults(entry))
        if req._grammar is not None:
            await self.pools.prompts.run(constrain, entry.lm, req._grammar, params, {}, "grammar")
        return Prepared(entry, ids, params, Split())

    async def completion_stream(self, req: CompletionRequest) -> tuple[AsyncIterator[str], threading.Event]:
        prep = await self.prepare_completion(req)
        return self._completion_sse(req, prep), prep.job.cancel

    async def _completion_sse(self, req, prep) -> AsyncIterator[str]:
        cid, created, tally = new_id("cmpl"), now(), Tally()
        tok, offsets = prep.tokenizer, [0] * len(prep.params)

        def chunk(choices, usage=None, progress=None) -> str:
            return sse_chunk(Completion(id=cid, created=created, model=req.model, choices=choices, usage=usage,
                                        system_fingerprint=SYSTEM_FINGERPRINT), progress)

        async for p in self.pieces(prep, tally):
            if p.progress is not None:
                yield chunk([], progress=p.progress)
                continue
            lp = None
            if req.logprobs is not None:
                lp = completion_logprobs(tok, p.logprobs, offsets[p.index])
                offsets[p.index] += sum(len(t) for t in lp.tokens)
            yield chunk([CompletionChoice(text=p.content, index=p.index, logprobs=lp, finish_reason=p.finish_reason)])
        if req.stream_options and req.stream_options.include_usage:
            yield chunk([], tally.usage())
        yield "data: [DONE]\n\n"

    async def completion(self, req: CompletionRequest) -> Completion:
        prep = await self.prepare_completion(req)
        tally = Tally()
        texts = [{"text": [], "finish": None, "logprobs": []} for _ in prep.params]
        async for p in self.pieces(prep, tally):
            texts[p.index]["text"].append(p.content)
            texts[p.index]["finish"] = p.finish_reason or texts[p.index]["finish"]
            texts[p.index]["logprobs"] += p.logprobs
        tok = prep.tokenizer
        return Completion(id=new_id("cmpl"), created=now(), model=req.model,
                          choices=[CompletionChoice(text="".join(t["text"]), index=i, finish_reason=t["finish"],
                                                    logprobs=completion_logprobs(tok, t["logprobs"])
                                                    if req.logprobs is not None else None)
                                   for i, t in enumerate(texts)], usage=tally.usage(),
                          system_fingerprint=SYSTEM_FINGERPRINT)


class OverChat:
    """An API whose requests run through the chat path (Responses, Messages): `translate`
    makes the chat request one of its requests means, `renamed` names the chat fields an
    error may name as that API's own."""

    translate: staticmethod
    renamed: dict[str, str]

    def __init__(self, chat: ChatServing):
        self.service = chat

    async def _prepare(self, req):
        return await self.service.through_chat(type(self).translate, req, self.renamed)
