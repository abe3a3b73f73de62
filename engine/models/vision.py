"""What the vision towers share: the file's metadata (the same `Metadata` as text
files: clip keys have no `{arch}`), an image made ready for a tower (`ImagePlan`),
Pillow resizing and normalization, and the patch embedding as a matrix over the
image's unfolded patches (a strided convolution's weights, stored by the converter as
(out, channels, ph, pw), are that matrix's rows)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ...gguf_io import GGMLType, Keys
from ..modules import DenseLinear, GgufLinear, WeightError
from .params import FileParams, Metadata

VisionMetadata = Metadata


@dataclass
class VisionParams(FileParams):
    """What every tower's file states the same way (clip.vision.* keys); a family's Params
    adds its own fields (FileParams: each class reads its own)."""

    image_size: int
    patch_size: int
    hidden: int
    ffn: int
    n_layers: int
    n_heads: int
    eps: float
    projection_dim: int  # the text model's width
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @staticmethod
    def read(m: Metadata, c: dict) -> dict:
        return dict(image_size=m.get(Keys.VISION_IMAGE_SIZE), patch_size=m.get(Keys.VISION_PATCH_SIZE),
                    hidden=m.get(Keys.VISION_EMBEDDING_LENGTH), ffn=m.get(Keys.VISION_FEED_FORWARD_LENGTH),
                    n_layers=m.get(Keys.VISION_BLOCK_COUNT), n_heads=m.get(Keys.VISION_HEAD_COUNT),
                    eps=float(m.get(Keys.VISION_LAYERNORM_EPS, 1e-6)),
                    projection_dim=m.get(Keys.VISION_PROJECTION_DIM),
                    mean=tuple(m.get(Keys.VISION_IMAGE_MEAN)), std=tuple(m.get(Keys.VISION_IMAGE_STD)))


@dataclass
class ImagePlan:
    """An image as a tower takes it: normalized pixels (3, H, W) float32, how many
    tokens it becomes in the text model, and (for towers that need it) its grid of
    tokens (rows, columns)."""

    pixels: torch.Tensor
    n_tokens: int
    grid: tuple[int, int] | None = None
    extra: dict = field(default_factory=dict)


def resize_normalized(image, width: int, height: int, mean, std, resample: str = "bilinear") -> torch.Tensor:
    """A Pillow image as (3, height, width) float32: RGB, resized (bilinear or bicubic, as
    the family's transformers image processor does), scaled to [0, 1], normalized by
    mean and std."""
    from PIL import Image

    rgb = image.convert("RGB")
    if rgb.size != (width, height):
        rgb = rgb.resize((width, height), {"bilinear": Image.Resampling.BILINEAR,
                                           "bicubic": Image.Resampling.BICUBIC}[resample])
    a = np.asarray(rgb, dtype=np.float32) / 255.0
    a = (a - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)
    return torch.from_numpy(np.ascontiguousarray(a.transpose(2, 0, 1)))


class PatchEmbedding:
    """A strided convolution with kernel = stride = patch over (3, H, W) pixels, as
    one matrix product over the unfolded patches (row-major over the patch grid)."""

    def __init__(self, linear, patch: int):
        self.linear, self.patch = linear, patch

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        p = self.patch
        cols = torch.nn.functional.unfold(pixels[None].float(), p, stride=p)[0]  # (3 p p, n) in (c, y, x) order
        return self.linear(cols.T.contiguous())


def patch_linear(w, prefix: str, out: int, patch: int, channels: int = 3, weight: str = ".weight",
                 bias: bool = True) -> PatchEmbedding:
    """`{prefix}{weight}` (out, channels, patch, patch), with `{prefix}.bias` where the file
    has it and `bias` asks for it, as a PatchEmbedding (the matrix stays as stored: packed,
    or a view of the file for F32)."""
    name = prefix + weight
    info = w.info(name)
    if tuple(info.shape) != (out, channels, patch, patch):
        raise WeightError(f"{w.reader.path}: tensor {name!r} has shape {tuple(info.shape)}, "
                          f"expected {(out, channels, patch, patch)}")
    k = channels * patch * patch
    b = w.vector(prefix + ".bias", out) if bias and w.has(prefix + ".bias") else None
    if info.ggml_type == GGMLType.F32:
        return PatchEmbedding(DenseLinear(name, w.dense(name, tuple(info.shape)).reshape(out, k), b,
                                          native=w.native), patch)
    return PatchEmbedding(GgufLinear(name, w.packed(name).reshape(out, -1), info.ggml_type, k, out, b,
                                     settings=w.settings), patch)
