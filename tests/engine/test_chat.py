"""Chat templates: the file's own (rendered by transformers' sandboxed Jinja) and the
per-architecture fallbacks."""

import pytest

from gguf_serve.engine import load_model
from gguf_serve.engine.chat import FALLBACK_TEMPLATES, render
from gguf_serve.engine.sampling import SamplingParams

from helpers import copy_gguf
from tiny_models import random_model, spec, write_gguf

QWEN_LIKE_TEMPLATE = (
    "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and not enable_thinking %}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)


@pytest.fixture(scope="module")
def tiny_with_template(tmp_path_factory):
    s = spec("qwen3")
    folder = tmp_path_factory.mktemp("chat")
    plain = folder / "plain.gguf"
    write_gguf(s, random_model(s), plain, "Q8_0")
    # a copy of the file with a chat template in its metadata
    return copy_gguf(plain, folder / "templated.gguf", metadata={"tokenizer.chat_template": QWEN_LIKE_TEMPLATE})


def test_file_template_is_used_and_takes_kwargs(tiny_with_template):
    lm = load_model(tiny_with_template, device="cpu")
    assert lm.chat_template == QWEN_LIKE_TEMPLATE
    msgs = [{"role": "user", "content": "hi"}]
    assert render(lm.tokenizer, lm.chat_template, msgs) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    off = render(lm.tokenizer, lm.chat_template, msgs, enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_generate_from_messages(tiny_with_template):
    lm = load_model(tiny_with_template, device="cpu")
    steps = list(lm.generate([{"role": "user", "content": "the cat"}],
                             SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)))
    ids = lm.tokenizer("<|im_start|>user\nthe cat<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    assert steps[-1].prompt_tokens == len(ids)
    assert ids[0] == lm.tokenizer.convert_tokens_to_ids("<|im_start|>")  # markup encodes to its special id


def test_gemma_fallback(gemma_path):
    lm = load_model(gemma_path, device="cpu")
    assert lm.chat_template == FALLBACK_TEMPLATES["gemma"]
    text = render(lm.tokenizer, lm.chat_template, [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}])
    assert text == ("<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
                    "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")


@pytest.mark.parametrize("name,expected", [
    ("chatml", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
    ("llama3", "<s><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"),
    ("llama2", "<s>[INST] hi [/INST]"),
])
def test_other_fallbacks_render(gemma_path, name, expected):
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), bos_token="<s>", eos_token="</s>")
    assert render(tok, FALLBACK_TEMPLATES[name], [{"role": "user", "content": "hi"}]) == expected
