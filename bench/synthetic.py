"""Synthetic GGUF files written by our own writer, with real models' shapes, tensor
names and Q4_K_M-like quantization mixes, and random blocks (zero-mean weights with a
trained layer's spread, see random_blocks), so that speed at real sizes is measured
without a download:

- qwen3-4b: Qwen3-4B (36 layers, hidden 2560, ffn 9728, 32 / 8 heads x 128).
- qwen35-4b: Qwen3.5-4B (32 layers, hidden 2560, ffn 9216, gated attention every 4th
  layer with 16 / 4 heads x 256, Gated DeltaNet with 16 key heads and 32 value heads
  x 128, conv kernel 4, rotary sections [11, 11, 10, 0] over 64 dims, tied 248,320-token
  vocabulary).
- qwen3-30b-a3b-12l: Qwen3-30B-A3B cut to 12 of its 48 layers (hidden 2048, 32 / 4 heads
  x 128, 128 experts of ffn 768, 8 used).
- gpt-oss-20b-12l: gpt-oss-20b cut to 12 of its 24 layers (hidden 2880, 64 / 8 heads x 64,
  window 128 on every other layer, YaRN x32 over 4096, 32 experts of ffn 2880, 4 used) with
  its files' MXFP4 experts; attention, embedding and head Q8_0; biases, sinks and the
  router F32; a 201,088-token vocabulary.
- gemma4-e4b: Gemma 4 E4B (42 layers, hidden 2560, 8 heads; sliding layers 2 key-value
  heads x 256 with a window of 512, every sixth layer full with 2 x 512 and proportional
  rotary; the last 18 layers share the caches of earlier ones; per-layer embeddings of
  256 per layer; ffn 10240; tied 262,144-token vocabulary).
- gemma4-26b-a4b-10l: Gemma 4 26B-A4B cut to 10 of its 30 layers (hidden 2816, 16 heads;
  sliding 8 x 256, window 1024; full 2 x 512 with keys as values; a dense MLP of 2112
  beside 128 experts of 704, 8 used). The Gemma 4 shapes are the published configs' as
  NVIDIA's NeMo and mlx-lm's model files state them.
- qwen3-embedding-0.6b: Qwen3-Embedding-0.6B (28 layers, hidden 1024, ffn 3072, 16 / 8
  heads x 128, tied 151,669-token vocabulary) as its Q8_0 file: last-token pooling, EOS
  appended.

Each has a byte-level vocabulary (the 256 bytes, filler tokens up to the model's size,
<think> and </think>, ChatML's and Qwen's vision specials: text tokenizes one token per
byte in both engines) and a thinking ChatML template that, as Qwen3.5's, drops past turns'
thinking and writes an image part as <|vision_start|><|image_pad|><|vision_end|>.

    python bench/synthetic.py NAME OUT.gguf
"""

from __future__ import annotations

import sys

import numpy as np

from gguf_serve.gguf_io import GGMLType, GGUFValueType as V, GGUFWriter

Q4, Q6, Q8, MX = GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q8_0, GGMLType.MXFP4

