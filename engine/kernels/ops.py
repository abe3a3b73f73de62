"""The dense ops of a forward pass, around the packed matmuls: RMSNorm, rotary
embedding, attention over the engine's KV cache, gated activations, and Qwen3.5's
causal conv and gated delta rule.

`TorchOps` is each op in torch: the reference in tests and the path on every device.
`cpu_ops.CpuOps` overrides ops with native calls on CPU tensors; `KernelSettings.ops_for`
chooses once per model's settings and device. Ops take flattened batches (tokens first) and the `Batch`
for sequence boundaries; they never allocate cache memory."""

from __future__ import annotations


import torch
import torch.nn.functional as F

from ...gguf_io.quants import dequantize, quantize
from ..batch import Batch
from ..kv_rows import KVType

SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT = 1.702, 7.0  # gpt-oss's clamped SwiGLU (llama.cpp's swiglu_oai)


def rope_tables(batch: Batch, key, inv_freq: torch.Tensor, scaling: float,
                axes: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (T, rot / 2) for the batch's positions, computed once per forward; with
    `axes`, each frequency turns with its column of the batch's (T, 3) `mrope` positions."""
    if key not in batch.memo:
        if axes is not None:
            freqs = batch.mrope.to(inv_freq.device, torch.float32)[:, axes.to(inv_freq.device)] * inv_freq[None, :]
        else:
            freqs = batch.positions.to(inv_freq.device, torch.float32)[:, None] * inv_freq[None, :]
        cos, sin = freqs.cos(), freqs.sin()
        if scaling != 1.0:
            cos, sin = cos * scaling, sin * scaling
        batch.memo[key] = (cos, sin)
    return batch.memo[key]


def ring_positions(n_cells: int, end: int) -> torch.Tensor:
    """The position each cell of a ring of n_cells holds once a sequence has `end`
    tokens (-1: empty)."""
    c = torch.arange(min(n_cells, end))
    return c + n_cells * torch.div(end - 1 - c, n_cells, rounding_mode="floor")


class TorchOps:
    name = "torch"
    graph_safe = False  # its attention reads each sequence's Python-side bounds (engine.graphs)

    # ------------------------------------------------------------ norms

    def rms_norm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        """x / sqrt(mean(x²) + eps) * w over the last dim, in float32."""
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return (y * w.float()).to(x.dtype)

    def rms_norm_add(self, x: torch.Tensor, w: torch.Tensor, eps: float, residual: torch.Tensor) -> torch.Tensor:
        """residual + rms_norm(x) * w (Gemma's norms after attention and the MLP)."""
        return residual + self.rms_norm(x, w, eps)

    def l2_norm(self, x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)

    # ------------------------------------------------------------ rotary

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> torch.Tensor:
        """Rotate the first 2 * cos.shape[-1] dims of x (T, heads, head_dim): NeoX style
        (halves) or GPT-J style (adjacent pairs, llama.cpp's layout for Llama files)."""
        rot = 2 * cos.shape[-1]
        c, s = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
        xr = x[..., :rot]
        if neox:
            x1, x2 = xr[..., : rot // 2], xr[..., rot // 2:]
            out = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
        else:
            x1, x2 = xr[..., 0::2], xr[..., 1::2]
            out = torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).flatten(-2)
        if rot < x.shape[-1]:
            out = torch.cat([out, x[..., rot:]], dim=-1)
        return out

    # --------------------------------------------------------- attention

    def kv_write(self, kbuf: torch.Tensor, vbuf: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 slots: torch.Tensor, cells: torch.Tensor, types: tuple[KVType, KVType]) -> None:
        """Keys and values (T, kv_heads, head_dim) into their slots' cells, as rows of
        the cache's (key, value) types."""
        kbuf[slots, :, cells] = self.to_rows(k, types[0])
        vbuf[slots, :, cells] = self.to_rows(v, types[1])

    @staticmethod
    def to_rows(x: torch.Tensor, t: KVType) -> torch.Tensor:
        """(..., head_dim) values as cache rows of type `t` (the quantized ones through
        gguf_io's quantizers, on CPU tensors)."""
        if not t.quantized:
            return x.to(t.dtype)
        return torch.from_numpy(quantize(x.detach().float().numpy(), t.ggml))

    def from_rows(self, rows: torch.Tensor, t: KVType, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
        """Cache rows (..., row) of type `t` as (..., head_dim) values in `dtype`."""
        if not t.quantized:
            return rows.to(dtype)
        return torch.from_numpy(dequantize(rows.numpy(), t.ggml, (*rows.shape[:-1], head_dim))).to(dtype)

    def self_attention(self, qkv: torch.Tensor, spec, batch: Batch, cache) -> torch.Tensor:
        """A layer's attention between its projections. `qkv` (T, q + k + v) is the fused
        projection output (per head a query and, with `spec.gated`, a gate); `spec` the
        layer's models.layers.AttentionSpec (heads, rotary, scale, window, softcap, q/k
        norm weights, cache layer). q/k heads RMS-normalized when the spec has weights,
        rotary, k and v into the cache (v heads RMS-normalized where the spec says; none
        for a layer that shares an earlier one's), attention, the output times
        sigmoid(gate) if gated. Returns (T, H * D). The native version does all of it in
        one call."""
        t, h, hkv, d = qkv.shape[0], spec.n_heads, spec.n_kv_heads, spec.head_dim
        qw = spec.q_width
        q = qkv[:, :qw]
        gate = None
        if spec.gated:
            q, gate = q.reshape(t, h, 2 * d).split(d, dim=-1)
        q = q.reshape(t, h, d)
        if spec.q_norm is not None:
            q = self.rms_norm(q, spec.q_norm, spec.eps)
        cos, sin = spec.rope.tables(batch)
        q = self.rope(q, cos, sin, spec.rope.neox)
        kbuf, vbuf = cache.kv(spec.layer)
        if not spec.kv_shared:  # else an earlier layer wrote this batch's keys and values
            k, v = qkv[:, qw:qw + hkv * d].reshape(t, hkv, d), qkv[:, qw + hkv * d:qw + 2 * hkv * d].reshape(t, hkv, d)
            if spec.k_norm is not None:
                k = self.rms_norm(k, spec.k_norm, spec.eps)
            if spec.v_norm is not None:
                v = self.rms_norm(v, spec.v_norm, spec.eps)
            k = self.rope(k, cos, sin, spec.rope.neox)
            self.kv_write(kbuf, vbuf, k, v, batch.slots, cache.cells(spec.layer, batch), cache.types)
        o = self.attention(q, kbuf, vbuf, batch, cache.n_cells[spec.layer], spec.window, spec.scale, spec.softcap,
                           spec.media_both_ways, spec.sinks, cache.types, alibi=spec.alibi, chunk=spec.chunk)
        o = o.reshape(t, h * d)
        return o if gate is None else o * torch.sigmoid(gate.reshape(t, h * d))

    def attention(self, q: torch.Tensor, kbuf: torch.Tensor, vbuf: torch.Tensor, batch: Batch, n_cells: int,
                  window: int, scale: float, softcap: float | None = None, media_both_ways: bool = False,
                  sinks: torch.Tensor | None = None, types: tuple[KVType, KVType] | None = None,
                  alibi: torch.Tensor | None = None, chunk: int = 0) -> torch.Tensor:
        """Causal attention of q (T, heads, head_dim) over each sequence's cached keys
        and values (already written; rows of `types`, by default the buffers' dtypes),
        grouped-query, optionally within a window of
        `window` positions (the query's own included) and with tanh soft-capping. With
        `media_both_ways`, an image's tokens (batch.media_spans) also see each other's
        later ones (Gemma 3). `sinks` (heads,): per head a logit that joins each softmax
        with no value (gpt-oss). `alibi` (heads,): ALiBi's slopes, each score less the
        slope times the key's distance from the query (jina-bert-v2, both ways). `chunk`:
        each query sees the keys of its own chunk of positions only (Llama 4)."""
        out = torch.empty_like(q)
        for s in batch.seqs:
            qs = q[s.start:s.start + s.n].transpose(0, 1)[None]  # (1, H, n, D)
            used = min(s.end, n_cells)
            ks, vs = kbuf[s.slot, :, :used], vbuf[s.slot, :, :used]
            if types is not None:
                d = q.shape[-1]
                ks, vs = self.from_rows(ks, types[0], d, q.dtype), self.from_rows(vs, types[1], d, q.dtype)
            ks, vs = ks[None], vs[None]
            mask = self._mask(batch, s, n_cells, window, batch.media_spans.get(s.slot) if media_both_ways else None,
                              chunk)
            if alibi is not None:  # distances as a float mask, -inf where the boolean one hides a key
                dist = (torch.arange(s.pos, s.end)[:, None] - ring_positions(n_cells, s.end)[None, :]).abs()
                bias = (-alibi.float().cpu().view(-1, 1, 1) * dist.float()[None]).to(q.device)
                mask = (bias if mask is None else bias.masked_fill(~mask, float("-inf")))[None].to(q.dtype)
            if softcap or sinks is not None:
                o = self._explicit(qs, ks, vs, mask, scale, softcap, sinks)
            else:
                o = F.scaled_dot_product_attention(qs, ks.to(q.dtype), vs.to(q.dtype), attn_mask=mask, scale=scale,
                                                   enable_gqa=ks.shape[1] != qs.shape[1])
            out[s.start:s.start + s.n] = o[0].transpose(0, 1)
        return out

    @staticmethod
    def _mask(batch: Batch, s, n_cells: int, window: int, spans=None, chunk: int = 0) -> torch.Tensor | None:
        key = ("mask", s.slot, n_cells, window, bool(spans), chunk)
        if key not in batch.memo:
            cell_pos = ring_positions(n_cells, s.end)[None, :]
            q_pos = torch.arange(s.pos, s.end)[:, None]
            if batch.both_ways:  # an encoder: every token of the sequence, within a window symmetric about
                ok = torch.ones(q_pos.shape[0], cell_pos.shape[1], dtype=torch.bool)  # the query (llama.cpp's
                if window:  # LLAMA_SWA_TYPE_SYMMETRIC: |q - k| <= window / 2)
                    ok &= (q_pos - cell_pos).abs() <= window // 2
            else:
                ok = cell_pos <= q_pos
                for lo, hi in spans or ():
                    ok |= (q_pos >= lo) & (q_pos < hi) & (cell_pos >= lo) & (cell_pos < hi)
                if window:
                    ok &= q_pos - cell_pos < window
                if chunk:
                    ok &= q_pos // chunk == cell_pos // chunk
            batch.memo[key] = None if bool(ok.all()) else ok.to(batch.tokens.device)
        return batch.memo[key]

    @staticmethod
    def _explicit(q, k, v, mask, scale, cap, sinks):
        """Attention with the scores written out: tanh-capped at `cap`, and/or with a sink
        column per head (its logit in the softmax, its value zero)."""
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1).to(q.dtype), v.repeat_interleave(rep, dim=1).to(q.dtype)
        scores = (q @ k.transpose(-1, -2)) * scale
        if cap:
            scores = torch.tanh(scores / cap) * cap
        if mask is not None:
            scores = scores + mask if mask.dtype.is_floating_point else scores.masked_fill(~mask, float("-inf"))
        scores = scores.float()
        if sinks is None:
            return torch.softmax(scores, dim=-1).to(q.dtype) @ v
        sink = sinks.float().to(scores.device).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        return probs.to(q.dtype) @ v

    # -------------------------------------------------------- activations

    def gated_mul(self, y: torch.Tensor, n: int, act: str) -> torch.Tensor:
        """act(y[:, :n]) * y[:, n:2n]: the MLP's activation over a fused gate|up output."""
        return self.act_mul(y[:, :n], y[:, n:2 * n], act)

    def act_mul(self, gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
        """act(gate) * up: SwiGLU ("silu"), GeGLU with tanh GELU ("gelu_tanh"), or gpt-oss's
        clamped SwiGLU ("swiglu_oai": gate clamped above at 7, up to ±7,
        g sigmoid(1.702 g) (up + 1))."""
        if act == "silu":
            return F.silu(gate) * up
        if act == "swiglu_oai":
            g = gate.clamp(max=SWIGLU_OAI_LIMIT)
            return g * torch.sigmoid(SWIGLU_OAI_ALPHA * g) * (up.clamp(-SWIGLU_OAI_LIMIT, SWIGLU_OAI_LIMIT) + 1)
        if act == "gelu_tanh":
            return F.gelu(gate, approximate="tanh") * up
        raise ValueError(f"unknown activation {act!r}")

    # ------------------------------------------------------ routed experts

    def moe_route(self, logits: torch.Tensor, k: int, norm: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights (T, k) float32, ids (T, k) int64): the k most probable experts under
        softmax(logits), their probabilities renormalized to sum 1 when `norm`."""
        probs = torch.softmax(logits.float(), dim=-1)
        weights, ids = torch.topk(probs, k, dim=-1)
        if norm:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, ids

    def moe_combine(self, y: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Σ_k weights[t, k] · y[t, k, :]: the chosen experts' outputs, weighted."""
        return (y * weights.unsqueeze(-1).to(y.dtype)).sum(dim=1)

    # ---------------------------------------------------------- sampling

    def mask_logits(self, logits: torch.Tensor, allowed: bytes, n_allowed: int) -> torch.Tensor:
        """A copy of the 1-D `logits` with -inf wherever the token's bit in `allowed` (a
        bitmask in 32-bit little-endian words: bit i of byte i // 8) is clear, and past
        its first `n_allowed` bits."""
        bits = torch.frombuffer(bytearray(allowed), dtype=torch.uint8)
        ok = ((bits[:, None] >> torch.arange(8, dtype=torch.uint8)) & 1).flatten()[:n_allowed].bool()
        n = logits.shape[0]
        keep = torch.zeros(n, dtype=torch.bool, device=logits.device)
        m = min(n, ok.shape[0])
        keep[:m] = ok[:m].to(logits.device)
        return logits.masked_fill(~keep, float("-inf"))

    # ------------------------------------------- Qwen3.5 linear attention

    def causal_conv(self, x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, batch: Batch,
                    silu: bool = True) -> torch.Tensor:
        """Depthwise causal conv1d over each sequence's channels x (T, C) with weight
        (kernel, C), then SiLU where `silu` (Qwen3.5; LFM2's conv has none); the last
        kernel - 1 inputs of each slot are carried in conv_state (slots, kernel - 1, C)."""
        if batch.by_slot_tensor(x):  # every slot at once through the slot tensor
            full = torch.cat([conv_state[batch.slots], x.float()[:, None, :]], dim=1)  # (T, kernel, C)
            conv_state[batch.slots] = full[:, 1:]
            y = (full * weight.float()[None]).sum(1)
            return (F.silu(y) if silu else y).to(x.dtype)
        out = torch.empty_like(x)
        k, c = weight.shape
        w = weight.t()[:, None, :]  # (C, 1, kernel)
        for s in batch.seqs:
            full = torch.cat([conv_state[s.slot], x[s.start:s.start + s.n].float()])  # (kernel - 1 + n, C)
            y = F.conv1d(full.t()[None], w, groups=c)[0]  # (C, n)
            conv_state[s.slot].copy_(full[-(k - 1):])
            out[s.start:s.start + s.n] = (F.silu(y) if silu else y).t().to(x.dtype)
        return out

    def gated_delta_rule(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                         beta: torch.Tensor, state: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Gated DeltaNet over each sequence: q, k (T, Hk, dk), v (T, Hv, dv), log-decay g
        and beta (T, Hv); value head h reads key head h % Hk (the file's tiled head
        order). q and k are L2-normalized here, q scaled by dk^-0.5; the slot's state
        (Hv, dk, dv) is read and updated. Returns (T, Hv, dv) float32."""
        hv, hk = v.shape[1], k.shape[1]
        q = self.l2_norm(q.float()) * (q.shape[-1] ** -0.5)
        k = self.l2_norm(k.float())
        if hv != hk:
            q, k = q.repeat(1, hv // hk, 1), k.repeat(1, hv // hk, 1)
        v, g, beta = v.float(), g.float(), beta.float()
        if batch.by_slot_tensor(v):  # _delta_steps' one step for every slot at once
            S = state[batch.slots] * g.exp()[..., None, None]  # (T, Hv, dk, dv)
            delta = (v - torch.einsum("thkv,thk->thv", S, k)) * beta[..., None]
            S = S + k[..., :, None] * delta[..., None, :]
            state[batch.slots] = S
            return torch.einsum("thkv,thk->thv", S, q)
        out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
        for s in batch.seqs:
            sl = slice(s.start, s.start + s.n)
            fn = self._delta_steps if s.n <= DELTA_CHUNK else self._delta_chunked
            out[sl], new = fn(q[sl], k[sl], v[sl], g[sl], beta[sl], state[s.slot])
            state[s.slot].copy_(new)
        return out

    @staticmethod
    def _delta_steps(q, k, v, g, beta, S):
        """Token by token: S = e^g S; S += k ((v - Sᵀk) β)ᵀ; o = Sᵀq."""
        outs = []
        S = S.clone()
        for t in range(q.shape[0]):
            S = S * g[t].exp()[:, None, None]
            kv = torch.einsum("hkv,hk->hv", S, k[t])
            delta = (v[t] - kv) * beta[t][:, None]
            S = S + k[t][:, :, None] * delta[:, None, :]
            outs.append(torch.einsum("hkv,hk->hv", S, q[t]))
        return torch.stack(outs), S

    @staticmethod
    def _delta_chunked(q, k, v, g, beta, S):
        """The same recurrence in chunks of C tokens: with γ the cumulative log-decay in a
        chunk and D[t, s] = e^(γt - γs), the chunk's pseudo-values U solve
        (I + tril₋₁(β D∘KKᵀ)) U = β (V - e^γ ∘ K S₀); then O = e^γ ∘ Q S₀ + tril(D∘QKᵀ) U
        and S = e^γ_last S₀ + (K ∘ e^(γ_last - γ))ᵀ U."""
        n = q.shape[0]
        outs = []
        # heads first: (H, n, d)
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        g, beta = g.transpose(0, 1), beta.transpose(0, 1)
        S = S.clone()
        for lo in range(0, n, DELTA_CHUNK):
            hi = min(lo + DELTA_CHUNK, n)
            qc, kc, vc, bc = q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], beta[:, lo:hi]
            gam = g[:, lo:hi].cumsum(-1)  # (H, C)
            c = hi - lo
            diff = gam[:, :, None] - gam[:, None, :]
            lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
            decay = torch.where(lower, diff, torch.full_like(diff, float("-inf"))).exp()  # (H, C, C), 0 above
            eg = gam.exp()[..., None]  # (H, C, 1)
            a = (bc[..., None] * decay * (kc @ kc.transpose(-1, -2))).tril(-1)
            rhs = bc[..., None] * (vc - eg * (kc @ S))
            eye = torch.eye(c, dtype=q.dtype, device=q.device)
            u = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
            outs.append(eg * (qc @ S) + (decay * (qc @ kc.transpose(-1, -2))) @ u)
            last = gam[:, -1:]  # (H, 1)
            S = last.exp()[..., None] * S + (kc * (last - gam).exp()[..., None]).transpose(-1, -2) @ u
        return torch.cat(outs, dim=1).transpose(0, 1), S


# Tokens per chunk of the chunked delta rule (longer sequences use it; shorter ones step).
DELTA_CHUNK = 64

TORCH_OPS = TorchOps()
