"""The scheduler on tiny models of the three cache kinds (full attention, sliding
window, recurrent): sequences batched together, joining and leaving between steps,
each equal to the same sequence generated alone; prompts prefilled in chunks beside
running streams; cancellation; the prefix cache (exact, or not used); n choices from
one prefill; the per-sequence logits processor and logprobs."""

import os
import threading

import pytest
import torch

from gguf_serve.engine import kernels, load_model
from gguf_serve.engine.cache import CacheError
from gguf_serve.engine.sampling import SamplingParams
from gguf_serve.engine.scheduler import Request, Scheduler
from gguf_serve.engine.speculative import SpecSettings

from sequences import alone, greedy, prompts
from tiny_models import random_model, spec, write_gguf

# and the families of issue 25: Gemma 4 (shared-cache layers), gpt-oss (sinks), LFM2 and Granite 4 (conv and
# Mamba-2 states), GLM-4.5, Mistral 3
ARCHS = ["qwen3", "gemma3", "qwen35", "gemma4", "gpt-oss", "lfm2", "granitehybrid", "glm4moe", "mistral3"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Tiny models on the reference kernels: float32 all through, so that a prompt
    prefilled whole, in chunks or after a reused prefix gives the same greedy tokens (the
    native kernels quantize activations to 8 bits, and a rounding that flips with the
    chunking can turn a near tie of a random model's logits)."""
    os.environ[kernels.ENV_OVERRIDE] = "reference"
    out = {}
    try:
        for arch in ARCHS:
            s = spec(arch)
            path = tmp_path_factory.mktemp(arch) / f"{arch}.gguf"
            write_gguf(s, random_model(s, seed=3), path, "Q8_0")
            out[arch] = load_model(str(path), device="cpu", n_seq=4)
            if arch == "gemma3":  # rings of window 8 + max_batch 16 cells: a long sequence overwrites its start
                out["gemma3-ring"] = load_model(str(path), device="cpu", n_seq=4, max_batch=16)
        yield out
    finally:
        del os.environ[kernels.ENV_OVERRIDE]


@pytest.fixture
def make():
    """Schedulers over the module's models, closed after the test (their cached slots given back)."""
    made = []

    def new(lm, **kw):
        made.append(Scheduler(lm, **kw))
        return made[-1]

    yield new
    for s in made:
        s.close()


class Collect:
    """A request's emitted items: steps per choice, then the end."""

    def __init__(self, n=1):
        self.steps = [[] for _ in range(n)]
        self.done = False
        self.error = None

    def __call__(self, item):
        assert not self.done, "nothing may follow the end"
        if item is None:
            self.done = True
        elif isinstance(item, Exception):
            self.error, self.done = item, True
        else:
            self.steps[item.index].append(item)

    def tokens(self, i=0):
        return [s.token_id for s in self.steps[i] if s.token_id is not None]


def run(sched, until=None, limit=10_000):
    n = 0
    while sched.busy and n < limit and not (until and until()):
        sched.step()
        n += 1
    return n


@pytest.mark.parametrize("arch", ARCHS)
def test_sequences_joining_and_leaving_equal_each_alone(models, arch, make):
    lm = models[arch]
    ps = prompts(5, 17, 40, 9, 23)
    budgets = [10, 13, 16, 19, 6]
    expect = [alone(lm, p, greedy(b)) for p, b in zip(ps, budgets)]
    sched = make(lm)
    outs = [Collect() for _ in ps]
    sizes = []
    for i in (0, 1):
        sched.add(Request(ps[i], [greedy(budgets[i])], outs[i]))
    step = 0
    while sched.busy:
        sizes.append(sched.step())
        step += 1
        if step == 3:  # two join while two decode; the fifth waits for a slot (4 slots)
            for i in (2, 3, 4):
                sched.add(Request(ps[i], [greedy(budgets[i])], outs[i]))
    for o, e in zip(outs, expect):
        assert o.done and o.error is None and o.tokens() == e
        assert o.steps[0][-1].finish_reason == "length"
    assert max(sizes) > 40  # prompts rode along with decoding sequences
    assert sched.slots()["running"] == 0


def test_a_long_prompt_is_prefilled_in_chunks_beside_running_streams(models, make):
    lm = models["qwen3"]
    short, long = prompts(4, 200)
    sched = make(lm, prefill_chunk=32)
    a, b = Collect(), Collect()
    sched.add(Request(short, [greedy(30)], a))
    sched.step()  # a's prompt
    sched.add(Request(long, [greedy(3)], b))
    sizes = [sched.step() for _ in range(7)]
    assert sizes == [1 + 32] * 6 + [1 + 200 - 6 * 32]  # one decode token + a chunk, every step
    assert len(a.tokens()) == 8 and len(b.tokens()) == 1  # the stream never waited for the prefill
    run(sched)
    assert b.tokens() == alone(lm, long, greedy(3)) and a.tokens() == alone(lm, short, greedy(30))


def test_cancel_leaves_at_the_next_step_and_frees_the_slot(models, make):
    lm = models["gemma3"]
    p1, p2 = prompts(6, 8)
    sched = make(lm, prefix_cache=False, spec=SpecSettings(mode="off"))  # one token a step
    a, b = Collect(), Collect()
    ra = Request(p1, [greedy(50)], a)
    sched.add(ra)
    sched.add(Request(p2, [greedy(20)], b))
    for _ in range(4):
        sched.step()
    ra.cancel.set()
    sched.step()
    assert a.done and a.steps[0][-1].finish_reason == "cancelled" and len(a.tokens()) == 4
    assert sched.slots() == {"running": 1, "cached": 0, "free": 3}
    run(sched)
    assert b.tokens() == alone(lm, p2, greedy(20))
    assert sched.slots() == {"running": 0, "cached": 0, "free": 4}


def test_a_request_waiting_for_a_slot_is_admitted_when_one_frees(models, make):
    lm = models["qwen3"]
    sched = make(lm, prefix_cache=False)
    outs = [Collect(2) for _ in range(3)]
    for o, p in zip(outs, prompts(5, 6, 7)):
        sched.add(Request(p, [greedy(4), greedy(8)], o))  # two slots each: the third waits
    sched.step()
    assert len(sched.waiting) == 1 and not sched.has_room()
    run(sched)
    assert all(o.done and len(o.tokens(0)) == 4 and len(o.tokens(1)) == 8 for o in outs)
    with pytest.raises(CacheError, match="5 choices"):
        sched.add(Request([1, 2], [greedy(1)] * 5, Collect(5)))


@pytest.mark.parametrize("arch", ARCHS)
def test_n_choices_share_one_prefill_and_equal_each_alone(models, arch, make):
    lm = models[arch]
    (p,) = prompts(30)
    # without drafts: n-gram drafts (a random model's text repeats itself) would add verified tokens to the count
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=12, ignore_eos=True, speculative="off")
              for s in (7, 8, 9)]
    expect = [alone(lm, p, q) for q in params]
    fed = []
    forward = lm.forward

    def counting(batch):
        fed.append(batch.n_tokens)
        return forward(batch)

    lm.forward = counting
    try:
        sched = make(lm, prefix_cache=False)
        out = Collect(3)
        sched.add(Request(p, params, out))
        run(sched)
    finally:
        del lm.forward
    assert [out.tokens(i) for i in range(3)] == expect
    assert len({tuple(e) for e in expect}) > 1  # the seeds do give different choices
    assert fed[0] == 30 and sum(fed) == 30 + 3 * 11  # the prompt once, then three tokens a step


