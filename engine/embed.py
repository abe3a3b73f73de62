"""Embedding and reranking files: what llama.cpp's converter marks with
`{arch}.pooling_type` (sentence-transformers' pooling: mean, CLS, last token; `rank` for
rerankers). Their forward keeps every token's final normed output (Batch.keep_hidden),
pools each sequence's, then applies what the file holds after pooling (the model's
`pool`, models.pooling.PoolingHead: EmbeddingGemma's dense projections, a reranker's
classifier). Sequences go several to a forward (`embed`, `rank`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .batch import Batch
from .errors import EmbeddingError
from .models.pooling import PoolingHead


def _groups(lm, inputs: list[list[int]]) -> list[list[int]]:
    """The inputs' indexes, several to a forward: as many as the cache has slots and,
    together, at most a forward's tokens (a longer input alone)."""
    cache, both_ways = lm.cache, lm.model.both_ways
    limit = min(cache.n_ctx, cache.max_batch) if both_ways else cache.n_ctx
    for i, ids in enumerate(inputs):
        if not ids:
            raise EmbeddingError("the input is empty", i)
        if len(ids) > limit:
            why = "one forward (its tokens attend both ways)" if both_ways and limit < cache.n_ctx else "the context"
            raise EmbeddingError(f"the input is {len(ids)} tokens; {why} holds at most {limit}", i)
    groups, group, tokens = [], [], 0
    for i, ids in enumerate(inputs):
        if group and (len(group) == cache.n_seq or tokens + len(ids) > cache.max_batch):
            groups.append(group)
            group, tokens = [], 0
        group.append(i)
        tokens += len(ids)
    return groups + [group] if group else groups


def _pooled(lm, inputs: list[list[int]], per_token: bool = False) -> list[torch.Tensor]:
    """Each input's pooled output, through the head (in input order); `per_token`: each
    input's tokens' outputs (n, hidden) as they are, no pooling (llama.cpp's pooling none)."""
    head: PoolingHead = lm.model.pool
    both_ways = lm.model.both_ways
    out: list[torch.Tensor] = [None] * len(inputs)  # type: ignore[list-item]
    for group in _groups(lm, inputs):
        slots = [lm.cache.allocate() for _ in group]
        try:
            batch = Batch.of([(slot, inputs[i], 0) for slot, i in zip(slots, group)], want="none",
                             device=lm.device)
            batch.keep_hidden, batch.both_ways = True, both_ways
            lm.forward(batch)
            hidden = batch.hidden
            if per_token:
                for i, s in zip(group, batch.seqs):
                    out[i] = hidden[s.start:s.start + s.n].float().clone()
                continue
            pooled = torch.stack([head.pool(hidden[s.start:s.start + s.n].float(), not both_ways)
                                  for s in batch.seqs])
            with torch.inference_mode(), lm.threads.run(len(group)):  # the model's kernel settings
                result = head(pooled.to(hidden.dtype))
            for i, row in zip(group, result):
                out[i] = row
        finally:
            for slot in slots:
                lm.cache.free(slot)
    return out


def embed(lm, inputs: list[list[int]], normalize: bool = True) -> torch.Tensor:
    """Embeddings (n, dims) float32 of token id lists, L2-normalized unless told not to."""
    vectors = torch.stack(_pooled(lm, inputs)).float()
    return F.normalize(vectors, dim=-1) if normalize else vectors


def embed_tokens(lm, inputs: list[list[int]]) -> list[torch.Tensor]:
    """Every token's output (n, hidden) float32 of each input, not normalized: a file
    served with pooling none (llama-server's /embedding)."""
    return _pooled(lm, inputs, per_token=True)


def rank(lm, inputs: list[list[int]]) -> torch.Tensor:
    """A reranker's relevance score per input (query and document already in it): the
    classifier's first output (Qwen3-Reranker: the probability of "yes")."""
    return torch.stack([row[0] for row in _pooled(lm, inputs)]).float()
