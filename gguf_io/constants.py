"""The one table of GGUF facts: magic, versions, value types, ggml tensor types and
their block geometry, and the metadata key names the rest of the package uses.

Everything that reads, writes or (de)quantizes looks sizes up here; nothing else in
the code base spells a block size or a key name.
"""

from __future__ import annotations

import enum
from typing import Union
from dataclasses import dataclass

import numpy as np

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)  # v1 (uint32 counts) is long obsolete and refused
GGUF_DEFAULT_ALIGNMENT = 32
GGML_MAX_DIMS = 4
QK_K = 256


class GGUFValueType(enum.IntEnum):
    """Type codes of metadata values."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# Fixed-size metadata scalars: struct format (little-endian) and numpy dtype.
VALUE_FORMATS: dict[GGUFValueType, tuple[str, np.dtype]] = {
    GGUFValueType.UINT8: ("<B", np.dtype("<u1")),
    GGUFValueType.INT8: ("<b", np.dtype("<i1")),
    GGUFValueType.UINT16: ("<H", np.dtype("<u2")),
    GGUFValueType.INT16: ("<h", np.dtype("<i2")),
    GGUFValueType.UINT32: ("<I", np.dtype("<u4")),
    GGUFValueType.INT32: ("<i", np.dtype("<i4")),
    GGUFValueType.FLOAT32: ("<f", np.dtype("<f4")),
    GGUFValueType.BOOL: ("<?", np.dtype("?")),
    GGUFValueType.UINT64: ("<Q", np.dtype("<u8")),
    GGUFValueType.INT64: ("<q", np.dtype("<i8")),
    GGUFValueType.FLOAT64: ("<d", np.dtype("<f8")),
}

INT_RANGES: dict[GGUFValueType, tuple[int, int]] = {
    GGUFValueType.UINT8: (0, 2**8 - 1),
    GGUFValueType.INT8: (-(2**7), 2**7 - 1),
    GGUFValueType.UINT16: (0, 2**16 - 1),
    GGUFValueType.INT16: (-(2**15), 2**15 - 1),
    GGUFValueType.UINT32: (0, 2**32 - 1),
    GGUFValueType.INT32: (-(2**31), 2**31 - 1),
    GGUFValueType.UINT64: (0, 2**64 - 1),
    GGUFValueType.INT64: (-(2**63), 2**63 - 1),
}


@dataclass(frozen=True)
class TypeInfo:
    block_size: int  # elements per block
    type_size: int  # bytes per block
    quantized: bool
    dtype: np.dtype | None = None  # numpy dtype of unquantized types


class GGMLType(enum.IntEnum):
    """Every tensor type of today's ggml (ids are the file's type codes)."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41
    Q2_0 = 42

    @property
    def info(self) -> TypeInfo:
        return TYPE_INFO[self]

    @property
    def block_size(self) -> int:
        return TYPE_INFO[self].block_size

    @property
    def type_size(self) -> int:
        return TYPE_INFO[self].type_size

    @property
    def quantized(self) -> bool:
        return TYPE_INFO[self].quantized

    def row_nbytes(self, n_elements: int) -> int:
        """Bytes taken by `n_elements` values (a multiple of the block size)."""
        bs, ts = TYPE_INFO[self].block_size, TYPE_INFO[self].type_size
        if n_elements % bs:
            raise ValueError(f"{self.name}: {n_elements} elements is not a multiple of the block size {bs}")
        return n_elements // bs * ts


def _q(block: int, size: int) -> TypeInfo:
    return TypeInfo(block, size, True)


def _f(dtype: str) -> TypeInfo:
    dt = np.dtype(dtype)
    return TypeInfo(1, dt.itemsize, False, dt)


