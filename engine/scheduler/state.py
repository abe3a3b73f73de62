"""What the scheduler keeps per request and per sequence: the caller's `Request`, an
admitted request's `Running` state, one choice's `Choice` (its sampler, penalties and
stopping rules, over `ChoiceText` for its text), and the `Row` each sequence puts into
a step's batch. Nothing here runs a model or owns a cache slot: the scheduler assigns
them (engine.scheduler.loop)."""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..cache import Checkpoint
from ..sampling import (DryPenalty, SamplingParams, apply_logit_bias, apply_penalties, mirostat_sample, sample,
                        token_logprobs)
from ..speculative import Drafting
from ..text import Detokenizer, Step, StopStrings


@dataclass(eq=False)
class Request:
    """What the scheduler runs: a prompt and one SamplingParams per choice. `emit` is
    called on the scheduler's thread with each Step (its `index` is the choice), then
    None once every choice has finished; or with an Exception, which ends the request."""

    prompt_ids: list[int]
    params: list[SamplingParams]
    emit: Callable[[object], None]
    cancel: threading.Event = field(default_factory=threading.Event)
    done: bool = False
    # the prompt's media by content key (engine.media.PromptMedia; their tokens are media tokens)
    media: dict = field(default_factory=dict)
    progress: bool = False  # emit a progress Step as the prompt is admitted and after each chunk
    lora: tuple[tuple[int, float], ...] = ()  # the LoRA adapters (LoadedModel.adapters ids) and scales it runs with


class ChoiceText:
    """A choice's text: its tokens detokenized as they come, cut at the first stop string
    (what might start one is held back until the next token tells)."""

    def __init__(self, tokenizer, prompt_ids: list[int], stop):
        self.detok = Detokenizer(tokenizer, [t for t in prompt_ids[-16:] if t >= 0])  # no image tokens
        self.stops = StopStrings(stop)

    def push(self, token: int) -> tuple[str, bool]:
        """The text `token` adds, and whether a stop string ended it."""
        return self.stops.feed(self.detok.push(token))

    def flush(self) -> str:
        """The text held back (a partial character's bytes, what might have started a stop
        string): the choice ends here. A stop string completed by those bytes still cuts."""
        text, hit = self.stops.feed(self.detok.flush())
        return text if hit else text + self.stops.flush()

    @property
    def matched(self) -> str | None:
        return self.stops.matched


