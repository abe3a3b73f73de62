"""Speculative decoding in the scheduler: drafts (n-gram lookup over each sequence's
prompt and output) verified in one batch forward. Greedy output equals decoding without
speculation token for token on every architecture's tiny model, with speculating and
plain sequences joining and leaving the same steps, a stateful logits mask, stop
strings and ids, logit bias and max_tokens cutting inside an accepted run; sampled
output keeps its distribution (a chi-square test over seeds); a rolled-back recurrent
state equals a fresh prefill; a drafter the model lacks is refused."""

import os

import pytest
import torch

from gguf_serve.engine import kernels, load_model
from gguf_serve.engine.config import EngineConfig
from gguf_serve.engine.loader import load_draft
from gguf_serve.engine.batch import Batch
from gguf_serve.engine.sampling import SamplingParams
from gguf_serve.engine.scheduler import Request, Scheduler, check_speculative
from gguf_serve.engine.speculative import NgramIndex, SpecSettings, SpeculationError

from tiny_models import random_model, spec, write_gguf

ARCHS = ["llama", "qwen2", "qwen3", "qwen3moe", "qwen35", "qwen35moe", "gemma3", "phi3", "smollm3", "olmo2", "olmo3",
         "mistral3", "lfm2", "glm4moe", "gpt-oss", "gemma4", "gemma4moe"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Float32 files on the reference kernels (exact arithmetic, so that a row verified in a
    batch of drafts and the same row decoded alone give the same greedy token)."""
    os.environ[kernels.ENV_OVERRIDE] = "reference"
    cache = {}

    def get(arch):
        if arch not in cache:
            s = spec(arch)
            path = tmp_path_factory.mktemp(arch) / f"{arch}.gguf"
            write_gguf(s, random_model(s, seed=ARCHS.index(arch)), path, "F32")
            cache[arch] = load_model(str(path), device="cpu", n_seq=4)
        return cache[arch]
    yield get
    del os.environ[kernels.ENV_OVERRIDE]


def pattern(seed=1, n=6):
    return torch.randint(0, 200, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def no_triples(generated, logits):
    """A stateful mask (as a grammar is): never the same token three times in a row."""
    if len(generated) >= 2 and generated[-1] == generated[-2]:
        logits = logits.clone()
        logits[generated[-1]] = float("-inf")
    return logits


def run(lm, mode, plan):
    """`plan`: (step at which it joins, prompt, params); every request's emitted items."""
    sched = Scheduler(lm, spec=SpecSettings(mode=mode))
    outs = [[] for _ in plan]
    step = 0
    try:
        while step == 0 or sched.busy or any(at >= step for at, _, _ in plan):
            for i, (at, prompt, params) in enumerate(plan):
                if at == step:
                    sched.add(Request(list(prompt), [params], outs[i].append))
            sched.step()
            step += 1
            assert step < 1000
    finally:
        sched.close()
    return outs, sched


def tokens(items):
    return [(s.token_id, s.text, s.finish_reason) for s in items if s is not None]


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_with_speculation_is_greedy_without(models, arch):
    lm = models(arch)
    a, b, c = pattern(1), pattern(2), pattern(3)
    bias = lambda p: {t: 8.0 for t in p}  # noqa: E731 (the output keeps to the pattern: drafts are found)
    plan = [
        (0, a * 5, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logit_bias=bias(a))),
        (0, b * 2 + [7, 9], SamplingParams(temperature=0, max_tokens=25, ignore_eos=True, speculative="off")),
        (3, c * 4, SamplingParams(temperature=0, max_tokens=13, ignore_eos=True, logit_bias=bias(c),
                                  logits_processor=no_triples)),
        (5, a * 3 + c, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, logit_bias=bias(a + c),
                                      stop_token_ids=[c[2]], stop=[lm.tokenizer.decode([a[4], a[5]])])),
    ]
    plain, _ = run(lm, "off", plan)
    spec_out, sched = run(lm, "ngram", plan)
    assert [tokens(o) for o in spec_out] == [tokens(o) for o in plain]
    assert all(o[-1] is None for o in spec_out)  # each request ended, once
    assert sched.drafted_tokens > 0
    if arch not in ("qwen35", "qwen35moe"):  # random hybrids rarely repeat: there, rollbacks are what is tested
        assert sched.accepted_tokens > 0
    last = [s for s in spec_out[1] if s is not None][-1]
    assert last.drafted_tokens == 0  # the request that turned it off drafted nothing


