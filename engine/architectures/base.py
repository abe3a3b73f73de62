"""What every architecture file provides: how the file's metadata becomes the model's
hyperparameters (a `Config`, with transformers' field names so that the tests'
transformers oracles and these read alike), with the llama-family conventions most of
them share. The forward passes over the file's tensors are engine.models'.
(transformers' own config classes are not used here: importing them pulls in most of
transformers, ~65 MB and over a second.)"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, ClassVar

from ...gguf_io import GGUFReader, Keys


class Config(SimpleNamespace):
    """A model's hyperparameters, as attributes (hidden_size, num_hidden_layers, ...)."""


class MissingMetadata(KeyError):
    """A key the architecture needs is absent from the file."""


class Architecture:
    """One GGUF `general.architecture`. Subclasses set `name` and build `config()`."""

    name: ClassVar[str]
    chat_template_fallback: ClassVar[str | None] = None

    def __init__(self, reader: GGUFReader):
        self.reader = reader
        self.arch = reader.architecture

    # ------------------------------------------------------------ metadata

    def get(self, key: str, default: Any = MissingMetadata) -> Any:
        full = key.format(arch=self.arch)
        value = self.reader.metadata.get(full, default)
        if value is MissingMetadata:
            raise MissingMetadata(f"{self.reader.path}: metadata key {full!r} is required for {self.name} models")
        return value

    def vocab_size(self) -> int:
        tokens = self.reader.metadata.get(Keys.TOKENIZER_TOKENS)
        if tokens is not None:
            return len(tokens)
        return self.reader.tensors["token_embd.weight"].shape[0]

    def common_config(self) -> dict[str, Any]:
        """The config fields every llama-family file states the same way."""
        n_head = self.get(Keys.HEAD_COUNT)
        n_embd = self.get(Keys.EMBEDDING_LENGTH)
        cfg = dict(
            vocab_size=self.vocab_size(),
            hidden_size=n_embd,
            intermediate_size=self.get(Keys.FEED_FORWARD_LENGTH, 0),
            num_hidden_layers=self.get(Keys.BLOCK_COUNT),
            num_attention_heads=n_head,
            num_key_value_heads=self.get(Keys.HEAD_COUNT_KV, n_head),
            head_dim=self.get(Keys.KEY_LENGTH, n_embd // n_head),
            max_position_embeddings=self.get(Keys.CONTEXT_LENGTH, 4096),
            rms_norm_eps=self.get(Keys.LAYERNORM_RMS_EPS, 1e-6),
            tie_word_embeddings=False,  # a missing output.weight: the head reads the embedding
            bos_token_id=self.reader.metadata.get(Keys.TOKENIZER_BOS_ID),
            eos_token_id=self.reader.metadata.get(Keys.TOKENIZER_EOS_ID),
            pad_token_id=self.reader.metadata.get(Keys.TOKENIZER_PAD_ID),
        )
        cfg["rope_parameters"] = self.rope_parameters(self.get(Keys.ROPE_FREQ_BASE, 10000.0))
        return cfg

    def rope_parameters(self, theta: float) -> dict[str, Any]:
        kind = self.get(Keys.ROPE_SCALING_TYPE, "none")
        params: dict[str, Any] = {"rope_type": "default", "rope_theta": float(theta)}
        if kind == "linear":
            params.update(rope_type="linear", factor=float(self.get(Keys.ROPE_SCALING_FACTOR)))
        elif kind == "yarn":
            params.update(rope_type="yarn", factor=float(self.get(Keys.ROPE_SCALING_FACTOR)),
                          original_max_position_embeddings=self.get(Keys.ROPE_SCALING_ORIG_CTX))
        return params

    def config(self):
        """The transformers config for this file."""
        raise NotImplementedError
