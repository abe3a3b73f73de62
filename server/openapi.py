"""The OpenAPI document says what the server really answers: the error envelope on every
status it can give (400 for every validation failure: FastAPI's 422 never happens
here), the SSE stream beside the JSON body of the generating endpoints, plain text on
/metrics, 503 from /health while loading."""

from __future__ import annotations

from typing import Any, Optional

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict

from .protocol import ErrorResponse

WHY = {
    400: "Invalid request: a field out of range or unsupported (named in `error.param`), "
         "or prompt plus completion over the context (`context_length_exceeded`)",
    401: "Missing or wrong API key (when the server has one)",
    404: "Unknown model (`model_not_found`) or path",
    413: "Request body over the server's limit",
    429: "The model's queue is full (`Retry-After` says when to try again)",
    500: "The model failed to load or generation failed",
}
API_ERRORS = (400, 401, 404, 413, 429, 500)


def errors(*statuses: int) -> dict[int, dict]:
    """Responses entries for these statuses, each in OpenAI's error envelope."""
    return {s: {"model": ErrorResponse, "description": WHY[s]} for s in statuses}


def generating(model: type[BaseModel], events: str) -> dict[int, dict]:
    """A generating endpoint's answers: `model` as JSON, or with `stream: true` the SSE
    stream of `events`; and its errors (refusals come before a stream starts)."""
    return {200: {"model": model, "description": f"The reply; with `stream: true`, {events}",
                  "content": {"text/event-stream": {"schema": {"type": "string", "description": events}}}},
            **errors(*API_ERRORS)}


class ResponseObject(BaseModel):
    """A Responses API reply (`object: "response"`), as documented by OpenAI."""

    model_config = ConfigDict(extra="allow")
    id: str
    object: str = "response"
    created_at: float
    status: str
    model: str
    output: list[dict[str, Any]]
    usage: Optional[dict[str, Any]] = None
    error: Optional[dict[str, Any]] = None
    incomplete_details: Optional[dict[str, Any]] = None


def install(app: FastAPI) -> None:
    """Generate the document once, without FastAPI's 422 entries and their schemas."""
    def openapi() -> dict:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, routes=app.routes,
                              description="OpenAI-compatible API over packed GGUF models")
            for ops in doc.get("paths", {}).values():
                for op in ops.values():
                    op.get("responses", {}).pop("422", None)
            schemas = doc.get("components", {}).get("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                schemas.pop(name, None)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi
