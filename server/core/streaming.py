"""How a route hands a generation to the client: a streamed reply (server-sent events)
that cancels its generation however it ends, or a folded one that is abandoned if the
client hangs up first; an error inside a stream as its last event. A server-sent event
stream silent for --sse-ping-interval seconds (a long prompt's prefill, a queue) gets a
comment line (`: ping`), which clients skip and proxies see as traffic; NDJSON streams
(Ollama's) get none: their clients read every line as JSON."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import AsyncIterator, Callable

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from .errors import APIError, InternalError

log = logging.getLogger("gguf_serve.server")


PING = ": ping\n\n"


async def with_pings(lines: AsyncIterator[str], interval: float, ping: Callable[[], str] = lambda: PING
                     ) -> AsyncIterator[str]:
    """`lines`, and a `ping()` line (an SSE comment, PING, unless said) whenever `interval`
    seconds pass without one. The next line is awaited in a task of its own, so that a
    ping does not cancel it."""
    it = lines.__aiter__()
    pending: asyncio.Future | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(it.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield ping()
                continue
            line, pending = pending, None
            try:
                value = line.result()
            except StopAsyncIteration:
                return
            yield value
    finally:
        if pending is not None:
            pending.cancel()
            await asyncio.wait({pending})  # the generator's own `finally` runs before it is closed
        close = getattr(it, "aclose", None)
        if close is not None:
            await close()


class CancellingStream(StreamingResponse):
    """A streamed reply that cancels its generation however it ends: also when the
    client hangs up before the first line is sent (the body's own `finally` never runs
    for a generator that was never started). While silent, server-sent events get comment
    pings, other streams the `ping` line given (Ollama's NDJSON: an empty chunk)."""

    def __init__(self, content, cancel: threading.Event, ping: Callable[[], str] | None = None, **kwargs):
        super().__init__(content, **kwargs)
        self.cancel, self.ping = cancel, ping

    async def __call__(self, scope, receive, send):
        settings = getattr(getattr(scope.get("app"), "state", None), "settings", None)
        interval = getattr(settings, "sse_ping_interval", 0) or 0
        if (self.media_type or "").startswith("text/event-stream"):
            self.ping = self.ping or (lambda: PING)
        if interval > 0 and self.ping is not None:
            self.body_iterator = with_pings(self.body_iterator, interval, self.ping)
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.cancel.set()


def event_stream(lines: AsyncIterator[str], cancel: threading.Event) -> CancellingStream:
    """`lines` (whole SSE events) as a text/event-stream reply; `cancel` set when it ends."""
    return CancellingStream(lines, cancel, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def sse_error(body: dict) -> str:
    return f"data: {json.dumps(body)}\n\n"


def openai_stream(gen_and_cancel: tuple[AsyncIterator[str], threading.Event]) -> CancellingStream:
    """An OpenAI stream's lines, a failure after the start sent as a last `data:` line
    in OpenAI's error envelope."""
    gen, cancel = gen_and_cancel

    async def body():
        try:
            async for line in gen:
                yield line
        except APIError as e:
            yield sse_error(e.body())
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("stream failed")
            yield sse_error(InternalError(str(e)).body())
    return event_stream(body(), cancel)


async def until_disconnected(request: Request) -> None:
    """Returns once the client has gone (the body is read by then: what `receive` gives
    next is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work):
    """Await `work` (a coroutine); if the client hangs up first, cancel it (its
    generation leaves the batch at the next step) and return None."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(until_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if task in done:
        return task.result()
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, Exception):
        pass
    return None


async def folded(request: Request, work):
    """The reply `work` makes, or, where the client hung up first, a 499 nobody reads."""
    return await unless_disconnected(request, work) or Response(status_code=499)
