"""Streaming generation: the real Gemma file greedily (against llama.cpp's output),
and the sampling, stopping, cancel and detokenization rules on a tiny model."""

import threading

import pytest
import torch

from gguf_serve.engine import load_model
from gguf_serve.engine.text import Detokenizer, StopStrings
from gguf_serve.engine.sampling import (SamplingParams, apply_logit_bias, apply_penalties, min_p_filter, sample,
                                        top_k_filter, top_p_filter)
from gguf_serve.engine.tokenizer import encode

from tiny_models import random_model, spec, write_gguf

# llama.cpp (llama-cpp-python 0.3.36, temperature 0) on the Gemma file, same prompt
LLAMA_CPP_GREEDY = " the capital of the country of France. It is the largest city in France and"


@pytest.fixture(scope="module")
def gemma(gemma_path):
    """The exact-dequantization path (reference kernels), whose greedy text is llama.cpp's."""
    import os

    from gguf_serve.engine import kernels

    os.environ[kernels.ENV_OVERRIDE] = "reference"
    try:
        yield load_model(gemma_path, device="cpu")
    finally:
        del os.environ[kernels.ENV_OVERRIDE]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    s = spec("qwen2")
    path = tmp_path_factory.mktemp("gen") / "tiny.gguf"
    write_gguf(s, random_model(s, seed=3), path, "Q8_0")
    return load_model(str(path), device="cpu")


def _run(lm, ids, **kw):
    steps = list(lm.generate(ids, SamplingParams(**kw)))
    return steps, "".join(s.text for s in steps)


def test_gemma_greedy_is_llama_cpp_text(gemma):
    ids = encode(gemma.tokenizer, "The capital of France is")
    steps, text = _run(gemma, ids, temperature=0, max_tokens=16)
    assert text == LLAMA_CPP_GREEDY
    last = steps[-1]
    assert (last.finish_reason, last.prompt_tokens, last.completion_tokens) == ("length", 6, 16)
    assert all(s.finish_reason is None for s in steps[:-1])


def test_gemma_stop_string_cuts_and_never_leaks(gemma):
    ids = encode(gemma.tokenizer, "The capital of France is")
    steps, text = _run(gemma, ids, temperature=0, max_tokens=16, stop=["France."])
    assert text == " the capital of the country of "
    assert steps[-1].finish_reason == "stop"


def test_stop_token_ids(gemma):
    ids = encode(gemma.tokenizer, "The capital of France is")
    france = gemma.tokenizer.convert_tokens_to_ids("▁France")
    steps, text = _run(gemma, ids, temperature=0, max_tokens=16, stop_token_ids=[france])
    assert text == " the capital of the country of"
    assert steps[-1].finish_reason == "stop" and steps[-1].token_id == france


def test_detokenizer_never_splits_a_character(gemma):
    text = "Zürich 🙂 日本語 🚀🚀 done"
    ids = encode(gemma.tokenizer, text, add_special=False)
    assert len(ids) > len(text.split())  # some characters take several byte tokens
    d = Detokenizer(gemma.tokenizer, [2])
    chunks = [d.push(i) for i in ids]
    assert all("\ufffd" not in c for c in chunks)
    assert "".join(chunks) == text


def test_a_character_cut_off_at_the_end_is_sent_not_dropped(gemma):
    # max_tokens ends the answer inside a character (the first of its three byte tokens):
    # the bytes come out as U+FFFD, as llama-server sends them, not dropped with their tokens
    ids = encode(gemma.tokenizer, "Zürich 日本", add_special=False)
    first_byte = gemma.tokenizer.convert_tokens_to_ids("<0xE6>")
    steps, text = _run(gemma, ids, temperature=0, max_tokens=2, logit_bias={first_byte: 100})
    assert [s.token_id for s in steps] == [first_byte, first_byte] and steps[-1].finish_reason == "length"
    assert text and set(text) == {"\ufffd"}
    d = Detokenizer(gemma.tokenizer, [2])
    assert d.push(first_byte) == "" and d.flush() == "\ufffd" and d.flush() == ""


def test_stop_strings_hold_back_partial_matches():
    s = StopStrings(["</answer>"])
    assert s.feed("hello </an") == ("hello ", False)
    assert s.feed("swer> tail") == ("", True)
    s = StopStrings(["ab"])
    assert s.feed("xa") == ("x", False)
    assert s.feed("c") == ("ac", False)


def test_max_tokens_and_context_limit(tiny):
    steps, _ = _run(tiny, [1, 2, 3], temperature=0, max_tokens=5, ignore_eos=True)
    assert len(steps) == 5 and steps[-1].finish_reason == "length" and steps[-1].completion_tokens == 5
    short = load_model(tiny.gguf.path, device="cpu", n_ctx=7, n_seq=1)  # the limit is the cache's context
    steps = list(short.generate([1, 2, 3], SamplingParams(temperature=0, ignore_eos=True)))
    assert steps[-1].completion_tokens == 4 and steps[-1].finish_reason == "length"


