"""Tiny random vision-language models from transformers' configs, written as llama.cpp's
converter writes them: the text model by tiny_models.write_gguf, the vision tower and
projector as a separate `mmproj` file (`convert_hf_to_gguf.py --mmproj`: its keys,
tensor names, forced types and transforms, read in the llama-cpp-python 0.3.36 sdist,
conversion/base.py MmprojModel and conversion/gemma.py Gemma3VisionModel).

`tiny_gemma3_vlm` returns the files and a transformers model carrying exactly the
weights the files hold (dequantized), the oracle for the engine's image features and
logits."""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from transformers import Gemma3Config, Gemma3ForConditionalGeneration

from gguf_serve.gguf_io import GGMLType, GGUFWriter, dequantize, quantize

from tiny_metadata import VOCAB, byte_level_vocab
from tiny_models import GEMMA3_NAMES, Spec, spec, write_gguf

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


def _header(w, name: str, ftype: str, text_width: int, image_size: int, patch: int, hidden: int, ffn: int,
            blocks: int, heads: int) -> None:
    """The keys every vision file starts with (conversion/base.py MmprojModel.set_gguf_parameters)."""
    w.add("general.architecture", "clip")
    w.add("general.type", "mmproj")
    w.add("general.name", name)
    w.add("general.file_type", {"F32": 0, "F16": 1, "Q8_0": 7, "BF16": 32}[ftype])
    w.add("clip.has_vision_encoder", True)
    w.add("clip.vision.projection_dim", text_width)
    w.add("clip.vision.image_size", image_size)
    w.add("clip.vision.patch_size", patch)
    w.add("clip.vision.embedding_length", hidden)
    w.add("clip.vision.feed_forward_length", ffn)
    w.add("clip.vision.block_count", blocks)
    w.add("clip.vision.attention.head_count", heads)
    w.add("clip.vision.image_mean", IMAGE_MEAN)
    w.add("clip.vision.image_std", IMAGE_STD)


def write_gemma3_mmproj(model, path, ftype: str = "F32") -> dict[str, torch.Tensor]:
    """The vision tower and projector of a Gemma3ForConditionalGeneration as the converter's
    --mmproj file; returns the files' weights, dequantized, under transformers' names."""
    cfg = model.config
    v = cfg.vision_config
    state = {k: t.detach().float().numpy() for k, t in model.state_dict().items()
             if k.startswith(("model.vision_tower.", "model.multi_modal_projector."))}
    back: dict[str, torch.Tensor] = {}
    with GGUFWriter(path) as w:
        _header(w, "tiny-gemma3-vision", ftype, cfg.text_config.hidden_size, v.image_size, v.patch_size,
                v.hidden_size, v.intermediate_size, v.num_hidden_layers, v.num_attention_heads)
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
            _add(w, back, hf, gname, stored, _vision_type(ftype, gname, stored.ndim))
            if gname == "mm.soft_emb_norm.weight":
                back[hf] = back[hf] - 1.0
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


# ----------------------------------------------------------------------------- Qwen3.5

QWEN35_IMAGE_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>")
# Qwen3.5's chat template, reduced: an image part is <|vision_start|><|image_pad|><|vision_end|>
QWEN35_VISION_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' }}"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for item in m['content'] %}"
    "{% if item['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# transformers' Qwen3-VL / Qwen3.5 vision names -> the converter's (gguf-py tensor_mapping)
QWEN_VISION_NAMES = {"norm1": "ln1", "norm2": "ln2", "attn.qkv": "attn_qkv", "attn.proj": "attn_out",
                     "mlp.linear_fc1": "ffn_up", "mlp.linear_fc2": "ffn_down"}


def qwen35_vlm_config(side: int = 8):
    from transformers import Qwen3_5Config

    text = spec("qwen35").config.to_dict()
    text.update(max_position_embeddings=1024)
    tokens, _, _ = byte_level_vocab(VOCAB, extra=QWEN35_IMAGE_TOKENS)
    vision = dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=4, patch_size=16, spatial_merge_size=2,
                  temporal_patch_size=2, out_hidden_size=text["hidden_size"], num_position_embeddings=side * side)
    cfg = Qwen3_5Config(text_config=text, vision_config=vision, image_token_id=tokens.index("<|image_pad|>"),
                        vision_start_token_id=tokens.index("<|vision_start|>"),
                        vision_end_token_id=tokens.index("<|vision_end|>"))
    for c in (cfg, cfg.text_config, cfg.vision_config):
        c._attn_implementation = "sdpa"
    return cfg


def _qwen_vision_type(ftype: str, gname: str, ndim: int) -> GGMLType:
    """The converter's type for a Qwen3-VL vision tensor at --outtype ftype."""
    if ndim < 2 or gname == "v.position_embd.weight":
        return GGMLType.F32
    if gname.startswith("v.patch_embd.weight"):  # MmprojModel.tensor_force_quant: F16 at f16, else F32
        return GGMLType.F16 if ftype == "F16" else GGMLType.F32
    return {"F32": GGMLType.F32, "F16": GGMLType.F16, "BF16": GGMLType.BF16, "Q8_0": GGMLType.Q8_0}[ftype]


