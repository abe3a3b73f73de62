"""Fast tokenizer from a GGUF file's `tokenizer.ggml.*` keys, built directly with the
`tokenizers` library (no config files, no slow-tokenizer conversion).

- `llama` (SentencePiece-style, Gemma's too): BPE whose merges come from the
  vocabulary and scores (a pair merges into a token; higher-scored tokens merge
  first, as llama.cpp's SPM tokenizer does), byte fallback, `▁` for spaces.
- `gpt2` (byte-level BPE): the file's merges and the pre-tokenizer regex that
  `tokenizer.ggml.pre` names.
Control and user-defined tokens become added tokens, so chat markup in rendered
templates encodes to its single ids."""

from __future__ import annotations

import hashlib
import logging
import operator
import os
import re
from dataclasses import dataclass

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from ..gguf_io import GGUFReader, Keys
from .errors import TokenizerError

log = logging.getLogger(__name__)

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Pre-tokenizers for byte-level BPE, by `tokenizer.ggml.pre`: the split regexes (applied
# one after another, each piece kept) as the models' tokenizer.json files state them, and
# whether a word already in the vocabulary is taken whole before any merge (llama.cpp's
# ignore_merges), from llama.cpp's vocab code.
_CONTRACTIONS = r"'s|'t|'re|'ve|'m|'ll|'d"
_GPT2 = _CONTRACTIONS + r"| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_TEKKEN = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*|\p{{N}}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+(?i:{_CONTRACTIONS})?"
          rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*(?i:{_CONTRACTIONS})?|\p{{N}}{{1,3}}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_REFACT = (r"\p{N}", _CONTRACTIONS + r"| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)")


@dataclass(frozen=True)
class PreTokenizer:
    regexes: tuple[str, ...]
    ignore_merges: bool = False


PRE_TOKENIZERS = {
    **dict.fromkeys(("default", "gpt2", "gpt-2", "olmo", "mpt"), PreTokenizer((_GPT2,))),
    **dict.fromkeys(("llama-bpe", "llama3", "llama-v3", "smaug-bpe", "falcon3", "pixtral", "lfm2"),
                    PreTokenizer((_LLAMA3,), ignore_merges=True)),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), PreTokenizer((_QWEN2,))),
    "qwen35": PreTokenizer((_QWEN35,)),
    "tekken": PreTokenizer((_TEKKEN,), ignore_merges=True),  # Mistral (Nemo, Small 3, Ministral 3)
    **dict.fromkeys(("gpt-4o", "llama4"), PreTokenizer((_GPT4O,))),  # gpt-oss
    **dict.fromkeys(("glm4", "glm5"), PreTokenizer((_LLAMA3,), ignore_merges=True)),  # GLM-4.5
    **dict.fromkeys(("refact", "smollm"), PreTokenizer(_REFACT)),  # Granite
}


