"""Errors the API returns, each rendered in OpenAI's `{"error": {...}}` shape."""

from __future__ import annotations


class APIError(Exception):
    """An error with an HTTP status and OpenAI's error fields."""

    status = 400
    type = "invalid_request_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
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

    def response(self, anthropic: bool = False):
        """The error as an HTTP response in OpenAI's shape (or Anthropic's)."""
        from fastapi.responses import JSONResponse

        return JSONResponse(self.anthropic_body() if anthropic else self.body(), status_code=self.status,
                            headers=self.headers)


# Anthropic's error types by HTTP status (its API reference's "Errors")
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 409: "conflict_error", 413: "request_too_large",
                   429: "rate_limit_error", 500: "api_error", 503: "overloaded_error", 529: "overloaded_error"}


def anthropic_path(path: str) -> bool:
    """Whether a path is Anthropic's API (its errors in Anthropic's envelope)."""
    return path == "/v1/messages" or path.startswith("/v1/messages/")


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
    """The model exists where it comes from, but this server may not fetch it (a gated or
    private Hub repository without a token that has access)."""

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


class InternalError(APIError):
    """Something failed inside the server."""

    status = 500
    type = "server_error"


class Unavailable(APIError):
    """Something the request needs is out of reach for now (the Hub does not answer)."""

    status = 503
    type = "server_error"


class ModelLoadFailed(APIError):
    """The model file could not be loaded."""

    status = 500
    type = "server_error"
