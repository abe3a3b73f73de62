"""The native CPU dense ops (csrc/ops/ through kernels.cpu_ops) against their torch
twins (kernels.ops.TorchOps), on random inputs with the layouts the models pass
(strided rows, views of a fused projection), at every ISA level of this machine."""

import pytest
import torch

from gguf_serve.engine.batch import Batch
from gguf_serve.engine.kernels import cpu
from gguf_serve.engine.kernels.ops import TORCH_OPS, ring_positions

if cpu.load() is None:
    pytest.skip("native CPU kernels not built", allow_module_level=True)

from gguf_serve.engine.kernels.cpu_ops import cpu_ops  # noqa: E402

CPU_OPS = cpu_ops()

ISAS = cpu.isas()[: cpu.isas().index(cpu.best_isa()) + 1]


@pytest.fixture(params=ISAS)
def isa(request):
    cpu.set_isa(request.param)
    yield request.param
    cpu.set_isa(None)


def close(a, b, tol=2e-5):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_rms_norm_and_norm_add(isa):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 2 * 640, generator=g)[:, ::2] * 3  # rows strided, elements not: copied first
    w = torch.randn(640, generator=g)
    close(CPU_OPS.rms_norm(x, w, 1e-6), TORCH_OPS.rms_norm(x, w, 1e-6))
    rows = torch.randn(4, 3, 2 * 96, generator=g)[..., :96]  # q heads: rows with a stride
    close(CPU_OPS.rms_norm(rows, w[:96], 1e-5), TORCH_OPS.rms_norm(rows, w[:96], 1e-5))
    y, r = torch.randn(3, 640, generator=g), torch.randn(3, 640, generator=g)
    close(CPU_OPS.rms_norm_add(y, w, 1e-6, r), TORCH_OPS.rms_norm_add(y, w, 1e-6, r))


@pytest.mark.parametrize("act", ["silu", "gelu_tanh", "swiglu_oai"])
def test_gated_activations(isa, act):
    g = torch.Generator().manual_seed(1)
    both = torch.randn(3, 2 * 1000 + 6, generator=g) * 6  # up to ±30: exp's clamping range too
    both[0, :8] = torch.tensor([-100.0, 100.0, -88.0, 89.0, 0.0, -0.0, 1e-8, -1e-8])
    gate, up = both[:, :1003], both[:, 1003:]  # views of one projection, odd length (a scalar tail)
    close(CPU_OPS.act_mul(gate, up, act), TORCH_OPS.act_mul(gate, up, act), tol=1e-5)
    fused = both[:, :2006].contiguous()  # the MLP's gate|up projection output
    close(CPU_OPS.gated_mul(fused, 1003, act), TORCH_OPS.gated_mul(fused, 1003, act), tol=1e-5)