def _hit(sched, lm, prompt, params):
    before = sched.prefix_hit_tokens
    out = Collect()
    sched.add(Request(prompt, [params], out))
    run(sched)
    assert out.done and out.error is None
    return sched.prefix_hit_tokens - before, out.tokens()


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "gemma3-ring", "qwen35", "gemma4", "gpt-oss", "lfm2",
                                  "granitehybrid", "glm4moe", "mistral3"])
def test_the_prefix_cache_is_exact_where_it_reuses(models, arch, make):
    lm = models[arch]
    system, turn1, turn2, other = prompts(60, 10, 12, 15, seed=2)
    sched = make(lm)
    n, reply = _hit(sched, lm, system + turn1, greedy(8))
    assert n == 0
    # the next turn: everything the sequence held (its prompt and reply but the last token) is a prefix
    follow = system + turn1 + reply + turn2
    n, got = _hit(sched, lm, follow, greedy(8))
    # (all of the reply where speculative decoding fed its last token as a draft that held)
    assert n in (len(system + turn1) + len(reply) - 1, len(system + turn1) + len(reply))
    assert got == alone(lm, follow, greedy(8))
    # another conversation with the same system prompt: part of a sequence can be reused by full attention,
    # by sliding windows while the ring still holds the window before the reuse point, never by a
    # recurrent state (it holds the end of the sequence only); where it cannot, it does not try
    n, got = _hit(sched, lm, system + other, greedy(8))
    assert n == {"qwen3": 60, "gemma3": 60, "gemma3-ring": 0, "qwen35": 0, "gemma4": 60, "gpt-oss": 60, "lfm2": 0,
                 "granitehybrid": 0, "glm4moe": 60, "mistral3": 60}[arch]
    assert got == alone(lm, system + other, greedy(8))


