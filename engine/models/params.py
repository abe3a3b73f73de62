"""Hyperparameters from the file's metadata, one way for every architecture and tower:
`Metadata` (keys from gguf_io's `Keys`, a required key's absence named), `FileParams`
(a dataclass whose classes each read their own fields), `TextParams` (what every
decoder-only file states the same way, which an architecture's `Params` extends with
its switches) and the per-layer lists files state (`kv_heads_per_layer`,
`sliding_layers`). Nothing here builds weights."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from ...gguf_io import GGUFReader, Keys

DEFAULT_CONTEXT = 4096  # a file that states no context length
POOLING = {1: "mean", 2: "cls", 3: "last", 4: "rank"}  # llama.cpp's enum llama_pooling_type (0: none)
POOL_DENSE = ("dense_2", "dense_3")  # EmbeddingGemma's projections after pooling, in order


class MissingMetadata(KeyError):
    """A key the architecture needs is absent from the file."""

    def __str__(self) -> str:  # KeyError's str() would quote the message
        return str(self.args[0])


_REQUIRED = object()


class Metadata:
    """The file's metadata as an architecture reads it: `get(Keys.X)` fills in the
    architecture's name (and any other name of the template, `names`) and raises
    MissingMetadata (naming the file and the key) for a required key the file lacks."""

    def __init__(self, reader: GGUFReader):
        self.reader = reader
        self.arch = reader.architecture
        self.path = reader.path

    def key(self, key: str, **names: str) -> str:
        return key.format(arch=self.arch, **names)

    def get(self, key: str, default: Any = _REQUIRED, **names: str) -> Any:
        full = self.key(key, **names)
        value = self.reader.metadata.get(full, default)
        if value is _REQUIRED:
            raise MissingMetadata(f"{self.path}: metadata key {full!r} is required for {self.arch} models")
        return value

    def has_tensor(self, name: str) -> bool:
        return name in self.reader.tensors

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.reader.tensors[name].shape)

    def vocab_size(self) -> int:
        tokens = self.reader.metadata.get(Keys.TOKENIZER_TOKENS)
        if tokens is not None:
            return len(tokens)
        return self.tensor_shape("token_embd.weight")[0]


Reader = Callable[[Metadata, dict], dict]  # (the file, the fields read so far) -> fields


class FileParams:
    """A dataclass of hyperparameters built from the file by `from_gguf`: each class of its
    hierarchy that defines a static `read(m, fields)` reads its own fields (the base
    class's first; a later class may restate an earlier one's field), then the class's
    fixed `SWITCHES` apply. `member` makes a family member's class without a body."""

    SWITCHES: ClassVar[dict[str, Any]] = {}

    @classmethod
    def from_gguf(cls, m: Metadata):
        fields_: dict[str, Any] = {}
        for klass in reversed(cls.__mro__):
            read = vars(klass).get("read")
            if read is not None:
                fields_.update(read(m, fields_))
        return cls(**{**fields_, **cls.SWITCHES})

    @classmethod
    def member(cls, *readers: Reader, **switches: Any) -> type:
        """The Params of a family member that differs in fixed switches (qwen2 is llama
        with NeoX rotary) and fields of its own (`readers`, each as a class's `read`)."""
        def read(m: Metadata, fields_: dict) -> dict:
            own: dict[str, Any] = {}
            for reader in readers:
                own.update(reader(m, {**fields_, **own}))
            return own

        return type(cls.__name__, (cls,), {"read": staticmethod(read), "SWITCHES": {**cls.SWITCHES, **switches},
                                           "__module__": cls.__module__})


@dataclass(frozen=True)
class RopeScaling:
    """How rotary frequencies are stretched beyond the trained context: "none",
    "linear" (divided by `factor`) or "yarn" (llama.cpp's rope.scaling.* keys)."""

    kind: str = "none"
    factor: float = 1.0
    original_context: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    # YaRN's ramp between whole dimensions (llama.cpp; transformers' truncate=True) or the
    # exact correction range (gpt-oss is trained with truncate=False)
    truncate: bool = True

    @classmethod
    def read(cls, m: Metadata) -> "RopeScaling":
        """From the file's rope.scaling.* keys. YaRN's cos/sin scale is llama.cpp's: 0.1 ln(factor) + 1,
        or with a log multiplier (a config's mscale_all_dim, mscale 1) the ratio
        mscale(factor, 1) / mscale(factor, log_mul); times yarn_attn_factor where the file has one."""
        kind = m.get(Keys.ROPE_SCALING_TYPE, "none")
        if kind not in ("none", "linear", "yarn"):
            raise ValueError(f"rotary scaling {kind!r} is not supported (none, linear, yarn)")
        factor = float(m.get(Keys.ROPE_SCALING_FACTOR, 1.0) or 1.0)
        attention = None
        if kind == "yarn":
            def mscale(mul: float) -> float:
                return 1.0 if factor <= 1 else 0.1 * mul * math.log(factor) + 1.0
            log_mul = m.get(Keys.ROPE_SCALING_YARN_LOG_MUL, None)
            attn_factor = m.get(Keys.ROPE_SCALING_YARN_ATTN_FACTOR, None)
            attention = mscale(1.0) / mscale(float(log_mul)) if log_mul else mscale(1.0)
            attention *= float(attn_factor) if attn_factor else 1.0
        return cls(kind, factor, int(m.get(Keys.ROPE_SCALING_ORIG_CTX, 0) or 0),
                   float(m.get(Keys.ROPE_SCALING_YARN_BETA_FAST, None) or 32.0),
                   float(m.get(Keys.ROPE_SCALING_YARN_BETA_SLOW, None) or 1.0), attention)


