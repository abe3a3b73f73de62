"""Tiny random transformers models written as GGUF the way llama.cpp's converter writes
them (its key names, tensor names and transforms), with our own writer.

This is a test fixture, kept independent of the engine's architecture files: its
name tables and transforms are the converter's, so that a loader mistake shows up
as a mismatch instead of being mirrored."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, Gemma4ForCausalLM, Gemma4TextConfig, Glm4MoeConfig, Glm4MoeForCausalLM, GptOssConfig,
                          GptOssForCausalLM,
                          GraniteConfig, GraniteForCausalLM, GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM,
                          GraniteMoeSharedConfig, GraniteMoeSharedForCausalLM, LlamaConfig,
                          LlamaForCausalLM, Lfm2Config,
                          Lfm2ForCausalLM, Ministral3Config,
                          Ministral3ForCausalLM, Olmo2Config,
                          Olmo2ForCausalLM, Olmo3Config, Olmo3ForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM, Qwen3_5ForCausalLM,
                          Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig, Qwen3_5TextConfig, SmolLM3Config,
                          SmolLM3ForCausalLM)

from gguf_serve.gguf_io import GGMLType, GGUFWriter, dequantize, quantize

from tiny_metadata import VOCAB, write_metadata

HIDDEN = 256
FF = 512


# per-architecture: transformers names → llama.cpp names (the converter's tensor map)
LLAMA_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate": "ffn_gate_inp",
}
GEMMA3_NAMES = {**LLAMA_NAMES, "post_attention_layernorm": "post_attention_norm",
                "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"}
QWEN35_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
    "linear_attn.in_proj_qkv": "attn_qkv", "linear_attn.in_proj_z": "attn_gate", "linear_attn.in_proj_a": "ssm_alpha",
    "linear_attn.in_proj_b": "ssm_beta", "linear_attn.out_proj": "ssm_out", "linear_attn.conv1d": "ssm_conv1d",
    "linear_attn.norm": "ssm_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "mlp.gate": "ffn_gate_inp", "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp", "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
}
OLMO2_NAMES = {**LLAMA_NAMES, "post_attention_layernorm": "post_attention_norm",
               "post_feedforward_layernorm": "post_ffw_norm"}
GLM4MOE_NAMES = {**LLAMA_NAMES, "post_attention_layernorm": "post_attention_norm",
                 "mlp.gate.e_score_correction_bias": "exp_probs_b", "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
                 "mlp.shared_experts.up_proj": "ffn_up_shexp", "mlp.shared_experts.down_proj": "ffn_down_shexp"}
GRANITE_NAMES = {**LLAMA_NAMES, "block_sparse_moe.router": "ffn_gate_inp", "shared_mlp.output_linear": "ffn_down_shexp",
                 "mamba.in_proj": "ssm_in", "mamba.conv1d": "ssm_conv1d", "mamba.norm": "ssm_norm",
                 "mamba.out_proj": "ssm_out"}
LFM2_NAMES = {"operator_norm": "attn_norm", "ffn_norm": "ffn_norm", "self_attn.q_proj": "attn_q",
              "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.out_proj": "attn_output",
              "self_attn.q_layernorm": "attn_q_norm", "self_attn.k_layernorm": "attn_k_norm",
              "conv.in_proj": "shortconv.in_proj", "conv.out_proj": "shortconv.out_proj", "conv.conv": "shortconv.conv",
              "feed_forward.w1": "ffn_gate", "feed_forward.w3": "ffn_up", "feed_forward.w2": "ffn_down"}
GEMMA4_NAMES = {**GEMMA3_NAMES, "pre_feedforward_layernorm_2": "pre_ffw_norm_2",
                "post_feedforward_layernorm_1": "post_ffw_norm_1", "post_feedforward_layernorm_2": "post_ffw_norm_2",
                "router.proj": "ffn_gate_inp", "per_layer_input_gate": "inp_gate", "per_layer_projection": "proj",
                "post_per_layer_input_norm": "post_norm"}
GEMMA4_GLOBAL = {"model.embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
                 "model.per_layer_model_projection.weight": "per_layer_model_proj.weight",
                 "model.per_layer_projection_norm.weight": "per_layer_proj_norm.weight"}
GPT_OSS_NAMES = {**LLAMA_NAMES, "post_attention_layernorm": "post_attention_norm", "mlp.router": "ffn_gate_inp"}
PHI3_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
              "self_attn.qkv_proj": "attn_qkv", "self_attn.o_proj": "attn_output",
              "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


# per-layer parameters whose names do not end in .weight / .bias → the converter's names
UNSUFFIXED = {"mlp.gate.e_score_correction_bias": "exp_probs_b.bias", "router.scale": "ffn_gate_inp.scale",
              "router.per_expert_scale": "ffn_down_exps.scale", "layer_scalar": "layer_output_scale.weight",
              "mamba.A_log": "ssm_a", "mamba.D": "ssm_d",
              "mamba.dt_bias": "ssm_dt.bias", "linear_attn.A_log": "ssm_a", "linear_attn.dt_bias": "ssm_dt.bias"}


GEMMA3_FAMILY = ("gemma3", "gemma-embedding")  # the same layers and tensor transforms


@dataclass
class Spec:
    arch: str
    model_class: type
    config: object
    names: dict


def spec(arch: str) -> Spec:
    common = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FF, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
                  tie_word_embeddings=False, bos_token_id=VOCAB - 3, eos_token_id=VOCAB - 3)
    if arch == "llama":
        return Spec(arch, LlamaForCausalLM, LlamaConfig(**common, head_dim=64), LLAMA_NAMES)
    if arch == "qwen2":
        return Spec(arch, Qwen2ForCausalLM, Qwen2Config(**common), LLAMA_NAMES)
    if arch == "qwen3":  # head_dim deliberately not hidden/heads: the file's key_length must be read
        return Spec(arch, Qwen3ForCausalLM, Qwen3Config(**common, head_dim=96), LLAMA_NAMES)
    if arch == "qwen3moe":
        cfg = Qwen3MoeConfig(**common, head_dim=64, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=256,
                             decoder_sparse_step=1, norm_topk_prob=True, mlp_only_layers=[])
        return Spec(arch, Qwen3MoeForCausalLM, cfg, LLAMA_NAMES)
    if arch in ("qwen35", "qwen35moe"):
        linear = dict(layer_types=["linear_attention"] * 3 + ["full_attention"], linear_conv_kernel_dim=4,
                      linear_key_head_dim=32, linear_value_head_dim=32, linear_num_key_heads=2,
                      linear_num_value_heads=4, head_dim=64,
                      rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25,
                                       "mrope_section": [3, 3, 2]})
        c = dict(common, num_hidden_layers=4)
        if arch == "qwen35":
            return Spec(arch, Qwen3_5ForCausalLM, Qwen3_5TextConfig(**c, **linear), QWEN35_NAMES)
        cfg = Qwen3_5MoeTextConfig(**c, **linear, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=256,
                                   shared_expert_intermediate_size=256)
        return Spec(arch, Qwen3_5MoeForCausalLM, cfg, QWEN35_NAMES)
    if arch == "gemma-embedding":  # EmbeddingGemma: Gemma 3's layers, attending both ways
        c = dict(common, num_hidden_layers=7, num_key_value_heads=1, tie_word_embeddings=True)
        cfg = Gemma3TextConfig(**c, head_dim=64, sliding_window=8, query_pre_attn_scalar=64,
                               use_bidirectional_attention=True,
                               rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
        return Spec(arch, Gemma3ForCausalLM, cfg, GEMMA3_NAMES)
    if arch == "gemma3":
        c = dict(common, num_hidden_layers=7, num_key_value_heads=1, tie_word_embeddings=True)
        cfg = Gemma3TextConfig(**c, head_dim=64, sliding_window=8, query_pre_attn_scalar=64,
                               rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
        return Spec(arch, Gemma3ForCausalLM, cfg, GEMMA3_NAMES)
    if arch == "smollm3":  # four layers: the fourth has no rotary
        cfg = SmolLM3Config(**dict(common, num_hidden_layers=4), no_rope_layer_interval=4, pad_token_id=0)
        return Spec(arch, SmolLM3ForCausalLM, cfg, LLAMA_NAMES)
    if arch == "olmo2":
        return Spec(arch, Olmo2ForCausalLM, Olmo2Config(**common), OLMO2_NAMES)
    if arch == "olmo3":  # llama.cpp writes OLMo 3 as olmo2, with its sliding-window pattern
        cfg = Olmo3Config(**dict(common, num_hidden_layers=4), sliding_window=8, pad_token_id=0)
        return Spec("olmo2", Olmo3ForCausalLM, cfg, OLMO2_NAMES)
    if arch == "mistral3":  # YaRN, and a short original context so the attention temperature turns in
        rope = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0, "original_max_position_embeddings": 8,
                "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1}
        return Spec(arch, Ministral3ForCausalLM, Ministral3Config(**common, head_dim=64, rope_parameters=rope),
                    LLAMA_NAMES)
    if arch == "glm4moe":  # one dense layer, then sigmoid-routed experts with a shared one; partial NeoX rotary
        cfg = Glm4MoeConfig(**dict(common, num_hidden_layers=3), head_dim=64, attention_bias=True,
                            partial_rotary_factor=0.5, moe_intermediate_size=128, n_routed_experts=4,
                            num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                            routed_scaling_factor=2.5, n_group=1, topk_group=1, norm_topk_prob=True, num_mtp_layers=0,
                            rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5})
        return Spec(arch, Glm4MoeForCausalLM, cfg, GLM4MOE_NAMES)
    if arch == "granitehybrid":  # Mamba-2 layers (two groups) around one attention layer; experts + shared MLP
        cfg = GraniteMoeHybridConfig(**dict(common, intermediate_size=128, num_hidden_layers=4), num_local_experts=4,
                                     num_experts_per_tok=2,
                                     shared_intermediate_size=256,
                                     layer_types=["linear_attention", "linear_attention", "attention",
                                                  "linear_attention"], mamba_n_heads=8, mamba_n_groups=2,
                                     mamba_d_state=16, mamba_d_conv=4, embedding_multiplier=2.0,
                                     residual_multiplier=0.5, attention_multiplier=0.1, logits_scaling=3.0,
                                     pad_token_id=0)
        return Spec(arch, GraniteMoeHybridForCausalLM, cfg, GRANITE_NAMES)
    granite = dict(embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.1, logits_scaling=3.0)
    if arch == "granite":  # Granite 3.x dense: llama's layers with Granite's multipliers
        return Spec(arch, GraniteForCausalLM, GraniteConfig(**common, **granite, pad_token_id=0), LLAMA_NAMES)
    if arch == "granitemoe":  # Granite 3.x MoE Shared: routed experts and a shared MLP in every layer
        cfg = GraniteMoeSharedConfig(**dict(common, intermediate_size=128), **granite, num_local_experts=4,
                                     num_experts_per_tok=2, shared_intermediate_size=256, pad_token_id=0)
        return Spec(arch, GraniteMoeSharedForCausalLM, cfg, GRANITE_NAMES)
    if arch == "lfm2":  # convolution layers around one attention layer, as LFM2's pattern has them
        c = {k: v for k, v in common.items() if k != "rms_norm_eps"}
        cfg = Lfm2Config(**dict(c, num_hidden_layers=4, tie_word_embeddings=True), norm_eps=1e-6, conv_L_cache=3,
                         block_auto_adjust_ff_dim=False, layer_types=["conv", "conv", "full_attention", "conv"],
                         rope_parameters={"rope_type": "default", "rope_theta": 1e6})
        return Spec(arch, Lfm2ForCausalLM, cfg, LFM2_NAMES)
    if arch in ("gemma4", "gemma4moe"):  # E2B-like: per-layer embeddings, shared KV layers, keys as values in
        # the full layers; or (gemma4moe) 26B-A4B-like: experts beside the MLP, no per-layer embeddings
        moe = arch == "gemma4moe"
        layers = ["sliding_attention", "sliding_attention", "full_attention"] * 2
        c = dict(common, num_hidden_layers=6, num_key_value_heads=2, tie_word_embeddings=True, intermediate_size=256)
        cfg = Gemma4TextConfig(**c, head_dim=32, global_head_dim=64, sliding_window=8, layer_types=layers,
                               num_kv_shared_layers=0 if moe else 3, attention_k_eq_v=not moe,
                               num_global_key_value_heads=None if moe else 1,
                               hidden_size_per_layer_input=0 if moe else 32, vocab_size_per_layer_input=VOCAB,
                               use_double_wide_mlp=not moe, final_logit_softcapping=30.0,
                               enable_moe_block=moe, num_experts=4 if moe else None, top_k_experts=2 if moe else None,
                               moe_intermediate_size=64 if moe else None,
                               rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                                "full_attention": {"rope_type": "proportional", "rope_theta": 1e6,
                                                                   "partial_rotary_factor": 0.25}})
        cfg.allow_global_per_layer_attribute_access = True  # the writer reads the sliding layers' values as global
        return Spec("gemma4", Gemma4ForCausalLM, cfg, GEMMA4_NAMES)
    if arch == "gpt-oss":  # alternating window of 8 and full layers, YaRN (untruncated, as gpt-oss's), sinks
        rope = {"rope_type": "yarn", "rope_theta": 1.5e5, "factor": 8.0, "original_max_position_embeddings": 32,
                "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
        cfg = GptOssConfig(**dict(common, intermediate_size=128, num_hidden_layers=4), head_dim=64,
                           num_local_experts=4, num_experts_per_tok=2, sliding_window=8, attention_bias=True,
                           rope_parameters=rope, layer_types=["sliding_attention", "full_attention"] * 2,
                           pad_token_id=0)
        return Spec(arch, GptOssForCausalLM, cfg, GPT_OSS_NAMES)
    if arch == "phi3":
        return Spec(arch, Phi3ForCausalLM, Phi3Config(**dict(common, num_key_value_heads=4), pad_token_id=0), PHI3_NAMES)
    raise KeyError(arch)


def random_model(s: Spec, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    s.config._attn_implementation = "eager" if s.arch == "gpt-oss" else "sdpa"  # sdpa drops gpt-oss's sinks
    model = s.model_class(s.config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("sinks"):  # logits comparable to the scores, so that they matter
                p.copy_(torch.randn_like(p))
            elif s.arch == "gemma4" and ("q_norm" in name or "k_norm" in name):
                # Gemma 4 does not scale its queries: q/k norms of about 1 would make every softmax one-hot
                p.copy_(0.3 * (1.0 + 0.1 * torch.randn_like(p)))
            elif s.arch == "gemma4" and ("norm" in name or name.endswith(("router.scale", "per_expert_scale"))):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))  # Gemma 4's norms scale by w, not 1 + w
            elif "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p)) if s.arch not in GEMMA3_FAMILY else p.copy_(
                    0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.05 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # GLM-4.5's expert-choice bias (a buffer)
                b.copy_(0.1 * torch.randn_like(b))
            elif name.endswith("layer_scalar"):  # Gemma 4's per-layer output scale
                b.copy_(1.0 + 0.2 * torch.randn_like(b))
    return model


def _reorder_v(t: np.ndarray, axis: int, n_k: int, per_k: int, head_dim: int) -> np.ndarray:
    """llama.cpp's converter: V heads from grouped-by-K to tiled order along `axis`."""
    t = np.moveaxis(t, axis, 0)
    shape = t.shape
    t = t.reshape(n_k, per_k, head_dim, *shape[1:]).swapaxes(0, 1).reshape(shape)
    return np.ascontiguousarray(np.moveaxis(t, 0, axis))


