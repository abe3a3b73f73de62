"""gemma4 (Gemma 4: E2B / E4B with per-layer embeddings and shared key-value layers, the
26B-A4B mixture of experts, the 31B dense; as llama.cpp's converter writes them:
conversion/gemma.py Gemma4Model). Sandwich norms as Gemma 3 (weights stored as used,
no 1 + w), RMS-normalized q and k heads with learned scales and v heads without, no
query scaling (1.0), embeddings scaled by sqrt(hidden), GeGLU (tanh GELU), and:

- sliding and full layers as the file lists them (`attention.sliding_window_pattern`),
  each kind with its own head size (key_length_swa / key_length), key-value heads
  (head_count_kv per layer) and rotary: the sliding layers' over
  `rope.dimension_count_swa` dims at `rope.freq_base_swa`, the full layers' over the
  whole head at `rope.freq_base` with rope_freqs (1e30 past the rotated quarter:
  "proportional" rotary);
- full layers without attn_v reuse their keys as values (attention_k_eq_v: the
  projection before k's norm and rotary, normalized as values);
- the last `attention.shared_kv_layers` layers compute queries only and attend over the
  cache of the last earlier layer of their kind;
- per-layer embeddings (`embedding_length_per_layer_input` > 0): per_layer_token_embd
  rows of the tokens (times sqrt of their width) plus the embedded input projected by
  per_layer_model_proj (over sqrt(hidden), RMS-normalized), times 2^-1/2, one slice per
  layer, joined after the feed-forward through a GELU gate and a projection;
- MoE layers (ffn_gate_inp present): the dense MLP and routed experts side by side, the
  router reading the attention output RMS-normalized (no weight), over sqrt(hidden),
  times ffn_gate_inp.scale; softmax, top k, renormalized, times the chosen experts'
  ffn_down_exps.scale;
- each layer's output times layer_output_scale where the file has it; the logits
  soft-capped (final_logit_softcapping);
- images (gemma4_vision): their tokens see each other both ways in the sliding layers,
  except in E2B / E4B; media rows take token 0's per-layer embedding (llama.cpp's)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...gguf_io import Keys
from ..modules import Weights
from .base import Model, standard_model
from .layers import MLP, Attention, Block, Rope
from .params import Metadata, TextParams, kv_heads_per_layer, per_layer, sliding_layers

ARCHITECTURE = "gemma4"
CHAT_TEMPLATE_FALLBACK = "gemma"


@dataclass
class Params(TextParams):
    sliding: list[bool] = field(default_factory=list)  # per layer
    window: int = 0
    head_dim_swa: int = 0
    kv_heads: list[int] = field(default_factory=list)  # per layer
    ffns: list[int] = field(default_factory=list)  # per layer (Gemma 4's double-wide MLP in the shared layers)
    rope_theta_swa: float = 10000.0
    rope_dims_swa: int = 0
    n_shared_kv: int = 0
    per_layer: int = 0  # width of each layer's slice of the per-layer embeddings (0: none)
    n_experts: int = 0
    n_experts_used: int = 0
    expert_ffn: int = 0
    final_softcap: float | None = None

    @staticmethod
    def read(m: Metadata, c: dict) -> dict:
        n = c["n_layers"]
        ffns = per_layer(m, Keys.FEED_FORWARD_LENGTH, c["ffn"], n)
        n_shared = m.get(Keys.SHARED_KV_LAYERS, 0)
        if not 0 <= n_shared < n:
            raise ValueError(f"{m.path}: {n_shared} shared key-value layers of {n}")
        head_swa = m.get(Keys.KEY_LENGTH_SWA)
        return dict(ffn=ffns[0], sliding=sliding_layers(m, n, None), window=m.get(Keys.SLIDING_WINDOW),
                    head_dim_swa=head_swa, kv_heads=kv_heads_per_layer(m, c), ffns=ffns,
                    rope_theta_swa=float(m.get(Keys.ROPE_FREQ_BASE_SWA, 10000.0)),
                    rope_dims_swa=m.get(Keys.ROPE_DIMENSION_COUNT_SWA, head_swa), n_shared_kv=n_shared,
                    per_layer=m.get(Keys.EMBEDDING_LENGTH_PER_LAYER, 0) or 0,
                    n_experts=m.get(Keys.EXPERT_COUNT, 0) or 0, n_experts_used=m.get(Keys.EXPERT_USED_COUNT, 0) or 0,
                    expert_ffn=m.get(Keys.EXPERT_FEED_FORWARD_LENGTH, 0) or 0,
                    final_softcap=m.get(Keys.FINAL_LOGIT_SOFTCAPPING, None))

    def source(self, i: int) -> int:
        """The layer whose cache layer i attends over: itself, or for a shared layer the last
        layer of its kind before the shared ones."""
        first = self.n_layers - self.n_shared_kv
        if i < first:
            return i
        for j in range(first - 1, -1, -1):
            if self.sliding[j] == self.sliding[i]:
                return j
        raise ValueError(f"shared layer {i} has no earlier {'sliding' if self.sliding[i] else 'full'} layer")


# an image's tokens see each other both ways in the sliding layers (the full layers stay
# causal), except in E2B and E4B (these widths), which read images causally: llama.cpp's rule
CAUSAL_IMAGE_WIDTHS = (1536, 2560)


def attention(w: Weights, i: int, p: Params, rope: Rope, ops) -> Attention:
    """Layer i's attention: its kind's head size, the key-value heads of the layer whose cache
    it uses, no query scaling, q/k heads normalized and v heads without weight."""
    src = p.source(i)
    return Attention(w, i, ops, hidden=p.hidden, n_heads=p.n_heads, n_kv_heads=p.kv_heads[src],
                     head_dim=p.head_dim_swa if p.sliding[i] else p.head_dim, eps=p.eps, rope=rope, scale=1.0,
                     window=p.window if p.sliding[i] else 0, qk_norm="head", v_norm=True,
                     media_both_ways=p.sliding[i] and p.hidden not in CAUSAL_IMAGE_WIDTHS,
                     keys_as_values=not w.has(f"blk.{i}.attn_v.weight"), cache_layer=src)
class Experts:
    """Gemma 4's routed experts beside the dense MLP: the router reads the attention output
    RMS-normalized without weight, over sqrt(hidden), times its `scale` vector; the top k of
    the softmax renormalized and times each chosen expert's scale."""

    def __init__(self, w: Weights, i: int, p: Params, ops):
        pre = f"blk.{i}."
        self.ops, self.eps, self.k = ops, p.eps, p.n_experts_used
        self.router = w.linear(pre + "ffn_gate_inp.weight", p.n_experts, p.hidden)
        self.router_scale = w.vector(pre + "ffn_gate_inp.scale", p.hidden) * p.hidden ** -0.5
        self.expert_scale = w.vector(pre + "ffn_down_exps.scale", p.n_experts)
        self.ones = torch.ones(p.hidden, device=w.device)
        self.experts = w.experts(i, p.n_experts, p.hidden, p.expert_ffn)
        self.pre_norm = w.vector(pre + "pre_ffw_norm_2.weight", p.hidden)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        ops = self.ops
        logits = self.router(ops.rms_norm(h, self.ones, self.eps) * self.router_scale.to(h.dtype))
        weights, ids = ops.moe_route(logits.float().contiguous(), self.k, True)
        weights = weights * self.expert_scale[ids]
        y = ops.moe_combine(self.experts(ops.rms_norm(h, self.pre_norm, self.eps), ids, ops, "gelu_tanh"), weights)
        return y if y.dtype is h.dtype else y.to(h.dtype)


