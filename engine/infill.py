"""Fill-in-the-middle prompts, as llama-server builds them for /infill (and Ollama for
`suffix`): the file's FIM tokens (`tokenizer.ggml.fim_*_token_id`, else the vocabulary's
tokens of those names, as llama.cpp's vocabulary loader finds them), and the prompt

    [FIM_REP]myproject\\n [FIM_SEP]<file>\\n<chunk> ... [FIM_SEP]filename\\n
    [BOS] [FIM_PRE]<prefix><prompt> [FIM_SUF]<suffix> [FIM_MID]

with the prefix's last tokens and the suffix's first ones kept to fit a batch (3:1), the
repository chunks filling what the context leaves before it; `spm` puts the suffix
first. (llama-server reads special tokens' names in the prefix, suffix and chunks as
text; here they are those tokens, as in every other prompt.)"""

from __future__ import annotations

from ..gguf_io import GGUFReader

FIM_KINDS = ("pre", "suf", "mid", "pad", "rep", "sep")
# the token names llama.cpp's loader takes for each kind where the file names none
FIM_NAMES = {
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>",
            "<|prefix|>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>",
            "<|suffix|>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>",
            "<|middle|>"),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "sep": ("<|file_sep|>",),
}
CHUNK_MARK = "\n\n--- snippet ---\n\n"  # between repository chunks where the model has no FIM_SEP


class InfillError(ValueError):
    """The model has no fill-in-the-middle tokens."""


def fim_tokens(reader: GGUFReader, tokenizer) -> dict[str, int | None]:
    """The FIM token of each kind (None: the model has none), read once per tokenizer."""
    cached = getattr(tokenizer, "_gguf_serve_fim", None)
    if cached is not None:
        return cached
    vocab = None
    out: dict[str, int | None] = {}
    for kind in FIM_KINDS:
        value = reader.metadata.get(f"tokenizer.ggml.fim_{kind}_token_id")
        if value is None:
            vocab = vocab if vocab is not None else tokenizer.get_vocab()
            value = next((vocab[n] for n in FIM_NAMES[kind] if n in vocab), None)
        out[kind] = int(value) if value is not None else None
    tokenizer._gguf_serve_fim = out
    return out


def can_infill(reader: GGUFReader, tokenizer) -> bool:
    t = fim_tokens(reader, tokenizer)
    return all(t[k] is not None for k in ("pre", "suf", "mid"))


def infill_ids(lm, prefix: str, suffix: str, extra: list[dict] | None = None, prompt: list[int] | None = None,
               n_batch: int = 2048, n_predict: int = -1, spm: bool = False) -> list[int]:
    """The token ids of a fill-in-the-middle prompt (module docstring) for `lm`."""
    tok = lm.tokenizer
    fim = fim_tokens(lm.gguf, tok)
    if not can_infill(lm.gguf, tok):
        raise InfillError("this model has no fill-in-the-middle tokens (FIM prefix, suffix and middle)")

    def text(s: str) -> list[int]:
        return tok.backend_tokenizer.encode(s, add_special_tokens=False).ids

    prompt = list(prompt or [])
    pre, suf = text(prefix), text(suffix)
    repo: list[int] = []
    if fim["rep"] is not None:
        repo += [fim["rep"], *text("myproject\n")]
    for chunk in extra or []:
        if fim["sep"] is not None:
            repo += [fim["sep"], *text(chunk.get("filename", "tmp") + "\n")]
        else:
            repo += text(CHUNK_MARK)
        repo += text(chunk.get("text", ""))
    if fim["sep"] is not None:
        repo += [fim["sep"], *text("filename\n")]
    take_pre = min(len(pre), 3 * (n_batch // 4))
    take_suf = min(len(suf), max(0, n_batch // 4 - (2 + len(prompt))))
    take_repo = min(max(0, lm.n_ctx - n_batch - 2 * n_predict), len(repo))
    head = [fim["pre"], *pre[len(pre) - take_pre:], *prompt]
    tail = [fim["suf"], *suf[:take_suf]]
    first, second = (tail, head) if spm else (head, tail)
    if tok.add_bos_token and tok.bos_token_id is not None:
        first = [tok.bos_token_id, *first]
    return [*repo[len(repo) - take_repo:], *first, *second, fim["mid"]]

