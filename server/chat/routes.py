"""POST /v1/chat/completions and /v1/completions: the reply as JSON, or with
`stream: true` as server-sent events."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ..core.openapi import generating, ref, sse_event
from ..core.streaming import folded, openai_stream
from .protocol import ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, Completion, CompletionRequest
from .serving import ChatServing

router = APIRouter()


def chat(request: Request) -> ChatServing:
    return request.app.state.chat


@router.post("/v1/chat/completions", responses=generating(
    ChatCompletion, "`chat.completion.chunk` objects as `data:` lines, then `data: [DONE]`",
    sse_event(ref(ChatCompletionChunk))))
@router.post("/chat/completions", include_in_schema=False)  # llama-server's routes without /v1
async def chat_completions(req: ChatCompletionRequest, request: Request):
    request.app.state.catalog.answering(req)
    if req.stream:
        return openai_stream(await chat(request).chat_stream(req))
    return await folded(request, chat(request).chat(req))


@router.post("/v1/completions", responses=generating(
    Completion, "`text_completion` objects as `data:` lines, then `data: [DONE]`", sse_event(ref(Completion))))
@router.post("/completions", include_in_schema=False)
async def completions(req: CompletionRequest, request: Request):
    request.app.state.catalog.answering(req)
    if req.stream:
        return openai_stream(await chat(request).completion_stream(req))
    return await folded(request, chat(request).completion(req))
