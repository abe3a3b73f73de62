"""Decode steps replayed as captured (engine.graphs), on the CPU through the emulated replay
(the step run again over its buffers, with placeholder sequences) and Triton's interpreter
(tests/conftest.py): every family whose steps are captured reads only the batch's tensors,
so replays for other slots, orders and positions give the eager steps' logits;
what is not a decode step runs eagerly; the load's choice on CUDA and its reasons; which
draws the scheduler leaves on the device (greedy ones: an argmax there, one number back)."""

from __future__ import annotations

import pytest
import torch

from gguf_serve.engine import EngineConfig, load_model
from gguf_serve.engine.batch import Batch
from gguf_serve.engine.graphs import StepGraphs
from gguf_serve.engine.kernels import triton_ops
from gguf_serve.engine.sampling import SamplingParams
from gguf_serve.engine.scheduler.state import Choice

from tiny_models import random_model, spec, write_gguf

pytestmark = pytest.mark.skipif(not triton_ops.AVAILABLE, reason="the triton package is not installed "
                                "(the test extra installs it)")

PROMPTS = {0: [5, 9, 200, 17, 3], 1: [11, 12, 13], 2: [40, 41, 42, 43, 44, 45, 46]}
# decode steps: per step the slots that go on (one token each), or (slots, tokens each) for a verification
# step that wants every row; the first of each shape runs eagerly and is captured, the others replay it
STEPS = [[0, 1], [0, 1], [2, 0], [1, 2], [1], [2], [0], ([0, 2], 3), ([2, 1], 3), [1, 0]]


def _drive(lm) -> list[torch.Tensor]:
    slots = {k: lm.cache.allocate() for k in PROMPTS}
    ends = {k: len(p) for k, p in PROMPTS.items()}
    try:
        lm.forward(Batch.of([(slots[k], p, 0) for k, p in PROMPTS.items()], want="none"))
        out = []
        for i, step in enumerate(STEPS):
            keys, n = (step, 1) if isinstance(step, list) else step
            items = [(slots[k], [(13 * i + 7 * k + j) % 200 + 1 for j in range(n)], ends[k]) for k in keys]
            out.append(lm.forward(Batch.of(items, want="last" if n == 1 else "all")))
            for k in keys:
                ends[k] += n
        return out
    finally:
        for s in slots.values():
            lm.cache.free(s)


FAMILIES = {  # arch: what its decode step adds
    "llama": "full attention, a q8_0 cache",
    "gemma3": "sliding rings shorter than the context",
    "qwen35": "Gated DeltaNet and its causal conv, gated attention",
    "gemma4": "per-layer embeddings, layers sharing another's cache",
    "granitehybrid": "Mamba-2's scan, experts",
}


@pytest.mark.parametrize("arch", FAMILIES)
def test_replayed_steps_give_the_eager_steps_logits_for_any_slots(arch, tmp_path):
    s = spec(arch)
    path = tmp_path / f"{arch}.gguf"
    write_gguf(s, random_model(s), path, "F32")  # torch's products: the attention and the state ops are tested
    cache = "q8_0" if arch == "llama" else None
    config = EngineConfig(kernels="triton", device="cpu", n_ctx=64, n_seq=4, max_batch=16, cache_type_k=cache,
                          cache_type_v=cache)
    eager, lm = load_model(str(path), config=config), load_model(str(path), config=config)
    assert lm.graphs is None  # a CPU: none at load
    lm.graphs = StepGraphs(lm.model, lm.cache, "cpu", emulate=True)
    want, got = _drive(eager), _drive(lm)
    for w, g in zip(want, got):  # equal but for the recurrent layers, whose eager CPU steps go sequence by
        # sequence in place (float32 sums in another order, carried through the states)
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4 * float(w.abs().max()))
    recurrent = lm.cache.has_linear
    assert sorted(lm.graphs.steps) == ([(1, 1), (2, 1)] if recurrent else [(1, 1), (2, 1), (2, 3)])
    assert lm.graphs.replays == (6 if recurrent else 7)


