"""Constrained decoding: a grammar as a token mask at every step, through llguidance
(the grammar engine llama.cpp and vLLM use; picked over xgrammar on this CPU with
Gemma's 262k-token vocabulary: both compute a step's mask in under 0.1 ms median, but
xgrammar needs triton and tvm-ffi, llguidance nothing).

`GrammarMask` is a per-sequence logits processor (`SamplingParams.logits_processor`):
it feeds the matcher each token the sequence generated and masks every token the
grammar does not allow next. When the grammar is complete only the end-of-generation
tokens are allowed, so the sequence stops there. For thinking models the mask can wait
for the reasoning block to close (`after`), or let one open first (`optional`); while
it waits, only the end-of-generation tokens are masked (the answer must still come).

The matcher needs the vocabulary as llguidance sees it (`grammar_tokenizer`): built
once per model, ~3 s for a 262k vocabulary (holding the GIL most of it), so the server
starts it in the background after a model loads."""

from __future__ import annotations

import json
import threading

import torch

from .text import end_of_generation_ids
from .errors import GrammarError

# between JSON tokens: a few spaces or newlines (pretty-printed replies), never unbounded
# (a model that likes whitespace could otherwise fill max_tokens with it): one space, or a
# newline and an indent of up to 20, as llama.cpp's JSON grammars allow
JSON_WHITESPACE = r"(\x20|\n[\x20\t]{0,20})?"


_lock = threading.Lock()


def grammar_tokenizer(lm):
    """llguidance's view of the model's vocabulary (built on first use, then kept on `lm`)."""
    with _lock:
        tok = getattr(lm, "_grammar_tokenizer", None)
        if tok is None:
            import llguidance

            hf = lm.tokenizer.backend_tokenizer
            eos = sorted(end_of_generation_ids(lm))
            tok = llguidance.LLTokenizer(hf.to_str(), n_vocab=lm.model.vocab_size, eos_token=eos)
            lm._grammar_tokenizer = tok
        return tok


_LITERAL_KEYWORDS = ("enum", "const", "default", "examples")  # values, not schemas
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def closed_objects(schema):
    """`schema` with every object that lists its properties closed to others, unless it says
    otherwise (`additionalProperties` or `patternProperties` given): as llama.cpp's schema
    grammars do. Valid replies stay valid for the schema as written; a model cannot pad
    its reply with keys nobody asked for (a random model fills max_tokens that way)."""
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k in _LITERAL_KEYWORDS:
            out[k] = v
        elif k in _SCHEMA_MAPS and isinstance(v, dict):  # names -> schemas: the names are not keywords
            out[k] = {name: closed_objects(s) for name, s in v.items()}
        else:
            out[k] = closed_objects(v)
    if isinstance(schema.get("properties"), dict) and not {"additionalProperties", "patternProperties"} & set(schema):
        out["additionalProperties"] = False
    return out


def json_grammar(schema: dict | None) -> str:
    """The grammar of JSON values matching `schema` (None: any JSON object), its objects
    closed (`closed_objects`)."""
    from llguidance import LLMatcher

    try:
        return LLMatcher.grammar_from_json_schema(closed_objects(schema) if schema is not None else {"type": "object"},
                                                  defaults={"whitespace_pattern": JSON_WHITESPACE})
    except (ValueError, TypeError) as e:
        raise GrammarError(f"invalid JSON schema: {e}") from None


class GrammarMask:
    """Per-sequence logits processor masking what `grammar` does not allow next.

    `after`: a token id (a reasoning block's close) before which nothing is masked;
    `optional`: a token id (the reasoning block's open) also allowed as the first token,
    after which the mask waits for `after`."""

    def __init__(self, lm, grammar: str, after: int | None = None, optional: int | None = None,
                 waiting: bool = False):
        from llguidance import LLMatcher

        self.ops, self.n_vocab = lm.model.ops, lm.model.vocab_size
        self.matcher = LLMatcher(grammar_tokenizer(lm), grammar, log_level=0)
        if self.matcher.is_error():
            raise GrammarError(self.matcher.get_error())
        self.after, self.optional = after, optional
        self.waiting = waiting and after is not None  # inside a reasoning block until `after`
        self.fed = 0
        self.ends = torch.tensor(sorted(end_of_generation_ids(lm)), dtype=torch.long)

    def _feed(self, generated: list[int]) -> None:
        for i in range(self.fed, len(generated)):
            t = generated[i]
            if self.waiting:
                self.waiting = t != self.after
            elif i == 0 and self.optional is not None and t == self.optional:
                self.waiting = True
            elif not self.matcher.consume_token(t):
                raise GrammarError(f"token {t} does not fit the grammar: {self.matcher.get_error()}")
        self.fed = len(generated)

    def __call__(self, generated: list[int], logits: torch.Tensor) -> torch.Tensor:
        self._feed(generated)
        if self.waiting:
            return logits.index_fill(-1, self.ends.to(logits.device), float("-inf"))
        allowed = self.matcher.compute_bitmask()
        if self.fed == 0 and self.optional is not None:  # the reasoning block may open instead
            allowed = bytearray(allowed)
            allowed[self.optional // 8] |= 1 << (self.optional % 8)
            allowed = bytes(allowed)
        return self.ops.mask_logits(logits, allowed, self.n_vocab)


def schema_of(response_format: dict) -> dict | None:
    """The JSON schema of an OpenAI `response_format` (json_object: None, any object)."""
    kind = response_format.get("type")
    if kind == "json_object":
        return None
    spec = response_format.get("json_schema") or {}
    schema = spec.get("schema")
    if isinstance(schema, str):
        schema = json.loads(schema)
    if not isinstance(schema, dict):
        raise GrammarError("response_format.json_schema.schema must be a JSON schema object")
    return schema


class ThinkingBudget:
    """Per-sequence logits processor that ends a reasoning block after `budget` tokens:
    once the sequence has spent them inside the block (opened by the prompt, `in_reasoning`,
    or by the model's first token, `open`), the next token is forced to `close`, and the
    answer follows. `inner` (a grammar mask, say) runs on every step not forced."""

    def __init__(self, budget: int, close: int, open: int | None = None, in_reasoning: bool = False,
                 inner=None):
        self.budget, self.close, self.open = budget, close, open
        self.in_reasoning, self.inner = in_reasoning, inner
        self.spent, self.fed = 0, 0

    def _feed(self, generated: list[int]) -> None:
        for i in range(self.fed, len(generated)):
            t = generated[i]
            if self.in_reasoning:
                self.in_reasoning = t != self.close
                self.spent += self.in_reasoning
            elif i == 0 and t == self.open:
                self.in_reasoning = True
        self.fed = len(generated)

    def __call__(self, generated: list[int], logits: torch.Tensor) -> torch.Tensor:
        self._feed(generated)
        if self.in_reasoning and self.spent >= self.budget:
            forced = torch.full_like(logits, float("-inf"))
            forced[..., self.close] = 0.0
            return forced
        return logits if self.inner is None else self.inner(generated, logits)
