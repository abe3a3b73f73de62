"""GGUF file → transformers model whose quantized weights stay packed in the map.

The model is built on the meta device; every nn.Linear and nn.Embedding is then
replaced by a packed module over the file's bytes (zero copy), the small dense
tensors (norms, biases) are loaded as tensors, and buffers computed at construction
(rotary frequencies) are rebuilt on the real device. Nothing is dequantized here."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..gguf_io import GGUFReader, TensorInfo
from .architectures import architecture_for
from .architectures.base import Architecture
from . import kernels
from .kernels.reference import as_tensor
from .modules import GgufEmbedding, GgufExperts, GgufLinear

log = logging.getLogger("gguf_serve.engine")


class ModelLoadError(ValueError):
    """The file's tensors do not fit the model its metadata describes."""


def pick_device(device: str | torch.device = "auto") -> torch.device:
    if str(device) != "auto":
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    return {"cuda": torch.bfloat16, "mps": torch.float16}.get(device.type, torch.float32)


@dataclass
class LoadedModel:
    """What `load_model` returns: the model, its tokenizer and chat template, the reader."""

    model: nn.Module
    tokenizer: Any
    chat_template: str | None
    config: Any
    gguf: GGUFReader
    architecture: Architecture
    device: torch.device
    dtype: torch.dtype

    def generate(self, *args, **kwargs):
        from .generate import generate

        return generate(self, *args, **kwargs)


class _Packer:
    """Hands out one torch view per GGUF tensor (a tied head reuses the embedding's)."""

    def __init__(self, reader: GGUFReader):
        self.reader = reader
        self.views: dict[str, torch.Tensor] = {}

    def info(self, name: str) -> TensorInfo:
        return self.reader.tensors[name]

    def packed(self, name: str) -> torch.Tensor:
        if name not in self.views:
            self.views[name] = as_tensor(self.reader.tensors[name].data)
        return self.views[name]


def _expect_shape(info: TensorInfo, shape: tuple[int, ...], hf_name: str) -> None:
    if tuple(info.shape) != tuple(shape):
        raise ModelLoadError(f"tensor {info.name!r} has shape {tuple(info.shape)}, but {hf_name} needs {tuple(shape)}")


def _replace_packed_modules(model: nn.Module, arch: Architecture, packer: _Packer, config, dtype) -> None:
    tensors = packer.reader.tensors
    for name, module in list(model.named_modules()):
        if _is_fused_experts(module):
            model.set_submodule(name, _packed_experts(name, module, arch, packer))
        elif isinstance(module, nn.Linear):
            hf = f"{name}.weight"
            gname = arch.gguf_name(hf)
            if gname not in tensors and name == "lm_head":
                gname = "token_embd.weight"  # tied output head: share the embedding's bytes
            if gname not in tensors:
                raise ModelLoadError(f"{packer.reader.path}: no tensor {gname!r} for {hf}")
            info = packer.info(gname)
            packed = packer.packed(gname)
            if module.out_features == 1 and tuple(info.shape) == (module.in_features,):
                packed = packed.reshape(1, -1)  # a one-row matrix stored as a vector (e.g. a shared-expert gate)
            else:
                _expect_shape(info, (module.out_features, module.in_features), hf)
            bias = None
            if module.bias is not None:
                bname = arch.gguf_name(f"{name}.bias")
                if bname not in tensors:
                    raise ModelLoadError(f"{packer.reader.path}: no tensor {bname!r} for {name}.bias")
                bias = arch.dense(f"{name}.bias", tensors[bname].dequantize(), config).to(dtype)
            new = GgufLinear(packed, info.ggml_type, module.in_features, module.out_features,
                             bias=bias, out_perm=arch.output_permutation(hf, config),
                             in_perm=arch.input_permutation(hf, config))
            model.set_submodule(name, new)
        elif isinstance(module, nn.Embedding):
            hf = f"{name}.weight"
            gname = arch.gguf_name(hf)
            if gname not in tensors:
                raise ModelLoadError(f"{packer.reader.path}: no tensor {gname!r} for {hf}")
            info = packer.info(gname)
            _expect_shape(info, (module.num_embeddings, module.embedding_dim), hf)
            scale = getattr(module, "scalar_embed_scale", None)
            new = GgufEmbedding(packer.packed(gname), info.ggml_type, module.num_embeddings, module.embedding_dim,
                                dtype=dtype, scale=scale)
            model.set_submodule(name, new)


def _is_fused_experts(module: nn.Module) -> bool:
    p = getattr(module, "gate_up_proj", None)
    return isinstance(p, nn.Parameter) and p.dim() == 3 and isinstance(getattr(module, "down_proj", None), nn.Parameter)