class MlpAndExperts:
    """A MoE layer's feed-forward: the dense MLP (after ffn_norm) and the routed experts (which
    normalize their own input) side by side, each output normalized, then added."""

    def __init__(self, w: Weights, i: int, p: Params, ops):
        n = lambda name: w.vector(f"blk.{i}.{name}.weight", p.hidden)  # noqa: E731
        self.ops, self.eps = ops, p.eps
        self.mlp, self.moe = MLP(w, i, ops, hidden=p.hidden, ffn=p.ffns[i], act="gelu_tanh"), Experts(w, i, p, ops)
        self.ffn_norm, self.post_norm_1, self.post_norm_2 = n("ffn_norm"), n("post_ffw_norm_1"), n("post_ffw_norm_2")

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        norm, eps = self.ops.rms_norm, self.eps
        return norm(self.mlp(norm(h, self.ffn_norm, eps)), self.post_norm_1, eps) + \
            norm(self.moe(h), self.post_norm_2, eps)


class PerLayerInput:
    """A layer's slice of the per-layer embeddings joined after its feed-forward: through a
    GELU gate (inp_gate) and a projection (proj), normalized (post_norm)."""

    def __init__(self, w: Weights, i: int, p: Params, ops):
        pre = f"blk.{i}."
        self.ops, self.eps, self.index, self.width = ops, p.eps, i, p.per_layer
        self.inp_gate = w.linear(pre + "inp_gate.weight", p.per_layer, p.hidden)
        self.proj = w.linear(pre + "proj.weight", p.hidden, p.per_layer)
        self.post_norm = w.vector(pre + "post_norm.weight", p.hidden)

    def __call__(self, out: torch.Tensor, batch) -> torch.Tensor:
        g = self.ops.gated_mul(torch.cat([self.inp_gate(out), batch.memo["per_layer"][self.index]], dim=1),
                               self.width, "gelu_tanh")
        return self.ops.rms_norm_add(self.proj(g), self.post_norm, self.eps, out)


