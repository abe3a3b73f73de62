"""LoRA adapters (engine.lora) as users have them: peft's adapter on a tiny llama, written
by llama.cpp's convert_lora_to_gguf.py. Our logits with the adapter, at scale 1 and 0.5,
equal llama.cpp's with the same files (llama-cpp-python); requests with different adapters
and one without share a forward and each gets what it gets alone; files that do not fit
are refused with the reason."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from gguf_serve.engine import EngineConfig, Request, SamplingParams, Scheduler, load_model
from gguf_serve.engine.batch import Batch
from gguf_serve.engine.lora import AdapterError
from gguf_serve.engine.speculative import SpecSettings

from oracles import llama_cpp_logits, prompt_logits
from tiny_lora import lora_adapter
from tiny_models import random_model, spec, write_gguf

IDS = [1, 5, 9, 200, 17, 33]

LLAMA_CPP_LORA = """
import sys, json, llama_cpp, numpy as np
m = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=64, n_threads=1, logits_all=True, verbose=False,
                    lora_path=sys.argv[3], lora_scale=float(sys.argv[4]))
ids = json.loads(sys.argv[2])
m.eval(ids)
print(json.dumps(np.asarray(m.scores[:len(ids)]).tolist()))
"""


def llama_cpp_lora_logits(base: str, adapter: str, scale: float, ids: list[int]) -> torch.Tensor:
    p = subprocess.run([sys.executable, "-c", LLAMA_CPP_LORA, base, json.dumps(ids), adapter, str(scale)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return torch.tensor(json.loads(p.stdout))


@pytest.fixture(scope="module", params=[("F32", "f32"), ("Q8_0", "f32"), ("F32", "q8_0")], ids=lambda p: "-".join(p))
def files(request, tmp_path_factory):
    """(base file, two adapters, (the base's type, the adapters'))."""
    mix, outtype = request.param
    folder = tmp_path_factory.mktemp(f"lora-{mix}-{outtype}")
    s = spec("llama")
    dense = write_gguf(s, random_model(s), folder / "base.gguf", mix)
    first, _ = lora_adapter(dense, folder / "a", outtype, seed=1)
    second, _ = lora_adapter(dense, folder / "b", outtype, rank=8, alpha=4.0, seed=2, targets=("q_proj", "v_proj"))
    return str(folder / "base.gguf"), first, second, request.param


def with_adapters(lm, ids: list[int], chosen: tuple[tuple[int, float], ...]) -> torch.Tensor:
    slot = lm.cache.allocate()
    try:
        batch = Batch.of([(slot, ids, 0)], want="all")
        batch.lora = {slot: chosen}
        return lm.forward(batch)
    finally:
        lm.cache.free(slot)


def test_logits_with_an_adapter_equal_llama_cpps_at_each_scale(files):
    base, first, _, (mix, outtype) = files
    lm = load_model(base, device="cpu")
    adapter = lm.load_adapter(first)
    plain = prompt_logits(lm, IDS)
    # the base type's own distance from llama.cpp (Q8_0: both quantize the activations, each its
    # own way), which the adapter may not widen; a Q8_0 adapter's products llama.cpp takes with
    # its input quantized to 8 bits, ours in float32 (1.4e-2 apart here at scale 1)
    floor = float((plain - llama_cpp_logits(base, IDS)).abs().max() / plain.abs().max())
    tolerance = max(3e-3, 1.5 * floor) if outtype == "f32" else 2e-2
    assert mix != "F32" or floor < 3e-3
    for scale in (1.0, 0.5):
        theirs = llama_cpp_lora_logits(base, first, scale, IDS)
        ours = with_adapters(lm, IDS, ((adapter.id, scale),))
        assert float((ours - theirs).abs().max() / theirs.abs().max()) < tolerance, scale
        assert mix != "F32" or torch.equal(ours.argmax(-1), theirs.argmax(-1))  # Q8_0 on random weights: near ties
        assert float((ours - plain).abs().max()) > 0.1  # the adapter changes the logits
    torch.testing.assert_close(with_adapters(lm, IDS, ((adapter.id, 0.0),)), plain)


def test_requests_with_different_adapters_share_a_forward(files):
    """Three sequences in one batch (the first adapter, the second at 0.5 with the first at
    0.25, none): each sequence's logits are those of its forward alone."""
    base, first, second, _ = files
    lm = load_model(base, device="cpu", n_seq=4)
    a, b = lm.load_adapter(first), lm.load_adapter(second)
    prompts = [IDS, [7, 8, 9, 10], [3, 200, 4]]
    chosen = [((a.id, 1.0),), ((b.id, 0.5), (a.id, 0.25)), ()]
    alone = [with_adapters(lm, p, c) for p, c in zip(prompts, chosen)]
    slots = [lm.cache.allocate() for _ in prompts]
    batch = Batch.of([(s, p, 0) for s, p in zip(slots, prompts)], want="all")
    batch.lora = dict(zip(slots, chosen))
    together = lm.forward(batch).split([len(p) for p in prompts])
    for got, expected in zip(together, alone):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(alone[2], with_adapters(lm, prompts[2], ((a.id, 1.0),)), atol=1e-2)
    lm.unload_adapter(a.id)
    torch.testing.assert_close(with_adapters(lm, IDS, ((a.id, 1.0),)), prompt_logits(lm, IDS))


