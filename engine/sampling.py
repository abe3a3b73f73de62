"""Sampling: small pure functions over a logits vector (1-D float tensor)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from .options import SAMPLER_OFF, sampler_names

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
    # llama.cpp's other samplers (its names and defaults; each off at its default)
    typical_p: float = 1.0  # locally typical sampling
    top_n_sigma: float = -1.0  # keep logits within n standard deviations of the best
    xtc_probability: float = 0.0  # exclude top choices: this often, all above the threshold but the least
    xtc_threshold: float = 0.1
    dynatemp_range: float = 0.0  # dynamic temperature: temperature +- range by the distribution's entropy
    dynatemp_exponent: float = 1.0
    mirostat: int = 0  # 1, 2: Mirostat's target surprise (tau) learnt at rate eta; the other filters off
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    dry_multiplier: float = 0.0  # DRY: a penalty on tokens that would extend a repeat of the context
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1  # tokens of context it looks at (-1: all)
    dry_sequence_breakers: list[str] = field(default_factory=lambda: ["\n", ":", "\"", "*"])
    # llama.cpp's `samplers`: the ones that apply (names or letters; None: all); those left out are off
    samplers: list[str] | str | None = None
    t_max_predict_ms: int = 0  # once generating this long, a choice ends at its next newline ("length")

    def __post_init__(self):
        if self.samplers is not None:
            self.samplers = sampler_names(self.samplers)
            for name, neutral in SAMPLER_OFF.items():
                if name not in self.samplers:
                    for attr, value in neutral.items():
                        if attr != "temperature" or self.temperature > 0:  # temperature 0 stays greedy
                            setattr(self, attr, value)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1


MIN_TEMPERATURE = 1e-30

# a file's recommended sampling (llama.cpp's general.sampling.* keys, which its servers take
# as defaults) as SamplingParams fields
FILE_KEYS = {"sequence": ("samplers", str), "top_k": ("top_k", int), "top_p": ("top_p", float),
             "min_p": ("min_p", float), "xtc_probability": ("xtc_probability", float),
             "xtc_threshold": ("xtc_threshold", float), "temp": ("temperature", float),
             "penalty_repeat": ("repetition_penalty", float), "mirostat": ("mirostat", int),
             "mirostat_tau": ("mirostat_tau", float), "mirostat_eta": ("mirostat_eta", float)}


def file_sampling(metadata: dict) -> dict:
    """The sampling a file recommends (its general.sampling.* keys), as SamplingParams
    fields; a value that does not read is left out."""
    out = {}
    for key, (name, kind) in FILE_KEYS.items():
        value = metadata.get(f"general.sampling.{key}")
        if value is None:
            continue
        try:
            out[name] = sampler_names(value) if name == "samplers" else kind(value)
        except (TypeError, ValueError):
            continue
    return out


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
    xtc_draw = float(torch.rand((), generator=generator)) if params.xtc_probability > 0 else 1.0
    z = pre_temperature(z, params)
    # shifted so that the largest is 0 before dividing, and the temperature kept a
    # float32 number: a vanishing one then gives -inf for all but the best tokens, not
    # inf - inf or 0 / 0 (NaN)
    z = (z - z.max()) / max(temperature(z, params), MIN_TEMPERATURE)
    if xtc_draw < params.xtc_probability:
        z = xtc_filter(z, params.xtc_threshold)
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


def pre_temperature(z: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """top-n-sigma and locally typical sampling, on the logits before temperature (as
    llama.cpp's chain puts them)."""
    if params.top_n_sigma >= 0:
        finite = z[torch.isfinite(z)]
        if finite.numel() > 1:
            z = z.masked_fill(z < finite.max() - params.top_n_sigma * finite.std(), -math.inf)
    if params.typical_p < 1.0:
        logp = torch.log_softmax(z, dim=0)
        p = torch.exp(logp)
        entropy = -torch.nansum(p * logp)
        score = torch.where(torch.isfinite(logp), (-logp - entropy).abs(), torch.full_like(logp, math.inf))
        order = torch.argsort(score)
        cum = torch.cumsum(p[order], dim=0)
        keep = max(1, int((cum - p[order] < params.typical_p).sum()))  # the smallest set reaching typical_p
        drop = order[keep:]
        z = z.clone()
        z[drop] = -math.inf
    return z


def temperature(z: torch.Tensor, params: SamplingParams) -> float:
    """The temperature of this draw: the request's, or with dynatemp_range its range's
    point for the distribution's normalized entropy (llama.cpp's dynamic temperature)."""
    if params.dynatemp_range <= 0:
        return params.temperature
    lo, hi = max(0.0, params.temperature - params.dynatemp_range), params.temperature + params.dynatemp_range
    logp = torch.log_softmax(z, dim=0)
    n = int(torch.isfinite(logp).sum())
    if n <= 1:
        return lo
    entropy = float(-torch.nansum(torch.exp(logp) * logp))
    return lo + (hi - lo) * (entropy / math.log(n)) ** params.dynatemp_exponent


def xtc_filter(z: torch.Tensor, threshold: float) -> torch.Tensor:
    """Exclude top choices: of the tokens at or above `threshold` probability, all but the
    least likely go (nothing where fewer than two are)."""
    p = torch.softmax(z, dim=0)
    above = torch.nonzero(p >= threshold).flatten()
    if above.numel() < 2:
        return z
    keep = above[torch.argmin(p[above])]
    return z.index_fill(0, above[above != keep], -math.inf)


def mirostat_sample(logits: torch.Tensor, params: SamplingParams, mu: float, generator) -> tuple[int, float]:
    """Mirostat (1 or 2): the tokens whose surprise (-log2 p, after temperature) exceeds mu
    cut (v2), or a top-k from the Zipf exponent of the 100 best (v1); one drawn; mu moved by
    eta towards the target tau. Returns the token and the new mu."""
    z = logits.float() / max(params.temperature, MIN_TEMPERATURE)
    logp = torch.log_softmax(z, dim=0)
    if params.mirostat == 1:
        top = torch.topk(logp, min(100, logp.shape[0])).values
        t = torch.log(torch.arange(2, top.shape[0] + 1, dtype=torch.float32) / torch.arange(1, top.shape[0],
                                                                                            dtype=torch.float32))
        b = top[:-1] - top[1:]
        s_hat = float((t * b).sum() / (t * t).sum()) if top.shape[0] > 1 else 1.0
        eps = s_hat - 1.0
        n = logp.shape[0]
        k = int(((eps * 2 ** mu) / (1 - n ** -eps)) ** (1 / s_hat)) if eps > 1e-6 else n
        keep = torch.topk(logp, max(1, min(k, n))).indices
        z = torch.full_like(z, -math.inf).index_copy(0, keep, z[keep])
    else:
        surprise = -logp / math.log(2)
        cut = surprise > mu
        if bool(cut.all()):
            cut[torch.argmax(logp)] = False
        z = z.masked_fill(cut, -math.inf)
    probs = torch.softmax(z, dim=0)
    token = int(torch.multinomial(probs, 1, generator=generator))
    observed = float(-torch.log_softmax(z, dim=0)[token] / math.log(2))
    return token, mu - params.mirostat_eta * (observed - params.mirostat_tau)


class DryPenalty:
    """DRY ("don't repeat yourself"): where the context ends with a run that occurred
    before, the token that followed that earlier run is penalized by multiplier x
    base^(run length - allowed length), for runs of at least the allowed length; runs do
    not cross a sequence breaker (a token whose text holds one)."""

    MAX_RUN = 64  # runs longer than this count as this long

    def __init__(self, params: SamplingParams, tokenizer, prompt_ids: list[int]):
        self.p, self.tok = params, tokenizer
        self.prompt = [t for t in prompt_ids if t >= 0]
        self.breaks: dict[int, bool] = {}

    def _breaker(self, t: int) -> bool:
        if t not in self.breaks:
            text = self.tok.decode([t], skip_special_tokens=False)
            self.breaks[t] = any(b in text for b in self.p.dry_sequence_breakers)
        return self.breaks[t]

    def __call__(self, generated: list[int], logits: torch.Tensor) -> torch.Tensor:
        p = self.p
        h = self.prompt + generated
        if p.dry_penalty_last_n > 0:
            h = h[-p.dry_penalty_last_n:]
        if len(h) < 2 or self._breaker(h[-1]):
            return logits
        arr = torch.tensor(h, dtype=torch.long)
        n = len(h)
        ends = torch.arange(n - 1)  # a run ending at j (before the last token), followed by h[j + 1]
        alive = arr[:-1] == arr[-1]
        length = alive.long()
        for k in range(1, min(self.MAX_RUN, n - 1)):
            if self._breaker(h[-1 - k]):
                break
            ok = ends - k >= 0
            idx = (ends - k).clamp(min=0)
            alive = alive & ok & (arr[idx] == arr[-1 - k])
            if not bool(alive.any()):
                break
            length = length + alive.long()
        best: dict[int, int] = {}
        for j in torch.nonzero(length >= p.dry_allowed_length).flatten().tolist():
            nxt = h[j + 1]
            best[nxt] = max(best.get(nxt, 0), int(length[j]))
        if not best:
            return logits
        ids = torch.tensor(list(best), dtype=torch.long)
        pen = torch.tensor([p.dry_multiplier * p.dry_base ** (m - p.dry_allowed_length) for m in best.values()],
                           dtype=logits.dtype)
        return logits.index_add(0, ids, -pen)


def token_logprobs(logits: torch.Tensor, token: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    """The log-probability of `token` under `logits` (the processed logits the sampler
    saw, before temperature and filtering) and the `k` most likely (id, logprob), best first."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    top: list[tuple[int, float]] = []
    if k > 0:
        vals, ids = torch.topk(lp, min(k, lp.shape[-1]))
        top = [(int(i), float(v)) for i, v in zip(ids, vals)]
    return float(lp[token]), top
