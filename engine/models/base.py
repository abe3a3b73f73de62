"""What the model families share: rotary tables, the attention block (with the
families' switches as named arguments), the gated MLP, the mixture-of-experts block,
and the model loop (embed, layers, final norm, output head) over a flattened batch.

The weights are the file's, in the file's layout: norms as llama.cpp stores them
(Gemma's and Qwen3.5's `1 + w` already added), Llama's q/k rows in llama.cpp's
interleaved order (so their rotary is GPT-J style), Qwen3.5's value heads in its tiled
order. Nothing here knows about requests, sampling or tokenizers."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..batch import Batch
from ..cache import KVCache, LayerCache
from ..kernels.ops import rope_tables
from ..modules import GgufEmbedding, LinearGroup, Weights


@dataclass(eq=False)
class Rope:
    """Rotary frequencies of one layer kind: inv_freq (rot / 2,), the cos/sin scaling
    (YaRN's attention factor, else 1) and the pairing (NeoX halves or GPT-J pairs)."""

    inv_freq: torch.Tensor
    scaling: float = 1.0
    neox: bool = True

    def tables(self, batch: Batch):
        dev = batch.positions.device
        if self.inv_freq.device != dev:  # built on the CPU; moved once to the model's device
            self.inv_freq = self.inv_freq.to(dev)
        return rope_tables(batch, ("rope", id(self)), self.inv_freq, self.scaling)


def rope_from_config(config, params: dict, head_dim: int, neox: bool, layer_type: str | None = None,
                     freq_factors: torch.Tensor | None = None) -> Rope:
    """Frequencies for `params` (a rope_parameters dict: default, linear or YaRN), as
    transformers computes them; `freq_factors` (llama.cpp's rope_freqs tensor, Llama 3.1
    files) divide them."""
    kind = params.get("rope_type", "default")
    rot = int(head_dim * params.get("partial_rotary_factor", 1.0))
    base = float(params["rope_theta"])
    inv_freq = 1.0 / (base ** (torch.arange(0, rot, 2, dtype=torch.int64).float() / rot))
    scaling = 1.0
    if kind == "linear":
        inv_freq = inv_freq / float(params["factor"])
    elif kind == "yarn":
        inv_freq, scaling = _yarn(inv_freq, base, rot, params, config.max_position_embeddings)
    elif kind != "default":
        raise ValueError(f"rotary scaling {kind!r} is not supported (default, linear, yarn)")
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors.float().cpu()[: inv_freq.shape[0]]
    return Rope(inv_freq.float(), float(scaling), neox)


def _yarn(inv_freq: torch.Tensor, base: float, dim: int, params: dict, max_positions: int):
    """YaRN: dimensions rotating faster than beta_fast turns over the original context keep
    their frequency, slower than beta_slow are divided by the factor, a linear ramp
    between; cos/sin scaled by 0.1 ln(factor) + 1 unless the file says otherwise."""
    factor = float(params["factor"])
    orig = params.get("original_max_position_embeddings") or max_positions
    fast, slow = float(params.get("beta_fast") or 32), float(params.get("beta_slow") or 1)

    def dim_for(turns: float) -> float:  # the dimension that turns `turns` times over `orig` positions
        return dim * math.log(orig / (turns * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(dim_for(fast)), 0)
    high = min(math.ceil(dim_for(slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (keep the frequency), 0: interpolate (divide by factor)
    inv = inv_freq / factor * (1 - keep) + inv_freq * keep
    attention = params.get("attention_factor") or (0.1 * math.log(factor) + 1.0)
    return inv, attention


class Attention:
    """Self-attention over the KV cache. Switches: `fused_qkv` (one attn_qkv matrix),
    `qk_norm` (RMSNorm of each q and k head), `gated` (Qwen3.5: q_proj also yields a
    sigmoid gate on the output), `window` (sliding-window attention), `scale`
    (Gemma 3's query_pre_attn_scalar), `softcap` (tanh capping of the scores)."""

    def __init__(self, w: Weights, layer: int, ops, *, hidden: int, n_heads: int, n_kv_heads: int, head_dim: int,
                 eps: float, rope: Rope, scale: float, window: int = 0, softcap: float | None = None,
                 qk_norm: bool = False, fused_qkv: bool = False, gated: bool = False):
        p = f"blk.{layer}."
        self.layer, self.ops = layer, ops
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.eps, self.rope, self.scale, self.window, self.softcap, self.gated = eps, rope, scale, window, softcap, gated
        q_rows, kv_rows = n_heads * head_dim * (2 if gated else 1), n_kv_heads * head_dim
        if fused_qkv:
            self.qkv = w.linear(p + "attn_qkv.weight", q_rows + 2 * kv_rows, hidden, bias=p + "attn_qkv.bias")
        else:
            self.qkv = LinearGroup([w.linear(p + f"attn_{n}.weight", rows, hidden, bias=p + f"attn_{n}.bias")
                                    for n, rows in (("q", q_rows), ("k", kv_rows), ("v", kv_rows))])
        self.o = w.linear(p + "attn_output.weight", hidden, n_heads * head_dim, bias=p + "attn_output.bias")
        self.q_norm = w.vector(p + "attn_q_norm.weight", head_dim) if qk_norm else None
        self.k_norm = w.vector(p + "attn_k_norm.weight", head_dim) if qk_norm else None

    def cache_spec(self) -> LayerCache:
        from ..cache import attention

        return attention(self.n_kv_heads, self.head_dim, self.window)

    def __call__(self, x: torch.Tensor, batch: Batch, cache: KVCache) -> torch.Tensor:
        return self.o(self.ops.self_attention(self, self.qkv(x), batch, cache))


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
    (their weights renormalized with `norm_topk`); optionally a shared expert scaled
    by a sigmoid gate (Qwen3.5 MoE)."""

    def __init__(self, w: Weights, layer: int, ops, *, hidden: int, n_experts: int, n_used: int, expert_ffn: int,
                 act: str, norm_topk: bool = True, shared_ffn: int = 0):
        p = f"blk.{layer}."
        self.ops, self.act, self.n_used, self.norm_topk = ops, act, n_used, norm_topk
        self.router = w.linear(p + "ffn_gate_inp.weight", n_experts, hidden)
        self.experts = w.experts(layer, n_experts, hidden, expert_ffn)
        self.shared = self.shared_gate = None
        if shared_ffn:
            self.shared = MLP(w, layer, ops, hidden=hidden, ffn=shared_ffn, act=act, suffix="_shexp")
            self.shared_gate = w.linear(p + "ffn_gate_inp_shexp.weight", 1, hidden)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.ops.moe_route(self.router(x), self.n_used, self.norm_topk)
        y = self.ops.moe_combine(self.experts(x, ids, self.ops, self.act), weights)
        y = y if y.dtype is x.dtype else y.to(x.dtype)
        if self.shared is not None:
            y = y + torch.sigmoid(self.shared_gate(x)) * self.shared(x)
        return y


def feed_forward(w: Weights, layer: int, ops, *, hidden: int, ffn: int, act: str = "silu", n_experts: int = 0,
                 n_used: int = 0, expert_ffn: int = 0, norm_topk: bool = True, shared_ffn: int = 0,
                 fused: bool = False):
    """A layer's feed-forward: routed experts (MoE) when the family has them, else the MLP."""
    if n_experts:
        return MoE(w, layer, ops, hidden=hidden, n_experts=n_experts, n_used=n_used, expert_ffn=expert_ffn, act=act,
                   norm_topk=norm_topk, shared_ffn=shared_ffn)
    return MLP(w, layer, ops, hidden=hidden, ffn=ffn, act=act, fused=fused)


class Model:
    """embed → layers → final norm → output head, over a flattened batch. Subclasses
    (one per family) build `layers`: callables (x, batch, cache) -> x with a
    `cache_spec()`. `forward` returns float32 logits for the batch's rows."""

    def __init__(self, ops, embed: GgufEmbedding, layers: list, norm: torch.Tensor, head, eps: float,
                 vocab_size: int, softcap: float | None = None):
        self.ops, self.embed, self.layers, self.norm, self.head = ops, embed, layers, norm, head
        self.eps, self.vocab_size, self.softcap = eps, vocab_size, softcap

    def cache_specs(self) -> list[LayerCache]:
        return [layer.cache_spec() for layer in self.layers]

    def forward(self, batch: Batch, cache: KVCache) -> torch.Tensor:
        """Logits (len(batch.rows), vocab) float32; a batch longer than the cache's
        max_batch runs in consecutive chunks."""
        parts = [self._forward(b, cache) for b in batch.split(cache.max_batch)]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _forward(self, batch: Batch, cache: KVCache) -> torch.Tensor:
        cache.begin(batch)
        x = self.embed(batch.tokens)
        for layer in self.layers:
            x = layer(x, batch, cache)
        if batch.rows.numel() == 0:
            return torch.empty(0, self.vocab_size, dtype=torch.float32)
        if batch.rows.numel() != x.shape[0]:
            x = x[batch.rows]
        logits = self.head(self.ops.rms_norm(x, self.norm, self.eps)).float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def output_head(w: Weights, vocab: int, hidden: int):
    """output.weight, or the token embedding's bytes when the head is tied."""
    name = "output.weight" if w.has("output.weight") else "token_embd.weight"
    return w.linear(name, vocab, hidden)