class Choice:
    """One sequence's decoding state: sampler, penalties, stopping rules, text, and where
    it stands in its slot."""

    def __init__(self, index: int, params: SamplingParams, tokenizer, prompt_ids: list[int], budget: int,
                 eog: set[int]):
        self.index, self.params, self.budget = index, params, budget
        self.stop_ids = (set() if params.ignore_eos else eog) | set(params.stop_token_ids)
        self.generator = None
        if params.seed is not None:
            self.generator = torch.Generator(device="cpu").manual_seed(params.seed)
        self.text = ChoiceText(tokenizer, prompt_ids, params.stop)
        self.dry = DryPenalty(params, tokenizer, prompt_ids) if params.dry_multiplier > 0 else None
        self.mu = 2 * params.mirostat_tau  # Mirostat's running target (where it samples)
        self.counts: dict[int, int] = {}
        self.generated: list[int] = []
        self.started: float | None = None  # when its first token came (t_max_predict_ms counts from it)
        self.n_prompt = len(prompt_ids)
        self.slot: int | None = None
        self.cached = 0  # prompt tokens the prefix cache supplied
        self.next_token: int | None = None  # sampled, not yet fed
        self.finished = False
        self.drafting: Drafting | None = None  # speculative decoding's drafter state, when it drafts
        self.refeed: list[int] = []  # output tokens whose state a rollback dropped: fed again before next_token
        self.snapshot: Checkpoint | None = None  # recurrent states before a verification step (reused buffers)
        self.valid = 0  # after a decode step: how many of the tokens it fed the sequence stands for

    def take(self, logits: torch.Tensor) -> Step:
        """Sample from this sequence's logits row and apply the stopping rules (a draft
        holds where this draw is the draft: engine.sampling.sample)."""
        token, logprob, top = self._draw(logits)
        self.generated.append(token)
        finish, text = self._stopping(token)
        self.finished = finish is not None
        self.next_token = None if self.finished else token
        return Step(token, text, finish, self.n_prompt, len(self.generated), index=self.index,
                    cached_tokens=self.cached, logprob=logprob, top_logprobs=top,
                    stop_sequence=self.text.matched if finish else None, slot=self.slot)

    @property
    def draws_anywhere(self) -> bool:
        """Whether this choice's draws run on the logits' own device: greedy, without DRY, a logits
        processor (a grammar), mirostat or logprobs (bias and penalties are device ops, and an
        argmax sends one number back)."""
        p = self.params
        return p.greedy and self.dry is None and p.logits_processor is None and p.logprobs is None

    def _draw(self, logits: torch.Tensor) -> tuple[int, float | None, list | None]:
        """The next token (bias, penalties, the logits processor, then the sampler) and its logprobs if asked."""
        p = self.params
        logits = apply_logit_bias(logits, p.logit_bias)
        logits = apply_penalties(logits, self.counts, repetition=p.repetition_penalty, presence=p.presence_penalty,
                                 frequency=p.frequency_penalty)
        if self.dry is not None:
            logits = self.dry(self.generated, logits)
        if p.logits_processor is not None:
            logits = p.logits_processor(self.generated, logits)
        if p.mirostat and not p.greedy:
            token, self.mu = mirostat_sample(logits, p, self.mu, self.generator)
        else:
            token = sample(logits, p, self.generator)
        if self.drafting is not None:
            self.drafting.push(token)
        if p.logprobs is None:
            return token, None, None
        return (token, *token_logprobs(logits, token, p.logprobs))

    def _stopping(self, token: int) -> tuple[str | None, str]:
        """The finish reason `token` brings (None: the choice goes on) and the text it adds."""
        if token in self.stop_ids:
            return "stop", self.text.flush()
        self.counts[token] = self.counts.get(token, 0) + 1
        text, hit = self.text.push(token)
        if hit:
            return "stop", text
        if len(self.generated) >= self.budget or self._out_of_time(text):
            return "length", text + self.text.flush()
        return None, text

    def _out_of_time(self, text: str) -> bool:
        """llama-server's t_max_predict_ms: past it, a choice ends at a token that brings a newline."""
        limit = self.params.t_max_predict_ms
        if not limit:
            return False
        now = time.monotonic()
        if self.started is None:
            self.started = now
        return "\n" in text and (now - self.started) * 1e3 > limit

    def count_drafts(self, step: Step) -> Step:
        if self.drafting is not None:
            step.drafted_tokens, step.accepted_tokens = self.drafting.drafted, self.drafting.accepted
        return step

    def cancelled(self) -> Step:
        self.finished = True
        return self.count_drafts(Step(None, self.text.flush(), "cancelled", self.n_prompt, len(self.generated),
                                      index=self.index, cached_tokens=self.cached))


class Running:
    """An admitted request: its prompt (fed up to `fed` into the first choice's slot),
    then its choices decoding."""

    def __init__(self, req: Request, choices: list[Choice], fed: int, rope=None):
        self.req, self.choices, self.fed = req, choices, fed
        self.prompt = req.prompt_ids
        self.encoding: dict[int, object] = {}  # images being encoded: content key -> the tower's step generator
        self.rope = rope  # engine.vision.RopePlan: where its images move the rotary positions (Qwen3.5)

    @property
    def prefilling(self) -> bool:
        return self.fed < len(self.prompt)


class Purpose(enum.Enum):
    """What a row of a step's batch is for."""

    DECODE = "decode"  # a sequence's next token, its drafts after it: logits for each
    PREFILL = "prefill"  # a chunk of a prompt: no logits (a checkpoint may follow)
    PROMPT_END = "prompt end"  # a prompt's last chunk: one logits row, every choice's first token


@dataclass(eq=False)
class Row:
    """One sequence's part of a step's batch, passed from phase to phase: what it is for,
    whose it is, its tokens from cache position `pos`, where its logits are, and what
    sampling them gave."""

    purpose: Purpose
    run: Running
    choice: Choice  # whose slot it feeds (a prompt's: the first choice's)
    slot: int
    tokens: list[int]
    pos: int
    drafts: list[int] = field(default_factory=list)  # DECODE: the drafted tokens it ends with
    logits: slice | None = None  # its rows of the forward's logits (set with the batch)
    out: list[tuple[Choice, Step]] = field(default_factory=list)  # what its choices took, to emit
    error: Exception | None = None  # its sampling failed: ends its request

    @property
    def n_logits(self) -> int:
        """How many of its last tokens' logits the forward returns."""
        return 1 + len(self.drafts) if self.purpose is Purpose.DECODE else int(self.purpose is Purpose.PROMPT_END)