@pytest.mark.parametrize("norm", [True, False])
def test_expert_routing_and_combine(isa, norm):
    """softmax → top-k → (renormalized) weights, and the weighted sum of the chosen
    experts' outputs, as MoE layers use them; a tie goes to the lower expert index."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 128, generator=g) * 2
    logits[5, 10] = logits[5, 20] = 50.0  # a tie at the top
    w, ids = CPU_OPS.moe_route(logits, 8, norm)
    w_ref, ids_ref = TORCH_OPS.moe_route(logits, 8, norm)
    assert ids.dtype is torch.int64 and ids[5, :2].tolist() == [10, 20]
    assert torch.equal(ids.sort(dim=-1).values, ids_ref.sort(dim=-1).values)
    close(w.gather(1, ids.argsort(dim=-1)), w_ref.gather(1, ids_ref.argsort(dim=-1)), tol=1e-6)
    if norm:
        close(w.sum(dim=-1), torch.ones(6), tol=1e-6)
    y = torch.randn(6, 8, 2048 + 3, generator=g)  # a scalar tail too
    close(CPU_OPS.moe_combine(y, w), TORCH_OPS.moe_combine(y, w), tol=1e-5)


def _attention_case(n_kv, n_heads, d, window, gated, seqs, n_cells, n_slots=3, seed=2, sinks=False, types="f32"):
    """A layer's fused q/k/v projection for a batch of `seqs` (slot, new tokens, position),
    over a cache (rows of `types`, "k/v" or one for both) whose slots already hold random
    earlier positions: fresh, identical inputs on every call (the native op works in
    place)."""
    from gguf_serve.engine.cache import KVCache, attention, kv_types
    from gguf_serve.engine.models.layers import AttentionSpec, Rope

    g = torch.Generator().manual_seed(seed)
    batch = Batch.of([(slot, list(range(n)), pos) for slot, n, pos in seqs])
    t = batch.n_tokens
    qkv = torch.randn(t, n_heads * d * (2 if gated else 1) + 2 * n_kv * d, generator=g)
    kt, vt = (types.split("/") * 2)[:2]
    cache = KVCache([attention(n_kv, d, window)], n_seq=n_slots, n_ctx=n_cells if not window else 200 * n_cells,
                    max_batch=n_cells - window if window else 64, types=kv_types(torch.float32, kt, vt))
    assert cache.n_cells[0] == n_cells
    for buf, ty in zip((cache.k[0], cache.v[0]), cache.types):
        buf.copy_(TORCH_OPS.to_rows(torch.randn(*buf.shape[:-1], d, generator=g), ty))
    rope = Rope(1.0 / 10000 ** (torch.arange(d // 4).float() / (d // 4)), 1.0, True)
    spec = AttentionSpec(layer=0, n_heads=n_heads, n_kv_heads=n_kv, head_dim=d, rope=rope, scale=d ** -0.5,
                         eps=1e-6, window=window, gated=gated, q_norm=torch.randn(d, generator=g),
                         k_norm=torch.randn(d, generator=g),
                         sinks=3 * torch.randn(n_heads, generator=g) if sinks else None)
    return spec, qkv, batch, cache


@pytest.mark.parametrize("n", [1, 3, 30])
def test_gemma4_normed_values_and_a_shared_layer(isa, n):
    """Gemma 4: v heads RMS-normalized (no scale) before they are cached, and a later layer
    with queries only attending over that layer's cache (kv_shared); native (decode, and a
    30-token chunk in tiles of tokens) equal the torch ops."""
    from gguf_serve.engine.cache import KVCache, attention, shared
    from gguf_serve.engine.models.layers import AttentionSpec, Rope

    d, heads, kv = 32, 4, 2
    rope = Rope(1.0 / 10000 ** (torch.arange(d // 2).float() / (d // 2)), 1.0, True)
    results = []
    for ops in (CPU_OPS, TORCH_OPS):
        g = torch.Generator().manual_seed(9)
        cache = KVCache([attention(kv, d), shared(0)], n_seq=2, n_ctx=64, max_batch=32)
        assert cache.k[1] is None and cache.v[1] is None  # a shared layer holds nothing of its own
        own = AttentionSpec(0, heads, kv, d, rope, 1.0, 1e-6, q_norm=torch.rand(d, generator=g),
                            k_norm=torch.rand(d, generator=g), v_norm=torch.ones(d))
        reuse = AttentionSpec(0, heads, kv, d, rope, 1.0, 1e-6, q_norm=torch.rand(d, generator=g), kv_shared=True)
        outs = []
        for start, length in ((0, 20), (20, n)):
            batch = Batch.of([(1, list(range(length)), start)])
            qkv = torch.randn(length, own.width, generator=g) * 3
            outs.append(ops.self_attention(qkv, own, batch, cache))
            outs.append(ops.self_attention(torch.randn(length, reuse.width, generator=g), reuse, batch, cache))
        results.append((outs, cache))
    (ours, c1), (ref, c2) = results
    for a, b in zip(ours, ref):
        close(a, b, tol=5e-5)
    close(c1.v[0][1, :, :20 + n], c2.v[0][1, :, :20 + n])
    assert torch.allclose(c1.v[0][1, :, :20 + n].pow(2).mean(-1), torch.ones(kv, 20 + n), atol=1e-4)  # normalized


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("layout", ["gqa", "gated", "window", "ring", "prefill", "sinks", "sinks-prefill",
                                    "prefill-ring", "prefill-deep", "prefill-gated", "prefill-g3", "prefill-d80",
                                    "prefill-d72", "prefill-softcap"])
def test_attention_equals_torch(isa, layout, neox):
    """Decode (a few tokens a sequence: blocks of cells across threads) and prompt chunks
    (tiles of tokens, flash attention; a head size that is not a multiple of 16, d72,
    goes to torch) against the torch ops."""
    cases = {  # (n_kv, n_heads, d, window, gated, (slot, new tokens, position) per sequence, cells)
        "gqa": (2, 8, 64, 0, False, [(0, 1, 40), (2, 1, 5), (1, 3, 17)], 64),  # 8 query heads on 2
        "gated": (2, 4, 64, 0, True, [(1, 2, 30)], 64),  # Qwen3.5: a gate after each query head
        "window": (1, 4, 32, 8, False, [(0, 1, 50), (1, 4, 3)], 72),  # sliding window, ring not wrapped
        "ring": (1, 4, 32, 8, False, [(0, 1, 100), (2, 5, 61)], 24),  # a ring of 24, wrapped
        "prefill": (2, 4, 32, 0, False, [(0, 40, 0), (1, 1, 7)], 64),  # a long chunk beside a decode
        # gpt-oss: a sink logit per head, over a wrapped window and a full cache
        "sinks": (2, 8, 64, 8, False, [(0, 1, 100), (2, 3, 61)], 24, 3, 2, True),
        "sinks-prefill": (2, 8, 64, 0, False, [(0, 40, 0), (1, 1, 7)], 64, 3, 2, True),
        "prefill-ring": (2, 4, 64, 16, False, [(0, 30, 70), (1, 20, 0)], 48),  # a chunk into a wrapped ring
        "prefill-deep": (2, 8, 64, 0, False, [(0, 100, 900), (1, 1, 300)], 1024),  # many blocks, most seen whole
        "prefill-gated": (1, 4, 64, 0, True, [(1, 33, 10)], 64),
        "prefill-g3": (2, 6, 32, 0, False, [(0, 40, 0)], 64),  # 21 tokens of 3 heads a tile: rows padded
        "prefill-d80": (2, 4, 80, 0, False, [(0, 40, 5)], 64),  # a head of 64 + 16
        "prefill-d72": (2, 4, 72, 0, False, [(0, 40, 5)], 64),
        "prefill-softcap": (2, 4, 32, 0, False, [(0, 40, 5)], 64),
    }
    results = []
    for ops in (CPU_OPS, TORCH_OPS):
        spec, qkv, batch, cache = _attention_case(*cases[layout])
        spec.rope.neox = neox
        if layout == "prefill-softcap":
            spec.softcap = 0.5  # Gemma 2 caps at 50 over scaled scores of a few units; 0.5 bends most here
        results.append((ops.self_attention(qkv, spec, batch, cache), cache))
    (ours, c1), (ref, c2) = results
    close(ours, ref, tol=5e-5)
    close(c1.k[0], c2.k[0])
    close(c1.v[0], c2.v[0])


@pytest.mark.parametrize("types", ["f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "q8_0/f16"])
@pytest.mark.parametrize("layout", ["gqa", "ring", "sinks", "long", "long-window", "prefill", "prefill-ring"])
def test_typed_caches_equal_torch(isa, layout, types):
    """Caches of half and quantized rows: the native op writes each new key and value as
    gguf_io's quantizers (numpy) do, and attends over the rows as torch does over the
    same rows dequantized; long caches split into blocks across threads (flash-decoding)
    and merged equal one pass."""
    cases = {
        "gqa": (2, 8, 64, 0, False, [(0, 1, 40), (2, 1, 5), (1, 3, 17)], 64),
        "ring": (1, 4, 32, 8, False, [(0, 1, 100), (2, 5, 61)], 24),
        "sinks": (2, 8, 64, 8, False, [(0, 1, 100), (2, 3, 61)], 24, 3, 2, True),
        "long": (1, 4, 64, 0, False, [(0, 1, 1500), (1, 3, 999), (2, 1, 64)], 1536),  # several blocks each
        "long-window": (2, 4, 64, 300, False, [(0, 1, 2000), (1, 2, 700)], 364),  # a ring of blocks, wrapped
        "prefill": (2, 4, 32, 0, False, [(0, 40, 0), (1, 1, 7)], 64),  # tiles of tokens over typed rows
        "prefill-ring": (2, 4, 64, 16, False, [(0, 30, 70), (1, 20, 0)], 48),
    }
    case = cases[layout] + (() if len(cases[layout]) > 7 else (3, 2, False))
    spec, qkv, batch, cache = _attention_case(*case, types=types)
    q_in = qkv.clone()
    ours = CPU_OPS.self_attention(qkv, spec, batch, cache)
    spec2, qkv2, batch2, ref_cache = _attention_case(*case, types=types)
    TORCH_OPS.self_attention(qkv2, spec2, batch2, ref_cache)
    d = spec.head_dim
    for a, b, ty in zip((cache.k[0], cache.v[0]), (ref_cache.k[0], ref_cache.v[0]), cache.types):
        # the rows written: as numpy's quantizer (the inputs' last-bit differences in the
        # normed, rotated keys may move a value by one step, rarely)
        fa, fb = TORCH_OPS.from_rows(a, ty, d, torch.float32), TORCH_OPS.from_rows(b, ty, d, torch.float32)
        levels = {"q8_0": 127, "q4_0": 7, "q4_1": 7, "q5_0": 15, "q5_1": 15, "iq4_nl": 5}.get(ty.name, 256)
        step = fb.abs().amax(-1, keepdim=True) / levels
        assert ((fa - fb).abs() <= step * 1.01 + 1e-6).all()
        assert (a == b).float().mean() > 0.99
    # the attention over the rows the native op wrote: torch over the same rows, dequantized
    t, h = q_in.shape[0], spec.n_heads
    q = qkv[:, :spec.q_width].reshape(t, h, -1)[..., :d]  # normed and rotated in place by the native op
    ref = TORCH_OPS.attention(q, cache.k[0], cache.v[0], batch, cache.n_cells[0], spec.window, spec.scale,
                              spec.softcap, False, spec.sinks, cache.types).reshape(t, h * d)
    close(ours, ref, tol=5e-5)


@pytest.mark.parametrize("types", ["f32", "f16", "q8_0"])
def test_batched_attention_equals_each_sequence_alone(isa, types):
    """Sequences of very different lengths (1 to 1500 cells: one block to many) in one
    call give, bit for bit, what each gives alone: a sequence's blocks do not depend on
    the batch."""
    seqs = [(0, 1, 1500), (1, 1, 3), (2, 2, 700), (3, 1, 0), (4, 3, 90)]
    case = (2, 8, 64, 0, False)
    spec, qkv, batch, cache = _attention_case(*case, seqs, 1536, n_slots=5, types=types)
    together = CPU_OPS.self_attention(qkv, spec, batch, cache)
    for i, one in enumerate(seqs):
        spec, qkv, batch, cache = _attention_case(*case, seqs, 1536, n_slots=5, types=types)  # the same inputs
        start = sum(n for _, n, _ in seqs[:i])
        sub = Batch.of([(one[0], list(range(one[1])), one[2])])
        alone = CPU_OPS.self_attention(qkv[start:start + one[1]].contiguous(), spec, sub, cache)
        assert torch.equal(alone, together[start:start + one[1]])


def test_quantized_caches_stay_near_float():
    """The same attention over a q8_0 / q4_0 / f16 cache and a float32 one: outputs differ
    by what the rows' rounding allows."""
    outs = {}
    for types in ("f32", "f16", "q8_0", "q4_0"):
        spec, qkv, batch, cache = _attention_case(2, 8, 128, 0, False, [(0, 1, 700), (1, 2, 300)], 1024, seed=5,
                                                  types="f32")
        if types != "f32":  # the same random history, rounded to the type
            from gguf_serve.engine.cache import KVCache, kv_types
            typed = KVCache([cache.layers[0]], n_seq=3, n_ctx=1024, max_batch=64,
                            types=kv_types(torch.float32, types, types))
            for src, dst, ty in zip((cache.k[0], cache.v[0]), (typed.k[0], typed.v[0]), typed.types):
                dst.copy_(TORCH_OPS.to_rows(src, ty))
            cache = typed
        outs[types] = CPU_OPS.self_attention(qkv, spec, batch, cache)
    scale = outs["f32"].abs().mean()
    err = {k: ((v - outs["f32"]).abs().mean() / scale).item() for k, v in outs.items()}
    assert err["f16"] < 1e-3 and err["q8_0"] < 2e-2 and err["q4_0"] < 0.2, err  # 3e-4, 7e-3, 0.12 measured
    assert err["f16"] < err["q8_0"] < err["q4_0"], err


