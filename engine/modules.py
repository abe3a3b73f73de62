"""Packed modules: the only parts of the engine that hold GGUF blocks. They keep the
file's bytes (a uint8 tensor over the memory map) and call the kernels chosen for
their device and type; nothing here dequantizes a whole weight."""

from __future__ import annotations

import types
from typing import Callable

import torch
from torch import nn

from ..gguf_io import GGMLType
from . import kernels


class _Packed(nn.Module):
    """A module over packed bytes: kernels are chosen on first use, and chosen again
    after the module moves to another device."""

    _ops = None

    def _apply(self, fn, recurse=True):
        self._ops = None
        return super()._apply(fn, recurse)


class GgufLinear(_Packed):
    """y = x @ W.T (+ bias) with W packed as GGUF rows (out_features, row_bytes).

    `out_perm` and `in_perm`, when set, undo a row or column permutation llama.cpp's
    converter applied (Llama's q/k head interleave, Qwen3.5's V-head reorder): the
    output is gathered by `out_perm`, the input by `in_perm`."""

    def __init__(self, packed: torch.Tensor, ggml_type: GGMLType, in_features: int, out_features: int,
                 bias: torch.Tensor | None = None, out_perm: torch.Tensor | None = None,
                 in_perm: torch.Tensor | None = None):
        super().__init__()
        self.ggml_type = GGMLType(ggml_type)
        self.in_features = in_features
        self.out_features = out_features
        self.register_buffer("packed", packed, persistent=False)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None
        self.register_buffer("out_perm", out_perm, persistent=False)
        self.register_buffer("in_perm", in_perm, persistent=False)
        self._plain = bias is None and out_perm is None and in_perm is None  # forward is one kernel call

    def _kernels(self) -> kernels.KernelOps:
        if self._ops is None:
            self._ops = kernels.select(self.packed.device, self.ggml_type)
        return self._ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._plain:
            return (self._ops or self._kernels()).mul_mat(self.packed, x, self.ggml_type, self.out_features)
        if self.in_perm is not None:
            x = x.index_select(-1, self.in_perm)
        y = self._kernels().mul_mat(self.packed, x, self.ggml_type, self.out_features)
        if self.out_perm is not None:
            y = y.index_select(-1, self.out_perm)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, type={self.ggml_type.name}"


class GgufEmbedding(_Packed):
    """Row lookup into a packed (num_embeddings, row_bytes) table, times `scale`."""

    def __init__(self, packed: torch.Tensor, ggml_type: GGMLType, num_embeddings: int, embedding_dim: int,
                 dtype: torch.dtype, scale: float | None = None):
        super().__init__()
        self.ggml_type = GGMLType(ggml_type)
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.dtype = dtype
        self.scale = scale
        self.register_buffer("packed", packed, persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self._ops is None:
            self._ops = kernels.select(self.packed.device, self.ggml_type)
        out = self._ops.get_rows(self.packed, input_ids, self.ggml_type, self.embedding_dim, self.dtype)
        if self.scale is not None:
            out = out * torch.tensor(self.scale, dtype=self.dtype)
        return out

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, type={self.ggml_type.name}"


class GgufExperts(_Packed):
    """A mixture-of-experts feed-forward over packed expert tensors (llama.cpp's
    ffn_gate_exps / ffn_up_exps / ffn_down_exps), with transformers' experts interface:
    forward(hidden_states (T, H), top_k_index (T, K), top_k_weights (T, K))."""

    def __init__(self, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor,
                 types: tuple[GGMLType, GGMLType, GGMLType], hidden: int, intermediate: int, act_fn):
        super().__init__()
        self.register_buffer("gate", gate, persistent=False)
        self.register_buffer("up", up, persistent=False)
        self.register_buffer("down", down, persistent=False)
        self.types = tuple(GGMLType(t) for t in types)
        self.num_experts = gate.shape[0]
        self.hidden = hidden
        self.intermediate = intermediate
        self.act_fn = act_fn

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        if self._ops is None:
            self._ops = [kernels.select(self.gate.device, t) for t in self.types]
        g_ops, u_ops, d_ops = self._ops
        g = g_ops.mul_mat_id(self.gate, hidden_states, top_k_index, self.types[0], self.intermediate)
        u = u_ops.mul_mat_id(self.up, hidden_states, top_k_index, self.types[1], self.intermediate)
        h = self.act_fn(g) * u
        d = d_ops.mul_mat_id(self.down, h, top_k_index, self.types[2], self.hidden)
        return (d * top_k_weights.unsqueeze(-1).to(d.dtype)).sum(dim=1).to(hidden_states.dtype)

    def extra_repr(self) -> str:
        return f"experts={self.num_experts}, hidden={self.hidden}, intermediate={self.intermediate}, types={[t.name for t in self.types]}"


# transformers' RMSNorm classes whose forward is, in float32,
# x * rsqrt(mean(x²) + eps) * w  (or * (1 + w)): class name -> (eps attribute, 1 + w)
RMS_NORMS = {
    "LlamaRMSNorm": ("variance_epsilon", False),
    "MistralRMSNorm": ("variance_epsilon", False),
    "Qwen2RMSNorm": ("variance_epsilon", False),
    "Qwen3RMSNorm": ("variance_epsilon", False),
    "Qwen3MoeRMSNorm": ("variance_epsilon", False),
    "Phi3RMSNorm": ("variance_epsilon", False),
    "Gemma3RMSNorm": ("eps", True),
    "Qwen3_5RMSNorm": ("eps", True),
    "Qwen3_5MoeRMSNorm": ("eps", True),
}


def use_native_norms(model: nn.Module, rms_norm: Callable) -> int:
    """Route the float32 CPU calls of the model's RMSNorm modules (the classes in
    RMS_NORMS) to `rms_norm(x, weight, eps, add_one)`; anything else (another dtype or
    device) still runs the class's own forward. Returns how many modules were routed."""
    n = 0
    for module in model.modules():
        spec = RMS_NORMS.get(type(module).__name__)
        if spec is None or getattr(module, "weight", None) is None:
            continue
        module._native_norm = (rms_norm, float(getattr(module, spec[0])), spec[1])
        module.forward = types.MethodType(_native_norm_forward, module)
        n += 1
    return n


def _native_norm_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    rms_norm, eps, add_one = self._native_norm
    w = self.weight
    if x.dtype is torch.float32 and w.dtype is torch.float32 and x.device.type == "cpu" and w.device.type == "cpu":
        return rms_norm(x, w, eps, add_one)
    return type(self).forward(self, x)
