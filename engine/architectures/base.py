"""What every architecture file provides, and the llama-family conventions most of
them share: how metadata becomes a transformers config, how GGUF tensor names map
to transformers parameter names, and the inverse of each transform llama.cpp's
converter applied. The modeling itself is transformers' own."""

from __future__ import annotations

import re
from typing import Any, ClassVar

import numpy as np
import torch

from ...gguf_io import GGUFReader, Keys


class MissingMetadata(KeyError):
    """A key the architecture needs is absent from the file."""


# transformers name (per layer, after "model.layers.{i}.") → GGUF name (after "blk.{i}.")
ATTENTION_NAMES = {
    f"self_attn.{hf}.{kind}": f"{gg}.{kind}"
    for hf, gg in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output"))
    for kind in ("weight", "bias")
}
QK_NORM_NAMES = {"self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight"}
MLP_NAMES = {"mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
             "mlp.down_proj.weight": "ffn_down.weight"}
LLAMA_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    **ATTENTION_NAMES,
    **MLP_NAMES,
}

GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.*)$")


class Architecture:
    """One GGUF `general.architecture`. Subclasses set the class attributes and
    override the hooks whose llama defaults do not fit."""

    name: ClassVar[str]
    model_class: ClassVar[type]  # a transformers *ForCausalLM class
    layer_names: ClassVar[dict[str, str]] = LLAMA_LAYER_NAMES
    global_names: ClassVar[dict[str, str]] = GLOBAL_NAMES
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
            tie_word_embeddings=False,  # the loader shares packed bytes itself
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

    # --------------------------------------------------------------- names

    def gguf_name(self, hf_name: str) -> str | None:
        """GGUF tensor name holding transformers parameter `hf_name` (None: not stored)."""
        m = _LAYER.match(hf_name)
        if m:
            rest = self.layer_names.get(m.group(2))
            return f"blk.{m.group(1)}.{rest}" if rest else None
        return self.global_names.get(hf_name)

    # ---------------------------------------------------- inverse transforms

    def dense(self, hf_name: str, array: np.ndarray, config) -> torch.Tensor:
        """A small unquantized tensor (norm, bias) as transformers expects it."""
        return torch.from_numpy(np.array(array, dtype=np.float32))

    def experts_names(self, module_name: str) -> tuple[str, str, str] | None:
        """GGUF names of (gate, up, down) expert tensors for an experts module."""
        m = _LAYER.match(module_name + ".")
        if m is None:
            return None
        i = m.group(1)
        return (f"blk.{i}.ffn_gate_exps.weight", f"blk.{i}.ffn_up_exps.weight", f"blk.{i}.ffn_down_exps.weight")

    def output_permutation(self, hf_name: str, config) -> torch.Tensor | None:
        """For a packed linear layer: output reordering that undoes a converter row permutation."""
        return None

    def input_permutation(self, hf_name: str, config) -> torch.Tensor | None:
        """For a packed linear layer: input reordering that undoes a converter column permutation."""
        return None


def llama_qk_permutation(n_rows: int, n_head: int) -> torch.Tensor:
    """llama.cpp's converter interleaves each head's two rotary halves (q and k rows);
    this index maps the file's output order back to transformers' rotate_half order."""
    head_dim = n_rows // n_head
    return torch.arange(n_rows).reshape(n_head, head_dim // 2, 2).transpose(1, 2).reshape(-1)