def test_what_is_not_a_decode_step_runs_eagerly(tmp_path):
    s = spec("llama")
    path = tmp_path / "llama.gguf"
    write_gguf(s, random_model(s), path, "F32")
    lm = load_model(str(path), config=EngineConfig(kernels="triton", device="cpu", n_ctx=64, max_batch=16))
    graphs = StepGraphs(lm.model, lm.cache, "cpu", emulate=True)
    assert graphs.key(Batch.of([(0, [1], 4), (1, [2], 9)])) == (2, 1)
    assert graphs.key(Batch.of([(0, [1, 2], 4), (1, [2, 3], 9)], want="all")) == (2, 2)
    assert graphs.key(Batch.of([(0, [1, 2], 4), (1, [2, 3], 9)], want="last")) is None  # a subset of rows
    assert graphs.key(Batch.of([(0, [1, 2], 4), (1, [2], 9)], want="all")) is None  # unequal sequences
    assert graphs.key(Batch.of([(0, list(range(1, 18)), 0)], want="all")) is None  # a prompt
    assert graphs.key(Batch.of([(0, [1], 4)], want="none")) is None
    lora = Batch.of([(0, [1], 4)])
    lora.lora[0] = ((0, 1.0),)
    assert graphs.key(lora) is None
    hidden = Batch.of([(0, [1], 4)])
    hidden.keep_hidden = True
    assert graphs.key(hidden) is None
    graphs.off = "a capture failed"
    assert graphs.key(Batch.of([(0, [1], 4)])) is None


def test_the_load_takes_graphs_on_cuda_where_the_model_and_ops_allow(tmp_path):
    """What the load line says on CUDA (no capture happens until a step runs): graphs with the
    Triton ops, off by the setting, off with torch's own attention (which reads the batch's
    sequences)."""
    s = spec("llama")
    path = tmp_path / "llama.gguf"
    write_gguf(s, random_model(s), path, "F32")
    lm = load_model(str(path), config=EngineConfig(kernels="triton", device="cpu", n_ctx=64))
    graphs, note = StepGraphs.make(lm.model, lm.cache, "cuda", True)
    assert isinstance(graphs, StepGraphs) and note == "CUDA graphs for decode steps"
    assert StepGraphs.make(lm.model, lm.cache, "cuda", False) == (None, "CUDA graphs off (the setting)")
    assert StepGraphs.make(lm.model, lm.cache, "cpu", True) == (None, "")
    torch_ops = load_model(str(path), config=EngineConfig(kernels="reference", device="cpu", n_ctx=64))
    assert StepGraphs.make(torch_ops.model, torch_ops.cache, "cuda", True)[1].startswith("CUDA graphs off: torch ops")


def test_greedy_draws_without_processors_stay_on_the_device(tmp_path):
    s = spec("llama")
    path = tmp_path / "llama.gguf"
    write_gguf(s, random_model(s), path, "F32")
    tok = load_model(str(path), config=EngineConfig(device="cpu", n_ctx=64)).tokenizer

    def choice(**kw):
        return Choice(0, SamplingParams(**kw), tok, [1, 2, 3], 16, set())

    assert choice(temperature=0).draws_anywhere
    assert choice(temperature=0.8, top_k=1).draws_anywhere  # top-k 1 is greedy
    assert choice(temperature=0, repetition_penalty=1.3, logit_bias={5: 2.0}).draws_anywhere  # device ops
    assert not choice(temperature=0.8).draws_anywhere  # a draw from the distribution: on the host
    assert not choice(temperature=0, logprobs=2).draws_anywhere
    assert not choice(temperature=0, dry_multiplier=0.8).draws_anywhere
    assert not choice(temperature=0, logits_processor=lambda ids, z: z).draws_anywhere
