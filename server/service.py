"""From an OpenAI request to the engine and back: templating, sampling settings, the
worker queue, reasoning split, and the response in its streamed or folded form. The
non-streaming reply is built by folding the stream, so there is one generation path."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from typing import AsyncIterator

from ..engine.chat import render, rendered_ids
from ..engine.grammar import GrammarError, GrammarMask, ThinkingBudget, json_grammar, schema_of
from ..engine.sampling import SamplingParams
from ..engine.tokenizer import encode
from .errors import BadRequest, ContextLengthExceeded
from .protocol import (ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, Choice, ChoiceLogprobs, ChunkChoice,
                       Completion, CompletionChoice, CompletionLogprobs, CompletionRequest, Delta, ResponseMessage,
                       TokenLogprob, TopLogprob, Usage, new_id, now, unsupported_fields)
from .reasoning import THINK_CLOSE, THINK_OPEN, ReasoningSplitter, enable_thinking, starts_in_reasoning, template_has_switch
from .registry import Job, Registry
from .tools import (HERMES, Family, ToolCallSplitter, call_format, for_template, render_fallback, required_grammar,
                    template_renders_tools)

log = logging.getLogger("gguf_serve.server")

SYSTEM_FINGERPRINT = "gguf-serve"  # OpenAI's backend-configuration tag, in every chunk and reply
MEASURE_PIECE = 1 << 16  # characters tokenized at a time while a long prompt is measured


@dataclass
class Piece:
    """One streamed piece of one choice."""

    index: int
    content: str = ""
    reasoning: str = ""
    finish_reason: str | None = None
    logprobs: list = field(default_factory=list)  # (token id, logprob, [(id, logprob)...]) of its tokens
    tool_calls: list = field(default_factory=list)  # ToolCall, whole
    tool_deltas: list = field(default_factory=list)  # the calls as OpenAI stream deltas, as they form


@dataclass
class Tally:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cached_tokens: int = 0

    def usage(self) -> Usage:
        return Usage(prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
                     total_tokens=self.prompt_tokens + self.completion_tokens,
                     prompt_tokens_details={"cached_tokens": self.cached_tokens},
                     completion_tokens_details={"reasoning_tokens": self.reasoning_tokens})


@dataclass
class Prepared:
    entry: object
    prompt_ids: list[int]
    params: list[SamplingParams]
    splitter_args: dict = field(default_factory=dict)
    job: Job | None = None  # queued before a stream starts
    tools: list = field(default_factory=list)  # the tools the reply may call (their calls parsed out)
    family: Family = HERMES  # how the model writes them


def _stops(stop) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


def _sampling(req, max_tokens: int | None, vocab_size: int) -> SamplingParams:
    bias = {}
    for k, v in (req.logit_bias or {}).items():
        try:
            token = int(k)
        except ValueError:
            raise BadRequest(f"logit_bias keys must be token ids, got {k!r}", param="logit_bias") from None
        if not 0 <= token < vocab_size:
            raise BadRequest(f"logit_bias: token id {token} is outside the vocabulary (0..{vocab_size - 1})",
                             param="logit_bias")
        bias[token] = float(v)
    return SamplingParams(
        temperature=req.temperature if req.temperature is not None else 1.0,
        top_p=req.top_p if req.top_p is not None else 1.0,
        top_k=req.top_k or 0,
        min_p=req.min_p or 0.0,
        repetition_penalty=req.repetition_penalty or 1.0,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        seed=req.seed,
        stop=_stops(req.stop),
        max_tokens=max_tokens,
        logit_bias=bias,
        ignore_eos=bool(req.ignore_eos),
    )


def _template_tool_calls(calls: list[dict], i: int) -> list[dict]:
    """An assistant message's tool_calls as chat templates read them: arguments as a mapping."""
    out = []
    for j, c in enumerate(calls):
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise BadRequest("a tool call needs function.name", param=f"messages.{i}.tool_calls.{j}")
        args = f.get("arguments") or "{}"
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                raise BadRequest("tool call arguments must be a JSON object",
                                 param=f"messages.{i}.tool_calls.{j}.function.arguments") from None
        out.append({"id": c.get("id"), "type": "function", "function": {"name": f["name"], "arguments": args}})
    return out


