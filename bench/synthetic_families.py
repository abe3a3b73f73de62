"""Synthetic GGUF files of the architectures issue 45 added (bench/synthetic.py's way: real
shapes, Q4_K_M-like mixes, random blocks, its byte-level vocabulary and template):

- qwen3vl-8b: Qwen3-VL-8B's language model (36 layers, hidden 4096, ffn 12288, 32 / 8 heads
  x 128, rotary sections [24, 20, 20], three deepstack layers named), text only.
- deepseek-v2-lite: DeepSeek-V2-Lite (27 layers, hidden 2048, 16 heads of MLA: kv_lora_rank
  512, rotary 64 of 192-dim keys, 128-dim values, one q matrix; a dense first layer of
  10944, then 64 experts of 1408, 6 used, 2 shared; YaRN x40 over 4096; a 102,400-token
  vocabulary), the matrices whose rows are not whole 256-blocks (the experts' down, the
  dense down, attn_k_b) in Q8_0 as llama-quantize falls back.
- qwen3next-80b-a3b-8l: Qwen3-Next-80B-A3B cut to 8 of its 48 layers (hidden 2048; Gated
  DeltaNet with 16 key and 32 value heads x 128 in its grouped order and fused beta/alpha,
  gated attention every fourth layer with 16 / 2 heads x 256; 512 experts of 512, 10 used,
  and a gated shared expert of 512).
- nemotron-h-8b-8l: Nemotron-H-8B cut to 8 of its 52 layers in its order (M-M-M*-M: Mamba-2
  with 128 heads x 64 in 8 groups of state 128, one attention layer of 32 / 8 heads x 128,
  relu-squared MLPs of 21504; a 131,072-token vocabulary).

    python bench/synthetic_families.py NAME OUT.gguf
"""

from __future__ import annotations

import sys

import numpy as np

from gguf_serve.gguf_io import GGUFValueType as V, GGUFWriter
from synthetic import Q4, Q6, Q8, _attention, _delta_net, _embedding_and_head, _header, _mat, _mlp, _moe_keys


NEMOTRON_H_8B_8L = dict(vocab=131072, hidden=4096, layers=8, heads=32, kv_heads=None, head_dim=128, ffn=None,
                        ctx=8192, pattern="M-M-M*-M", mlp=21504, ssm_heads=128, ssm_head_dim=64, groups=8, state=128)


