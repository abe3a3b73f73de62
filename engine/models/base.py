"""The model loop every architecture file ends with: embed, layers, final norm, output
head over a flattened batch (`Model`, its optional parts fields the family fills when it
builds it), and `standard_model`, the model around a family's layers as the files store
it. The hyperparameters are read in `params.py`, the layers' pieces are in `layers.py`.

Nothing here knows about requests, sampling or tokenizers, and nothing here reads a
transformers config: the file's metadata is the only input."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from .. import lora
from ..batch import Batch
from ..cache import KVCache, LayerCache
from ..modules import GgufEmbedding, Weights
from .params import TextParams
from .pooling import PoolingHead


@dataclass(eq=False)
class Model:
    """embed → layers → final norm → output head, over a flattened batch. An
    architecture's `build` makes `layers`: callables (x, batch, cache) -> x with a
    `cache_spec()`. `forward` returns float32 logits for the batch's rows. `ops` are the
    dense ops (kernels.ops) the layers were built with. The optional parts are the
    family's, given when it builds the model."""

    ops: Any
    embed: GgufEmbedding
    layers: list
    norm: torch.Tensor | None  # None: the layers' output as it is (an encoder that ends normed: BERT)
    head: Any  # None: an encoder without one (BERT)
    eps: float
    vocab_size: int
    softcap: float | None = None  # tanh capping of the logits
    logit_scale: float = 1.0  # logits divided by it (Granite's logits_scaling)
    # a multi-token-prediction head drafting for speculative decoding (qwen35's MtpHead), whose
    # own cache layer follows the trunk's: called (batch, cache, hidden) -> (logits, hidden)
    mtp: Any = None
    # called (embeddings, batch) once per forward before the first layer, for a family that
    # derives per-batch inputs from the embeddings (Gemma 4's per-layer embeddings)
    before_layers: Callable[[torch.Tensor, Batch], None] | None = None
    pool: PoolingHead | None = None  # embedding and reranking files: pooling and what follows it
    both_ways: bool = False  # an encoder: each sequence's tokens attend both ways (EmbeddingGemma)

    def cache_specs(self) -> list[LayerCache]:
        specs = [layer.cache_spec() for layer in self.layers]
        return specs + [self.mtp.cache_spec()] if self.mtp is not None else specs

    def forward(self, batch: Batch, cache: KVCache) -> torch.Tensor:
        """Logits (len(batch.rows), vocab) float32; a batch longer than the cache's
        max_batch runs in consecutive chunks."""
        subs = batch.split(cache.max_batch)
        parts = [self._forward(b, cache) for b in subs]
        if batch.keep_hidden and len(subs) > 1:
            batch.hidden = torch.cat([b.hidden for b in subs])
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _forward(self, batch: Batch, cache: KVCache) -> torch.Tensor:
        with lora.rows(batch):  # the batch's rows that use LoRA adapters, for the matrices that have them
            return self._compute(batch, cache)

    def _compute(self, batch: Batch, cache: KVCache) -> torch.Tensor:
        cache.begin(batch)
        return self.run(batch, cache)

    def run(self, batch: Batch, cache: KVCache) -> torch.Tensor:
        """The forward's tensor work, once the cache has taken the batch's positions
        (cache.begin): what a captured decode step replays (engine.graphs)."""
        if batch.media is None:
            x = self.embed(batch.tokens)
        else:  # image tokens: their embeddings stand for the (negative) ids
            rows, emb = batch.media
            x = self.embed(batch.tokens.clamp(min=0))
            x[rows] = emb[:, :x.shape[1]].to(x.dtype)
        if self.before_layers is not None:
            self.before_layers(x, batch)
        deep = 0 if batch.media is None else batch.media[1].shape[1] // x.shape[1] - 1
        for i, layer in enumerate(self.layers):
            x = layer(x, batch, cache)
            if i < deep:  # deepstack (Qwen3-VL): the media rows' i-th further slice added after layer i
                rows, emb = batch.media
                x[rows] += emb[:, (i + 1) * x.shape[1]:(i + 2) * x.shape[1]].to(x.dtype)
        if batch.keep_hidden:  # every token's output after the final norm (what an MTP head reads)
            batch.hidden = x = x if self.norm is None else self.ops.rms_norm(x, self.norm, self.eps)
        if batch.rows.numel() == 0:
            return torch.empty(0, self.vocab_size, dtype=torch.float32)
        if batch.rows.numel() != x.shape[0]:
            x = x[batch.rows]
        logits = self.head(x if batch.keep_hidden else self.ops.rms_norm(x, self.norm, self.eps)).float()
        if self.logit_scale != 1.0:
            logits = logits / self.logit_scale
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def output_head(w: Weights, vocab: int, hidden: int):
    """output.weight, or the token embedding's bytes when the head is tied."""
    name = "output.weight" if w.has("output.weight") else "token_embd.weight"
    return w.linear(name, vocab, hidden)


def standard_model(ops, w: Weights, p: TextParams, layers: list, *, embed_scale: float | None = None,
                   softcap: float | None = None, logit_scale: float = 1.0, final_norm: str = "output_norm",
                   mtp: Callable | None = None, before_layers: Callable | None = None,
                   both_ways: bool = False) -> Model:
    """The model around `layers` as the files store it: token_embd (scaled by
    `embed_scale`), the final norm (`final_norm`, LFM2's is token_embd_norm), the output
    head (tied where output.weight is absent), the pooling head of an embedding or
    reranking file; `mtp` builds the multi-token-prediction head from the trunk's
    embedding, head and final norm (which it uses where it has none of its own)."""
    embed = w.embedding("token_embd.weight", p.vocab_size, p.hidden, scale=embed_scale)
    norm, head = w.vector(f"{final_norm}.weight", p.hidden), output_head(w, p.vocab_size, p.hidden)
    return Model(ops, embed, layers, norm, head, p.eps, p.vocab_size, softcap=softcap, logit_scale=logit_scale,
                 mtp=mtp(embed, head, norm) if mtp is not None else None, before_layers=before_layers,
                 pool=PoolingHead.build(p, w), both_ways=both_ways)
