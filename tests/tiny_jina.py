"""A tiny jina-embeddings-v2 checkpoint as Jina publishes it (its remote-code JinaBertModel:
ALiBi instead of positions, a GeGLU feed-forward `mlp.gated_layers`, `mlp.wo`,
`mlp.layernorm`), tiny_bert's WordPiece vocabulary and mean pooling, for llama.cpp's
converter (conversion/bert.py JinaBertV2Model); and `reference`, the checkpoint's forward
pass written out from Jina's code (transformers has no class for it), for the weights."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from tiny_bert import wordpiece_folder

HIDDEN, LAYERS, HEADS, INNER, EPS = 64, 2, 4, 128, 1e-12


def tiny_jina(folder: Path, seed: int = 0) -> tuple[Path, dict]:
    """The checkpoint folder and its weights by name."""
    hf, vocab = wordpiece_folder(folder / "hf", seed)
    (hf / "config.json").write_text(json.dumps({
        "architectures": ["JinaBertModel"], "model_type": "bert", "vocab_size": vocab, "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "intermediate_size": INNER,
        "max_position_embeddings": 8192, "type_vocab_size": 2, "layer_norm_eps": EPS, "hidden_act": "gelu",
        "position_embedding_type": "alibi", "feed_forward_type": "geglu", "pad_token_id": 0}))
    g = torch.Generator().manual_seed(seed)
    rand = lambda *shape, s=0.2: torch.randn(*shape, generator=g) * s  # noqa: E731
    t = {"embeddings.word_embeddings.weight": rand(vocab, HIDDEN, s=1.0),
         "embeddings.token_type_embeddings.weight": rand(2, HIDDEN),
         "embeddings.LayerNorm.weight": 1 + rand(HIDDEN, s=0.1), "embeddings.LayerNorm.bias": rand(HIDDEN, s=0.1)}
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        for n in ("query", "key", "value"):
            t |= {p + f"attention.self.{n}.weight": rand(HIDDEN, HIDDEN), p + f"attention.self.{n}.bias": rand(HIDDEN)}
        t |= {p + "attention.output.dense.weight": rand(HIDDEN, HIDDEN), p + "attention.output.dense.bias": rand(HIDDEN),
              p + "attention.output.LayerNorm.weight": 1 + rand(HIDDEN, s=0.1),
              p + "attention.output.LayerNorm.bias": rand(HIDDEN, s=0.1),
              p + "mlp.gated_layers.weight": rand(2 * INNER, HIDDEN), p + "mlp.wo.weight": rand(HIDDEN, INNER),
              p + "mlp.wo.bias": rand(HIDDEN), p + "mlp.layernorm.weight": 1 + rand(HIDDEN, s=0.1),
              p + "mlp.layernorm.bias": rand(HIDDEN, s=0.1)}
    save_file({k: v.contiguous() for k, v in t.items()}, str(hf / "model.safetensors"))
    return hf, t


def reference(t: dict, ids: list[int]) -> torch.Tensor:
    """Every token's output (n, hidden) by Jina's forward pass: post-norm BERT layers whose
    scores carry ALiBi's symmetric bias (-slope x |i - j|, slopes 2^(-8 (h + 1) / heads)),
    GeGLU with exact GELU."""
    n, d = len(ids), HIDDEN // HEADS
    ln = lambda x, name: F.layer_norm(x, (HIDDEN,), t[name + ".weight"], t[name + ".bias"], EPS)  # noqa: E731
    x = ln(t["embeddings.word_embeddings.weight"][ids] + t["embeddings.token_type_embeddings.weight"][0],
           "embeddings.LayerNorm")
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / HEADS) for h in range(HEADS)])
    pos = torch.arange(n)
    bias = -slopes[:, None, None] * (pos[None, :, None] - pos[None, None, :]).abs()
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        proj = {m: F.linear(x, t[p + f"attention.self.{m}.weight"], t[p + f"attention.self.{m}.bias"])
                .view(n, HEADS, d).transpose(0, 1) for m in ("query", "key", "value")}
        scores = proj["query"] @ proj["key"].transpose(-1, -2) / math.sqrt(d) + bias
        a = (torch.softmax(scores, -1) @ proj["value"]).transpose(0, 1).reshape(n, HIDDEN)
        x = ln(x + F.linear(a, t[p + "attention.output.dense.weight"], t[p + "attention.output.dense.bias"]),
               p + "attention.output.LayerNorm")
        gated, plain = F.linear(x, t[p + "mlp.gated_layers.weight"]).split(INNER, -1)
        x = ln(x + F.linear(F.gelu(gated) * plain, t[p + "mlp.wo.weight"], t[p + "mlp.wo.bias"]), p + "mlp.layernorm")
    return x
