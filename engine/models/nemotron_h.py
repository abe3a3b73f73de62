"""nemotron_h (NVIDIA's dense Nemotron-H: Mamba-2, attention and MLP layers, as llama.cpp's
converter writes them, conversion/nemotron.py NemotronHModel; nemotron_h_moe.py's Nemotron 3
Nano the same with expert layers): every layer is one of these, x + part(rms_norm(x)): a Mamba-2 mixer as Granite 4's (granitehybrid.Mamba2: groups,
a biased causal conv, D skip, the grouped gated norm), attention without positions (no
rotary) whose layers the file marks with a key-value head count, or an MLP (down(relu(up(x))
^2)) where the file gives a feed-forward length, routed experts of that MLP's kind where the
layer has a router (sigmoid scores plus the file's bias choose, renormalized and scaled, a
shared expert added; a latent projection around the experts where the file has one); a
final norm and the head."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...gguf_io import Keys
from ..batch import Batch
from ..cache import nothing
from ..errors import WeightError
from ..modules import Weights
from .base import Model, output_head
from .granitehybrid import Mamba2
from .layers import Attention, MoE, Rope
from .params import Metadata, TextParams, kv_heads_per_layer, per_layer

ARCHITECTURE = "nemotron_h"


@dataclass
class Params(TextParams):
    kinds: list[str] = field(default_factory=list)  # per layer: "mamba", "attention" or "mlp"
    ffns: list[int] = field(default_factory=list)
    conv_kernel: int = 4
    state: int = 128
    groups: int = 1
    inner: int = 0
    ssm_heads: int = 0
    n_experts: int = 0  # nemotron_h_moe
    n_experts_used: int = 0
    expert_ffn: int = 0
    shared_ffn: int = 0
    norm_topk: bool = True
    expert_scale: float = 1.0
    groups_e: int = 1  # expert groups, and how many of them a token's experts come from
    groups_used: int = 1

    @staticmethod
    def read(m: Metadata, c: dict) -> dict:
        n = c["n_layers"]
        kv = kv_heads_per_layer(m, c)
        ffns = [int(f) for f in per_layer(m, Keys.FEED_FORWARD_LENGTH, c["ffn"], n)]
        kinds = ["attention" if kv[i] else "mlp" if ffns[i] else "mamba" for i in range(n)]
        attn = sorted({h for h in kv if h})
        if len(attn) > 1:
            raise ValueError(f"{m.path}: {m.key(Keys.HEAD_COUNT_KV)} {kv} is not one count for the attention layers")
        inner, heads, groups = m.get(Keys.SSM_INNER_SIZE), m.get(Keys.SSM_TIME_STEP_RANK), m.get(Keys.SSM_GROUP_COUNT)
        if inner % heads or heads % groups:
            raise ValueError(f"{m.path}: Mamba-2 inner size {inner}, {heads} heads and {groups} groups do not divide")
        n_ff_exp = m.get(Keys.EXPERT_FEED_FORWARD_LENGTH, 0) or 0
        return dict(kinds=kinds, ffns=ffns, ffn=max(ffns), n_kv_heads=attn[0] if attn else c["n_heads"],
                    conv_kernel=m.get(Keys.SSM_CONV_KERNEL), state=m.get(Keys.SSM_STATE_SIZE), groups=groups,
                    inner=inner, ssm_heads=heads, n_experts=m.get(Keys.EXPERT_COUNT, 0) or 0,
                    n_experts_used=m.get(Keys.EXPERT_USED_COUNT, 0) or 0,
                    expert_ffn=max(n_ff_exp) if isinstance(n_ff_exp, list) else n_ff_exp,
                    shared_ffn=m.get(Keys.EXPERT_SHARED_FEED_FORWARD_LENGTH, 0) or 0,
                    norm_topk=bool(m.get(Keys.EXPERT_WEIGHTS_NORM, False)),
                    expert_scale=float(m.get(Keys.EXPERT_WEIGHTS_SCALE, 1.0) or 1.0),
                    groups_e=m.get(Keys.EXPERT_GROUP_COUNT, 1) or 1, groups_used=m.get(Keys.EXPERT_GROUP_USED_COUNT, 1) or 1)


class ReluSquared:
    """down(relu(up(x))^2), the biases where the file has them."""

    def __init__(self, w: Weights, i: int, hidden: int, ffn: int, suffix: str = ""):
        pre = f"blk.{i}."
        self.up = w.linear(f"{pre}ffn_up{suffix}.weight", ffn, hidden, bias=f"{pre}ffn_up{suffix}.bias")
        self.down = w.linear(f"{pre}ffn_down{suffix}.weight", hidden, ffn, bias=f"{pre}ffn_down{suffix}.bias")

    def cache_spec(self):
        return nothing()

    def __call__(self, x: torch.Tensor, batch: Batch, cache) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)).square())


class ReluSquaredExperts(MoE):
    """Routed relu-squared experts (up and down only) and a shared one: MoE's sigmoid routing,
    the experts' products as one mixture-of-experts call each."""

    def __init__(self, w: Weights, i: int, p: Params, ops):
        pre = f"blk.{i}."
        e, ffn = p.n_experts, p.expert_ffn
        width = w.info(pre + "ffn_latent_down.weight").shape[0] if w.has(pre + "ffn_latent_down.weight") else p.hidden
        self.ops, self.n_used, self.norm_topk, self.act = ops, p.n_experts_used, p.norm_topk, "relu2"
        self.router = w.linear(pre + "ffn_gate_inp.weight", e, p.hidden)
        self.sigmoid, self.scale, self.groups, self.groups_used = True, p.expert_scale, p.groups_e, p.groups_used
        self.choice_bias = w.vector(pre + "exp_probs_b.bias", e)
        self.latent_down = w.linear(pre + "ffn_latent_down.weight", width, p.hidden) if width != p.hidden else None
        self.latent_up = w.linear(pre + "ffn_latent_up.weight", p.hidden, width) if width != p.hidden else None
        self.up = w.packed(pre + "ffn_up_exps.weight")
        self.down = w.packed(pre + "ffn_down_exps.weight")
        up, down = w.info(pre + "ffn_up_exps.weight"), w.info(pre + "ffn_down_exps.weight")
        if tuple(up.shape) != (e, ffn, width) or tuple(down.shape) != (e, width, ffn):
            raise WeightError(f"{w.reader.path}: blk.{i}'s experts are {tuple(up.shape)} / {tuple(down.shape)}, "
                              f"expected {(e, ffn, width)} / {(e, width, ffn)}")
        self.types = (up.ggml_type, down.ggml_type)
        self.kernels = [w.settings.select(self.up.device, t) for t in self.types]
        self.width, self.ffn = width, ffn
        self.shared = ReluSquared(w, i, p.hidden, p.shared_ffn, suffix="_shexp") if p.shared_ffn else None
        self.shared_gate = None

    def cache_spec(self):
        return nothing()

    def __call__(self, x: torch.Tensor, batch: Batch | None = None, cache=None) -> torch.Tensor:
        weights, ids = self.route(x)
        h = x if self.latent_down is None else self.latent_down(x)
        up = self.kernels[0].mul_mat_id(self.up, h.float().contiguous(), ids, self.types[0], self.ffn)
        y = self.kernels[1].mul_mat_id(self.down, torch.relu(up).square().contiguous(), ids, self.types[1], self.width)
        y = self.ops.moe_combine(y, weights).to(x.dtype)
        if self.latent_up is not None:
            y = self.latent_up(y)
        return y if self.shared is None else y + self.shared(x, batch, cache)


