"""lfm2 (Liquid's LFM2 and LFM2.5 dense models, as llama.cpp's converter writes them:
conversion/lfm2.py): most layers are gated short convolutions, the rest attention;
`attention.head_count_kv` is a per-layer list, 0 marking a convolution layer.

Convolution layer: in_proj gives B, C, x (hidden each); B * x goes through a
depthwise causal conv of `shortconv.l_cache` taps (no bias, no activation), whose
last taps - 1 inputs are the slot's state; C times the result goes through out_proj.
Attention layer: per-head RMS norms on q and k, NeoX rotary (the converter leaves q/k
unpermuted). Both are pre-norm (`attn_norm`, transformers' operator_norm) with a
SwiGLU MLP after `ffn_norm`; the final norm is stored as `token_embd_norm` (the
checkpoint's embedding_norm, applied after the last layer)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...gguf_io import Keys
from ..cache import LayerCache, linear
from ..modules import Weights
from .base import Model, standard_model
from .layers import MLP, Attention, Block, Rope
from .params import Metadata, TextParams, kv_heads_per_layer

ARCHITECTURE = "lfm2"


@dataclass
class Params(TextParams):
    conv_layers: list[bool] = field(default_factory=list)
    conv_kernel: int = 3

    @staticmethod
    def read(m: Metadata, c: dict) -> dict:
        per_layer = kv_heads_per_layer(m, c)
        attn = [n for n in per_layer if n]
        if not attn or len(set(attn)) != 1:
            raise ValueError(f"{m.path}: the attention layers' key/value heads {sorted(set(attn))} are not one "
                             "positive count")
        kernel = m.get(Keys.SHORTCONV_L_CACHE)
        if not 2 <= kernel <= 8:
            raise ValueError(f"{m.path}: {m.key(Keys.SHORTCONV_L_CACHE)} is {kernel}, expected 2 to 8")
        return dict(n_kv_heads=attn[0], conv_layers=[n == 0 for n in per_layer], conv_kernel=kernel)


class ShortConv:
    def __init__(self, w: Weights, i: int, p: Params, ops):
        pre = f"blk.{i}.shortconv."
        self.ops, self.layer, self.hidden, self.kernel = ops, i, p.hidden, p.conv_kernel
        self.in_proj = w.linear(pre + "in_proj.weight", 3 * p.hidden, p.hidden)
        self.out_proj = w.linear(pre + "out_proj.weight", p.hidden, p.hidden)
        conv = w.vector(pre + "conv.weight", p.hidden * p.conv_kernel)
        self.conv_w = conv.reshape(p.hidden, p.conv_kernel).t().contiguous()  # (kernel, hidden)

    def cache_spec(self) -> LayerCache:
        return linear(self.hidden, self.kernel, 0, 0, 0)  # a conv state, no recurrent state

    def __call__(self, x, batch, cache):
        h = self.hidden
        bcx = self.in_proj(x)
        b, c, v = bcx[:, :h], bcx[:, h:2 * h], bcx[:, 2 * h:]
        conv_state, _ = cache.linear_state(self.layer)
        y = self.ops.causal_conv((b * v).float(), conv_state, self.conv_w, batch, silu=False)
        return self.out_proj((c * y).to(x.dtype))


def layer(w: Weights, i: int, p: Params, rope: Rope, ops) -> Block:
    if p.conv_layers[i]:
        mixer = ShortConv(w, i, p, ops)
    else:
        mixer = Attention(w, i, ops, hidden=p.hidden, n_heads=p.n_heads, n_kv_heads=p.n_kv_heads, head_dim=p.head_dim,
                          eps=p.eps, rope=rope, qk_norm="head")
    return Block(w, i, ops, hidden=p.hidden, eps=p.eps, mixer=mixer,
                 mlp=MLP(w, i, ops, hidden=p.hidden, ffn=p.ffn, act="silu"))


def build(p: Params, w: Weights, ops) -> Model:
    rope = Rope.build(p.rope_theta, p.rope_dims, p.rope_scaling, context_length=p.context_length)
    return standard_model(ops, w, p, [layer(w, i, p, rope, ops) for i in range(p.n_layers)],
                          final_norm="token_embd_norm")