@pytest.mark.parametrize("arch", ["qwen3", "qwen35"])
def test_penalties_logprobs_and_cancellation_hold_with_drafts(models, arch):
    """Presence and frequency penalties (counted token by token through a verified run) and
    logprobs (each from the logits its token was taken from) as without drafts; a request
    cancelled mid-way ends at the next step with its slot given back."""
    lm = models(arch)
    a = pattern(1)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, logit_bias={t: 8.0 for t in a},
                            presence_penalty=0.3, frequency_penalty=0.2, logprobs=2)
    plan = [(0, a * 5, params)]
    plain, _ = run(lm, "off", plan)
    got, sched = run(lm, "ngram", plan)
    with_lp = lambda items: [(s.token_id, s.text, s.logprob, s.top_logprobs) for s in items if s is not None]  # noqa: E731
    assert len(with_lp(got[0])) == 30
    for x, y in zip(with_lp(got[0]), with_lp(plain[0])):
        assert x[:2] == y[:2] and x[2] == pytest.approx(y[2], abs=1e-4)
        assert [t for t, _ in x[3]] == [t for t, _ in y[3]]
    assert sched.drafted_tokens > 0
    sched = Scheduler(lm, spec=SpecSettings(mode="ngram"))
    out = []
    req = Request(a * 5, [SamplingParams(temperature=0, max_tokens=200, ignore_eos=True,
                                         logit_bias={t: 8.0 for t in a})], out.append)
    sched.add(req)
    for _ in range(4):
        sched.step()
    req.cancel.set()
    sched.step()
    assert out[-1] is None and out[-2].finish_reason == "cancelled" and not sched.busy
    sched.close()
    assert lm.cache.free_slots == lm.cache.n_seq


def test_rollbacks_on_the_hybrid_model(models):
    """Qwen3.5's recurrent states cannot be cut back: a rejected draft restores the state
    from before the step and feeds the accepted tokens again with the next one."""
    lm = models("qwen35")
    a = pattern(1)
    plan = [(0, a * 5, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logit_bias={t: 8.0 for t in a}))]
    plain, _ = run(lm, "off", plan)
    spec_out, sched = run(lm, "ngram", plan)
    assert tokens(spec_out[0]) == tokens(plain[0])
    assert sched.drafted_tokens > sched.accepted_tokens  # rejections happened


def test_a_restored_recurrent_state_equals_a_fresh_prefill(models):
    lm = models("qwen35")
    cache = lm.cache
    ids, drafts, more = pattern(4, 20), pattern(5, 4), pattern(6, 3)
    a, cold = cache.allocate(), cache.allocate()
    try:
        lm.forward(Batch.of([(a, ids, 0)]))
        snap = cache.snapshot(a)
        lm.forward(Batch.of([(a, drafts, 20)], want="all"))  # a verification step whose drafts all fail
        cache.restore(a, snap)
        assert cache.lengths[a] == 20
        got = lm.forward(Batch.of([(a, more, 20)], want="all"))
        lm.forward(Batch.of([(cold, ids, 0)]))
        assert torch.equal(got, lm.forward(Batch.of([(cold, more, 20)], want="all")))
    finally:
        cache.free(a)
        cache.free(cold)


def test_the_same_prompt_again_after_an_answer_past_the_ring(models):
    """Issue 39's 500 (aider sent its prompt again after a long answer, on Gemma 3): the
    second request goes on from the prompt's checkpoint in the slot the answer ran past its
    sliding rings (window 8 + a 16-token batch), and its rejected drafts are cut back there
    exactly. Before, restoring the checkpoint kept the slot's far-off 'lost' mark, so no
    rollback was exact and the rollback restored a snapshot nobody had taken."""
    lm = models("gemma3")
    ring = load_model(lm.gguf.path, device="cpu", n_seq=2, max_batch=16)
    assert ring.cache.min_ring == 24 and ring.cache.checkpoint_budget > 0
    a = pattern(1)

    def off_the_cycle(generated, logits):  # every seventh token leaves the cycle the drafts predict
        if len(generated) % 7 == 6:
            logits = logits.clone()
            logits[generated[-6]] = float("-inf")
        return logits

    prompt = a * 4
    params = SamplingParams(temperature=0, max_tokens=90, ignore_eos=True, logit_bias={t: 6.0 for t in a},
                            logits_processor=off_the_cycle)
    plain, _ = run(ring, "off", [(0, prompt, params)])
    sched = Scheduler(ring, spec=SpecSettings(mode="ngram"))
    try:
        outs = [[], []]
        for out in outs:  # one after the other, in one scheduler: the second reuses the first's slot
            sched.add(Request(list(prompt), [params], out.append))
            while sched.busy:
                sched.step()
        hits = ring.cache.checkpoint_stats.hits
    finally:
        sched.close()
    assert all(not isinstance(x, Exception) for o in outs for x in o)
    assert [tokens(o) for o in outs] == [tokens(plain[0])] * 2
    assert sched.drafted_tokens > sched.accepted_tokens > 0 and hits > 0


CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32, 8: 26.12}  # 0.1% critical values


def same_distribution(xs, ys) -> bool:
    """Two samples from one distribution, by a chi-square test of homogeneity (categories
    expected fewer than 5 times merged) below its 0.1% critical value."""
    cats, rare = [], []
    for t in sorted(set(xs) | set(ys), key=str):
        (cats if (xs.count(t) + ys.count(t)) / 2 >= 5 else rare).append(t)
    counts = [(xs.count(t), ys.count(t)) for t in cats]
    if rare:
        counts.append((sum(xs.count(t) for t in rare), sum(ys.count(t) for t in rare)))
    stat = sum((x - (x + y) / 2) ** 2 / ((x + y) / 2) + (y - (x + y) / 2) ** 2 / ((x + y) / 2) for x, y in counts)
    assert len(counts) >= 3
    return stat < CHI2_999[len(counts) - 1]


def test_sampling_keeps_its_distribution(models):
    """Over 240 seeds, the second and third sampled tokens (the first that verified drafts
    decide): a draft holds where the sequence's own draw is the draft, so each seed draws
    the same tokens with drafts as without and the histograms match (chi-square below its
    0.1% critical value); a rule that kept drafts more often than that would be caught."""
    lm = models("qwen3")
    pat = [63, 113]  # this tiny model's two likeliest tokens after the pattern: the drafts are often right

    def draws(mode):
        seen, drafted = [], 0
        for batch in range(60):
            plan = [(0, pat * 8, SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True,
                                                logit_bias={t: 10.0 for t in pat}, seed=1000 * batch + i))
                    for i in range(4)]
            outs, sched = run(lm, mode, plan)
            drafted += sched.accepted_tokens
            seen += [tuple([s.token_id for s in o if s is not None][1:3]) for o in outs]
        return seen, drafted

    plain, _ = draws("off")
    spec_, accepted = draws("ngram")
    assert accepted > 50  # drafts decided many tokens...
    assert spec_ == plain and same_distribution(plain, spec_)  # ...each the draw it would have been
    # a draft kept too often: every third second token made 113, the rarer of the two here (a skew towards
    # the likelier one moves its share less, within the 240 draws' noise for some seeds)
    skewed = [(x, pat[1]) if i % 3 == 0 else (x, y) for i, (x, y) in enumerate(plain)]
    assert not same_distribution(plain, skewed)


def test_seeded_speculative_runs_reproduce(models):
    lm = models("qwen3")
    a = pattern(1)
    plan = [(0, a * 5, SamplingParams(temperature=0.8, max_tokens=30, ignore_eos=True, seed=5,
                                      logit_bias={t: 6.0 for t in a}))]
    first, sched = run(lm, "ngram", plan)
    plain, _ = run(lm, "off", plan)
    assert tokens(first[0]) == tokens(plain[0]) and sched.accepted_tokens > 0  # the same draws with drafts


def test_the_draft_length_adapts_and_pauses():
    from gguf_serve.engine.speculative import Drafting

    d = Drafting(SpecSettings(first_draft=2, max_draft=8, pause_after_misses=2, pause_steps=3), [1, 2, 3, 1, 2])
    assert d.propose(10) == [3, 1]  # "1 2" occurred before, followed by 3 1
    d.verified(2, 2)
    assert d.k == 4
    d.verified(4, 1)
    assert d.k == 2
    d.verified(2, 0)
    d.verified(1, 0)  # the second miss in a row: a pause of 3 steps
    assert [d.propose(10) for _ in range(3)] == [[], [], []] and d.propose(10) != []
    assert (d.drafted, d.accepted) == (9, 3)


