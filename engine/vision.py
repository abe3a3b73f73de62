"""Images in: a vision file (llama.cpp's `mmproj` GGUF: `general.architecture` "clip",
`clip.projector_type` naming the tower) loaded beside its text model, images decoded
with Pillow within limits, and the prompt's image tokens.

An image in a prompt is a run of its tokens, each a negative id that names the image's
content hash and the token's place in the image (`batch.media_token`): the prefix cache
compares prompts id by id, so a later prompt with the same image at the same place
reuses its cached state, and a different image never matches. The ids the tokenizer
gave those places (the family's image token) never reach the model: the batch carries
the image's embeddings for them (`Batch.media`).

The tower runs an encoder layer per scheduler step (`encode_steps`), so that streams
decoding beside a request with an image wait at most one layer per step; encoded
images are kept (least recently used dropped) so that a follow-up about the same image
does not encode it again even where the prefix cache no longer holds it."""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
from collections import OrderedDict
from dataclasses import dataclass
from types import ModuleType

import torch

from ..gguf_io import GGUFError, GGUFReader, Keys
from .batch import KEY_BITS, media_of, media_token
from .kernels import KernelSettings
from .kernels.cpu import has_native_bf16
from .models import projectors
from .models.vision import ImagePlan, VisionMetadata
from .modules import Weights
from .tokenizer import rendered_ids
from .errors import ImageError, VisionFileError

log = logging.getLogger("gguf_serve.engine")

MAX_IMAGE_BYTES = 20 << 20  # an image's encoded size
MAX_IMAGE_PIXELS = 40_000_000  # width x height once decoded (Pillow's bomb check warns at ~89M)
FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
KEEP_ENCODED = 16  # encoded images kept for follow-ups


MEDIA_TYPES = {"PNG": ("image/png",), "JPEG": ("image/jpeg", "image/jpg"), "WEBP": ("image/webp",),
               "GIF": ("image/gif",)}


@dataclass(frozen=True)
class ImageHeader:
    """What an image's header says, before any pixel is decoded."""

    format: str
    width: int
    height: int


def _open(data: bytes, max_bytes: int, max_pixels: int, media_type: str | None):
    """The image opened lazily (its header read, nothing decoded), within the limits and of
    the media type the caller was told (a data URL's), if any."""
    from PIL import Image  # deferred: Pillow only where images are used

    if len(data) > max_bytes:
        raise ImageError(f"the image is {len(data)} bytes; the limit is {max_bytes} bytes")
    im = Image.open(io.BytesIO(data), formats=FORMATS)
    w, h = im.size
    if w * h > max_pixels:
        raise ImageError(f"the image is {w}x{h} pixels; the limit is {max_pixels} pixels")
    if w < 1 or h < 1:
        raise ImageError(f"the image is {w}x{h} pixels")
    if media_type is not None and media_type.lower() not in MEDIA_TYPES[im.format]:
        raise ImageError(f"the data URL says {media_type}, but its bytes are a {im.format} image")
    return im


def _decoding_errors():
    from PIL import Image, UnidentifiedImageError  # deferred: Pillow only where images are used

    return UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError


def read_header(data: bytes, max_bytes: int = MAX_IMAGE_BYTES, max_pixels: int = MAX_IMAGE_PIXELS,
                media_type: str | None = None) -> ImageHeader:
    """The image's format and size from its header alone (cheap whatever its size), or ImageError."""
    try:
        with _open(data, max_bytes, max_pixels, media_type) as im:
            return ImageHeader(im.format, *im.size)
    except ImageError:
        raise
    except _decoding_errors() as e:
        raise ImageError(f"the image does not decode as PNG, JPEG, WebP or GIF ({type(e).__name__}: {e})") from None


def decode_image(data: bytes, max_bytes: int = MAX_IMAGE_BYTES, max_pixels: int = MAX_IMAGE_PIXELS,
                 media_type: str | None = None):
    """A PNG, JPEG, WebP or GIF (its first frame) as an RGB Pillow image; ImageError
    for anything else, anything over the limits, or bytes of another type than `media_type`."""
    try:
        with _open(data, max_bytes, max_pixels, media_type) as im:
            im.seek(0)
            return im.convert("RGB")
    except ImageError:
        raise
    except _decoding_errors() as e:
        raise ImageError(f"the image does not decode as PNG, JPEG, WebP or GIF ({type(e).__name__}: {e})") from None