def _qwen35_tensor(cfg, name: str, value: np.ndarray) -> np.ndarray:
    """The converter's transforms for one Qwen3.5 tensor (HF name, HF layout)."""
    # +1 on every RMSNorm but the gated one; the MTP block's are renamed (enorm, hnorm) before the rule applies
    if (name.endswith("norm.weight") or name.startswith("mtp.pre_fc_norm")) and "linear_attn.norm" not in name:
        value = value + 1.0
    if name.endswith("A_log"):
        value = -np.exp(value)
    if name.endswith("conv1d.weight"):
        value = value.squeeze(1)
    return _qwen35_reorder(cfg, name, value)


def _qwen35_undo_reorder(cfg, name: str, stored: np.ndarray) -> np.ndarray:
    """Back from the file's V-head order to transformers' (for the dense reference)."""
    rows = _qwen35_reorder(cfg, name, np.arange(stored.shape[0])[:, None] * np.ones((1, stored.shape[1]), np.int64))
    cols = _qwen35_reorder(cfg, name, np.ones((stored.shape[0], 1), np.int64) * np.arange(stored.shape[1])[None, :])
    out = np.empty_like(stored)
    out[rows, cols] = stored
    return out


def _qwen35_reorder(cfg, name: str, value: np.ndarray) -> np.ndarray:
    n_k, n_v = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    if "linear_attn." in name and n_k != n_v:
        per_k, hk, hv = n_v // n_k, cfg.linear_key_head_dim, cfg.linear_value_head_dim
        qk = 2 * n_k * hk
        if "in_proj_qkv" in name or "conv1d" in name:
            value = np.concatenate([value[:qk], _reorder_v(value[qk:], 0, n_k, per_k, hv)])
        elif "in_proj_z" in name:
            value = _reorder_v(value, 0, n_k, per_k, hv)
        elif "in_proj_a" in name or "in_proj_b" in name or "A_log" in name or "dt_bias" in name:
            value = _reorder_v(value, 0, n_k, per_k, 1)
        elif "out_proj" in name:
            value = _reorder_v(value, 1, n_k, per_k, hv)
    return value