def _spm_merges(tokens: list[str], scores: list[float], types: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Every split of a token into two tokens, as (left ids, right ids), best-scored
    merged token first (then by the pieces' ids), the order transformers' SentencePiece
    conversion uses."""
    vocab = {t: i for i, t in enumerate(tokens) if types[i] in (NORMAL, USER_DEFINED)}
    live = [t for t in vocab if len(t) > 1]
    merged: list[str] = []
    left: list[str] = []
    right: list[str] = []
    k = 1
    while live:  # one comprehension per split position: far less interpreter work than nested loops
        hits = [t for t in live if t[:k] in vocab and t[k:] in vocab]
        merged += hits
        left += [t[:k] for t in hits]
        right += [t[k:] for t in hits]
        k += 1
        live = [t for t in live if len(t) > k]
    g = vocab.__getitem__
    score = np.asarray(scores, dtype=np.float64)[np.fromiter(map(g, merged), np.int64, len(merged))]
    ia = np.fromiter(map(g, left), np.int64, len(left))
    ib = np.fromiter(map(g, right), np.int64, len(right))
    order = np.lexsort((ib, ia, -score))
    return ia[order], ib[order]


def default_cache_dir() -> str:
    """Where loads keep what they derive from a file when no cache_dir is set (EngineConfig.cache_dir)."""
    return os.path.join(os.path.expanduser("~"), ".cache", "gguf-serve")


def _cached_spm_merges(reader: GGUFReader, tokens, scores, types, cache_dir: str | None) -> list[tuple[str, str]]:
    """Merges are a pure function of the vocabulary; keep them in `cache_dir` (None:
    default_cache_dir()), keyed by the file's identity, so later loads skip deriving them."""
    st = os.stat(reader.path)
    key = hashlib.sha1(f"{os.path.abspath(reader.path)}|{st.st_size}|{st.st_mtime_ns}|{len(tokens)}".encode()).hexdigest()
    folder = os.path.join(cache_dir or default_cache_dir(), "merges")
    path = os.path.join(folder, f"{key}.npy")
    pairs = None
    try:
        pairs = np.load(path)
    except (OSError, ValueError):
        pass
    if pairs is None or pairs.ndim != 2 or pairs.shape[1] != 2 or (pairs.size and pairs.max() >= len(tokens)):
        ia, ib = _spm_merges(tokens, scores, types)
        pairs = np.stack([ia, ib], axis=1).astype(np.int32)
        try:
            os.makedirs(folder, exist_ok=True)
            tmp = f"{path}.{os.getpid()}.tmp.npy"
            np.save(tmp, pairs)
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only home only costs the next load the derivation
    if not len(pairs):
        return []
    get = operator.itemgetter(*pairs[:, 0].tolist())
    get_b = operator.itemgetter(*pairs[:, 1].tolist())
    a, b = get(tokens), get_b(tokens)
    if len(pairs) == 1:
        return [(a, b)]
    return list(zip(a, b))


def _spm(reader: GGUFReader, tokens, types, cache_dir: str | None = None) -> tuple[Tokenizer, bool]:
    scores = reader.metadata.get(Keys.TOKENIZER_SCORES) or [0.0] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    unk_id = reader.metadata.get(Keys.TOKENIZER_UNK_ID)
    unk = tokens[unk_id] if unk_id is not None and unk_id < len(tokens) else None
    merges = _cached_spm_merges(reader, tokens, scores, types, cache_dir)
    model = models.BPE(vocab=vocab, merges=merges, unk_token=unk,
                       fuse_unk=True, byte_fallback=True, dropout=None)
    tok = Tokenizer(model)
    add_prefix = reader.metadata.get(Keys.TOKENIZER_ADD_SPACE_PREFIX, True)
    norms = [normalizers.Prepend("▁")] if add_prefix else []
    tok.normalizer = normalizers.Sequence(norms + [normalizers.Replace(" ", "▁")])
    decs = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_prefix:
        decs.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(decs)
    return tok, True


def _gpt2(reader: GGUFReader, tokens, types) -> tuple[Tokenizer, bool]:
    merges = reader.metadata.get(Keys.TOKENIZER_MERGES)
    if merges is None:
        raise TokenizerError(f"{reader.path}: a gpt2 tokenizer needs {Keys.TOKENIZER_MERGES!r}")
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    vocab = {t: i for i, t in enumerate(tokens)}
    name = reader.metadata.get(Keys.TOKENIZER_PRE, "default")
    pre = PRE_TOKENIZERS.get(name)
    if pre is None:
        log.warning("%s: pre-tokenizer %r is not known here; splitting words as GPT-2 does (known: %s)",
                    reader.path, name, ", ".join(sorted(PRE_TOKENIZERS)))
        pre = PRE_TOKENIZERS["default"]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False,
                               ignore_merges=pre.ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in pre.regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok, False


def _gemma4(reader: GGUFReader, tokens, types) -> tuple[Tokenizer, bool]:
    """Gemma 4's tokenizer (tokenizer.ggml.model "gemma4"): SentencePiece-style BPE with
    merges: spaces as ▁, no splitting but at newlines, bytes outside the vocabulary as
    <0xXX> tokens; a line that is itself a token (a run of newlines, say) is that token, as
    llama.cpp takes it. Always with BOS (llama.cpp overrides the files' false)."""
    merges = reader.metadata.get(Keys.TOKENIZER_MERGES)
    if merges is None:
        raise TokenizerError(f"{reader.path}: a gemma4 tokenizer needs {Keys.TOKENIZER_MERGES!r}")
    pairs = []
    for m in merges:  # split at the first space after the first character, as llama.cpp does
        i = m.find(" ", 1)
        pairs.append((m[:i], m[i + 1:]) if i > 0 else (m, ""))
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=True, ignore_merges=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\n]+|[\n]+"), behavior="isolated", invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return tok, True


def _wpm(reader: GGUFReader, tokens, types) -> tuple[Tokenizer, bool]:
    """A WordPiece vocabulary (tokenizer.ggml.model "bert"), as llama.cpp's converter writes
    it: a word's first piece with a leading ▁, a continuation without (its ## dropped),
    control tokens as they are. Text lowercased unless the file says not, accents stripped
    then, split at whitespace and punctuation (BERT's basic tokenizer), each word into the
    longest pieces the vocabulary has, an unknown word as [UNK]; [CLS] text [SEP]."""
    vocab: dict[str, int] = {}
    for i, (t, kind) in enumerate(zip(tokens, types)):
        piece = t if kind == CONTROL else t[1:] if t.startswith("▁") else "##" + t
        if piece and piece != "##":
            vocab.setdefault(piece, i)
    unk_id = reader.metadata.get(Keys.TOKENIZER_UNK_ID)
    unk = tokens[unk_id] if isinstance(unk_id, int) and 0 <= unk_id < len(tokens) else "[UNK]"
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token=unk, max_input_chars_per_word=100))
    lowercase = bool(reader.metadata.get(Keys.TOKENIZER_LOWERCASE, True))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                                lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok, True


