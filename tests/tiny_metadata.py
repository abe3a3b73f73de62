"""The metadata llama.cpp's converter writes for the tiny test models: the byte-level
BPE vocabulary, and each architecture's hyperparameter keys (conversion/*.py's
set_gguf_parameters) as our writer writes them. A test fixture (tests/tiny_models.py
writes the tensors)."""

from __future__ import annotations

import numpy as np

VOCAB = 320


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable character map."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = keep[:]
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(keep, chars)}


# merges that cross the places pre-tokenizers split differently (digit runs, a space before
# digits, a case change inside a word, a contraction, '/' before a newline, a Devanagari
# letter before its virama mark), and words in the vocabulary that no merge makes (taken
# whole only where llama.cpp ignores merges)
def _probe_words(b2u: dict[int, str]) -> list[str]:
    return ["12", "123", "1234", "Ġ1", "Ġ12", "oW", "n'", "/" + b2u[10], b2u[0xB8] + b2u[0xE0]]


PROBE_WHOLE = ["Ġworld", "Ġdog"]


def byte_level_vocab(n_vocab: int = VOCAB, think: bool = False, extra: tuple[str, ...] = (),
                     probes: bool = False) -> tuple[list[str], list[str], list[int]]:
    """A byte-level BPE vocabulary: 256 bytes, merges of frequent English pairs, specials
    (with `think`, also Qwen3's user-defined <think> and </think> tokens; `extra`: more
    special tokens, such as a vision model's image tokens, before the last three;
    `probes`: merges and whole words that tell pre-tokenizers apart)."""
    b2u = bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    merges = []
    words = ["Ġt", "he", "Ġa", "in", "er", "on", "Ġthe", "re", "at", "en", "Ġs", "or", "it", "is", "Ġw", "an",
             "ed", "Ġo", "es", "ing", "Ġc", "ou", "nd", "Ġf", "Ġb", "ar", "Ġp", "al", "Ġm", "Ġin", "le", "Ġd",
             "ic", "Ġof", "Ġh", "as", "ion", "Ġand", "Ġto", "om", "Ġl", "ent", "Ġis", "ro", "Ġth", "st", "Ġn",
             "Ġre", "ve", "ct", "ly", "Ġe", "ow", "ad", "id", "Ġg", "Ġbe", "ut", "ot", "im"]
    if probes:
        words = _probe_words(b2u) + words
    for w in words:
        for k in range(len(w) - 1, 0, -1):
            a, b = w[:k], w[k:]
            if a in tokens and b in tokens and w not in tokens:
                merges.append(f"{a} {b}")
                tokens.append(w)
                break
    if probes:
        tokens += PROBE_WHOLE
    specials = list(extra) + ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    users = ["<think>", "</think>"] if think else []
    room = n_vocab - len(specials) - len(users)
    while len(tokens) > room:  # drop the last merges to make room for the added tokens
        merges.pop()
        tokens.pop()
    while len(tokens) < n_vocab - len(specials) - len(users):
        tokens.append(f"[unused{len(tokens)}]")
    tokens += users + specials
    types = [1] * (n_vocab - len(specials) - len(users)) + [4] * len(users) + [3] * len(specials)
    return tokens, merges, types