# architectures whose q/k rows the converter permutes (LlamaModel and its subclasses)
PERMUTED = ("llama", "smollm3", "mistral3", "granitehybrid", "granite", "granitemoe")


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter: interleave each head's rotary halves (q, k rows)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _qtype(mix: str, name: str, cols: int, mxfp4: bool = False) -> GGMLType:
    """`mxfp4`: the K mix's experts in MXFP4, as gpt-oss files keep them."""
    if mix == "F32":
        return GGMLType.F32
    if mix == "F16":
        return GGMLType.F16
    if mix == "Q8_0":
        return GGMLType.Q8_0
    # a K-quant mix like Q4_K_M: most matrices Q4_K, ffn_down and v Q6_K, embedding Q8_0
    if mxfp4 and "_exps" in name:
        return GGMLType.MXFP4
    if cols % 256:
        return GGMLType.Q8_0
    if "token_embd" in name:
        return GGMLType.Q8_0
    if "ffn_down" in name or "attn_v" in name:
        return GGMLType.Q6_K
    if "attn_k" in name:
        return GGMLType.Q5_K
    return GGMLType.Q4_K


# the converter's names for Qwen3.5's multi-token-prediction block (conversion/qwen.py, _QwenMtpMixin)
MTP_NAMES = {"mtp.fc.weight": "nextn.eh_proj.weight", "mtp.pre_fc_norm_embedding.weight": "nextn.enorm.weight",
             "mtp.pre_fc_norm_hidden.weight": "nextn.hnorm.weight", "mtp.norm.weight": "nextn.shared_head_norm.weight"}


