"""Generation: a prompt (ids, text or chat messages) in, a stream of Steps out.

Templating happens before it (engine.chat) and detokenization at its edge
(engine.text). The loop itself is the scheduler's (engine.scheduler): `generate()`
runs one request through it, which checks its cancel flag before every forward pass."""

from __future__ import annotations

import threading
from typing import Iterator

from .chat import prompt_ids, render
from .sampling import SamplingParams
from .scheduler import run_one
from .text import Step
from .tokenizer import encode
from .vision import template_media


def prompt_ids_for(lm, prompt, **template_kwargs) -> list[int]:
    """Token ids for a prompt given as ids, as text (BOS per the file), or as chat
    messages (rendered with the model's chat template, generation prompt added)."""
    return prompt_for(lm, prompt, **template_kwargs)[0]


def prompt_for(lm, prompt, **template_kwargs) -> tuple[list[int], dict]:
    """prompt_ids_for, and the media of chat messages by content key: parts
    {"type": "image", "image": <PNG, JPEG, WebP or GIF bytes>} and {"type": "audio",
    "audio": <WAV, MP3, FLAC bytes>, "format": optional} (with an mmproj file that takes them)."""
    if isinstance(prompt, str):
        return encode(lm.tokenizer, prompt), {}
    if prompt and isinstance(prompt[0], dict):
        messages, images = template_media(lm, list(prompt))
        return prompt_ids(lm, render(lm.tokenizer, lm.chat_template, messages, **template_kwargs), images)
    return [int(i) for i in prompt], {}


def generate(lm, prompt, params: SamplingParams | None = None, cancel: threading.Event | None = None,
             lora: tuple[tuple[int, float], ...] = (), **template_kwargs) -> Iterator[Step]:
    """Stream a completion of `prompt`: token ids, a text, or chat messages (which may
    hold images, see prompt_for), with the LoRA adapters `lora` ((adapter id, scale), ...)
    of those loaded (LoadedModel.load_adapter). This is the scheduler (engine.scheduler)
    with one request: one sequence slot of the model's KV cache is held for the generation."""
    ids, media = prompt_for(lm, prompt, **template_kwargs)
    return run_one(lm, ids, params or SamplingParams(), cancel, media=media, lora=tuple(lora))
