"""Tokenizers built from GGUF keys: SentencePiece-style (Gemma) against llama.cpp's
tokenizer, byte-level BPE against transformers' own GGUF tokenizer."""

import os

import pytest

from gguf_serve.engine.tokenizer import TokenizerError, encode, load_tokenizer, token_bytes
from gguf_serve.gguf_io import GGUFReader, GGUFWriter

from helpers import copy_gguf, no_llama_cpp
from tiny_models import random_model, spec, write_gguf

TEXTS = ["Hello world", "  leading spaces and trailing  ", "The quick brown fox jumps over the lazy dog.",
         "日本語のテキスト、中文文本 and émojis 🙂🚀", "def f(x):\n\treturn x**2  # comment\n\n",
         "<start_of_turn>user\nhi<end_of_turn>\n", "line1\r\nline2\n\n\nline5", "1234567890 3.14159 -42",
         "a\u00a0b\u2003c", "ÄÖÜ äöü ß", "https://example.com/path?q=1&r=2", "    ", "\n", ""]

# llama.cpp's tokenization of the Gemma file (llama-cpp-python 0.3.36, add_bos, special=True)
LLAMA_CPP_GEMMA = {
    "Hello world": [2, 9259, 1902],
    "  leading spaces and trailing  ": [2, 138, 26016, 9952, 532, 45330, 138],
    "The quick brown fox jumps over the lazy dog.": [2, 818, 3823, 8864, 37423, 38167, 1024, 506, 31770, 4799, 236761],
    "日本語のテキスト、中文文本 and émojis 🙂🚀": [2, 94951, 236945, 95830, 236951, 55041, 57489, 532, 1559, 1289, 92467,
                                        57235, 242015],
    "def f(x):\n\treturn x**2  # comment\n\n": [2, 2063, 517, 236769, 236781, 1473, 107, 255968, 2060, 1123, 1018,
                                                236778, 138, 236865, 5739, 108],
    "<start_of_turn>user\nhi<end_of_turn>\n": [2, 105, 2364, 107, 2202, 106, 107],
}


@pytest.fixture(scope="module")
def gemma_tok(gemma_path):
    return load_tokenizer(GGUFReader(gemma_path))


@pytest.mark.parametrize("text", list(LLAMA_CPP_GEMMA))
def test_gemma_encoding_equals_recorded_llama_cpp(gemma_tok, text):
    assert encode(gemma_tok, text) == LLAMA_CPP_GEMMA[text]
    assert gemma_tok(text)["input_ids"] == LLAMA_CPP_GEMMA[text]  # the transformers call path agrees


def test_gemma_encoding_equals_live_llama_cpp(gemma_path, gemma_tok):
    try:
        import llama_cpp
    except ImportError:
        no_llama_cpp()
    ref = llama_cpp.Llama(model_path=gemma_path, vocab_only=True, verbose=False)
    for text in TEXTS:
        assert encode(gemma_tok, text) == ref.tokenize(text.encode(), add_bos=True, special=True), repr(text)


@pytest.mark.parametrize("text", TEXTS)
def test_gemma_round_trip(gemma_tok, text):
    ids = encode(gemma_tok, text, add_special=False)
    assert gemma_tok.decode(ids) == text


def test_gemma_special_tokens(gemma_tok):
    assert (gemma_tok.bos_token, gemma_tok.eos_token, gemma_tok.pad_token, gemma_tok.unk_token) == ("<bos>", "<eos>", "<pad>", "<unk>")
    assert gemma_tok.convert_tokens_to_ids("<start_of_turn>") == 105
    assert len(gemma_tok) == 262144


def test_token_bytes_are_each_tokens_own(gemma_tok, bpe_file):
    """A token's bytes (logprobs' `bytes`): byte tokens their one byte, pieces their text with
    spaces, control tokens their text; the bytes of a text's tokens, joined, are the text."""
    text = "héllo 𝄞 wörld\n\t<end>"
    for tok in (gemma_tok, load_tokenizer(GGUFReader(bpe_file))):
        ids = tok.backend_tokenizer.encode(text, add_special_tokens=False).ids
        joined = b"".join(token_bytes(tok, i) for i in ids)
        assert joined.decode() == text
    bpe = load_tokenizer(GGUFReader(bpe_file))  # its vocabulary splits "é" into its two bytes
    assert [token_bytes(bpe, i) for i in bpe.backend_tokenizer.encode("é").ids] == [b"\xc3", b"\xa9"]
    assert token_bytes(gemma_tok, gemma_tok.convert_tokens_to_ids("<0xE2>")) == b"\xe2"
    assert token_bytes(gemma_tok, 105) == b"<start_of_turn>"
    assert token_bytes(gemma_tok, gemma_tok.convert_tokens_to_ids("▁world")) == b" world"


@pytest.fixture(scope="module")
def bpe_file(tmp_path_factory):
    s = spec("qwen2")
    path = tmp_path_factory.mktemp("bpe") / "tiny-qwen2.gguf"
    write_gguf(s, random_model(s), path, "Q8_0")
    return str(path)


def test_byte_level_bpe_equals_transformers_gguf_tokenizer(bpe_file):
    from transformers import AutoTokenizer

    ours = load_tokenizer(GGUFReader(bpe_file))
    ref = AutoTokenizer.from_pretrained(os.path.dirname(bpe_file), gguf_file=os.path.basename(bpe_file))
    for text in TEXTS + ["<|im_start|>user\nthe cat<|im_end|>", "the theory of everything in the end"]:
        assert encode(ours, text) == ref(text, add_special_tokens=False)["input_ids"], repr(text)
        assert ours.decode(encode(ours, text)) == text


def test_byte_level_bpe_uses_merges(bpe_file):
    tok = load_tokenizer(GGUFReader(bpe_file))
    ids = encode(tok, " the")
    assert len(ids) == 1 and tok.convert_ids_to_tokens(ids) == ["Ġthe"]
    assert encode(tok, "<|im_end|>") == [tok.convert_tokens_to_ids("<|im_end|>")]


# the pre-tokenizers of the families' files: Mistral (tekken), gpt-oss (gpt-4o), GLM (glm4),
# Granite (refact), LFM2 and Llama 3 (llama-bpe), Qwen
PRES = ["tekken", "gpt-4o", "glm4", "refact", "lfm2", "llama-bpe", "qwen2", "qwen35", "gpt-2"]
PRE_TEXTS = TEXTS + ["HelloWorld isn't DON'T we'LL", "ÉCOLE École école ΑΒΓ αβγ", "12345 1.5e10 ١٢٣", "a/b/c//\n x/\n",
                     "CamelCaseWords and snake_case", "नमस्ते दुनिया", "the theory of everything in the end",
                     "HelloWorld 12345678 isn't hello world, dog/\n x 1 22 333"]


@pytest.mark.parametrize("pre", PRES)
def test_byte_level_pre_tokenizers_equal_live_llama_cpp(tmp_path, pre):
    """The same file under each family's `tokenizer.ggml.pre`, tokenized by llama.cpp."""
    try:
        import llama_cpp
    except ImportError:
        no_llama_cpp()
    s = spec("qwen2")
    s.config.vocab_size = 400  # room for the probe merges
    path = tmp_path / f"tiny-{pre}.gguf"
    write_gguf(s, random_model(s), path, "Q8_0", pre=pre, probes=True)
    ours = load_tokenizer(GGUFReader(str(path)))
    ref = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    for text in PRE_TEXTS:
        if pre in ("tekken", "gpt-4o") and text == "नमस्ते दुनिया":
            # llama.cpp's rewrite of these two regexes drops \p{M} from the letter classes, so it splits
            # a combining mark from its letter; the models' tokenizer.json (kept here) does not
            continue
        assert encode(ours, text, add_special=False) == ref.tokenize(text.encode(), add_bos=False, special=True), \
            (pre, text)


