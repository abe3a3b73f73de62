"""Media in: a model's mmproj file (llama.cpp's `mmproj` GGUF: `general.architecture`
"clip", its vision and/or audio encoder named by their projector types) loaded beside
its text model; images decoded with Pillow and audio with engine.sound, within limits;
the prompt's media tokens (engine.media).

The towers run an encoder layer per scheduler step (`encode_steps`), so that streams
decoding beside a request with an image or a clip wait at most one layer per step;
encoded media are kept (least recently used dropped) so that a follow-up about the
same image does not encode it again even where the prefix cache no longer holds it."""

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
from .batch import KEY_BITS, media_of
from .kernels import KernelSettings
from .kernels.cpu import has_native_bf16
from .models import projectors
from .media import MediaKind, MediaPrompts, PromptMedia
from .models.audio import SAMPLE_RATE
from .models.vision import VisionMetadata
from .modules import Weights
from .sound import audio_header, decode_audio, resampled_length
from .errors import AudioError, ImageError, VisionFileError

log = logging.getLogger("gguf_serve.engine")

MAX_IMAGE_BYTES = 20 << 20  # an image's encoded size
MAX_IMAGE_PIXELS = 40_000_000  # width x height once decoded (Pillow's bomb check warns at ~89M)
FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
KEEP_ENCODED = 16  # encoded images and clips kept for follow-ups
MEDIA_PARTS = ("image", "audio")  # the content parts template_media takes


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


class VisionModel(MediaPrompts):
    """A model's mmproj file loaded for its text model: its image tower and/or its audio
    tower (`towers`: kind -> (family, tower)). `prepare` / `prepare_audio` (bytes ->
    PromptMedia), `encode_steps` / `encode` (-> embeddings (n_tokens, text width)), and
    the prompt side (MediaPrompts: the template's marks -> the media's token runs)."""

    def __init__(self, path: str, reader: GGUFReader, towers: dict[str, tuple[ModuleType, object]], nbytes: int):
        self.path, self.reader, self.towers, self.nbytes = path, reader, towers, nbytes
        self.family, self.tower = towers.get("image", (None, None))
        self.audio_family, self.audio_tower = towers.get("audio", (None, None))
        self.kinds = {name: MediaKind(name, fam, fam.IMAGE_TOKEN if name == "image" else fam.AUDIO_TOKEN)
                      for name, (fam, _) in towers.items()}
        self.projector = "+".join(fam.PROJECTOR for fam, _ in towers.values())
        self.encoded: OrderedDict[int, torch.Tensor] = OrderedDict()
        self.threads = None  # the text model's ThreadPolicy (set by the loader): a tower runs as a long prefill

    def _threads(self):
        return self.threads.run(1 << 20) if self.threads is not None else contextlib.nullcontext()

    def bind(self, tokenizer) -> None:
        """The text model's ids of the families' media tokens (MediaPrompts.bind_kinds)."""
        self.bind_kinds(tokenizer)

    @property
    def mrope(self) -> bool:
        """Whether images move the text's rotary positions (Qwen3.5's multi-section rotary)."""
        return self.family is not None and self.family.MROPE

    # ------------------------------------------------------------ images

    def _image_tower(self):
        if self.tower is None:
            raise ImageError(f"this model's mmproj file ({self.projector}) has no vision encoder: it takes audio, "
                             "not images")
        return self.tower

    def count(self, data: bytes, detail: str = "auto", **limits) -> tuple[ImageHeader, int]:
        """The image's header and the tokens it will take, from its header alone (nothing
        decoded), or ImageError: a request's images are checked against the context so."""
        tower = self._image_tower()
        head = read_header(data, **limits)
        return head, tower.n_tokens(head.width, head.height, detail)

    def prepare(self, data: bytes, detail: str = "auto", **limits) -> PromptMedia:
        tower = self._image_tower()
        plan = tower.plan(decode_image(data, **limits), detail)
        digest = hashlib.blake2b(data, digest_size=8, person=detail.encode()[:16]).digest()
        return PromptMedia(plan, int.from_bytes(digest, "little") & ((1 << KEY_BITS) - 1), "image",
                           both_ways=bool(self.family.BIDIRECTIONAL))

    # ------------------------------------------------------------ audio

    def _audio_tower(self):
        if self.audio_tower is None:
            raise AudioError("this model takes no audio" + (f" (its mmproj file, {self.projector}, has no audio "
                                                            "encoder)" if self.towers else ""))
        return self.audio_tower

    def count_audio(self, data: bytes, fmt: str | None = None, **limits) -> tuple[float, int]:
        """The clip's seconds and the tokens it will take, from its header alone, or AudioError."""
        tower = self._audio_tower()
        _, seconds, rate, _ = audio_header(data, fmt=fmt, **limits)
        return seconds, tower.n_tokens(resampled_length(round(seconds * rate), rate, SAMPLE_RATE))

    def prepare_audio(self, data: bytes, fmt: str | None = None, **limits) -> PromptMedia:
        tower = self._audio_tower()
        plan = tower.plan(decode_audio(data, SAMPLE_RATE, fmt=fmt, **limits))
        digest = hashlib.blake2b(data, digest_size=8, person=b"audio").digest()
        return PromptMedia(plan, int.from_bytes(digest, "little") & ((1 << KEY_BITS) - 1), "audio",
                           both_ways=bool(self.audio_family.BIDIRECTIONAL))

    # ------------------------------------------------------------ encoding

    def encode_steps(self, item: PromptMedia):
        """A generator: None per piece of work, then the embeddings (also kept on `item`)."""
        if item.embeddings is None and item.key in self.encoded:
            self.encoded.move_to_end(item.key)
            item.embeddings = self.encoded[item.key]
        if item.embeddings is not None:
            yield item.embeddings
            return
        steps = self.towers[item.kind][1].encode_steps(item.plan)
        while True:
            with torch.inference_mode(), self._threads():  # the tower's torch ops on every kernel thread
                out = next(steps)
            if out is not None:
                item.embeddings = out.float().contiguous()
                break
            yield None
        self.encoded[item.key] = item.embeddings
        while len(self.encoded) > KEEP_ENCODED:
            self.encoded.popitem(last=False)
        yield item.embeddings

    def encode(self, item: PromptMedia) -> torch.Tensor:
        for out in self.encode_steps(item):
            if out is not None:
                return out
        raise AssertionError("unreachable")

    @property
    def mark(self) -> str:
        """What the chat template writes for an image content part."""
        return self.family.TEMPLATE_MARK


