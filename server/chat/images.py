"""Images in chat messages: an `image_url` content part (a data URL with a PNG, JPEG,
WebP or GIF, or, with --image-urls, an http(s) URL fetched within --max-image-bytes and
IMAGE_URL_TIMEOUT) made ready for the model's vision file. Every failure is a 400 that
names the content part; nothing is dropped."""

from __future__ import annotations

import base64
import binascii

import httpx

from ...engine import ImageError
from ..core.errors import BadRequest

class NoVisionFile(ImageError):
    """An image for a model without a vision file: content it cannot use."""


IMAGE_URL_TIMEOUT = 10.0  # seconds for a remote image, all of it
DETAILS = ("auto", "low", "high")


def image_url(part) -> tuple[str, str]:
    """(url, detail) of an image_url part (an object with url and detail, or a bare URL string)."""
    v = part.image_url
    if isinstance(v, str):
        return v, "auto"
    if not isinstance(v, dict) or not isinstance(v.get("url"), str):
        raise ImageError("an image_url part needs image_url.url (a data: URL or an http(s) URL)")
    return v["url"], v.get("detail") or "auto"


def _data_url(url: str) -> bytes:
    head, sep, body = url.partition(",")
    if not sep or not head.startswith("data:") or not head.endswith(";base64"):
        raise ImageError("a data URL must be data:<media type>;base64,<data>")
    try:
        return base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("the data URL's base64 does not decode") from None


def _fetch(url: str, limit: int) -> bytes:
    try:
        with httpx.stream("GET", url, timeout=IMAGE_URL_TIMEOUT, follow_redirects=True) as r:
            if r.status_code != 200:
                raise ImageError(f"fetching the image answered {r.status_code}")
            data = bytearray()
            for chunk in r.iter_bytes():
                data += chunk
                if len(data) > limit:
                    raise ImageError(f"the image at the URL is over {limit} bytes")
            return bytes(data)
    except httpx.HTTPError as e:
        raise ImageError(f"the image could not be fetched: {type(e).__name__}: {e}") from None


def load_image(lm, part, settings):
    """An image_url part as the engine's PromptImage (ImageError saying why not)."""
    if lm.vision is None:
        raise NoVisionFile("this model has no vision file, so it cannot take images (start it with --mmproj, or put "
                         "the mmproj .gguf beside the model)")
    url, detail = image_url(part)
    if detail not in DETAILS:
        raise ImageError(f"detail must be one of {', '.join(DETAILS)}, got {detail!r}")
    if url.startswith("data:"):
        data = _data_url(url)
    elif url.startswith(("http://", "https://")):
        if not settings.image_urls:
            raise ImageError("this server takes images as data URLs only (start it with --image-urls to fetch "
                             "http(s) URLs)")
        data = _fetch(url, settings.max_image_bytes)
    else:
        raise ImageError("an image URL must be a data: URL or an http(s) URL")
    return lm.vision.prepare(data, detail, max_bytes=settings.max_image_bytes)


def bad_image(e: ImageError, param: str) -> BadRequest:
    code = "unsupported_parameter" if isinstance(e, NoVisionFile) else "invalid_image"
    return BadRequest(f"{param}: {e}", param=param, code=code)