def _refuse_parts(m, i: int) -> None:
    """Content this server cannot use is refused, never dropped: non-text parts (images,
    audio, files)."""
    if isinstance(m.content, list):
        for j, part in enumerate(m.content):
            if part.type != "text":
                raise BadRequest(f"content parts of type {part.type!r} are not supported (text only)",
                                 param=f"messages.{i}.content.{j}", code="unsupported_parameter")


def _refuse_unsupported(req) -> None:
    bad = unsupported_fields(req)
    if bad:
        raise BadRequest(f"'{bad[0]}' is not supported by this server yet", param=bad[0], code="unsupported_parameter")


def _per_choice(req, max_tokens: int | None, lm, logprobs: int | None) -> list[SamplingParams]:
    """One SamplingParams per requested choice (n), built and checked once; a seed
    advances by one per choice (within the 64 bits a generator takes)."""
    n = req.n or 1
    if n > lm.cache.n_seq:
        raise BadRequest(f"n={n} choices need as many sequence slots; this server runs {lm.cache.n_seq} "
                         f"(--parallel)", param="n")
    base = _sampling(req, max_tokens, lm.model.vocab_size)
    base.logprobs = logprobs
    if base.seed is None:
        return [replace(base) for _ in range(n)]
    return [replace(base, seed=base.seed + i if base.seed + i < 2 ** 64 else base.seed + i - 2 ** 64)
            for i in range(n)]