def test_ngram_lookup_proposes_what_followed_the_longest_match():
    ix = NgramIndex(2, 3)
    ix.extend([5, 6, 7, 8, 9, 6, 7, 1, 5, 6, 7])
    # the bigram "6 7" last occurred followed by 1, the trigram "5 6 7" by 8: the longer match wins
    assert ix.propose(3) == [8, 9, 6]
    ix2 = NgramIndex(2, 3)
    ix2.extend([9, 6, 7, 1, 4, 6, 7])
    assert ix2.propose(2) == [1, 4]
    assert NgramIndex(2, 3).propose(4) == []


def test_a_drafter_the_model_lacks_is_refused(models):
    lm = models("qwen3")
    for ok in (None, "auto", "off", "ngram"):
        check_speculative(lm, ok)
    with pytest.raises(SpeculationError, match="'mtp' is not available for this model"):
        check_speculative(lm, "mtp")
    with pytest.raises(SpeculationError, match="not known"):
        SpecSettings(mode="magic")


# ----------------------------------------------------------------- multi-token prediction

def mtp_reference(dense, tokens: list[int], k: int) -> list[int]:
    """The drafts a Qwen3.5 MTP head makes, computed densely with transformers' decoder
    layer: the trunk over every token but the last (its outputs after the final norm),
    then the head at the last position (that token, the trunk's output before it), each
    further draft from the last one and the head's own output."""
    import copy

    from transformers.models.qwen3_5 import modeling_qwen3_5 as Q

    cfg = copy.deepcopy(dense.config)
    cfg.layer_types = list(cfg.layer_types) + ["full_attention"]
    layer = Q.Qwen3_5DecoderLayer(cfg, cfg.num_hidden_layers).eval()
    w = dense.mtp
    layer.load_state_dict({n[len("mtp.layers.0."):]: v for n, v in w.items() if n.startswith("mtp.layers.0.")})

    def rms(x, weight):  # Qwen3.5's norms scale by 1 + w
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps) * (1.0 + weight)

    with torch.no_grad():
        h = dense.model(input_ids=torch.tensor([tokens[:-1]])).last_hidden_state[0]
        toks, prev = list(tokens), torch.cat([torch.zeros(1, h.shape[1]), h])
        drafts = []
        for _ in range(k):
            e = dense.model.embed_tokens(torch.tensor(toks))
            x = torch.cat([rms(e, w["mtp.pre_fc_norm_embedding.weight"]),
                           rms(prev, w["mtp.pre_fc_norm_hidden.weight"])], -1) @ w["mtp.fc.weight"].T
            pos = torch.arange(len(toks))[None]
            out = rms(layer(x[None], position_embeddings=dense.model.rotary_emb(x[None], pos), position_ids=pos)[0],
                      w["mtp.norm.weight"])
            drafts.append(int(dense.lm_head(out[-1]).argmax()))
            toks, prev = toks + [drafts[-1]], torch.cat([prev, out[-1:]])
        return drafts


@pytest.fixture(scope="module")
def mtp_model(tmp_path_factory, models):
    from tiny_models import mtp_weights

    s = spec("qwen35")
    path = tmp_path_factory.mktemp("mtp") / "qwen35-mtp.gguf"
    dense = write_gguf(s, random_model(s, seed=4), path, "F32", mtp=mtp_weights(s.config))
    return load_model(str(path), device="cpu", n_seq=4), dense


def test_the_mtp_head_drafts_what_a_dense_reference_computes(mtp_model):
    """Step after step (after rejections and the hybrid's rollbacks, whose accepted tokens
    the head's cache must catch up with), the drafts waiting for the next step are the
    dense reference's for the sequence so far."""
    lm, dense = mtp_model
    assert lm.model.mtp is not None and check_speculative(lm, "mtp") is None
    prompt = pattern(1) * 3
    sched = Scheduler(lm, spec=SpecSettings(mode="mtp", pause_after_misses=1000))  # a random head: drafts fail
    out = []
    sched.add(Request(prompt, [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)], out.append))
    checked = 0
    try:
        while sched.busy:
            sched.step()
            for r in sched.running:
                c = r.choices[0]
                if c.drafting.pending:
                    assert c.drafting.pending == mtp_reference(dense, prompt + c.generated, len(c.drafting.pending))
                    checked += 1
    finally:
        sched.close()
    assert checked >= 8 and sched.drafted_tokens > 0