@dataclass
class TextParams(FileParams):
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
    # embedding and reranking files ({arch}.pooling_type): "mean", "cls", "last" or "rank"; None: generative
    pooling: str | None = None
    pool_dense: tuple[tuple[str, int], ...] = ()  # the projections after pooling the file has: (name, out features)
    rank_softmax: bool = False  # a reranker's classifier outputs as probabilities (the family's: Qwen3-Reranker)

    @staticmethod
    def read(m: Metadata, fields_: dict) -> dict[str, Any]:
        n_head = m.get(Keys.HEAD_COUNT)
        n_embd = m.get(Keys.EMBEDDING_LENGTH)
        head_dim = m.get(Keys.KEY_LENGTH, n_embd // n_head)
        n_blocks, n_mtp = m.get(Keys.BLOCK_COUNT), m.get(Keys.NEXTN_PREDICT_LAYERS, 0)
        if not 0 <= n_mtp < n_blocks:
            raise ValueError(f"{m.path}: {n_mtp} multi-token-prediction layers of {n_blocks} blocks leave no trunk")
        pooling = m.get(Keys.POOLING_TYPE, None)
        return dict(
            vocab_size=m.vocab_size(), hidden=n_embd, n_layers=n_blocks - n_mtp, n_mtp_layers=n_mtp, n_heads=n_head,
            n_kv_heads=m.get(Keys.HEAD_COUNT_KV, n_head), head_dim=head_dim, ffn=m.get(Keys.FEED_FORWARD_LENGTH, 0),
            eps=float(m.get(Keys.LAYERNORM_RMS_EPS, 1e-6)), context_length=m.get(Keys.CONTEXT_LENGTH, DEFAULT_CONTEXT),
            rope_theta=float(m.get(Keys.ROPE_FREQ_BASE, 10000.0)), rope_dims=m.get(Keys.ROPE_DIMENSION_COUNT, head_dim),
            rope_scaling=RopeScaling.read(m), pooling=POOLING.get(int(pooling)) if pooling is not None else None,
            pool_dense=tuple((name, int(m.get(Keys.DENSE_FEAT_OUT, None, dense=name)
                                        or m.tensor_shape(f"{name}.weight")[0]))
                             for name in POOL_DENSE if m.has_tensor(f"{name}.weight")))


def per_layer(m: Metadata, key: str, value, n_layers: int) -> list:
    """A value the file states once or once per layer, as one per layer; ValueError naming
    the key where its list does not cover the layers."""
    values = list(value) if isinstance(value, list) else [value] * n_layers
    if len(values) != n_layers:
        raise ValueError(f"{m.path}: {m.key(key)} has {len(values)} entries for {n_layers} layers")
    return values


def kv_heads_per_layer(m: Metadata, c: dict) -> list[int]:
    """`attention.head_count_kv` as one count per layer (a hybrid's files list it, 0 for the
    layers without attention)."""
    return per_layer(m, Keys.HEAD_COUNT_KV, c["n_kv_heads"], c["n_layers"])


def layer_pattern(m: Metadata, key: str, n_layers: int, every: int | None) -> list[bool]:
    """A per-layer switch as the file's list under `key` states it (its first n_layers
    entries), else every `every`-th layer off and the others on (the family's fixed
    pattern); ValueError naming the key where a family with no fixed pattern (None) has
    no list, or the list is short."""
    pattern = m.get(key, None)
    if isinstance(pattern, list):
        if len(pattern) < n_layers:
            raise ValueError(f"{m.path}: {m.key(key)} has {len(pattern)} entries for {n_layers} layers")
        return [bool(v) for v in pattern[:n_layers]]
    if every is None:
        raise ValueError(f"{m.path}: {m.key(key)} must list each of the {n_layers} layers")
    return [(i + 1) % every != 0 for i in range(n_layers)]


def sliding_layers(m: Metadata, n_layers: int, global_every: int | None) -> list[bool]:
    """Per layer, whether it attends within the sliding window: as the file's
    `attention.sliding_window_pattern` lists it, else every `global_every`-th layer global
    (llama.cpp's set_swa_pattern)."""
    return layer_pattern(m, Keys.SLIDING_WINDOW_PATTERN, n_layers, global_every)