def _ugm(reader: GGUFReader, tokens, types) -> tuple[Tokenizer, bool]:
    """A SentencePiece Unigram vocabulary (tokenizer.ggml.model "t5": XLM-RoBERTa's, so
    bge-m3, multilingual-e5 and bge-reranker's, and T5's) as llama.cpp reads it: the text
    through the file's precompiled normalization (SentencePiece's charsmap, NFKC for the
    usual ones), runs of spaces merged and the ends' dropped where the file says so
    (remove_extra_whitespaces), a ▁ before the text (add_space_prefix, or always when
    merging), spaces as ▁; then the pieces of the highest summed score (Viterbi), a
    character no piece covers as the unknown token (consecutive ones as one)."""
    md = reader.metadata
    scores = md.get(Keys.TOKENIZER_SCORES) or [0.0] * len(tokens)
    unk_id = md.get(Keys.TOKENIZER_UNK_ID)
    if not isinstance(unk_id, int) or not 0 <= unk_id < len(tokens):
        unk_id = next((i for i, t in enumerate(types) if t == UNKNOWN), None)
    tok = Tokenizer(models.Unigram([(t, float(s)) for t, s in zip(tokens, scores)], unk_id=unk_id, byte_fallback=False))
    norms = []
    charsmap = md.get(Keys.TOKENIZER_PRECOMPILED_CHARSMAP)
    if charsmap:
        norms.append(normalizers.Precompiled(bytes(bytearray(int(b) & 0xFF for b in charsmap))))
    merge = bool(md.get(Keys.TOKENIZER_REMOVE_EXTRA_WS, False))
    if merge:
        norms += [normalizers.Replace(Regex("^ +| +$"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    if norms:
        tok.normalizer = normalizers.Sequence(norms)
    prepend = "always" if merge or md.get(Keys.TOKENIZER_ADD_SPACE_PREFIX, False) else "never"
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=prepend, split=False)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=prepend, split=False)
    return tok, False


# the longest token a vocabulary may hold (real ones: at most a few hundred characters of whitespace or code); a
# 16 MiB one cost 1.4 GiB to build into the tokenizer
MAX_TOKEN_CHARS = 1 << 16


def load_tokenizer(reader: GGUFReader, cache_dir: str | None = None) -> PreTrainedTokenizerFast:
    """The file's tokenizer as a transformers fast tokenizer; `cache_dir` (EngineConfig.cache_dir;
    None: default_cache_dir()) keeps a SentencePiece vocabulary's derived merges for later loads."""
    kind = reader.metadata.get(Keys.TOKENIZER_MODEL)
    tokens = reader.metadata.get(Keys.TOKENIZER_TOKENS)
    if kind is None or tokens is None:
        raise TokenizerError(f"{reader.path}: no tokenizer in the file ({Keys.TOKENIZER_MODEL} / {Keys.TOKENIZER_TOKENS})")
    types = reader.metadata.get(Keys.TOKENIZER_TOKEN_TYPE) or [NORMAL] * len(tokens)
    long = next((i for i, t in enumerate(tokens) if len(t) > MAX_TOKEN_CHARS), None)
    if long is not None:  # a vocabulary's tokens are words: this one would cost its size many times over to build
        raise TokenizerError(f"{reader.path}: token {long} is {len(tokens[long])} characters long; a vocabulary's "
                             f"tokens are at most {MAX_TOKEN_CHARS}")
    if kind == "llama":
        tok, default_bos = _spm(reader, tokens, types, cache_dir)
    elif kind == "gpt2":
        tok, default_bos = _gpt2(reader, tokens, types)
    elif kind == "gemma4":
        tok, default_bos = _gemma4(reader, tokens, types)
    elif kind == "bert":
        tok, default_bos = _wpm(reader, tokens, types)
    elif kind == "t5":
        tok, default_bos = _ugm(reader, tokens, types)
    else:
        raise TokenizerError(f"{reader.path}: tokenizer model {kind!r} is not supported (supported: llama, gpt2, "
                             "gemma4, bert, t5)")
    specials = [AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == CONTROL]
    users = [AddedToken(tokens[i], special=False, normalized=False) for i, t in enumerate(types) if t == USER_DEFINED]
    tok.add_special_tokens(specials)
    if users:
        tok.add_tokens(users)

    def token(key):
        i = reader.metadata.get(key)
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    add_bos = (kind == "gemma4" or bool(reader.metadata.get(Keys.TOKENIZER_ADD_BOS, default_bos))) \
        and token(Keys.TOKENIZER_BOS_ID) is not None
    add_eos = bool(reader.metadata.get(Keys.TOKENIZER_ADD_EOS, kind == "t5")) and token(Keys.TOKENIZER_EOS_ID) is not None
    add_sep = bool(reader.metadata.get(Keys.TOKENIZER_ADD_SEP, kind == "bert")) and token(Keys.TOKENIZER_SEP_ID) is not None
    return GgufTokenizer(
        tok,
        bos_token=token(Keys.TOKENIZER_BOS_ID),
        eos_token=token(Keys.TOKENIZER_EOS_ID),
        unk_token=token(Keys.TOKENIZER_UNK_ID),
        pad_token=token(Keys.TOKENIZER_PAD_ID),
        sep_token=token(Keys.TOKENIZER_SEP_ID),
        add_sep=add_sep,
        add_bos_token=add_bos,
        add_eos_token=add_eos,
        clean_up_tokenization_spaces=False,
    )


class GgufTokenizer(PreTrainedTokenizerFast):
    """A transformers fast tokenizer over a `tokenizers.Tokenizer` built here (taken
    as is: the base class would deep-copy a 262k vocabulary for nothing)."""

    def __init__(self, backend: Tokenizer, add_sep: bool = False, **kwargs):
        self._tokenizer = backend
        super().__init__(**kwargs)
        self.add_sep = add_sep  # llama.cpp's add_sep: a reranker's SEP between query and document
        self.added_ids = frozenset(self.added_tokens_decoder)  # control and user-defined tokens


def _byte_level_table() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character each byte is written as in a vocabulary,
    here from character to byte (printable Latin-1 bytes stand for themselves; the others
    are the characters from U+0100 on, in byte order)."""
    direct = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {chr(b): b for b in direct}, 0
    for b in range(256):
        if b not in direct:
            table[chr(256 + extra)] = b
            extra += 1
    return table


BYTE_LEVEL = _byte_level_table()
BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def token_bytes(tokenizer, token_id: int) -> bytes:
    """The bytes a token stands for (OpenAI's logprob `bytes`): one byte for a byte token
    (part of a character: its own byte, not the replacement character's), a SentencePiece
    piece with its ▁ as spaces, a byte-level BPE token through GPT-2's alphabet; a control or
    user-defined token its text."""
    piece = tokenizer.convert_ids_to_tokens(int(token_id))
    if piece is None:
        return b""
    if int(token_id) in getattr(tokenizer, "added_ids", ()):
        return piece.encode()
    if isinstance(tokenizer.backend_tokenizer.decoder, decoders.ByteLevel):
        if all(c in BYTE_LEVEL for c in piece):
            return bytes(BYTE_LEVEL[c] for c in piece)
        return piece.encode()
    byte = BYTE_TOKEN.fullmatch(piece)
    return bytes([int(byte.group(1), 16)]) if byte else piece.replace("▁", " ").encode()


def encode(tokenizer: PreTrainedTokenizerFast, text: str, *, add_special: bool = True) -> list[int]:
    """Token ids of `text`, with BOS/EOS as the file asks when `add_special`."""
    ids = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids
    if add_special:
        if tokenizer.add_bos_token and (not ids or ids[0] != tokenizer.bos_token_id):
            ids = [tokenizer.bos_token_id] + ids
        if tokenizer.add_eos_token:
            ids = ids + [tokenizer.eos_token_id]
    return ids


def rendered_ids(tokenizer: PreTrainedTokenizerFast, text: str) -> list[int]:
    """A rendered chat prompt's token ids. The template writes BOS and every turn's
    markup itself, so nothing is added (the one place this is decided, for the engine's
    generate() and the server alike)."""
    return encode(tokenizer, text, add_special=False)
