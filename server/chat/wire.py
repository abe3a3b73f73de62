"""What the chat path hands the APIs above it besides the protocol models: a streamed
piece of a choice (`Piece`) and the usage it adds up to (`Tally`), token logprobs in
the chat and completions forms, a token's text."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ...engine import token_bytes
from .protocol import ChoiceLogprobs, CompletionLogprobs, TokenLogprob, TopLogprob, Usage


SYSTEM_FINGERPRINT = "gguf-serve"  # OpenAI's backend-configuration tag, in every chunk and reply


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
    stop_sequence: str | None = None  # with finish_reason "stop": the stop string that ended it, if one did
    tokens: list = field(default_factory=list)  # the ids of the tokens since the last piece (not an end token)
    progress: dict | None = None  # llama-server's prompt_progress (total, cache, processed, time_ms), no text


@dataclass
class Tally:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cached_tokens: int = 0
    slot: int = 0  # the KV cache slot the (first) choice ran in
    drafts: dict[int, tuple[int, int]] = field(default_factory=dict)  # per choice: speculative (drafted, accepted)
    started: float = field(default_factory=time.perf_counter)  # when the reply was asked for
    first: float | None = None  # when its first token came

    def timings(self) -> dict:
        """llama-server's `timings` (milliseconds, per token and per second; the prompt's
        until the first token, the prompt's cached tokens apart)."""
        end = time.perf_counter()
        first = self.first or end
        prompt_s, gen_s = first - self.started, end - first
        n_prompt, n_gen = max(0, self.prompt_tokens - self.cached_tokens), self.completion_tokens
        return {"cache_n": self.cached_tokens, "prompt_n": n_prompt, "prompt_ms": prompt_s * 1e3,
                "prompt_per_token_ms": prompt_s * 1e3 / n_prompt if n_prompt else 0.0,
                "prompt_per_second": n_prompt / prompt_s if prompt_s > 0 else 0.0,
                "predicted_n": n_gen, "predicted_ms": gen_s * 1e3,
                "predicted_per_token_ms": gen_s * 1e3 / n_gen if n_gen else 0.0,
                "predicted_per_second": n_gen / gen_s if gen_s > 0 else 0.0}

    def usage(self) -> Usage:
        details = {"reasoning_tokens": self.reasoning_tokens}
        if self.drafts:  # OpenAI's predicted-output counts, for the engine's own drafts
            details["accepted_prediction_tokens"] = sum(a for _, a in self.drafts.values())
            details["rejected_prediction_tokens"] = sum(d - a for d, a in self.drafts.values())
        return Usage(prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
                     total_tokens=self.prompt_tokens + self.completion_tokens,
                     prompt_tokens_details={"cached_tokens": self.cached_tokens},
                     completion_tokens_details=details)


def reply_content(t: dict) -> str | None:
    """A reply's content; with tool calls, what is left around them (None if only whitespace)."""
    text = "".join(t["content"])
    if t["calls"]:
        return text.strip() or None
    return text


def token_text(tok, token_id: int) -> str:
    return tok.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)


def chat_logprobs(tok, entries: list) -> ChoiceLogprobs:
    """OpenAI's chat logprobs from (token id, logprob, top [(id, logprob)]) entries."""
    def top(token_id: int, logprob: float) -> TopLogprob:
        text = token_text(tok, token_id)
        return TopLogprob(token=text, logprob=logprob, bytes=list(token_bytes(tok, token_id)))

    return ChoiceLogprobs(content=[TokenLogprob(**top(t, lp).model_dump(), top_logprobs=[top(a, b) for a, b in alts])
                                   for t, lp, alts in entries])


def completion_logprobs(tok, entries: list, offset: int = 0) -> CompletionLogprobs:
    """The completions endpoint's parallel lists; text offsets count from the completion's start."""
    out = CompletionLogprobs()
    for t, lp, alts in entries:
        text = token_text(tok, t)
        out.tokens.append(text)
        out.token_logprobs.append(lp)
        out.top_logprobs.append({token_text(tok, a): b for a, b in alts})
        out.text_offset.append(offset)
        offset += len(text)
    return out
