"""Connections bounded (issue 39): uvicorn's h11 protocol with a deadline on every request
head (a client that sends its head a byte at a time is closed after HEAD_TIMEOUT; uvicorn
times out only idle keep-alive connections) and a cap on the connections held at once:
past it, the connection that has waited longest for its head is closed to make room
(slow heads are the cheapest to drop), and where every connection is a request in
progress, the new one is refused with a 503 at once; each connection's kernel send buffer
is kept small (SEND_BUFFER), so that a client that stops reading is noticed early. Also
the process's file-descriptor limit raised to what the system allows, so that the cap,
not the limit, decides."""

from __future__ import annotations

import contextlib
import logging
import resource
import socket

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("gguf_serve.server")

HEAD_TIMEOUT = 10.0  # seconds a request's head may take to arrive, from the connection (or the last reply)
# the listening socket's backlog, which is also how many connections asyncio accepts at once before any of
# them is seen (and room made): kept under the open files the cap leaves spare, so accepting never runs out
ACCEPT_BATCH = 128
# each connection's kernel send buffer (Linux doubles it): plenty for a stream of tokens, and a reader that
# stops is seen after a quarter megabyte rather than the autotuned four (server.models.worker.MAX_UNREAD)
SEND_BUFFER = 128 << 10
REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
           b"retry-after: 1\r\n")
REFUSAL_BODY = (b'{"error":{"message":"too many connections (--max-connections); retry shortly",'
                b'"type":"server_error","param":null,"code":null}}')


def raise_open_files() -> int:
    """Raise this process's open-file limit to the hard limit; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            log.info("open files: limit raised from %d to %d", soft, want)
            soft = want
        except (ValueError, OSError) as e:
            log.warning("open files: limit %d could not be raised (%s)", soft, e)
    return soft


def default_max_connections(open_files: int) -> int:
    """Connections to hold at most: what the open-file limit leaves room for (model files,
    template workers and the like keep 256; then two accepted batches: a burst accepted
    while the connections closed to make room for the last one are still open), at most
    4096."""
    return max(16, min(4096, open_files - 256 - 2 * ACCEPT_BATCH))


def protocol(max_connections: int, head_timeout: float = HEAD_TIMEOUT) -> type:
    """uvicorn's h11 protocol with these bounds (a class per server: the bounds are values)."""

    class Bounded(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            sock = transport.get_extra_info("socket")
            if sock is not None:  # a reply nobody reads waits here, not in megabytes of kernel buffer
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
            self._head_timer = None
            self._arm()
            if len(self.connections) > max_connections and not self._make_room():
                transport.write(REFUSAL + b"content-length: %d\r\n\r\n" % len(REFUSAL_BODY) + REFUSAL_BODY)
                transport.close()

        def _make_room(self) -> bool:
            """Close the connection that has waited longest for its head (not this one)."""
            waiting = [c for c in self.connections if c is not self and getattr(c, "_head_timer", None) is not None
                       and c.conn.their_state is h11.IDLE and not c.transport.is_closing()]
            if not waiting:
                return False
            oldest = min(waiting, key=lambda c: c._head_since)
            oldest._head_late()
            return True

        def _arm(self) -> None:
            self._disarm()
            self._head_since = self.loop.time()
            self._head_timer = self.loop.call_later(head_timeout, self._head_late)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_late(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self.transport.close()

        def handle_events(self) -> None:
            super().handle_events()
            if self._head_timer is not None and self.conn.their_state is not h11.IDLE:
                self._disarm()  # the head is in: the request's own deadlines take over

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._arm()  # the next request's head (a keep-alive connection)

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

    return Bounded