def test_ring_positions():
    assert ring_positions(4, 3).tolist() == [0, 1, 2]
    assert ring_positions(4, 10).tolist() == [8, 9, 6, 7]


def _seqs_batch(lengths, slots):
    return Batch.of([(s, list(range(n)), 0) for s, n in zip(slots, lengths)])


@pytest.mark.parametrize("kernel,silu", [(4, True), (3, False)])  # Qwen3.5's, LFM2's
def test_causal_conv_equals_torch(isa, kernel, silu):
    g = torch.Generator().manual_seed(3)
    batch = _seqs_batch([1, 5, 2], [2, 0, 1])
    full = torch.randn(batch.n_tokens, 200, generator=g)
    x = full[:, 30:160]  # 130 channels, rows strided: a column range of a projection
    w = torch.randn(kernel, 130, generator=g)  # (kernel, channels)
    state = torch.randn(3, kernel - 1, 130, generator=g)  # (slots, kernel - 1, channels)
    s1, s2 = state.clone(), state.clone()
    out = CPU_OPS.causal_conv(x, s1, w, batch, silu)
    close(out, TORCH_OPS.causal_conv(x, s2, w, batch, silu))
    close(s1, s2)
    assert bool(out.min() < -0.28) != silu  # SiLU's outputs stay above -0.2785; a plain conv's do not


def test_gated_delta_rule_equals_torch(isa):
    g = torch.Generator().manual_seed(4)
    batch = _seqs_batch([1, 3, 7], [1, 2, 0])
    t, n_k, n_v, dk, dv = batch.n_tokens, 2, 4, 32, 24
    mixed = torch.randn(t, 2 * n_k * dk + n_v * dv, generator=g)
    q, k, v = mixed.split([n_k * dk, n_k * dk, n_v * dv], dim=-1)
    q, k, v = q.reshape(t, n_k, dk), k.reshape(t, n_k, dk), v.reshape(t, n_v, dv)
    gl = -torch.rand(t, n_v, generator=g) * 2
    beta = torch.rand(t, n_v, generator=g)
    state = torch.randn(3, n_v, dk, dv, generator=g) * 0.1
    s1, s2 = state.clone(), state.clone()
    close(CPU_OPS.gated_delta_rule(q, k, v, gl, beta, s1, batch), TORCH_OPS.gated_delta_rule(q, k, v, gl, beta, s2, batch))
    close(s1, s2)


def test_chunked_delta_rule_equals_the_steps():
    """The torch twin's chunked form (long prompts) against its token-by-token form."""
    g = torch.Generator().manual_seed(5)
    n, h, dk, dv = 150, 3, 16, 8
    q, k = torch.randn(n, h, dk, generator=g), torch.nn.functional.normalize(torch.randn(n, h, dk, generator=g), dim=-1)
    v, gl, beta = torch.randn(n, h, dv, generator=g), -torch.rand(n, h, generator=g), torch.rand(n, h, generator=g)
    s0 = torch.randn(h, dk, dv, generator=g) * 0.1
    o1, s1 = TORCH_OPS._delta_steps(q, k, v, gl, beta, s0)
    o2, s2 = TORCH_OPS._delta_chunked(q, k, v, gl, beta, s0)
    close(o1, o2, tol=1e-4)
    close(s1, s2, tol=1e-4)