def template_media(lm, messages: list[dict]) -> tuple[list[dict], list]:
    """Messages as the template reads them, and their media in order: each content part
    {"type": "image", "image": bytes or PromptMedia} becomes {"type": "image"}, each
    {"type": "audio", "audio": bytes or PromptMedia, "format": optional} {"type": "audio"}
    (the family's template writes its mark there). ImageError / AudioError for a part the
    model cannot take."""
    items, out = [], []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list) and any(isinstance(p, dict) and p.get("type") in MEDIA_PARTS for p in content):
            parts = []
            for p in content:
                kind = p.get("type") if isinstance(p, dict) else None
                if kind not in MEDIA_PARTS:
                    parts.append(p)
                    continue
                if lm.vision is None:
                    raise (ImageError("this model has no vision file, so it cannot take images (--mmproj)")
                           if kind == "image" else AudioError("this model has no mmproj file with an audio encoder, "
                                                              "so it cannot take audio (--mmproj)"))
                given = p.get(kind)
                if isinstance(given, PromptMedia):
                    items.append(given)
                elif kind == "image":
                    items.append(lm.vision.prepare(bytes(given)))
                else:
                    items.append(lm.vision.prepare_audio(bytes(given), p.get("format")))
                parts.append({"type": kind})
            m = {**m, "content": parts}
        out.append(m)
    return out, items


def encoders(m: VisionMetadata) -> dict[str, str]:
    """The file's encoders: kind ("image", "audio") -> llama.cpp's projector type (a file
    with both names each in clip.vision / clip.audio.projector_type; one with a single
    encoder may name it in clip.projector_type)."""
    out = {}
    for kind, has, key in (("image", Keys.CLIP_HAS_VISION, Keys.VISION_PROJECTOR_TYPE),
                           ("audio", Keys.CLIP_HAS_AUDIO, Keys.AUDIO_PROJECTOR_TYPE)):
        if m.get(has, False):
            out[kind] = m.get(key, None) or m.get(Keys.CLIP_PROJECTOR_TYPE, None)
    return out