def write_nemotron_h(path: str, s: dict = NEMOTRON_H_8B_8L, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    arch, h, pat = "nemotron_h", s["hidden"], s["pattern"]
    inner = s["ssm_heads"] * s["ssm_head_dim"]
    conv_dim = inner + 2 * s["groups"] * s["state"]
    with GGUFWriter(path) as w:
        _header(w, arch, "synthetic Nemotron-H-8B, 8 of 52 layers", s)
        w.add(f"{arch}.attention.layer_norm_epsilon", 1e-5)
        w.add(f"{arch}.feed_forward_length", [s["mlp"] if c == "-" else 0 for c in pat], (V.ARRAY, V.INT32))
        w.add(f"{arch}.attention.head_count_kv", [8 if c == "*" else 0 for c in pat], (V.ARRAY, V.INT32))
        for key, value in {"ssm.conv_kernel": 4, "ssm.state_size": s["state"], "ssm.group_count": s["groups"],
                           "ssm.inner_size": inner, "ssm.time_step_rank": s["ssm_heads"],
                           "rope.dimension_count": s["head_dim"]}.items():
            w.add(f"{arch}.{key}", value)
        _embedding_and_head(w, rng, s, Q4, Q6)
        for i, kind in enumerate(pat):
            p = f"blk.{i}."
            w.add_tensor(p + "attn_norm.weight", np.ones(h, np.float32))
            if kind == "*":  # no q/k norms
                hd = s["head_dim"]
                _mat(w, rng, p + "attn_q.weight", Q4, (s["heads"] * hd, h))
                _mat(w, rng, p + "attn_k.weight", Q4, (8 * hd, h))
                _mat(w, rng, p + "attn_v.weight", Q6, (8 * hd, h))
                _mat(w, rng, p + "attn_output.weight", Q4, (h, s["heads"] * hd))
            elif kind == "-":
                _mat(w, rng, p + "ffn_up.weight", Q4, (s["mlp"], h))
                _mat(w, rng, p + "ffn_down.weight", Q6, (h, s["mlp"]))
            else:
                _mat(w, rng, p + "ssm_in.weight", Q4, (inner + conv_dim + s["ssm_heads"], h))
                _mat(w, rng, p + "ssm_out.weight", Q6, (h, inner))
                w.add_tensor(p + "ssm_conv1d.weight", (rng.standard_normal((conv_dim, 4)) * 0.1).astype(np.float32))
                w.add_tensor(p + "ssm_conv1d.bias", np.zeros(conv_dim, np.float32))
                w.add_tensor(p + "ssm_dt.bias", np.zeros(s["ssm_heads"], np.float32))
                w.add_tensor(p + "ssm_a", -np.ones((s["ssm_heads"], 1), np.float32))
                w.add_tensor(p + "ssm_d", np.ones((s["ssm_heads"], 1), np.float32))
                w.add_tensor(p + "ssm_norm.weight", np.ones((s["groups"], inner // s["groups"]), np.float32))


QWEN3VL_8B = dict(vocab=151936, hidden=4096, layers=36, heads=32, kv_heads=8, head_dim=128, ffn=12288, ctx=262144,
                  rope_base=5000000.0)


def write_qwen3vl(path: str, s: dict = QWEN3VL_8B, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    with GGUFWriter(path) as w:
        _header(w, "qwen3vl", "synthetic Qwen3-VL-8B (text)", s)
        w.add("qwen3vl.rope.dimension_sections", [24, 20, 20, 0], (V.ARRAY, V.INT32))
        w.add("qwen3vl.n_deepstack_layers", 3)
        _embedding_and_head(w, rng, s, Q4, Q6)
        for i in range(s["layers"]):
            _attention(w, rng, i, s, s["heads"] * s["head_dim"])
            _mlp(w, rng, i, s)
            for norm in ("attn_norm", "ffn_norm"):
                w.add_tensor(f"blk.{i}.{norm}.weight", np.ones(s["hidden"], np.float32))


DEEPSEEK_V2_LITE = dict(vocab=102400, hidden=2048, layers=27, heads=16, kv_heads=1, head_dim=None, ffn=10944,
                        ctx=163840, rope_base=10000.0, kv_lora=512, rope_dims=64, nope=128, v_head=128, experts=64,
                        used=6, shared=2, expert_ffn=1408)


def write_deepseek2(path: str, s: dict = DEEPSEEK_V2_LITE, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    arch, h, nh, r, rd = "deepseek2", s["hidden"], s["heads"], s["kv_lora"], s["rope_dims"]
    k_head, e, eff = s["nope"] + rd, s["experts"], s["expert_ffn"]
    with GGUFWriter(path) as w:
        _header(w, arch, "synthetic DeepSeek-V2-Lite", s)
        for key, value in {"attention.key_length": r + rd, "attention.value_length": r, "attention.kv_lora_rank": r,
                           "attention.key_length_mla": k_head, "attention.value_length_mla": s["v_head"],
                           "rope.dimension_count": rd, "leading_dense_block_count": 1, "expert_shared_count": s["shared"],
                           "expert_weights_scale": 1.0, "expert_gating_func": 1, "vocab_size": s["vocab"],
                           "rope.scaling.factor": 40.0, "rope.scaling.original_context_length": 4096,
                           "rope.scaling.yarn_log_multiplier": 0.0707}.items():
            w.add(f"{arch}.{key}", value)
        w.add(f"{arch}.rope.scaling.type", "yarn")
        _moe_keys(w, arch, s)
        _embedding_and_head(w, rng, s, Q4, Q6)
        for i in range(s["layers"]):
            p = f"blk.{i}."
            _mat(w, rng, p + "attn_q.weight", Q4, (nh * k_head, h))
            _mat(w, rng, p + "attn_kv_a_mqa.weight", Q4, (r + rd, h))
            _mat(w, rng, p + "attn_k_b.weight", Q8, (nh, r, s["nope"]))
            _mat(w, rng, p + "attn_v_b.weight", Q4, (nh, s["v_head"], r))
            _mat(w, rng, p + "attn_output.weight", Q4, (h, nh * s["v_head"]))
            w.add_tensor(p + "attn_kv_a_norm.weight", np.ones(r, np.float32))
            if i == 0:
                _mat(w, rng, p + "ffn_gate.weight", Q4, (s["ffn"], h))
                _mat(w, rng, p + "ffn_up.weight", Q4, (s["ffn"], h))
                _mat(w, rng, p + "ffn_down.weight", Q8, (h, s["ffn"]))
            else:
                w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((e, h)) * 0.02).astype(np.float32))
                _mat(w, rng, p + "ffn_gate_exps.weight", Q4, (e, eff, h))
                _mat(w, rng, p + "ffn_up_exps.weight", Q4, (e, eff, h))
                _mat(w, rng, p + "ffn_down_exps.weight", Q8, (e, h, eff))
                _mat(w, rng, p + "ffn_gate_shexp.weight", Q4, (s["shared"] * eff, h))
                _mat(w, rng, p + "ffn_up_shexp.weight", Q4, (s["shared"] * eff, h))
                _mat(w, rng, p + "ffn_down_shexp.weight", Q6, (h, s["shared"] * eff))
            for norm in ("attn_norm", "ffn_norm"):
                w.add_tensor(f"{p}{norm}.weight", np.ones(h, np.float32))


QWEN3NEXT_8L = dict(vocab=151936, hidden=2048, layers=8, heads=16, kv_heads=2, head_dim=256, ffn=5120, ctx=262144,
                    rope_base=10000000.0, k_heads=16, v_heads=32, ssm_dim=128, conv=4, interval=4, experts=512,
                    used=10, expert_ffn=512)


def write_qwen3next(path: str, s: dict = QWEN3NEXT_8L, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    arch, h, e, eff = "qwen3next", s["hidden"], s["experts"], s["expert_ffn"]
    value_dim = s["v_heads"] * s["ssm_dim"]
    with GGUFWriter(path) as w:
        _header(w, arch, "synthetic Qwen3-Next-80B-A3B, 8 of 48 layers", s)
        _moe_keys(w, arch, s)
        w.add(f"{arch}.expert_shared_feed_forward_length", eff)
        for key, value in {"ssm.conv_kernel": s["conv"], "ssm.state_size": s["ssm_dim"], "ssm.group_count": s["k_heads"],
                           "ssm.time_step_rank": s["v_heads"], "ssm.inner_size": value_dim,
                           "full_attention_interval": s["interval"], "rope.dimension_count": 64}.items():
            w.add(f"{arch}.{key}", value)
        _embedding_and_head(w, rng, s, Q4, Q6)
        for i in range(s["layers"]):
            p = f"blk.{i}."
            if (i + 1) % s["interval"] == 0:
                _attention(w, rng, i, s, 2 * s["heads"] * s["head_dim"])  # query and gate per head
            else:
                _delta_net(w, rng, i, s, fused_ba=True)
            w.add_tensor(p + "ffn_gate_inp.weight", (rng.standard_normal((e, h)) * 0.02).astype(np.float32))
            _mat(w, rng, p + "ffn_gate_exps.weight", Q4, (e, eff, h))
            _mat(w, rng, p + "ffn_up_exps.weight", Q4, (e, eff, h))
            _mat(w, rng, p + "ffn_down_exps.weight", Q6 if i % 2 == 0 else Q4, (e, h, eff))
            w.add_tensor(p + "ffn_gate_inp_shexp.weight", (rng.standard_normal((1, h)) * 0.02).astype(np.float32))
            _mat(w, rng, p + "ffn_gate_shexp.weight", Q4, (eff, h))
            _mat(w, rng, p + "ffn_up_shexp.weight", Q4, (eff, h))
            _mat(w, rng, p + "ffn_down_shexp.weight", Q6, (h, eff))
            for norm in ("attn_norm", "post_attention_norm"):
                w.add_tensor(f"{p}{norm}.weight", np.ones(h, np.float32))


WRITERS = {"qwen3vl-8b": write_qwen3vl, "deepseek-v2-lite": write_deepseek2, "qwen3next-80b-a3b-8l": write_qwen3next,
           "nemotron-h-8b-8l": write_nemotron_h}

if __name__ == "__main__":
    WRITERS[sys.argv[1]](sys.argv[2])