def test_seed_reproducible(tiny):
    a = [s.token_id for s in tiny.generate([5, 6], SamplingParams(temperature=1.0, seed=7, max_tokens=12, ignore_eos=True))]
    b = [s.token_id for s in tiny.generate([5, 6], SamplingParams(temperature=1.0, seed=7, max_tokens=12, ignore_eos=True))]
    c = [s.token_id for s in tiny.generate([5, 6], SamplingParams(temperature=1.0, seed=8, max_tokens=12, ignore_eos=True))]
    assert a == b and a != c


def test_cancel_takes_effect_before_the_next_token(tiny):
    cancel = threading.Event()
    got = []
    for step in tiny.generate([1, 2], SamplingParams(temperature=0, max_tokens=50, ignore_eos=True), cancel=cancel):
        got.append(step)
        if len(got) == 3:
            cancel.set()
    assert len(got) == 4 and got[-1].finish_reason == "cancelled" and got[-1].completion_tokens == 3


def test_logit_bias_forces_a_token(tiny):
    steps, _ = _run(tiny, [1, 2], temperature=0, max_tokens=3, logit_bias={42: 100.0}, ignore_eos=True)
    assert [s.token_id for s in steps] == [42, 42, 42]


def test_eos_stops_generation(tiny):
    eos = tiny.tokenizer.eos_token_id
    steps, _ = _run(tiny, [1, 2], temperature=0, max_tokens=10, logit_bias={eos: 100.0})
    assert len(steps) == 1 and steps[0].finish_reason == "stop" and steps[0].text == ""


@pytest.mark.parametrize("kw", [dict(temperature=0.7), dict(temperature=1.0, top_p=0.9), dict(temperature=2.0, top_p=0.97),
                                dict(temperature=1.0, top_k=50), dict(temperature=1.0, top_k=400, top_p=0.8),
                                dict(temperature=1.0, min_p=0.1), dict(temperature=1.3, top_p=0.95, min_p=0.02)],
                         ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_draws_follow_what_the_filters_keep(kw):
    """The sampler works on candidates (top-k, the best tokens top-p needs, min-p as a
    threshold), not a softmax and sort of the whole vocabulary: its draws keep to the
    tokens top_k_filter -> top_p_filter -> min_p_filter keep, at their renormalized
    probabilities (8,000 draws: each of the likeliest tokens within 5 standard errors).
    A flat distribution at temperature 2 needs more than the first 256 candidates."""
    g = torch.Generator().manual_seed(11)
    logits = torch.randn(5000, generator=g) * 2.5
    params = SamplingParams(**kw)
    z = (logits - logits.max()) / params.temperature
    z = min_p_filter(top_p_filter(top_k_filter(z, params.top_k), params.top_p), params.min_p)
    ref = torch.softmax(z, 0)
    n = 8000
    draws = torch.tensor([sample(logits, params, g) for _ in range(n)])
    assert bool((ref[draws] > 0).all())  # nothing the filters drop
    freq = torch.bincount(draws, minlength=5000).double() / n
    for t in ref.argsort(descending=True)[:5]:
        p = float(ref[t])
        assert abs(float(freq[t]) - p) <= 5 * (p * (1 - p) / n) ** 0.5 + 1e-9, (int(t), float(freq[t]), p)
    assert len(set(draws.tolist())) > 1


def test_sampling_functions():
    logits = torch.tensor([1.0, 3.0, 2.0, -1.0])
    assert torch.isinf(top_k_filter(logits, 2)).tolist() == [True, False, False, True]
    assert torch.isinf(top_p_filter(logits, 0.5)).tolist() == [True, False, True, True]
    probs = torch.softmax(logits, 0)
    kept = ~torch.isinf(min_p_filter(logits, 0.3))
    assert kept.tolist() == (probs >= 0.3 * probs.max()).tolist()
    assert apply_logit_bias(logits, {3: 5.0})[3] == 4.0
    pen = apply_penalties(logits, {1: 2, 3: 1}, presence=0.5, frequency=0.25)
    assert pen.tolist() == [1.0, 3.0 - 0.5 - 0.5, 2.0, -1.0 - 0.5 - 0.25]
    rep = apply_penalties(logits, {1: 1, 3: 1}, repetition=2.0)
    assert rep.tolist() == [1.0, 1.5, 2.0, -2.0]
    assert sample(logits, SamplingParams(temperature=0), None) == 1
    g = torch.Generator().manual_seed(0)
    assert {sample(logits, SamplingParams(temperature=1.0, top_k=2), g) for _ in range(50)} <= {1, 2}
