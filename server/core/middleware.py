"""The ASGI middleware in front of the routes: the body size limit, enforced however the
body is framed, and the guard (Host and Origin, API key, Content-Length, the request
counter)."""

from __future__ import annotations

import asyncio
import hmac

from starlette.exceptions import HTTPException as StarletteHTTPException

from ..settings import ServerSettings
from .errors import APIError, Forbidden, PayloadTooLarge, Unauthorized, envelope
from .hosts import HostPolicy
from .metrics import Metrics
from .webui import ASSETS, is_public

BODY_TIMEOUT = 60.0  # seconds for a request's whole body to arrive


class BodyLimit:
    """ASGI middleware: a request body over `limit` bytes is refused with 413 while it is
    read, whatever its framing (Content-Length is checked before, in `guard`; a chunked
    body has none), and one that has not all arrived within BODY_TIMEOUT seconds with 408
    (a client sending it a byte at a time). The errors are raised from `receive`, inside
    the app, so they become the usual error response. Once the body is in, `receive` is
    the server's own (a route watching for the client's disconnect waits as long as it
    likes)."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        seen, whole = 0, False
        deadline = asyncio.get_running_loop().time() + BODY_TIMEOUT

        async def limited():
            nonlocal seen, whole
            if whole:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - asyncio.get_running_loop().time()))
            except TimeoutError:
                raise StarletteHTTPException(408, f"the request body did not arrive within {BODY_TIMEOUT:g} s") \
                    from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                whole = not message.get("more_body", False)
                if seen > self.limit:
                    raise StarletteHTTPException(413, f"request body over the {self.limit}-byte limit")
            return message

        await self.app(scope, limited, send)


class Guard:
    """ASGI middleware in front of everything: the Host and Origin a browser sends (DNS
    rebinding, cross-site posts: server.core.hosts), the API key (every path but /health
    and the chat page's own files, and /metrics with --metrics-public: it and the docs
    name models and traffic), a
    Content-Length over the body limit refused before the body is read, and the request
    counter by route and status.
    Plain ASGI, so that `receive` reaches the routes untouched (a route watching for the
    client's `http.disconnect` sees it)."""

    def __init__(self, app, settings: ServerSettings, metrics: Metrics):
        self.app, self.settings, self.metrics = app, settings, metrics
        self.hosts = HostPolicy(settings.host, settings.allowed_hosts, settings.cors_origins)
        self.keys = [k.encode() for k in settings.api_keys]

    def _authorized(self, headers: dict) -> bool:
        """`Authorization: Bearer <key>` (the scheme in any case, RFC 9110) or Anthropic's
        `x-api-key: <key>`, compared in constant time with each key."""
        scheme, _, key = headers.get("authorization", "").strip().partition(" ")
        given = [headers["x-api-key"].strip().encode()] if "x-api-key" in headers else []
        if scheme.lower() == "bearer":
            given.append(key.strip().encode())
        hits = [hmac.compare_digest(g, k) for g in given for k in self.keys]  # every pair, whichever matches
        return any(hits)

    def _refusal(self, scope) -> APIError | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        path, limit = scope.get("path", ""), self.settings.max_body_bytes
        host, origin = headers.get("host"), headers.get("origin")
        if not self.hosts.host_allowed(host):
            return Forbidden(f"Host '{host[:200]}' is not one this server answers to (--allowed-hosts)",
                             code="host_not_allowed")
        if not self.hosts.origin_allowed(scope.get("method", "GET"), origin, host):
            return Forbidden(f"Origin '{origin[:200]}' may not make requests to this server (--cors-origins)",
                             code="origin_not_allowed")
        public = (path == "/health" or (self.settings.webui and is_public(path))
                  or (self.settings.metrics_public and path == "/metrics"))
        if self.keys and not public and not self._authorized(headers):
            return Unauthorized("Incorrect or missing API key")
        length = headers.get("content-length")
        if path.startswith("/v1/") and length is not None and length.isdigit() and int(length) > limit:
            return PayloadTooLarge(f"request body of {length} bytes is over the {limit}-byte limit")
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = [500]

        async def counted(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            refusal = self._refusal(scope)
            if refusal is not None:
                await refusal.response(envelope(scope.get("path", "")))(scope, receive, counted)
            else:
                await self.app(scope, receive, counted)
        finally:
            route = getattr(scope.get("route"), "path", None) or (
                f"{ASSETS}/{{file}}" if scope.get("path", "").startswith(ASSETS + "/") else "unmatched")
            self.metrics.requests.labels(route, str(status[0])).inc()