def mtp_weights(cfg, seed: int = 1) -> dict[str, np.ndarray]:
    """A random multi-token-prediction block for a Qwen3.5 config, as a checkpoint holds it
    (`mtp.*`, transformers' layout): the fc over [embedding, hidden], its norms and one
    full-attention decoder layer with a dense MLP."""
    g = torch.Generator().manual_seed(seed)
    h, ff, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    shapes = {"mtp.fc.weight": (h, 2 * h), "mtp.pre_fc_norm_embedding.weight": (h,),
              "mtp.pre_fc_norm_hidden.weight": (h,), "mtp.norm.weight": (h,),
              "mtp.layers.0.input_layernorm.weight": (h,), "mtp.layers.0.post_attention_layernorm.weight": (h,),
              "mtp.layers.0.self_attn.q_proj.weight": (2 * nh * hd, h), "mtp.layers.0.self_attn.k_proj.weight": (nkv * hd, h),
              "mtp.layers.0.self_attn.v_proj.weight": (nkv * hd, h), "mtp.layers.0.self_attn.o_proj.weight": (h, nh * hd),
              "mtp.layers.0.self_attn.q_norm.weight": (hd,), "mtp.layers.0.self_attn.k_norm.weight": (hd,),
              "mtp.layers.0.mlp.gate_proj.weight": (ff, h), "mtp.layers.0.mlp.up_proj.weight": (ff, h),
              "mtp.layers.0.mlp.down_proj.weight": (h, ff)}
    out = {}
    for name, shape in shapes.items():
        if len(shape) == 1:  # Qwen3.5's norms scale by 1 + w
            out[name] = (0.1 * torch.randn(shape, generator=g)).numpy()
        else:
            out[name] = (torch.randn(shape, generator=g) / shape[-1] ** 0.5).numpy()
    return out


