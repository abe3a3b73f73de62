"""Tiny random checkpoints that take images and audio, with real tokenizers, converted
whole by llama.cpp's converter into the two files llama-server --mmproj loads: the text
model and the projector file (`--mmproj`).

- `tiny_gemma4_media`: a Gemma4ForConditionalGeneration with a vision tower and an audio
  tower (one mmproj file, projector types "gemma4v" and "gemma4a", converter class
  conversion/gemma.py Gemma4VisionAudioModel; the text side Gemma4Model, E2B-like).
- `tiny_qwen2_audio`: a Qwen2AudioForConditionalGeneration (Whisper encoder, projector
  "qwen2a", conversion/ultravox.py WhisperEncoderModel; the text side qwen2).
- `tiny_qwen3vl`: a Qwen3VLForConditionalGeneration (projector "qwen3vl_merger" with
  deepstack layers, conversion/qwen3vl.py; the text side qwen3vl, interleaved M-RoPE).

What the tokenizers' chat templates write for a media part is in GEMMA4_MEDIA_TOKENS and
QWEN2_AUDIO_MEDIA_TOKENS; what mtmd writes around a media chunk (for the engine to write
the same) in GEMMA4_MTMD_WRAP and QWEN2_AUDIO_MTMD_WRAP. A test fixture: it knows nothing
of the engine."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (Gemma4AudioFeatureExtractor, Gemma4Config, Gemma4ForConditionalGeneration,
                          Gemma4ImageProcessorPil, GemmaTokenizer,
                          PreTrainedTokenizerBase, Qwen2AudioConfig, Qwen2AudioForConditionalGeneration,
                          Qwen2AudioProcessor, Qwen2Tokenizer, Qwen3VLConfig, Qwen3VLForConditionalGeneration,
                          WhisperFeatureExtractor)

from converter import _RUN_WITH_VOCAB, llama_cpp_src
from tiny_metadata import bytes_to_unicode

CORPUS = """The quick brown fox jumps over the lazy dog. Describe this image and this sound.
What is in the picture? A cat sits on the mat near the window. Listen to the audio and answer.
The weather is sunny today, and the birds sing in the trees. Hello world, how are you?
There is a red car in the street, and the people are walking to the station.
She sings a song while the children are playing with their dog in the garden."""

# Gemma 4's special tokens, in the real vocabulary's order (pad, eos, bos, unk, mask first)
GEMMA4_SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>",
                   "<|tool_response>", "<tool_response|>", '<|"|>', "<|think|>", "<|channel>", "<channel|>", "<|turn>",
                   "<turn|>", "<|image>", "<|audio>", "<|image|>", "<|audio|>", "<image|>", "<audio|>", "<|video|>")
# the processor's names for the media tokens (tokenizer_config.json keys, as Gemma 4's has them)
GEMMA4_NAMED = {"image_token": "<|image|>", "boi_token": "<|image>", "eoi_token": "<image|>",
                "audio_token": "<|audio|>", "boa_token": "<|audio>", "eoa_token": "<audio|>"}
# what the chat template writes for a content part of each type
GEMMA4_MEDIA_TOKENS = {"image": "<|image|>", "audio": "<|audio|>"}
# what mtmd writes before and after the media chunk (tools/mtmd/mtmd.cpp, PROJECTOR_TYPE_GEMMA4V / GEMMA4A)
GEMMA4_MTMD_WRAP = {"image": ("<|image>", "<image|>"), "audio": ("<|audio>", "<audio|>")}

# Gemma 4's chat template reduced to turns and media parts (the real one's tools, thinking and
# system turn left out; it also writes <|image|> and <|audio|> for media parts)
GEMMA4_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "{{ '<|turn>' + role + '\n' }}"
    "{% if m['content'] is string %}{{ m['content'] | trim }}"
    "{% else %}{% for item in m['content'] %}"
    "{% if item['type'] == 'image' %}{{ '<|image|>' }}"
    "{% elif item['type'] == 'audio' %}{{ '<|audio|>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] | trim }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<turn|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|turn>model\n' }}{% endif %}"
)

QWEN2_AUDIO_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>")
QWEN2_AUDIO_MEDIA_TOKENS = {"audio": "<|AUDIO|>"}
QWEN2_AUDIO_MTMD_WRAP = {"audio": ("<|audio_bos|>", "<|audio_eos|>")}

# Qwen2-Audio-7B-Instruct's template reduced: its default system turn, and an audio part as the
# placeholder alone (the real one writes "Audio N: <|audio_bos|><|AUDIO|><|audio_eos|>\n"; mtmd
# writes the begin and end tokens itself, so the placeholder is what the engine expands)
QWEN2_AUDIO_TEMPLATE = (
    "{% for m in messages %}"
    "{% if loop.first and m['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + m['role'] + '\n' }}"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for item in m['content'] %}"
    "{% if item['type'] == 'audio' %}{{ '<|AUDIO|>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

QWEN3VL_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                    "<|image_pad|>")
# Qwen3-VL's template writes the three tokens for an image part; mtmd writes nothing around its chunk
QWEN3VL_MEDIA_TOKENS = {"image": "<|image_pad|>"}
QWEN3VL_TEMPLATE = QWEN2_AUDIO_TEMPLATE.replace(
    "{% if item['type'] == 'audio' %}{{ '<|AUDIO|>' }}",
    "{% if item['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}")

PATCH = 8  # Gemma 4's vision patch (the real one's is 16)
GEMMA4_WIDTH = 128  # its text model's


@dataclass
class TinyMedia:
    text_path: str
    mmproj_path: str
    model: torch.nn.Module  # the transformers model both files were converted from
    tokenizer: PreTrainedTokenizerBase
    token_ids: dict[str, int]  # each special token's id
    chat_template: str


def learn_merges(words: list[str], n: int) -> list[tuple[str, str]]:
    """`n` BPE merges learned greedily over `words` (the most frequent pair first, ties by
    the pair), so that the vocabulary has merged words as real ones do."""
    seqs = [list(w) for w in words]
    merges = []
    for _ in range(n):
        counts = Counter(p for s in seqs for p in zip(s, s[1:]))
        if not counts:
            break
        pair, count = max(counts.items(), key=lambda kv: (kv[1], kv[0]))
        if count < 2:
            break
        merges.append(pair)
        for i, s in enumerate(seqs):
            out, j = [], 0
            while j < len(s):
                if j + 1 < len(s) and (s[j], s[j + 1]) == pair:
                    out.append(s[j] + s[j + 1])
                    j += 2
                else:
                    out.append(s[j])
                    j += 1
            seqs[i] = out
    return merges


def gemma4_tokenizer(folder: Path) -> GemmaTokenizer:
    """A Gemma 4 style tokenizer (SentencePiece-like BPE over "▁"-joined text with byte
    fallback; its special tokens first, then the 256 byte tokens, the corpus' characters and
    merges), with the reduced template, saved in `folder`."""
    vocab = {t: i for i, t in enumerate(GEMMA4_SPECIALS)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    words = ["▁" + w for w in CORPUS.split()]
    for c in sorted(set("".join(words))):
        vocab.setdefault(c, len(vocab))
    merges = learn_merges(words, 120)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    extra = [t for t in GEMMA4_SPECIALS[5:] if t not in GEMMA4_NAMED.values()]
    tok = GemmaTokenizer(vocab=vocab, merges=merges, add_bos_token=True, extra_special_tokens=extra, **GEMMA4_NAMED)
    tok.chat_template = GEMMA4_TEMPLATE
    tok.save_pretrained(folder)
    # the processor's config beside it, as the real checkpoint has it (the converter reads the
    # image mean and std from it: 0 and 1, Gemma 4 scales its pixels in the model); written by
    # hand, as Gemma4Processor wants torchvision for its video processor
    processor = {"processor_class": "Gemma4Processor", "image_seq_length": 280, "audio_seq_length": 750,
                 "image_processor": json.loads(Gemma4ImageProcessorPil(patch_size=PATCH).to_json_string()),
                 "feature_extractor": json.loads(Gemma4AudioFeatureExtractor().to_json_string())}
    (folder / "processor_config.json").write_text(json.dumps(processor, indent=2))
    return tok


def qwen_tokenizer(folder: Path, specials: tuple[str, ...], template: str) -> Qwen2Tokenizer:
    """A byte-level BPE tokenizer as Qwen's (256 bytes, merges of the corpus, then the
    `specials`, the first of them the pad), with `template`, saved in `folder`."""
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: i for i, b in enumerate(sorted(b2u))}
    words = ["".join(b2u[b] for b in (" " + w).encode()) for w in CORPUS.split()]
    merges = learn_merges(words, 120)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    for t in specials:
        vocab[t] = len(vocab)
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=None, bos_token=None, eos_token="<|im_end|>",
                         pad_token=specials[0], extra_special_tokens=list(specials[1:]))
    tok.chat_template = template
    tok.save_pretrained(folder)
    return tok


def qwen2_audio_tokenizer(folder: Path) -> Qwen2Tokenizer:
    """Qwen's tokenizer with Qwen2-Audio's specials and the reduced template, its processor beside it."""
    tok = qwen_tokenizer(folder, QWEN2_AUDIO_SPECIALS, QWEN2_AUDIO_TEMPLATE)
    Qwen2AudioProcessor(WhisperFeatureExtractor(feature_size=128), tok,
                        chat_template=QWEN2_AUDIO_TEMPLATE).save_pretrained(folder)
    return tok


def qwen3vl_tokenizer(folder: Path) -> Qwen2Tokenizer:
    """Qwen's tokenizer with Qwen3-VL's vision tokens, and the image processor's mean and
    std beside it (the converter reads them)."""
    tok = qwen_tokenizer(folder, QWEN3VL_SPECIALS, QWEN3VL_TEMPLATE)
    (folder / "preprocessor_config.json").write_text(json.dumps(
        {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "patch_size": 16, "merge_size": 2,
         "temporal_patch_size": 2}))
    return tok


def _randomize(model: torch.nn.Module, seed: int, embed_std: float, final_norm: float) -> None:
    """Weights of a trained model's spread, so that no output is degenerate and greedy
    tokens change from step to step and win by margins larger than float rounding:

    - matrices and convolutions of unit gain; norms near 1 (Gemma 4's scale by w); Gemma 4's
      q/k norms near 0.7 (it does not scale its queries: norms of 1 make every softmax
      one-hot, norms of 0.3 so flat that the text after an image attends to the image alone);
      Qwen2's queries and keys of gain 2, for the same reason after 750 audio tokens
    - the clippable linears' bounds finite (about 2.5): some inputs and outputs are clipped
    - logits that spread about 4: `final_norm` near 14 before Gemma 4's tied head, near 1
      before Qwen2's head of gain 4
    - token embeddings of std `embed_std`: Gemma 4's 0.25 / sqrt(width), 0.25 once the model
      has scaled them (a tied embedding of unit size dominates the residual, and the model
      echoes its last token over and over); Qwen2's 1 (its untied head echoes nothing; smaller
      ones leave the token after 750 audio tokens too faint to matter)
    - media embeddings out of the projectors of about 0.25, position tables of 0.1 (less than
      what the pixels and mel frames bring, so that the content shows in the embeddings)"""
    g = torch.Generator().manual_seed(seed)
    saved = model.state_dict().keys()  # not the buffers a checkpoint leaves out (embedding scales, rotary tables)
    with torch.no_grad():
        for name, p in [*model.named_parameters(), *model.named_buffers()]:
            if name not in saved or not p.is_floating_point():
                continue
            r = torch.randn(p.shape, generator=g)
            u = torch.rand(p.shape, generator=g)
            if name.endswith(("input_max", "output_max")):
                p.copy_(2.0 + u)
            elif name.endswith(("input_min", "output_min")):
                p.copy_(-2.0 - u)
            elif name.endswith("embed_tokens.weight"):
                p.copy_(embed_std * r)
            elif name.endswith(("embedding_projection.weight", "multi_modal_projector.linear.weight")):
                p.copy_(0.25 * r / p.shape[-1] ** 0.5)
            elif name.endswith("language_model.norm.weight"):
                p.copy_(final_norm * (1.0 + 0.1 * r))
            elif name.endswith("lm_head.weight"):
                p.copy_(4.0 * r / p.shape[-1] ** 0.5)
            elif "q_norm" in name or "k_norm" in name:
                p.copy_(0.7 * (1.0 + 0.1 * r))
            elif "norm" in name or name.endswith(("layer_scalar", "std_scale")):
                p.copy_(1.0 + 0.1 * r)
            elif name.endswith(("bias", "per_dim_scale", "std_bias")):
                p.copy_(0.1 * r)
            elif name.endswith(("position_embedding_table", "embed_positions.weight")):
                p.copy_(0.1 * r)
            elif "language_model" in name and name.endswith(("q_proj.weight", "k_proj.weight")):
                p.copy_(2.0 * r / p.shape[-1] ** 0.5)  # Gemma 4 normalizes them after: no matter
            elif p.ndim >= 2:
                p.copy_(r / (p[0].numel() ** 0.5))
            else:
                p.copy_(0.1 * r)


def gemma4_config(tok: GemmaTokenizer) -> Gemma4Config:
    """Gemma 4 E2B's layout (the sizes with audio), tiny: per-layer embeddings, KV shared
    across the last two layers, the double-wide MLP, a sliding window of 512. A vision tower
    with patch 8 and the default 3x3 pooling, a position table of 256 per axis, its outputs
    standardized (std_bias, std_scale in the file). An audio conformer of 128 mel bins (the
    real one's, and the only count transformers allows: it sizes the subsampling projection
    from subsampling_conv_channels[0] // 4, the mel bins / 4 only at 128) with mtmd's fixed
    chunked attention (12 frames, 13 to the left), kernel 5 and logit cap 50 (the defaults).
    Both towers' linears clippable, with finite bounds in the file.
    use_bidirectional_attention="vision": transformers' image tokens attend both ways (its
    sliding layers only); llama.cpp's every layer does, for any Gemma 4 whose width is not
    E2B's or E4B's (1536, 2560)."""
    ids = tok.convert_tokens_to_ids
    text = dict(vocab_size=len(tok), hidden_size=GEMMA4_WIDTH, intermediate_size=256, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, global_head_dim=64,
                layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                sliding_window=512, num_kv_shared_layers=2, hidden_size_per_layer_input=16,
                vocab_size_per_layer_input=len(tok), use_double_wide_mlp=True, attention_k_eq_v=False,
                final_logit_softcapping=30.0, max_position_embeddings=4096, rms_norm_eps=1e-6,
                use_bidirectional_attention="vision", pad_token_id=0, eos_token_id=1, bos_token_id=2,
                rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                 "full_attention": {"rope_type": "proportional", "rope_theta": 1e6,
                                                    "partial_rotary_factor": 0.25}})
    vision = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=2, head_dim=32, patch_size=PATCH, pooling_kernel_size=3,
                  position_embedding_size=256, use_clipped_linears=True, standardize=True, rms_norm_eps=1e-6)
    audio = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, subsampling_conv_channels=[128, 16],
                 output_proj_dims=96, use_clipped_linears=True, rms_norm_eps=1e-6)
    cfg = Gemma4Config(text_config=text, vision_config=vision, audio_config=audio,
                       boi_token_id=ids("<|image>"), eoi_token_id=ids("<image|>"), image_token_id=ids("<|image|>"),
                       video_token_id=ids("<|video|>"), boa_token_id=ids("<|audio>"), eoa_token_index=ids("<audio|>"),
                       audio_token_id=ids("<|audio|>"), tie_word_embeddings=True)
    cfg.text_config.allow_global_per_layer_attribute_access = True
    return cfg


def qwen2_audio_config(tok: Qwen2Tokenizer) -> Qwen2AudioConfig:
    """Qwen2-Audio's layout, tiny: a Whisper encoder of 128 mel bins and 1500 positions (mtmd
    feeds it 30 s windows of 3000 frames, whatever the audio's length), a qwen2 text model.
    Three encoder layers, not two: the converter finds `audio_tower.conv{n}` (n = 1, 2) through
    its per-block name table, which holds only as many blocks as the encoder has layers."""
    audio = dict(model_type="qwen2_audio_encoder", d_model=64, encoder_layers=3, encoder_attention_heads=4,
                 encoder_ffn_dim=128, num_mel_bins=128, max_source_positions=1500)
    text = dict(model_type="qwen2", vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 1e4}, tie_word_embeddings=False,
                bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
                eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    return Qwen2AudioConfig(audio_config=audio, text_config=text,
                            audio_token_index=tok.convert_tokens_to_ids("<|AUDIO|>"))


def qwen3vl_config(tok: Qwen2Tokenizer) -> Qwen3VLConfig:
    """Qwen3-VL's layout, tiny: a ViT of 3 layers, patches of 16 merged 2x2, an 8x8
    position table, deepstack after layers 0 and 1; a qwen3vl text model of 3 layers whose
    head of 16 turns 8 frequencies in interleaved sections (time 4, rows 2, columns 2)."""
    ids = tok.convert_tokens_to_ids
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                rms_norm_eps=1e-6, tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [4, 2, 2],
                                 "mrope_interleaved": True})
    vision = dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16, spatial_merge_size=2,
                  temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=64,
                  deepstack_visual_indexes=[0, 1])
    return Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=ids("<|image_pad|>"),
                         vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
                         tie_word_embeddings=False)

# convert_with_vocab's runner, naming the pre-tokenizer "qwen2" (what Qwen2-Audio's files have)
# instead of "default"; Gemma 4's vocabulary has no pre-tokenizer name (its tokenizer model is "gemma4")
_RUN_QWEN2_PRE = _RUN_WITH_VOCAB.replace('lambda self, tokenizer: "default"', 'lambda self, tokenizer: "qwen2"')
assert _RUN_QWEN2_PRE != _RUN_WITH_VOCAB, "tests/converter.py's runner no longer names the pre-tokenizer as expected"


def _convert(hf: Path, todo: dict[str, tuple[str, ...]], runner: str) -> dict[str, str]:
    """Each of `todo` ("text" or "mmproj" -> the converter's arguments) converted from the
    checkpoint `hf` into its parent folder, side by side (one process each)."""
    src = llama_cpp_src()

    def run(role: str, args: tuple[str, ...]) -> str:
        out = hf.parent / f"{role}-{args[1]}.gguf"
        part = out.with_suffix(".part")
        p = subprocess.run([sys.executable, "-c", runner, src, str(hf), "--outfile", str(part), *args],
                           capture_output=True, text=True)
        assert p.returncode == 0, f"converting {hf} ({' '.join(args)}): {p.stderr[-3000:]}"
        part.rename(out)
        return str(out)

    with ThreadPoolExecutor(2) as pool:
        jobs = {role: pool.submit(run, role, args) for role, args in todo.items()}
        return {role: job.result() for role, job in jobs.items()}


@dataclass(frozen=True)
class _Family:
    tokenizer: Callable[[Path], PreTrainedTokenizerBase]
    config: Callable[[PreTrainedTokenizerBase], object]
    model_class: type
    template: str
    specials: tuple[str, ...]
    runner: str  # the converter's runner (tests/converter.py's, with the vocabulary)
    embed_std: float  # _randomize's
    final_norm: float


FAMILIES = {  # Gemma scales its token embeddings by sqrt(width) as it reads them, and ties its head to them
    "gemma4": _Family(gemma4_tokenizer, gemma4_config, Gemma4ForConditionalGeneration, GEMMA4_TEMPLATE,
                      GEMMA4_SPECIALS, _RUN_WITH_VOCAB, embed_std=0.25 / GEMMA4_WIDTH ** 0.5, final_norm=14.0),
    "qwen2a": _Family(qwen2_audio_tokenizer, qwen2_audio_config, Qwen2AudioForConditionalGeneration,
                      QWEN2_AUDIO_TEMPLATE, QWEN2_AUDIO_SPECIALS, _RUN_QWEN2_PRE, embed_std=1.0, final_norm=1.0),
    "qwen3vl": _Family(qwen3vl_tokenizer, qwen3vl_config, Qwen3VLForConditionalGeneration, QWEN3VL_TEMPLATE,
                       QWEN3VL_SPECIALS, _RUN_QWEN2_PRE, embed_std=1.0, final_norm=1.0),
}

# what this process has built: checkpoints per (family, seed), files per (family, seed, role, type);
# a later call, whatever its folder, gets them (pytest's tmp_path_factory folders last the session)
_CHECKPOINTS: dict[tuple[str, int], tuple[Path, torch.nn.Module, PreTrainedTokenizerBase]] = {}
_FILES: dict[tuple[str, int, str, str], str] = {}


def _build(kind: str, folder: Path, outtype: str, mmproj_outtype: str, seed: int) -> TinyMedia:
    llama_cpp_src()  # skip (or fail in CI) before building anything where the converter is missing
    family = FAMILIES[kind]
    if (kind, seed) not in _CHECKPOINTS:
        hf = folder / "hf"
        shutil.rmtree(hf, ignore_errors=True)
        tok = family.tokenizer(hf)
        model = family.model_class(family.config(tok)).eval()
        _randomize(model, seed, family.embed_std, family.final_norm)
        model.save_pretrained(hf)
        _CHECKPOINTS[kind, seed] = hf, model, tok
    hf, model, tok = _CHECKPOINTS[kind, seed]
    wanted = {"text": ("--outtype", outtype), "mmproj": ("--outtype", mmproj_outtype, "--mmproj")}
    todo = {role: args for role, args in wanted.items() if (kind, seed, role, args[1]) not in _FILES}
    for role, path in _convert(hf, todo, family.runner).items():
        _FILES[kind, seed, role, wanted[role][1]] = path
    return TinyMedia(_FILES[kind, seed, "text", outtype], _FILES[kind, seed, "mmproj", mmproj_outtype], model, tok,
                     {t: tok.convert_tokens_to_ids(t) for t in family.specials}, family.template)


def tiny_gemma4_media(folder, outtype: str = "f32", seed: int = 0, mmproj_outtype: str = "f32") -> TinyMedia:
    """A tiny Gemma 4 with vision and audio in `folder`: the checkpoint (folder/hf), the text
    file at `outtype` (f32, q8_0) and the mmproj file (both towers) at `mmproj_outtype`.
    Built once per seed in a process (each file type once): a later call returns the first
    one's files, wherever they are, so call it from a session-scoped fixture."""
    return _build("gemma4", Path(folder), outtype, mmproj_outtype, seed)


def tiny_qwen2_audio(folder, outtype: str = "f32", seed: int = 0, mmproj_outtype: str = "f32") -> TinyMedia:
    """A tiny Qwen2-Audio in `folder`, as tiny_gemma4_media."""
    return _build("qwen2a", Path(folder), outtype, mmproj_outtype, seed)


def tiny_qwen3vl(folder, outtype: str = "f32", seed: int = 0, mmproj_outtype: str = "f32") -> TinyMedia:
    """A tiny Qwen3-VL (deepstack) in `folder`, as tiny_gemma4_media."""
    return _build("qwen3vl", Path(folder), outtype, mmproj_outtype, seed)
