"""qwen3vl (Qwen3-VL 2B-32B, the language model of the file; llama.cpp's converter writes
it as qwen3's layers): qwen3 with interleaved multimodal rotary sections, which for text
(every section at the token's position) are NeoX rotary over the whole head, and deepstack
inputs that only images add. Text only here: a file with images needs its mmproj tower,
which this architecture does not read yet."""

from __future__ import annotations

from . import llama

ARCHITECTURE = "qwen3vl"
CHAT_TEMPLATE_FALLBACK = "chatml"

Params = llama.Params.member(neox=True, qk_norm="head", rank_softmax=True)
build = llama.build