def random_blocks(rng: np.random.Generator, gtype: GGMLType, shape: tuple[int, ...]):
    """A callable producing random packed blocks of `shape` (pulled while writing) whose
    weights have mean zero and a standard deviation of 1/sqrt(columns), like a trained
    layer's: the activations then stay of order one through the layers. (Blocks with a
    positive mean drive SiLU gates far negative, and activations of 1e-34 make float32
    denormals in the dot products, which both engines would pay for and no real model
    does.) Q4_K: each sub-block's min equals its scale and dmin = 7.5 d, so a weight is
    d * scale * (q - 7.5); Q6_K: d * int8 scale * (q - 32); Q8_0: d * q; MXFP4: the power of
    two nearest the spread over the doubled E2M1 values' (root mean square 5.85)."""
    cols = shape[-1]
    target = 1.0 / np.sqrt(cols)
    if gtype == MX:
        e = np.uint8(round(128 + np.log2(target / 5.85)))

        def make_mx():
            rows = int(np.prod(shape[:-1]))
            raw = rng.integers(0, 256, size=(rows, gtype.row_nbytes(cols)), dtype=np.uint8)
            raw.reshape(-1, gtype.type_size)[:, 0] = e
            return raw.reshape(*shape[:-1], -1)
        return make_mx
    # the standard deviation of the integer part of a weight with uniform random bits
    spread = {Q4: np.sqrt(63 * 127 / 6) * np.sqrt(255 / 12), Q6: np.sqrt(128 ** 2 / 3) * np.sqrt(4095 / 12),
              Q8: np.sqrt(128 ** 2 / 3)}[gtype]
    d = np.frombuffer(np.float16(target / spread).tobytes(), np.uint8)

    def make():
        rows = int(np.prod(shape[:-1]))
        raw = rng.integers(0, 256, size=(rows, gtype.row_nbytes(cols)), dtype=np.uint8)
        b = raw.reshape(-1, gtype.type_size)
        if gtype == Q4:  # d, dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles
            b[:, 0:2] = d
            b[:, 2:4] = np.frombuffer(np.float16(7.5 * np.float16(target / spread)).tobytes(), np.uint8)
            b[:, 8:12] = b[:, 4:8]  # mins 0-3 (and the high bits of mins 4-7) = the scales'
            b[:, 12:16] = (b[:, 12:16] & 0x0F) | (b[:, 12:16] << 4)  # mins 4-7 low bits = the scales'
        elif gtype == Q6:  # 128 ql, 64 qh, 16 int8 scales, d
            b[:, 208:210] = d
        else:  # Q8_0: d, 32 int8
            b[:, 0:2] = d
        return raw.reshape(*shape[:-1], -1)
    return make


# ChatML with Qwen3's thinking switch; past assistant turns are rendered from their content only
THINKING_TEMPLATE = (
    "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}"
    "{%- if m.content is string %}{{ m.content }}{%- else %}{%- for item in m.content %}"
    "{%- if item.type == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif item.type == 'text' %}{{ item.text }}{%- endif %}{%- endfor %}{%- endif %}"
    "{{ '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{ '<think>\\n' }}{%- endif %}{%- endif %}"
)


