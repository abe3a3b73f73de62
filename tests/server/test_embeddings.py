"""/v1/embeddings and /v1/rerank against a real server, on tiny random files written as
llama.cpp's converter writes them: Qwen3-Embedding-style (last token, EOS appended),
EmbeddingGemma-style (both ways, a symmetric sliding window, mean pooling, the dense
projections) and a Qwen3-Reranker-style reranker, each equal to transformers' model with
the file's pooling (the `openai` client and LangChain's OpenAIEmbeddings as clients),
and every bad input a 400 naming it."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest
import torch
import torch.nn.functional as F

from converter import convert_with_vocab
from gguf_serve.engine import encode, load_model
from gguf_serve.engine.embed import embed, rank
from gguf_serve.server.embeddings.serving import _rerank_inputs
from server_harness import THINKING_TEMPLATE, server
from tiny_bert import tiny_bert
from tiny_models import YES_NO, tiny_chat_model, tiny_embedding_model
from tiny_xlmr import tiny_xlmr

TEXTS = ["hello world", "the dog ran far away from the world", "a", "world " * 10]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("embed")
    out = {kind: tiny_embedding_model(d, f"{kind}.gguf", kind, seed=i)
           for i, kind in enumerate(("qwen3-embedding", "embeddinggemma", "qwen3-reranker"))}
    tiny_chat_model(d, "chat.gguf", 5, THINKING_TEMPLATE, think=True)
    return d, out


@pytest.fixture(scope="module")
def base(files):
    with server(str(files[0]), "--max-loaded", "4", "--ctx-size", "128", "--parallel", "4") as b:
        yield b


@pytest.fixture(scope="module")
def client(base):
    return openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0)


def ids_of(base, model, text) -> list[int]:
    r = httpx.post(f"{base}/tokenize", json={"model": model, "content": text, "add_special": True})
    return r.json()["tokens"]


def reference(kind: str, dense, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        hidden = dense.model(torch.tensor([ids])).last_hidden_state[0]
        if kind == "qwen3-embedding":
            return F.normalize(hidden[-1], dim=-1)
        v = dense.extras["dense_3.weight"] @ (dense.extras["dense_2.weight"] @ hidden.mean(0))
        return F.normalize(v, dim=-1)


@pytest.mark.parametrize("kind", ["qwen3-embedding", "embeddinggemma"])
def test_embeddings_equal_transformers(base, client, files, kind):
    _, dense = files[1][kind]
    model = f"{kind}.gguf"
    r = client.embeddings.create(model=model, input=TEXTS)  # the client asks for base64 and decodes it
    ids = [ids_of(base, model, t) for t in TEXTS]
    if kind == "qwen3-embedding":
        assert all(x[-1] == 317 for x in ids)  # the file's add_eos_token: EOS appended
    assert len(ids[3]) > 16  # longer than the sliding window (8): its symmetric mask matters
    assert r.usage.prompt_tokens == sum(len(x) for x in ids) and [d.index for d in r.data] == [0, 1, 2, 3]
    for d, x in zip(r.data, ids):
        got = torch.tensor(d.embedding)
        assert float(got.norm()) == pytest.approx(1.0, abs=1e-5)
        assert float(F.cosine_similarity(got, reference(kind, dense, x), dim=0)) >= 0.9999
    floats = httpx.post(f"{base}/v1/embeddings", json={"model": model, "input": TEXTS, "encoding_format": "float"})
    assert np.allclose([d["embedding"] for d in floats.json()["data"]], [d.embedding for d in r.data], atol=1e-6)
    raw = httpx.post(f"{base}/v1/embeddings", json={"model": model, "input": TEXTS[0], "encoding_format": "base64"})
    vec = np.frombuffer(base64.b64decode(raw.json()["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(vec, r.data[0].embedding, atol=1e-6)
    by_ids = client.embeddings.create(model=model, input=ids, encoding_format="float")  # token ids, as given
    assert np.allclose([d.embedding for d in by_ids.data], [d.embedding for d in r.data], atol=1e-5)
    one = client.embeddings.create(model=model, input=ids[1], encoding_format="float")
    assert np.allclose(one.data[0].embedding, r.data[1].embedding, atol=1e-5)
    short = client.embeddings.create(model=model, input=TEXTS[:2], dimensions=64)  # Matryoshka
    for d, full in zip(short.data, r.data):
        assert len(d.embedding) == 64
        assert np.allclose(d.embedding, F.normalize(torch.tensor(full.embedding[:64]), dim=-1).numpy(), atol=1e-5)


def test_langchain_openai_embeddings(base, files):
    from langchain_openai import OpenAIEmbeddings

    emb = OpenAIEmbeddings(model="qwen3-embedding.gguf", base_url=f"{base}/v1", api_key="x",
                           check_embedding_ctx_length=False)  # no tiktoken: it would download its tables
    docs = emb.embed_documents(TEXTS[:2])
    query = emb.embed_query(TEXTS[0])
    _, dense = files[1]["qwen3-embedding"]
    ref = reference("qwen3-embedding", dense, ids_of(base, "qwen3-embedding.gguf", TEXTS[0]))
    assert float(F.cosine_similarity(torch.tensor(query), ref, dim=0)) >= 0.9999
    assert np.allclose(docs[0], query, atol=1e-5) and len(docs) == 2


def test_rerank_equals_the_yes_probability(base, files):
    _, dense = files[1]["qwen3-reranker"]
    docs = ["the dog", "hello world", "a cat sat on the mat", "world world world"]
    r = httpx.post(f"{base}/v1/rerank", json={"model": "qwen3-reranker.gguf", "query": "hello", "documents": docs,
                                              "top_n": 3, "return_documents": True}).json()
    template = "<|im_start|>user\n<Query>: {query}\n<Document>: {document}<|im_end|>\n<|im_start|>assistant\n"
    expected = []
    for d in docs:
        ids = ids_of(base, "qwen3-reranker.gguf", template.replace("{query}", "hello").replace("{document}", d))
        with torch.no_grad():
            logits = dense(torch.tensor([ids])).logits[0, -1, list(YES_NO)]
        expected.append(float(torch.softmax(logits, -1)[0]))
    assert [x["index"] for x in r["results"]] == sorted(range(4), key=lambda j: -expected[j])[:3]
    for x in r["results"]:
        assert x["relevance_score"] == pytest.approx(expected[x["index"]], abs=1e-4)
        assert x["document"] == {"text": docs[x["index"]]}
    assert r["usage"]["prompt_tokens"] > 4 * 10
    same = httpx.post(f"{base}/rerank", json={"model": "qwen3-reranker.gguf", "query": "hello",
                                              "documents": [{"text": d} for d in docs]}).json()
    assert len(same["results"]) == 4 and "document" not in same["results"][0]


def test_the_wrong_kind_of_model_and_bad_inputs_are_400s(base, client):
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="chat.gguf", input="x")
    assert "is a generative (chat and completion) model" in e.value.message and e.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="qwen3-embedding.gguf", messages=[{"role": "user", "content": "x"}])
    assert "is an embedding model: use /v1/embeddings" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="qwen3-reranker.gguf", prompt="x")
    assert "is a reranking model: use /v1/rerank" in e.value.message
    r = httpx.post(f"{base}/v1/rerank", json={"model": "embeddinggemma.gguf", "query": "q", "documents": ["d"]})
    assert r.status_code == 400 and "is an embedding model" in r.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError) as e:  # --ctx-size 128
        client.embeddings.create(model="qwen3-embedding.gguf", input=["fine", "world " * 200])
    assert e.value.body["param"] == "input.1" and "holds at most 128" in e.value.message
    for bad, param in (([], "input"), (["ok", ""], "input.1"), ([[1, 2], [5, 99999]], "input.1")):
        r = httpx.post(f"{base}/v1/embeddings", json={"model": "qwen3-embedding.gguf", "input": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = httpx.post(f"{base}/v1/embeddings", json={"model": "qwen3-embedding.gguf", "input": "x", "dimensions": 9999})
    assert r.status_code == 400 and r.json()["error"]["param"] == "dimensions"
    assert client.embeddings.create(model="qwen3-embedding.gguf", input="still serving").data


def test_models_say_their_kind_chat_first_and_a_lone_kind_answers_other_names(base):
    """/v1/models names each model's kind (from the file's pooling type), the chat models
    first, so that a client picking the first one chats; a name not served goes to the one
    model of the endpoint's kind where there is one (the reranker here), and stays a 404
    naming the served models where there are several (two embedding models)."""
    listed = httpx.get(f"{base}/v1/models").json()["data"]
    kinds = {m["id"]: m["kind"] for m in listed}
    assert kinds == {"chat.gguf": "chat", "qwen3-embedding.gguf": "embedding", "embeddinggemma.gguf": "embedding",
                     "qwen3-reranker.gguf": "rerank"}
    assert listed[0]["id"] == "chat.gguf"
    r = httpx.post(f"{base}/v1/rerank", json={"model": "rerank-english-v3.0", "query": "hello", "documents": ["a"]})
    assert r.status_code == 200 and r.json()["model"] == "qwen3-reranker.gguf", r.text
    r = httpx.post(f"{base}/v1/embeddings", json={"model": "text-embedding-3-small", "input": "x"})
    assert r.status_code == 404
    assert "qwen3-embedding.gguf" in r.json()["error"]["message"] and "embeddinggemma.gguf" in r.json()["error"]["message"]


def test_a_bert_embedder_over_the_openai_client(tmp_path):
    """A converter-written BERT file (its WordPiece vocabulary): /v1/embeddings gives the
    engine's vectors for the texts, with their token counts."""
    hf, _ = tiny_bert(tmp_path / "hf")
    path = convert_with_vocab(hf, tmp_path / "tiny-bert.gguf", "f32")
    texts = ["Hello the quick brown foxes!", "a lazy dog"]
    lm = load_model(path, device="cpu")
    ids = [encode(lm.tokenizer, t) for t in texts]
    expected = embed(lm, ids)
    with server(path) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x")
        r = client.embeddings.create(model="tiny-bert.gguf", input=texts)
        assert r.usage.prompt_tokens == sum(len(i) for i in ids)
        for item, vec in zip(r.data, expected):
            assert float(F.cosine_similarity(torch.tensor(item.embedding), vec, dim=0)) > 0.9999