@pytest.mark.parametrize("arch", ["gemma3-ring", "qwen35"])
def test_a_new_turn_that_drops_the_last_reply_goes_on_from_a_checkpoint(models, arch, make):
    """A thinking chat's next turn leaves the history inside the last prompt's assistant
    header (the reply's thinking is dropped): recurrent states and a ring the conversation
    has outgrown cannot go back there, a checkpoint taken CHECKPOINT_BEFORE_END tokens
    before the prompt's end can, and gives the tokens of a cold start. Each turn keeps one."""
    from gguf_serve.engine.scheduler import CHECKPOINT_BEFORE_END

    lm = models[arch]
    system, turn1, header, answer1, turn2, turn3 = prompts(60, 10, 3, 6, 9, 7, seed=6)
    sched = make(lm)
    saved = lm.cache.checkpoint_stats.saved
    first = system + turn1 + header
    n, reply = _hit(sched, lm, first, greedy(30))  # a reply longer than gemma3-ring's 24 cells
    assert n == 0 and lm.cache.checkpoint_stats.saved == saved + 1
    second = system + turn1 + answer1 + turn2 + header  # leaves `first` 3 tokens before its end
    hits = lm.cache.checkpoint_stats.hits
    n, got = _hit(sched, lm, second, greedy(30))
    assert n == len(first) - CHECKPOINT_BEFORE_END and lm.cache.checkpoint_stats.hits == hits + 1
    assert got == alone(lm, second, greedy(30))
    third = second[:-len(header)] + answer1 + turn3 + header
    n, got = _hit(sched, lm, third, greedy(30))
    assert n == len(second) - CHECKPOINT_BEFORE_END
    assert got == alone(lm, third, greedy(30))


def test_a_prefix_is_copied_from_a_running_sequence(models, make):
    lm = models["qwen3"]
    system, a_turn, b_turn = prompts(50, 7, 9, seed=4)
    sched = make(lm)
    a, b = Collect(), Collect()
    sched.add(Request(system + a_turn, [greedy(20)], a))
    sched.step()
    sched.add(Request(system + b_turn, [greedy(5)], b))
    sched.step()
    assert sched.prefix_hit_tokens == 50 and sched.slots()["running"] == 2
    run(sched)
    assert b.tokens() == alone(lm, system + b_turn, greedy(5))
    assert a.tokens() == alone(lm, system + a_turn, greedy(20))


def test_cached_slots_are_evicted_least_recently_used_first(models, make):
    lm = models["qwen3"]
    sched = make(lm)
    ps = prompts(20, 21, 22, 23, 24, seed=5)
    for p in ps[:4]:
        _hit(sched, lm, p, greedy(2))
    assert sched.slots() == {"running": 0, "cached": 4, "free": 0}
    _hit(sched, lm, ps[4], greedy(2))  # evicts the first
    assert _hit(sched, lm, ps[0] + [1], greedy(2))[0] == 0
    assert _hit(sched, lm, ps[2] + [1], greedy(2))[0] == len(ps[2])
    sched.close()
    assert lm.cache.free_slots == 4


