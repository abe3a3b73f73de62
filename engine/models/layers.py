"""The pieces the architecture files build their layers from: rotary frequencies
(`Rope`), self-attention over the KV cache (`Attention`, the families' switches as its
named options, what the dense ops need of them an `AttentionSpec` handed to them as an
argument), the one layer (`Block`: a mixer and a feed-forward between the norms the
family names), the gated MLP and the mixture-of-experts block.

The weights are the file's, in the file's layout: norms as llama.cpp stores them
(Gemma's and Qwen3.5's `1 + w` already added), Llama's q/k rows in llama.cpp's
interleaved order (so their rotary is GPT-J style). `ops` is the dense ops object
(kernels.ops) of the model's device."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..batch import Batch
from ..cache import KVCache, LayerCache, attention, shared
from ..graphs import capturing
from ..kernels.ops import rope_tables
from ..modules import LinearGroup, Weights
from .params import RopeScaling


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


QK_NORMS = (None, "head", "whole")


def alibi_slopes(n_heads: int, max_bias: float) -> torch.Tensor:
    """ALiBi's slope per head as ggml's soft_max_ext computes them: powers of
    2^(-max_bias / n) for the first n (the largest power of two not above n_heads), then
    odd powers of 2^(-max_bias / 2n) for the rest."""
    n = 1 << (n_heads.bit_length() - 1)
    m0, m1 = 2.0 ** (-max_bias / n), 2.0 ** (-max_bias / 2 / n)
    return torch.tensor([m0 ** (h + 1) if h < n else m1 ** (2 * (h - n) + 1) for h in range(n_heads)])


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
    alibi: torch.Tensor | None = None  # (n_heads,) ALiBi's slopes: scores less slope x distance (jina-bert-v2)
    chunk: int = 0  # chunked attention: a query sees the keys of its own chunk of positions only (Llama 4: 8192)

    @property
    def q_width(self) -> int:
        """Columns of the fused projection that hold the queries (and gates)."""
        return self.n_heads * self.head_dim * (2 if self.gated else 1)

    @property
    def width(self) -> int:
        """Columns of the fused projection: queries (and gates), then keys and values unless shared."""
        return self.q_width + (0 if self.kv_shared else 2 * self.n_kv_heads * self.head_dim)


class Attention:
    """q/k/v projections (`blk.{i}.attn_q`, `attn_k`, `attn_v`), the ops' attention over
    the cache, the output projection; the families' switches as named options:

    - `scale`: the queries' scale (None: head_dim^-1/2); `window`: sliding-window
      attention (0: none); `softcap`: tanh capping of the scores; `sinks`: the file's
      per-head attn_sinks (gpt-oss); `gated`: each query head followed by a sigmoid gate
      on its output (Qwen3.5); `media_both_ways`: an image's tokens see each other (Gemma 3);
    - `fused_qkv`: one attn_qkv matrix (Phi-3);
    - `qk_norm`: "head" (an RMS norm of each q and k head, attn_q_norm / attn_k_norm of
      head_dim) or "whole" (over all the heads at once, OLMo 2); `v_norm`: each v head
      RMS-normalized without a weight (Gemma 4);
    - `keys_as_values`: no attn_v: the keys' projection is the values' too, normalized as
      values (Gemma 4's attention_k_eq_v);
    - `cache_layer`: an earlier layer whose cache the queries attend over, this layer
      having no k/v of its own (Gemma 4's shared key-value layers);
    - `temperature` (beta, length[, offset]): each query scaled by 1 + beta ln(1 +
      floor((position + offset) / length)) (Mistral 3; Llama 4's NoPE layers with offset 1;
      rotary is linear in q, so before it);
    - `encoder`: the window is the mask's alone, the cache keeps every position
      (EmbeddingGemma, whose input goes in one forward);
    - `alibi_max_bias`: ALiBi instead of positions in the queries and keys, each head's
      slope from it as ggml's softmax takes them (jina-bert-v2: 8);
    - `chunk`: chunked attention, each query over the keys of its own chunk of positions
      (Llama 4's rotary layers: 8192; llama.cpp's LLAMA_SWA_TYPE_CHUNKED)."""

    def __init__(self, w: Weights, layer: int, ops, *, hidden: int, n_heads: int, n_kv_heads: int, head_dim: int,
                 eps: float, rope: Rope, scale: float | None = None, window: int = 0, softcap: float | None = None,
                 sinks: bool = False, gated: bool = False, media_both_ways: bool = False, fused_qkv: bool = False,
                 qk_norm: str | None = None, v_norm: bool = False, keys_as_values: bool = False,
                 cache_layer: int | None = None, temperature: tuple[float, ...] | None = None, encoder: bool = False,
                 alibi_max_bias: float = 0.0, chunk: int = 0):
        if qk_norm not in QK_NORMS:
            raise ValueError(f"qk_norm {qk_norm!r}: expected one of {QK_NORMS}")
        p = f"blk.{layer}."
        kv_shared = cache_layer is not None and cache_layer != layer
        per_head = qk_norm == "head"
        self.ops, self.encoder, self.keys_as_values = ops, encoder, keys_as_values and not kv_shared
        self.temperature = temperature if temperature and temperature[0] else None
        self.spec = AttentionSpec(
            cache_layer if kv_shared else layer, n_heads, n_kv_heads, head_dim, rope,
            head_dim ** -0.5 if scale is None else scale, eps, window, softcap, gated,
            q_norm=w.vector(p + "attn_q_norm.weight", head_dim) if per_head else None,
            k_norm=w.vector(p + "attn_k_norm.weight", head_dim) if per_head and not kv_shared else None,
            media_both_ways=media_both_ways, sinks=w.vector(p + "attn_sinks.weight", n_heads).contiguous() if sinks
            else None, v_norm=torch.ones(head_dim, device=w.device) if v_norm and not kv_shared else None, kv_shared=kv_shared,
            alibi=alibi_slopes(n_heads, alibi_max_bias) if alibi_max_bias else None, chunk=chunk)
        self.q_rows, self.kv_rows = n_heads * head_dim, n_kv_heads * head_dim  # the queries (without gates), k or v
        self.q_norm = self.k_norm = None  # over the whole projections ("whole")
        if qk_norm == "whole":
            self.q_norm = w.vector(p + "attn_q_norm.weight", self.q_rows)
            self.k_norm = w.vector(p + "attn_k_norm.weight", self.kv_rows)
        q_width = self.spec.q_width
        if fused_qkv:
            self.qkv = w.linear(p + "attn_qkv.weight", q_width + 2 * self.kv_rows, hidden, bias=p + "attn_qkv.bias")
        else:
            own = [] if kv_shared else ["k"] if self.keys_as_values else ["k", "v"]
            parts = [w.linear(p + f"attn_{n}.weight", rows, hidden, bias=p + f"attn_{n}.bias")
                     for n, rows in [("q", q_width)] + [(n, self.kv_rows) for n in own]]
            self.qkv = parts[0] if len(parts) == 1 else LinearGroup(parts)
        self.o = w.linear(p + "attn_output.weight", hidden, n_heads * head_dim, bias=p + "attn_output.bias")

    def cache_spec(self) -> LayerCache:
        s = self.spec
        if s.kv_shared:
            return shared(s.layer)
        return attention(s.n_kv_heads, s.head_dim, 0 if self.encoder else s.window)

    def __call__(self, x: torch.Tensor, batch: Batch, cache: KVCache) -> torch.Tensor:
        y = self.qkv(x)
        if self.temperature is not None and (scale := query_temperature(batch, *self.temperature)) is not None:
            y[:, :self.q_rows] *= scale.to(y.device, y.dtype)
        if self.q_norm is not None:
            qw, kw, norm, eps = self.q_rows, self.kv_rows, self.ops.rms_norm, self.spec.eps
            y = torch.cat([norm(y[:, :qw], self.q_norm, eps), norm(y[:, qw:qw + kw], self.k_norm, eps), y[:, qw + kw:]],
                          dim=-1)
        if self.keys_as_values:
            y = torch.cat([y, y[:, -self.kv_rows:]], dim=1)
        return self.o(self.ops.self_attention(y, self.spec, batch, cache))


def query_temperature(batch: Batch, beta: float, length: int, offset: int = 0) -> torch.Tensor | None:
    """(T, 1) query scales 1 + beta ln(1 + floor((position + offset) / length)) for the
    batch's positions, once per forward; None while every one is inside the first `length`
    (all scales 1). Mistral 3: offset 0; Llama 4's NoPE layers: 1."""
    key = ("attn_temp", beta, length, offset)
    if key not in batch.memo:
        steps = torch.div(batch.positions + offset, length, rounding_mode="floor")
        kept = capturing(steps) or bool(steps.any())  # a captured step keeps them (no host check)
        batch.memo[key] = (1.0 + beta * torch.log1p(steps.float()))[:, None] if kept else None
    return batch.memo[key]


class Block:
    """One layer: h = x + mixer(x), then h + mlp(h), each part between the norms the
    family's files have (`blk.{i}.{name}.weight`):

    - `attn_norm`, `ffn_norm`: the norm before each part (None: none there, as OLMo 2, or
      the part normalizes its input itself, as Gemma 4's experts);
    - `post_norms`: sandwich norms: each part's output normalized (post_attention_norm,
      post_ffw_norm) as it joins the residual (Gemma 3 and 4, OLMo 2);
    - `residual`: each part's output scaled before it joins (Granite's residual multiplier);
    - `per_layer_input`: called (out, batch) -> out after the feed-forward (Gemma 4's
      per-layer embeddings); `out_scale`: the layer's output scaled (layer_output_scale)."""

    def __init__(self, w: Weights, layer: int, ops, *, hidden: int, eps: float, mixer, mlp,
                 attn_norm: str | None = "attn_norm", ffn_norm: str | None = "ffn_norm", post_norms: bool = False,
                 residual: float = 1.0, per_layer_input=None, out_scale: torch.Tensor | None = None):
        def norm(name: str | None) -> torch.Tensor | None:
            return w.vector(f"blk.{layer}.{name}.weight", hidden) if name else None

        self.ops, self.eps, self.mixer, self.mlp, self.residual = ops, eps, mixer, mlp, residual
        self.attn_norm, self.ffn_norm = norm(attn_norm), norm(ffn_norm)
        self.post_attn_norm = norm("post_attention_norm" if post_norms else None)
        self.post_ffn_norm = norm("post_ffw_norm" if post_norms else None)
        self.per_layer_input, self.out_scale = per_layer_input, out_scale

    def cache_spec(self) -> LayerCache:
        return self.mixer.cache_spec()

    def __call__(self, x: torch.Tensor, batch: Batch, cache: KVCache) -> torch.Tensor:
        h = self._join(x, self.mixer(self._norm(x, self.attn_norm), batch, cache), self.post_attn_norm)
        out = self._join(h, self.mlp(self._norm(h, self.ffn_norm)), self.post_ffn_norm)
        if self.per_layer_input is not None:
            out = self.per_layer_input(out, batch)
        return out if self.out_scale is None else out * self.out_scale.to(out.dtype)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        return x if weight is None else self.ops.rms_norm(x, weight, self.eps)

    def _join(self, x: torch.Tensor, y: torch.Tensor, post: torch.Tensor | None) -> torch.Tensor:
        """The residual x with a part's output y joined."""
        if post is not None:
            return self.ops.rms_norm_add(y, post, self.eps, x)
        return x + (y * self.residual if self.residual != 1.0 else y)


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
    chosen by score plus the file's exp_probs_b, renormalized; either times `scale`, and
    with `groups` chosen from the best `groups_used` groups only (ranked by their two best);
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
        self.choice_bias = w.vector(p + "exp_probs_b.bias", n_experts) \
            if sigmoid or w.has(p + "exp_probs_b.bias") else None  # added to the scores that choose (llama.cpp: any gating)
        self.shared = self.shared_gate = None
        if shared_ffn:
            self.shared = MLP(w, layer, ops, hidden=hidden, ffn=shared_ffn, act=act, suffix="_shexp")
            if shared_gate:
                self.shared_gate = w.linear(p + "ffn_gate_inp_shexp.weight", 1, hidden)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.router(x)
        if not self.sigmoid and self.groups == 1 and self.choice_bias is None:
            weights, ids = self.ops.moe_route(logits, self.n_used, self.norm_topk)
            return (weights * self.scale if self.scale != 1.0 else weights), ids
        scores = torch.sigmoid(logits.float()) if self.sigmoid else torch.softmax(logits.float(), dim=-1)
        choice = scores + self.choice_bias if self.choice_bias is not None else scores
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