def test_an_adapter_that_does_not_fit_is_refused_with_the_reason(files, tmp_path):
    base, first, _, _ = files
    wider = spec("llama")
    wider.config.intermediate_size *= 2  # the same architecture, another size
    wider_base = tmp_path / "wider.gguf"
    write_gguf(wider, random_model(wider), wider_base, "F32")
    with pytest.raises(AdapterError, match=r"blk.0.ffn_down.weight's lora_a \(4, 512\) and lora_b \(256, 4\) do not fit"):
        load_model(str(wider_base), device="cpu").load_adapter(first)
    other = spec("qwen3")
    other_base = tmp_path / "other.gguf"
    write_gguf(other, random_model(other), other_base, "F32")
    lm = load_model(str(other_base), device="cpu")
    with pytest.raises(AdapterError, match="an adapter for 'llama', and the model is 'qwen3'"):
        lm.load_adapter(first)
    with pytest.raises(AdapterError, match="not a LoRA adapter"):
        lm.load_adapter(base)  # a model file
    assert lm.adapters == {}


def test_the_scheduler_runs_each_request_under_its_adapters_and_keeps_their_prefixes_apart(files):
    """Requests with different adapters stream side by side, each with the tokens it gets
    alone; a prompt computed under one adapter set is never reused under another."""
    base, first, second, _ = files
    # float32 prompts at every length (AMX CPUs take 17 rows and up in bfloat16): a batch of
    # three prompts then computes each as it is computed alone
    lm = load_model(base, config=EngineConfig(device="cpu", n_seq=4, prefill_dtype="float32"))
    a, b = lm.load_adapter(first), lm.load_adapter(second)
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    sets = [((a.id, 1.0),), ((b.id, 1.0),), ()]
    alone = [[s.token_id for s in lm.generate(IDS, greedy, lora=c) if s.token_id is not None] for c in sets]
    assert len({tuple(t) for t in alone}) == 3  # each set its own continuation
    sched = Scheduler(lm)
    outs = [[] for _ in sets]
    for out, chosen in zip(outs, sets):
        sched.add(Request(list(IDS), [greedy], out.append, lora=chosen))
    while sched.busy:
        sched.step()
    for out, expected in zip(outs, alone):
        assert [s.token_id for s in out if s is not None and s.token_id is not None] == expected

    def cached(chosen) -> int:
        out = []
        sched.add(Request(IDS + [40, 41], [greedy], out.append, lora=chosen))
        while sched.busy:
            sched.step()
        return next(s.cached_tokens for s in out if s is not None)
    assert cached(((a.id, 1.0),)) == len(IDS)  # the same adapter: its prompt reused
    assert cached(((a.id, 0.5),)) == 0  # another scale: computed again
    sched.close()

    # drafts are verified under their row's adapters: n-gram drafts (from the prompt, and
    # from what a tiny model's greedy text repeats) leave each request's tokens as they are
    greedy = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    for chosen in sets[:2]:
        got, drafted = {}, {}
        for mode in ("off", "ngram"):
            s = Scheduler(lm, prefix_cache=False, spec=SpecSettings(mode=mode))
            out = []
            s.add(Request(IDS * 3, [greedy], out.append, lora=chosen))
            while s.busy:
                s.step()
            got[mode] = [t.token_id for t in out if t is not None and t.token_id is not None]
            drafted[mode] = s.drafted_tokens
            s.close()
        assert drafted["ngram"] > 0 and got["ngram"] == got["off"]
