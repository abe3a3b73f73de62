"""The pieces the architecture files build their layers from: rotary frequencies
(`Rope`), self-attention over the KV cache (`Attention`, whose switches are an
`AttentionSpec` handed to the dense ops as an argument), the gated MLP and the
mixture-of-experts block.

The weights are the file's, in the file's layout: norms as llama.cpp stores them
(Gemma's and Qwen3.5's `1 + w` already added), Llama's q/k rows in llama.cpp's
interleaved order (so their rotary is GPT-J style). `ops` is the dense ops object
(kernels.ops) of the model's device."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..batch import Batch
from ..cache import KVCache, LayerCache, attention
from ..kernels.ops import rope_tables
from ..modules import LinearGroup, Weights


@dataclass(frozen=True)
class RopeScaling:
    """How rotary frequencies are stretched beyond the trained context: "none",
    "linear" (divided by `factor`) or "yarn" (llama.cpp's rope.scaling.* keys)."""

    kind: str = "none"
    factor: float = 1.0
    original_context: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    # YaRN's ramp between whole dimensions (llama.cpp; transformers' truncate=True) or the
    # exact correction range (gpt-oss is trained with truncate=False)
    truncate: bool = True

    @classmethod
    def read(cls, kind: str, factor: float, original_context: int, beta_fast: float | None = None,
             beta_slow: float | None = None, attn_factor: float | None = None,
             log_mul: float | None = None) -> "RopeScaling":
        """From the file's rope.scaling.* keys. YaRN's cos/sin scale is llama.cpp's: 0.1 ln(factor) + 1,
        or with a log multiplier (a config's mscale_all_dim, mscale 1) the ratio
        mscale(factor, 1) / mscale(factor, log_mul); times yarn_attn_factor where the file has one."""
        if kind not in ("none", "linear", "yarn"):
            raise ValueError(f"rotary scaling {kind!r} is not supported (none, linear, yarn)")
        factor = float(factor or 1.0)
        attention = None
        if kind == "yarn":
            def mscale(m: float) -> float:
                return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0
            attention = mscale(1.0) / mscale(float(log_mul)) if log_mul else mscale(1.0)
            attention *= float(attn_factor) if attn_factor else 1.0
        return cls(kind, factor, int(original_context or 0), float(beta_fast or 32.0), float(beta_slow or 1.0),
                   attention)


@dataclass(eq=False)
class Rope:
    """Rotary frequencies of one layer kind: inv_freq (rot / 2,), the cos/sin scaling
    (YaRN's attention factor, else 1) and the pairing (NeoX halves or GPT-J pairs).
    An empty inv_freq rotates nothing (layers without rotary)."""

    inv_freq: torch.Tensor
    scaling: float = 1.0
    neox: bool = True
    # multi-section rotary (Qwen3.5's interleaved MRoPE): per frequency, which of a token's
    # (time, row, column) positions it turns with; used where the batch has such positions
    axes: torch.Tensor | None = None

    @classmethod
    def build(cls, theta: float, dims: int, scaling: RopeScaling = RopeScaling(), *, neox: bool = True,
              context_length: int = 0, freq_factors: torch.Tensor | None = None) -> "Rope":
        """Frequencies over the first `dims` dimensions of a head for base `theta`, as
        transformers computes them; `freq_factors` (llama.cpp's rope_freqs tensor, Llama
        3.1 files) divide them."""
        inv_freq = 1.0 / (float(theta) ** (torch.arange(0, dims, 2, dtype=torch.int64).float() / dims))
        attn = 1.0
        if scaling.kind == "linear":
            inv_freq = inv_freq / scaling.factor
        elif scaling.kind == "yarn":
            inv_freq, attn = _yarn(inv_freq, float(theta), dims, scaling, context_length)
        if freq_factors is not None:
            inv_freq = inv_freq / freq_factors.float().cpu()[: inv_freq.shape[0]]
        return cls(inv_freq.float(), float(attn), neox)

    @classmethod
    def none(cls) -> "Rope":
        return cls(torch.empty(0))

    def with_sections(self, sections) -> "Rope":
        """This rotary with interleaved multi-section positions (llama.cpp's IMROPE, transformers'
        mrope_interleaved): frequency i turns with the row where i % 3 == 1 and i < 3 * rows,
        the column where i % 3 == 2 and i < 3 * columns, else the time position."""
        _, rows, cols = (list(sections) + [0, 0, 0])[:3]
        i = torch.arange(self.inv_freq.shape[0])
        axes = torch.zeros_like(i)
        axes[(i % 3 == 1) & (i < 3 * rows)] = 1
        axes[(i % 3 == 2) & (i < 3 * cols)] = 2
        return Rope(self.inv_freq, self.scaling, self.neox, axes)

    def tables(self, batch: Batch):
        dev = batch.positions.device
        if self.inv_freq.device != dev:  # built on the CPU; moved once to the model's device
            self.inv_freq = self.inv_freq.to(dev)
        if self.axes is not None and batch.mrope is not None:
            return rope_tables(batch, ("mrope", id(self)), self.inv_freq, self.scaling, self.axes)
        return rope_tables(batch, ("rope", id(self)), self.inv_freq, self.scaling)


def _yarn(inv_freq: torch.Tensor, base: float, dim: int, s: RopeScaling, context_length: int):
    """YaRN: dimensions rotating faster than beta_fast turns over the original context keep
    their frequency, slower than beta_slow are divided by the factor, a linear ramp
    between; cos/sin scaled by 0.1 ln(factor) + 1 unless the file says otherwise."""
    orig = s.original_context or context_length

    def dim_for(turns: float) -> float:  # the dimension that turns `turns` times over `orig` positions
        return dim * math.log(orig / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_for(s.beta_fast), dim_for(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (keep the frequency), 0: interpolate (divide by factor)
    inv = inv_freq / s.factor * (1 - keep) + inv_freq * keep
    return inv, s.attention_factor or (0.1 * math.log(s.factor) + 1.0)


@dataclass(eq=False)
class AttentionSpec:
    """One layer's attention as the dense ops see it: its cache layer, heads, rotary,
    query scale, and the family's switches: `window` (sliding-window attention, 0:
    none), `softcap` (tanh capping of the scores), `gated` (Qwen3.5: each query head
    followed by a sigmoid gate on its output), `q_norm`/`k_norm` (RMSNorm weights of
    each q and k head)."""

    layer: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rope: Rope
    scale: float
    eps: float = 1e-6
    window: int = 0
    softcap: float | None = None
    gated: bool = False
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    media_both_ways: bool = False  # an image's tokens attend to each other both ways (Gemma 3)
    sinks: torch.Tensor | None = None  # (n_heads,) per head a logit in the softmax with no value (gpt-oss)
    v_norm: torch.Tensor | None = None  # RMSNorm weight of each v head (Gemma 4: ones, a norm without scale)
    kv_shared: bool = False  # no k/v of its own: attends over `layer`'s cache, which an earlier layer wrote (Gemma 4)

    @property
    def q_width(self) -> int:
        """Columns of the fused projection that hold the queries (and gates)."""
        return self.n_heads * self.head_dim * (2 if self.gated else 1)

    @property
    def width(self) -> int:
        """Columns of the fused projection: queries (and gates), then keys and values unless shared."""
        return self.q_width + (0 if self.kv_shared else 2 * self.n_kv_heads * self.head_dim)


class Attention:
    """q/k/v projections (separate, or one attn_qkv matrix with `fused_qkv`), the ops'
    attention over the cache, the output projection. `qk_norm`: per-head q/k norms;
    `sinks`: the file's per-head attn_sinks."""

    def __init__(self, w: Weights, layer: int, ops, *, hidden: int, n_heads: int, n_kv_heads: int, head_dim: int,
                 eps: float, rope: Rope, scale: float, window: int = 0, softcap: float | None = None,
                 qk_norm: bool = False, fused_qkv: bool = False, gated: bool = False, media_both_ways: bool = False,
                 sinks: bool = False):
        p = f"blk.{layer}."
        self.ops = ops
        self.spec = AttentionSpec(
            layer, n_heads, n_kv_heads, head_dim, rope, scale, eps, window, softcap, gated,
            q_norm=w.vector(p + "attn_q_norm.weight", head_dim) if qk_norm else None,
            k_norm=w.vector(p + "attn_k_norm.weight", head_dim) if qk_norm else None, media_both_ways=media_both_ways,
            sinks=w.vector(p + "attn_sinks.weight", n_heads).contiguous() if sinks else None)
        q_rows, kv_rows = self.spec.q_width, n_kv_heads * head_dim
        if fused_qkv:
            self.qkv = w.linear(p + "attn_qkv.weight", q_rows + 2 * kv_rows, hidden, bias=p + "attn_qkv.bias")
        else:
            self.qkv = LinearGroup([w.linear(p + f"attn_{n}.weight", rows, hidden, bias=p + f"attn_{n}.bias")
                                    for n, rows in (("q", q_rows), ("k", kv_rows), ("v", kv_rows))])
        self.o = w.linear(p + "attn_output.weight", hidden, n_heads * head_dim, bias=p + "attn_output.bias")

    def cache_spec(self) -> LayerCache:
        return attention(self.spec.n_kv_heads, self.spec.head_dim, self.spec.window)

    def __call__(self, x: torch.Tensor, batch: Batch, cache: KVCache) -> torch.Tensor:
        return self.o(self.ops.self_attention(self.qkv(x), self.spec, batch, cache))


class Block:
    """The pre-norm layer most families share: h = x + mixer(norm(x)), then h + mlp(norm(h)),
    the norms the file's `blk.{i}.attn_norm` and `blk.{i}.{ffn_norm}`; `residual` scales
    both outputs before they join (Granite's residual multiplier)."""

    def __init__(self, w: Weights, layer: int, ops, *, hidden: int, eps: float, mixer, mlp, ffn_norm: str = "ffn_norm",
                 residual: float = 1.0):
        self.ops, self.eps, self.mixer, self.mlp, self.residual = ops, eps, mixer, mlp, residual
        self.attn_norm = w.vector(f"blk.{layer}.attn_norm.weight", hidden)
        self.ffn_norm = w.vector(f"blk.{layer}.{ffn_norm}.weight", hidden)

    def cache_spec(self) -> LayerCache:
        return self.mixer.cache_spec()

    def __call__(self, x: torch.Tensor, batch: Batch, cache: KVCache) -> torch.Tensor:
        r = self.residual
        y = self.mixer(self.ops.rms_norm(x, self.attn_norm, self.eps), batch, cache)
        h = x + (y * r if r != 1.0 else y)
        y = self.mlp(self.ops.rms_norm(h, self.ffn_norm, self.eps))
        return h + (y * r if r != 1.0 else y)


class MLP:
    """down(act(gate(x)) * up(x)), gate and up computed as one; `fused` when one ffn_up matrix holds both
    (Phi-3), `suffix` for a shared expert's tensors (ffn_*_shexp)."""

    def __init__(self, w: Weights, layer: int, ops, *, hidden: int, ffn: int, act: str, fused: bool = False,
                 suffix: str = ""):
        p = f"blk.{layer}."
        self.ops, self.act, self.ffn = ops, act, ffn
        if fused:
            self.gate_up = w.linear(f"{p}ffn_up{suffix}.weight", 2 * ffn, hidden)
        else:
            self.gate_up = LinearGroup([w.linear(f"{p}ffn_{n}{suffix}.weight", ffn, hidden) for n in ("gate", "up")])
        self.down = w.linear(f"{p}ffn_down{suffix}.weight", hidden, ffn)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.ops.gated_mul(self.gate_up(x), self.ffn, self.act))


class MoE:
    """Routed experts: softmax over the router's logits, the top `n_used` experts
    (their weights renormalized with `norm_topk`), or with `sigmoid` the sigmoid scores,
    chosen by score plus the file's exp_probs_b, renormalized and times `scale`;
    optionally a shared expert, scaled by a sigmoid gate where `shared_gate` (Qwen3.5
    MoE) or added as is (GLM-4.5). `biases` (gpt-oss): the router and every expert
    matrix have a bias."""

    def __init__(self, w: Weights, layer: int, ops, *, hidden: int, n_experts: int, n_used: int, expert_ffn: int,
                 act: str, norm_topk: bool = True, shared_ffn: int = 0, sigmoid: bool = False, scale: float = 1.0,
                 shared_gate: bool = True, groups: int = 1, groups_used: int = 1, biases: bool = False):
        p = f"blk.{layer}."
        self.ops, self.act, self.n_used, self.norm_topk = ops, act, n_used, norm_topk
        self.router = w.linear(p + "ffn_gate_inp.weight", n_experts, hidden,
                               bias=p + "ffn_gate_inp.bias" if biases else None)
        self.experts = w.experts(layer, n_experts, hidden, expert_ffn, biases=biases)
        # sigmoid routing (GLM-4.5, DeepSeek V3): experts chosen by score + exp_probs_b, weighted by score
        self.sigmoid, self.scale = sigmoid, scale
        self.groups, self.groups_used = groups, groups_used  # choice limited to the best groups of experts
        self.choice_bias = w.vector(p + "exp_probs_b.bias", n_experts) if sigmoid else None
        self.shared = self.shared_gate = None
        if shared_ffn:
            self.shared = MLP(w, layer, ops, hidden=hidden, ffn=shared_ffn, act=act, suffix="_shexp")
            if shared_gate:
                self.shared_gate = w.linear(p + "ffn_gate_inp_shexp.weight", 1, hidden)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.router(x)
        if not self.sigmoid:
            return self.ops.moe_route(logits, self.n_used, self.norm_topk)
        scores = torch.sigmoid(logits.float())
        choice = scores + self.choice_bias
        if self.groups > 1:  # each group ranked by its two best choices; experts outside the best groups out
            t, n = choice.shape
            grouped = choice.view(t, self.groups, n // self.groups)
            best = torch.topk(grouped.topk(2, dim=-1).values.sum(-1), self.groups_used, dim=-1).indices
            keep = torch.zeros(t, self.groups, dtype=torch.bool, device=choice.device).scatter_(1, best, True)
            choice = grouped.masked_fill(~keep[:, :, None], float("-inf")).view(t, n)
        ids = torch.topk(choice, self.n_used, dim=-1).indices
        weights = scores.gather(1, ids)
        if self.norm_topk:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * self.scale, ids

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(x)
        y = self.ops.moe_combine(self.experts(x, ids, self.ops, self.act), weights)
        y = y if y.dtype is x.dtype else y.to(x.dtype)
        if self.shared_gate is not None:
            y = y + torch.sigmoid(self.shared_gate(x)) * self.shared(x)
        elif self.shared is not None:
            y = y + self.shared(x)
        return y


def feed_forward(w: Weights, layer: int, ops, *, hidden: int, ffn: int, act: str = "silu", n_experts: int = 0,
                 n_used: int = 0, expert_ffn: int = 0, norm_topk: bool = True, shared_ffn: int = 0,
                 fused: bool = False):
    """A layer's feed-forward: routed experts (MoE) when the family has them, else the MLP."""
    if n_experts:
        return MoE(w, layer, ops, hidden=hidden, n_experts=n_experts, n_used=n_used, expert_ffn=expert_ffn, act=act,
                   norm_topk=norm_topk, shared_ffn=shared_ffn)
    return MLP(w, layer, ops, hidden=hidden, ffn=ffn, act=act, fused=fused)