def test_lora_products_equal_torch_and_each_row_alone(isa):
    """LoRA's float16 products for a decode step (engine.lora): h = x A^T, and y += h B span
    by span, equal torch's on the same values (odd sizes: the vectors' tails); a row through
    every adapter's stacked factors, the columns of those it does not use zeroed, gets the
    bits it gets through its own adapter's factors alone."""
    g = torch.Generator().manual_seed(11)
    ranks, cols, out = (16, 8, 16), 300, 777
    a = (torch.randn(sum(ranks), cols, generator=g) * 0.1).half()
    bt = (torch.randn(sum(ranks), out, generator=g) * 0.1).half()
    ends = torch.tensor(ranks).cumsum(0).tolist()
    kernels = cpu.CpuKernels.make(threads=2, isa=isa)
    every = cpu.LoraProducts(kernels, a, bt, ends)
    x = torch.randn(5, cols, generator=g)
    h = every.down(x)
    close(h, x @ a.float().T, tol=1e-4)
    y0 = torch.randn(5, out, generator=g)
    y = y0.clone()
    every.up(y, h)
    close(y, y0 + h @ bt.float(), tol=1e-4)

    use = [0, 2, 1, 0, 2]  # each row's adapter
    mask = torch.zeros(5, sum(ranks))
    starts = [0, *ends[:-1]]
    for row, i in enumerate(use):
        mask[row, starts[i]:ends[i]] = 0.5
    y = y0.clone()
    masked = every.down(x, mask)  # only the columns a row uses computed (the others 0)
    assert torch.equal(masked, every.down(x) * mask)
    every.up(y, masked)
    for row, i in enumerate(use):
        own = cpu.LoraProducts(kernels, a[starts[i]:ends[i]], bt[starts[i]:ends[i]], [ranks[i]])
        alone = y0[row:row + 1].clone()
        own.up(alone, own.down(x[row:row + 1]) * 0.5)
        assert torch.equal(y[row:row + 1], alone), (row, i)
