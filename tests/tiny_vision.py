"""Tiny random vision-language models from transformers' configs, written as llama.cpp's
converter writes them: the text model by tiny_models.write_gguf, the vision tower and
projector as a separate `mmproj` file (`convert_hf_to_gguf.py --mmproj`: its keys,
tensor names, forced types and transforms, read in the llama-cpp-python 0.3.36 sdist,
conversion/base.py MmprojModel and conversion/gemma.py Gemma3VisionModel).

`tiny_gemma3_vlm` returns the files and a transformers model carrying exactly the
weights the files hold (dequantized), the oracle for the engine's image features and
logits."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers import Gemma3Config, Gemma3ForConditionalGeneration

from gguf_serve.gguf_io import GGMLType, GGUFWriter, dequantize, quantize

from tiny_models import GEMMA3_NAMES, VOCAB, Spec, byte_level_vocab, spec, write_gguf

GEMMA3_IMAGE_TOKENS = ("<start_of_image>", "<end_of_image>", "<image_soft_token>")
IMAGE_MEAN = IMAGE_STD = [0.5, 0.5, 0.5]

# Gemma 3's chat template, reduced to what the tests need: image parts become <start_of_image>
GEMMA3_VISION_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' }}"
    "{% if m['content'] is string %}{{ m['content'] | trim }}"
    "{% else %}{% for item in m['content'] %}"
    "{% if item['type'] == 'image' %}{{ '<start_of_image>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] | trim }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

# transformers' SigLIP names -> the converter's (gguf-py tensor_mapping, MODEL_ARCH.MMPROJ)
SIGLIP_NAMES = {"layer_norm1": "ln1", "layer_norm2": "ln2", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                "self_attn.v_proj": "attn_v", "self_attn.out_proj": "attn_out", "mlp.fc1": "ffn_up",
                "mlp.fc2": "ffn_down"}


@dataclass
class TinyVLM:
    text_path: str
    vision_path: str
    model: torch.nn.Module  # the transformers model with the files' weights
    image_token_id: int
    image_size: int
    n_tokens: int  # per image


def _token_id(name: str) -> int:
    tokens, _, _ = byte_level_vocab(VOCAB, extra=GEMMA3_IMAGE_TOKENS)
    return tokens.index(name)


def gemma3_vlm_config(image_size: int = 64, patch: int = 8, tokens_per_image: int = 16) -> Gemma3Config:
    text = spec("gemma3").config.to_dict()
    text.update(sliding_window=64, max_position_embeddings=512)
    vision = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  image_size=image_size, patch_size=patch, layer_norm_eps=1e-6)
    cfg = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=tokens_per_image,
                       image_token_id=_token_id("<image_soft_token>"), boi_token_index=_token_id("<start_of_image>"),
                       eoi_token_index=_token_id("<end_of_image>"))
    cfg._attn_implementation = "sdpa"
    cfg.text_config._attn_implementation = "sdpa"
    cfg.vision_config._attn_implementation = "sdpa"
    return cfg


def _randomize(model: torch.nn.Module, seed: int) -> None:
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and "vision" not in name:  # Gemma's RMSNorms scale by 1 + w
                p.copy_(0.1 * torch.randn_like(p))
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.05 * torch.randn_like(p))
            elif "position_embedding" in name:
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)


def _vision_type(ftype: str, gname: str, ndim: int) -> GGMLType:
    """The converter's type for a vision tensor at --outtype ftype."""
    if gname == "mm.input_projection.weight":
        return GGMLType.F16  # Gemma3VisionModel.tensor_force_quant
    if ndim < 2 or gname.startswith(("v.patch_embd", "v.position_embd")):  # vectors, and ".embeddings." -> F32
        return GGMLType.F32
    return {"F32": GGMLType.F32, "F16": GGMLType.F16, "BF16": GGMLType.BF16, "Q8_0": GGMLType.Q8_0}[ftype]