def _byte_chars() -> list[str]:
    """GPT-2's printable character for each byte (its byte-level BPE alphabet)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = {b: b for b in keep}, 0
    for b in range(256):
        if b not in chars:
            chars[b], extra = 256 + extra, extra + 1
    return [chr(chars[b]) for b in range(256)]


def _vocab(w: GGUFWriter, n: int) -> None:
    users = ["<think>", "</think>"]
    specials = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    fill = n - 256 - len(users) - len(specials)
    tokens = _byte_chars() + [f"t{i}" for i in range(fill)] + users + specials
    w.add("tokenizer.ggml.model", "gpt2")
    w.add("tokenizer.ggml.pre", "qwen2")
    w.add("tokenizer.ggml.tokens", tokens, (V.ARRAY, V.STRING))
    w.add("tokenizer.ggml.token_type", [1] * (256 + fill) + [4, 4] + [3] * len(specials), (V.ARRAY, V.INT32))
    w.add("tokenizer.chat_template", THINKING_TEMPLATE)
    w.add("tokenizer.ggml.merges", [], (V.ARRAY, V.STRING))
    w.add("tokenizer.ggml.eos_token_id", n - 1)
    w.add("tokenizer.ggml.bos_token_id", n - 3)
    w.add("tokenizer.ggml.add_bos_token", False)


def _header(w: GGUFWriter, arch: str, name: str, s: dict, file_type: int = 15) -> None:
    w.add("general.architecture", arch)
    w.add("general.name", name)
    w.add("general.file_type", file_type)  # 15: MOSTLY_Q4_K_M
    for key, value in {"context_length": s["ctx"], "embedding_length": s["hidden"], "block_count": s["layers"],
                       "feed_forward_length": s["ffn"], "attention.head_count": s["heads"],
                       "attention.head_count_kv": s["kv_heads"], "attention.key_length": s["head_dim"],
                       "attention.value_length": s["head_dim"]}.items():
        if value is not None:  # None: the writer states it otherwise (per layer)
            w.add(f"{arch}.{key}", value)
    w.add(f"{arch}.rope.freq_base", float(s.get("rope_base", 1000000.0)))
    w.add(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    _vocab(w, s["vocab"])


def _moe_keys(w: GGUFWriter, arch: str, s: dict) -> None:
    w.add(f"{arch}.expert_count", s["experts"])
    w.add(f"{arch}.expert_used_count", s["used"])
    w.add(f"{arch}.expert_feed_forward_length", s["expert_ffn"])


def _embedding_and_head(w: GGUFWriter, rng, s: dict, embd: GGMLType, head: GGMLType) -> None:
    _mat(w, rng, "token_embd.weight", embd, (s["vocab"], s["hidden"]))
    w.add_tensor("output_norm.weight", np.ones(s["hidden"], np.float32))
    _mat(w, rng, "output.weight", head, (s["vocab"], s["hidden"]))


def _mat(w, rng, name, gtype, shape):
    w.add_tensor(name, random_blocks(rng, gtype, shape), ggml_type=gtype, shape=shape)


def _attention(w, rng, i, s, q_rows):
    h, hd, kv = s["hidden"], s["head_dim"], s["kv_heads"]
    _mat(w, rng, f"blk.{i}.attn_q.weight", Q4, (q_rows, h))
    _mat(w, rng, f"blk.{i}.attn_k.weight", Q4, (kv * hd, h))
    _mat(w, rng, f"blk.{i}.attn_v.weight", Q6 if i % 2 == 0 else Q4, (kv * hd, h))  # Q4_K_M: Q6_K in half
    _mat(w, rng, f"blk.{i}.attn_output.weight", Q4, (h, s["heads"] * hd))
    for norm in ("attn_q_norm", "attn_k_norm"):
        w.add_tensor(f"blk.{i}.{norm}.weight", np.ones(hd, np.float32))


def _mlp(w, rng, i, s):
    h, ff = s["hidden"], s["ffn"]
    _mat(w, rng, f"blk.{i}.ffn_gate.weight", Q4, (ff, h))
    _mat(w, rng, f"blk.{i}.ffn_up.weight", Q4, (ff, h))
    _mat(w, rng, f"blk.{i}.ffn_down.weight", Q6 if i % 2 == 0 else Q4, (h, ff))


QWEN3_4B = dict(vocab=151936, hidden=2560, layers=36, heads=32, kv_heads=8, head_dim=128, ffn=9728, ctx=40960)


def write_qwen3(path: str, s: dict = QWEN3_4B, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    with GGUFWriter(path) as w:
        _header(w, "qwen3", "synthetic Qwen3-4B", s)
        _mat(w, rng, "token_embd.weight", Q4, (s["vocab"], s["hidden"]))
        w.add_tensor("output_norm.weight", np.ones(s["hidden"], np.float32))
        _mat(w, rng, "output.weight", Q6, (s["vocab"], s["hidden"]))
        for i in range(s["layers"]):
            _attention(w, rng, i, s, s["heads"] * s["head_dim"])
            _mlp(w, rng, i, s)
            for norm in ("attn_norm", "ffn_norm"):
                w.add_tensor(f"blk.{i}.{norm}.weight", np.ones(s["hidden"], np.float32))


QWEN35_4B = dict(vocab=248320, hidden=2560, layers=32, heads=16, kv_heads=4, head_dim=256, ffn=9216, ctx=262144,
                 rope_base=10000000.0, k_heads=16, v_heads=32, ssm_dim=128, conv=4, interval=4)


def write_qwen35(path: str, s: dict = QWEN35_4B, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    arch, h = "qwen35", s["hidden"]
    value_dim = s["v_heads"] * s["ssm_dim"]
    with GGUFWriter(path) as w:
        _header(w, arch, "synthetic Qwen3.5-4B", s)
        w.add(f"{arch}.ssm.conv_kernel", s["conv"])
        w.add(f"{arch}.ssm.state_size", s["ssm_dim"])
        w.add(f"{arch}.ssm.group_count", s["k_heads"])
        w.add(f"{arch}.ssm.time_step_rank", s["v_heads"])
        w.add(f"{arch}.ssm.inner_size", value_dim)
        w.add(f"{arch}.full_attention_interval", s["interval"])
        w.add(f"{arch}.rope.dimension_count", 64)
        w.add(f"{arch}.rope.dimension_sections", [11, 11, 10, 0])
        _mat(w, rng, "token_embd.weight", Q6, (s["vocab"], h))  # tied: the output head's type
        w.add_tensor("output_norm.weight", np.ones(h, np.float32))
        for i in range(s["layers"]):
            p = f"blk.{i}."
            if (i + 1) % s["interval"] == 0:
                _attention(w, rng, i, s, 2 * s["heads"] * s["head_dim"])  # query and gate per head
            else:
                _delta_net(w, rng, i, s, fused_ba=False)
            _mlp(w, rng, i, s)
            for norm in ("attn_norm", "post_attention_norm"):
                w.add_tensor(f"{p}{norm}.weight", np.ones(h, np.float32))


def _delta_net(w, rng, i, s, fused_ba: bool) -> None:
    """Layer i's Gated DeltaNet: beta and alpha as two matrices (Qwen3.5's files) or one
    (ssm_ba, Qwen3-Next's)."""
    p, h = f"blk.{i}.", s["hidden"]
    key_dim, value_dim = s["k_heads"] * s["ssm_dim"], s["v_heads"] * s["ssm_dim"]
    conv_dim = 2 * key_dim + value_dim
    _mat(w, rng, p + "attn_qkv.weight", Q4, (conv_dim, h))
    _mat(w, rng, p + "attn_gate.weight", Q4, (value_dim, h))
    if fused_ba:
        _mat(w, rng, p + "ssm_ba.weight", Q4, (2 * s["v_heads"], h))
    else:
        _mat(w, rng, p + "ssm_alpha.weight", Q4, (s["v_heads"], h))
        _mat(w, rng, p + "ssm_beta.weight", Q4, (s["v_heads"], h))
    _mat(w, rng, p + "ssm_out.weight", Q6 if i % 2 == 0 else Q4, (h, value_dim))
    w.add_tensor(p + "ssm_conv1d.weight", (rng.standard_normal((conv_dim, s["conv"])) * 0.1).astype(np.float32))
    w.add_tensor(p + "ssm_a", -np.ones(s["v_heads"], np.float32))
    w.add_tensor(p + "ssm_dt.bias", np.zeros(s["v_heads"], np.float32))
    w.add_tensor(p + "ssm_norm.weight", np.ones(s["ssm_dim"], np.float32))


QWEN3_30B_A3B_12L = dict(vocab=151936, hidden=2048, layers=12, heads=32, kv_heads=4, head_dim=128, ffn=6144,
                         ctx=40960, experts=128, used=8, expert_ffn=768)


def write_qwen3moe(path: str, s: dict = QWEN3_30B_A3B_12L, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    arch, h, e, eff = "qwen3moe", s["hidden"], s["experts"], s["expert_ffn"]
    with GGUFWriter(path) as w:
        _header(w, arch, "synthetic Qwen3-30B-A3B, 12 of 48 layers", s)
        _moe_keys(w, arch, s)
        _embedding_and_head(w, rng, s, Q4, Q6)
        for i in range(s["layers"]):
            p = f"blk.{i}."
            _attention(w, rng, i, s, s["heads"] * s["head_dim"])
            w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((e, h)) * 0.02).astype(np.float32))
            _mat(w, rng, p + "ffn_gate_exps.weight", Q4, (e, eff, h))
            _mat(w, rng, p + "ffn_up_exps.weight", Q4, (e, eff, h))
            _mat(w, rng, p + "ffn_down_exps.weight", Q6 if i % 2 == 0 else Q4, (e, h, eff))
            for norm in ("attn_norm", "ffn_norm"):
                w.add_tensor(f"{p}{norm}.weight", np.ones(h, np.float32))