@dataclass(eq=False)
class PromptImage:
    """One image of a prompt: what the tower takes, its content key, its embeddings once encoded."""

    plan: ImagePlan
    key: int
    embeddings: torch.Tensor | None = None

    @property
    def n_tokens(self) -> int:
        return self.plan.n_tokens


class VisionModel:
    """A vision file loaded for a text model: `prepare` (bytes -> PromptImage),
    `encode_steps`/`encode` (-> embeddings (n_tokens, text width)), and the prompt
    side: `expand` (the template's image marks -> the image token runs) and `prompt_ids`."""

    def __init__(self, path: str, reader: GGUFReader, family: ModuleType, tower, nbytes: int):
        self.path, self.reader, self.family, self.tower, self.nbytes = path, reader, family, tower, nbytes
        self.projector = family.PROJECTOR
        self.encoded: OrderedDict[int, torch.Tensor] = OrderedDict()
        self.image_token_id: int | None = None  # set by `bind` from the text model's vocabulary
        self.threads = None  # the text model's ThreadPolicy (set by the loader): the tower runs as a long prefill

    def _threads(self):
        return self.threads.run(1 << 20) if self.threads is not None else contextlib.nullcontext()

    def bind(self, tokenizer) -> None:
        """The text model's id of the family's image token, where its vocabulary has one
        (then a prompt is tokenized whole, as the family's processor does); else None, and
        the text around each image is tokenized on its own (as llama.cpp's mtmd does)."""
        token = self.family.IMAGE_TOKEN
        tid = tokenizer.convert_tokens_to_ids(token)
        if tid is None or tid == tokenizer.unk_token_id or tokenizer.convert_ids_to_tokens(tid) != token:
            tid = None
        self.image_token_id = tid
        self.tokenizer = tokenizer

    # ------------------------------------------------------------ images

    def count(self, data: bytes, detail: str = "auto", **limits) -> tuple[ImageHeader, int]:
        """The image's header and the tokens it will take, from its header alone (nothing
        decoded), or ImageError: a request's images are checked against the context so."""
        head = read_header(data, **limits)
        return head, self.tower.n_tokens(head.width, head.height, detail)

    def prepare(self, data: bytes, detail: str = "auto", **limits) -> PromptImage:
        image = decode_image(data, **limits)
        plan = self.tower.plan(image, detail)
        digest = hashlib.blake2b(data, digest_size=8, person=detail.encode()[:16]).digest()
        return PromptImage(plan, int.from_bytes(digest, "little") & ((1 << KEY_BITS) - 1))

    def encode_steps(self, image: PromptImage):
        """A generator: None per piece of work, then the embeddings (also kept on `image`)."""
        if image.embeddings is None and image.key in self.encoded:
            self.encoded.move_to_end(image.key)
            image.embeddings = self.encoded[image.key]
        if image.embeddings is not None:
            yield image.embeddings
            return
        steps = self.tower.encode_steps(image.plan)
        while True:
            with torch.inference_mode(), self._threads():  # the tower's torch ops on every kernel thread
                out = next(steps)
            if out is not None:
                image.embeddings = out.float().contiguous()
                break
            yield None
        self.encoded[image.key] = image.embeddings
        while len(self.encoded) > KEEP_ENCODED:
            self.encoded.popitem(last=False)
        yield image.embeddings

    def encode(self, image: PromptImage) -> torch.Tensor:
        for out in self.encode_steps(image):
            if out is not None:
                return out
        raise AssertionError("unreachable")

    # ------------------------------------------------------------ prompts

    @property
    def mark(self) -> str:
        """What the chat template writes for an image content part."""
        return self.family.TEMPLATE_MARK

    def expand(self, text: str, images: list[PromptImage]) -> str:
        """The rendered prompt with each image mark replaced by the image's token run."""
        parts = self._marks(text, images)
        out = [parts[0]]
        for image, rest in zip(images, parts[1:]):
            out += [self.family.expand(image.n_tokens), rest]
        return "".join(out)

    def _marks(self, text: str, images: list[PromptImage]) -> list[str]:
        parts = text.split(self.mark)
        if len(parts) - 1 != len(images):
            raise ImageError(f"the chat template placed {len(parts) - 1} image(s) for {len(images)} given")
        return parts

    def rendered_ids(self, text: str, images: list[PromptImage]) -> list[int]:
        """A rendered chat prompt's ids with its images' media tokens in place."""
        if self.image_token_id is not None:
            return self.prompt_ids(rendered_ids(self.tokenizer, self.expand(text, images)), images)
        parts = self._marks(text, images)  # no image token: the text between images tokenized piece by piece
        ids, pending = [], parts[0]
        for image, rest in zip(images, parts[1:]):
            before, after = self.family.expand(image.n_tokens).split(self.family.IMAGE_TOKEN * image.n_tokens)
            ids += rendered_ids(self.tokenizer, pending + before)
            ids += [media_token(image.key, j) for j in range(image.n_tokens)]
            pending = after + rest
        return ids + rendered_ids(self.tokenizer, pending)

    def prompt_ids(self, ids: list[int], images: list[PromptImage]) -> list[int]:
        """Token ids of an expanded prompt with each image's run of image tokens replaced
        by its media tokens (raises ImageError where the runs do not match the images)."""
        out, k, i = list(ids), 0, 0
        while i < len(out):
            if out[i] != self.image_token_id:
                i += 1
                continue
            if k >= len(images):
                raise ImageError("the prompt holds more image tokens than the images given")
            img = images[k]
            run = out[i:i + img.n_tokens]
            if len(run) != img.n_tokens or any(t != self.image_token_id for t in run):
                raise ImageError(f"image {k}: its {img.n_tokens} tokens are not one run in the prompt")
            out[i:i + img.n_tokens] = [media_token(img.key, j) for j in range(img.n_tokens)]
            i += img.n_tokens
            k += 1
        if k != len(images):
            raise ImageError(f"the prompt placed {k} of {len(images)} images")
        return out