def _write_halves(w, mix: str, hf_name: str, value: np.ndarray, parts: tuple[str, str], axis: int) -> torch.Tensor:
    """A fused gate+up tensor written as the converter's two tensors (`parts`, halves along
    `axis`); returns what the file holds, dequantized and fused again."""
    layer = hf_name.split(".")[2]
    backs = []
    for part, stored in zip(parts, np.split(value, 2, axis=axis)):
        qt = _qtype(mix, part, stored.shape[-1])
        packed = quantize(np.ascontiguousarray(stored), qt)
        w.add_tensor(f"blk.{layer}.{part}.weight", packed, ggml_type=qt, shape=stored.shape)
        backs.append(dequantize(packed, qt, stored.shape))
    return torch.from_numpy(np.concatenate(backs, axis=axis))


def _gpt_oss_experts(w, mix: str, hf_name: str, value: np.ndarray, new_state: dict) -> bool:
    """conversion/gpt_oss.py for an unquantized checkpoint: gate_up_proj (E, H, 2I) holds
    gate and up interleaved along its last axis and transposed; down_proj (E, I, H) is
    transposed; their biases are split the same way. False for any other tensor."""
    layer = hf_name.split(".")[2] if hf_name.startswith("model.layers.") else None
    p = f"blk.{layer}."

    def put(name: str, stored: np.ndarray) -> np.ndarray:
        stored = np.ascontiguousarray(stored)
        if name.endswith(".bias"):
            w.add_tensor(p + name, stored.astype(np.float32))
            return stored
        qt = _qtype(mix, name, stored.shape[-1], mxfp4=True)
        packed = quantize(stored, qt)
        w.add_tensor(p + name, packed, ggml_type=qt, shape=stored.shape)
        return dequantize(packed, qt, stored.shape)

    if hf_name.endswith("mlp.experts.gate_up_proj"):
        t = value.swapaxes(-1, -2)
        back = np.empty_like(t)
        back[:, 0::2], back[:, 1::2] = put("ffn_gate_exps.weight", t[:, 0::2]), put("ffn_up_exps.weight", t[:, 1::2])
        new_state[hf_name] = torch.from_numpy(np.ascontiguousarray(back.swapaxes(-1, -2)))
    elif hf_name.endswith("mlp.experts.gate_up_proj_bias"):
        put("ffn_gate_exps.bias", value[..., 0::2]), put("ffn_up_exps.bias", value[..., 1::2])
        new_state[hf_name] = torch.from_numpy(value.copy())
    elif hf_name.endswith("mlp.experts.down_proj"):
        back = put("ffn_down_exps.weight", value.swapaxes(-1, -2))
        new_state[hf_name] = torch.from_numpy(np.ascontiguousarray(back.swapaxes(-1, -2)))
    elif hf_name.endswith("mlp.experts.down_proj_bias"):
        put("ffn_down_exps.bias", value)
        new_state[hf_name] = torch.from_numpy(value.copy())
    elif hf_name.endswith("self_attn.sinks"):
        w.add_tensor(p + "attn_sinks.weight", value.astype(np.float32))
        new_state[hf_name] = torch.from_numpy(value.copy())
    else:
        return False
    return True