def test_logits_processor_and_logprobs(models, make):
    lm = models["qwen3"]
    (p,) = prompts(8)
    allowed = torch.tensor([3, 17, 42])
    seen = []

    def only_allowed(generated, logits):
        seen.append(list(generated))
        mask = torch.full_like(logits, float("-inf"))
        mask[allowed] = 0
        return logits + mask

    params = SamplingParams(temperature=1.0, seed=1, max_tokens=10, ignore_eos=True, logits_processor=only_allowed,
                            logprobs=2)
    out = Collect()
    sched = make(lm)
    sched.add(Request(p, [params], out))
    run(sched)
    toks = out.tokens()
    assert len(toks) == 10 and set(toks) <= {3, 17, 42}
    assert seen[3] == toks[:3]  # the processor sees what was generated before
    for s in out.steps[0]:
        top = dict(s.top_logprobs)
        assert s.logprob <= 0 and len(top) == 2 and set(top) <= {3, 17, 42}
        assert s.top_logprobs[0][1] >= s.top_logprobs[1][1]
        assert s.logprob <= s.top_logprobs[0][1] + 1e-6
        if s.token_id in top:
            assert top[s.token_id] == pytest.approx(s.logprob)
    # the masked-out tokens have no probability: the three allowed hold all of it
    probs = [sum(torch.tensor([lp for _, lp in s.top_logprobs]).exp()) for s in out.steps[0]]
    assert all(0.3 < float(x) <= 1 + 1e-5 for x in probs)
    greedy_out = Collect()
    sched.add(Request(p, [greedy(4, logprobs=1)], greedy_out))
    run(sched)
    for s in greedy_out.steps[0]:  # greedy picks the most likely token: it is the top one
        assert s.top_logprobs == [(s.token_id, pytest.approx(s.logprob))] and s.logprob < 0


def test_a_failing_logits_processor_ends_only_its_request(models, make):
    lm = models["qwen3"]
    p1, p2 = prompts(5, 6)

    def broken(generated, logits):
        if len(generated) == 2:
            raise RuntimeError("mask failed")
        return logits

    a, b = Collect(), Collect()
    sched = make(lm)
    sched.add(Request(p1, [greedy(6, logits_processor=broken)], a))
    sched.add(Request(p2, [greedy(6)], b))
    run(sched)
    assert isinstance(a.error, RuntimeError) and len(a.tokens()) == 2
    assert b.error is None and b.tokens() == alone(lm, p2, greedy(6))
    assert sched.slots()["running"] == 0


def test_generate_is_the_scheduler_with_one_request(models, make):
    lm = models["gemma3"]
    (p,) = prompts(9)
    cancel = threading.Event()
    steps = []
    for s in lm.generate(p, greedy(30), cancel=cancel):
        steps.append(s)
        if len(steps) == 5:
            cancel.set()
    assert [s.finish_reason for s in steps[-2:]] == [None, "cancelled"] and len(steps) == 6
    assert lm.cache.free_slots == lm.cache.n_seq  # its slot was given back
    assert [s.token_id for s in lm.generate([], greedy(3))] == [None]  # nothing to condition on
    taken = [lm.cache.allocate() for _ in range(lm.cache.n_seq)]  # another scheduler holds every slot
    try:
        with pytest.raises(CacheError, match="no free sequence slot"):
            list(lm.generate(p, greedy(3)))
    finally:
        for slot in taken:
            lm.cache.free(slot)