class Service:
    def __init__(self, registry: Registry, settings, metrics=None):
        self.registry = registry
        self.settings = settings
        self.metrics = metrics
        self._warned_no_switch: set[str] = set()

    async def _entry(self, model: str):
        entry = self.registry.get(model)
        return await asyncio.to_thread(self.registry.ensure_loaded, entry)

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
            count += len(await asyncio.to_thread(tok.encode, text[start:end], add_special_tokens=False))
            start, pieces = end, pieces + 1
            at_least = count - 16 * pieces  # what the pieces' boundaries could have added, generously
            if at_least >= ctx:
                verb = "are" if param == "messages" else "is"
                raise ContextLengthExceeded(f"This model's maximum context length is {ctx} tokens. However, the "
                                            f"{param} alone {verb} more than {at_least} tokens.", param=param)

    async def entry_for(self, model: str | None):
        """A loaded model by id; with none named, the only one served (else a 400)."""
        if model is None:
            ids = list(self.registry.entries)
            if len(ids) != 1:
                raise BadRequest(f"name the model: this server has {len(ids)}", param="model")
            model = ids[0]
        return await self._entry(model)

    # ------------------------------------------------------------- chat

    async def prepare_chat(self, req: ChatCompletionRequest) -> Prepared:
        _refuse_unsupported(req)
        entry = await self._entry(req.model)
        lm = entry.lm
        messages = []
        for i, m in enumerate(req.messages):
            _refuse_parts(m, i)
            msg = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            if m.tool_calls:
                msg["tool_calls"] = _template_tool_calls(m.tool_calls, i)
            if m.tool_call_id:
                msg["tool_call_id"] = m.tool_call_id
            if m.reasoning_content:
                msg["reasoning_content"] = m.reasoning_content
            messages.append(msg)
        kwargs = dict(req.chat_template_kwargs or {})
        thinking = enable_thinking(req.chat_template_kwargs, req.reasoning_effort, self.settings.reasoning)
        has_switch = template_has_switch(lm.chat_template)
        if thinking is not None:
            if has_switch:
                kwargs["enable_thinking"] = thinking
            elif entry.id not in self._warned_no_switch:
                self._warned_no_switch.add(entry.id)
                log.info("%s: its chat template has no thinking switch; the reasoning setting is ignored", entry.id)
        tools, grammar_for_tools, family = self._tools(req, lm, messages, kwargs)
        prompt = await asyncio.to_thread(_render, lm, messages, kwargs)
        await self._measure(entry, prompt, "messages")
        ids = await asyncio.to_thread(rendered_ids, lm.tokenizer, prompt)
        max_tokens = req.max_completion_tokens or req.max_tokens
        self._check_length(entry, len(ids), max_tokens, "messages")
        if max_tokens is None:  # the server's cap for requests that set none, within the context left
            max_tokens = min(self.settings.max_tokens, self._context(entry) - len(ids))
        think_open, think_close = (lm.tokenizer.backend_tokenizer.token_to_id(t) for t in (THINK_OPEN, THINK_CLOSE))
        vocab_thinks = think_open is not None or (lm.chat_template and THINK_OPEN in lm.chat_template)
        split = {"in_reasoning": starts_in_reasoning(prompt) and thinking is not False,
                 "enabled": bool(vocab_thinks) and thinking is not False}
        params = _per_choice(req, max_tokens, lm, (req.top_logprobs or 0) if req.logprobs else None)
        # a grammar mask waits for the reasoning block to close, or lets one open first
        think = {"after": think_close, "optional": think_open, "waiting": split["in_reasoning"]} \
            if split["enabled"] else {}
        if grammar_for_tools is not None:
            await asyncio.to_thread(self._constrain, lm, grammar_for_tools, params, think, "tool_choice")
        elif req.response_format and req.response_format.get("type") in ("json_object", "json_schema"):
            await asyncio.to_thread(self._constrain, lm, req.response_format, params, think, "response_format")
        budget = req.thinking_budget_tokens
        budget = self.settings.reasoning_budget if budget is None else budget
        if budget is not None and split["enabled"] and think_close is not None:  # else: no block to close
            for p in params:
                p.logits_processor = ThinkingBudget(budget, think_close, think_open, split["in_reasoning"],
                                                    inner=p.logits_processor)
        return Prepared(entry, ids, params, split, tools=tools, family=family)

    @staticmethod
    def _tools(req, lm, messages: list[dict], kwargs: dict) -> tuple[list[dict], str | None, Family]:
        """The tools the reply may call (empty: none), for `tool_choice` required or a named
        function the grammar its reply must follow, and the family its calls are written
        in. Renders them: through the template when it knows tools, else as a system
        message (the generic fallback)."""
        choice = req.tool_choice
        if not req.tools or choice == "none":
            return [], None, HERMES
        for j, t in enumerate(req.tools):
            f = t.get("function") if t.get("type") == "function" else None
            if not isinstance(f, dict) or not isinstance(f.get("name"), str):
                raise BadRequest("each tool must be {'type': 'function', 'function': {'name': ..., ...}}",
                                 param=f"tools.{j}")
        fmt = call_format(lm.chat_template, lm.tokenizer.backend_tokenizer.token_to_id)
        if template_renders_tools(lm.chat_template):
            kwargs["tools"] = req.tools
            for_template(messages, fmt.family)
        else:
            render_fallback(messages, req.tools)
        name = None
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name")
            if not isinstance(name, str):
                raise BadRequest("tool_choice must be 'none', 'auto', 'required' or "
                                 "{'type': 'function', 'function': {'name': ...}}", param="tool_choice")
        elif choice not in (None, "auto", "required"):
            raise BadRequest(f"tool_choice {choice!r} is not 'none', 'auto' or 'required'", param="tool_choice")
        grammar = None
        if choice == "required" or name is not None:
            try:
                # a named function is one call (as OpenAI and vLLM make it); `required`, one or more
                parallel = name is None and req.parallel_tool_calls is not False
                grammar = required_grammar(req.tools, name, parallel, fmt)
            except ValueError as e:
                raise BadRequest(str(e), param="tool_choice") from None
        return req.tools, grammar, fmt.family

    @staticmethod
    def _constrain(lm, constraint: dict | str, params: list[SamplingParams], think: dict, field: str) -> None:
        """A grammar mask per choice (llguidance): a response_format's JSON, or a grammar
        (a forced tool call's); for a thinking model (`think`: GrammarMask's reasoning
        arguments) it starts once the reasoning block closes. `field`: the request field
        a failure is reported against. Off the event loop: the first one builds the
        grammar vocabulary (~3 s for a 262k-token one)."""
        try:
            grammar = constraint if isinstance(constraint, str) else json_grammar(schema_of(constraint))
            for p in params:
                p.logits_processor = GrammarMask(lm, grammar, **think)
        except (GrammarError, json.JSONDecodeError) as e:
            raise BadRequest(f"{field}: {e}", param=field) from None

    def _submit(self, prep: Prepared) -> Job:
        job = Job(prep.prompt_ids, prep.params, asyncio.get_running_loop(), asyncio.Queue())
        prep.entry.worker.submit(job)  # Overloaded (429) when the queue is full
        return job

    def queue_first(self, prep: Prepared) -> Prepared:
        """Queue the request now, so that a refusal (429) is the response's status and
        not an event inside a stream that already answered 200."""
        prep.job = self._submit(prep)
        return prep

    async def pieces(self, prep: Prepared, tally: Tally) -> AsyncIterator[Piece]:
        """The choices' pieces as the scheduler makes them (one prefill, the choices
        decoded side by side); cancels generation if abandoned."""
        tally.prompt_tokens = len(prep.prompt_ids)
        m, name = self.metrics, prep.entry.id
        job = prep.job or self._submit(prep)
        breaks = (prep.family.open,) if prep.tools else ()  # a call ends an unclosed reasoning block
        splitters = [ReasoningSplitter(**prep.splitter_args, breaks=breaks) for _ in prep.params]
        pending: list[list] = [[] for _ in prep.params]  # logprobs of tokens whose text is held back
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
                i, splitter = step.index, splitters[step.index]
                tally.cached_tokens = step.cached_tokens
                if step.token_id is not None:
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
                    yield Piece(i, content, reasoning, finish, pending[i], calls, deltas)
                    pending[i] = []
        finally:
            job.cancel.set()

    async def chat_stream(self, req: ChatCompletionRequest) -> tuple[AsyncIterator[str], threading.Event]:
        """The SSE lines, and the job's cancel flag (for the response to set on hang-up)."""
        prep = self.queue_first(await self.prepare_chat(req))
        return self._chat_sse(req, prep), prep.job.cancel

    async def _chat_sse(self, req, prep) -> AsyncIterator[str]:
        cid, created, tally = new_id("chatcmpl"), now(), Tally()
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def chunk(choices, usage=None) -> str:
            c = ChatCompletionChunk(id=cid, created=created, model=req.model, choices=choices, usage=usage,
                                    system_fingerprint=SYSTEM_FINGERPRINT)
            data = c.model_dump(exclude_none=True)
            for ch in data["choices"]:  # OpenAI's chunks say these are null until they are not
                ch.setdefault("logprobs", None)
                ch.setdefault("finish_reason", None)
            return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"

        tok = prep.entry.lm.tokenizer
        for i in range(len(prep.params)):
            yield chunk([ChunkChoice(index=i, delta=Delta(role="assistant", content=""))])
        async for p in self.pieces(prep, tally):
            delta = Delta(content=p.content or None, reasoning_content=p.reasoning or None)
            lp = chat_logprobs(tok, p.logprobs) if req.logprobs and p.logprobs else None
            if p.content or p.reasoning:
                yield chunk([ChunkChoice(index=p.index, delta=delta, logprobs=lp)])
                lp = None
            if p.tool_deltas:  # names first, then argument fragments as they are generated
                yield chunk([ChunkChoice(index=p.index, delta=Delta(tool_calls=p.tool_deltas))])
            if p.finish_reason:
                yield chunk([ChunkChoice(index=p.index, delta=Delta(), logprobs=lp, finish_reason=p.finish_reason)])
        if include_usage:
            yield chunk([], usage=tally.usage())
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
        tok = prep.entry.lm.tokenizer
        choices = [Choice(index=i, message=ResponseMessage(content=_content(t),
                                                           reasoning_content="".join(t["reasoning"]) or None,
                                                           tool_calls=[c.openai() for c in t["calls"]] or None),
                          logprobs=chat_logprobs(tok, t["logprobs"]) if req.logprobs else None,
                          finish_reason=t["finish"]) for i, t in enumerate(texts)]
        return ChatCompletion(id=new_id("chatcmpl"), created=now(), model=req.model, choices=choices,
                              usage=tally.usage(), system_fingerprint=SYSTEM_FINGERPRINT)

    # ------------------------------------------------------- completions

    async def prepare_completion(self, req: CompletionRequest) -> Prepared:
        _refuse_unsupported(req)
        if isinstance(req.prompt, list):
            if len(req.prompt) != 1:
                raise BadRequest("only one prompt string per request is supported", param="prompt")
            prompt = req.prompt[0]
        else:
            prompt = req.prompt
        entry = await self._entry(req.model)
        await self._measure(entry, prompt, "prompt")
        ids = await asyncio.to_thread(encode, entry.lm.tokenizer, prompt)
        self._check_length(entry, len(ids), req.max_tokens, "prompt")
        params = _per_choice(req, req.max_tokens, entry.lm, req.logprobs)
        return Prepared(entry, ids, params, {"in_reasoning": False, "enabled": False})

    async def completion_stream(self, req: CompletionRequest) -> tuple[AsyncIterator[str], threading.Event]:
        prep = self.queue_first(await self.prepare_completion(req))
        return self._completion_sse(req, prep), prep.job.cancel

    async def _completion_sse(self, req, prep) -> AsyncIterator[str]:
        cid, created, tally = new_id("cmpl"), now(), Tally()
        tok, offsets = prep.entry.lm.tokenizer, [0] * len(prep.params)
        async for p in self.pieces(prep, tally):
            lp = None
            if req.logprobs is not None:
                lp = completion_logprobs(tok, p.logprobs, offsets[p.index])
                offsets[p.index] += sum(len(t) for t in lp.tokens)
            c = Completion(id=cid, created=created, model=req.model,
                           choices=[CompletionChoice(text=p.content, index=p.index, logprobs=lp,
                                                     finish_reason=p.finish_reason)])
            yield f"data: {c.model_dump_json(exclude_none=True)}\n\n"
        if req.stream_options and req.stream_options.include_usage:
            c = Completion(id=cid, created=created, model=req.model, choices=[], usage=tally.usage())
            yield f"data: {c.model_dump_json(exclude_none=True)}\n\n"
        yield "data: [DONE]\n\n"

    async def completion(self, req: CompletionRequest) -> Completion:
        prep = await self.prepare_completion(req)
        tally = Tally()
        texts = [{"text": [], "finish": None, "logprobs": []} for _ in prep.params]
        async for p in self.pieces(prep, tally):
            texts[p.index]["text"].append(p.content)
            texts[p.index]["finish"] = p.finish_reason or texts[p.index]["finish"]
            texts[p.index]["logprobs"] += p.logprobs
        tok = prep.entry.lm.tokenizer
        return Completion(id=new_id("cmpl"), created=now(), model=req.model,
                          choices=[CompletionChoice(text="".join(t["text"]), index=i, finish_reason=t["finish"],
                                                    logprobs=completion_logprobs(tok, t["logprobs"])
                                                    if req.logprobs is not None else None)
                                   for i, t in enumerate(texts)], usage=tally.usage())


