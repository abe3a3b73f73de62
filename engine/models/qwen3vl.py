"""qwen3vl (Qwen3-VL 2B-32B, the language model of the file; llama.cpp's converter writes
it as qwen3's layers): qwen3 with interleaved multi-section rotary (`rope.dimension_sections`;
for text every section is at the token's position, so NeoX rotary over the whole head;
an image's tokens take (time, row, column) positions, RopePlan) and deepstack: its
mmproj tower (qwen35_vision) gives each image token the main embedding and one more per
deepstack layer, which the model adds to the image rows after its first layers
(base.Model, as llama.cpp's qwen3vl graph does)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...gguf_io import Keys
from ..modules import Weights
from . import llama
from .base import Model, standard_model
from .layers import Rope
from .params import Metadata

ARCHITECTURE = "qwen3vl"
CHAT_TEMPLATE_FALLBACK = "chatml"


def sections(m: Metadata, c: dict) -> dict:
    return dict(rope_sections=list(m.get(Keys.ROPE_DIMENSION_SECTIONS, [])))


@dataclass
class Params(llama.Params.member(neox=True, qk_norm="head", rank_softmax=True)):
    rope_sections: list[int] = field(default_factory=list)  # time, rows, columns (, unused)
    read = staticmethod(sections)


def build(p, w: Weights, ops) -> Model:
    rope = Rope.build(p.rope_theta, p.rope_dims, p.rope_scaling, neox=True, context_length=p.context_length)
    if any(p.rope_sections):
        rope = rope.with_sections(p.rope_sections)
    return standard_model(ops, w, p, [llama.layer(w, i, p, rope, ops) for i in range(p.n_layers)])