GPT_OSS_20B_12L = dict(vocab=201088, hidden=2880, layers=12, heads=64, kv_heads=8, head_dim=64, ffn=2880,
                       ctx=131072, experts=32, used=4, expert_ffn=2880, window=128, rope_base=150000.0)


def write_gpt_oss(path: str, s: dict = GPT_OSS_20B_12L, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    arch, h, e, eff, hd = "gpt-oss", s["hidden"], s["experts"], s["expert_ffn"], s["head_dim"]
    vec = lambda n, scale=0.02: (rng.standard_normal(n) * scale).astype(np.float32)  # noqa: E731
    with GGUFWriter(path) as w:
        _header(w, arch, "synthetic gpt-oss-20b, 12 of 24 layers", s)
        _moe_keys(w, arch, s)
        w.add(f"{arch}.attention.sliding_window", s["window"])
        for key, value in (("type", "yarn"), ("factor", 32.0), ("original_context_length", 4096),
                           ("yarn_beta_fast", 32.0), ("yarn_beta_slow", 1.0)):
            w.add(f"{arch}.rope.scaling.{key}", value)
        _embedding_and_head(w, rng, s, Q8, Q8)
        for i in range(s["layers"]):
            p = f"blk.{i}."
            for name, rows, cols in (("attn_q", s["heads"] * hd, h), ("attn_k", s["kv_heads"] * hd, h),
                                     ("attn_v", s["kv_heads"] * hd, h), ("attn_output", h, s["heads"] * hd)):
                _mat(w, rng, f"{p}{name}.weight", Q8, (rows, cols))
                w.add_tensor(f"{p}{name}.bias", vec(rows))
            w.add_tensor(p + "attn_sinks.weight", vec(s["heads"], 1.0))
            w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((e, h)) * 0.02).astype(np.float32))
            w.add_tensor(p + "ffn_gate_inp.bias", vec(e))
            for name, shape in (("ffn_gate_exps", (e, eff, h)), ("ffn_up_exps", (e, eff, h)),
                                ("ffn_down_exps", (e, h, eff))):
                _mat(w, rng, f"{p}{name}.weight", MX, shape)
                w.add_tensor(f"{p}{name}.bias", vec(shape[0] * shape[1]).reshape(shape[:2]))
            for norm in ("attn_norm", "post_attention_norm"):
                w.add_tensor(f"{p}{norm}.weight", np.ones(h, np.float32))


