"""Errors the API returns, each rendered in OpenAI's `{"error": {...}}` shape (or
Anthropic's on its paths), and the app's exception handlers that turn every failure
(ours, a validation error, a routing error, a bug) into one of them, in one place."""

from __future__ import annotations

import logging
import os
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("gguf_serve.server")


ABSOLUTE_PATH = re.compile(r"(?<![\w:/.~-])(?:/[^\s'\"/:,;()\[\]]+)+/([^\s'\"/:,;()\[\]]+)")
LONG_RUN = re.compile(r"\S{200,}")
MAX_MESSAGE = 1000  # characters of an error message, at most


def _on_disk(path: str) -> bool:
    """Whether an absolute path is this machine's (a file or the folder it was in), not an
    API's (/v1/models)."""
    return os.path.exists(path) or os.path.isdir(os.path.dirname(path))


def public(text: str) -> str:
    """An error's text as a client may see it: absolute paths of this machine's files cut to
    their file's name (the id the user named says enough), any run of 200 characters without a space (a
    file's metadata quoted whole, a token list) cut to its start and its length, and the
    whole at most MAX_MESSAGE characters."""
    text = ABSOLUTE_PATH.sub(lambda m: m.group(1) if _on_disk(m.group(0)) else m.group(0), text)
    text = LONG_RUN.sub(lambda m: f"{m.group(0)[:60]}… ({len(m.group(0))} characters)", text)
    return text if len(text) <= MAX_MESSAGE else f"{text[:MAX_MESSAGE]}… ({len(text)} characters)"


class APIError(Exception):
    """An error with an HTTP status and OpenAI's error fields; its message is cut as
    `public` says (no server paths, nothing quoted at length)."""

    status = 400
    type = "invalid_request_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        message = public(message)
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def anthropic_body(self) -> dict:
        """Anthropic's envelope: its error type for the status, the message."""
        kind = ANTHROPIC_TYPES.get(self.status, "api_error" if self.status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": self.message}}

    def response(self, envelope: str = "openai"):
        """The error as an HTTP response in OpenAI's shape, Anthropic's or Ollama's (its
        `{"error": message}`)."""
        body = self.anthropic_body() if envelope == "anthropic" else {"error": self.message} \
            if envelope == "ollama" else self.body()
        return JSONResponse(body, status_code=self.status, headers=self.headers)


# Anthropic's error types by HTTP status (its API reference's "Errors")
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 409: "conflict_error", 413: "request_too_large",
                   429: "rate_limit_error", 500: "api_error", 503: "overloaded_error", 529: "overloaded_error"}


def built(kind, **fields):
    """`kind` (a request model) from another API's request's `fields` (those not None):
    what it cannot be is a 400 naming the field, as that API's own validation would."""
    try:
        return kind(**{k: v for k, v in fields.items() if v is not None})
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise BadRequest(f"{where}: {first.get('msg', 'invalid')}", param=where or None) from None


def envelope(path: str) -> str:
    """The error envelope of the API a path is in: Anthropic's (/v1/messages), Ollama's
    (/api/...), else OpenAI's."""
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return "anthropic"
    return "ollama" if path.startswith("/api/") else "openai"


class BadRequest(APIError):
    """The request is malformed or asks for something not supported."""


class ContextLengthExceeded(APIError):
    """Prompt plus requested completion do not fit the model's context."""

    def __init__(self, message: str, param: str = "messages"):
        super().__init__(message, param=param, code="context_length_exceeded")


class Unauthorized(APIError):
    """Missing or wrong API key."""

    status = 401
    type = "authentication_error"


class Forbidden(APIError):
    """The request may not be served: a Host or Origin a browser sent that this server does
    not answer to, or a model that exists where it comes from but that this server may not
    fetch (a gated or private Hub repository without a token that has access)."""

    status = 403
    type = "permission_error"


class ModelNotFound(APIError):
    """The requested model is not one this server knows, or not where its ID points."""

    status = 404

    def __init__(self, model: str, detail: str | None = None):
        super().__init__(f"The model '{model}' does not exist" + (f": {detail}" if detail else ""), param="model",
                         code="model_not_found")


class PayloadTooLarge(APIError):
    """The request body is over the configured limit."""

    status = 413


class Conflict(APIError):
    """The request conflicts with what the server is doing (unloading a model in use)."""

    status = 409