def _add(w, back: dict, hf: str, gname: str, value: np.ndarray, qt: GGMLType, part=None) -> None:
    """`value` written as `gname` at type qt (Q8_0 falls back to F16 where rows are not whole
    blocks, as gguf-py does); what the file holds, dequantized, goes to back[hf]."""
    stored = np.ascontiguousarray(value, dtype=np.float32)
    if qt == GGMLType.Q8_0 and stored.shape[-1] % 32:
        qt = GGMLType.F16
    if qt == GGMLType.F32:
        w.add_tensor(gname, stored)
        got = stored
    else:
        packed = quantize(stored.reshape(-1, stored.shape[-1]), qt)
        w.add_tensor(gname, packed, ggml_type=qt, shape=stored.shape)
        got = dequantize(packed, qt, stored.shape)
    got = torch.from_numpy(np.array(got, dtype=np.float32).reshape(value.shape))
    if part is None:
        back[hf] = got
    else:  # one temporal half of the patch convolution
        back.setdefault(hf, [None, None])[part] = got


def write_qwen35_mmproj(model, path, ftype: str = "F32") -> dict[str, torch.Tensor]:
    """Qwen3_5ForConditionalGeneration's vision tower and merger as the converter's --mmproj
    file (conversion/qwen3vl.py); returns the file's weights, dequantized, under
    transformers' names."""
    cfg = model.config
    v = cfg.vision_config
    state = {k: t.detach().float().numpy() for k, t in model.state_dict().items() if k.startswith("model.visual.")}
    back: dict = {}
    with GGUFWriter(path) as w:
        _header(w, "tiny-qwen35-vision", ftype, cfg.text_config.hidden_size,
                int(v.num_position_embeddings ** 0.5 * v.patch_size), v.patch_size, v.hidden_size,
                v.intermediate_size, v.depth, v.num_heads)
        w.add("clip.projector_type", "qwen3vl_merger")
        w.add("clip.use_gelu", True)
        w.add("clip.vision.spatial_merge_size", v.spatial_merge_size)
        w.add("clip.vision.attention.layer_norm_epsilon", float(cfg.text_config.rms_norm_eps))
        w.add("clip.vision.is_deepstack_layers", [False] * v.depth)
        for hf, value in state.items():
            name = hf[len("model.visual."):]
            kind = name.rsplit(".", 1)[1]
            if name == "patch_embed.proj.weight":  # Conv3d split into its two temporal halves
                for part, suffix in ((0, ""), (1, ".1")):
                    g = "v.patch_embd.weight" + suffix
                    _add(w, back, hf, g, value[:, :, part], _qwen_vision_type(ftype, g, 4), part)
                continue
            if name == "patch_embed.proj.bias":
                gname = "v.patch_embd.bias"
            elif name == "pos_embed.weight":
                gname = "v.position_embd.weight"
            elif name.startswith("merger.norm."):
                gname = f"v.post_ln.{kind}"
            elif name.startswith("merger.linear_fc"):
                gname = f"mm.{0 if name.startswith('merger.linear_fc1') else 2}.{kind}"
            else:
                parts = name.split(".")  # blocks.N.<module>.<kind>
                gname = f"v.blk.{parts[1]}.{QWEN_VISION_NAMES['.'.join(parts[2:-1])]}.{kind}"
            _add(w, back, hf, gname, value, _qwen_vision_type(ftype, gname, value.ndim))
    halves = back["model.visual.patch_embed.proj.weight"]
    back["model.visual.patch_embed.proj.weight"] = torch.stack(halves, dim=2)
    return back


def tiny_qwen35_vlm(folder, text_mix: str = "F32", vision_ftype: str = "F32", seed: int = 0,
                    chat_template: str = QWEN35_VISION_TEMPLATE) -> TinyVLM:
    """A random tiny Qwen3.5 vision-language model as folder/tiny-qwen35-vl.gguf (text) and
    folder/mmproj-tiny-qwen35-vl.gguf (vision)."""
    from transformers import Qwen3_5ForConditionalGeneration

    cfg = qwen35_vlm_config()
    vlm = Qwen3_5ForConditionalGeneration(cfg).eval()
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in vlm.named_parameters():
            if "visual" in name and "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif "visual" in name and name.endswith("bias"):
                p.copy_(0.05 * torch.randn_like(p))
            elif "visual" in name and "pos_embed" in name:
                p.copy_(0.5 * torch.randn_like(p))
            elif "visual" in name:
                p.copy_(torch.randn_like(p) / p[0].numel() ** 0.5)
    s = spec("qwen35")
    s = Spec(s.arch, s.model_class, cfg.text_config, s.names)
    text = s.model_class(cfg.text_config).eval()
    text.model.load_state_dict(vlm.model.language_model.state_dict())
    text.lm_head.load_state_dict(vlm.lm_head.state_dict())
    from tiny_models import random_model  # the text weights as the text tests randomize them

    donor = random_model(Spec(s.arch, s.model_class, cfg.text_config, s.names), seed=seed)
    text.load_state_dict(donor.state_dict())
    text_path, vision_path = folder / "tiny-qwen35-vl.gguf", folder / "mmproj-tiny-qwen35-vl.gguf"
    dense = write_gguf(s, text, text_path, text_mix, chat_template=chat_template, extra_tokens=QWEN35_IMAGE_TOKENS)
    vlm.model.language_model.load_state_dict(dense.model.state_dict())
    vlm.lm_head.load_state_dict(dense.lm_head.state_dict())
    vision = write_qwen35_mmproj(vlm, vision_path, vision_ftype)
    missing = vlm.load_state_dict(vision, strict=False)
    assert not missing.unexpected_keys, missing.unexpected_keys
    return TinyVLM(str(text_path), str(vision_path), vlm, cfg.image_token_id, 0, 0)


# chat requests with images, as the server tests send them
def data_url(seed: int = 0, fmt: str = "PNG", size=(60, 40)) -> str:
    a = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


def image(url: str, **extra) -> dict:
    return {"type": "image_url", "image_url": {"url": url, **extra}}


def user(*parts) -> dict:
    return {"role": "user", "content": [{"type": "text", "text": "look at this"}, *parts]}
