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

    def response(self):
        """The error as an HTTP response in OpenAI's shape."""
        from fastapi.responses import JSONResponse

        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


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
