"""Gemma 3's vision tower and projector, as llama.cpp's converter writes them
(`clip.projector_type` "gemma3", conversion/gemma.py Gemma3VisionModel): a SigLIP
encoder (patch embedding as a strided convolution, learned positions, pre-norm layers
with biased attention and a tanh-GELU MLP, a final LayerNorm) over a square image
resized to `image_size`, then the projector: average pooling of the patch grid by
`scale_factor` (4: 64x64 patches to 256 tokens), an RMSNorm (`1 + w` already added by
the converter) and a matrix to the text model's width.

In the text model the image's tokens attend to each other both ways (transformers'
token_type_ids mask, llama.cpp's non-causal image batch); the template's
`<start_of_image>` becomes the image's tokens between `<start_of_image>` and
`<end_of_image>`, with blank lines around them, as Gemma 3's processor writes it."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...gguf_io import Keys
from .vision import ImagePlan, VisionMetadata, VisionParams, patch_linear, resize_normalized

PROJECTOR = "gemma3"
TEXT_ARCHITECTURES = ("gemma3",)
DEFAULT_SCALE_FACTOR = 4  # llama.cpp's default: 64x64 patches pooled to 16x16 tokens
TEMPLATE_MARK = "<start_of_image>"  # what Gemma 3's chat template writes for an image part
IMAGE_TOKEN = "<image_soft_token>"
BIDIRECTIONAL = True  # an image's tokens attend to each other both ways in the text model (so go in one batch)
MROPE = False


def expand(n_tokens: int) -> str:
    """The text an image mark becomes (Gemma 3's processor: full_image_sequence)."""
    return f"\n\n<start_of_image>{IMAGE_TOKEN * n_tokens}<end_of_image>\n\n"


@dataclass
class Params(VisionParams):
    pool: int  # patches per token along each side

    @staticmethod
    def read(m: VisionMetadata, c: dict) -> dict:
        image, patch = c["image_size"], c["patch_size"]
        pool = m.get(Keys.VISION_PROJECTOR_SCALE_FACTOR, DEFAULT_SCALE_FACTOR)
        if image % patch or (image // patch) % pool:
            raise ValueError(f"{m.path}: image size {image}, patch {patch} and pooling {pool} do not make a whole grid")
        return dict(pool=pool)

    @property
    def side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def n_tokens(self) -> int:
        return (self.side // self.pool) ** 2


class EncoderLayer:
    def __init__(self, w, i: int, p: Params):
        b = f"v.blk.{i}."
        lin = lambda n, o, k: w.linear(f"{b}{n}.weight", o, k, bias=f"{b}{n}.bias")  # noqa: E731
        self.ln1 = (w.vector(b + "ln1.weight", p.hidden), w.vector(b + "ln1.bias", p.hidden))
        self.ln2 = (w.vector(b + "ln2.weight", p.hidden), w.vector(b + "ln2.bias", p.hidden))
        self.q, self.k, self.v = (lin(n, p.hidden, p.hidden) for n in ("attn_q", "attn_k", "attn_v"))
        self.o = lin("attn_out", p.hidden, p.hidden)
        self.up, self.down = lin("ffn_up", p.ffn, p.hidden), lin("ffn_down", p.hidden, p.ffn)
        self.heads, self.eps = p.n_heads, p.eps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        n, d = x.shape
        h = F.layer_norm(x, (d,), *self.ln1, self.eps)
        q, k, v = (m(h).view(n, self.heads, -1).transpose(0, 1)[None] for m in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v)[0].transpose(0, 1).reshape(n, d)
        x = x + self.o(a)
        h = F.layer_norm(x, (d,), *self.ln2, self.eps)
        return x + self.down(F.gelu(self.up(h), approximate="tanh"))


class Tower:
    """image -> (n_tokens, projection_dim) embeddings in the text model's space."""

    def __init__(self, p: Params, w):
        self.p = p
        self.patch = patch_linear(w, "v.patch_embd", p.hidden, p.patch_size)
        self.positions = w.dense("v.position_embd.weight", (p.side * p.side, p.hidden))  # a view of the file
        self.layers = [EncoderLayer(w, i, p) for i in range(p.n_layers)]
        self.post_ln = (w.vector("v.post_ln.weight", p.hidden), w.vector("v.post_ln.bias", p.hidden))
        self.soft_norm = w.vector("mm.soft_emb_norm.weight", p.hidden)
        # x @ proj, as transformers' projector has it; kept as stored (rows are inputs, so not a packed linear)
        self.proj = w.dense("mm.input_projection.weight", (p.hidden, p.projection_dim))

    # ------------------------------------------------------------ images

    def n_tokens(self, width: int, height: int, detail: str = "auto") -> int:
        """The tokens an image of this size takes: always the same (one resolution)."""
        return self.p.n_tokens

    def plan(self, image, detail: str = "auto") -> ImagePlan:
        """Gemma 3 takes one resolution: the image resized to image_size x image_size (`detail` has no choice)."""
        s = self.p.image_size
        return ImagePlan(resize_normalized(image, s, s, self.p.mean, self.p.std), self.p.n_tokens)

    # ------------------------------------------------------------ forward

    def encode_steps(self, plan: ImagePlan):
        """A generator: one encoder layer per step (yields None), then the embeddings."""
        p = self.p
        x = self.patch(plan.pixels) + self.positions.float()
        yield None
        for layer in self.layers:
            x = layer(x)
            yield None
        x = F.layer_norm(x, (p.hidden,), *self.post_ln, p.eps)
        side, k = p.side, p.pool
        grid = x.T.reshape(1, p.hidden, side, side)
        pooled = F.avg_pool2d(grid, k, k).flatten(2)[0].T  # (tokens, hidden), row-major over the pooled grid
        normed = pooled * torch.rsqrt(pooled.pow(2).mean(-1, keepdim=True) + p.eps) * self.soft_norm
        yield normed @ self.proj.float()


def build(p: Params, w) -> Tower:
    return Tower(p, w)
