"""The media of a chat request (images and audio clips) made ready for the model's mmproj
file, in three steps that each come before any costlier one: `count` refuses too many
parts, or parts the model has no encoder for, before a byte of them is read; `content`
reads each message's parts (image bytes from data URLs or fetched URLs, server.chat.images;
audio bytes from base64, server.chat.audio) in prompt order; `prepare` reads every part's
header, checks the tokens they all take against the context (and the images' pixels
against MAX_REQUEST_PIXELS), and only then decodes them on the images pool. What each
part is (its bytes, its format) is the images and audio modules'; decoding is the
engine's (engine.vision, engine.sound)."""

from __future__ import annotations

from ...engine import AudioError, ImageError
from ..core.errors import BadRequest, ContextLengthExceeded
from ..core.pools import Pools
from .audio import AudioPart, audio_bytes, bad_audio, max_audio, no_audio
from .images import MAX_REQUEST_PIXELS, Fetcher, ImagePart, bad_image, image_bytes, max_images, no_vision

MEDIA_PARTS = ("image_url", "input_audio")  # the content parts that are media


class ChatMedia:
    """Images and audio in chat messages, within the settings' bounds (--max-images,
    --max-image-bytes, --image-urls..., --max-audio, --max-audio-bytes, --max-audio-seconds)."""

    def __init__(self, settings, pools: Pools):
        self.settings, self.pools = settings, pools
        self.fetcher = Fetcher(settings)  # image URLs (--image-urls), on the event loop

    def count(self, lm, messages) -> None:
        """Refuse a request with more images than --max-images or more clips than
        --max-audio, or with any the model has no encoder for, before a byte is read."""
        vision = lm.vision
        limits = {"image_url": (max_images(self.settings, lm), "images (--max-images)"),
                  "input_audio": (max_audio(self.settings, lm), "audio clips (--max-audio)")}
        seen = dict.fromkeys(MEDIA_PARTS, 0)
        for i, m in enumerate(messages):
            for j, part in enumerate(m.content if isinstance(m.content, list) else []):
                if part.type not in MEDIA_PARTS:
                    continue
                where = f"messages.{i}.content.{j}"
                if part.type == "image_url" and (vision is None or vision.tower is None):
                    raise bad_image(no_vision(lm), where)
                if part.type == "input_audio" and (vision is None or vision.audio_tower is None):
                    raise bad_audio(no_audio(lm), where)
                seen[part.type] += 1
                limit, what = limits[part.type]
                if seen[part.type] > limit:
                    code = "invalid_image" if part.type == "image_url" else "invalid_audio"
                    raise BadRequest(f"{where}: a request may hold at most {limit} {what}", param=where, code=code)

    async def content(self, m, i: int, pending: list):
        """A message's content as the template reads it: its text, or, with media, its parts
        (an image_url part {"type": "image"}, an input_audio part {"type": "audio"}), each
        medium's bytes had and added to `pending` in order."""
        if not isinstance(m.content, list) or not any(p.type in MEDIA_PARTS for p in m.content):
            return m.text()
        parts = []
        for j, part in enumerate(m.content):
            where = f"messages.{i}.content.{j}"
            if part.type == "text":
                parts.append({"type": "text", "text": part.text or ""})
                continue
            image = part.type == "image_url"
            if m.role != "user":
                raise BadRequest(f"{where}: {'images' if image else 'audio clips'} go in user messages, not "
                                 f"{m.role} ones", param=where, code="invalid_image" if image else "invalid_audio")
            if image:
                try:
                    pending.append(await image_bytes(part, where, self.settings, self.fetcher))
                except ImageError as e:
                    raise bad_image(e, where) from None
                parts.append({"type": "image"})
            else:
                try:
                    pending.append(AudioPart(where, *audio_bytes(part, self.settings.max_audio_bytes)))
                except AudioError as e:
                    raise bad_audio(e, where) from None
                parts.append({"type": "audio"})
        return parts

    def _audio_limits(self) -> dict:
        return {"max_bytes": self.settings.max_audio_bytes, "max_seconds": self.settings.max_audio_seconds}

    def _tokens(self, lm, p: ImagePart | AudioPart) -> tuple[int, int]:
        """(tokens, pixels) of one part, from its header alone."""
        if isinstance(p, AudioPart):
            try:
                _, n = lm.vision.count_audio(p.data, p.format, **self._audio_limits())
            except AudioError as e:
                raise bad_audio(e, p.where) from None
            both_ways, pixels, what = lm.vision.audio_family.BIDIRECTIONAL, 0, "audio"
        else:
            try:
                head, n = lm.vision.count(p.data, p.detail, media_type=p.media_type,
                                          max_bytes=self.settings.max_image_bytes)
            except ImageError as e:
                raise bad_image(e, p.where) from None
            both_ways, pixels, what = lm.vision.family.BIDIRECTIONAL, head.width * head.height, "image"
        if both_ways and n > lm.cache.max_batch:  # its tokens go in one forward
            raise BadRequest(f"{p.where}: the {what} is {n} tokens; a forward pass takes at most "
                             f"{lm.cache.max_batch}", param=p.where, code=f"invalid_{what}")
        return n, pixels

    async def prepare(self, lm, pending: list) -> list:
        """The request's media prepared for the mmproj file, in prompt order (engine
        PromptMedia): first each one's tokens from its header, all of them checked against
        the context and MAX_REQUEST_PIXELS, then (only then) decoded, on the images pool."""
        tokens = pixels = 0
        for p in pending:
            n, size = self._tokens(lm, p)
            tokens, pixels = tokens + n, pixels + size
            if tokens >= lm.n_ctx:
                raise ContextLengthExceeded(f"This model's maximum context length is {lm.n_ctx} tokens; the media "
                                            f"up to {p.where} take {tokens}", param=p.where)
            if pixels > MAX_REQUEST_PIXELS:
                raise BadRequest(f"{p.where}: the request's images come to {pixels} pixels; one request may hold "
                                 f"{MAX_REQUEST_PIXELS}", param=p.where, code="invalid_image")
        items = []
        for p in pending:
            if isinstance(p, AudioPart):
                try:
                    items.append(await self.pools.images.run(lm.vision.prepare_audio, p.data, p.format,
                                                             **self._audio_limits()))
                except AudioError as e:
                    raise bad_audio(e, p.where) from None
                continue
            try:
                items.append(await self.pools.images.run(lm.vision.prepare, p.data, p.detail, media_type=p.media_type,
                                                         max_bytes=self.settings.max_image_bytes))
            except ImageError as e:
                raise bad_image(e, p.where) from None
        return items