class Layer:
    def __init__(self, w: Weights, i: int, p: Params, ops):
        self.ops, self.eps = ops, p.eps
        self.norm = w.vector(f"blk.{i}.attn_norm.weight", p.hidden)
        kind = p.kinds[i]
        if kind == "attention":
            self.part = Attention(w, i, ops, hidden=p.hidden, n_heads=p.n_heads, n_kv_heads=p.n_kv_heads,
                                  head_dim=p.head_dim, eps=p.eps, rope=Rope.none())
        elif kind == "mlp" and w.has(f"blk.{i}.ffn_gate_inp.weight"):
            self.part = ReluSquaredExperts(w, i, p, ops)
        elif kind == "mlp":
            self.part = ReluSquared(w, i, p.hidden, p.ffns[i])
        else:
            self.part = Mamba2(w, i, p, ops)

    def cache_spec(self):
        return self.part.cache_spec()

    def __call__(self, x: torch.Tensor, batch: Batch, cache) -> torch.Tensor:
        return x + self.part(self.ops.rms_norm(x, self.norm, self.eps), batch, cache)


def build(p: Params, w: Weights, ops) -> Model:
    return Model(ops, w.embedding("token_embd.weight", p.vocab_size, p.hidden),
                 [Layer(w, i, p, ops) for i in range(p.n_layers)], w.vector("output_norm.weight", p.hidden),
                 output_head(w, p.vocab_size, p.hidden), p.eps, p.vocab_size)
