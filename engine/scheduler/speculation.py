"""Speculative decoding as phases of the scheduler's step: which drafter a sequence
uses, the drafts it feeds after its next token, their verification against the
forward's logits (and the rollback of what was rejected), and after the step the
drafters that run a model: the MTP head's chain and the draft model's pass. It owns
the counts of drafted and accepted tokens, the MTP head's cache positions per slot and
the draft model's slots; the drafters' per-sequence bookkeeping (n-gram lookup, draft
lengths, pauses) is engine.speculative's."""

from __future__ import annotations

import torch

from ..batch import Batch
from ..errors import CacheError
from ..sampling import SamplingParams, apply_logit_bias
from ..speculative import Drafting, SpecSettings, SpeculationError, available_modes
from ..text import Step
from .prefix import PrefixCache, shared_prefix
from .state import Choice, Purpose, Request, Row, Running


class Speculation:
    """A scheduler's drafting; follows its slots (engine.scheduler.prefix.SlotFollower)."""

    def __init__(self, lm, spec: SpecSettings, prefix: PrefixCache):
        self.spec, self.cache, self.prefix = spec, lm.cache, prefix
        self.drafted_tokens = self.accepted_tokens = 0  # over every sequence
        self.mtp = getattr(lm.model, "mtp", None)
        # per slot: how many positions the MTP head's cache holds, and the trunk's output at the last
        self.mtp_state: dict[int, tuple[int, torch.Tensor | None]] = {}
        self.draft = getattr(lm, "draft", None)
        self.draft_slots: dict[int, int] = {}  # the target's slot -> the draft model's
        self.draft_held: dict[int, list[int]] = {}  # the draft model's slot -> the tokens it holds

    # ------------------------------------------------------- before the forward

    def drafting(self, p: SamplingParams, req: Request) -> Drafting | None:
        """A new sequence's drafter: the model's default unless its request turns it off or
        names another the model has (an unavailable one is refused when the request is
        prepared, see `check_speculative`)."""
        mode = self.spec.mode if p.speculative in (None, "auto") else p.speculative
        if req.media and mode in ("mtp", "draft"):  # their drafters read token ids: images have none
            mode = "ngram"
        return Drafting(self.spec, req.prompt_ids, mode) if mode != "off" else None

    def drafts(self, c: Choice, pos: int, room: int) -> list[int]:
        """The drafts a decoding sequence (its slot holding `pos` tokens) feeds after its next
        token: within `room` (the batch's), the context and the tokens it may still take."""
        if c.drafting is None:
            return []
        end = pos + len(c.refeed) + 1
        drafts = c.drafting.propose(min(room, self.cache.n_ctx - end, c.budget - len(c.generated) - 1))
        if drafts and not self.cache.can_cut_back(c.slot, end - pos + len(drafts)):
            # recurrent states (or a ring that this step would overwrite) cannot be cut back: keep them
            c.snapshot = self.cache.snapshot(c.slot, reuse=c.snapshot)
        return drafts

    def keeps_hidden(self, rows: list[Row]) -> bool:
        """Whether the forward keeps the trunk's outputs: the MTP head drafts from them."""
        return self.mtp is not None and any(_mode(c) == "mtp" for row in rows for c in row.run.choices)

    # -------------------------------------------------------- after the forward

    def verify(self, row: Row, logits: torch.Tensor) -> list[Step]:
        """A decode row's logits: sample the next token, and with drafts, go on through them
        while each is what the sequence takes (the draw it makes without drafts: each
        token keeps its distribution); cut the slot back to what the steps taken stand for."""
        c, drafts = row.choice, row.drafts
        steps, accepted = [], 0
        for j in range(len(drafts) + 1):
            draft = drafts[j] if j < len(drafts) else None
            steps.append(c.take(logits[j]))
            if c.finished or draft is None or steps[-1].token_id != draft:
                break
            accepted += 1
        c.refeed = []
        c.valid = len(row.tokens) - (len(drafts) - accepted)  # tokens of the row the sequence stands for
        if drafts:
            c.drafting.verified(len(drafts), accepted)
            self.drafted_tokens += len(drafts)
            self.accepted_tokens += accepted
            if accepted < len(drafts) and not c.finished:
                self._roll_back(row)
        return [c.count_drafts(step) for step in steps]

    def _roll_back(self, row: Row) -> None:
        """The slot's state must stand for the tokens taken only."""
        c = row.choice
        valid = row.pos + c.valid
        if self.cache.can_restart_at(c.slot, valid):
            self.cache.rewind(c.slot, valid)
        else:  # recurrent states: back to before the step; what held is fed again with the next token
            if c.snapshot is None or c.snapshot.pos != row.pos:
                raise CacheError(f"KV cache: slot {c.slot} cannot go back to {valid} after a rejected draft, "
                                 f"and no snapshot from before the step (at {row.pos}) was kept")
            self.cache.restore(c.slot, c.snapshot)
            c.refeed = row.tokens[:c.valid]
            valid = row.pos
        self.prefix.cut(c.slot, valid)

    def after_step(self, batch: Batch, rows: list[Row], running: list[Running]) -> None:
        """The drafters that run a model draft the next step's tokens."""
        if batch.keep_hidden:
            self._mtp_pass(batch, rows)
        if self.draft is not None:
            self._draft_pass(running)

    def _mtp_pass(self, batch: Batch, rows: list[Row]) -> None:
        """The MTP head's cache catches up with what the trunk took (each token paired with
        the trunk's output at the position before), then drafts a chain for every sequence
        that goes on: the first from its next token and the trunk's last output, each
        further one from the last draft and the head's own output."""
        feeds, hidden, wants, starts = self._mtp_catch_up(batch, rows)
        if not feeds:
            return
        logits, out = self.mtp(Batch.of(feeds, wants, device=batch.tokens.device), self.cache, torch.stack(hidden))
        if not starts:  # a prompt chunk: the head's cache caught up, nothing to draft yet
            return
        ends = [i for i, w in enumerate(wants) if w == "last"]
        offsets = torch.tensor([0] + [len(t) for _, t, _ in feeds]).cumsum(0)
        chains = {id(x): [pick(logits[j], x)] for j, (x, _, _) in enumerate(starts)}
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
                chains[id(x)].append(pick(logits[j], x))
                state[id(x)] = out[j]
        for x, _, _ in starts:
            x.drafting.pending = chains[id(x)]

    def _mtp_catch_up(self, batch: Batch, rows: list[Row]) -> tuple[list, list, list, list]:
        """The MTP head's batch: per slot, the tokens its cache lacks with the trunk's outputs
        before them (and, for a sequence that drafts next, its next token); `starts`:
        (choice, slot, position of its next token) for each of those."""
        feeds, hidden, wants, starts = [], [], [], []
        zero = batch.hidden.new_zeros(batch.hidden.shape[1])
        for row, seq in zip(rows, batch.seqs):
            if not any(_mode(x) == "mtp" for x in row.run.choices):
                continue
            pos, ids = row.pos, row.tokens
            n_valid = row.choice.valid if row.purpose is Purpose.DECODE else len(ids)
            if n_valid <= 0:
                continue
            h = batch.hidden[seq.start:seq.start + n_valid]
            known, last = self.mtp_state.get(row.slot, (0, None))
            targets = row.run.choices if row.purpose is Purpose.PROMPT_END else [row.choice]  # the prompt's: all
            before_pos = last if known == pos and last is not None else zero  # the trunk's output at pos - 1
            for x in targets:
                if x.slot is None:  # finished and retired already
                    continue
                first = max(known, pos)  # positions the head's cache holds already are not fed again
                prev = [h[p - 1 - pos] if p > pos else before_pos for p in range(first, pos + n_valid)]
                toks = ids[first - pos:n_valid]
                goes_on = row.purpose is not Purpose.PREFILL and not x.finished and _mode(x) == "mtp" \
                    and x.drafting.wanted() > 0 and pos + n_valid < self.cache.n_ctx - 1
                if goes_on:
                    toks, prev = toks + [x.next_token], prev + [h[n_valid - 1]]
                    starts.append((x, x.slot, pos + n_valid))
                if toks:
                    feeds.append((x.slot, toks, first))
                    hidden += prev
                    wants.append("last" if goes_on else "none")
                self.mtp_state[x.slot] = (pos + n_valid, h[n_valid - 1])
        return feeds, hidden, wants, starts

    def _draft_pass(self, running: list[Running]) -> None:
        """The draft model takes what each drafting sequence now is (from where its own
        slot's tokens part from it: a rejected draft is cut back) and decodes greedily
        ahead of it, every sequence one token per forward."""
        lm, live = self.draft, []
        for r in running:
            for c in r.choices:
                if c.finished or r.prefilling or _mode(c) != "draft" or c.drafting.wanted() == 0:
                    continue
                seq = self.prefix.held[c.slot] + c.refeed + [c.next_token]
                k = min(c.drafting.wanted(), self.cache.n_ctx - len(seq) - 1)
                if k <= 0:
                    continue
                if c.slot not in self.draft_slots:
                    self.draft_slots[c.slot] = lm.cache.allocate()
                ds = self.draft_slots[c.slot]
                n = lm.cache.restart_point(ds, shared_prefix(self.draft_held.get(ds, []), seq))
                live.append((c, ds, seq, n, k))
        if not live:
            return
        chains = {}
        logits = lm.forward(Batch.of([(ds, seq[n:], n) for _, ds, seq, n, _ in live], "last", device=lm.device))
        for j, (c, ds, seq, n, k) in enumerate(live):
            self.draft_held[ds] = list(seq)
            chains[id(c)] = [pick(logits[j], c)]
        for step in range(1, max(k for *_, k in live)):
            more = [(c, ds, seq) for c, ds, seq, _, k in live if k > step]
            if not more:
                break
            logits = lm.forward(Batch.of([(ds, [chains[id(c)][-1]], len(seq) + step - 1) for c, ds, seq in more],
                                         "last", device=lm.device))
            for j, (c, ds, _) in enumerate(more):
                self.draft_held[ds].append(chains[id(c)][-1])
                chains[id(c)].append(pick(logits[j], c))
        for c, *_ in live:
            c.drafting.pending = chains[id(c)]

    # ------------------------------------------------- following the slots

    def copied(self, src: int, dst: int, n: int) -> None:
        """`dst` now holds `src`'s first n tokens: so does the MTP head's cache, as far as it went."""
        known, last = self.mtp_state.get(src, (0, None))
        if known >= n:
            self.mtp_state[dst] = (n, last if known == n else None)
        elif dst != src:
            self.mtp_state[dst] = (known, last)

    def fresh(self, slot: int) -> None:
        self.mtp_state.pop(slot, None)

    def released(self, slot: int) -> None:
        ds = self.draft_slots.pop(slot, None)
        if ds is not None:
            self.draft_held.pop(ds, None)
            self.draft.cache.free(ds)


def _mode(c: Choice) -> str | None:
    """The choice's drafter (None: it does not draft)."""
    return c.drafting.mode if c.drafting is not None else None


def pick(logits: torch.Tensor, c: Choice) -> int:
    """A drafter's token: its argmax after the sequence's logit bias (which the target's sampler applies too)."""
    return int(apply_logit_bias(logits, c.params.logit_bias).argmax())


def default_mode(lm) -> str:
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
