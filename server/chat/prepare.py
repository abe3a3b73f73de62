"""An OpenAI request made ready for the engine: its sampling settings per choice (with
every value checked and the field at fault named), the chat messages as the template
reads them, the tools the reply may call and the grammar a forced call imposes, and
what the server refuses rather than drops (content it cannot use, fields it does not
honour yet). `Prepared` is the result the service queues."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace

from ...engine import (HERMES, THINK_CLOSE, THINK_OPEN, Family, GrammarError, GrammarMask, SamplingParams,
                      SpeculationError, TemplateError, TemplateWorkers, check_speculative, json_grammar, schema_of)
from ..core.errors import BadRequest, ContextLengthExceeded, InternalError, Unavailable
from ..core.protocol import LlamaSamplers
from ..models.worker import Job
from . import harmony
from .protocol import unsupported_fields
from .derived_calls import Derived, with_ids
from .tool_grammar import derived_grammar, required_grammar
from .tool_parse import DerivedFamily
from .reasoning import ReasoningSplitter
from .tools import for_template, render_fallback


def _stops(stop) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


# llama.cpp's samplers a request may set (SamplingParams takes the same names)
LLAMA_SAMPLERS = tuple(LlamaSamplers.model_fields)


# Claude Code's first system line: `x-anthropic-billing-header: cc_version=...; cch=...;`, a
# hash of the request that changes on every one; first in the prompt, it would make every
# turn prefill the whole conversation again
BILLING_HEADER = re.compile(r"^x-anthropic-billing-header:[^\n]*(?:\n|$)", re.MULTILINE)


def without_billing_header(content):
    """A system message's content without Claude Code's billing lines (text or text parts);
    None where nothing else is left."""
    if isinstance(content, str):
        out = BILLING_HEADER.sub("", content)
        return (out.lstrip("\n") if out != content else out) or None
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str):
                text = without_billing_header(p["text"])
                if text is None:
                    continue
                p = {**p, "text": text}
            parts.append(p)
        return parts or None
    return content


def _default(value, fallback):
    return value if value is not None else fallback


def _sampling(req, max_tokens: int | None, vocab_size: int, defaults: dict) -> SamplingParams:
    """A request's sampling settings; those it leaves out from `defaults` (SamplingParams
    fields: the command line's, the model's preset, the file's own; server.models.presets),
    else the neutral ones."""
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
        temperature=_default(req.temperature, defaults.get("temperature", 1.0)),
        top_p=_default(req.top_p, defaults.get("top_p", 1.0)),
        top_k=_default(req.top_k, defaults.get("top_k", 0)),
        min_p=_default(req.min_p, defaults.get("min_p", 0.0)),
        repetition_penalty=_default(req.repetition_penalty, defaults.get("repetition_penalty", 1.0)),
        presence_penalty=_default(req.presence_penalty, defaults.get("presence_penalty", 0.0)),
        frequency_penalty=_default(req.frequency_penalty, defaults.get("frequency_penalty", 0.0)),
        seed=_default(req.seed, defaults.get("seed")),
        stop=_stops(req.stop),
        max_tokens=max_tokens,
        logit_bias=bias,
        ignore_eos=bool(req.ignore_eos),
        speculative=req.speculative,
        **{k: v for k in LLAMA_SAMPLERS if (v := _default(getattr(req, k, None), defaults.get(k))) is not None},
    )


def template_tool_calls(calls: list[dict], i: int) -> list[dict]:
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


def refuse_parts(m, i: int) -> None:
    """Content this server cannot use is refused, never dropped: parts other than text,
    images and audio (files, for one)."""
    if isinstance(m.content, list):
        for j, part in enumerate(m.content):
            if part.type not in ("text", "image_url", "input_audio"):
                raise BadRequest(f"content parts of type {part.type!r} are not supported (text, image_url and "
                                 f"input_audio are)", param=f"messages.{i}.content.{j}", code="unsupported_parameter")


def refuse_unsupported(req) -> None:
    bad = unsupported_fields(req)
    if bad:
        raise BadRequest(f"'{bad[0]}' is not supported by this server yet", param=bad[0], code="unsupported_parameter")


def per_choice(req, max_tokens: int | None, lm, logprobs: int | None, defaults) -> list[SamplingParams]:
    """One SamplingParams per requested choice (n), built and checked once (`defaults`: the
    sampling fields for what the request leaves out); a seed advances by one per choice
    (within the 64 bits a generator takes)."""
    n = req.n or 1
    if n > lm.cache.n_seq:
        raise BadRequest(f"n={n} choices need as many sequence slots; this server runs {lm.cache.n_seq} "
                         f"(--parallel)", param="n")
    base = _sampling(req, max_tokens, lm.model.vocab_size, defaults)
    base.logprobs = logprobs
    try:
        check_speculative(lm, base.speculative)
    except SpeculationError as e:
        raise BadRequest(str(e), param="speculative") from None
    if base.seed is None:
        return [replace(base) for _ in range(n)]
    return [replace(base, seed=base.seed + i if base.seed + i < 2 ** 64 else base.seed + i - 2 ** 64)
            for i in range(n)]


async def render_chat(templates: TemplateWorkers, lm, messages: list[dict], kwargs: dict) -> str:
    """The chat prompt, rendered by a template worker within its limits (engine.templates): the
    template's own refusal is a 400 in its words, a render past --template-timeout a 500
    naming it, no worker free in time a 503."""
    max_chars = max(1 << 20, 64 * lm.n_ctx)  # a prompt this long is far over the context anyway
    try:
        return await templates.render(lm.chat_template, messages, special_tokens=lm.tokenizer.special_tokens_map,
                                      max_chars=max_chars, **kwargs)
    except TemplateError as e:
        if e.kind == "timeout":
            raise InternalError(f"the model's chat template: {e}", code="template_timeout") from None
        if e.kind == "busy":
            raise Unavailable(f"{e}; retry shortly", headers={"Retry-After": "1"}) from None
        if e.kind == "size":  # far over the context: refused before tokenizing it
            raise ContextLengthExceeded(f"This model's maximum context length is {lm.n_ctx} tokens; {e}") from None
        raise BadRequest(f"the chat template rejected these messages: {e}", param="messages") from None


@dataclass(frozen=True)
class Split:
    """How a reply's text is split into reasoning and answer: by harmony's channels
    (`harmony`), else by the reasoning `markers` where `enabled`, `in_reasoning` where the
    prompt leaves a reasoning block open."""

    in_reasoning: bool = False
    enabled: bool = False
    markers: tuple[str, str] = (THINK_OPEN, THINK_CLOSE)
    harmony: bool = False

    def splitter(self, breaks: tuple[str, ...] = ()):
        """A new splitter for one choice; `breaks`: markers that also end a reasoning block."""
        if self.harmony:
            return harmony.HarmonySplitter()
        return ReasoningSplitter(self.in_reasoning, self.enabled, breaks, self.markers)


@dataclass
class Prepared:
    entry: object
    prompt_ids: list[int]
    params: list[SamplingParams]
    split: Split = Split()
    job: Job | None = None  # queued before a stream starts
    tools: list = field(default_factory=list)  # the tools the reply may call (their calls parsed out)
    family: Family = HERMES  # how the model writes them
    media: dict = field(default_factory=dict)  # the prompt's images and clips by content key
    text: str = ""  # a chat prompt as its template rendered it (/apply-template)

    # the model's tokenizer, kept from the request's start: the model may be unloaded as soon
    # as its generation has ended, before the reply is put together
    tokenizer: object = field(init=False)

    def __post_init__(self):
        self.tokenizer = self.entry.lm.tokenizer


def origin_param(param: str | None, origins: list[str] | None, renamed: dict[str, str]) -> str | None:
    """A chat path error's `param` in the terms of the request it was made from (the
    Responses or Messages API): `messages.K...` as the part message K came from, other
    fields by `renamed`."""
    if param is None:
        return None
    parts = param.split(".")
    if origins and parts[0] == "messages" and len(parts) > 1 and parts[1].isdigit() and int(parts[1]) < len(origins):
        return ".".join([origins[int(parts[1])]] + parts[2:])
    return renamed.get(parts[0], param)


def tools_for(req, lm, messages: list[dict], kwargs: dict,
              derived: Derived | None = None) -> tuple[list[dict], str | None, Family]:
    """The tools the reply may call (empty: none), for `tool_choice` required or a named
    function the grammar its reply must follow, and the family its calls are written
    in. Renders them: through the template when it knows tools (a hand-written family's,
    or `derived`: the syntax its own render of probe calls shows), else as a system
    message (the generic fallback)."""
    choice = req.tool_choice
    if not req.tools or choice == "none":
        return [], None, HERMES
    for j, t in enumerate(req.tools):
        f = t.get("function") if t.get("type") == "function" else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise BadRequest("each tool must be {'type': 'function', 'function': {'name': ..., ...}}",
                             param=f"tools.{j}")
    chat = lm.chat_format
    fmt, in_harmony = chat.calls, chat.harmony  # harmony's calls reach the parser in the Hermes form
    if in_harmony:
        kwargs["tools"] = harmony.tools_for_template(req.tools)
    elif derived is not None:
        kwargs["tools"] = req.tools
        with_ids(messages, derived)
    elif chat.renders_tools:
        kwargs["tools"] = req.tools
        for_template(messages, fmt.family, chat.renders_calls)
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
    if derived is not None:
        if choice == "required" or name is not None:
            try:
                grammar = derived_grammar(req.tools, name, derived, req.parallel_tool_calls is not False)
            except ValueError as e:
                raise BadRequest(str(e), param="tool_choice") from None
        return req.tools, grammar, DerivedFamily.of(derived)
    if choice == "required" or name is not None:
        try:
            # a named function is one call (as OpenAI and vLLM make it); `required`, one or more
            parallel = name is None and req.parallel_tool_calls is not False
            if in_harmony:  # one call a reply: <|call|> ends it
                grammar = harmony.forced_grammar(lm.tokenizer.backend_tokenizer.token_to_id, req.tools, name)
            else:
                grammar = required_grammar(req.tools, name, parallel, fmt)
        except ValueError as e:
            raise BadRequest(str(e), param="tool_choice") from None
    return req.tools, grammar, HERMES if in_harmony else fmt.family

def constrain(lm, constraint: dict | str, params: list[SamplingParams], think: dict, field: str) -> None:
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
