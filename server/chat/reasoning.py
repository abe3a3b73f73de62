"""Reasoning ("thinking") control and the split of generated text into reasoning and
answer. Precedence: the request (chat_template_kwargs.enable_thinking, then
reasoning_effort) over the server flag (--reasoning on/off) over the template's default."""

from __future__ import annotations

import logging

from ...engine import THINK_CLOSE, THINK_OPEN, held_back

log = logging.getLogger("gguf_serve.server")


def enable_thinking(request_kwargs: dict | None, reasoning_effort: str | None, server_flag: str) -> bool | None:
    """The enable_thinking value to pass to the template (None: leave its default)."""
    if request_kwargs and "enable_thinking" in request_kwargs:
        return bool(request_kwargs["enable_thinking"])
    if reasoning_effort is not None:
        return reasoning_effort != "none"
    if server_flag == "on":
        return True
    if server_flag == "off":
        return False
    return None


def starts_in_reasoning(prompt: str, markers: tuple[str, str] = (THINK_OPEN, THINK_CLOSE)) -> bool:
    """Whether the rendered prompt leaves a reasoning block open (Qwen3.5's templates do)."""
    i = prompt.rfind(markers[0])
    return i >= 0 and prompt.find(markers[1], i) < 0


class ReasoningSplitter:
    """Routes streamed text to (reasoning, content), holding back a partial tag. A marker
    in `breaks` (a tool call's opening) also ends the reasoning, and starts the content:
    a model that calls a tool without closing its reasoning block still calls it."""

    def __init__(self, in_reasoning: bool, enabled: bool = True, breaks: tuple[str, ...] = (),
                 markers: tuple[str, str] = (THINK_OPEN, THINK_CLOSE)):
        self.breaks, (self.open, self.close) = breaks, markers
        self.enabled = enabled
        self.in_reasoning = in_reasoning and enabled
        self.pending = ""
        self.seen_content = False
        self.strip_newlines = False  # newlines right after a tag belong to neither part

    def feed(self, text: str) -> tuple[str, str]:
        if not self.enabled:
            return "", text
        self.pending += text
        reasoning, content = [], []
        while self.pending:
            if self.strip_newlines:
                self.pending = self.pending.lstrip("\n")
                if not self.pending:
                    break
                self.strip_newlines = False
            tag = self.close if self.in_reasoning else self.open
            i = self.pending.find(tag)
            if self.in_reasoning:
                for b in self.breaks:
                    j = self.pending.find(b)
                    if j >= 0 and (i < 0 or j < i):
                        reasoning.append(self.pending[:j])
                        self.in_reasoning, self.pending = False, self.pending[j:]
                        break
                if not self.in_reasoning:
                    continue
            if i >= 0:
                before = self.pending[:i]
                if self.in_reasoning:
                    reasoning.append(before)
                    self.in_reasoning = False
                    self.pending = self.pending[i + len(tag):]
                    self.strip_newlines = True
                elif not self.seen_content and not before.strip():
                    self.in_reasoning = True  # a reasoning block opened by the model itself
                    self.pending = self.pending[i + len(tag):]
                    self.strip_newlines = True
                else:
                    content.append(self.pending)
                    self.pending = ""
                continue
            out = self.pending[: len(self.pending) - held_back(self.pending, [tag, *self.breaks]
                                                                 if self.in_reasoning else [tag])]
            self.pending = self.pending[len(out):]
            (reasoning if self.in_reasoning else content).append(out)
            break
        r, c = "".join(reasoning), "".join(content)
        if c.strip():
            self.seen_content = True
        return r, c

    def flush(self) -> tuple[str, str]:
        out, self.pending = self.pending, ""
        return (out, "") if self.in_reasoning else ("", out)