GEMMA4_E4B = dict(vocab=262144, hidden=2560, layers=42, heads=8, kv_heads=2, head_dim=512, ffn=10240, ctx=131072,
                  head_dim_swa=256, kv_heads_full=2, window=512, shared=18, per_layer=256, k_eq_v=False,
                  rope_base=1000000.0)
GEMMA4_26B_A4B_10L = dict(vocab=262144, hidden=2816, layers=10, heads=16, kv_heads=8, head_dim=512, ffn=2112,
                          ctx=262144, head_dim_swa=256, kv_heads_full=2, window=1024, shared=0, per_layer=0,
                          k_eq_v=True, experts=128, used=8, expert_ffn=704, rope_base=1000000.0)


def write_gemma4(path: str, s: dict = GEMMA4_E4B, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    arch, h, n = "gemma4", s["hidden"], s["layers"]
    sliding = [(i + 1) % 6 != 0 for i in range(n)]
    with GGUFWriter(path) as w:
        _header(w, arch, f"synthetic Gemma 4 ({n} layers)", {**s, "kv_heads": None})
        w.add(f"{arch}.attention.head_count_kv", [s["kv_heads"] if t else s["kv_heads_full"] for t in sliding])
        w.add(f"{arch}.attention.key_length_swa", s["head_dim_swa"])
        w.add(f"{arch}.attention.value_length_swa", s["head_dim_swa"])
        w.add(f"{arch}.attention.sliding_window", s["window"])
        w.add(f"{arch}.attention.sliding_window_pattern", sliding)
        w.add(f"{arch}.attention.shared_kv_layers", s["shared"])
        w.add(f"{arch}.embedding_length_per_layer_input", s["per_layer"])
        w.add(f"{arch}.rope.freq_base_swa", 10000.0)
        w.add(f"{arch}.rope.dimension_count", s["head_dim"])
        w.add(f"{arch}.rope.dimension_count_swa", s["head_dim_swa"])
        w.add(f"{arch}.final_logit_softcapping", 30.0)
        if s.get("experts"):
            _moe_keys(w, arch, s)
        rot = s["head_dim"] // 8  # proportional rotary: a quarter of the full layers' dims turn
        w.add_tensor("rope_freqs.weight", np.array([1.0] * rot + [1e30] * (s["head_dim"] // 2 - rot), np.float32))
        _mat(w, rng, "token_embd.weight", Q6, (s["vocab"], h))  # tied: the output head's type
        w.add_tensor("output_norm.weight", np.ones(h, np.float32))
        if s["per_layer"]:
            _mat(w, rng, "per_layer_token_embd.weight", Q4, (s["vocab"], n * s["per_layer"]))
            _mat(w, rng, "per_layer_model_proj.weight", Q4, (n * s["per_layer"], h))
            w.add_tensor("per_layer_proj_norm.weight", np.ones(s["per_layer"], np.float32))
        first_shared = n - s["shared"]
        for i in range(n):
            p = f"blk.{i}."
            hd = s["head_dim_swa"] if sliding[i] else s["head_dim"]
            kv = s["kv_heads"] if sliding[i] else s["kv_heads_full"]
            _mat(w, rng, p + "attn_q.weight", Q4, (s["heads"] * hd, h))
            w.add_tensor(p + "attn_q_norm.weight", np.ones(hd, np.float32))
            if i < first_shared:
                _mat(w, rng, p + "attn_k.weight", Q4, (kv * hd, h))
                if sliding[i] or not s["k_eq_v"]:
                    _mat(w, rng, p + "attn_v.weight", Q6 if i % 2 == 0 else Q4, (kv * hd, h))
                w.add_tensor(p + "attn_k_norm.weight", np.ones(hd, np.float32))
            _mat(w, rng, p + "attn_output.weight", Q4, (h, s["heads"] * hd))
            for name, shape in (("ffn_gate", (s["ffn"], h)), ("ffn_up", (s["ffn"], h)), ("ffn_down", (h, s["ffn"]))):
                down = name == "ffn_down"
                _mat(w, rng, f"{p}{name}.weight", Q8 if down and s["ffn"] % 256 else Q6 if down and i % 2 == 0 else Q4,
                     shape)
            for norm in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
                w.add_tensor(f"{p}{norm}.weight", np.ones(h, np.float32))
            w.add_tensor(p + "layer_output_scale.weight", np.ones(1, np.float32))
            if s["per_layer"]:
                _mat(w, rng, p + "inp_gate.weight", Q4, (s["per_layer"], h))
                _mat(w, rng, p + "proj.weight", Q4, (h, s["per_layer"]))
                w.add_tensor(p + "post_norm.weight", np.ones(h, np.float32))
            if s.get("experts"):
                e, eff = s["experts"], s["expert_ffn"]
                w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((e, h)) * 0.02).astype(np.float32))
                w.add_tensor(p + "ffn_gate_inp.scale", np.ones(h, np.float32))
                w.add_tensor(p + "ffn_down_exps.scale", np.ones(e, np.float32))
                _mat(w, rng, p + "ffn_gate_up_exps.weight", Q4, (e, 2 * eff, h))
                _mat(w, rng, p + "ffn_down_exps.weight", Q8, (e, h, eff))  # 704 columns: not whole 256-blocks
                for norm in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
                    w.add_tensor(f"{p}{norm}.weight", np.ones(h, np.float32))


# Qwen3-Embedding-0.6B: Qwen3 layers, a tied head, last-token pooling, EOS appended (its Q8_0 file)
QWEN3_EMBEDDING_06B = dict(vocab=151669, hidden=1024, layers=28, heads=16, kv_heads=8, head_dim=128, ffn=3072,
                           ctx=32768)


def write_qwen3_embedding(path: str, s: dict = QWEN3_EMBEDDING_06B, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    h, hd, kv = s["hidden"], s["head_dim"], s["kv_heads"]
    with GGUFWriter(path) as w:
        _header(w, "qwen3", "synthetic Qwen3-Embedding-0.6B", s, file_type=7)  # MOSTLY_Q8_0
        w.add("qwen3.pooling_type", 3, V.UINT32)  # last token
        w.add("tokenizer.ggml.add_eos_token", True)
        _mat(w, rng, "token_embd.weight", Q8, (s["vocab"], h))
        w.add_tensor("output_norm.weight", np.ones(h, np.float32))
        for i in range(s["layers"]):
            for name, shape in (("attn_q", (s["heads"] * hd, h)), ("attn_k", (kv * hd, h)), ("attn_v", (kv * hd, h)),
                                ("attn_output", (h, s["heads"] * hd)), ("ffn_gate", (s["ffn"], h)),
                                ("ffn_up", (s["ffn"], h)), ("ffn_down", (h, s["ffn"]))):
                _mat(w, rng, f"blk.{i}.{name}.weight", Q8, shape)
            for norm, n in (("attn_norm", h), ("ffn_norm", h), ("attn_q_norm", hd), ("attn_k_norm", hd)):
                w.add_tensor(f"blk.{i}.{norm}.weight", np.ones(n, np.float32))


BERT_BASE = dict(vocab=30522, hidden=768, layers=12, heads=12, ffn=3072, ctx=512)


def write_bert(path: str, s: dict = BERT_BASE, seed: int = 0) -> None:
    """A BERT-base embedder (bge-base-en-v1.5's shape) as llama.cpp's converter writes one:
    Q8_0 matrices, F32 norms, biases and position table, mean pooling, a WordPiece
    vocabulary of letters (a word's first piece with ▁) and filler words."""
    rng = np.random.default_rng(seed)
    h, f = s["hidden"], s["ffn"]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + ["▁" + c for c in letters] + letters
    tokens += [f"▁w{i}" for i in range(s["vocab"] - len(tokens))]
    with GGUFWriter(path) as w:
        w.add("general.architecture", "bert")
        w.add("general.name", "synthetic BERT-base")
        w.add("general.file_type", 7)  # MOSTLY_Q8_0
        for key, value in {"context_length": s["ctx"], "embedding_length": h, "block_count": s["layers"],
                           "feed_forward_length": f, "attention.head_count": s["heads"]}.items():
            w.add(f"bert.{key}", value)
        w.add("bert.attention.layer_norm_epsilon", 1e-12)
        w.add("bert.attention.causal", False)
        w.add("bert.pooling_type", 1, V.UINT32)  # mean
        w.add("tokenizer.ggml.model", "bert")
        w.add("tokenizer.ggml.pre", "default")
        w.add("tokenizer.ggml.tokens", tokens, (V.ARRAY, V.STRING))
        w.add("tokenizer.ggml.token_type", [3] * 5 + [1] * (len(tokens) - 5), (V.ARRAY, V.INT32))
        w.add("tokenizer.ggml.token_type_count", 2)
        for key, i in (("bos", 2), ("eos", 3), ("unknown", 1), ("seperator", 3), ("padding", 0), ("mask", 4)):
            w.add(f"tokenizer.ggml.{key}_token_id", i)
        w.add("tokenizer.ggml.add_bos_token", True)
        w.add("tokenizer.ggml.add_eos_token", True)
        w.add("tokenizer.ggml.normalizer.lowercase", True)
        small = lambda name, *shape: w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))  # noqa: E731
        ones = lambda name, n: w.add_tensor(name, np.ones(n, np.float32))  # noqa: E731
        _mat(w, rng, "token_embd.weight", Q8, (s["vocab"], h))
        small("position_embd.weight", s["ctx"], h)
        small("token_types.weight", 2, h)
        ones("token_embd_norm.weight", h)
        small("token_embd_norm.bias", h)
        for i in range(s["layers"]):
            for name, shape in (("attn_q", (h, h)), ("attn_k", (h, h)), ("attn_v", (h, h)), ("attn_output", (h, h)),
                                ("ffn_up", (f, h)), ("ffn_down", (h, f))):
                _mat(w, rng, f"blk.{i}.{name}.weight", Q8, shape)
                small(f"blk.{i}.{name}.bias", shape[0])
            for norm in ("attn_output_norm", "layer_output_norm"):
                ones(f"blk.{i}.{norm}.weight", h)
                small(f"blk.{i}.{norm}.bias", h)


WRITERS = {"qwen3-4b": write_qwen3, "bert-base": write_bert, "qwen3-embedding-0.6b": write_qwen3_embedding, "qwen35-4b": write_qwen35, "qwen3-30b-a3b-12l": write_qwen3moe,
           "gpt-oss-20b-12l": write_gpt_oss, "gemma4-e4b": write_gemma4,
           "gemma4-26b-a4b-10l": lambda path: write_gemma4(path, GEMMA4_26B_A4B_10L)}


def write_qwen3_lora(path: str, s: dict = QWEN3_4B, rank: int = 16, seed: int = 0) -> None:
    """A LoRA adapter for the Qwen3-4B shape as convert_lora_to_gguf.py writes one (its
    default F16 tensors): every attention and feed-forward matrix, rank `rank`, alpha 2 x rank."""
    rng = np.random.default_rng(seed)
    h, hd = s["hidden"], s["head_dim"]
    shapes = {"attn_q": (s["heads"] * hd, h), "attn_k": (s["kv_heads"] * hd, h), "attn_v": (s["kv_heads"] * hd, h),
              "attn_output": (h, s["heads"] * hd), "ffn_gate": (s["ffn"], h), "ffn_up": (s["ffn"], h),
              "ffn_down": (h, s["ffn"])}
    with GGUFWriter(path) as w:
        w.add("general.architecture", "qwen3")
        w.add("general.type", "adapter")
        w.add("adapter.type", "lora")
        w.add("adapter.lora.alpha", float(2 * rank))
        for i in range(s["layers"]):
            for name, (out, cols) in shapes.items():
                a = rng.normal(0, 1 / np.sqrt(cols), (rank, cols)).astype(np.float16)
                b = rng.normal(0, 0.01, (out, rank)).astype(np.float16)
                w.add_tensor(f"blk.{i}.{name}.weight.lora_a", a, ggml_type=GGMLType.F16, shape=a.shape)
                w.add_tensor(f"blk.{i}.{name}.weight.lora_b", b, ggml_type=GGMLType.F16, shape=b.shape)


def write(path: str) -> None:  # the name earlier scripts import: the Qwen3-4B shape
    write_qwen3(path)


if __name__ == "__main__":
    WRITERS[sys.argv[1]](sys.argv[2])
