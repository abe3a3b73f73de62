"""Generation: a prompt (ids, text or chat messages) in, a stream of Steps out.

Templating happens before it (engine.chat) and detokenization at its edge
(engine.text). The loop itself is the scheduler's (engine.scheduler): `generate()`
runs one request through it, which checks its cancel flag before every forward pass."""

from __future__ import annotations

import threading
from typing import Iterator

from .sampling import SamplingParams
from .scheduler import run_one
from .text import Step


def prompt_ids_for(lm, prompt, **template_kwargs) -> list[int]:
    """Token ids for a prompt given as ids, as text (BOS per the file), or as chat
    messages (rendered with the model's chat template, generation prompt added)."""
    if isinstance(prompt, str):
        from .tokenizer import encode

        return encode(lm.tokenizer, prompt)
    if prompt and isinstance(prompt[0], dict):
        from .chat import render, rendered_ids

        return rendered_ids(lm.tokenizer, render(lm.tokenizer, lm.chat_template, list(prompt), **template_kwargs))
    return [int(i) for i in prompt]


def generate(lm, prompt, params: SamplingParams | None = None,
             cancel: threading.Event | None = None, **template_kwargs) -> Iterator[Step]:
    """Stream a completion of `prompt`: token ids, a text, or chat messages. This is the
    scheduler (engine.scheduler) with one request: one sequence slot of the model's KV
    cache is held for the generation."""
    prompt_ids = prompt_ids_for(lm, prompt, **template_kwargs)
    return run_one(lm, prompt_ids, params or SamplingParams(), cancel)
