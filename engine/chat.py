"""Chat templates: the file's `tokenizer.chat_template`, or a documented fallback per
architecture where a file has none (the Gemma 3 270M file has none). Rendering is
transformers' `apply_chat_template` (sandboxed Jinja). A rendered prompt's ids:
tokenizer.rendered_ids; the template's media parts: vision.template_media."""

from __future__ import annotations

from ..gguf_io import GGUFReader, Keys
from .tokenizer import rendered_ids

FALLBACK_TEMPLATES = {
    # Gemma: no system role; a system message is prefixed to the first user turn.
    "gemma": (
        "{{ bos_token }}"
        "{% if messages and messages[0]['role'] == 'system' %}"
        "{% set first = messages[0]['content'] + '\n\n' %}{% set rest = messages[1:] %}"
        "{% else %}{% set first = '' %}{% set rest = messages %}{% endif %}"
        "{% for m in rest %}"
        "{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
        "{{ '<start_of_turn>' + role + '\n' + ((first if loop.first else '') + m['content']) | trim + '<end_of_turn>\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
    ),
    "chatml": (
        "{% for m in messages %}"
        "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    ),
    "llama3": (
        "{{ bos_token }}"
        "{% for m in messages %}"
        "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] | trim + '<|eot_id|>' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
    ),
    "llama2": (
        "{% for m in messages %}"
        "{% if m['role'] == 'user' %}{{ bos_token + '[INST] ' + m['content'] | trim + ' [/INST]' }}"
        "{% elif m['role'] == 'assistant' %}{{ ' ' + m['content'] | trim + eos_token }}"
        "{% elif m['role'] == 'system' %}{{ '<<SYS>>\n' + m['content'] | trim + '\n<</SYS>>\n\n' }}"
        "{% endif %}"
        "{% endfor %}"
    ),
}


def fallback_name(reader: GGUFReader, arch) -> str:
    if arch.chat_template_fallback:
        return arch.chat_template_fallback
    tokens = reader.metadata.get(Keys.TOKENIZER_TOKENS) or []
    if "<|start_header_id|>" in tokens:
        return "llama3"
    if "<|im_start|>" in tokens:
        return "chatml"
    return "llama2"


def chat_template_for(reader: GGUFReader, arch, override: str | None = None) -> str:
    """The template a model renders chats with: `override` (Jinja text, or the name of a
    built-in: FALLBACK_TEMPLATES), else the file's, else its architecture's fallback."""
    if override:
        if override in FALLBACK_TEMPLATES:
            return FALLBACK_TEMPLATES[override]
        if "{{" not in override and "{%" not in override:
            raise ValueError(f"chat template {override!r}: neither Jinja nor a built-in's name "
                             f"({', '.join(FALLBACK_TEMPLATES)})")
        return override
    template = reader.metadata.get(Keys.CHAT_TEMPLATE)
    if template:
        return template
    return FALLBACK_TEMPLATES[fallback_name(reader, arch)]


def render(tokenizer, template: str, messages: list[dict], *, add_generation_prompt: bool = True, **kwargs) -> str:
    """The chat prompt; with `continue_final_message`, the last (assistant) message is left
    open for the reply to go on from (a prefill) instead of a new turn being started."""
    if kwargs.get("continue_final_message"):
        add_generation_prompt = False
    return tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                         add_generation_prompt=add_generation_prompt, **kwargs)


def prompt_ids(lm, text: str, images: list) -> tuple[list[int], dict]:
    """A rendered chat prompt's ids with its images in place (their runs of media tokens),
    and the images by content key, as the scheduler's Request takes them."""
    if not images:
        return rendered_ids(lm.tokenizer, text), {}
    return lm.vision.rendered_ids(text, images), {img.key: img for img in images}
