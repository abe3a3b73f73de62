"""The OpenAPI document says what the server really answers: the error envelope on every
status it can give (400 for every validation failure: FastAPI's 422 never happens
here; 403 on every path, from the Host and Origin check; 408 on every POST), the SSE stream beside the
JSON body of the generating endpoints, plain text on /metrics, 503 from /health while
loading."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from .protocol import ErrorResponse

WHY = {
    400: "Invalid request: a field out of range or unsupported (named in `error.param`), "
         "or prompt plus completion over the context (`context_length_exceeded`)",
    401: "Missing or wrong API key (when the server has one)",
    403: "A Host or Origin (a browser's) that this server does not answer to (`host_not_allowed`, "
         "`origin_not_allowed`: --allowed-hosts, --cors-origins); or the model's Hub repository refuses this "
         "server (gated, or private without a token that has access)",
    404: "Unknown model (`model_not_found`) or path",
    408: "The request's body did not all arrive within 60 s",
    409: "The model is in use by requests (unload it once they end)",
    413: "Request body over the server's limit",
    429: "The model's queue is full, or it was unloaded under the request (`Retry-After` says when to try again)",
    500: "The model file failed to load (corrupt or not supported: it stays failed) or generation failed",
    503: "The model is loading, or waits for room that models in use hold, past --load-wait; or its load failed "
         "for a cause that may pass (memory, the file system: the next request loads again); or the Hub does not "
         "answer (`Retry-After` says when to try again)",
    501: "A feature this server was started without (llama-server's /slots: --slot-save-path, --slots)",
    499: "The client closed the connection before the reply (nobody reads it; no body)",
}
API_ERRORS = (400, 401, 403, 404, 413, 429, 500, 503)  # a request that names a model: each can come of it


def errors(*statuses: int, envelope: type[BaseModel] = ErrorResponse) -> dict[int, dict]:
    """Responses entries for these statuses, each in OpenAI's error envelope (or the
    API's own: Anthropic's)."""
    return {s: {"model": envelope, "description": WHY[s]} for s in statuses}


STREAM_MODELS: list[type[BaseModel]] = []  # chunk models that only streams carry, added to the components


def sse_event(data: dict, *, event: dict | None = None, done: bool = True) -> dict:
    """The schema of one server-sent event of a stream (OpenAPI 3.0/3.1 put it under
    `schema`; validators such as schemathesis check each parsed event against it): its
    `data` line is a JSON document shaped by `data` (or `[DONE]` at the end), `event` the
    event line where the stream names its events."""
    payload = {"type": "string", "contentMediaType": "application/json", "contentSchema": data,
               "description": "one JSON object"}
    if done:  # the last data line is not JSON
        payload = {"anyOf": [payload, {"type": "string", "const": "[DONE]"}],
                   "description": "one JSON object, or `[DONE]` after the last"}
    props = {"data": payload, "id": {"type": "string"}, "retry": {"type": "integer"}}
    props["event"] = event or {"type": "string", "enum": ["message"], "description": "unnamed (`message`)"}
    return {"type": "object", "required": ["data"], "properties": props}


def generating(model: type[BaseModel], events: str, event_schema: dict) -> dict[int, dict]:
    """A generating endpoint's answers: `model` as JSON, or with `stream: true` the SSE
    stream of `events` (each event shaped by `event_schema`, see sse_event); and its
    errors (refusals come before a stream starts; a reply not streamed whose client
    left first is a 499)."""
    return {200: {"model": model, "description": f"The reply; with `stream: true`, {events}",
                  "content": {"text/event-stream": {"schema": event_schema}}},
            **errors(*API_ERRORS), 499: {"description": WHY[499]}}


def ref(model: type[BaseModel]) -> dict:
    """A reference to `model`'s schema in the document's components (a chunk model that
    no route returns as JSON is added there by install)."""
    if model not in STREAM_MODELS:
        STREAM_MODELS.append(model)
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def install(app: FastAPI) -> None:
    """Generate the document once, without FastAPI's 422 entries and their schemas."""
    def openapi() -> dict:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, routes=app.routes,
                              description="OpenAI-compatible API over packed GGUF models")
            envelope = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
            for ops in doc.get("paths", {}).values():
                for op in ops.values():
                    op.get("responses", {}).pop("422", None)
                    # the guard's Host and Origin check answers any path
                    op.setdefault("responses", {}).setdefault("403", {"description": WHY[403], "content": envelope})
            for ops in doc.get("paths", {}).values():  # and a body that does not arrive in time, any POST
                if "post" in ops:
                    ops["post"]["responses"].setdefault("408", {"description": WHY[408], "content": envelope})
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                schemas.pop(name, None)
            for model in STREAM_MODELS:  # the streamed events' data, referenced by sse_event schemas
                if model.__name__ not in schemas:
                    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                    for name, sub in schema.pop("$defs", {}).items():
                        schemas.setdefault(name, sub)
                    schemas[model.__name__] = schema
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi
