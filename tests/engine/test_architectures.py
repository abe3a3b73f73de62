"""Per architecture: a tiny random transformers model written as GGUF the way llama.cpp
does; the engine's own forward pass (over the file's packed tensors, in the file's
layout) must equal the dense transformers model holding the same dequantized weights:
a whole prompt, step-by-step decode, a prompt processed in chunks, and several
sequences of different lengths decoded together in one batch, joining and leaving
between steps, each equal to the same sequence alone. Also transformers' own GGUF
loader where it reads the file."""

import os

import pytest
import torch

from gguf_serve.engine import load_model
from gguf_serve.engine.models import UnsupportedArchitecture, architectures, gpt_oss
from gguf_serve.engine.batch import Batch
from gguf_serve.engine.modules import GgufEmbedding, GgufLinear, WeightError
from gguf_serve.gguf_io import GGUFWriter

from converter import assert_same_file, convert
from helpers import copy_gguf, no_llama_cpp
from oracles import llama_cpp_logits, prompt_logits
from tiny_models import mtp_weights, random_model, spec, write_gguf

ARCHS = ["llama", "qwen2", "qwen3", "qwen3moe", "qwen35", "qwen35moe", "gemma3", "phi3", "smollm3", "olmo2", "olmo3",
         "mistral3", "lfm2", "glm4moe", "granitehybrid", "granite", "granitemoe", "gpt-oss", "gemma4", "gemma4moe"]
MIXES = ["F32", "F16", "Q8_0", "K"]
ROUTED = ("qwen3moe", "qwen35moe", "glm4moe", "granitehybrid", "granitemoe", "gpt-oss", "gemma4moe")  # architectures with routed experts
TOL = 2e-4  # float32 everywhere; differences come from summation order (chunked matmuls, SDPA)


@pytest.fixture(scope="module", autouse=True)
def exact_kernels():
    """These tests check the forward pass with exact arithmetic: the reference kernels
    and torch ops, not the native ones that quantize activations."""
    from gguf_serve.engine import kernels

    os.environ[kernels.ENV_OVERRIDE] = "reference"
    yield
    del os.environ[kernels.ENV_OVERRIDE]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cache = {}

    def build(arch, mix):
        """`qwen35+mtp`: qwen35's weights with a multi-token-prediction block as the converter keeps it."""
        if (arch, mix) not in cache:
            base, _, extra = arch.partition("+")
            s = spec(base)
            model = random_model(s, seed=ARCHS.index(base))
            path = tmp_path_factory.mktemp(f"{base}-{mix}") / f"tiny-{arch}-{mix}.gguf"
            dense = write_gguf(s, model, path, mix, mtp=mtp_weights(s.config) if extra == "mtp" else None)
            cache[(arch, mix)] = (str(path), dense)
        return cache[(arch, mix)]
    return build


def dense_logits(dense, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return dense(input_ids=ids[None]).logits[0]


@pytest.mark.parametrize("mix", MIXES)
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_equal_dense_transformers(tiny, arch, mix):
    path, dense = tiny(arch, mix)
    lm = load_model(path, device="cpu")
    ids = torch.randint(0, 250, (20,), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(prompt_logits(lm, ids.tolist()), dense_logits(dense, ids), rtol=TOL, atol=TOL)


@pytest.mark.parametrize("arch", ARCHS)
def test_step_by_step_decode_equals_dense(tiny, arch):
    path, dense = tiny(arch, "K")
    lm = load_model(path, device="cpu")
    ids = torch.randint(0, 250, (16,), generator=torch.Generator().manual_seed(1))
    ref = dense_logits(dense, ids)
    slot = lm.cache.allocate()
    first = lm.forward(Batch.of([(slot, ids[:10].tolist(), 0)]))
    torch.testing.assert_close(first[0], ref[9], rtol=TOL, atol=TOL)
    for t in range(10, 16):
        out = lm.forward(Batch.of([(slot, [int(ids[t])], t)]))
        torch.testing.assert_close(out[0], ref[t], rtol=TOL, atol=TOL)
    assert lm.cache.lengths[slot] == 16


@pytest.mark.parametrize("arch", ["gemma3", "qwen35", "llama", "olmo3"])
def test_long_prompt_in_chunks_equals_dense(tiny, arch):
    """max_batch 32: a 150-token prompt runs in five chunks; Gemma's window of 8 then
    wraps its ring of 40 cells several times; Qwen3.5 carries its recurrent state across
    chunks (and with the default max_batch its chunked delta rule takes >64 tokens)."""
    path, dense = tiny(arch, "Q8_0")
    ids = torch.randint(0, 250, (150,), generator=torch.Generator().manual_seed(2))
    ref = dense_logits(dense, ids)
    for max_batch in (32, 512):
        lm = load_model(path, device="cpu", max_batch=max_batch)
        torch.testing.assert_close(prompt_logits(lm, ids.tolist()), ref, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("arch", ARCHS)
def test_sequences_batched_together_equal_each_alone(tiny, arch):
    """Three sequences in three slots: they join at different steps with prompts of
    different lengths, decode in one batch at different positions, and leave when done
    (a fourth then takes a freed slot). Every logits row equals the dense model's at
    that position, and the same sequence run alone."""
    path, dense = tiny(arch, "Q8_0")
    lm = load_model(path, device="cpu", n_seq=3)
    g = torch.Generator().manual_seed(3)
    seqs = [torch.randint(0, 250, (n,), generator=g) for n in (30, 12, 24, 9)]
    prompt = [11, 3, 20, 4]
    joins = [0, 2, 2, 14]  # step at which each sequence arrives
    refs = [dense_logits(dense, s) for s in seqs]
    alone = [prompt_logits(lm, s.tolist()) for s in seqs]
    slot, pos = {}, {}
    for step in range(60):
        items, who = [], []
        for i, s in enumerate(seqs):
            if step == joins[i]:
                slot[i], pos[i] = lm.cache.allocate(), 0
                items.append((slot[i], s[:prompt[i]].tolist(), 0))
                who.append(i)
            elif i in pos and 0 < pos[i] < len(s):
                items.append((slot[i], [int(s[pos[i]])], pos[i]))
                who.append(i)
        if not items:
            continue
        out = lm.forward(Batch.of(items))
        for row, i in enumerate(who):
            at = items[row][2] + len(items[row][1]) - 1
            torch.testing.assert_close(out[row], refs[i][at], rtol=TOL, atol=TOL)
            torch.testing.assert_close(out[row], alone[i][at], rtol=5e-5, atol=5e-5)  # other matmul shapes
            pos[i] = at + 1
            if pos[i] == len(seqs[i]):
                lm.cache.free(slot[i])
    assert all(pos[i] == len(s) for i, s in enumerate(seqs))
    assert lm.cache.free_slots == 3


@pytest.mark.parametrize("arch", ARCHS)
def test_bfloat16_forward_stays_close(tiny, arch, monkeypatch):
    """The path other devices take (CUDA runs bfloat16): the torch ops and reference
    kernels in bfloat16, KV cache included, stay within bfloat16's rounding of the
    float32 logits (relative to their scale). With random routers a rounding can flip an
    expert choice, so for the MoE models only a finite, same-shaped result is required."""
    path, dense = tiny(arch, "Q8_0")
    ids = torch.randint(0, 250, (12,), generator=torch.Generator().manual_seed(6)).tolist()
    monkeypatch.delenv("GGUF_SERVE_CACHE_TYPE_K")  # the suite's float32 caches (conftest): the dtype's here
    monkeypatch.delenv("GGUF_SERVE_CACHE_TYPE_V")
    lm = load_model(path, device="cpu", dtype=torch.bfloat16)
    assert all(k.dtype == torch.bfloat16 for k in lm.cache.k if k is not None)  # attention layers' caches
    slot = lm.cache.allocate()
    first = lm.forward(Batch.of([(slot, ids[:8], 0)], want="all"))
    rest = torch.cat([lm.forward(Batch.of([(slot, [t], 8 + i)])) for i, t in enumerate(ids[8:])])
    ours = torch.cat([first, rest])
    ref = dense_logits(dense, torch.tensor(ids))
    assert ours.dtype == torch.float32
    assert ours.shape == ref.shape and torch.isfinite(ours).all()
    if arch not in ROUTED:
        err = (ours - ref).abs().max() / ref.abs().max()
        assert err < 0.08, float(err)


# transformers' GGUF loader ignores attention.key_length (our tiny qwen3 has head_dim 96,
# not hidden/heads) and expert_feed_forward_length (qwen3moe), and has no Gemma 3 / Qwen3.5
# path for these files, so those are checked against the dense model only.
TRANSFORMERS_GGUF = ["llama", "qwen2", "phi3"]


@pytest.mark.parametrize("arch", TRANSFORMERS_GGUF)
def test_logits_equal_transformers_gguf_loader(tiny, arch):
    from transformers import AutoModelForCausalLM

    path, _ = tiny(arch, "Q8_0")
    ref = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                               dtype=torch.float32).eval()
    lm = load_model(path, device="cpu")
    ids = torch.randint(0, 250, (12,), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(prompt_logits(lm, ids.tolist()), dense_logits(ref, ids), rtol=TOL, atol=TOL)


@pytest.mark.parametrize("mix", ["F32", "K"])
def test_multi_token_prediction_block_is_not_a_trunk_layer(tiny, mix):
    """The converter keeps Qwen3.5's MTP block by default, counted in block_count: the
    trunk is block_count - nextn_predict_layers layers, so the same weights with and
    without the block give the same logits (and transformers' dense model's)."""
    with_mtp, dense = tiny("qwen35+mtp", mix)
    without, _ = tiny("qwen35", mix)
    lm, plain = load_model(with_mtp, device="cpu"), load_model(without, device="cpu")
    assert (lm.params.n_layers, lm.params.n_mtp_layers) == (4, 1)
    assert len(lm.model.layers) == 4
    ids = torch.randint(0, 250, (12,), generator=torch.Generator().manual_seed(5))
    ours = prompt_logits(lm, ids.tolist())
    torch.testing.assert_close(ours, prompt_logits(plain, ids.tolist()), rtol=0, atol=0)
    torch.testing.assert_close(ours, dense_logits(dense, ids), rtol=TOL, atol=TOL)


# phi3: these tiny files carry a byte-level BPE vocabulary, where the converter writes
# Phi-3's SentencePiece one, and llama.cpp refuses that pairing when loading the vocabulary
@pytest.mark.parametrize("arch", [a for a in ARCHS if a != "phi3"] + ["qwen35+mtp"])
def test_llama_cpp_reads_each_file_and_computes_the_same_logits(tiny, arch, monkeypatch):
    """The second oracle: llama.cpp itself loads every architecture's tiny file (F32) and
    its logits for a prompt equal ours (within its float16 KV cache's rounding), so the
    files hold the names, keys and layouts llama.cpp's converter writes. gpt-oss with
    llama.cpp's rounded YaRN range (ours follows the model's training, see gpt_oss.py)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        no_llama_cpp()
    path, _ = tiny(arch, "F32")
    monkeypatch.setattr(gpt_oss, "YARN_TRUNCATE", True)
    lm = load_model(path, device="cpu")
    ids = torch.randint(0, 250, (12,), generator=torch.Generator().manual_seed(8)).tolist()
    ours = prompt_logits(lm, ids)
    ref = llama_cpp_logits(path, ids)
    assert ours.shape == ref.shape
    assert float((ours - ref).abs().max() / ref.abs().max()) < 3e-3
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


# the architectures whose test files are held to llama.cpp's converter byte for byte
CONVERTED = ["mistral3", "lfm2", "glm4moe", "granitehybrid", "granite", "granitemoe", "gpt-oss", "gemma4", "gemma4moe"]


@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
@pytest.mark.parametrize("arch", CONVERTED)
def test_writer_is_the_converter(tmp_path, arch, outtype):
    """llama.cpp's convert_hf_to_gguf.py on the same tiny transformers model writes the
    keys and tensors our test writer writes: the names, transforms and metadata the
    engine reads are the ones users' files have."""
    s = spec(arch)
    model = random_model(s, seed=ARCHS.index(arch))
    ours = tmp_path / "ours.gguf"
    write_gguf(s, model, ours, outtype.upper())
    assert_same_file(str(ours), convert(model, tmp_path, outtype))


def test_glm4moe_expert_groups_equal_dense(tmp_path):
    """Group-limited routing (DeepSeek-style: experts only from the best groups, each group
    ranked by its two best choices), which GLM-4.5's files turn off with one group."""
    s = spec("glm4moe")
    s.config.n_group, s.config.topk_group = 2, 1
    path = tmp_path / "tiny-glm4moe-groups.gguf"
    dense = write_gguf(s, random_model(s, seed=5), path, "F32")
    lm = load_model(str(path), device="cpu")
    assert lm.model.layers[1].mlp.groups == 2
    ids = torch.randint(0, 250, (20,), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(prompt_logits(lm, ids.tolist()), dense_logits(dense, ids), rtol=TOL, atol=TOL)


@pytest.mark.parametrize("arch,drop", [("mistral3", "blk.0.attn_q.weight"), ("lfm2", "blk.0.shortconv.conv.weight"),
                                       ("glm4moe", "blk.1.exp_probs_b.bias"), ("granitehybrid", "blk.0.ssm_a"),
                                       ("gpt-oss", "blk.1.attn_sinks.weight"), ("gpt-oss", "blk.0.ffn_up_exps.bias"),
                                       ("gpt-oss", "blk.0.ffn_gate_inp.bias"), ("gemma4", "per_layer_token_embd.weight"),
                                       ("gemma4", "blk.1.attn_k_norm.weight"), ("gemma4moe", "blk.2.ffn_down_exps.scale")])
def test_a_missing_tensor_is_refused_naming_it(tiny, tmp_path, arch, drop):
    """The family's file less one tensor: the load stops with one line naming the file and the tensor."""
    path, _ = tiny(arch, "Q8_0")
    broken = copy_gguf(path, tmp_path / f"{arch}-without-a-tensor.gguf", drop_tensor=drop)
    with pytest.raises(WeightError, match=f"{broken}: no tensor '{drop}'"):
        load_model(broken, device="cpu")


def test_mismatched_metadata_is_refused_naming_the_key(tmp_path):
    """An LFM2 file whose per-layer key/value head list does not cover its layers."""
    s = spec("lfm2")
    path = tmp_path / "tiny-lfm2.gguf"
    write_gguf(s, random_model(s), path, "Q8_0")
    broken = copy_gguf(path, tmp_path / "lfm2-short-list.gguf", metadata={"lfm2.attention.head_count_kv": [0, 0, 2]})
    with pytest.raises(ValueError, match="lfm2.attention.head_count_kv has 3 entries for 4 layers"):
        load_model(broken, device="cpu")


def test_tied_head_shares_the_embedding_bytes(tiny):
    path, _ = tiny("gemma3", "K")
    lm = load_model(path, device="cpu")
    assert isinstance(lm.model.embed, GgufEmbedding) and isinstance(lm.model.head, GgufLinear)
    assert lm.model.head.packed.data_ptr() == lm.model.embed.packed.data_ptr()
    assert "output.weight" not in lm.gguf.tensors


def _packed(model):
    """Every packed weight of the model (by walking its layers' attributes)."""
    seen, out = set(), []

    def walk(obj, depth=0):
        if id(obj) in seen or depth > 8:
            return
        seen.add(id(obj))
        if isinstance(obj, (GgufLinear, GgufEmbedding)):
            out.append(obj)
        elif isinstance(obj, list):
            for x in obj:
                walk(x, depth + 1)
        elif hasattr(obj, "__dict__") and not isinstance(obj, torch.Tensor):
            for x in vars(obj).values():
                walk(x, depth + 1)
    walk(model)
    return out


def test_packed_layers_are_views_of_the_file_never_dequantized_at_load(tiny, monkeypatch):
    import gguf_serve.engine.kernels.reference as ref

    path, _ = tiny("llama", "K")
    calls = []
    monkeypatch.setattr(ref, "dequantize_rows", lambda *a, **k: calls.append(a) or (_ for _ in ()).throw(
        AssertionError("dequantized at load")))
    lm = load_model(path, device="cpu")
    assert calls == []
    file_views = {t.data.ctypes.data for t in lm.gguf.tensors.values()}
    packed = _packed(lm.model)
    assert len(packed) == 2 * 7 + 2  # 7 matrices per layer, the embedding and the output head
    for m in packed:
        assert m.packed.dtype == torch.uint8
        assert m.packed.data_ptr() in file_views, m.name  # a view of the map, not a copy


def test_unsupported_architecture_is_a_clear_error(tmp_path):
    path = tmp_path / "mamba.gguf"
    with GGUFWriter(path) as w:
        w.add("general.architecture", "mamba")
    with pytest.raises(UnsupportedArchitecture, match="architecture 'mamba' is not supported; supported: ") as e:
        load_model(path, device="cpu")
    assert str(e.value).endswith("supported: " + ", ".join(sorted(architectures())))  # every one, in order
    assert set(architectures()) >= {"llama", "qwen2", "qwen3", "gemma3", "phi3"}


@pytest.mark.parametrize("params", [
    {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 32768},
    {"rope_type": "yarn", "rope_theta": 5e5, "factor": 8.0, "original_max_position_embeddings": 8192,
     "beta_fast": 16, "beta_slow": 2},
    {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0},
])
def test_rotary_frequencies_equal_transformers(params):
    """YaRN and linear scaling (the kinds GGUF metadata names) as transformers computes them."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from gguf_serve.engine.models.layers import Rope, RopeScaling

    hf = LlamaConfig(hidden_size=1024, num_attention_heads=8, head_dim=128, max_position_embeddings=131072,
                     rope_parameters=dict(params))
    inv, attention = ROPE_INIT_FUNCTIONS[params["rope_type"]](hf, "cpu")
    scaling = RopeScaling(params["rope_type"], params["factor"], params.get("original_max_position_embeddings", 0),
                          beta_fast=params.get("beta_fast", 32), beta_slow=params.get("beta_slow", 1))
    ours = Rope.build(params["rope_theta"], 128, scaling, context_length=131072)
    torch.testing.assert_close(ours.inv_freq, inv.float(), rtol=1e-6, atol=0)
    assert ours.scaling == pytest.approx(attention)