def _render(lm, messages: list[dict], kwargs: dict) -> str:
    try:
        return render(lm.tokenizer, lm.chat_template, messages, **kwargs)
    except Exception as e:  # a template raising on these messages (e.g. role order)
        raise BadRequest(f"the chat template rejected these messages: {e}", param="messages") from None


def _content(t: dict) -> str | None:
    """A reply's content; with tool calls, what is left around them (None if only whitespace)."""
    text = "".join(t["content"])
    if t["calls"]:
        return text.strip() or None
    return text


def tokenize(lm, text: str, add_special: bool, with_pieces: bool) -> dict:
    ids = encode(lm.tokenizer, text, add_special=add_special)
    if not with_pieces:
        return {"tokens": ids}
    return {"tokens": [{"id": t, "piece": _token_text(lm.tokenizer, t)} for t in ids]}


def detokenize(lm, ids: list[int]) -> dict:
    n = lm.model.vocab_size
    bad = next((i for i, t in enumerate(ids) if not 0 <= t < n), None)
    if bad is not None:
        raise BadRequest(f"token id {ids[bad]} is outside the vocabulary (0..{n - 1})", param=f"tokens.{bad}")
    return {"content": lm.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)}


def _token_text(tok, token_id: int) -> str:
    return tok.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)


def chat_logprobs(tok, entries: list) -> ChoiceLogprobs:
    """OpenAI's chat logprobs from (token id, logprob, top [(id, logprob)]) entries."""
    def top(token_id: int, logprob: float) -> TopLogprob:
        text = _token_text(tok, token_id)
        return TopLogprob(token=text, logprob=logprob, bytes=list(text.encode()))

    return ChoiceLogprobs(content=[TokenLogprob(**top(t, lp).model_dump(), top_logprobs=[top(a, b) for a, b in alts])
                                   for t, lp, alts in entries])


def completion_logprobs(tok, entries: list, offset: int = 0) -> CompletionLogprobs:
    """The completions endpoint's parallel lists; text offsets count from the completion's start."""
    out = CompletionLogprobs()
    for t, lp, alts in entries:
        text = _token_text(tok, t)
        out.tokens.append(text)
        out.token_logprobs.append(lp)
        out.top_logprobs.append({_token_text(tok, a): b for a, b in alts})
        out.text_offset.append(offset)
        offset += len(text)
    return out


def sse_error(body: dict) -> str:
    return f"data: {json.dumps(body)}\n\n"