def write_gguf(s: Spec, model: torch.nn.Module, path, mix: str, *, think: bool = False,
               chat_template: str | None = None, mtp: dict[str, np.ndarray] | None = None,
               extra_tokens: tuple[str, ...] = (), pre: str = "qwen2", probes: bool = False,
               meta: dict | None = None, extra: dict[str, np.ndarray] | None = None) -> torch.nn.Module:
    """Write `model` as llama.cpp would, with matrices in `mix`; returns the dense
    transformers model carrying exactly the dequantized weights the file holds.

    `mtp` (Qwen3.5: `mtp_weights()`) adds a multi-token-prediction block as the converter
    keeps it by default: one more block counted in block_count, `nextn_predict_layers` 1,
    its tensors `blk.N.nextn.*` and `blk.N.*` at N = the trunk's layers. The dense model
    then carries `mtp`: the block's weights as the file holds them, dequantized, in
    transformers' layout and convention."""
    cfg = s.config
    arch = s.arch
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    n_trunk = cfg.num_hidden_layers
    if mtp:
        state.update(mtp)
    dense = s.model_class(cfg).eval()
    new_state = {}
    with GGUFWriter(path) as w:
        write_metadata(w, s, mtp=bool(mtp), think=think, chat_template=chat_template, extra_tokens=extra_tokens,
                       pre=pre, probes=probes, meta=meta)
        extras = {}
        for name, value in (extra or {}).items():  # more matrices (EmbeddingGemma's dense_2 / dense_3)
            qt = _qtype(mix, name, value.shape[1])
            packed = quantize(value, qt)
            w.add_tensor(name, packed, ggml_type=qt, shape=value.shape)
            extras[name] = torch.from_numpy(dequantize(packed, qt, value.shape))
        for hf_name, value in state.items():
            if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
                continue
            if hf_name.endswith("rotary_emb.inv_freq"):
                continue
            if arch == "gpt-oss" and _gpt_oss_experts(w, mix, hf_name, value, new_state):
                continue
            if (hf_name.endswith("mlp.experts.gate_up_proj") and arch == "qwen35moe") or (
                    hf_name.endswith("experts.gate_up_proj") and arch == "gemma4"):
                layer = hf_name.split(".")[2]  # this converter keeps the experts' gate and up fused
                qt = _qtype(mix, "ffn_gate_up_exps", value.shape[-1])
                packed = quantize(value, qt)
                w.add_tensor(f"blk.{layer}.ffn_gate_up_exps.weight", packed, ggml_type=qt, shape=value.shape)
                new_state[hf_name] = torch.from_numpy(dequantize(packed, qt, value.shape))
                continue
            if arch in ("granitehybrid", "granitemoe") and hf_name.endswith("shared_mlp.input_linear.weight"):
                # the converter splits the shared MLP's gate and up
                new_state[hf_name] = _write_halves(w, mix, hf_name, value, ("ffn_gate_shexp", "ffn_up_shexp"), 0)
                continue
            if hf_name.endswith("experts.gate_up_proj"):  # (E, 2I, H) → the converter's two (E, I, H) tensors
                new_state[hf_name] = _write_halves(w, mix, hf_name, value, ("ffn_gate_exps", "ffn_up_exps"), 1)
                continue
            if hf_name.endswith("experts.down_proj"):
                layer = hf_name.split(".")[2]
                qt = _qtype(mix, "ffn_down_exps", value.shape[-1])
                packed = quantize(value, qt)
                w.add_tensor(f"blk.{layer}.ffn_down_exps.weight", packed, ggml_type=qt, shape=value.shape)
                new_state[hf_name] = torch.from_numpy(dequantize(packed, qt, value.shape))
                continue
            if hf_name == "model.embed_tokens.weight":
                gname = "token_embd.weight"
            elif hf_name == "model.norm.weight":
                gname = "output_norm.weight"
            elif hf_name == "model.embedding_norm.weight":  # LFM2's final norm
                gname = "token_embd_norm.weight"
            elif hf_name in GEMMA4_GLOBAL:
                gname = GEMMA4_GLOBAL[hf_name]
            elif hf_name == "lm_head.weight":
                gname = "output.weight"
            elif (suffix := next((k for k in UNSUFFIXED if hf_name.endswith(k)), None)) is not None:
                gname = f"blk.{hf_name.split('.')[2]}.{UNSUFFIXED[suffix]}"
            elif hf_name in MTP_NAMES:
                gname = f"blk.{n_trunk}.{MTP_NAMES[hf_name]}"
            elif hf_name.startswith("mtp.layers.0."):
                module, kind = hf_name[len("mtp.layers.0."):].rsplit(".", 1)
                gname = f"blk.{n_trunk}.{s.names[module]}.{kind}"
            else:
                parts = hf_name.split(".")
                layer, module, kind = parts[2], ".".join(parts[3:-1]), parts[-1]
                gname = f"blk.{layer}.{s.names[module]}.{kind}"
            stored = value
            if arch in PERMUTED and ("attn_q." in gname or "attn_k." in gname):
                heads = cfg.num_attention_heads if "attn_q." in gname else cfg.num_key_value_heads
                stored = _permute(value, heads)
            if gname.endswith("shortconv.conv.weight"):
                stored = value.squeeze(1)  # (hidden, 1, taps) -> (hidden, taps)
            if arch in GEMMA3_FAMILY and gname.endswith("norm.weight"):
                stored = value + 1.0
            if arch in ("qwen35", "qwen35moe"):
                stored = _qwen35_tensor(cfg, hf_name, value)
                if gname.endswith("ffn_gate_inp_shexp.weight"):
                    stored = stored.reshape(-1)  # a one-row gate, stored as a vector
            if arch == "granitehybrid":  # conversion/mamba.py Mamba2Model.modify_tensors
                if gname.endswith("ssm_conv1d.weight"):
                    stored = value.squeeze(1)
                elif gname.endswith(("ssm_a", "ssm_d")):
                    a = -torch.exp(torch.from_numpy(value)).numpy()  # torch's exp, as the converter's
                    stored = (a if gname.endswith("ssm_a") else value).reshape(-1, 1)
                elif gname.endswith("ssm_norm.weight"):
                    stored = value.reshape(cfg.mamba_n_groups, -1)
            if (stored.ndim == 2 and gname.endswith(".weight")
                    and not gname.endswith(("ffn_gate_inp.weight", "ssm_conv1d.weight", "shortconv.conv.weight",
                                            "ssm_norm.weight"))):
                # routers, convs, what is not a .weight and what was a vector before its reshape stay F32
                qt = _qtype(mix, gname, stored.shape[1])
                packed = quantize(stored, qt)
                w.add_tensor(gname, packed, ggml_type=qt, shape=stored.shape)
                back = dequantize(packed, qt, stored.shape)
                if arch in PERMUTED and ("attn_q." in gname or "attn_k." in gname):
                    heads = cfg.num_attention_heads if "attn_q." in gname else cfg.num_key_value_heads
                    hd = back.shape[0] // heads
                    back = back.reshape(heads, hd // 2, 2, -1).swapaxes(1, 2).reshape(back.shape)
                if arch in ("qwen35", "qwen35moe"):
                    back = _qwen35_undo_reorder(cfg, hf_name, back)
                new_state[hf_name] = torch.from_numpy(np.ascontiguousarray(back.reshape(value.shape)))
            else:
                w.add_tensor(gname, stored.astype(np.float32))
                new_state[hf_name] = torch.from_numpy(value.copy())
    if cfg.tie_word_embeddings:
        new_state["lm_head.weight"] = new_state["model.embed_tokens.weight"]
    dense.mtp = {k: new_state.pop(k) for k in list(new_state) if k.startswith("mtp.")}
    dense.load_state_dict(new_state, strict=False)
    dense.extras = extras  # the extra matrices as the file holds them
    return dense


HARMONY_TOKENS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")


def tiny_chat_model(folder, name: str, seed: int, chat_template: str, think: bool = False,
                    arch: str = "qwen3", extra_tokens: tuple[str, ...] = ()) -> str:
    """A tiny random chat model (Qwen3-shaped by default) at folder/name (Q8_0) with this
    template (`extra_tokens`: more special tokens, such as HARMONY_TOKENS for gpt-oss)."""
    s = spec(arch)
    path = folder / name
    write_gguf(s, random_model(s, seed=seed), path, "Q8_0", think=think, chat_template=chat_template,
               extra_tokens=extra_tokens)
    return str(path)


YES_NO = (100, 101)  # the tiny rerankers' "yes" and "no" token ids
RERANK_TEMPLATE = "<|im_start|>user\n<Query>: {query}\n<Document>: {document}<|im_end|>\n<|im_start|>assistant\n"


def tiny_embedding_model(folder, name: str, kind: str, mix: str = "F32", seed: int = 0):
    """A tiny embedding or reranking file as llama.cpp's converter writes them, and its dense
    transformers model (the reference). `kind`: "qwen3-embedding" (last-token pooling, EOS
    appended), "embeddinggemma" (gemma-embedding: both ways, mean pooling, dense_2 and
    dense_3 in `dense.extras`), "qwen3-reranker" (rank pooling, cls.output = the head's
    yes/no rows, the "rerank" template)."""
    rng = np.random.default_rng(seed)
    path = folder / name
    if kind == "embeddinggemma":
        s = spec("gemma-embedding")
        h = s.config.hidden_size
        extra = {"dense_2.weight": (rng.standard_normal((2 * h, h)) / h ** 0.5).astype(np.float32),
                 "dense_3.weight": (rng.standard_normal((h, 2 * h)) / (2 * h) ** 0.5).astype(np.float32)}
        meta = {"{arch}.pooling_type": 1, "{arch}.dense_2_feat_in": h, "{arch}.dense_2_feat_out": 2 * h,
                "{arch}.dense_3_feat_in": 2 * h, "{arch}.dense_3_feat_out": h}
        return str(path), write_gguf(s, random_model(s, seed), path, mix, meta=meta, extra=extra)
    s = spec("qwen3")
    model = random_model(s, seed)
    if kind == "qwen3-embedding":
        meta = {"{arch}.pooling_type": 3, "tokenizer.ggml.add_eos_token": True}
        return str(path), write_gguf(s, model, path, mix, meta=meta)
    assert kind == "qwen3-reranker"
    head = model.lm_head.weight.detach().float().numpy()
    extra = {"cls.output.weight": np.ascontiguousarray(head[list(YES_NO)])}
    meta = {"{arch}.pooling_type": 4, "{arch}.classifier.output_labels": ["yes", "no"],
            "tokenizer.chat_templates": ["rerank"], "tokenizer.chat_template.rerank": RERANK_TEMPLATE}
    return str(path), write_gguf(s, model, path, mix, meta=meta, extra=extra)