def goes_with(path: str, text_path: str) -> bool:
    """Whether the mmproj file at `path` is one for the text model at `text_path` (its
    architecture and width, from the headers): a folder's mmproj file is paired with the
    models it fits, not with every model beside it."""
    try:
        m = VisionMetadata(GGUFReader(path))
        text = GGUFReader(text_path)
        width = text.get(f"{text.architecture}.embedding_length")
        for name in encoders(m).values():
            family = projectors().get(name)
            if family is None or text.architecture not in family.TEXT_ARCHITECTURES:
                return False
            if width is not None and family.Params.from_gguf(m).projection_dim != width:  # another size's
                return False
        return bool(encoders(m))
    except (GGUFError, OSError, ValueError, KeyError) as e:  # a file that cannot be read: paired, its load says why
        log.warning("%s: cannot tell whether it goes with %s (%s); paired with it, its load will say", path,
                    text_path, e)
        return True


def whole_media_tokens(path: str) -> int:
    """The most tokens one medium of the mmproj file at `path` takes in one forward (an
    image that goes whole: Gemma 4's up to 1,120), from its header; 0 where none goes
    whole or the file does not say (its load will)."""
    try:
        m = VisionMetadata(GGUFReader(path))
    except (GGUFError, OSError, ValueError) as e:
        log.debug("%s: not read for its batch size (%s)", path, e)
        return 0
    families = [projectors().get(name) for name in encoders(m).values()]
    return max([getattr(f, "MAX_TOKENS", 0) for f in families if f is not None and f.BIDIRECTIONAL] + [0])


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
    """A model's mmproj file (its vision and/or audio encoder) for a text model
    (VisionFileError where it is not one, or not this model's); `settings`: the text
    model's kernel settings; `products`: the dtype its F16/BF16 matrices multiply in
    (vision_products)."""
    reader = GGUFReader(path)
    if reader.architecture != "clip":
        raise VisionFileError(f"{path}: not a vision file (general.architecture is {reader.architecture!r}, "
                              "a vision file's is 'clip')")
    m = VisionMetadata(reader)
    kinds = encoders(m)
    if not kinds:
        raise VisionFileError(f"{path}: the file has no vision or audio encoder (clip.has_vision_encoder, "
                              "clip.has_audio_encoder)")
    chosen = {}
    for kind, name in kinds.items():
        family = projectors().get(name)
        if family is None or getattr(family, "KIND", "image") != kind:
            supported = sorted(n for n, f in projectors().items() if getattr(f, "KIND", "image") == kind)
            raise VisionFileError(f"{path}: {'vision' if kind == 'image' else 'audio'} projector {name!r} is not "
                                  f"supported; supported: {', '.join(supported)}")
        if text_reader.architecture not in family.TEXT_ARCHITECTURES:
            raise VisionFileError(f"{path}: a {name} mmproj file goes with {', '.join(family.TEXT_ARCHITECTURES)} "
                                  f"text models, not {text_reader.architecture}")
        try:
            params = family.Params.from_gguf(m)
        except ValueError as e:  # a key that says the file is not one this tower runs
            raise VisionFileError(str(e)) from None
        if params.projection_dim != text_hidden:
            raise VisionFileError(f"{path}: its {kind} embeddings are {params.projection_dim} wide; the text model's "
                                  f"are {text_hidden} (a file of another model size?)")
        chosen[kind] = (family, params)
    reader.populate()
    w = Weights(reader, device, dtype, settings, views=True,  # the towers never write into weights
                products=products)
    towers = {kind: (family, family.build(params, w)) for kind, (family, params) in chosen.items()}
    w.release_copies()
    nbytes = sum(t.nbytes for t in reader.tensors.values())
    products_said = "; float matrices multiplied in bfloat16 (vision_dtype float32 keeps float32)" \
        if products is torch.bfloat16 else ""
    said = ", ".join(f"{kind} ({fam.PROJECTOR}, {params.n_layers} layers)" for kind, (fam, params) in chosen.items())
    log.info("mmproj file %s: %s%s", path, said, products_said)
    return VisionModel(path, reader, towers, nbytes)


class RopePlan:
    """Where a prompt's images sit, for families with multi-section rotary (Qwen3.5): an
    image's tokens take (t, t + row, t + column), t the text position it starts at, and
    what follows goes on from t + max(rows, columns), so each image moves the rotary
    positions of everything after it back by its tokens less that."""

    def __init__(self, prompt: list[int], media: dict[int, PromptMedia]):
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
