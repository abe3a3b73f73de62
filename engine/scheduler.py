"""Continuous batching: one scheduler per loaded model runs every admitted request's
sequences through one batch forward per step.

A step holds the next token of every decoding sequence plus chunks of the prompts
being prefilled (at most `prefill_chunk` prompt tokens while others decode, so a long
prompt never stalls the running streams for its whole prefill; the whole `max_batch`
when nothing decodes). After the forward, each sequence that got logits samples its
next token (bias, penalties, its logits processor, then the sampler) and applies its
stopping rules; finished or cancelled sequences leave between steps and new requests
join. `generate()` is this scheduler with one request.

Sequences live in the KV cache's slots. A request with `n` choices takes `n` slots:
the prompt is prefilled once in the first, copied into the others, and the choices
decode side by side.

Prefix cache: a finished sequence's slot keeps what it holds (its token ids are
remembered) until the slot is needed again, least recently used first. A new prompt
that starts with tokens some slot holds goes on from there instead of prefilling
them: in that slot when the prompt covers at least half of what the slot holds (or no
slot is free), else copied into a free slot (from a finished or a running sequence).
Reuse is exact or not at all (`KVCache.can_restart_at`): full-attention layers at any
prefix; sliding-window layers (Gemma 3) while the window of the reuse point is still
in the ring; recurrent layers (Qwen3.5's Gated DeltaNet) at the end of what the slot
holds, where their state is the state of that prefix (a multi-turn chat whose next
prompt extends the last one), and elsewhere at a state checkpoint. Where the cache
has such layers, a prompt's prefill keeps checkpoints (`KVCache.save`) every
CHECKPOINT_EVERY tokens and CHECKPOINT_BEFORE_END tokens before its end: a chat's
next turn, whose template drops the last reply's thinking, leaves the history there."""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable

import torch

from .batch import Batch
from .cache import CacheError, Checkpoint
from .speculative import Drafting, SpecSettings, SpeculationError, available_modes
from .text import Detokenizer, Step, StopStrings, end_of_generation_ids
from .sampling import SamplingParams, apply_logit_bias, apply_penalties, sample, token_logprobs

PREFILL_CHUNK = 128  # prompt tokens per step while other sequences decode
CHECKPOINT_BEFORE_END = 4  # a checkpoint this many tokens before a prompt's end (the assistant turn's header)...
CHECKPOINT_EVERY = 512  # ...and at chunk ends at least this many tokens past the slot's last one


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
    # the prompt's images by content key (engine.vision.PromptImage; their tokens are media tokens)
    media: dict = field(default_factory=dict)


class _Choice:
    """One sequence's decoding state: sampler, penalties, stopping rules, text."""

    def __init__(self, index: int, params: SamplingParams, lm, prompt_ids: list[int], budget: int, eog: set[int]):
        self.index, self.params, self.budget = index, params, budget
        self.stop_ids = (set() if params.ignore_eos else eog) | set(params.stop_token_ids)
        self.generator = None
        if params.seed is not None:
            self.generator = torch.Generator(device="cpu").manual_seed(params.seed)
        self.detok = Detokenizer(lm.tokenizer, [t for t in prompt_ids[-16:] if t >= 0])  # no image tokens
        self.stops = StopStrings(params.stop)
        self.counts: dict[int, int] = {}
        self.generated: list[int] = []
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
        p = self.params
        logits = apply_logit_bias(logits, p.logit_bias)
        logits = apply_penalties(logits, self.counts, repetition=p.repetition_penalty, presence=p.presence_penalty,
                                 frequency=p.frequency_penalty)
        if p.logits_processor is not None:
            logits = p.logits_processor(self.generated, logits)
        token = sample(logits, p, self.generator)
        if self.drafting is not None:
            self.drafting.push(token)
        logprob = top = None
        if p.logprobs is not None:
            logprob, top = token_logprobs(logits, token, p.logprobs)
        self.generated.append(token)
        n_out = len(self.generated)
        finish, text = None, ""
        if token in self.stop_ids:
            finish, text = "stop", self.stops.flush()
        else:
            self.counts[token] = self.counts.get(token, 0) + 1
            text, hit = self.stops.feed(self.detok.push(token))
            if hit:
                finish = "stop"
            elif n_out >= self.budget:
                finish, text = "length", text + self.stops.flush()
        self.finished = finish is not None
        self.next_token = None if self.finished else token
        return Step(token, text, finish, self.n_prompt, n_out, index=self.index, cached_tokens=self.cached,
                    logprob=logprob, top_logprobs=top, stop_sequence=self.stops.matched if finish else None)

    def count_drafts(self, step: Step) -> Step:
        if self.drafting is not None:
            step.drafted_tokens, step.accepted_tokens = self.drafting.drafted, self.drafting.accepted
        return step

    def cancelled(self) -> Step:
        self.finished = True
        return self.count_drafts(Step(None, self.stops.flush(), "cancelled", self.n_prompt, len(self.generated),
                                      index=self.index, cached_tokens=self.cached))


