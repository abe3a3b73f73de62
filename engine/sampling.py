"""Sampling: small pure functions over a logits vector (1-D float tensor)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

# (token ids generated so far, logits) -> logits; must not modify its input in place
LogitsProcessor = Callable[[list[int], torch.Tensor], torch.Tensor]


@dataclass
class SamplingParams:
    """What a request asks of the sampler and the stopping rules."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    max_tokens: int | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    ignore_eos: bool = False
    # None: no logprobs; k >= 0: the chosen token's log-probability and the k most likely
    logprobs: int | None = None
    # per sequence, after logit bias and penalties, before sampling (a constrained-decoding mask)
    logits_processor: LogitsProcessor | None = None
    # speculative decoding for this sequence: None, the model's default; "off"; a drafter
    # the model has (engine.speculative.MODES)
    speculative: str | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1


MIN_TEMPERATURE = 1e-30


def apply_logit_bias(logits: torch.Tensor, bias: dict[int, float]) -> torch.Tensor:
    if not bias:
        return logits
    ids = torch.tensor(list(bias.keys()), dtype=torch.long, device=logits.device)
    vals = torch.tensor(list(bias.values()), dtype=logits.dtype, device=logits.device)
    return logits.index_add(0, ids, vals)


def apply_penalties(logits: torch.Tensor, counts: dict[int, int], *, repetition: float = 1.0,
                    presence: float = 0.0, frequency: float = 0.0) -> torch.Tensor:
    """OpenAI's presence/frequency penalties and the CTRL-style repetition penalty,
    over the tokens seen so far (`counts`: token id → occurrences)."""
    if not counts or (repetition == 1.0 and presence == 0.0 and frequency == 0.0):
        return logits
    ids = torch.tensor(list(counts.keys()), dtype=torch.long, device=logits.device)
    n = torch.tensor(list(counts.values()), dtype=logits.dtype, device=logits.device)
    sel = logits[ids]
    if repetition != 1.0:
        sel = torch.where(sel > 0, sel / repetition, sel * repetition)
    sel = sel - presence - frequency * n
    out = logits.clone()
    out[ids] = sel
    return out


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k).values[-1]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    cum = torch.cumsum(probs, dim=-1)
    drop = cum - probs > p  # keep the smallest prefix whose mass reaches p
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(0, order, sorted_logits)


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    if min_p <= 0.0:
        return logits
    probs = torch.softmax(logits, dim=-1)
    return logits.masked_fill(probs < min_p * probs.max(), float("-inf"))


# top-p draws from the best tokens first: this many (then 16 times as many, then all) are
# sorted until their mass reaches p; top-k and min-p take only the candidates they keep
CANDIDATES = 256


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token id from processed logits. Speculative decoding verifies a draft (a token a
    drafter proposed deterministically) against this very draw: it holds where the draw
    is the draft, which happens with probability p(draft), and otherwise the draw comes
    from p without the draft, renormalized: speculative sampling's rule. So a seeded
    sequence draws the same tokens with drafts as without, however many are drafted.

    The filters keep what top_k_filter, top_p_filter and min_p_filter keep, in that order,
    without a softmax and sort over the whole vocabulary: top-k and top-p work on the best
    candidates (torch.topk), min-p is a threshold on the scaled logits (p >= min_p p_max
    is z >= log(min_p) with the best at 0), and the draw is one uniform number against the
    kept tokens' cumulative mass (a 262k vocabulary: 0.7 ms, not multinomial's 5 ms, or
    26 ms with top-p's full sort)."""
    if params.greedy:
        if logits.device.type == "cpu":  # numpy's argmax: ~10x torch's over a 262k vocabulary here
            return int(logits.numpy().argmax())
        return int(torch.argmax(logits))
    z = logits.float()
    # shifted so that the largest is 0 before dividing, and the temperature kept a
    # float32 number: a vanishing one then gives -inf for all but the best tokens, not
    # inf - inf or 0 / 0 (NaN)
    z = (z - z.max()) / max(params.temperature, MIN_TEMPERATURE)
    n = z.shape[0]
    top_k = params.top_k if 0 < params.top_k < n else 0
    floor = math.log(params.min_p) if 0.0 < params.min_p <= 1.0 else -math.inf
    ids = None  # the kept tokens, best first (None: the whole vocabulary, z as it is)
    if top_k:
        z, ids = torch.topk(z, top_k)
    if params.top_p < 1.0:
        # the mass of each candidate in the distribution top-p sees (the top-k's, or all)
        log_total = torch.logsumexp(z, dim=0)
        m = CANDIDATES
        while True:
            vals, order = torch.topk(z, min(m, z.shape[0]))
            probs = torch.exp(vals - log_total)
            cum = torch.cumsum(probs, dim=0)
            if cum[-1] >= params.top_p or vals.shape[0] == z.shape[0]:
                break
            m *= 16
        keep = int((cum - probs <= params.top_p).sum())  # the smallest prefix whose mass reaches p
        z, order = vals[:keep], order[:keep]
        ids = order if ids is None else ids[order]
    if floor > -math.inf:
        if ids is None:  # keep z >= floor over the whole vocabulary: the rest to -inf
            z = z.masked_fill(z < floor, -math.inf)
        else:  # sorted: a prefix
            n_keep = max(1, int((z >= floor).sum()))
            z, ids = z[:n_keep], ids[:n_keep]
    probs = torch.exp(z)
    cum = torch.cumsum(probs, dim=0)
    u = float(torch.rand((), generator=generator)) * float(cum[-1])
    i = min(int(torch.searchsorted(cum, torch.tensor([u]), right=True)[0]), cum.shape[0] - 1)
    while float(probs[i]) == 0.0 and i > 0:  # u on a zero-mass token's edge (rounding): the one before
        i -= 1
    return int(ids[i]) if ids is not None else i


def token_logprobs(logits: torch.Tensor, token: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    """The log-probability of `token` under `logits` (the processed logits the sampler
    saw, before temperature and filtering) and the `k` most likely (id, logprob), best first."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    top: list[tuple[int, float]] = []
    if k > 0:
        vals, ids = torch.topk(lp, min(k, lp.shape[-1]))
        top = [(int(i), float(v)) for i, v in zip(ids, vals)]
    return float(lp[token]), top
