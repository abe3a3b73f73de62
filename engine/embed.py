"""Embedding and reranking files: what llama.cpp's converter marks with
`{arch}.pooling_type` (sentence-transformers' pooling: mean, CLS, last token; `rank` for
rerankers). Their forward keeps every token's final normed output (Batch.keep_hidden),
pools each sequence's, then applies what the file holds after pooling: EmbeddingGemma's
dense projections (dense_2, dense_3), a reranker's classifier (cls.output, over the
last token; Qwen3-Reranker's yes/no rows, whose softmax's first is the score, as
llama.cpp's). Sequences go several to a forward (`embed`, `rank`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..gguf_io import GGUFReader, Keys
from .batch import Batch

POOLING = {1: "mean", 2: "cls", 3: "last", 4: "rank"}  # llama.cpp's enum llama_pooling_type (0: none)


class EmbeddingError(ValueError):
    """An input the model cannot embed (too long for one forward or for the context)."""

    def __init__(self, message: str, index: int):
        super().__init__(message)
        self.index = index


def pooling_of(reader: GGUFReader) -> str | None:
    """The file's pooling ("mean", "cls", "last", "rank"), or None for a generative model."""
    value = reader.get(Keys.POOLING_TYPE.format(arch=reader.architecture))
    return POOLING.get(int(value)) if value is not None else None


@dataclass
class PoolingHead:
    """What follows the trunk in an embedding or reranking file."""

    pooling: str
    dense: list  # linear layers applied in order after pooling (EmbeddingGemma's dense_2, dense_3)
    classifier: object = None  # rerankers: cls.output (labels x hidden)
    softmax: bool = False  # the classifier's outputs as probabilities (Qwen3-Reranker)

    @classmethod
    def build(cls, reader: GGUFReader, w, hidden: int) -> "PoolingHead | None":
        """The head of a file with a pooling type (its tensors checked), else None."""
        pooling = pooling_of(reader)
        if pooling is None:
            return None
        arch = reader.architecture
        dense, width = [], hidden
        for name in ("dense_2", "dense_3"):
            if w.has(f"{name}.weight"):
                out = int(reader.get(Keys.DENSE_FEAT_OUT.format(arch=arch, dense=name))
                          or reader.tensors[f"{name}.weight"].shape[0])
                dense.append(w.linear(f"{name}.weight", out, width, bias=f"{name}.bias"))
                width = out
        classifier = None
        if pooling == "rank":
            if not w.has("cls.output.weight"):
                raise ValueError(f"{reader.path}: a rank (reranker) file needs its classifier, cls.output.weight")
            labels = reader.tensors["cls.output.weight"].shape[0]
            classifier = w.linear("cls.output.weight", labels, width, bias="cls.output.bias")
        return cls(pooling, dense, classifier, softmax=pooling == "rank" and arch in ("qwen3", "qwen3vl"))

    def pool(self, hidden: torch.Tensor, causal: bool) -> torch.Tensor:
        """One sequence's pooled vector from its tokens' outputs (n, hidden)."""
        if self.pooling == "mean":
            return hidden.mean(0)
        if self.pooling == "cls":
            return hidden[0]
        return hidden[-1] if causal or self.pooling == "last" else hidden[0]  # rank: last, or CLS where both ways

    def __call__(self, pooled: torch.Tensor) -> torch.Tensor:
        x = pooled
        for layer in self.dense:
            x = layer(x)
        if self.classifier is not None:
            x = self.classifier(x).float()
            return torch.softmax(x, -1) if self.softmax else x
        return x.float()


def _groups(lm, inputs: list[list[int]]) -> list[list[int]]:
    """The inputs' indexes, several to a forward: as many as the cache has slots and,
    together, at most a forward's tokens (a longer input alone)."""
    cache, both_ways = lm.cache, getattr(lm.model, "both_ways", False)
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


def _pooled(lm, inputs: list[list[int]]) -> list[torch.Tensor]:
    """Each input's pooled output, through the head (in input order)."""
    head: PoolingHead = lm.model.pool
    both_ways = getattr(lm.model, "both_ways", False)
    out: list[torch.Tensor] = [None] * len(inputs)  # type: ignore[list-item]
    for group in _groups(lm, inputs):
        slots = [lm.cache.allocate() for _ in group]
        try:
            batch = Batch.of([(slot, inputs[i], 0) for slot, i in zip(slots, group)], want="none",
                             device=lm.device)
            batch.keep_hidden, batch.both_ways = True, both_ways
            lm.forward(batch)
            hidden = batch.hidden
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


def rank(lm, inputs: list[list[int]]) -> torch.Tensor:
    """A reranker's relevance score per input (query and document already in it): the
    classifier's first output (Qwen3-Reranker: the probability of "yes")."""
    return torch.stack([row[0] for row in _pooled(lm, inputs)]).float()
