"""Embedding and reranking files through the engine (engine.embed): each equal to
transformers' model with the file's pooling on tiny random files (Qwen3-Embedding-style,
EmbeddingGemma-style with its symmetric sliding window and dense projections, a
Qwen3-Reranker-style reranker), several inputs in one forward equal each alone, the
converter's own EmbeddingGemma file read as users have it, and bad files refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from converter import convert
from gguf_serve.engine import WeightError, load_model
from gguf_serve.gguf_io import GGUFReader
from gguf_serve.engine.embed import EmbeddingError, embed, rank
from helpers import copy_gguf
from tiny_models import YES_NO, tiny_embedding_model

RNG = np.random.default_rng(7)
INPUTS = [RNG.integers(0, 300, n).tolist() for n in (3, 17, 9, 30, 1)]


def reference(kind: str, dense, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        hidden = dense.model(torch.tensor([ids])).last_hidden_state[0]
        if kind == "qwen3-embedding":
            return F.normalize(hidden[-1], dim=-1)
        return F.normalize(dense.extras["dense_3.weight"] @ (dense.extras["dense_2.weight"] @ hidden.mean(0)), dim=-1)


@pytest.mark.parametrize("mix", ["F32", "Q8_0", "Q4_K_M"])
@pytest.mark.parametrize("kind", ["qwen3-embedding", "embeddinggemma"])
def test_embeddings_equal_transformers(tmp_path, kind, mix):
    """cosine >= 0.9999 at F32 to the dense model holding the file's weights (>= 0.999
    quantized: the activations' quantization is then the difference), inputs longer and
    shorter than the window."""
    path, dense = tiny_embedding_model(tmp_path, f"{kind}.gguf", kind, mix)
    lm = load_model(path, device="cpu", n_ctx=64, n_seq=3)
    assert lm.pooling == ("last" if kind == "qwen3-embedding" else "mean")
    assert lm.model.both_ways is (kind == "embeddinggemma")
    got = embed(lm, INPUTS)  # five inputs, three slots: two forwards
    for row, ids in zip(got, INPUTS):
        assert float(row.norm()) == pytest.approx(1.0, abs=1e-5)
        bound = 0.9999 if mix == "F32" else 0.999
        assert float(F.cosine_similarity(row, reference(kind, dense, ids), dim=0)) >= bound
    for i in (0, 3):  # in company or alone: the same vector
        alone = embed(lm, [INPUTS[i]])[0]
        if mix == "Q4_K_M" or (mix == "Q8_0" and lm.kernels.cpu.amx_types):
            # the first forward's 29 rows take the k-quant tiles, which sum in another order than one
            # sequence's rows (equal up to rounding: engine/test_cpu_rows.py), and a rounding can flip an
            # activation's 8-bit step in a later layer; where the CPU has AMX, the 29 rows are bfloat16
            # products against the one sequence's integer dots: within the quantized bound, as against
            # transformers
            assert float(F.cosine_similarity(alone, got[i], dim=0)) >= 0.999
        else:
            torch.testing.assert_close(alone, got[i], rtol=1e-4, atol=1e-5)


def test_rank_is_the_yes_probability(tmp_path):
    path, dense = tiny_embedding_model(tmp_path, "rr.gguf", "qwen3-reranker")
    lm = load_model(path, device="cpu", n_ctx=64, n_seq=2)
    assert lm.pooling == "rank"
    scores = rank(lm, INPUTS[:3])
    with torch.no_grad():
        expected = [float(torch.softmax(dense(torch.tensor([x])).logits[0, -1, list(YES_NO)], -1)[0])
                    for x in INPUTS[:3]]
    assert scores.tolist() == pytest.approx(expected, abs=1e-4)


def test_inputs_too_long_are_refused_with_their_index(tmp_path):
    path, _ = tiny_embedding_model(tmp_path, "g.gguf", "embeddinggemma")
    lm = load_model(path, device="cpu", n_ctx=64, n_seq=2, max_batch=32)
    with pytest.raises(EmbeddingError, match="is 40 tokens; one forward") as e:  # both ways: one forward
        embed(lm, [[1, 2], [3] * 40])
    assert e.value.index == 1
    path, _ = tiny_embedding_model(tmp_path, "q.gguf", "qwen3-embedding")
    lm = load_model(path, device="cpu", n_ctx=64, n_seq=2, max_batch=32)
    assert embed(lm, [[3] * 40]).shape == (1, 256)  # causal: chunked over forwards
    with pytest.raises(EmbeddingError, match="is 70 tokens; the context holds at most 64"):
        embed(lm, [[3] * 70])


def test_a_reranker_without_its_classifier_is_refused(tmp_path):
    path, _ = tiny_embedding_model(tmp_path, "rr.gguf", "qwen3-reranker")
    broken = copy_gguf(path, tmp_path / "no-cls.gguf", drop_tensor="cls.output.weight")
    with pytest.raises(WeightError, match="cls.output.weight"):  # the file's fault: kept on its entry by the server
        load_model(broken, device="cpu")


def test_the_converters_embeddinggemma_file(tmp_path):
    """llama.cpp's converter on an EmbeddingGemma checkpoint as sentence-transformers saves
    it (Gemma3TextModel, modules.json, mean pooling, 2_Dense and 3_Dense, with
    --sentence-transformers-dense-modules): gemma-embedding with its pooling type and
    dense tensors, read by the engine as the dense model computes."""
    from safetensors.torch import save_file

    _, dense = tiny_embedding_model(tmp_path, "ours.gguf", "embeddinggemma")
    hf = tmp_path / "hf"
    encoder = dense.model
    encoder.config.architectures = ["Gemma3TextModel"]
    encoder.save_pretrained(hf)
    n_vocab, h = encoder.config.vocab_size, encoder.config.hidden_size
    (hf / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {f"t{i}": i for i in range(n_vocab)}},
                                                   "added_tokens": []}))
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
               {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"},
               {"idx": 4, "name": "4", "path": "4_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (hf / "modules.json").write_text(json.dumps(modules))
    (hf / "1_Pooling").mkdir()
    (hf / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": h,
                                                               "pooling_mode_mean_tokens": True}))
    for folder, name in (("2_Dense", "dense_2.weight"), ("3_Dense", "dense_3.weight")):
        w = dense.extras[name]
        (hf / folder).mkdir()
        (hf / folder / "config.json").write_text(json.dumps({"in_features": w.shape[1], "out_features": w.shape[0],
                                                             "bias": False}))
        save_file({"linear.weight": w.contiguous()}, str(hf / folder / "model.safetensors"))
    converted = convert(None, tmp_path, "f32", ("--sentence-transformers-dense-modules",))
    ours = GGUFReader(str(tmp_path / "ours.gguf"))  # the vocabulary (the converter's step for it is skipped)
    path = copy_gguf(converted, tmp_path / "with-vocab.gguf",
                     metadata={k: v for k, v in ours.metadata.items() if k.startswith("tokenizer.")})
    lm = load_model(path, device="cpu", n_ctx=64, n_seq=3)
    assert lm.gguf.architecture == "gemma-embedding" and lm.pooling == "mean" and len(lm.model.pool.dense) == 2
    for row, ids in zip(embed(lm, INPUTS), INPUTS):
        assert float(F.cosine_similarity(row, reference("embeddinggemma", dense, ids), dim=0)) >= 0.9999