class Overloaded(APIError):
    """The model's queue is full."""

    status = 429
    type = "rate_limit_error"


class HTTPStatus(APIError):
    """A routing-level HTTP error (unknown path, wrong method) with its own status."""

    def __init__(self, status: int, message: str, *, code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message, code=code, headers=headers)
        self.status = status


def not_supported(message: str) -> HTTPStatus:
    """llama-server's 501 for a feature this server was started without."""
    e = HTTPStatus(501, message, code="not_supported")
    e.type = "not_supported_error"
    return e


class InternalError(APIError):
    """Something failed inside the server."""

    status = 500
    type = "server_error"


class Unavailable(APIError):
    """Something the request needs is out of reach for now (the Hub does not answer, a
    load failed for a cause that may pass): retry, `Retry-After` says when."""

    status = 503
    type = "server_error"


class ModelLoadFailed(APIError):
    """The model file could not be loaded, by its own fault (corrupt, not supported): it
    stays failed."""

    status = 500
    type = "server_error"


# ---------------------------------------------------------- the app's handlers


async def _json_error(request: Request, error: dict) -> str:
    """What is wrong with a body that is not JSON, and where (line and column)."""
    reason = (error.get("ctx") or {}).get("error", "not valid JSON")
    loc = error.get("loc") or ()
    pos = loc[-1] if loc and isinstance(loc[-1], int) else None
    if pos is None:
        return f"the request body is not valid JSON: {reason}"
    body = (await request.body()).decode("utf-8", "replace")
    line = body.count("\n", 0, pos) + 1
    col = pos - (body.rfind("\n", 0, pos) + 1) + 1
    return f"the request body is not valid JSON: {reason} at line {line}, column {col} (character {pos})"


def reply(error: APIError, request: Request):
    """`error` as the response, in the envelope of the API the request went to."""
    return error.response(envelope(request.url.path))


async def api_error(request: Request, exc: APIError):
    return reply(exc, request)


async def validation_error(request: Request, exc: RequestValidationError):
    """A body that fails validation: a 400 naming the field (FastAPI's 422 never happens)."""
    first = exc.errors()[0] if exc.errors() else {}
    if first.get("type") == "json_invalid":  # loc holds a character offset, not a field
        return reply(BadRequest(await _json_error(request, first)), request)
    ctx = first.get("ctx") or {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    whole = first.get("type") in ("missing", "model_attributes_type", "dict_type", "model_type")
    if whole and not ctx.get("field") and tuple(first.get("loc", ())) == ("body",):  # no body, or not an object
        kind = request.headers.get("content-type", "")
        if first.get("type") == "missing":
            msg = "the request needs a JSON body (Content-Type: application/json)"
        elif not kind.startswith("application/json"):
            msg = (f"the body must be JSON sent with Content-Type: application/json (this one came as "
                   f"{kind.split(';')[0] or 'no content type'}; curl: -H 'Content-Type: application/json')")
        else:
            msg = "the body must be a JSON object ({...})"
        return reply(BadRequest(msg), request)
    param = ctx.get("field") or ".".join(loc) or None
    msg = first.get("msg", "invalid request")
    return reply(BadRequest(f"{param}: {msg}" if param else msg, param=param), request)


async def http_error(request: Request, exc: StarletteHTTPException):
    """Routing's errors (unknown path, wrong method) in the API's envelope."""
    where = f"{request.method} {request.url.path}"
    if exc.status_code == 404:
        return reply(HTTPStatus(404, f"Invalid URL ({where}): this server does not serve that path",
                                code="unknown_url"), request)
    if exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow")  # Starlette's router names the methods it serves
        return reply(HTTPStatus(405, f"{where}: method not allowed" + (f" (allowed: {allowed})" if allowed else ""),
                                headers=dict(exc.headers or {})), request)
    return reply(HTTPStatus(exc.status_code, f"{where}: {exc.detail}", headers=dict(exc.headers or {})), request)


async def unexpected(request: Request, exc: Exception):
    log.exception("unexpected error")
    return reply(InternalError(f"internal error: {type(exc).__name__}: {exc}"), request)


def install_handlers(app: FastAPI) -> None:
    """Every failure a route can raise, answered in the envelope of the API it went to."""
    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)