def test_missing_or_unknown_tokenizer_is_a_clear_error(tmp_path):
    p = tmp_path / "none.gguf"
    with GGUFWriter(p) as w:
        w.add("general.architecture", "llama")
    with pytest.raises(TokenizerError, match="no tokenizer in the file"):
        load_tokenizer(GGUFReader(p))
    p2 = tmp_path / "rwkv.gguf"
    with GGUFWriter(p2) as w:
        w.add("tokenizer.ggml.model", "rwkv")
        w.add("tokenizer.ggml.tokens", ["a"])
    with pytest.raises(TokenizerError, match="tokenizer model 'rwkv' is not supported"):
        load_tokenizer(GGUFReader(p2))
    p3 = tmp_path / "huge-token.gguf"  # (issue 39) a 16 MiB special token cost 1.4 GiB to build
    with GGUFWriter(p3) as w:
        w.add("tokenizer.ggml.model", "gpt2")
        w.add("tokenizer.ggml.tokens", ["a", "b", "x" * (1 << 24)])
        w.add("tokenizer.ggml.token_type", [1, 1, 3])
    with pytest.raises(TokenizerError, match="token 2 is 16777216 characters long; a vocabulary's tokens are at most"):
        load_tokenizer(GGUFReader(p3))


def _gemma4_vocab() -> tuple[list[str], list[str], list[int]]:
    """A small vocabulary as Gemma 4's files have theirs: specials, the 256 byte tokens, pieces
    with ▁ for spaces built by merges, and newline runs that are tokens with no merge."""
    tokens, types = ["<pad>", "<eos>", "<bos>", "<unk>"], [3, 3, 3, 2]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    chars = list("abcdefghijklmnopqrstuvwxyz.,'") + ["▁", "\n"]
    merges = []
    for w in ["▁t", "he", "▁the", "▁c", "at", "▁cat", "▁s", "▁sat", "in", "▁in", "▁o", "on", "▁on", "▁m", "▁mat",
              "er", "ing", "▁a", "▁an", "▁and"]:
        for k in range(len(w) - 1, 0, -1):
            a, b = w[:k], w[k:]
            if (a in chars or a in tokens) and (b in chars or b in tokens):
                merges.append(f"{a} {b}")
                chars.append(w)
                break
    tokens += chars + ["\n\n", "\n\n\n"]  # newline runs: tokens without merges, as in Gemma 4's vocabulary
    types += [1] * (len(chars) + 2)
    return tokens, merges, types


GEMMA4_TEXTS = ["the cat sat on the mat", " the cat", "a\n\nb", "\n\n\nthe", "café and crème", "Hello, World.",
                "in\n\n\n\nthe", "the  cat\n", "naïve 日本"]


def test_gemma4_tokenizer_equals_live_llama_cpp(tmp_path):
    """tokenizer.ggml.model "gemma4": llama.cpp's tokens for the same file and texts (spaces as
    ▁, byte fallback, newline runs), BOS always added, and the text back on decoding."""
    try:
        import llama_cpp
    except ImportError:
        no_llama_cpp()
    s = spec("qwen2")
    base = tmp_path / "tiny.gguf"
    write_gguf(s, random_model(s), base, "Q8_0")
    tokens, merges, types = _gemma4_vocab()
    path = copy_gguf(base, tmp_path / "tiny-gemma4-vocab.gguf", metadata={
        "tokenizer.ggml.model": "gemma4", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges, "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.padding_token_id": 0, "tokenizer.ggml.add_bos_token": False, "tokenizer.ggml.pre": "gemma4"})
    ours = load_tokenizer(GGUFReader(path))
    ref = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    for text in GEMMA4_TEXTS:
        ids = encode(ours, text)
        assert ids == ref.tokenize(text.encode(), add_bos=True, special=True), text
        assert ids[0] == 2 and ours.decode(ids[1:]) == text
    assert encode(ours, "\n\n", add_special=False) == [tokens.index("\n\n")]


def test_gemma4_turn_and_tool_response_end_generation(tmp_path):
    """Gemma 4 ends a turn with <turn|> and hands over to a tool with <|tool_response>: both
    stop a reply, as in llama.cpp's EOG list (its files' EOS is <eos>)."""
    from gguf_serve.engine import load_model
    from gguf_serve.engine.text import end_of_generation_ids

    s = spec("gemma4")
    path = tmp_path / "tiny-gemma4.gguf"
    write_gguf(s, random_model(s), path, "Q8_0", extra_tokens=("<|turn>", "<turn|>", "<|tool_response>"))
    lm = load_model(str(path), device="cpu")
    to_id = lm.tokenizer.backend_tokenizer.token_to_id
    ends = end_of_generation_ids(lm)
    assert {to_id("<turn|>"), to_id("<|tool_response>")} <= ends and to_id("<|turn>") not in ends