def test_xlmr_embedder_and_reranker_over_http(tmp_path):
    """bge-m3- and bge-reranker-shaped files (XLM-RoBERTa, a SentencePiece Unigram
    vocabulary) as the converter writes them, served from one folder: /v1/embeddings gives
    the engine's vectors, /v1/rerank the engine's scores of llama-server's query-document
    pairs, best first."""
    emb, _, _ = tiny_xlmr(tmp_path / "emb", "cls")
    ranker, _, _ = tiny_xlmr(tmp_path / "rank", "rank")
    models = tmp_path / "models"
    models.mkdir()
    convert_with_vocab(emb, models / "bge-m3-tiny.gguf", "f32")
    convert_with_vocab(ranker, models / "bge-reranker-tiny.gguf", "f32")
    texts = ["Paris is the capital of France.", "Ein schneller Fuchs ＡＢＣ"]
    lm = load_model(str(models / "bge-m3-tiny.gguf"), device="cpu")
    expected = embed(lm, [encode(lm.tokenizer, t) for t in texts])
    rl = load_model(str(models / "bge-reranker-tiny.gguf"), device="cpu")
    docs = ["Berlin is the capital of Germany.", "Paris is the capital of France.", "The quick brown fox."]
    scores = rank(rl, _rerank_inputs(rl, "What is the capital of France?", docs))
    with server(str(models), "--max-loaded", "2") as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x")
        r = client.embeddings.create(model="bge-m3-tiny.gguf", input=texts)
        for item, vec in zip(r.data, expected):
            assert float(F.cosine_similarity(torch.tensor(item.embedding), vec, dim=0)) > 0.9999
        r = httpx.post(f"{url}/v1/rerank", json={"model": "bge-reranker-tiny.gguf", "query": "What is the capital of "
                                                 "France?", "documents": docs}, timeout=60)
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert [x["index"] for x in results] == sorted(range(3), key=lambda j: -float(scores[j]))
        for x in results:
            assert abs(x["relevance_score"] - float(scores[x["index"]])) < 1e-4
        r = httpx.post(f"{url}/v1/rerank", json={"model": "bge-m3-tiny.gguf", "query": "q", "documents": ["d"]})
        assert r.status_code == 400 and "is an embedding model: use /v1/embeddings" in r.text
