"""llama.cpp's other samplers (engine.sampling): top-n-sigma, locally typical sampling,
XTC, dynamic temperature, Mirostat and DRY, each against what its definition keeps or
penalizes; and through generate() on the real Gemma 3 270M file."""

from __future__ import annotations

import math

import pytest
import torch

from gguf_serve.engine import SamplingParams, load_model
from gguf_serve.engine.generate import generate
from gguf_serve.engine.sampling import DryPenalty, mirostat_sample, pre_temperature, sample, temperature, xtc_filter
from gguf_serve.engine.tokenizer import load_tokenizer
from gguf_serve.gguf_io import GGUFReader


def draws(logits, params, n=300):
    g = torch.Generator().manual_seed(0)
    return {sample(logits, params, g) for _ in range(n)}


def test_top_n_sigma_keeps_the_logits_within_n_deviations():
    z = torch.tensor([5.0, 4.9, 1.0, 0.0, -1.0, -2.0, 0.5, 0.2])
    kept = torch.isfinite(pre_temperature(z, SamplingParams(top_n_sigma=1.0)))
    assert kept.tolist() == (z >= z.max() - z.std()).tolist() and kept.sum() == 2
    assert draws(z, SamplingParams(temperature=2.0, top_n_sigma=1.0)) == {0, 1}
    assert draws(z, SamplingParams(temperature=2.0, top_n_sigma=0.0)) == {0}  # only the best: greedy


def test_typical_sampling_keeps_the_tokens_nearest_the_entropy():
    p = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
    z = torch.log(p)
    entropy = float(-(p * torch.log(p)).sum())
    order = sorted(range(5), key=lambda i: abs(-math.log(p[i]) - entropy))
    mass, want = 0.0, set()
    for i in order:  # the smallest set, nearest first, whose mass reaches 0.3
        want.add(i)
        mass += float(p[i])
        if mass >= 0.3:
            break
    kept = torch.isfinite(pre_temperature(z, SamplingParams(typical_p=0.3)))
    assert set(torch.nonzero(kept).flatten().tolist()) == want == {1, 2}  # the most likely is not typical


def test_xtc_leaves_the_least_likely_of_the_top_choices():
    z = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert torch.isfinite(xtc_filter(z, 0.1)).tolist() == [False, False, True, True]
    assert torch.isfinite(xtc_filter(z, 0.4)).tolist() == [True] * 4  # one above: nothing goes
    assert draws(z, SamplingParams(xtc_probability=1.0, xtc_threshold=0.1)) == {2, 3}
    assert 0 in draws(z, SamplingParams(xtc_probability=0.5, xtc_threshold=0.1))  # half the draws keep it


def test_dynamic_temperature_follows_the_entropy():
    params = SamplingParams(temperature=1.0, dynatemp_range=0.5)
    assert temperature(torch.zeros(100), params) == pytest.approx(1.5)  # uniform: the top of the range
    peaked = torch.full((100,), -30.0)
    peaked[0] = 0.0
    assert temperature(peaked, params) < 0.51
    assert temperature(peaked, SamplingParams(temperature=0.7)) == 0.7  # no range: the request's


def test_mirostat_two_cuts_above_mu_and_moves_mu_towards_tau():
    """v2: the tokens whose surprise (-log2 p) is above mu are cut, one is drawn from the
    rest renormalized, and mu moves by eta (surprise of the draw there - tau)."""
    z = torch.log_softmax(torch.linspace(4, -4, 50), dim=0)
    params = SamplingParams(mirostat=2, mirostat_tau=3.0, mirostat_eta=0.5)
    g = torch.Generator().manual_seed(1)
    surprise = -z / math.log(2)
    mu = 2 * params.mirostat_tau
    for _ in range(200):
        kept = surprise <= mu
        token, new = mirostat_sample(z, params, mu, g)
        assert kept[token] or token == 0
        renormalized = float(surprise[token]) + math.log2(float(torch.exp(z[kept]).sum())) if kept.any() else 0.0
        assert new == pytest.approx(mu - 0.5 * (renormalized - 3.0), abs=1e-4)
        mu = new
    assert abs(mu - 3.0) < 3.0  # it settles about its target, not drifting off
    token, _ = mirostat_sample(z, SamplingParams(mirostat=1, mirostat_tau=3.0), 6.0, g)
    assert 0 <= token < 50


@pytest.fixture(scope="module")
def gemma_tok(gemma_path):
    return load_tokenizer(GGUFReader(gemma_path))


def test_dry_penalizes_the_token_that_would_extend_a_repeat(gemma_tok):
    ids = gemma_tok("so the quick brown fox jumps and the quick brown", add_special_tokens=False)["input_ids"]
    fox = gemma_tok(" fox", add_special_tokens=False)["input_ids"][0]
    params = SamplingParams(dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2, dry_sequence_breakers=[])
    out = DryPenalty(params, gemma_tok, ids[:-3])(ids[-3:], torch.zeros(gemma_tok.vocab_size))
    run = 3  # " the quick brown" before, then " fox"
    assert float(out[fox]) == pytest.approx(-0.8 * 1.75 ** (run - 2))
    assert int((out != 0).sum()) == 1
    broken = SamplingParams(dry_multiplier=0.8, dry_sequence_breakers=[" quick"])  # the run stops at a breaker
    assert float(DryPenalty(broken, gemma_tok, ids[:-3])(ids[-3:], torch.zeros(gemma_tok.vocab_size))[fox]) == 0


def text(lm, prompt, **params) -> str:
    return "".join(s.text for s in generate(lm, prompt, SamplingParams(**params)))


def test_the_samplers_through_generate(gemma_path):
    lm = load_model(gemma_path, device="cpu", n_ctx=256, n_seq=1)
    greedy = text(lm, "The capital of France is", max_tokens=8, temperature=0)
    assert text(lm, "The capital of France is", temperature=1.5, top_n_sigma=0.0, max_tokens=8, seed=3) == greedy
    repeat = "one two three one two three one two three one two"
    plain = text(lm, repeat, max_tokens=6, temperature=0)
    dry = text(lm, repeat, temperature=0, max_tokens=6, dry_multiplier=2.0)
    assert plain.split()[:1] == ["three"] and dry.split()[:1] != ["three"]