def template_images(lm, messages: list[dict]) -> tuple[list[dict], list]:
    """Messages as the template reads them, and their images in order: each content part
    {"type": "image", "image": bytes or PromptImage} becomes {"type": "image"} (the
    family's template writes its image mark there). ImageError for an image part when
    the model has no vision file."""
    images, out = [], []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == "image" for p in content):
            if lm.vision is None:
                raise ImageError("this model has no vision file, so it cannot take images (--mmproj)")
            parts = []
            for p in content:
                if p.get("type") == "image":
                    image = p.get("image")
                    images.append(image if isinstance(image, PromptImage) else lm.vision.prepare(bytes(image)))
                    parts.append({"type": "image"})
                else:
                    parts.append(p)
            m = {**m, "content": parts}
        out.append(m)
    return out, images


def goes_with(path: str, text_path: str) -> bool:
    """Whether the vision file at `path` is one for the text model at `text_path` (its
    architecture and width, from the headers): a folder's vision file is paired with the
    models it fits, not with every model beside it."""
    try:
        m = VisionMetadata(GGUFReader(path))
        kind = m.get(Keys.VISION_PROJECTOR_TYPE, None) or m.get(Keys.CLIP_PROJECTOR_TYPE, None)
        family = projectors().get(kind)
        text = GGUFReader(text_path)
        if family is None or text.architecture not in family.TEXT_ARCHITECTURES:
            return False
        width = text.get(f"{text.architecture}.embedding_length")
        return width is None or family.Params.from_gguf(m).projection_dim == width  # not another size's
    except (GGUFError, OSError, ValueError, KeyError) as e:  # a file that cannot be read: paired, its load says why
        log.warning("%s: cannot tell whether it goes with %s (%s); paired with it, its load will say", path,
                    text_path, e)
        return True


def vision_products(setting: str | None, device: torch.device, native: bool | None = None) -> torch.dtype | None:
    """The dtype a tower's F16/BF16 matrices multiply in on CPU (None: the activations'):
    the setting, else bfloat16 where the CPU computes it natively (`native`: that check's
    answer, for tests). The towers' checkpoints are bfloat16 to begin with, as a rule."""
    if device.type != "cpu":
        return None
    if setting is None:
        if native is None:
            native = has_native_bf16()
        return torch.bfloat16 if native else None
    return torch.bfloat16 if setting == "bfloat16" else None