@pytest.mark.parametrize("arch", ["qwen3", "gemma3-ring", "qwen35", "gemma4", "lfm2", "granitehybrid"])
def test_a_slot_saved_to_a_file_and_restored_goes_on_as_if_never_left(models, arch, make, tmp_path):
    """llama-server's slot save and restore: a conversation's slot written to a file, the
    scheduler closed (every slot given back), the file read into another slot of a new
    one; the next turn reuses all of it (full attention, a ring the reply outgrew, the
    recurrent states) and gives the tokens of a cold start."""
    from gguf_serve.engine import slots

    lm = models[arch]
    system, turn1, turn2 = prompts(40, 8, 9, seed=7)
    first = make(lm)
    _, reply = _hit(first, lm, system + turn1, greedy(30))
    (slot,) = first.prefix.idle
    state = slots.export(first, slot)
    assert len(state.tokens) >= len(system + turn1) + len(reply) - 1
    ident = slots.identity(lm)
    n_bytes = slots.write_state(str(tmp_path / "s.bin"), state, ident)
    first.close()
    assert lm.cache.free_slots == lm.cache.n_seq
    again, size = slots.read_state(str(tmp_path / "s.bin"), ident)
    assert size == n_bytes and again.tokens == state.tokens
    second = make(lm)
    target = (slot + 1) % lm.cache.n_seq
    slots.restore(second, target, again)
    assert second.slots() == {"running": 0, "cached": 1, "free": lm.cache.n_seq - 1}
    assert [r["n_prompt_tokens"] for r in slots.table(second)][target] == len(state.tokens)
    follow = system + turn1 + reply + turn2
    n, got = _hit(second, lm, follow, greedy(8))
    assert n == len(state.tokens)
    assert got == alone(lm, follow, greedy(8))
    assert slots.erase(second, target) >= len(follow) - 1 and slots.erase(second, target) == 0


def test_slot_files_are_refused_by_another_model_and_busy_slots_are_left_alone(models, make, tmp_path):
    from gguf_serve.engine import slots

    lm, other = models["qwen3"], models["gemma3"]
    sched = make(lm)
    _hit(sched, lm, prompts(20)[0], greedy(2))
    (slot,) = sched.prefix.idle
    slots.write_state(str(tmp_path / "q.bin"), slots.export(sched, slot), slots.identity(lm))
    with pytest.raises(slots.SlotError, match="another model"):
        slots.read_state(str(tmp_path / "q.bin"), slots.identity(other))
    (tmp_path / "junk.bin").write_bytes(b"not a slot")
    with pytest.raises(slots.SlotError, match="not a slot file"):
        slots.read_state(str(tmp_path / "junk.bin"), slots.identity(lm))
    with pytest.raises(slots.SlotError, match="Invalid slot ID"):
        slots.export(sched, lm.cache.n_seq)
    out = Collect()
    sched.add(Request(prompts(10, seed=3)[0], [greedy(50)], out))
    sched.step()
    busy = next(iter(slots.running_slots(sched)))
    for act in (lambda: slots.export(sched, busy), lambda: slots.erase(sched, busy)):
        with pytest.raises(slots.SlotError, match="generating"):
            act()
    assert slots.table(sched)[busy]["is_processing"] is True
    run(sched)
    assert out.done and len(out.tokens()) == 50


def test_cells_in_use_follow_the_running_sequences(models, make):
    """What /metrics reports as KV cache usage (vllm:kv_cache_usage_perc): the cells of the
    running sequences, a step's worth more each decode step, none once they end (a finished
    prefix kept for reuse is room, as vLLM counts its cached blocks)."""
    lm = models["gemma3"]
    p1, p2 = prompts(6, 9)
    sched = make(lm, spec=SpecSettings(mode="off"))
    total = lm.cache.n_seq * lm.cache.n_ctx
    assert sched.cells_in_use() == (0, total)
    sched.add(Request(p1, [greedy(20)], Collect()))
    sched.add(Request(p2, [greedy(5)], Collect()))
    sched.step()  # both prompts in, their first tokens out
    used = sched.cells_in_use()[0]
    assert used == len(p1) + len(p2)
    sched.step()
    assert sched.cells_in_use()[0] == used + 2
    run(sched)
    assert sched.cells_in_use() == (0, total) and sched.slots()["cached"] == 2