# (elements per block, bytes per block), as in ggml-common.h.
TYPE_INFO: dict[GGMLType, TypeInfo] = {
    GGMLType.F32: _f("<f4"),
    GGMLType.F16: _f("<f2"),
    GGMLType.BF16: TypeInfo(1, 2, False, np.dtype("<u2")),  # numpy has no bfloat16
    GGMLType.F64: _f("<f8"),
    GGMLType.I8: _f("<i1"),
    GGMLType.I16: _f("<i2"),
    GGMLType.I32: _f("<i4"),
    GGMLType.I64: _f("<i8"),
    GGMLType.Q4_0: _q(32, 2 + 16),
    GGMLType.Q4_1: _q(32, 2 + 2 + 16),
    GGMLType.Q5_0: _q(32, 2 + 4 + 16),
    GGMLType.Q5_1: _q(32, 2 + 2 + 4 + 16),
    GGMLType.Q8_0: _q(32, 2 + 32),
    GGMLType.Q8_1: _q(32, 2 + 2 + 32),
    GGMLType.Q2_K: _q(QK_K, 2 + 2 + QK_K // 16 + QK_K // 4),
    GGMLType.Q3_K: _q(QK_K, 2 + QK_K // 4 + QK_K // 8 + 12),
    GGMLType.Q4_K: _q(QK_K, 2 + 2 + 12 + QK_K // 2),
    GGMLType.Q5_K: _q(QK_K, 2 + 2 + 12 + QK_K // 2 + QK_K // 8),
    GGMLType.Q6_K: _q(QK_K, 2 + QK_K // 2 + QK_K // 4 + QK_K // 16),
    GGMLType.Q8_K: _q(QK_K, 4 + QK_K + QK_K // 8),
    GGMLType.IQ2_XXS: _q(QK_K, 2 + QK_K // 4),
    GGMLType.IQ2_XS: _q(QK_K, 2 + QK_K // 4 + QK_K // 32),
    GGMLType.IQ2_S: _q(QK_K, 2 + QK_K // 4 + QK_K // 16),
    GGMLType.IQ3_XXS: _q(QK_K, 2 + QK_K // 4 + QK_K // 8),
    GGMLType.IQ3_S: _q(QK_K, 2 + QK_K // 4 + QK_K // 8 + QK_K // 32 + 4),
    GGMLType.IQ1_S: _q(QK_K, 2 + QK_K // 8 + QK_K // 16),
    GGMLType.IQ1_M: _q(QK_K, QK_K // 8 + QK_K // 16 + QK_K // 32),
    GGMLType.IQ4_NL: _q(32, 2 + 16),
    GGMLType.IQ4_XS: _q(QK_K, 2 + 2 + QK_K // 64 + QK_K // 2),
    GGMLType.TQ1_0: _q(QK_K, 2 + QK_K // 64 + (QK_K - 4 * QK_K // 64) // 5),
    GGMLType.TQ2_0: _q(QK_K, 2 + QK_K // 4),
    GGMLType.MXFP4: _q(32, 1 + 16),
    GGMLType.NVFP4: _q(64, 4 + 32),
    GGMLType.Q1_0: _q(128, 2 + 16),
    GGMLType.Q2_0: _q(64, 2 + 16),
}

# Types that carry no weights (activation-side formats and integer tensors).
NON_WEIGHT_TYPES = frozenset({GGMLType.Q8_1, GGMLType.Q8_K})

# llama.cpp's `general.file_type` (enum llama_ftype), for display.
FILE_TYPES: dict[int, str] = {
    0: "ALL_F32", 1: "MOSTLY_F16", 2: "MOSTLY_Q4_0", 3: "MOSTLY_Q4_1",
    7: "MOSTLY_Q8_0", 8: "MOSTLY_Q5_0", 9: "MOSTLY_Q5_1", 10: "MOSTLY_Q2_K",
    11: "MOSTLY_Q3_K_S", 12: "MOSTLY_Q3_K_M", 13: "MOSTLY_Q3_K_L", 14: "MOSTLY_Q4_K_S",
    15: "MOSTLY_Q4_K_M", 16: "MOSTLY_Q5_K_S", 17: "MOSTLY_Q5_K_M", 18: "MOSTLY_Q6_K",
    19: "MOSTLY_IQ2_XXS", 20: "MOSTLY_IQ2_XS", 21: "MOSTLY_Q2_K_S", 22: "MOSTLY_IQ3_XS",
    23: "MOSTLY_IQ3_XXS", 24: "MOSTLY_IQ1_S", 25: "MOSTLY_IQ4_NL", 26: "MOSTLY_IQ3_S",
    27: "MOSTLY_IQ3_M", 28: "MOSTLY_IQ2_S", 29: "MOSTLY_IQ2_M", 30: "MOSTLY_IQ4_XS",
    31: "MOSTLY_IQ1_M", 32: "MOSTLY_BF16", 36: "MOSTLY_TQ1_0", 37: "MOSTLY_TQ2_0",
    38: "MOSTLY_MXFP4_MOE", 39: "MOSTLY_NVFP4", 40: "MOSTLY_Q1_0",
}


class Keys:
    """Metadata key names. Per-architecture keys are templates over `{arch}`."""

    ARCHITECTURE = "general.architecture"
    NAME = "general.name"
    ALIGNMENT = "general.alignment"
    FILE_TYPE = "general.file_type"
    QUANTIZATION_VERSION = "general.quantization_version"
    SIZE_LABEL = "general.size_label"
    BASENAME = "general.basename"

    SPLIT_NO = "split.no"
    SPLIT_COUNT = "split.count"
    SPLIT_TENSORS_COUNT = "split.tensors.count"

    CONTEXT_LENGTH = "{arch}.context_length"
    EMBEDDING_LENGTH = "{arch}.embedding_length"
    BLOCK_COUNT = "{arch}.block_count"
    NEXTN_PREDICT_LAYERS = "{arch}.nextn_predict_layers"  # multi-token-prediction layers counted in block_count
    POOLING_TYPE = "{arch}.pooling_type"  # embedding and reranking files: 1 mean, 2 CLS, 3 last token, 4 rank
    DENSE_FEAT_IN = "{arch}.{dense}_feat_in"  # EmbeddingGemma's projections after pooling (dense_2, dense_3)
    DENSE_FEAT_OUT = "{arch}.{dense}_feat_out"
    CLASSIFIER_OUTPUT_LABELS = "{arch}.classifier.output_labels"
    CLASSIFIER_POOLING_TYPE = "{arch}.classifier.pooling_type"  # a reranker's pooling before its head: 1 mean, 2 CLS
    HIDDEN_ACTIVATION = "{arch}.hidden_activation"  # ModernBERT's feed-forward activation (gelu, silu)
    FEED_FORWARD_LENGTH = "{arch}.feed_forward_length"
    EXPERT_COUNT = "{arch}.expert_count"
    EXPERT_USED_COUNT = "{arch}.expert_used_count"
    HEAD_COUNT = "{arch}.attention.head_count"
    HEAD_COUNT_KV = "{arch}.attention.head_count_kv"
    KEY_LENGTH = "{arch}.attention.key_length"
    VALUE_LENGTH = "{arch}.attention.value_length"
    KEY_LENGTH_MLA = "{arch}.attention.key_length_mla"  # DeepSeek's heads as decompressed (nope + rope)
    VALUE_LENGTH_MLA = "{arch}.attention.value_length_mla"
    Q_LORA_RANK = "{arch}.attention.q_lora_rank"
    KV_LORA_RANK = "{arch}.attention.kv_lora_rank"
    KEY_LENGTH_SWA = "{arch}.attention.key_length_swa"  # Gemma 4: the sliding layers' head size
    VALUE_LENGTH_SWA = "{arch}.attention.value_length_swa"
    SHARED_KV_LAYERS = "{arch}.attention.shared_kv_layers"  # Gemma 4: the last layers attend over earlier caches
    EMBEDDING_LENGTH_PER_LAYER = "{arch}.embedding_length_per_layer_input"  # Gemma 4 per-layer embeddings
    LAYERNORM_RMS_EPS = "{arch}.attention.layer_norm_rms_epsilon"
    LAYERNORM_EPS = "{arch}.attention.layer_norm_epsilon"  # LayerNorm's (BERT)
    SLIDING_WINDOW = "{arch}.attention.sliding_window"
    SLIDING_WINDOW_PATTERN = "{arch}.attention.sliding_window_pattern"
    RECURRENT_LAYERS = "{arch}.attention.recurrent_layers"
    FULL_ATTENTION_INTERVAL = "{arch}.full_attention_interval"
    ROPE_FREQ_BASE = "{arch}.rope.freq_base"
    ROPE_FREQ_BASE_SWA = "{arch}.rope.freq_base_swa"
    ROPE_DIMENSION_COUNT = "{arch}.rope.dimension_count"
    ROPE_DIMENSION_COUNT_SWA = "{arch}.rope.dimension_count_swa"
    ROPE_DIMENSION_SECTIONS = "{arch}.rope.dimension_sections"
    ROPE_SCALING_TYPE = "{arch}.rope.scaling.type"
    ROPE_SCALING_FACTOR = "{arch}.rope.scaling.factor"
    ROPE_SCALING_ORIG_CTX = "{arch}.rope.scaling.original_context_length"
    ROPE_SCALING_YARN_BETA_FAST = "{arch}.rope.scaling.yarn_beta_fast"
    ROPE_SCALING_YARN_BETA_SLOW = "{arch}.rope.scaling.yarn_beta_slow"
    ROPE_SCALING_YARN_ATTN_FACTOR = "{arch}.rope.scaling.yarn_attn_factor"
    ROPE_SCALING_YARN_LOG_MUL = "{arch}.rope.scaling.yarn_log_multiplier"  # a config's mscale_all_dim
    ATTENTION_TEMPERATURE_SCALE = "{arch}.attention.temperature_scale"  # Mistral 3: llama_4_scaling_beta
    ROPE_SCALING_FINETUNED = "{arch}.rope.scaling.finetuned"  # Granite hybrids: whose attention turns with rotary
    ATTENTION_SCALE = "{arch}.attention.scale"  # Granite's multipliers
    EMBEDDING_SCALE = "{arch}.embedding_scale"
    RESIDUAL_SCALE = "{arch}.residual_scale"
    LOGIT_SCALE = "{arch}.logit_scale"
    EXPERT_FEED_FORWARD_LENGTH = "{arch}.expert_feed_forward_length"
    SHORTCONV_L_CACHE = "{arch}.shortconv.l_cache"  # LFM2: the short convolutions' kernel
    SSM_CONV_KERNEL = "{arch}.ssm.conv_kernel"
    SSM_STATE_SIZE = "{arch}.ssm.state_size"
    SSM_GROUP_COUNT = "{arch}.ssm.group_count"
    SSM_TIME_STEP_RANK = "{arch}.ssm.time_step_rank"
    SSM_INNER_SIZE = "{arch}.ssm.inner_size"
    EXPERT_SHARED_FEED_FORWARD_LENGTH = "{arch}.expert_shared_feed_forward_length"
    EXPERT_SHARED_COUNT = "{arch}.expert_shared_count"
    EXPERT_WEIGHTS_SCALE = "{arch}.expert_weights_scale"
    EXPERT_WEIGHTS_NORM = "{arch}.expert_weights_norm"
    EXPERT_GATING_FUNC = "{arch}.expert_gating_func"  # 1 softmax, 2 sigmoid
    LEADING_DENSE_BLOCK_COUNT = "{arch}.leading_dense_block_count"
    INTERLEAVE_MOE_LAYER_STEP = "{arch}.interleave_moe_layer_step"  # Llama 4: every n-th layer routed
    EXPERT_GROUP_COUNT = "{arch}.expert_group_count"
    EXPERT_GROUP_USED_COUNT = "{arch}.expert_group_used_count"
    FINAL_LOGIT_SOFTCAPPING = "{arch}.final_logit_softcapping"
    ATTN_LOGIT_SOFTCAPPING = "{arch}.attn_logit_softcapping"

    # vision files (llama.cpp's clip layout: general.architecture "clip", general.type "mmproj")
    TYPE = "general.type"
    CLIP_PROJECTOR_TYPE = "clip.projector_type"
    CLIP_HAS_VISION = "clip.has_vision_encoder"
    CLIP_USE_GELU = "clip.use_gelu"
    CLIP_USE_SILU = "clip.use_silu"
    VISION_PROJECTOR_TYPE = "clip.vision.projector_type"  # files with several encoders
    VISION_IMAGE_SIZE = "clip.vision.image_size"
    VISION_PATCH_SIZE = "clip.vision.patch_size"
    VISION_EMBEDDING_LENGTH = "clip.vision.embedding_length"
    VISION_FEED_FORWARD_LENGTH = "clip.vision.feed_forward_length"
    VISION_PROJECTION_DIM = "clip.vision.projection_dim"
    VISION_BLOCK_COUNT = "clip.vision.block_count"
    VISION_IMAGE_MEAN = "clip.vision.image_mean"
    VISION_IMAGE_STD = "clip.vision.image_std"
    VISION_SPATIAL_MERGE_SIZE = "clip.vision.spatial_merge_size"
    VISION_IMAGE_MIN_PIXELS = "clip.vision.image_min_pixels"
    VISION_IMAGE_MAX_PIXELS = "clip.vision.image_max_pixels"
    VISION_IS_DEEPSTACK_LAYERS = "clip.vision.is_deepstack_layers"
    VISION_HEAD_COUNT = "clip.vision.attention.head_count"
    VISION_LAYERNORM_EPS = "clip.vision.attention.layer_norm_epsilon"
    VISION_PROJECTOR_SCALE_FACTOR = "clip.vision.projector.scale_factor"
    # audio encoders (in the same file as a vision tower, or alone)
    CLIP_HAS_AUDIO = "clip.has_audio_encoder"
    AUDIO_PROJECTOR_TYPE = "clip.audio.projector_type"  # files with several encoders
    AUDIO_EMBEDDING_LENGTH = "clip.audio.embedding_length"
    AUDIO_FEED_FORWARD_LENGTH = "clip.audio.feed_forward_length"
    AUDIO_PROJECTION_DIM = "clip.audio.projection_dim"
    AUDIO_BLOCK_COUNT = "clip.audio.block_count"
    AUDIO_HEAD_COUNT = "clip.audio.attention.head_count"
    AUDIO_LAYERNORM_EPS = "clip.audio.attention.layer_norm_epsilon"
    AUDIO_NUM_MEL_BINS = "clip.audio.num_mel_bins"
    AUDIO_STACK_FACTOR = "clip.audio.projector.stack_factor"

    TOKENIZER_MODEL = "tokenizer.ggml.model"
    TOKENIZER_PRE = "tokenizer.ggml.pre"
    TOKENIZER_TOKENS = "tokenizer.ggml.tokens"
    TOKENIZER_SCORES = "tokenizer.ggml.scores"
    TOKENIZER_TOKEN_TYPE = "tokenizer.ggml.token_type"
    TOKENIZER_MERGES = "tokenizer.ggml.merges"
    TOKENIZER_BOS_ID = "tokenizer.ggml.bos_token_id"
    TOKENIZER_EOS_ID = "tokenizer.ggml.eos_token_id"
    TOKENIZER_PAD_ID = "tokenizer.ggml.padding_token_id"
    TOKENIZER_UNK_ID = "tokenizer.ggml.unknown_token_id"
    TOKENIZER_ADD_BOS = "tokenizer.ggml.add_bos_token"
    TOKENIZER_ADD_EOS = "tokenizer.ggml.add_eos_token"
    TOKENIZER_ADD_SEP = "tokenizer.ggml.add_sep_token"
    TOKENIZER_SEP_ID = "tokenizer.ggml.seperator_token_id"  # sic: llama.cpp's spelling
    TOKENIZER_REMOVE_EXTRA_WS = "tokenizer.ggml.remove_extra_whitespaces"
    TOKENIZER_PRECOMPILED_CHARSMAP = "tokenizer.ggml.precompiled_charsmap"
    TOKENIZER_LOWERCASE = "tokenizer.ggml.normalizer.lowercase"  # a WordPiece ("bert") vocabulary's text lowercased
    TOKENIZER_ADD_SPACE_PREFIX = "tokenizer.ggml.add_space_prefix"
    TOKENIZER_EOT_ID = "tokenizer.ggml.eot_token_id"
    TOKENIZER_EOM_ID = "tokenizer.ggml.eom_token_id"
    CHAT_TEMPLATE = "tokenizer.chat_template"

    @staticmethod
    def arch(template: str, arch: str) -> str:
        return template.format(arch=arch)


# The type of a metadata value: a scalar type, or (ARRAY, element spec) for arrays.
ValueSpec = Union[GGUFValueType, tuple]