class _Running:
    """An admitted request: its prompt (fed up to `fed` into the first choice's slot),
    then its choices decoding."""

    def __init__(self, req: Request, choices: list[_Choice], fed: int):
        self.req, self.choices, self.fed = req, choices, fed
        self.prompt = req.prompt_ids
        self.encoding: dict[int, object] = {}  # images being encoded: content key -> the tower's step generator
        self.rope = None  # engine.vision.RopePlan: where its images move the rotary positions (Qwen3.5)

    @property
    def prefilling(self) -> bool:
        return self.fed < len(self.prompt)


class Scheduler:
    def __init__(self, lm, prefill_chunk: int = PREFILL_CHUNK, prefix_cache: bool = True,
                 spec: SpecSettings | None = None):
        """`spec`: speculative decoding's settings; None: the model's default (`lm.config.spec`)."""
        self.lm, self.cache = lm, lm.cache
        self.spec = spec if spec is not None else SpecSettings(mode=_default_mode(lm))
        self.drafted_tokens = self.accepted_tokens = 0  # speculative decoding, over every sequence
        check_speculative(lm, self.spec.mode)
        self.mtp = getattr(lm.model, "mtp", None)
        # per slot: how many positions the MTP head's cache holds, and the trunk's output at the last
        self.mtp_state: dict[int, tuple[int, torch.Tensor | None]] = {}
        self.draft = getattr(lm, "draft", None)
        self.draft_slots: dict[int, int] = {}  # the target's slot -> the draft model's
        self.draft_held: dict[int, list[int]] = {}  # the draft model's slot -> the tokens it holds
        self.prefill_chunk = max(1, min(prefill_chunk, self.cache.max_batch))
        self.prefix_cache = prefix_cache
        self.checkpoints = prefix_cache and self.cache.checkpoint_budget > 0  # state checkpoints while prefilling
        self.eog = end_of_generation_ids(lm)
        self.waiting: deque[Request] = deque()
        self.running: list[_Running] = []
        self.held: dict[int, list[int]] = {}  # slot → the token ids whose state it holds
        self.idle: OrderedDict[int, None] = OrderedDict()  # finished slots kept for reuse, least recent first
        self.prefix_hit_tokens = 0  # prompt tokens not prefilled thanks to the prefix cache

    # ------------------------------------------------------------ state

    @property
    def busy(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def n_running(self) -> int:
        return sum(1 for r in self.running for c in r.choices if not c.finished)

    def slots(self) -> dict[str, int]:
        """KV cache slots: running sequences, finished ones kept for reuse, free."""
        cached = len(self.idle)
        free = self.cache.free_slots
        return {"running": self.cache.n_seq - cached - free, "cached": cached, "free": free}

    def room_for(self, req: Request) -> bool:
        return len(req.params) <= self.cache.free_slots + len(self.idle)

    def has_room(self) -> bool:
        """Whether a slot would be left after admitting every waiting request."""
        return sum(len(r.params) for r in self.waiting) < self.cache.free_slots + len(self.idle)

    # ------------------------------------------------------- requests

    def add(self, req: Request) -> None:
        """Queue a request; it is admitted, first come first served, once its choices
        have slots. A request that cannot start (no prompt, no room in the context)
        finishes at once with "length"."""
        if not req.params:
            raise ValueError("a request needs at least one SamplingParams")
        if len(req.params) > self.cache.n_seq:
            raise CacheError(f"{len(req.params)} choices need as many sequence slots; the cache has {self.cache.n_seq}")
        if self._budget(req) <= 0 or not req.prompt_ids:
            for i in range(len(req.params)):
                req.emit(Step(None, "", "length", len(req.prompt_ids), 0, index=i))
            self._finish(req)
            return
        self.waiting.append(req)

    def _mode(self, p: SamplingParams) -> str:
        """How a sequence with these parameters drafts: the model's default unless its request
        turns it off or names another drafter the model has (an unavailable one is refused
        when the request is prepared, see `check_speculative`)."""
        return self.spec.mode if p.speculative in (None, "auto") else p.speculative

    def _budget(self, req: Request) -> int:
        return self.cache.n_ctx - len(req.prompt_ids)  # the context limit: the cache's, decided at load

    def _budget_for(self, req: Request, p: SamplingParams) -> int:
        b = self._budget(req)
        return b if p.max_tokens is None else min(b, p.max_tokens)

    def _finish(self, req: Request) -> None:
        req.done = True
        req.emit(None)

    def _admit(self) -> None:
        while self.waiting and self.room_for(self.waiting[0]):
            req = self.waiting.popleft()
            if req.cancel.is_set():
                for i in range(len(req.params)):
                    req.emit(Step(None, "", "cancelled", len(req.prompt_ids), 0, index=i))
                self._finish(req)
                continue
            choices = [_Choice(i, p, self.lm, req.prompt_ids, self._budget_for(req, p), self.eog)
                       for i, p in enumerate(req.params)]
            for c in choices:
                mode = self._mode(c.params)
                if req.media and mode in ("mtp", "draft"):  # their drafters read token ids: images have none
                    mode = "ngram"
                if mode != "off":
                    c.drafting = Drafting(self.spec, req.prompt_ids, mode)
            slot, reused = self._prefill_slot(req.prompt_ids)
            choices[0].slot = slot
            for c in choices[1:]:
                c.slot = self._take_slot()
            self.prefix_hit_tokens += reused
            for c in choices:
                c.cached = reused
            run = _Running(req, choices, reused)
            if req.media and self.lm.vision.family.MROPE:
                from .vision import RopePlan

                run.rope = RopePlan(req.prompt_ids, req.media)
            self.running.append(run)

    # ---------------------------------------------------------- slots

    def _usable(self, slot: int, prompt: list[int]) -> int:
        """How much of `prompt` the slot's state can stand for, exactly (one prompt
        token is always left to feed: its logits start the completion)."""
        held = self.held.get(slot)
        if not held:
            return 0
        n = _shared(held, prompt)
        if n and prompt[n] < 0:  # never into an image: from its first token
            from .vision import media_of

            n -= media_of(prompt[n])[1]
        return self.cache.restart_point(slot, n) if n else 0

    def _prefill_slot(self, prompt: list[int]) -> tuple[int, int]:
        """A slot for a new prompt and how many of its tokens it already holds."""
        best, best_n = None, 0
        if self.prefix_cache:
            for slot in list(self.idle) + [c.slot for r in self.running for c in r.choices if not r.prefilling]:
                n = self._usable(slot, prompt)
                if n > best_n:
                    best, best_n = slot, n
        if best is not None and best in self.idle and (2 * best_n >= len(self.held[best])
                                                        or not self.cache.free_slots):
            del self.idle[best]
            self.cache.rewind(best, best_n)  # now: a checkpoint it needs is not evicted before its first step
            self.held[best] = self.held[best][:best_n]
            self._mtp_cut(best, best, best_n)
            return best, best_n
        slot = self._take_slot(keep=best)
        if best is not None:
            self.cache.copy_prefix(best, slot, best_n)
            self.held[slot] = self.held[best][:best_n]
            self._mtp_cut(best, slot, best_n)
            return slot, best_n
        return slot, 0

    def _mtp_cut(self, src: int, dst: int, n: int) -> None:
        """`dst` now holds `src`'s first n tokens: so does the MTP head's cache, as far as it went."""
        known, last = self.mtp_state.get(src, (0, None))
        if known >= n:
            self.mtp_state[dst] = (n, last if known == n else None)
        elif dst != src:
            self.mtp_state[dst] = (known, last)

    def _take_slot(self, keep: int | None = None) -> int:
        """A free slot, else the least recently used finished one (never `keep`)."""
        if not self.cache.free_slots:
            victim = next(s for s in self.idle if s != keep)
            del self.idle[victim]
            self._release(victim)
        slot = self.cache.allocate()
        self.held[slot] = []
        self.mtp_state.pop(slot, None)
        return slot

    def _draft_pass(self) -> None:
        """After a step: the draft model takes what each drafting sequence now is (from where
        its own slot's tokens part from it: a rejected draft is cut back) and decodes
        greedily ahead of it, every sequence one token per forward."""
        lm, live = self.draft, []
        for r in self.running:
            for c in r.choices:
                if (c.finished or r.prefilling or c.drafting is None or c.drafting.mode != "draft"
                        or c.drafting.wanted() == 0):
                    continue
                seq = self.held[c.slot] + c.refeed + [c.next_token]
                k = min(c.drafting.wanted(), self.cache.n_ctx - len(seq) - 1)
                if k <= 0:
                    continue
                if c.slot not in self.draft_slots:
                    self.draft_slots[c.slot] = lm.cache.allocate()
                ds = self.draft_slots[c.slot]
                n = lm.cache.restart_point(ds, _shared(self.draft_held.get(ds, []), seq))
                live.append((c, ds, seq, n, k))
        if not live:
            return
        chains = {}
        logits = lm.forward(Batch.of([(ds, seq[n:], n) for _, ds, seq, n, _ in live], "last", device=lm.device))
        for j, (c, ds, seq, n, k) in enumerate(live):
            self.draft_held[ds] = list(seq)
            chains[id(c)] = [_pick(logits[j], c)]
        for step in range(1, max(k for *_, k in live)):
            more = [(c, ds, seq) for c, ds, seq, _, k in live if k > step]
            if not more:
                break
            logits = lm.forward(Batch.of([(ds, [chains[id(c)][-1]], len(seq) + step - 1) for c, ds, seq in more],
                                         "last", device=lm.device))
            for j, (c, ds, _) in enumerate(more):
                self.draft_held[ds].append(chains[id(c)][-1])
                chains[id(c)].append(_pick(logits[j], c))
        for c, *_ in live:
            c.drafting.pending = chains[id(c)]

    def _release(self, slot: int) -> None:
        ds = self.draft_slots.pop(slot, None)
        if ds is not None:
            self.draft_held.pop(ds, None)
            self.draft.cache.free(ds)
        self.held.pop(slot, None)
        self.cache.free(slot)

    def _retire(self, c: _Choice) -> None:
        """A finished sequence's slot: kept for reuse, or freed."""
        if c.slot is None:
            return
        if self.prefix_cache and self.held.get(c.slot):
            self.idle[c.slot] = None
        else:
            self._release(c.slot)
        c.slot = None

    def close(self) -> None:
        """Cancel what runs, drop what waits, and give every slot back to the cache."""
        for r in self.running:
            self._cancel(r)
        for req in self.waiting:
            self._finish(req)
        self.running, self.waiting = [], deque()
        for slot in list(self.idle):
            self._release(slot)
        self.idle.clear()

    def _cancel(self, r: _Running) -> None:
        for c in r.choices:
            if not c.finished:
                r.req.emit(c.cancelled())
            self._retire(c)
        self._finish(r.req)

    # ----------------------------------------------------------- steps

    def step(self) -> int:
        """One batch forward over every running sequence; returns its tokens (0: nothing to do)."""
        for r in [r for r in self.running if r.req.cancel.is_set()]:
            self.running.remove(r)
            self._cancel(r)
        self._admit()
        items, wants, owners = [], [], []  # owners: (request, choice, "decode" | "chunk" | "last", drafts)
        decoding = [(r, c) for r in self.running if not r.prefilling for c in r.choices if not c.finished]
        room = self.cache.max_batch - sum(len(c.refeed) + 1 for _, c in decoding)
        for r, c in decoding:
            drafts = []
            if c.drafting is not None:  # within the batch, the context and the tokens the sequence may still take
                end = len(self.held[c.slot]) + len(c.refeed) + 1
                drafts = c.drafting.propose(min(room, self.cache.n_ctx - end, c.budget - len(c.generated) - 1))
            room -= len(drafts)
            if drafts and self.cache.has_linear:  # recurrent states cannot be cut back: keep them
                c.snapshot = self.cache.snapshot(c.slot, reuse=c.snapshot)
            items.append((c.slot, c.refeed + [c.next_token] + drafts, len(self.held[c.slot])))
            wants.append(1 + len(drafts))
            owners.append((r, c, "decode", drafts))
        budget = self.cache.max_batch - sum(len(ids) for _, ids, _ in items)
        chunk = self.prefill_chunk if items else budget
        for r in self.running:
            if r.prefilling and budget > 0:
                n = min(len(r.prompt) - r.fed, chunk, budget)
                mark = len(r.prompt) - CHECKPOINT_BEFORE_END
                if self.checkpoints and r.fed < mark < r.fed + n:
                    n = mark - r.fed  # the last few tokens in a step of their own, after a checkpoint
                if r.req.media:
                    try:
                        n = self._media_chunk(r, n, budget, piecewise=bool(items))
                    except Exception as e:  # an image the tower fails on ends its request only
                        self._fail([r], e)
                        continue
                    if n == 0:
                        continue
                items.append((r.choices[0].slot, r.prompt[r.fed:r.fed + n], r.fed))
                last = r.fed + n == len(r.prompt)
                wants.append("last" if last else "none")
                owners.append((r, r.choices[0], "last" if last else "chunk", None))
                budget -= n
        if not items:
            return 0
        media = {k: img.embeddings for r, _, kind, _ in owners if kind != "decode" and r.req.media
                 for k, img in r.req.media.items() if img.embeddings is not None}
        ropes = None
        if any(r.rope is not None for r, _, _, _ in owners):
            ropes = [r.rope.positions(pos, len(ids)) if r.rope is not None else None
                     for (r, _, _, _), (_, ids, pos) in zip(owners, items)]
        try:
            batch = Batch.of(items, wants, device=self.lm.device, media=media, rope_positions=ropes,
                             whole_media=self.lm.vision is None or self.lm.vision.family.BIDIRECTIONAL)
        except ValueError as e:  # an image the chunking let through whole or not at all
            self._fail({id(r): r for r, _, _, _ in owners}.values(), e)
            raise
        batch.keep_hidden = self.mtp is not None and any(c.drafting is not None and c.drafting.mode == "mtp"
                                                         for r, _, _, _ in owners for c in r.choices)
        try:
            logits = self.lm.forward(batch)
        except Exception as e:  # a failed forward ends the requests in it; the scheduler goes on
            self._fail({id(r): r for r, _, _, _ in owners}.values(), e)
            raise
        if logits.device.type != "cpu":
            logits = logits.cpu()
        for slot, ids, pos in items:
            held = self.held[slot]
            del held[pos:]
            held.extend(ids)
        row = 0
        for (r, c, kind, drafts), (_, ids, pos) in zip(owners, items):
            if kind != "decode":
                r.fed += len(ids)
            if kind == "chunk":
                self._checkpoint(r, c.slot)
                continue
            n_rows = 1 + len(drafts) if kind == "decode" else 1
            try:
                if kind == "last":
                    self._fork(r, logits[row])
                else:
                    self._verify(r, c, logits[row:row + n_rows], drafts, ids, pos)
            except Exception as e:  # a sampler or logits processor failing ends its request only
                if not r.req.done:
                    self._fail([r], e)
            row += n_rows
        if batch.keep_hidden:
            self._mtp_pass(batch, items, owners)
        if self.draft is not None:
            self._draft_pass()
        self.running = [r for r in self.running if not r.req.done]
        return batch.n_tokens

    def _media_chunk(self, r: _Running, n: int, room: int, piecewise: bool) -> int:
        """How many of the next n prompt tokens this step takes, with images whole: a chunk
        ends before an image that would not fit it, takes an image that starts it even past
        the chunk size (within `room`, the batch's), and waits while an image in it is being
        encoded (one encoder step per scheduler step while other sequences run, `piecewise`;
        else at once). Returns 0 to take nothing this step."""
        from .vision import media_of

        prompt, lo = r.prompt, r.fed
        end = lo + n
        whole = self.lm.vision.family.BIDIRECTIONAL  # else an image may end in a later chunk
        if whole and end < len(prompt) and prompt[end] < 0 and media_of(prompt[end])[1] != 0:  # inside an image
            start = end - media_of(prompt[end])[1]
            if start > lo:
                end = start  # up to the image
            else:  # the image starts the chunk: all of it, or wait for room
                image = r.req.media[media_of(prompt[start])[0]]
                end = start + image.n_tokens
                if end - lo > room:
                    return 0
        for t in prompt[lo:end]:
            if t < 0 and media_of(t)[1] == 0:
                image = r.req.media[media_of(t)[0]]
                if image.embeddings is not None:
                    continue
                steps = r.encoding.get(image.key)
                if steps is None:
                    steps = r.encoding[image.key] = self.lm.vision.encode_steps(image)
                for out in steps:
                    if out is not None or piecewise:
                        break
                if image.embeddings is None:
                    return 0
                r.encoding.pop(image.key, None)
        return end - lo

    def _checkpoint(self, r: _Running, slot: int) -> None:
        """After a prompt chunk: keep the slot's state where a later prompt may leave this one."""
        if not self.checkpoints:
            return
        last = max(self.cache.checkpoints(slot), default=0)
        if r.fed == len(r.prompt) - CHECKPOINT_BEFORE_END or r.fed - last >= CHECKPOINT_EVERY:
            self.cache.save(slot, r.fed)

    def _verify(self, r: _Running, c: _Choice, rows: torch.Tensor, drafts: list[int], fed: list[int],
                pos: int) -> None:
        """A decode step's logits: sample the next token, and with drafts, go on through them
        while each is what the sequence takes (the draw it makes without drafts: each
        token keeps its distribution); emit what was taken and cut the slot back to what
        it stands for."""
        steps, accepted = [], 0
        for j in range(len(drafts) + 1):
            draft = drafts[j] if j < len(drafts) else None
            steps.append(c.take(rows[j]))
            if c.finished or draft is None or steps[-1].token_id != draft:
                break
            accepted += 1
        c.refeed = []
        c.valid = len(fed) - (len(drafts) - accepted)  # tokens of `fed` the sequence stands for
        if drafts:
            c.drafting.verified(len(drafts), accepted)
            self.drafted_tokens += len(drafts)
            self.accepted_tokens += accepted
            rejected = len(drafts) - accepted
            if rejected and not c.finished:
                valid = pos + c.valid  # the slot's state must stand for these tokens only
                if self.cache.can_restart_at(c.slot, valid):
                    self.cache.rewind(c.slot, valid)
                else:  # recurrent states: back to before the step; what held is fed again with the next token
                    self.cache.restore(c.slot, c.snapshot)
                    c.refeed = fed[:c.valid]
                    valid = pos
                del self.held[c.slot][valid:]
        for step in steps:
            self._emit(r, c, c.count_drafts(step))

    def _mtp_pass(self, batch: Batch, items: list, owners: list) -> None:
        """After a step: the MTP head's cache catches up with what the trunk took (each
        token paired with the trunk's output at the position before), then drafts a chain
        for every sequence that goes on: the first from its next token and the trunk's
        last output, each further one from the last draft and the head's own output."""
        rows, hidden, wants, starts = [], [], [], []  # starts: (choice, slot, position of its next token)
        zero = batch.hidden.new_zeros(batch.hidden.shape[1])
        for (r, c, kind, _), (slot, ids, pos), seq in zip(owners, items, batch.seqs):
            if not any(x.drafting is not None and x.drafting.mode == "mtp" for x in r.choices):
                continue
            n_valid = c.valid if kind == "decode" else len(ids)
            if n_valid <= 0:
                continue
            h = batch.hidden[seq.start:seq.start + n_valid]
            known, last = self.mtp_state.get(slot, (0, None))
            targets = [c] if kind != "last" else r.choices  # the prompt's last chunk: every choice's slot
            before_pos = last if known == pos and last is not None else zero  # the trunk's output at pos - 1
            for x in targets:
                if x.slot is None:  # finished and retired already
                    continue
                first = max(known, pos)  # positions the head's cache holds already are not fed again
                prev = [h[p - 1 - pos] if p > pos else before_pos for p in range(first, pos + n_valid)]
                toks = ids[first - pos:n_valid]
                goes_on = kind != "chunk" and not x.finished and x.drafting is not None and x.drafting.mode == "mtp" \
                    and x.drafting.wanted() > 0 and pos + n_valid < self.cache.n_ctx - 1
                if goes_on:
                    toks, prev = toks + [x.next_token], prev + [h[n_valid - 1]]
                    starts.append((x, x.slot, pos + n_valid))
                if toks:
                    rows.append((x.slot, toks, first))
                    hidden += prev
                    wants.append("last" if goes_on else "none")
                self.mtp_state[x.slot] = (pos + n_valid, h[n_valid - 1])
        if not rows:
            return
        logits, out = self.mtp(Batch.of(rows, wants, device=batch.tokens.device), self.cache, torch.stack(hidden))
        if not starts:  # a prompt chunk: the head's cache caught up, nothing to draft yet
            return
        ends = [i for i, w in enumerate(wants) if w == "last"]
        offsets = torch.tensor([0] + [len(t) for _, t, _ in rows]).cumsum(0)
        chains = {id(x): [_pick(logits[j], x)] for j, (x, _, _) in enumerate(starts)}
        state = {id(x): out[int(offsets[i + 1]) - 1] for i, (x, _, _) in zip(ends, starts)}
        for step in range(1, max(x.drafting.wanted() for x, _, _ in starts)):
            live = [(x, slot, p) for x, slot, p in starts if x.drafting.wanted() > step
                    and p + step < self.cache.n_ctx - 1]
            if not live:
                break
            b = Batch.of([(slot, [chains[id(x)][-1]], p + step) for x, slot, p in live], "last",
                         device=batch.tokens.device)
            logits, out = self.mtp(b, self.cache, torch.stack([state[id(x)] for x, _, _ in live]))
            for j, (x, _, _) in enumerate(live):
                chains[id(x)].append(_pick(logits[j], x))
                state[id(x)] = out[j]
        for x, _, _ in starts:
            x.drafting.pending = chains[id(x)]

    def _fork(self, r: _Running, logits: torch.Tensor) -> None:
        """The prompt is in: copy it into the other choices' slots; each samples its first token."""
        first = r.choices[0]
        for c in r.choices[1:]:
            self.cache.copy_prefix(first.slot, c.slot, len(r.prompt))
            self.held[c.slot] = list(r.prompt)
        for c in r.choices:
            self._emit(r, c, c.take(logits))

    def _emit(self, r: _Running, c: _Choice, step: Step) -> None:
        r.req.emit(step)
        if step.finish_reason is not None:
            self._retire(c)
            if all(x.finished for x in r.choices):
                self._finish(r.req)

    def _fail(self, runs, e: Exception) -> None:
        for r in runs:
            for c in r.choices:
                c.finished = True
                if c.slot is not None:  # its state may be half-written: not kept
                    self._release(c.slot)
                    c.slot = None
            r.req.done = True
            r.req.emit(e)
        self.running = [r for r in self.running if not r.req.done]


def _shared(held: list[int], seq: list[int]) -> int:
    """How many leading tokens `held` shares with `seq`, leaving seq's last one to feed (its
    logits are what comes next)."""
    n, limit = 0, min(len(held), len(seq) - 1)
    while n < limit and held[n] == seq[n]:
        n += 1
    return n


def _pick(logits: torch.Tensor, c: _Choice) -> int:
    """A drafter's token: its argmax after the sequence's logit bias (which the target's sampler applies too)."""
    return int(apply_logit_bias(logits, c.params.logit_bias).argmax())


def _default_mode(lm) -> str:
    """The model's drafter by default: its configured one (`--spec`); "auto": the draft model
    when one was given, else its MTP head where the file has one, else n-gram lookup."""
    mode = getattr(getattr(lm, "config", None), "spec", None) or "auto"
    if mode == "auto":
        have = available_modes(lm)
        return "draft" if "draft" in have else "mtp" if "mtp" in have else "ngram"
    return mode


def check_speculative(lm, mode: str | None) -> None:
    """Refuse a request's drafter the model does not have (SpeculationError names it)."""
    have = available_modes(lm)
    if mode not in (None, "auto") and mode not in have:
        raise SpeculationError(f"speculative decoding {mode!r} is not available for this model; it has: "
                               f"{', '.join(have)} (or auto)")


def run_one(lm, prompt_ids: list[int], params: SamplingParams, cancel: threading.Event | None = None,
            media: dict | None = None):
    """A scheduler with one request, its Steps as they come (generate()'s loop)."""
    out: deque = deque()
    req = Request(list(prompt_ids), [params], out.append, cancel or threading.Event(), media=media or {})
    sched = Scheduler(lm, prefix_cache=False)
    try:
        sched.add(req)
        while True:
            while out:
                item = out.popleft()
                if item is None:
                    return
                if isinstance(item, Exception):
                    raise item
                yield item
            if not sched.step() and not out:
                raise CacheError(f"no free sequence slot: all {sched.cache.n_seq} are held by another scheduler")
    finally:
        sched.close()