def _packed_experts(name: str, module: nn.Module, arch: Architecture, packer: _Packer) -> GgufExperts:
    names = arch.experts_names(name)
    if names is None or any(n not in packer.reader.tensors for n in names):
        raise ModelLoadError(f"{packer.reader.path}: no expert tensors {names} for {name}")
    n_exp, two_i, hidden = module.gate_up_proj.shape
    inter = two_i // 2
    gate_info, down_info = packer.info(names[0]), packer.info(names[2])
    _expect_shape(down_info, (n_exp, hidden, inter), f"{name} (down)")
    if names[0] == names[1]:  # fused gate_up experts: the first half of each expert's rows is the gate
        _expect_shape(gate_info, (n_exp, two_i, hidden), f"{name} (gate_up)")
        fused = packer.packed(names[0])
        gate, up = fused[:, :inter], fused[:, inter:]
        types = (gate_info.ggml_type, gate_info.ggml_type, down_info.ggml_type)
    else:
        up_info = packer.info(names[1])
        _expect_shape(gate_info, (n_exp, inter, hidden), f"{name} (gate)")
        _expect_shape(up_info, (n_exp, inter, hidden), f"{name} (up)")
        gate, up = packer.packed(names[0]), packer.packed(names[1])
        types = (gate_info.ggml_type, up_info.ggml_type, down_info.ggml_type)
    return GgufExperts(gate, up, packer.packed(names[2]), types, hidden=hidden, intermediate=inter,
                       act_fn=module.act_fn)


def _load_dense(model: nn.Module, arch: Architecture, reader: GGUFReader, config, dtype) -> None:
    for name, param in list(model.named_parameters()):
        if param.device.type != "meta":
            continue
        gname = arch.gguf_name(name)
        if gname is None or gname not in reader.tensors:
            raise ModelLoadError(f"{reader.path}: no tensor for parameter {name} (looked for {gname!r})")
        info = reader.tensors[gname]
        value = arch.dense(name, info.dequantize(), config)
        if tuple(value.shape) != tuple(param.shape):
            raise ModelLoadError(f"tensor {gname!r} has shape {tuple(value.shape)}, but {name} needs {tuple(param.shape)}")
        owner, _, attr = name.rpartition(".")
        setattr(model.get_submodule(owner), attr, nn.Parameter(value.to(dtype), requires_grad=False))


def _rebuild_buffers(model: nn.Module) -> None:
    for name, module in list(model.named_modules()):
        if type(module).__name__.endswith("RotaryEmbedding"):
            model.set_submodule(name, type(module)(module.config))
    left = [n for n, b in model.named_buffers() if b.device.type == "meta"]
    left += [n for n, p in model.named_parameters() if p.device.type == "meta"]
    if left:
        raise ModelLoadError(f"tensors left unmaterialized after loading: {', '.join(left[:5])}")


def resolve_path(path_or_id: str | os.PathLike) -> str:
    """A local .gguf path, or a Hub `<repo>[@<revision>]:<file>.gguf` fetched (with every
    shard of a split model) through huggingface_hub."""
    p = os.fspath(path_or_id)
    if os.path.exists(p):
        return p
    from .hub import download, parse

    ref = parse(p)
    if ref is not None and ref.filename is not None:
        return download(ref.repo, ref.filename, ref.revision)
    raise FileNotFoundError(f"no such GGUF file: {p} (give a local path or <repo>:<file>.gguf)")


LOAD_STAGES = ("reading the file", "building the model", "tokenizer")


def load_model(path_or_id: str | os.PathLike, device: str | torch.device = "auto",
               dtype: torch.dtype | None = None, progress=None) -> LoadedModel:
    """Load a GGUF model with its weights packed; see LoadedModel. `progress`, if given,
    is called with each of LOAD_STAGES as it starts."""
    step = progress or (lambda stage: None)
    path = resolve_path(path_or_id)
    step(LOAD_STAGES[0])
    reader = GGUFReader(path)
    arch = architecture_for(reader)
    config = arch.config()
    config._attn_implementation = "sdpa"
    dev = pick_device(device)
    dtype = dtype or default_dtype(dev)
    step(LOAD_STAGES[1])
    with torch.device("meta"):
        model = arch.model_class(config)
    model.eval()
    packer = _Packer(reader)
    _replace_packed_modules(model, arch, packer, config, dtype)
    _load_dense(model, arch, reader, config, dtype)
    _rebuild_buffers(model)
    if dev.type != "cpu":
        model.to(dev)
    elif kernels.native_cpu_in_use():
        from .kernels import cpu
        from .modules import use_native_norms

        use_native_norms(model, cpu.rms_norm)
    from .tokenizer import load_tokenizer
    from .chat import chat_template_for

    step(LOAD_STAGES[2])
    tokenizer = load_tokenizer(reader)
    template = chat_template_for(reader, arch)
    log.info("loaded %s (%s) on %s in %s", path, arch.name, dev, dtype)
    return LoadedModel(model, tokenizer, template, config, reader, arch, dev, dtype)