def write_gemma3_mmproj(model, path, ftype: str = "F32") -> dict[str, torch.Tensor]:
    """The vision tower and projector of a Gemma3ForConditionalGeneration as the converter's
    --mmproj file; returns the files' weights, dequantized, under transformers' names."""
    cfg = model.config
    v = cfg.vision_config
    state = {k: t.detach().float().numpy() for k, t in model.state_dict().items()
             if k.startswith(("model.vision_tower.", "model.multi_modal_projector."))}
    back: dict[str, torch.Tensor] = {}
    with GGUFWriter(path) as w:
        w.add("general.architecture", "clip")
        w.add("general.type", "mmproj")
        w.add("general.name", "tiny-gemma3-vision")
        w.add("general.file_type", {"F32": 0, "F16": 1, "Q8_0": 7, "BF16": 32}[ftype])
        w.add("clip.has_vision_encoder", True)
        w.add("clip.vision.projection_dim", cfg.text_config.hidden_size)
        w.add("clip.vision.image_size", v.image_size)
        w.add("clip.vision.patch_size", v.patch_size)
        w.add("clip.vision.embedding_length", v.hidden_size)
        w.add("clip.vision.feed_forward_length", v.intermediate_size)
        w.add("clip.vision.block_count", v.num_hidden_layers)
        w.add("clip.vision.attention.head_count", v.num_attention_heads)
        w.add("clip.vision.image_mean", IMAGE_MEAN)
        w.add("clip.vision.image_std", IMAGE_STD)
        w.add("clip.projector_type", "gemma3")
        w.add("clip.vision.attention.layer_norm_epsilon", float(v.layer_norm_eps))
        w.add("clip.use_gelu", True)
        scale = (v.image_size // v.patch_size) // int(cfg.mm_tokens_per_image ** 0.5)
        if scale != 4:
            w.add("clip.vision.projector.scale_factor", scale)
        for hf, value in state.items():
            name = hf[len("model."):]
            if name == "multi_modal_projector.mm_input_projection_weight":
                gname, stored = "mm.input_projection.weight", value
            elif name == "multi_modal_projector.mm_soft_emb_norm.weight":
                gname, stored = "mm.soft_emb_norm.weight", value + 1.0  # Gemma3RMSNorm's 1 + w
            elif name.startswith("vision_tower.head."):
                continue  # the pooling head the converter skips
            elif name.startswith("vision_tower.embeddings."):
                kind = name.split(".")[2]
                gname = {"patch_embedding": "v.patch_embd", "position_embedding": "v.position_embd"}[kind]
                gname, stored = f"{gname}.{name.rsplit('.', 1)[1]}", value
            elif name.startswith("vision_tower.post_layernorm."):
                gname, stored = f"v.post_ln.{name.rsplit('.', 1)[1]}", value
            else:
                parts = name.split(".")  # vision_tower.encoder.layers.N.<module>.<kind>
                layer, module, kind = parts[3], ".".join(parts[4:-1]), parts[-1]
                gname, stored = f"v.blk.{layer}.{SIGLIP_NAMES[module]}.{kind}", value
            qt = _vision_type(ftype, gname, stored.ndim)
            if qt == GGMLType.Q8_0 and stored.shape[-1] % 32:  # gguf-py cannot: the converter falls back to F16
                qt = GGMLType.F16
            stored = np.ascontiguousarray(stored, dtype=np.float32)
            if qt == GGMLType.F32:
                w.add_tensor(gname, stored)
                got = stored
            else:
                packed = quantize(stored.reshape(-1, stored.shape[-1]), qt)
                w.add_tensor(gname, packed, ggml_type=qt, shape=stored.shape)
                got = dequantize(packed, qt, stored.shape)
            if gname == "mm.soft_emb_norm.weight":
                got = got - 1.0
            back[hf] = torch.from_numpy(np.array(got, dtype=np.float32).reshape(value.shape))
    return back


def tiny_gemma3_vlm(folder, text_mix: str = "F32", vision_ftype: str = "F32", seed: int = 0,
                    chat_template: str = GEMMA3_VISION_TEMPLATE) -> TinyVLM:
    """A random tiny Gemma 3 vision-language model as folder/tiny-gemma3-vl.gguf (text,
    `text_mix`) and folder/mmproj-tiny-gemma3-vl.gguf (vision, `vision_ftype`)."""
    cfg = gemma3_vlm_config()
    vlm = Gemma3ForConditionalGeneration(cfg).eval()
    _randomize(vlm, seed)
    s = spec("gemma3")
    s = Spec(s.arch, s.model_class, cfg.text_config, GEMMA3_NAMES)
    text = s.model_class(cfg.text_config).eval()
    text.model.load_state_dict(vlm.model.language_model.state_dict())
    text_path, vision_path = folder / "tiny-gemma3-vl.gguf", folder / "mmproj-tiny-gemma3-vl.gguf"
    dense = write_gguf(s, text, text_path, text_mix, chat_template=chat_template, extra_tokens=GEMMA3_IMAGE_TOKENS)
    vlm.model.language_model.load_state_dict(dense.model.state_dict())
    vision = write_gemma3_mmproj(vlm, vision_path, vision_ftype)
    missing = vlm.load_state_dict(vision, strict=False)
    assert not missing.unexpected_keys, missing.unexpected_keys
    side = cfg.vision_config.image_size
    return TinyVLM(str(text_path), str(vision_path), vlm, cfg.image_token_id, side, cfg.mm_tokens_per_image)
