"""A prompt's media (images and audio clips) and where their tokens go.

An image or a clip in a prompt is a run of its tokens, each a negative id that names
its content hash and the token's place in it (`batch.media_token`): the prefix cache
compares prompts id by id, so a later prompt with the same media at the same place
reuses its cached state, and different media never match. The ids the tokenizer gave
those places (the family's image or audio token) never reach the model: the batch
carries the media's embeddings for them (`Batch.media`).

The chat template writes a mark where each media part goes (its family's
`TEMPLATE_MARK`); `MediaPrompts` turns the marks into the family's text around a run
of media tokens (`expand`) and the prompt into ids. Where the vocabulary has the
family's media token, the prompt is tokenized whole and the token runs replaced (as
the family's processor does); else the text around each media run is tokenized on
its own (as llama.cpp's mtmd does)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from .batch import media_token
from .errors import MediaError
from .tokenizer import rendered_ids


@dataclass(eq=False)
class PromptMedia:
    """One image or clip of a prompt: what its tower takes (`plan`: an ImagePlan or an
    AudioPlan), its content key, its embeddings once encoded. `both_ways`: its tokens go
    in one batch and see each other (in the layers the family says); else they are read
    causally, in as many chunks as the prompt's chunking makes."""

    plan: Any
    key: int
    kind: str = "image"
    both_ways: bool = True
    embeddings: torch.Tensor | None = None

    @property
    def n_tokens(self) -> int:
        return self.plan.n_tokens


@dataclass
class MediaKind:
    """A kind of media a model takes: its family (the tower's file), the family's token
    and that token's id in the text model's vocabulary (None where it has none)."""

    name: str  # "image" or "audio"
    family: ModuleType
    token: str
    token_id: int | None = None

    @property
    def marks(self) -> tuple[str, ...]:
        """What the chat template writes for a part of this kind (a family may know several
        forms: Qwen2-Audio's own template writes the begin and end tokens around its token)."""
        return getattr(self.family, "TEMPLATE_MARKS", (self.family.TEMPLATE_MARK,))


def token_id(tokenizer, token: str) -> int | None:
    """The vocabulary's id of `token` where it is one token of its own, else None."""
    tid = tokenizer.convert_tokens_to_ids(token)
    if tid is None or tid == tokenizer.unk_token_id or tokenizer.convert_ids_to_tokens(tid) != token:
        return None
    return tid


class MediaPrompts:
    """The prompt side of a model's media: `kinds` by name ("image", "audio"), bound to
    the text model's tokenizer (`bind_kinds`)."""

    kinds: dict[str, MediaKind]
    tokenizer: Any

    def bind_kinds(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        for kind in self.kinds.values():
            kind.token_id = token_id(tokenizer, kind.token)

    def _split(self, text: str, items: list[PromptMedia]) -> list[str]:
        """The text between the template's marks, checked against the media given (their
        number and, mark by mark, their kind)."""
        marks = {mark: k.name for k in self.kinds.values() for mark in k.marks}
        found = list(re.finditer("|".join(re.escape(m) for m in sorted(marks, key=len, reverse=True)), text))
        if len(found) != len(items):
            words = " or ".join(sorted(self.kinds))
            raise MediaError(f"the chat template placed {len(found)} {words} part(s) for {len(items)} given")
        parts, at = [], 0
        for k, (m, item) in enumerate(zip(found, items)):
            if marks[m.group()] != item.kind:
                raise MediaError(f"media part {k}: the template placed a {marks[m.group()]} where an {item.kind} is")
            parts.append(text[at:m.start()])
            at = m.end()
        return parts + [text[at:]]

    def expand(self, text: str, items: list[PromptMedia]) -> str:
        """The rendered prompt with each mark replaced by its media's token run."""
        parts = self._split(text, items)
        out = [parts[0]]
        for item, rest in zip(items, parts[1:]):
            out += [self.kinds[item.kind].family.expand(item.n_tokens), rest]
        return "".join(out)

    def rendered_ids(self, text: str, items: list[PromptMedia]) -> list[int]:
        """A rendered chat prompt's ids with its media tokens in place."""
        if all(self.kinds[i.kind].token_id is not None for i in items):
            return self.prompt_ids(rendered_ids(self.tokenizer, self.expand(text, items)), items)
        parts = self._split(text, items)  # the text between media tokenized piece by piece
        ids, pending = [], parts[0]
        for item, rest in zip(items, parts[1:]):
            kind = self.kinds[item.kind]
            before, after = kind.family.expand(item.n_tokens).split(kind.token * item.n_tokens)
            ids += rendered_ids(self.tokenizer, pending + before)
            ids += [media_token(item.key, j) for j in range(item.n_tokens)]
            pending = after + rest
        return ids + rendered_ids(self.tokenizer, pending)

    def prompt_ids(self, ids: list[int], items: list[PromptMedia]) -> list[int]:
        """Token ids of an expanded prompt with each media's run of its kind's token
        replaced by its media tokens (MediaError where the runs do not match the media)."""
        tokens = {k.token_id: k.name for k in self.kinds.values() if k.token_id is not None}
        out, k, i = list(ids), 0, 0
        while i < len(out):
            if out[i] not in tokens:
                i += 1
                continue
            if k >= len(items):
                raise MediaError(f"the prompt holds more {tokens[out[i]]} tokens than the media given")
            item = items[k]
            tid = self.kinds[item.kind].token_id
            run = out[i:i + item.n_tokens]
            if out[i] != tid or len(run) != item.n_tokens or any(t != tid for t in run):
                raise MediaError(f"media part {k} ({item.kind}): its {item.n_tokens} tokens are not one run "
                                 "in the prompt")
            out[i:i + item.n_tokens] = [media_token(item.key, j) for j in range(item.n_tokens)]
            i += item.n_tokens
            k += 1
        if k != len(items):
            raise MediaError(f"the prompt placed {k} of {len(items)} media parts")
        return out