def load_vision(path: str, text_reader: GGUFReader, text_hidden: int, device: torch.device, dtype: torch.dtype,
                settings: KernelSettings, products: torch.dtype | None = None) -> VisionModel:
    """A vision file for a text model (VisionFileError where it is not one, or not this model's);
    `settings`: the text model's kernel settings; `products`: the dtype its F16/BF16 matrices
    multiply in (vision_products)."""
    reader = GGUFReader(path)
    if reader.architecture != "clip":
        raise VisionFileError(f"{path}: not a vision file (general.architecture is {reader.architecture!r}, "
                              "a vision file's is 'clip')")
    m = VisionMetadata(reader)
    if not m.get(Keys.CLIP_HAS_VISION, False):
        raise VisionFileError(f"{path}: the file has no vision encoder (clip.has_vision_encoder)")
    kind = m.get(Keys.VISION_PROJECTOR_TYPE, None) or m.get(Keys.CLIP_PROJECTOR_TYPE, None)
    family = projectors().get(kind)
    if family is None:
        raise VisionFileError(f"{path}: vision projector {kind!r} is not supported; supported: "
                              f"{', '.join(sorted(projectors()))}")
    text_arch = text_reader.architecture
    if text_arch not in family.TEXT_ARCHITECTURES:
        raise VisionFileError(f"{path}: a {kind} vision file goes with {', '.join(family.TEXT_ARCHITECTURES)} "
                              f"text models, not {text_arch}")
    try:
        params = family.Params.from_gguf(m)
    except ValueError as e:  # a key that says the file is not one this tower runs
        raise VisionFileError(str(e)) from None
    if params.projection_dim != text_hidden:
        raise VisionFileError(f"{path}: its images are {params.projection_dim} wide; the text model's embeddings "
                              f"are {text_hidden} (a vision file of another model size?)")
    reader.populate()
    w = Weights(reader, device, dtype, settings, views=True,  # the towers never write into weights
                products=products)
    tower = family.build(params, w)
    w.release_copies()
    nbytes = sum(t.nbytes for t in reader.tensors.values())
    products_said = "; float matrices multiplied in bfloat16 (vision_dtype float32 keeps float32)" \
        if products is torch.bfloat16 else ""
    log.info("vision file %s (%s): %d layers, %d tokens per image%s", path, kind, params.n_layers,
             getattr(params, "n_tokens", 0), products_said)
    return VisionModel(path, reader, family, tower, nbytes)


class RopePlan:
    """Where a prompt's images sit, for families with multi-section rotary (Qwen3.5): an
    image's tokens take (t, t + row, t + column), t the text position it starts at, and
    what follows goes on from t + max(rows, columns), so each image moves the rotary
    positions of everything after it back by its tokens less that."""

    def __init__(self, prompt: list[int], media: dict[int, PromptImage]):
        self.images = []  # (first cache position, tokens, rows, columns, shift before it)
        shift, i = 0, 0
        while i < len(prompt):
            if prompt[i] < 0 and media_of(prompt[i])[1] == 0:
                img = media[media_of(prompt[i])[0]]
                rows, cols = img.plan.grid
                self.images.append((i, img.n_tokens, rows, cols, shift))
                shift += img.n_tokens - max(rows, cols)
                i += img.n_tokens
            else:
                i += 1
        self.total = shift

    def positions(self, pos: int, n: int) -> torch.Tensor | None:
        """(n, 3) rotary positions of cache positions [pos, pos + n); None where plain."""
        if not self.images or pos + n <= self.images[0][0]:
            return None
        p = torch.arange(pos, pos + n)
        start, count = self.images[-1][:2]
        if pos >= start + count:  # past every image (each decode step): all moved back by the total
            return (p - self.total)[:, None].repeat(1, 3)
        shift = torch.zeros(n, dtype=torch.long)
        out = None
        for start, count, rows, cols, before in self.images:
            shift[p >= start + count] = before + count - max(rows, cols)
            inside = (p >= start) & (p < start + count)
            if bool(inside.any()):
                out = out if out is not None else []
                out.append((inside, start - before, (p[inside] - start) // cols, (p[inside] - start) % cols))
        q = p - shift
        pos3 = q[:, None].repeat(1, 3)
        for inside, t, r, c in out or ():
            pos3[inside, 0] = t
            pos3[inside, 1] = t + r
            pos3[inside, 2] = t + c
        return pos3
