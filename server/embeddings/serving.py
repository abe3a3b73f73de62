"""/v1/embeddings (OpenAI's) and /v1/rerank (llama-server's and Jina's) for embedding and
reranking files (engine.embed): inputs tokenized as the file asks (BOS/EOS), each
request's inputs several to a forward on the model's EmbedWorker; a generative model
asked for either, or an embedding model asked to chat, is a 400 saying which it is."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import torch
import torch.nn.functional as F

from ...engine import EmbeddingError, encode
from ..core.errors import BadRequest
from ..core.pools import Pools
from ..models.catalog import refuse_kind
from ..models.residency import Residency
from ..models.worker import EmbedJob
from .protocol import EmbeddingRequest, RerankRequest


def _token_lists(req: EmbeddingRequest, tok) -> list[list[int]]:
    given = req.input
    if isinstance(given, str):
        given = [given]
    elif given and all(isinstance(t, int) for t in given):
        given = [given]  # one input as token ids
    if not given:
        raise BadRequest("input: no inputs given", param="input")
    vocab = len(tok)
    out = []
    for i, item in enumerate(given):
        if isinstance(item, str):
            if not item:
                raise BadRequest(f"input.{i}: an empty string has nothing to embed", param=f"input.{i}")
            out.append(encode(tok, item, add_special=True))
        else:
            bad = next((t for t in item if not 0 <= t < vocab), None)
            if bad is not None:
                raise BadRequest(f"input.{i}: token id {bad} is outside the vocabulary (0..{vocab - 1})",
                                 param=f"input.{i}")
            out.append(list(item))
    return out


class EmbeddingsServing:
    """The /v1/embeddings and /v1/rerank endpoints."""

    def __init__(self, residency: Residency, pools: Pools):
        self.residency, self.pools = residency, pools

    async def _run(self, entry, kind: str, inputs: list[list[int]], param: str) -> torch.Tensor:
        loop = asyncio.get_running_loop()
        job = EmbedJob(kind, inputs, loop, loop.create_future())
        entry.worker.submit(job)  # Overloaded (429) when the queue is full
        try:
            return await job.future
        except EmbeddingError as e:
            raise BadRequest(f"{param}.{e.index}: {e}", param=f"{param}.{e.index}",
                             code="context_length_exceeded") from None

    async def embeddings(self, req: EmbeddingRequest) -> dict:
        async with self.residency.holding(req.model, req.keep_alive, "embedding") as entry:
            refuse_kind(entry, "embed")
            req.model = entry.id  # the reply names the model that answered
            if entry.lm.pooling == "none":
                raise BadRequest(f"model {entry.id} is served with pooling none (every token's vector): use "
                                 f"/embedding", param="model", code="wrong_model_kind")
            inputs = await self.pools.prompts.run(_token_lists, req, entry.lm.tokenizer)
            vectors = await self._run(entry, "embed", inputs, "input")
        if req.dimensions is not None:  # Matryoshka: the first `dimensions`, renormalized
            if req.dimensions > vectors.shape[1]:
                raise BadRequest(f"dimensions: the model's embeddings have {vectors.shape[1]}", param="dimensions")
            vectors = F.normalize(vectors[:, :req.dimensions], dim=-1)
        data = []
        for i, v in enumerate(vectors.numpy().astype(np.float32)):
            value = base64.b64encode(v.astype("<f4").tobytes()).decode() if req.encoding_format == "base64" \
                else v.tolist()
            data.append({"object": "embedding", "index": i, "embedding": value})
        n = sum(len(x) for x in inputs)
        return {"object": "list", "data": data, "model": req.model,
                "usage": {"prompt_tokens": n, "total_tokens": n}}

    async def embedding(self, req: EmbeddingRequest, normalize: int = 2) -> list[dict]:
        """llama-server's /embedding: each input's vector, or with pooling none every
        token's, as rows; `normalize` as its embd_normalize (-1 none, 1 taxicab, 2
        Euclidean, p > 2 the p-norm)."""
        async with self.residency.holding(req.model, req.keep_alive, "embedding") as entry:
            refuse_kind(entry, "embed")
            inputs = await self.pools.prompts.run(_token_lists, req, entry.lm.tokenizer)
            if entry.lm.pooling == "none":
                rows = await self._run(entry, "tokens", inputs, "content")
            else:  # the pooled vector, unnormalized, as one row
                pooled = await self._run(entry, "embed", inputs, "content")
                rows = [v[None] for v in pooled] if normalize == 2 else None
                if rows is None:
                    raise BadRequest("embd_normalize: a pooled model's vectors come L2-normalized here (2)",
                                     param="embd_normalize")
        out = []
        for i, m in enumerate(rows):
            if normalize >= 1 and entry.lm.pooling == "none":
                m = F.normalize(m, p=float(normalize), dim=-1)
            out.append({"index": i, "embedding": m.numpy().astype(np.float32).tolist()})
        return out

    async def rerank(self, req: RerankRequest) -> dict:
        async with self.residency.holding(req.model, req.keep_alive, "rerank") as entry:
            refuse_kind(entry, "rank")
            req.model = entry.id
            texts = []
            for j, d in enumerate(req.documents):
                text = d if isinstance(d, str) else d.get("text")
                if not isinstance(text, str):
                    raise BadRequest(f"documents.{j}: a document is a string or {{\"text\": ...}}",
                                     param=f"documents.{j}")
                texts.append(text)
            inputs = await self.pools.prompts.run(_rerank_inputs, entry.lm, req.query, texts)
            scores = await self._run(entry, "rank", inputs, "documents")
        order = sorted(range(len(texts)), key=lambda j: -float(scores[j]))[:req.top_n or len(texts)]
        results = []
        for j in order:
            r = {"index": j, "relevance_score": float(scores[j])}
            if req.return_documents:
                r["document"] = {"text": texts[j]}
            results.append(r)
        n = sum(len(x) for x in inputs)
        return {"object": "list", "model": req.model, "results": results,
                "usage": {"prompt_tokens": n, "total_tokens": n}}


def _rerank_inputs(lm, query: str, documents: list[str]) -> list[list[int]]:
    """Each (query, document) pair as the file's "rerank" template writes it (Qwen3-Reranker's,
    as llama.cpp's converter stores it), else as llama-server pairs them: BOS query EOS SEP
    document EOS, each mark where the file's tokenizer adds it (EOS falling back to SEP):
    XLM-R's <s> q </s> d </s>, BERT's [CLS] q [SEP] d [SEP]."""
    tok = lm.tokenizer
    template = lm.gguf.metadata.get("tokenizer.chat_template.rerank")
    out = []
    for doc in documents:
        if template:
            out.append(encode(tok, template.replace("{query}", query).replace("{document}", doc), add_special=True))
            continue
        q = tok.backend_tokenizer.encode(query, add_special_tokens=False).ids
        d = tok.backend_tokenizer.encode(doc, add_special_tokens=False).ids
        eos = tok.eos_token_id if tok.eos_token_id is not None else tok.sep_token_id
        bos = [tok.bos_token_id] if tok.add_bos_token and tok.bos_token_id is not None else []
        end = [eos] if tok.add_eos_token and eos is not None else []
        sep = [tok.sep_token_id] if getattr(tok, "add_sep", False) and tok.sep_token_id is not None else []
        out.append(bos + q + end + sep + d + end)
    return out