def three_requests(bias: float, third: str) -> list:
    """A biased request, a plain one joining at step 2, one with its own `speculative` at step 4."""
    a, b = pattern(1), pattern(2)
    return [(0, a * 5, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, logit_bias={t: bias for t in a})),
            (2, b * 3, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)),
            (4, a + b, SamplingParams(temperature=0, max_tokens=15, ignore_eos=True, speculative=third))]


def test_greedy_with_mtp_drafts_is_greedy_without(mtp_model):
    lm, _ = mtp_model
    plan = three_requests(8.0, "ngram")
    plain, _ = run(lm, "off", plan)
    got, sched = run(lm, "mtp", plan)
    assert [tokens(o) for o in got] == [tokens(o) for o in plain]
    assert sched.drafted_tokens > 0
    assert [s for s in got[0] if s is not None][-1].drafted_tokens > 0


def test_mtp_on_a_file_without_heads_is_refused(models):
    lm = models("qwen35")
    with pytest.raises(SpeculationError, match="'mtp' is not available"):
        Scheduler(lm, spec=SpecSettings(mode="mtp"))


# ------------------------------------------------------------------------ draft models

@pytest.fixture(scope="module")
def draft_files(tmp_path_factory, models):
    """A tiny Qwen3 target, a smaller-seeded draft of the same vocabulary, and one of another."""
    folder = tmp_path_factory.mktemp("draft")
    out = {}
    for name, seed, vocab in (("target", 2, None), ("draft", 7, None), ("other", 7, 300)):
        s = spec("qwen3")
        if vocab:
            s.config.vocab_size = vocab
        write_gguf(s, random_model(s, seed=seed), folder / f"{name}.gguf", "F32")
        out[name] = str(folder / f"{name}.gguf")
    return out


@pytest.mark.parametrize("drafter", ["target", "draft"])
def test_greedy_with_a_draft_model_is_greedy_without(draft_files, drafter):
    """The target itself as its draft: every draft holds (exact arithmetic); another model:
    drafts come and go. Either way the tokens are the target's."""
    lm = load_model(draft_files["target"], device="cpu", n_seq=4, config=None)
    lm.draft = load_draft(lm, draft_files[drafter])
    plan = three_requests(3.0, "off")
    plain, _ = run(lm, "off", plan)
    got, sched = run(lm, "draft", plan)
    assert [tokens(o) for o in got] == [tokens(o) for o in plain]
    assert sched.drafted_tokens > 10
    if drafter == "target":
        assert sched.accepted_tokens == sched.drafted_tokens
    else:
        assert sched.accepted_tokens < sched.drafted_tokens
    assert lm.draft.cache.free_slots == lm.draft.cache.n_seq  # every draft slot given back


def test_a_draft_model_of_another_vocabulary_or_a_missing_file_is_refused(draft_files):
    from gguf_serve.engine.loader import DraftMismatch

    lm = load_model(draft_files["target"], device="cpu", n_seq=2)
    with pytest.raises(DraftMismatch, match="vocabulary is not the model's"):
        load_draft(lm, draft_files["other"])
    with pytest.raises(FileNotFoundError, match="no such GGUF file"):
        load_model(draft_files["target"], device="cpu", n_seq=2, config=EngineConfig(draft_model="/nowhere/x.gguf"))
    with pytest.raises(SpeculationError, match="'draft' is not available"):
        check_speculative(lm, "draft")


def test_a_grammar_mask_sees_each_verified_token(models):
    """A JSON schema's llguidance mask (stateful: it is fed each token the sequence takes)
    with drafts from a prompt that holds such objects: the same reply with and without."""
    import json

    from gguf_serve.engine.grammar import GrammarMask, json_grammar
    from gguf_serve.engine.tokenizer import encode

    lm = models("qwen3")
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "tag": {"enum": ["x", "yy"]}},
              "required": ["n", "tag"], "additionalProperties": False}
    prompt = encode(lm.tokenizer, '{"n": 12, "tag": "yy"}\n' * 4)
    grammar = json_grammar(schema)

    def plan():  # a fresh mask per run: it keeps the state of what its sequence took
        return [(0, prompt, SamplingParams(temperature=0, max_tokens=40,
                                           logits_processor=GrammarMask(lm, grammar)))]
    plain, _ = run(lm, "off", plan())
    got, sched = run(lm, "ngram", plan())
    assert tokens(got[0]) == tokens(plain[0])
    assert sched.drafted_tokens > 0
    json.loads("".join(s.text for s in got[0] if s is not None))
