"""A prompt's media in the scheduler: how a prompt chunk ends around an image, the
towers' encoding step by step while other sequences run, and what the batch takes of
them (the embeddings by content key, which go whole and see each other, the
multi-section rotary positions). The media themselves, their tokens and the towers are
engine.media's and engine.vision's."""

from __future__ import annotations

from ..batch import media_of
from ..vision import RopePlan
from .state import Purpose, Request, Row, Running


def rope_plan(lm, req: Request) -> RopePlan | None:
    """Where the request's images move the rotary positions, for families that move them (Qwen3.5)."""
    return RopePlan(req.prompt_ids, req.media) if req.media and lm.vision.mrope else None


def media_chunk(lm, r: Running, n: int, room: int, piecewise: bool) -> int:
    """How many of the next n prompt tokens this step takes, with images whole: a chunk
    ends before an image that would not fit it, takes an image that starts it even past
    the chunk size (within `room`, the batch's), and waits while an image in it is being
    encoded (one encoder step per scheduler step while other sequences run, `piecewise`;
    else at once). Returns 0 to take nothing this step."""
    prompt, lo = r.prompt, r.fed
    end = lo + n
    inside = end < len(prompt) and prompt[end] < 0 and media_of(prompt[end])[1] != 0
    if inside and r.req.media[media_of(prompt[end])[0]].both_ways:  # inside media that goes whole
        start = end - media_of(prompt[end])[1]
        if start > lo:
            end = start  # up to the image
        else:  # the image starts the chunk: all of it, or wait for room
            image = r.req.media[media_of(prompt[start])[0]]
            end = start + image.n_tokens
            if end - lo > room:
                return 0
    for t in prompt[lo:end]:
        if t < 0 and media_of(t)[1] == 0:
            image = r.req.media[media_of(t)[0]]
            if image.embeddings is not None:
                continue
            steps = r.encoding.get(image.key)
            if steps is None:
                steps = r.encoding[image.key] = lm.vision.encode_steps(image)
            for out in steps:
                if out is not None or piecewise:
                    break
            if image.embeddings is None:
                return 0
            r.encoding.pop(image.key, None)
    return end - lo


def batch_media(lm, rows: list[Row]) -> dict:
    """Batch.of's media arguments for a step's rows: the embeddings of the prompts'
    media, the rotary positions where images moved them, the media that go causally
    (neither whole nor seeing each other: audio)."""
    media = {k: img.embeddings for row in rows if row.purpose is not Purpose.DECODE and row.run.req.media
             for k, img in row.run.req.media.items() if img.embeddings is not None}
    ropes = None
    if any(row.run.rope is not None for row in rows):
        ropes = [row.run.rope.positions(row.pos, len(row.tokens)) if row.run.rope is not None else None
                 for row in rows]
    causal = frozenset(k for row in rows if row.purpose is not Purpose.DECODE and row.run.req.media
                       for k, img in row.run.req.media.items() if not img.both_ways)
    return {"media": media, "rope_positions": ropes, "causal_media": causal}
