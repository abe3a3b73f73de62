"""Images in chat messages: an `image_url` content part (a data URL with a PNG, JPEG,
WebP or GIF, or, with --image-urls, an http(s) URL) made ready for the model's vision
file, within bounds checked before any pixel is decoded: at most --max-images a request,
each within --max-image-bytes and its data URL's media type, and together within the
context (their tokens counted from their headers) and MAX_REQUEST_PIXELS.

A URL is fetched on the event loop (no thread waits on a slow host) within
--image-url-timeout for all of it, redirects included, at most --max-image-bytes; its
host's addresses must be public ones (no loopback, private, link-local or metadata
address, however spelled, unless --image-urls-allow-private), the connection goes to
the address checked (a name that resolves again to another cannot slip through), and a
redirect may not leave the host unless --image-urls-redirects. The errors say which
bound a fetch broke, never what answered behind it. Every failure is a 400 that names
the content part; nothing is dropped."""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

import httpx

from ...engine import ImageError
from ..core.errors import BadRequest

DETAILS = ("auto", "low", "high")
MAX_REQUEST_PIXELS = 160_000_000  # a request's images together, decoded (four of the largest one image may be)
MAX_REDIRECTS = 3
TOKENS_PER_IMAGE = 256  # the default --max-images is the context over this (Gemma 3's image size)


class NoVisionFile(ImageError):
    """An image for a model without a vision file: content it cannot use."""


@dataclass
class ImagePart:
    """An image content part, its bytes had (decoded from the data URL, or fetched)."""

    where: str  # the content part, as errors name it
    data: bytes
    detail: str
    media_type: str | None  # a data URL's, checked against the bytes


def image_url(part) -> tuple[str, str]:
    """(url, detail) of an image_url part (an object with url and detail, or a bare URL string)."""
    v = part.image_url
    if isinstance(v, str):
        return v, "auto"
    if not isinstance(v, dict) or not isinstance(v.get("url"), str):
        raise ImageError("an image_url part needs image_url.url (a data: URL or an http(s) URL)")
    return v["url"], v.get("detail") or "auto"


def _data_url(url: str) -> tuple[bytes, str]:
    head, sep, body = url.partition(",")
    if not sep or not head.startswith("data:") or not head.endswith(";base64"):
        raise ImageError("a data URL must be data:<media type>;base64,<data>")
    media_type = head[5:-7].split(";")[0].strip()
    if not media_type.lower().startswith("image/"):
        raise ImageError(f"a data URL's media type must be an image type, got {media_type or 'none'!r}")
    try:
        return base64.b64decode(body, validate=True), media_type
    except (binascii.Error, ValueError):
        raise ImageError("the data URL's base64 does not decode") from None


def public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether an address is a public one (not loopback, private, link-local as cloud
    metadata services are, multicast, reserved or unspecified; an IPv4 address in IPv6
    clothing is judged as itself)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


class Fetcher:
    """Fetches image URLs under the settings' bounds (one client, connections kept)."""

    def __init__(self, settings):
        self.settings = settings
        self.client = httpx.AsyncClient(follow_redirects=False, timeout=settings.image_url_timeout)

    async def fetch(self, url: str) -> bytes:
        limit, seconds = self.settings.max_image_bytes, self.settings.image_url_timeout
        try:
            async with asyncio.timeout(seconds):
                return await self._fetch(url, limit)
        except TimeoutError:
            raise ImageError(f"the image URL did not give its image within {seconds:g} s (--image-url-timeout)") \
                from None
        except httpx.HTTPError:  # refused, reset, a bad certificate...: the same words for all
            raise ImageError("the image could not be fetched from its URL") from None

    async def _fetch(self, url: str, limit: int) -> bytes:
        first = urlsplit(url)
        for _ in range(MAX_REDIRECTS + 1):
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ImageError("an image URL must be an http(s) URL with a host")
            if parts.hostname != first.hostname and not self.settings.image_urls_redirects:
                raise ImageError("the image URL redirects to another host (--image-urls-redirects allows it)")
            ip = await self._address(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
            host = f"[{ip}]" if ip.version == 6 else str(ip)
            pinned = parts._replace(netloc=f"{host}:{parts.port}" if parts.port else host).geturl()
            headers = {"Host": parts.netloc.rpartition("@")[2], "Accept": "image/*"}
            extensions = {"sni_hostname": parts.hostname} if parts.scheme == "https" else {}
            async with self.client.stream("GET", pinned, headers=headers, extensions=extensions) as r:
                if r.is_redirect:
                    url = urljoin(url, r.headers.get("location", ""))
                    continue
                if r.status_code != 200:
                    raise ImageError(f"the image URL answered HTTP {r.status_code}")
                data = bytearray()
                async for chunk in r.aiter_bytes():
                    data += chunk
                    if len(data) > limit:
                        raise ImageError(f"the image at the URL is over {limit} bytes (--max-image-bytes)")
                return bytes(data)
        raise ImageError(f"the image URL redirects more than {MAX_REDIRECTS} times")

    async def _address(self, host: str, port: int):
        """The address to connect to: every address the host has must be allowed."""
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError:
            raise ImageError("the image URL's host name does not resolve") from None
        ips = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]
        if not self.settings.image_urls_allow_private and not all(public(ip) for ip in ips):
            raise ImageError("the image URL's host is a local or private address; this server fetches public "
                             "addresses only (--image-urls-allow-private)")
        return ips[0]

    async def aclose(self) -> None:
        await self.client.aclose()


async def image_bytes(part, where: str, settings, fetcher: Fetcher) -> ImagePart:
    """An image_url part's bytes (ImageError saying why not), not yet decoded."""
    url, detail = image_url(part)
    if detail not in DETAILS:
        raise ImageError(f"detail must be one of {', '.join(DETAILS)}, got {detail!r}")
    if url.startswith("data:"):
        data, media_type = _data_url(url)
        return ImagePart(where, data, detail, media_type)
    if url.startswith(("http://", "https://")):
        if not settings.image_urls:
            raise ImageError("this server takes images as data URLs only (start it with --image-urls to fetch "
                             "http(s) URLs)")
        return ImagePart(where, await fetcher.fetch(url), detail, None)
    raise ImageError("an image URL must be a data: URL or an http(s) URL")


def max_images(settings, lm) -> int:
    """Images a request may hold: --max-images, else as many as the context holds at the
    size of a Gemma 3 image."""
    return settings.max_images or max(1, lm.n_ctx // TOKENS_PER_IMAGE)


def no_vision(lm) -> NoVisionFile:
    if lm.vision is None:
        return NoVisionFile("this model has no vision file, so it cannot take images (start it with --mmproj, or put "
                            "the mmproj .gguf beside the model)")
    return NoVisionFile(f"this model's mmproj file ({lm.vision.projector}) has no vision encoder: it takes audio, "
                        "not images")


def bad_image(e: ImageError, param: str) -> BadRequest:
    code = "unsupported_parameter" if isinstance(e, NoVisionFile) else "invalid_image"
    return BadRequest(f"{param}: {e}", param=param, code=code)
