"""POST /v1/responses: the response object as JSON, or with `stream: true` its events."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ..core.openapi import generating, sse_event
from ..core.streaming import folded, openai_stream
from .protocol import ResponseObject, ResponsesRequest
from .serving import ResponsesServing

router = APIRouter()

EVENT = sse_event({"type": "object", "required": ["type", "sequence_number"],
                   "properties": {"type": {"type": "string"}, "sequence_number": {"type": "integer"}}},
                  event={"type": "string", "pattern": "^(response\\.|error$)",
                         "description": "the event's type, as its data's `type` says"}, done=False)


def responses(request: Request) -> ResponsesServing:
    return request.app.state.responses


@router.post("/v1/responses", responses=generating(
    ResponseObject, "Responses events (`event:` and `data:` lines, from `response.created` to "
                    "`response.completed`)", EVENT))
@router.post("/responses", include_in_schema=False)
async def create_response(req: ResponsesRequest, request: Request):
    request.app.state.catalog.answering(req)
    if req.stream:
        return openai_stream(await responses(request).stream(req))
    return await folded(request, responses(request).create(req))
