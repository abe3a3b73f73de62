"""Qwen3.5's vision tower and merger, as llama.cpp's converter writes them
(`clip.projector_type` "qwen3vl_merger", conversion/qwen3vl.py Qwen3VLVisionModel): a
ViT over 16x16 patches of an image resized to multiples of 32 (its own aspect, within
a pixel budget), a learned position table resampled (bilinear, corners aligned) to the
image's patch grid, 2-D rotary (rows and columns, a quarter of each head each), biased
fused q/k/v, a tanh-GELU MLP, then the merger: a LayerNorm, each 2x2 block of patches
concatenated, two matrices with an exact GELU between (`mm.0`, `mm.2`) to the text
model's width. Qwen3-VL's files (the same tower) add deepstack layers: after each of
them the patches go through a merger of their own (`v.deepstack.{i}`: LayerNorm, tanh
GELU), and an image token's embedding is the main one followed by those (the text
model adds them after its first layers: base.Model).

Patches run in merge-block order (each 2x2 block's four patches together), as
transformers' processor orders them. The temporal patch of two frames (`v.patch_embd.weight`
and `.weight.1`) sees one image twice, so its two halves add up.

In the text model an image's tokens take multi-section rotary positions: the first of
them at the text position t where the image starts, row and column added in their
sections, and the text after it goes on from t + max(rows, columns) (MROPE)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...gguf_io import Keys
from .vision import ImagePlan, VisionMetadata, VisionParams, patch_linear, resize_normalized

PROJECTOR = "qwen3vl_merger"
TEXT_ARCHITECTURES = ("qwen35", "qwen35moe", "qwen3vl", "qwen3vlmoe")
# what a chat template writes for an image part: Qwen's own the three tokens, others the pad alone
TEMPLATE_MARKS = ("<|vision_start|><|image_pad|><|vision_end|>", "<|image_pad|>")
TEMPLATE_MARK = TEMPLATE_MARKS[0]
IMAGE_TOKEN = "<|image_pad|>"
BIDIRECTIONAL = False
MROPE = True
ROPE_THETA = 10000.0  # the tower's 2-D rotary base (transformers' default, llama.cpp's constant)
# pixel budgets per `detail` (transformers' processor: 65,536 to 16,777,216 pixels; llama.cpp
# caps images lower by default): auto and high up to 1,003,520 pixels (~1000x1000), low 262,144
MIN_PIXELS = 65536
MAX_PIXELS = {"auto": 1003520, "high": 4194304, "low": 262144}


def expand(n_tokens: int) -> str:
    """The text an image mark becomes (Qwen's processor and mtmd: start, pads, end)."""
    return f"<|vision_start|>{IMAGE_TOKEN * n_tokens}<|vision_end|>"


@dataclass
class Params(VisionParams):
    merge: int
    min_pixels: int
    max_pixels: int
    deepstack: list[int]  # the layers whose output feeds a deepstack merger (Qwen3-VL)

    @staticmethod
    def read(m: VisionMetadata, c: dict) -> dict:
        flags = m.get(Keys.VISION_IS_DEEPSTACK_LAYERS, [])
        return dict(merge=m.get(Keys.VISION_SPATIAL_MERGE_SIZE, 2), deepstack=[i for i, f in enumerate(flags) if f],
                    min_pixels=m.get(Keys.VISION_IMAGE_MIN_PIXELS, MIN_PIXELS),
                    max_pixels=m.get(Keys.VISION_IMAGE_MAX_PIXELS, MAX_PIXELS["auto"]))

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The size Qwen's processor resizes an image to: each side a multiple of `factor`,
    the area within [min_pixels, max_pixels], the aspect kept as nearly as that allows."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"an image of {width}x{height} is too narrow (aspect over 200)")
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def merge_order(rows: int, cols: int, merge: int) -> torch.Tensor:
    """Raster patch indices in merge-block order (block row, block column, row in block, column in block)."""
    idx = torch.arange(rows * cols).view(rows // merge, merge, cols // merge, merge)
    return idx.permute(0, 2, 1, 3).reshape(-1)


class Block:
    def __init__(self, w, i: int, p: Params):
        b = f"v.blk.{i}."
        self.ln1 = (w.vector(b + "ln1.weight", p.hidden), w.vector(b + "ln1.bias", p.hidden))
        self.ln2 = (w.vector(b + "ln2.weight", p.hidden), w.vector(b + "ln2.bias", p.hidden))
        self.qkv = w.linear(b + "attn_qkv.weight", 3 * p.hidden, p.hidden, bias=b + "attn_qkv.bias")
        self.o = w.linear(b + "attn_out.weight", p.hidden, p.hidden, bias=b + "attn_out.bias")
        self.up = w.linear(b + "ffn_up.weight", p.ffn, p.hidden, bias=b + "ffn_up.bias")
        self.down = w.linear(b + "ffn_down.weight", p.hidden, p.ffn, bias=b + "ffn_down.bias")
        self.heads, self.eps = p.n_heads, p.eps

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        n, d = x.shape
        h = F.layer_norm(x, (d,), *self.ln1, self.eps)
        q, k, v = self.qkv(h).view(n, 3, self.heads, -1).unbind(1)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        a = F.scaled_dot_product_attention(*(t.transpose(0, 1)[None] for t in (q, k, v)))
        x = x + self.o(a[0].transpose(0, 1).reshape(n, d))
        h = F.layer_norm(x, (d,), *self.ln2, self.eps)
        return x + self.down(F.gelu(self.up(h), approximate="tanh"))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


class Tower:
    def __init__(self, p: Params, w):
        self.p = p
        ps, h = p.patch_size, p.hidden
        # the two frames of the temporal patch are the same image: the sum of both matrices' products
        # (each stays as stored; the bias rides with the first)
        self.patch = (patch_linear(w, "v.patch_embd", h, ps).linear,
                      patch_linear(w, "v.patch_embd", h, ps, weight=".weight.1", bias=False).linear)
        info = w.info("v.position_embd.weight")
        side = math.isqrt(info.shape[0])
        if len(info.shape) != 2 or side * side != info.shape[0] or info.shape[1] != h:
            raise ValueError(f"{w.reader.path}: v.position_embd.weight {tuple(info.shape)} is not a square grid "
                             f"of {h}-wide positions")
        self.table = w.dense("v.position_embd.weight", (side * side, h))  # a view of the file
        self.side = side
        self.blocks = [Block(w, i, p) for i in range(p.n_layers)]
        self.post_ln = (w.vector("v.post_ln.weight", h), w.vector("v.post_ln.bias", h))
        merged = h * p.merge * p.merge
        self.fc1 = w.linear("mm.0.weight", merged, merged, bias="mm.0.bias")
        self.fc2 = w.linear("mm.2.weight", p.projection_dim, merged, bias="mm.2.bias")
        ds = "v.deepstack.{}.{}".format
        self.deepstack = {i: (w.vector(ds(i, "norm.weight"), merged), w.vector(ds(i, "norm.bias"), merged),
                              w.linear(ds(i, "fc1.weight"), merged, merged, bias=ds(i, "fc1.bias")),
                              w.linear(ds(i, "fc2.weight"), p.projection_dim, merged, bias=ds(i, "fc2.bias")))
                          for i in p.deepstack}
        head = h // p.n_heads
        self.inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, head // 2, 2, dtype=torch.float32) / (head // 2)))

    # ------------------------------------------------------------ images

    def _size(self, width: int, height: int, detail: str) -> tuple[int, int]:
        """(height, width) the tower takes an image of this size at, for `detail`."""
        p = self.p
        budget = {"low": min(p.max_pixels, MAX_PIXELS["low"]), "high": max(p.max_pixels, MAX_PIXELS["high"])}
        return smart_resize(height, width, p.factor, p.min_pixels, budget.get(detail, p.max_pixels))

    def n_tokens(self, width: int, height: int, detail: str = "auto") -> int:
        """The tokens an image of this size takes (known from its header, before decoding)."""
        h, w = self._size(width, height, detail)
        return (h // self.p.patch_size) * (w // self.p.patch_size) // (self.p.merge * self.p.merge)

    def plan(self, image, detail: str = "auto") -> ImagePlan:
        p = self.p
        h, w = self._size(image.width, image.height, detail)
        pixels = resize_normalized(image, w, h, p.mean, p.std, resample="bicubic")
        rows, cols = h // p.patch_size, w // p.patch_size
        return ImagePlan(pixels, rows * cols // (p.merge * p.merge), grid=(rows // p.merge, cols // p.merge))

    # ------------------------------------------------------------ forward

    def encode_steps(self, plan: ImagePlan):
        p = self.p
        ps, m = p.patch_size, p.merge
        rows, cols = plan.grid[0] * m, plan.grid[1] * m
        order = merge_order(rows, cols, m)
        patches = F.unfold(plan.pixels[None].float(), ps, stride=ps)[0].T[order]  # (n, 3 ps ps), merge order
        x = self.patch[0](patches) + self.patch[1](patches)
        table = self.table.float().view(self.side, self.side, p.hidden).permute(2, 0, 1)[None]  # (1, h, side, side)
        pos = F.interpolate(table, size=(rows, cols), mode="bilinear", align_corners=True)
        x = x + pos[0].flatten(1).T[order]
        r, c = (order // cols).float(), (order % cols).float()
        fh, fw = r[:, None] * self.inv_freq, c[:, None] * self.inv_freq
        freqs = torch.cat([fh, fw, fh, fw], dim=-1)
        cos, sin = freqs.cos(), freqs.sin()
        yield None
        deep = []
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin)
            if i in self.deepstack:
                w, b, fc1, fc2 = self.deepstack[i]
                merged = F.layer_norm(x.reshape(-1, p.hidden * m * m), (p.hidden * m * m,), w, b, p.eps)
                deep.append(fc2(F.gelu(fc1(merged), approximate="tanh")))
            yield None
        x = F.layer_norm(x, (p.hidden,), *self.post_ln, p.eps).reshape(-1, p.hidden * m * m)
        yield torch.cat([self.fc2(F.gelu(self.fc1(x))), *deep], dim=1)


def build(p: Params, w) -> Tower:
    return Tower(p, w)