def layer(w: Weights, i: int, p: Params, rope: Rope, ops) -> Block:
    pre = f"blk.{i}."
    moe = w.has(pre + "ffn_gate_inp.weight")
    mlp = MlpAndExperts(w, i, p, ops) if moe else MLP(w, i, ops, hidden=p.hidden, ffn=p.ffns[i], act="gelu_tanh")
    scale = pre + "layer_output_scale.weight"
    return Block(w, i, ops, hidden=p.hidden, eps=p.eps, mixer=attention(w, i, p, rope, ops), mlp=mlp,
                 ffn_norm=None if moe else "ffn_norm", post_norms=True,
                 per_layer_input=PerLayerInput(w, i, p, ops) if p.per_layer else None,
                 out_scale=w.vector(scale, 1) if w.has(scale) else None)


class PerLayerInputs:
    """Each layer's slice of the per-layer embeddings for a batch (into batch.memo, once per
    forward, before the layers run)."""

    def __init__(self, w: Weights, p: Params, ops):
        self.ops, self.eps, self.n, self.width = ops, p.eps, p.n_layers, p.per_layer
        self.table = w.embedding("per_layer_token_embd.weight", p.vocab_size, p.n_layers * p.per_layer,
                                 scale=p.per_layer ** 0.5)
        self.proj = w.linear("per_layer_model_proj.weight", p.n_layers * p.per_layer, p.hidden)
        self.proj_scale = p.hidden ** -0.5
        self.norm = w.vector("per_layer_proj_norm.weight", p.per_layer)

    def __call__(self, x: torch.Tensor, batch) -> None:
        t = x.shape[0]
        projected = self.ops.rms_norm((self.proj(x) * self.proj_scale).reshape(t * self.n, self.width), self.norm,
                                      self.eps).reshape(t, self.n, self.width)
        rows = self.table(batch.tokens.clamp(min=0)).reshape(t, self.n, self.width).to(projected.dtype)
        both = (projected + rows) * 2 ** -0.5
        batch.memo["per_layer"] = both.transpose(0, 1).contiguous()  # (layers, T, width)


def build(p: Params, w: Weights, ops) -> Model:
    freqs = w.vector("rope_freqs.weight", p.head_dim // 2) if w.has("rope_freqs.weight") else None
    full = Rope.build(p.rope_theta, p.rope_dims, p.rope_scaling, context_length=p.context_length, freq_factors=freqs)
    local = Rope.build(p.rope_theta_swa, p.rope_dims_swa, context_length=p.context_length)
    layers = [layer(w, i, p, local if p.sliding[i] else full, ops) for i in range(p.n_layers)]
    return standard_model(ops, w, p, layers, embed_scale=p.hidden ** 0.5, softcap=p.final_softcap,
                          before_layers=PerLayerInputs(w, p, ops) if p.per_layer else None)
