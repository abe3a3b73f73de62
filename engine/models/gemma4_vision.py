"""Gemma 4's vision tower and embedder, as llama.cpp's converter writes them into the
model's one mmproj file beside the audio tower (`clip.vision.projector_type` "gemma4v",
conversion/gemma.py Gemma4VisionAudioModel), run as llama.cpp's mtmd runs them
(tools/mtmd/models/gemma4v.cpp):

- the image resized, its aspect kept, to multiples of patch x pooling (3 x 16 = 48
  pixels) within 70 to 1,120 tokens (bicubic, centred on black where the rounding
  leaves a margin), pixels in [-1, 1];
- the patch embedding as a matrix (no bias), plus two learned position tables, one
  read at each patch's column and one at its row;
- pre-norm layers with RMS norms: q/k norms per head, values RMS-normalized without a
  weight, 2-D rotary (NeoX halves: the first half of each head turned by the column,
  the second by the row, base 100), no 1/sqrt(d) score scale, norms after attention and
  MLP, a gated MLP (quick GELU, as llama.cpp runs it: `ACTIVATIONS`), and each layer's output scaled (`out_scale`);
- the pooler: each 3 x 3 block of patches averaged, times sqrt(width); where the file has
  them, (x - std_bias) * std_scale; then an RMS norm and the projection to the text
  model's width. Every matrix may carry clamps (Gemma4ClippableLinear: `.input_min`,
  `.input_max`, `.output_min`, `.output_max` scalars), applied around its product.

In the text model an image is `<|image>`, its tokens, `<image|>` (the template writes
`<|image|>` where the image goes). Its tokens see each other both ways in the sliding
layers, except in E2B and E4B (text width 1,536 or 2,560), which stay causal, as
llama.cpp decides (mtmd_decode_use_non_causal)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ...gguf_io import Keys
from .audio import rms
from .vision import ImagePlan, VisionMetadata, VisionParams, patch_linear

PROJECTOR = "gemma4v"
TEXT_ARCHITECTURES = ("gemma4",)
TEMPLATE_MARK = "<|image|>"  # what Gemma 4's chat template writes for an image part
IMAGE_TOKEN = "<|image|>"
BIDIRECTIONAL = True  # an image goes in one batch (its tokens see each other in the sliding layers: gemma4.py)
MROPE = False
ROPE_THETA = 100.0
DEFAULT_POOL = 3  # pooling_kernel_size
MIN_TOKENS, MAX_TOKENS = 70, 1120  # llama.cpp's bounds on an image's tokens
MAX_TOKENS_LOW = 280  # detail "low": transformers' default soft-token budget for Gemma 4


def expand(n_tokens: int) -> str:
    """The text an image mark becomes (Gemma 4's processor and mtmd: boi, tokens, eoi)."""
    return f"<|image>{IMAGE_TOKEN * n_tokens}<image|>"


# the MLP's gate activation as clip.cpp picks it: clip.use_gelu, clip.use_silu, else quick GELU
# (the converter writes neither for Gemma 4, so llama.cpp gates with x sigmoid(1.702 x), not
# transformers' tanh GELU: we run what llama-server runs)
ACTIVATIONS = {"gelu": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu,
               "gelu_quick": lambda x: x * torch.sigmoid(1.702 * x)}


@dataclass
class Params(VisionParams):
    pool: int
    act: str

    @staticmethod
    def read(m: VisionMetadata, c: dict) -> dict:
        gelu, silu = m.get(Keys.CLIP_USE_GELU, False), m.get(Keys.CLIP_USE_SILU, False)
        act = "gelu" if gelu else "silu" if silu else "gelu_quick"
        return dict(pool=m.get(Keys.VISION_PROJECTOR_SCALE_FACTOR, DEFAULT_POOL), act=act)

    @property
    def align(self) -> int:
        return self.patch_size * self.pool


def preserved_size(width: int, height: int, align: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(width, height) an image is resized to: multiples of `align`, the area within the
    bounds, the aspect kept (llama.cpp's calc_size_preserved_ratio, float32 as it computes)."""
    f = float(align)
    rnd = lambda x: math.floor(x / f + 0.5) * align  # noqa: E731  (std::round: halves away from zero)
    w, h = max(align, rnd(width)), max(align, rnd(height))
    if w * h > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h, w = max(align, math.floor(height / beta / f) * align), max(align, math.floor(width / beta / f) * align)
    elif w * h < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * beta / f) * align, math.ceil(width * beta / f) * align
    return w, h


class Clamped:
    """A matrix with Gemma4ClippableLinear's optional clamps around its product."""

    def __init__(self, w, name: str, out: int, inp: int):
        self.linear = w.linear(f"{name}.weight", out, inp, bias=f"{name}.bias")
        scalar = lambda s, d: float(w.vector(f"{name}.{s}").reshape(-1)[0]) if w.has(f"{name}.{s}") else d  # noqa: E731
        self.inp = (scalar("input_min", None), scalar("input_max", None))
        self.out = (scalar("output_min", None), scalar("output_max", None))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.inp != (None, None):
            x = x.clamp(*self.inp)
        y = self.linear(x)
        return y.clamp(*self.out) if self.out != (None, None) else y


def _rotate_halves(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX rotary on each half of the heads' dims: (n, heads, d); cos/sin (n, d/2) per half,
    the column's angles in the first quarter-pairs, the row's in the second."""
    d = x.shape[-1]
    out = []
    for part, c, s in ((x[..., :d // 2], cos[0], sin[0]), (x[..., d // 2:], cos[1], sin[1])):
        q = part.shape[-1] // 2
        rotated = torch.cat([-part[..., q:], part[..., :q]], dim=-1)
        out.append(part * c[:, None] + rotated * s[:, None])
    return torch.cat(out, dim=-1)


class Layer:
    def __init__(self, w, i: int, p: Params):
        b, h = f"v.blk.{i}.", p.hidden
        head = h // p.n_heads
        self.ln1, self.ln2 = w.vector(b + "ln1.weight", h), w.vector(b + "ln2.weight", h)
        self.q, self.k, self.v = (Clamped(w, b + n, h, h) for n in ("attn_q", "attn_k", "attn_v"))
        self.o = Clamped(w, b + "attn_out", h, h)
        self.q_norm, self.k_norm = w.vector(b + "attn_q_norm.weight", head), w.vector(b + "attn_k_norm.weight", head)
        self.post_attn = w.vector(b + "attn_post_norm.weight", h)
        self.post_ffn = w.vector(b + "ffn_post_norm.weight", h)
        self.gate, self.up = Clamped(w, b + "ffn_gate", p.ffn, h), Clamped(w, b + "ffn_up", p.ffn, h)
        self.down = Clamped(w, b + "ffn_down", h, p.ffn)
        self.scale = w.vector(b + "out_scale.weight") if w.has(b + "out_scale.weight") else None
        self.heads, self.eps, self.act = p.n_heads, p.eps, ACTIVATIONS[p.act]

    def __call__(self, x: torch.Tensor, cos, sin) -> torch.Tensor:
        n, d = x.shape
        h = rms(x, self.ln1, self.eps)
        q = rms(self.q(h).view(n, self.heads, -1), self.q_norm, self.eps)
        k = rms(self.k(h).view(n, self.heads, -1), self.k_norm, self.eps)
        v = rms(self.v(h).view(n, self.heads, -1), None, self.eps)
        q, k = _rotate_halves(q, cos, sin), _rotate_halves(k, cos, sin)
        a = F.scaled_dot_product_attention(*(t.transpose(0, 1)[None] for t in (q, k, v)), scale=1.0)
        x = x + rms(self.o(a[0].transpose(0, 1).reshape(n, d)), self.post_attn, self.eps)
        h = rms(x, self.ln2, self.eps)
        x = x + rms(self.down(self.act(self.gate(h)) * self.up(h)), self.post_ffn, self.eps)
        return x * self.scale if self.scale is not None else x


class Tower:
    """image -> (tokens, text width) embeddings."""

    def __init__(self, p: Params, w):
        self.p = p
        self.patch = patch_linear(w, "v.patch_embd", p.hidden, p.patch_size, bias=False)
        info = w.info("v.position_embd.weight")
        if len(info.shape) != 3 or info.shape[0] != 2 or info.shape[2] != p.hidden:
            raise ValueError(f"{w.reader.path}: v.position_embd.weight {tuple(info.shape)} is not two "
                             f"{p.hidden}-wide position tables")
        self.tables = w.dense("v.position_embd.weight", tuple(info.shape))  # (2: columns, rows; positions; width)
        self.layers = [Layer(w, i, p) for i in range(p.n_layers)]
        self.std = ((w.vector("v.std_bias"), w.vector("v.std_scale")) if w.has("v.std_bias") and w.has("v.std_scale")
                    else None)
        self.proj = Clamped(w, "mm.input_projection", p.projection_dim, p.hidden)
        head = p.hidden // p.n_heads
        self.inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, head // 2, 2, dtype=torch.float32) / (head // 2)))

    # ------------------------------------------------------------ images

    def _size(self, width: int, height: int, detail: str) -> tuple[int, int]:
        p = self.p
        area = p.align * p.align
        most = MAX_TOKENS_LOW if detail == "low" else MAX_TOKENS
        return preserved_size(width, height, p.align, MIN_TOKENS * area, most * area)

    def n_tokens(self, width: int, height: int, detail: str = "auto") -> int:
        w, h = self._size(width, height, detail)
        return (w // self.p.align) * (h // self.p.align)

    def plan(self, image, detail: str = "auto") -> ImagePlan:
        """The image fitted into its size (aspect kept, bicubic, centred on black), in [-1, 1]."""
        from PIL import Image  # deferred: Pillow only where images are used

        p = self.p
        w, h = self._size(image.width, image.height, detail)
        rgb = image.convert("RGB")
        if rgb.size != (w, h):  # llama.cpp's PAD_CEIL: the largest fit, rounded up, centred
            scale = min(w / rgb.width, h / rgb.height)
            nw, nh = min(math.ceil(rgb.width * scale), w), min(math.ceil(rgb.height * scale), h)
            canvas = Image.new("RGB", (w, h))
            canvas.paste(rgb.resize((nw, nh), Image.Resampling.BICUBIC), ((w - nw) // 2, (h - nh) // 2))
            rgb = canvas
        a = torch.from_numpy(np.asarray(rgb, dtype=np.float32) / 255.0)
        mean, std = torch.tensor(p.mean), torch.tensor(p.std)
        pixels = ((a - mean) / std * 2.0 - 1.0).permute(2, 0, 1).contiguous()
        rows, cols = h // p.align, w // p.align
        return ImagePlan(pixels, rows * cols, grid=(rows, cols))

    # ------------------------------------------------------------ forward

    def encode_steps(self, plan: ImagePlan):
        p = self.p
        rows, cols = plan.grid[0] * p.pool, plan.grid[1] * p.pool  # patches
        idx = torch.arange(rows * cols)
        px, py = idx % cols, idx // cols
        tables = self.tables.float()
        x = self.patch(plan.pixels) + tables[0][px] + tables[1][py]
        angles = [pos[:, None].float() * self.inv_freq for pos in (px, py)]
        cos = [torch.cat([a, a], -1).cos() for a in angles]
        sin = [torch.cat([a, a], -1).sin() for a in angles]
        yield None
        for layer in self.layers:
            x = layer(x, cos, sin)
            yield None
        grid = x.T.reshape(1, p.hidden, rows, cols)
        x = F.avg_pool2d(grid, p.pool, p.pool).flatten(2)[0].T * math.sqrt(p.hidden)  # row-major over the pooled grid
        if self.std is not None:
            x = (x - self.std[0]) * self.std[1]
        yield self.proj(rms(x, None, p.eps))


def build(p: Params, w) -> Tower:
    return Tower(p, w)