def write_metadata(w, s, *, mtp: bool = False, think: bool = False, chat_template: str | None = None,
                   extra_tokens: tuple[str, ...] = (), pre: str = "qwen2", probes: bool = False,
                   meta: dict | None = None) -> None:
    """Write the keys of `s` (a tiny_models.Spec) into the GGUFWriter `w`, as the converter
    writes them for its architecture: hyperparameters, rotary and sliding-window keys, the
    vocabulary and the chat template; `meta`: more keys, as a converter option writes them."""
    cfg = s.config
    arch = s.arch
    n_trunk = cfg.num_hidden_layers
    tokens, merges, types = byte_level_vocab(cfg.vocab_size, think=think, extra=extra_tokens, probes=probes)
    w.add("general.architecture", arch)
    if arch in ("qwen35", "qwen35moe"):
        w.add(f"{arch}.ssm.conv_kernel", cfg.linear_conv_kernel_dim)
        w.add(f"{arch}.ssm.state_size", cfg.linear_key_head_dim)
        w.add(f"{arch}.ssm.group_count", cfg.linear_num_key_heads)
        w.add(f"{arch}.ssm.time_step_rank", cfg.linear_num_value_heads)
        w.add(f"{arch}.ssm.inner_size", cfg.linear_value_head_dim * cfg.linear_num_value_heads)
        w.add(f"{arch}.full_attention_interval", 4)
        w.add(f"{arch}.rope.dimension_sections", [3, 3, 2, 0])
    if arch == "qwen35moe":
        w.add(f"{arch}.expert_shared_feed_forward_length", cfg.shared_expert_intermediate_size)
    if arch in ("qwen3moe", "qwen35moe"):
        w.add(f"{arch}.expert_count", cfg.num_experts)
        w.add(f"{arch}.expert_used_count", cfg.num_experts_per_tok)
        w.add(f"{arch}.expert_feed_forward_length", cfg.moe_intermediate_size)
    if arch == "gpt-oss":  # conversion/gpt_oss.py GptOssModel.set_gguf_parameters
        w.add(f"{arch}.expert_count", cfg.num_local_experts)
        w.add(f"{arch}.expert_used_count", cfg.num_experts_per_tok)
        w.add(f"{arch}.attention.sliding_window", cfg.sliding_window)
        w.add(f"{arch}.expert_feed_forward_length", cfg.intermediate_size)
    if arch == "glm4moe":  # conversion/glm.py Glm4MoeModel.set_gguf_parameters
        w.add(f"{arch}.expert_count", cfg.n_routed_experts)
        w.add(f"{arch}.expert_used_count", cfg.num_experts_per_tok)
        w.add(f"{arch}.expert_feed_forward_length", cfg.moe_intermediate_size)
        w.add(f"{arch}.expert_shared_count", cfg.n_shared_experts)
        w.add(f"{arch}.leading_dense_block_count", cfg.first_k_dense_replace)
        w.add(f"{arch}.expert_gating_func", 2)
        w.add(f"{arch}.expert_weights_scale", float(cfg.routed_scaling_factor))
        w.add(f"{arch}.expert_weights_norm", bool(cfg.norm_topk_prob))
        w.add(f"{arch}.expert_group_count", cfg.n_group)
        w.add(f"{arch}.expert_group_used_count", cfg.topk_group)
        w.add(f"{arch}.nextn_predict_layers", 0)
    if arch == "gemma4":  # conversion/gemma.py Gemma4Model.set_gguf_parameters
        swa = [t == "sliding_attention" for t in cfg.layer_types]
        first_shared = cfg.num_hidden_layers - cfg.num_kv_shared_layers
        full = cfg.per_layer_config[swa.index(False)]  # a full layer's own head size and key-value heads
        global_head_dim = full.head_dim
        full_kv = full.num_key_value_heads if full.num_key_value_heads != cfg.num_key_value_heads else None
        w.add(f"{arch}.attention.shared_kv_layers", cfg.num_kv_shared_layers)
        w.add(f"{arch}.embedding_length_per_layer_input", cfg.hidden_size_per_layer_input or 0)
        w.add(f"{arch}.attention.sliding_window_pattern", swa)
        w.add(f"{arch}.attention.key_length", global_head_dim)
        w.add(f"{arch}.attention.value_length", global_head_dim)
        w.add(f"{arch}.attention.key_length_swa", cfg.head_dim)
        w.add(f"{arch}.attention.value_length_swa", cfg.head_dim)
        w.add(f"{arch}.rope.freq_base_swa", float(cfg.rope_parameters["sliding_attention"]["rope_theta"]))
        w.add(f"{arch}.rope.dimension_count", global_head_dim)
        w.add(f"{arch}.rope.dimension_count_swa", cfg.head_dim)
        w.add(f"{arch}.final_logit_softcapping", float(cfg.final_logit_softcapping))
        if cfg.enable_moe_block:
            w.add(f"{arch}.expert_count", cfg.num_experts)
            w.add(f"{arch}.expert_used_count", cfg.top_k_experts)
            w.add(f"{arch}.expert_feed_forward_length", cfg.moe_intermediate_size)
        rot = int(global_head_dim * cfg.rope_parameters["full_attention"]["partial_rotary_factor"] / 2)
        w.add_tensor("rope_freqs.weight", np.array([1.0] * rot + [1e30] * (global_head_dim // 2 - rot),
                                                   np.float32))
    w.add("general.name", f"tiny-{arch}")
    # Granite hybrids without rotary: the converter writes 2**20 (no trained limit)
    w.add(f"{arch}.context_length", 2 ** 20 if arch == "granitehybrid" else cfg.max_position_embeddings)
    w.add(f"{arch}.embedding_length", cfg.hidden_size)
    w.add(f"{arch}.block_count", n_trunk + (1 if mtp else 0))
    if mtp:
        w.add(f"{arch}.nextn_predict_layers", 1)
        w.add(f"{arch}.attention.recurrent_layers", [t == "linear_attention" for t in cfg.layer_types] + [False])
    if arch == "gemma4" and cfg.use_double_wide_mlp:  # the shared layers' MLP is twice as wide
        first_shared = cfg.num_hidden_layers - cfg.num_kv_shared_layers
        w.add(f"{arch}.feed_forward_length", [cfg.intermediate_size * (1 if i < first_shared else 2)
                                              for i in range(cfg.num_hidden_layers)])
    else:
        w.add(f"{arch}.feed_forward_length", cfg.intermediate_size)
    w.add(f"{arch}.attention.head_count", cfg.num_attention_heads)
    if arch == "gemma4" and full_kv is not None:
        w.add(f"{arch}.attention.head_count_kv", [cfg.num_key_value_heads if t else full_kv for t in swa])
    elif arch in ("lfm2", "granitehybrid"):  # per layer: 0 for the convolution / Mamba-2 layers
        w.add(f"{arch}.attention.head_count_kv", [0 if t in ("conv", "mamba", "linear_attention")
                                                  else cfg.num_key_value_heads for t in cfg.layer_types])
    else:
        w.add(f"{arch}.attention.head_count_kv", cfg.num_key_value_heads)
    if arch in ("lfm2", "granitehybrid", "granite", "granitemoe", "mistral3"):  # their converters write the vocabulary's size
        w.add(f"{arch}.vocab_size", cfg.vocab_size)
    if arch == "lfm2":
        w.add(f"{arch}.shortconv.l_cache", cfg.conv_L_cache)
    elif arch == "granitehybrid":  # conversion/granite.py GraniteHybridModel.set_gguf_parameters
        w.add(f"{arch}.ssm.conv_kernel", cfg.mamba_d_conv)
        w.add(f"{arch}.ssm.state_size", cfg.mamba_d_state)
        w.add(f"{arch}.ssm.group_count", cfg.mamba_n_groups)
        w.add(f"{arch}.ssm.inner_size", cfg.mamba_expand * cfg.hidden_size)
        w.add(f"{arch}.ssm.time_step_rank", cfg.mamba_n_heads)
        w.add(f"{arch}.attention.scale", float(cfg.attention_multiplier))
        w.add(f"{arch}.embedding_scale", float(cfg.embedding_multiplier))
        w.add(f"{arch}.residual_scale", float(cfg.residual_multiplier))
        w.add(f"{arch}.logit_scale", float(cfg.logits_scaling))
        w.add(f"{arch}.expert_count", cfg.num_local_experts)
        w.add(f"{arch}.expert_used_count", cfg.num_experts_per_tok)
        w.add(f"{arch}.expert_shared_feed_forward_length", cfg.shared_intermediate_size)
        w.add(f"{arch}.rope.scaling.finetuned", False)
    elif arch in ("granite", "granitemoe"):  # conversion/granite.py GraniteModel, GraniteMoeModel
        w.add(f"{arch}.attention.scale", float(cfg.attention_multiplier))
        w.add(f"{arch}.embedding_scale", float(cfg.embedding_multiplier))
        w.add(f"{arch}.residual_scale", float(cfg.residual_multiplier))
        w.add(f"{arch}.logit_scale", float(cfg.logits_scaling))
        if arch == "granitemoe":
            w.add(f"{arch}.expert_count", cfg.num_local_experts)
            w.add(f"{arch}.expert_used_count", cfg.num_experts_per_tok)
            w.add(f"{arch}.expert_shared_feed_forward_length", cfg.shared_intermediate_size)
    eps = getattr(cfg, "rms_norm_eps", None) or cfg.norm_eps
    w.add(f"{arch}.attention.layer_norm_rms_epsilon", float(eps))
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if arch not in ("lfm2", "granitehybrid", "granite", "granitemoe", "gemma4"):  # no head_dim in LFM2's config;
        # Granite's converter drops it
        w.add(f"{arch}.attention.key_length", head_dim)
        w.add(f"{arch}.attention.value_length", head_dim)
    rope = cfg.rope_parameters
    if arch in ("gemma3", "gemma4", "gemma-embedding"):
        w.add(f"{arch}.rope.freq_base", float(rope["full_attention"]["rope_theta"]))
        # EmbeddingGemma: the config's own window, before transformers' halving (conversion/gemma.py)
        window = (cfg.sliding_window - 1) * 2 if getattr(cfg, "use_bidirectional_attention", False) \
            else cfg.sliding_window
        w.add(f"{arch}.attention.sliding_window", window)
    elif "full_attention" in rope:  # OLMo 3: both layer kinds share a base
        w.add(f"{arch}.rope.freq_base", float(rope["full_attention"]["rope_theta"]))
        w.add(f"{arch}.rope.dimension_count", head_dim)
        w.add(f"{arch}.attention.sliding_window", cfg.sliding_window)
        w.add(f"{arch}.attention.sliding_window_pattern", [t == "sliding_attention" for t in cfg.layer_types])
    else:
        w.add(f"{arch}.rope.freq_base", float(rope["rope_theta"]))
        rot = int(head_dim * rope.get("partial_rotary_factor", 1.0))
        if arch not in ("lfm2", "gpt-oss"):  # their converters write no rotary dimension count
            w.add(f"{arch}.rope.dimension_count", rot)
    if rope.get("rope_type") == "yarn":  # conversion/base.py, and mistral3.py's two keys of its own
        w.add(f"{arch}.rope.scaling.type", "yarn")
        w.add(f"{arch}.rope.scaling.factor", float(rope["factor"]))
        w.add(f"{arch}.rope.scaling.original_context_length", rope["original_max_position_embeddings"])
        w.add(f"{arch}.rope.scaling.yarn_beta_fast", float(rope["beta_fast"]))
        w.add(f"{arch}.rope.scaling.yarn_beta_slow", float(rope["beta_slow"]))
        if arch == "mistral3":
            w.add(f"{arch}.rope.scaling.yarn_log_multiplier", float(rope["mscale_all_dim"]))
            w.add(f"{arch}.attention.temperature_scale", float(rope["llama_4_scaling_beta"]))
    w.add("tokenizer.ggml.model", "gpt2")
    w.add("tokenizer.ggml.pre", pre)
    w.add("tokenizer.ggml.tokens", tokens)
    w.add("tokenizer.ggml.token_type", types)
    w.add("tokenizer.ggml.merges", merges)
    w.add("tokenizer.ggml.bos_token_id", cfg.vocab_size - 3)
    w.add("tokenizer.ggml.eos_token_id", cfg.vocab_size - 3)
    w.add("tokenizer.ggml.add_bos_token", False)
    w.add("tokenizer.ggml.padding_token_id", 0)
    if chat_template is not None:
        w.add("tokenizer.chat_template", chat_template)
    for key, val in (meta or {}).items():  # more keys, as a converter option writes them
        w.add(key.format(arch=arch), val)
