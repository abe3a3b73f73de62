"""A tiny nomic-embed-text checkpoint as Nomic publishes it (its remote-code layout: Wqkv,
fc11 / fc12, norm1 / norm2, and the config's n_embd-style keys the converter checks), with
tiny_bert's WordPiece vocabulary and mean pooling, for llama.cpp's converter to write
(conversion/bert.py NomicBertModel); and the same weights in transformers' own
NomicBertModel as the reference. The config also holds transformers' key names (hidden_size
and so on): transformers 5 reads a nomic_bert config.json as its NomicBertConfig, whose
defaults (a 768-wide, 12-layer model: nomic-embed-text v1.5's own sizes) the converter
would otherwise take."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import NomicBertConfig, NomicBertModel

from tiny_bert import wordpiece_folder

HIDDEN, LAYERS, HEADS, INNER = 64, 2, 4, 128


def tiny_nomic(folder: Path, seed: int = 0) -> tuple[Path, NomicBertModel]:
    """The checkpoint folder and transformers' model of its weights."""
    hf, vocab = wordpiece_folder(folder / "hf", seed)
    (hf / "config.json").write_text(json.dumps({
        "architectures": ["NomicBertModel"], "model_type": "nomic_bert", "vocab_size": vocab, "n_embd": HIDDEN,
        "n_layer": LAYERS, "n_head": HEADS, "n_inner": INNER, "n_positions": 8192, "max_trained_positions": 2048,
        "activation_function": "swiglu", "causal": False, "qkv_proj_bias": False, "mlp_fc1_bias": False,
        "mlp_fc2_bias": False, "prenorm": False, "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
        "rotary_emb_scale_base": None, "rotary_emb_base": 1000, "layer_norm_epsilon": 1e-12, "type_vocab_size": 2,
        "pad_token_id": 0, "hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "intermediate_size": INNER, "max_position_embeddings": 2048}))
    g = torch.Generator().manual_seed(seed)
    rand = lambda *shape, s=0.2: torch.randn(*shape, generator=g) * s  # noqa: E731
    t = {"embeddings.word_embeddings.weight": rand(vocab, HIDDEN, s=1.0),
         "embeddings.token_type_embeddings.weight": rand(2, HIDDEN),
         "emb_ln.weight": 1 + rand(HIDDEN, s=0.1), "emb_ln.bias": rand(HIDDEN, s=0.1)}
    for i in range(LAYERS):
        p = f"encoder.layers.{i}."
        t |= {p + "attn.Wqkv.weight": rand(3 * HIDDEN, HIDDEN), p + "attn.out_proj.weight": rand(HIDDEN, HIDDEN),
              p + "norm1.weight": 1 + rand(HIDDEN, s=0.1), p + "norm1.bias": rand(HIDDEN, s=0.1),
              p + "mlp.fc11.weight": rand(INNER, HIDDEN), p + "mlp.fc12.weight": rand(INNER, HIDDEN),
              p + "mlp.fc2.weight": rand(HIDDEN, INNER), p + "norm2.weight": 1 + rand(HIDDEN, s=0.1),
              p + "norm2.bias": rand(HIDDEN, s=0.1)}
    save_file({k: v.contiguous() for k, v in t.items()}, str(hf / "model.safetensors"))
    return hf, reference(t, vocab)


def reference(t: dict, vocab: int) -> NomicBertModel:
    """transformers' NomicBertModel holding the checkpoint's weights (its own names)."""
    cfg = NomicBertConfig(vocab_size=vocab, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                          intermediate_size=INNER, max_position_embeddings=2048, type_vocab_size=2, layer_norm_eps=1e-12,
                          rope_parameters={"rope_theta": 1000.0, "rope_type": "default"})
    sd = {"embeddings.word_embeddings.weight": t["embeddings.word_embeddings.weight"],
          "embeddings.token_type_embeddings.weight": t["embeddings.token_type_embeddings.weight"],
          "embeddings.LayerNorm.weight": t["emb_ln.weight"], "embeddings.LayerNorm.bias": t["emb_ln.bias"]}
    for i in range(LAYERS):
        p, o = f"encoder.layers.{i}.", f"layers.{i}."
        q, k, v = t[p + "attn.Wqkv.weight"].split(HIDDEN)
        sd |= {o + "self_attn.q_proj.weight": q, o + "self_attn.k_proj.weight": k, o + "self_attn.v_proj.weight": v,
               o + "self_attn.o_proj.weight": t[p + "attn.out_proj.weight"],
               o + "mlp.up_proj.weight": t[p + "mlp.fc11.weight"], o + "mlp.gate_proj.weight": t[p + "mlp.fc12.weight"],
               o + "mlp.down_proj.weight": t[p + "mlp.fc2.weight"],
               o + "post_attention_layernorm.weight": t[p + "norm1.weight"],
               o + "post_attention_layernorm.bias": t[p + "norm1.bias"],
               o + "post_mlp_layernorm.weight": t[p + "norm2.weight"], o + "post_mlp_layernorm.bias": t[p + "norm2.bias"]}
    model = NomicBertModel(cfg).eval()
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and all("position" in m for m in missing), (missing, unexpected)
    return model
