"""POST /v1/messages (Anthropic's Messages API: the message as JSON, or with `stream:
true` its events) and /v1/messages/count_tokens; errors in Anthropic's envelope."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ..core.openapi import API_ERRORS, errors, generating, sse_event
from ..core.streaming import event_stream, folded
from .protocol import AnthropicError, AnthropicMessage, CountTokensRequest, MessagesRequest, TokenCount
from .serving import MessagesServing

router = APIRouter()

EVENT = sse_event({"type": "object", "required": ["type"], "properties": {"type": {"type": "string"}}},
                  event={"type": "string", "description": "the event's type, as its data's `type` says"}, done=False)


def messages(request: Request) -> MessagesServing:
    return request.app.state.messages


@router.post("/v1/messages", responses={**generating(
    AnthropicMessage, "Anthropic's events (`event:` and `data:` lines, from `message_start` to `message_stop`)",
    EVENT), **errors(*API_ERRORS, envelope=AnthropicError)})
async def create_message(req: MessagesRequest, request: Request):
    """Anthropic's Messages API over the chat path; errors in Anthropic's envelope."""
    request.app.state.catalog.answering(req)
    if req.stream:
        return event_stream(*await messages(request).stream(req))
    return await folded(request, messages(request).create(req))


@router.post("/v1/messages/count_tokens", responses=errors(*API_ERRORS, envelope=AnthropicError))
async def count_message_tokens(req: CountTokensRequest, request: Request) -> TokenCount:
    request.app.state.catalog.answering(req)
    return TokenCount(**await messages(request).count_tokens(req))
