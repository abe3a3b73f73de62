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
  soft-capped (final_logit_softcapping)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...gguf_io import Keys
from ..cache import LayerCache, attention, shared
from ..modules import LinearGroup, Weights
from .base import Metadata, Model, TextParams, kv_heads_per_layer, standard_model
from .layers import MLP, AttentionSpec, Rope

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

    @classmethod
    def from_gguf(cls, m: Metadata) -> "Params":
        c = cls.common(m)
        n = c["n_layers"]
        pattern = m.get(Keys.SLIDING_WINDOW_PATTERN)
        if not isinstance(pattern, list) or len(pattern) != n:
            raise ValueError(f"{m.path}: {Keys.arch(Keys.SLIDING_WINDOW_PATTERN, m.arch)} must list each of the "
                             f"{n} layers")
        ffn = c["ffn"]
        ffns = list(ffn) if isinstance(ffn, list) else [ffn] * n
        if len(ffns) != n:
            raise ValueError(f"{m.path}: {Keys.arch(Keys.FEED_FORWARD_LENGTH, m.arch)} has {len(ffns)} entries "
                             f"for {n} layers")
        c["ffn"] = ffns[0]
        n_shared = m.get(Keys.SHARED_KV_LAYERS, 0)
        if not 0 <= n_shared < n:
            raise ValueError(f"{m.path}: {n_shared} shared key-value layers of {n}")
        head_swa = m.get(Keys.KEY_LENGTH_SWA)
        return cls(**c, sliding=[bool(v) for v in pattern], window=m.get(Keys.SLIDING_WINDOW), head_dim_swa=head_swa,
                   kv_heads=kv_heads_per_layer(m, c), ffns=ffns,
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


class Gemma4Attention:
    def __init__(self, w: Weights, i: int, p: Params, rope: Rope, ops):
        pre = f"blk.{i}."
        src = p.source(i)
        hd, n_kv = (p.head_dim_swa if p.sliding[i] else p.head_dim), p.kv_heads[src]
        self.ops, self.width = ops, n_kv * hd
        shared_kv = src != i
        self.spec = AttentionSpec(
            src, p.n_heads, n_kv, hd, rope, 1.0, p.eps, p.window if p.sliding[i] else 0,
            q_norm=w.vector(pre + "attn_q_norm.weight", hd),
            k_norm=None if shared_kv else w.vector(pre + "attn_k_norm.weight", hd),
            v_norm=None if shared_kv else torch.ones(hd), kv_shared=shared_kv)
        q = w.linear(pre + "attn_q.weight", p.n_heads * hd, p.hidden)
        self.k_as_v = False
        if shared_kv:
            self.qkv = q
        else:
            parts = [q, w.linear(pre + "attn_k.weight", self.width, p.hidden)]
            if w.has(pre + "attn_v.weight"):
                parts.append(w.linear(pre + "attn_v.weight", self.width, p.hidden))
            else:  # attention_k_eq_v: the keys' projection is the values'
                self.k_as_v = True
            self.qkv = LinearGroup(parts)
        self.o = w.linear(pre + "attn_output.weight", p.hidden, p.n_heads * hd)

    def cache_spec(self) -> LayerCache:
        s = self.spec
        return shared(s.layer) if s.kv_shared else attention(s.n_kv_heads, s.head_dim, s.window)

    def __call__(self, x, batch, cache):
        y = self.qkv(x)
        if self.k_as_v:
            y = torch.cat([y, y[:, -self.width:]], dim=1)
        return self.o(self.ops.self_attention(y, self.spec, batch, cache))


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
        self.ones = torch.ones(p.hidden)
        self.experts = w.experts(i, p.n_experts, p.hidden, p.expert_ffn)
        self.pre_norm = w.vector(pre + "pre_ffw_norm_2.weight", p.hidden)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        ops = self.ops
        logits = self.router(ops.rms_norm(h, self.ones, self.eps) * self.router_scale.to(h.dtype))
        weights, ids = ops.moe_route(logits.float().contiguous(), self.k, True)
        weights = weights * self.expert_scale[ids]
        y = ops.moe_combine(self.experts(ops.rms_norm(h, self.pre_norm, self.eps), ids, ops, "gelu_tanh"), weights)
        return y if y.dtype is h.dtype else y.to(h.dtype)


class Gemma4Layer:
    def __init__(self, w: Weights, i: int, p: Params, rope: Rope, ops):
        pre = f"blk.{i}."
        n = lambda name: w.vector(f"{pre}{name}.weight", p.hidden)  # noqa: E731
        self.ops, self.eps, self.index = ops, p.eps, i
        self.attn_norm, self.post_attn_norm = n("attn_norm"), n("post_attention_norm")
        self.ffn_norm, self.post_ffn_norm = n("ffn_norm"), n("post_ffw_norm")
        self.attn = Gemma4Attention(w, i, p, rope, ops)
        self.mlp = MLP(w, i, ops, hidden=p.hidden, ffn=p.ffns[i], act="gelu_tanh")
        self.moe = None
        if w.has(pre + "ffn_gate_inp.weight"):
            self.moe = Experts(w, i, p, ops)
            self.post_norm_1, self.post_norm_2 = n("post_ffw_norm_1"), n("post_ffw_norm_2")
        self.per_layer = p.per_layer
        if p.per_layer:
            self.inp_gate = w.linear(pre + "inp_gate.weight", p.per_layer, p.hidden)
            self.proj = w.linear(pre + "proj.weight", p.hidden, p.per_layer)
            self.post_norm = n("post_norm")
        self.out_scale = w.vector(pre + "layer_output_scale.weight", 1) if w.has(pre + "layer_output_scale.weight") \
            else None

    def cache_spec(self) -> LayerCache:
        return self.attn.cache_spec()

    def __call__(self, x, batch, cache):
        norm, norm_add, eps = self.ops.rms_norm, self.ops.rms_norm_add, self.eps
        h = norm_add(self.attn(norm(x, self.attn_norm, eps), batch, cache), self.post_attn_norm, eps, x)
        f = self.mlp(norm(h, self.ffn_norm, eps))
        if self.moe is not None:
            f = norm(f, self.post_norm_1, eps) + norm(self.moe(h), self.post_norm_2, eps)
        out = norm_add(f, self.post_ffn_norm, eps, h)
        if self.per_layer:
            g = self.ops.gated_mul(torch.cat([self.inp_gate(out), batch.memo["per_layer"][self.index]], dim=1),
                                   self.per_layer, "gelu_tanh")
            out = norm_add(self.proj(g), self.post_norm, eps, out)
        return out if self.out_scale is None else out * self.out_scale.to(out.dtype)


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
    layers = [Gemma4Layer(w, i, p, local if p.sliding[i] else full, ops) for i in range(p.n_layers)]
    model = standard_model(ops, w, p, layers, embed_scale=p.hidden ** 0.5, softcap=p.final_softcap)
    if p.per_layer:
        model.before_layers = PerLayerInputs(w, p, ops)
    return model
