"""What every architecture file starts from: reading the file's metadata (`Metadata`,
keys from gguf_io's `Keys`), the hyperparameters every llama-family file states the
same way (`TextParams`, which an architecture's `Params` extends with its own
switches), and the model loop (embed, layers, final norm, output head) over a
flattened batch. The layers' shared pieces are in `layers.py`.

Nothing here knows about requests, sampling or tokenizers, and nothing here reads a
transformers config: the file's metadata is the only input."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ...gguf_io import GGUFReader, Keys
from ..batch import Batch
from ..cache import KVCache, LayerCache
from ..modules import GgufEmbedding, Weights
from .layers import RopeScaling
from ..errors import MissingMetadata

DEFAULT_CONTEXT = 4096  # a file that states no context length


_REQUIRED = object()


class Metadata:
    """The file's metadata as an architecture reads it: `get(Keys.X)` fills in the
    architecture's name and raises MissingMetadata (naming the file and the key) for a
    required key the file lacks."""

    def __init__(self, reader: GGUFReader):
        self.reader = reader
        self.arch = reader.architecture
        self.path = reader.path

    def get(self, key: str, default: Any = _REQUIRED) -> Any:
        full = key.format(arch=self.arch)
        value = self.reader.metadata.get(full, default)
        if value is _REQUIRED:
            raise MissingMetadata(f"{self.path}: metadata key {full!r} is required for {self.arch} models")
        return value

    def has_tensor(self, name: str) -> bool:
        return name in self.reader.tensors

    def vocab_size(self) -> int:
        tokens = self.reader.metadata.get(Keys.TOKENIZER_TOKENS)
        if tokens is not None:
            return len(tokens)
        return self.reader.tensors["token_embd.weight"].shape[0]


@dataclass
class TextParams:
    """The hyperparameters of a decoder-only text model, as llama.cpp's keys state them.
    An architecture's `Params` subclasses this and adds its switches (with defaults)."""

    vocab_size: int
    hidden: int
    n_layers: int  # the trunk's layers
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    eps: float
    context_length: int  # the trained context
    rope_theta: float
    rope_dims: int  # rotated dimensions of each head (llama.cpp's n_rot)
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    # multi-token-prediction layers after the trunk's (llama.cpp's nextn_predict_layers): the file's
    # block_count counts them, the trunk does not run them
    n_mtp_layers: int = 0

    @staticmethod
    def common(m: Metadata) -> dict[str, Any]:
        """The fields above, read from the file."""
        n_head = m.get(Keys.HEAD_COUNT)
        n_embd = m.get(Keys.EMBEDDING_LENGTH)
        head_dim = m.get(Keys.KEY_LENGTH, n_embd // n_head)
        n_blocks, n_mtp = m.get(Keys.BLOCK_COUNT), m.get(Keys.NEXTN_PREDICT_LAYERS, 0)
        if not 0 <= n_mtp < n_blocks:
            raise ValueError(f"{m.path}: {n_mtp} multi-token-prediction layers of {n_blocks} blocks leave no trunk")
        return dict(
            vocab_size=m.vocab_size(), hidden=n_embd, n_layers=n_blocks - n_mtp, n_mtp_layers=n_mtp, n_heads=n_head,
            n_kv_heads=m.get(Keys.HEAD_COUNT_KV, n_head), head_dim=head_dim, ffn=m.get(Keys.FEED_FORWARD_LENGTH, 0),
            eps=float(m.get(Keys.LAYERNORM_RMS_EPS, 1e-6)), context_length=m.get(Keys.CONTEXT_LENGTH, DEFAULT_CONTEXT),
            rope_theta=float(m.get(Keys.ROPE_FREQ_BASE, 10000.0)), rope_dims=m.get(Keys.ROPE_DIMENSION_COUNT, head_dim),
            rope_scaling=RopeScaling.read(m.get(Keys.ROPE_SCALING_TYPE, "none"),
                                          m.get(Keys.ROPE_SCALING_FACTOR, 1.0),
                                          m.get(Keys.ROPE_SCALING_ORIG_CTX, 0),
                                          m.get(Keys.ROPE_SCALING_YARN_BETA_FAST, None),
                                          m.get(Keys.ROPE_SCALING_YARN_BETA_SLOW, None),
                                          m.get(Keys.ROPE_SCALING_YARN_ATTN_FACTOR, None),
                                          m.get(Keys.ROPE_SCALING_YARN_LOG_MUL, None)),
        )

    SWITCHES: ClassVar[dict[str, Any]] = {}  # a family member's fixed switches (see member)
    READERS: ClassVar[tuple] = ()  # a family member's own fields, each a function (Metadata) -> dict

    @classmethod
    def read(cls, m: Metadata) -> dict[str, Any]:
        """The fields the file states: the common ones, then each reader's."""
        fields_ = cls.common(m)
        for reader in cls.READERS:
            fields_.update(reader(m))
        return fields_

    @classmethod
    def from_gguf(cls, m: Metadata) -> "TextParams":
        return cls(**cls.read(m), **cls.SWITCHES)

    @classmethod
    def member(cls, *readers, **switches: Any) -> type:
        """The Params of a family member that differs in fixed switches (qwen2 is llama
        with NeoX rotary) and fields of its own (`readers`: (Metadata) -> dict)."""
        return type(cls.__name__, (cls,), {"SWITCHES": {**cls.SWITCHES, **switches}, "READERS": cls.READERS + readers,
                                           "__module__": cls.__module__})


def kv_heads_per_layer(m: Metadata, c: dict) -> list[int]:
    """`attention.head_count_kv` as one count per layer (a hybrid's files list it, 0 for the
    layers without attention); ValueError naming the key where it does not cover the layers."""
    kv = c["n_kv_heads"]
    per_layer = list(kv) if isinstance(kv, list) else [kv] * c["n_layers"]
    if len(per_layer) != c["n_layers"]:
        raise ValueError(f"{m.path}: {Keys.arch(Keys.HEAD_COUNT_KV, m.arch)} has {len(per_layer)} entries "
                         f"for {c['n_layers']} layers")
    return per_layer


class Model:
    """embed → layers → final norm → output head, over a flattened batch. An
    architecture's `build` makes `layers`: callables (x, batch, cache) -> x with a
    `cache_spec()`. `forward` returns float32 logits for the batch's rows. `ops` are the
    dense ops (kernels.ops) the layers were built with."""

    def __init__(self, ops, embed: GgufEmbedding, layers: list, norm: torch.Tensor, head, eps: float,
                 vocab_size: int, softcap: float | None = None, logit_scale: float = 1.0):
        self.ops, self.embed, self.layers, self.norm, self.head = ops, embed, layers, norm, head
        self.eps, self.vocab_size, self.softcap = eps, vocab_size, softcap
        self.logit_scale = logit_scale  # logits divided by it (Granite's logits_scaling)
        # a multi-token-prediction head drafting for speculative decoding (qwen35's MtpHead), whose
        # own cache layer follows the trunk's: called (batch, cache, hidden) -> (logits, hidden)
        self.mtp = None
        # called (embeddings, batch) once per forward before the first layer, for a family that
        # derives per-batch inputs from the embeddings (Gemma 4's per-layer embeddings)
        self.before_layers = None
        # embedding and reranking files (engine.embed.PoolingHead, set at load): pooling and what follows it
        self.pool = None
        self.both_ways = False  # an encoder: each sequence's tokens attend both ways (EmbeddingGemma)

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
        cache.begin(batch)
        if batch.media is None:
            x = self.embed(batch.tokens)
        else:  # image tokens: their embeddings stand for the (negative) ids
            rows, emb = batch.media
            x = self.embed(batch.tokens.clamp(min=0))
            x[rows] = emb.to(x.dtype)
        if self.before_layers is not None:
            self.before_layers(x, batch)
        for layer in self.layers:
            x = layer(x, batch, cache)
        if batch.keep_hidden:  # every token's output after the final norm (what an MTP head reads)
            batch.hidden = x = self.ops.rms_norm(x, self.norm, self.eps)
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
                   softcap: float | None = None) -> Model:
    """The model around `layers` as most families have it: token_embd (scaled by
    `embed_scale`), output_norm, the output head (tied where output.weight is absent)."""
    embed = w.embedding("token_embd.weight", p.vocab_size, p.hidden, scale=embed_scale)
    return Model(ops, embed, layers, w.vector("output_norm.weight", p.hidden), output_head(w, p.vocab_size, p.hidden),
                 p.eps, p.vocab_size, softcap=softcap)
