"""Text at the edge of the token stream: a generation step as it is emitted (`Step`),
token ids back to text that never splits a character (`Detokenizer`), stop strings
held back until they cannot match (`StopStrings`, `held_back`), and the tokens that end
a generation. The scheduler emits Steps; nothing here runs the model."""

from __future__ import annotations

from dataclasses import dataclass


# <turn|> ends a Gemma 4 turn, and <|tool_response> is where Gemma 4 hands over to the tool
# after its calls (llama.cpp's EOG list has both)
END_OF_GENERATION_TEXTS = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>",
                           "<|endoftext|>", "</s>", "<|end_of_text|>", "<turn|>", "<|tool_response>")
HARMONY_ENDS = ("<|return|>", "<|call|>")


@dataclass
class Step:
    """One streamed step. `text` is new, complete text (never half a UTF-8 character);
    the last step carries `finish_reason` ("stop", "length" or "cancelled"). `index` is
    the choice (of a request with several); `cached_tokens` the prompt tokens taken from
    the prefix cache; `logprob` / `top_logprobs` come when the
    sampling parameters ask for them; `drafted_tokens` / `accepted_tokens` count the
    choice's speculative drafts so far and those its model confirmed."""

    token_id: int | None
    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    index: int = 0
    cached_tokens: int = 0  # prompt tokens the prefix cache supplied (not prefilled)
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    stop_sequence: str | None = None  # the stop string that ended it, where one did
    slot: int | None = None  # the KV cache slot the choice runs in (llama-server's id_slot)
    # a request that asked for it (Request.progress): while its prompt is processed, steps
    # without a token give (prompt tokens processed, of them from the prefix cache)
    progress: tuple[int, int] | None = None


class Detokenizer:
    """Incremental decoding: emits text only once it no longer ends in a partial
    character, decoding a small window so that leading-space rules stay right."""

    def __init__(self, tokenizer, prompt_ids: list[int], window: int = 6):
        self.tok = tokenizer
        self.ids = list(prompt_ids[-window:])
        self.prefix = 0
        self.read = len(self.ids)

    def _decode(self, ids) -> str:
        return self.tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        return self._emit(final=False)

    def flush(self) -> str:
        """The text held back at the end: bytes that never completed a character come out as
        U+FFFD (as llama-server sends them), not dropped with their tokens."""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        """The text the ids not yet emitted add (all of it when `final`, else only once it
        does not end in a partial character), and the window moved past them."""
        before = self._decode(self.ids[self.prefix:self.read])
        after = self._decode(self.ids[self.prefix:])
        if final or (len(after) > len(before) and not after.endswith("\ufffd")):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before):]
        return ""


def end_of_generation_ids(lm) -> set[int]:
    """The tokens that end `lm`'s generation: EOS and every end-of-turn token its vocabulary
    has, <|return|> and <|call|> (not <|end|>) for a harmony model (decided once, at load:
    engine.chat_format.end_ids)."""
    return set(lm.chat_format.end_ids)


def held_back(text: str, needles: list[str]) -> int:
    """Length of the longest end of `text` that may be the start of one of `needles`
    (streamed text must wait for the next piece before it can be emitted)."""
    hold = 0
    for needle in needles:
        for n in range(min(len(needle) - 1, len(text)), hold, -1):
            if text.endswith(needle[:n]):
                hold = n
                break
    return hold


class StopStrings:
    """Holds back text that may be the start of a stop string; cuts at a full match."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.matched: str | None = None  # the stop string found, once one is

    def feed(self, text: str) -> tuple[str, bool]:
        self.pending += text
        if not self.stops:
            out, self.pending = self.pending, ""
            return out, False
        found = [(i, s) for s in self.stops if (i := self.pending.find(s)) >= 0]
        if found:
            cut, self.matched = min(found, key=lambda f: f[0])
            out, self.pending = self.pending[:cut], ""
            return out, True
        out = self.pending[: len(self.pending) - held_back(self.pending, self.stops)]
        self.pending = self.pending[len(out):]
        return out, False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out
