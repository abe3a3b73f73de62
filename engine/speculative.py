"""Speculative decoding's drafters and per-sequence bookkeeping: what a sequence proposes
to verify in its next step (the scheduler verifies every running sequence's drafts in
one batch forward, engine.scheduler.speculation), and how many tokens it proposes.

- n-gram lookup ("prompt lookup"): the sequence's own tokens (prompt and output) are
  indexed by their last `n` tokens; when the sequence's current ending occurred before,
  what followed it then is proposed. Costs no weights and almost no time; pays where the
  output repeats the prompt (editing a passage or code, quoting, extraction) or itself.
- draft: a smaller model of the same vocabulary (--draft-model, loaded beside the target,
  its KV cache slots mirroring the target's) decodes greedily ahead (`Speculation._draft_pass`).
- mtp: the file's multi-token-prediction head (Qwen3.5's nextn block, models.qwen35.MtpHead)
  drafts a chain of tokens from the trunk's last output; the scheduler runs it after each
  step (`Speculation._mtp_pass`) and the drafts wait in `Drafting.pending`.

The draft length adapts per sequence: it grows while whole drafts are accepted, shrinks
to what was accepted, and after repeated misses drafting pauses for a while (doubling),
so a sequence whose drafts keep failing decodes as it would without them."""

from __future__ import annotations

from dataclasses import dataclass

from .options import SPEC_MODES

MODES = SPEC_MODES  # what --spec and a request's `speculative` may name ("auto": the model's default)


class SpeculationError(ValueError):
    """A speculative decoding setting this model cannot honour."""


def available_modes(lm) -> tuple[str, ...]:
    """The drafters `lm` can use: off and n-gram lookup for every model, mtp where its file
    has a multi-token-prediction head, draft where a draft model runs beside it."""
    return ("off", "ngram") + (("mtp",) if getattr(lm.model, "mtp", None) is not None else ()) \
        + (("draft",) if getattr(lm, "draft", None) is not None else ())


@dataclass(frozen=True)
class SpecSettings:
    """A model's drafting: `mode` (MODES), the longest draft, the n-gram sizes looked up."""

    mode: str = "ngram"
    max_draft: int = 8
    first_draft: int = 4
    ngram_min: int = 2
    ngram_max: int = 4
    pause_after_misses: int = 3  # drafts wholly rejected in a row before drafting pauses
    pause_steps: int = 8  # the first pause; doubled at each pause, reset by an accepted draft

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise SpeculationError(f"speculative decoding mode {self.mode!r} is not known; expected one of "
                                   f"{', '.join(MODES)}")
        if not 1 <= self.first_draft <= self.max_draft:
            raise SpeculationError(f"draft lengths: need 1 <= first ({self.first_draft}) <= max ({self.max_draft})")


class NgramIndex:
    """For n in [n_min, n_max]: each n-gram of the tokens → the position after its latest
    occurrence that has a token following it (the current ending is looked up, not indexed)."""

    def __init__(self, n_min: int, n_max: int):
        self.n_min, self.n_max = n_min, n_max
        self.tokens: list[int] = []
        self.index: dict[tuple[int, ...], int] = {}

    def extend(self, tokens) -> None:
        for t in tokens:
            self.tokens.append(int(t))
            end = len(self.tokens) - 1  # the n-grams ending just before the new token now have a follower
            for n in range(self.n_min, self.n_max + 1):
                if end >= n:
                    self.index[tuple(self.tokens[end - n:end])] = end

    def propose(self, k: int) -> list[int]:
        """Up to `k` tokens that followed the longest earlier occurrence of the current ending."""
        toks = self.tokens
        for n in range(self.n_max, self.n_min - 1, -1):
            if len(toks) <= n:
                continue
            at = self.index.get(tuple(toks[-n:]))
            if at is not None:
                out = toks[at:at + k]
                return next((out[:i] for i, t in enumerate(out) if t < 0), out)  # never an image's token
        return []


class Drafting:
    """One sequence's drafting: its lookup index, its current draft length and pause, and
    what it drafted and had accepted."""

    def __init__(self, settings: SpecSettings, prompt_ids: list[int], mode: str = "ngram"):
        self.s, self.mode = settings, mode
        self.ngrams = None
        if mode == "ngram":
            self.ngrams = NgramIndex(settings.ngram_min, settings.ngram_max)
            self.ngrams.extend(prompt_ids)
        self.pending: list[int] = []  # mtp: the drafts its head made after the last step
        self.k = settings.first_draft
        self.misses = 0
        self.pause = 0  # steps left without drafting
        self.next_pause = settings.pause_steps
        self.drafted = 0
        self.accepted = 0

    def push(self, token: int) -> None:
        """A token of the sequence's output (accepted, sampled or a draft that held)."""
        if self.ngrams is not None:
            self.ngrams.extend((token,))

    def propose(self, room: int) -> list[int]:
        """The draft for the next step (at most `room` tokens); [] while paused or without a match."""
        pending, self.pending = self.pending, []
        if self.pause:
            self.pause -= 1
            return []
        if room <= 0:
            return []
        if self.mode in ("mtp", "draft"):
            return pending[:room]
        return self.ngrams.propose(min(self.k, room))

    def wanted(self) -> int:
        """How many tokens a head should draft for the next step (0 while paused)."""
        return 0 if self.pause else self.k

    def verified(self, n_drafted: int, n_accepted: int) -> None:
        """After a step: adapt the length to what was accepted."""
        if not n_drafted:
            return
        self.drafted += n_drafted
        self.accepted += n_accepted
        if n_accepted == n_drafted:
            self.k = min(self.s.max_draft, self.k * 2)
        else:
            self.k = max(1, n_accepted + 1)
        if n_accepted:
            self.misses, self.next_pause = 0, self.s.pause_steps
            return
        self.misses += 1
        if self.misses >= self.s.pause_after_misses:
            self.pause, self.next_pause, self.misses = self.next_pause, self.next_pause * 2, 0
