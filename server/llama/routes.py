"""llama-server's own endpoints: POST /completion (and /completions' llama-server form is
OpenAI's), /infill, /apply-template, GET /props; streams as llama-server's `data:` lines."""

from __future__ import annotations

from typing import Optional

from fastapi import APIRouter, Request

from ..chat.protocol import ChatCompletionRequest
from ..core.streaming import CancellingStream, folded
from .protocol import LlamaCompletionRequest, LlamaInfillRequest
from .serving import LlamaServing, sse

router = APIRouter(tags=["llama-server"])


def llama(request: Request) -> LlamaServing:
    return request.app.state.llama


async def _answer(request: Request, req, infill: bool):
    prep, chunks = await llama(request).completion(req, infill)
    if req.stream:
        async def lines():
            async for c in chunks:
                yield sse(c)
        return CancellingStream(lines(), prep.job.cancel, media_type="text/event-stream")

    async def last():
        out = None
        async for c in chunks:
            out = c
        return out
    return await folded(request, last())


@router.post("/completion")
async def completion(req: LlamaCompletionRequest, request: Request):
    """llama-server's native completion: its fields, its reply (`content`, `stop_type`, `timings`)."""
    return await _answer(request, req, False)


@router.post("/infill")
async def infill(req: LlamaInfillRequest, request: Request):
    """Fill-in-the-middle for editors: `input_prefix`, `input_suffix`, `input_extra` chunks."""
    return await _answer(request, req, True)


@router.post("/apply-template")
async def apply_template(req: ChatCompletionRequest, request: Request):
    return await llama(request).apply_template(req)


@router.get("/props")
async def props(request: Request, model: Optional[str] = None):
    return llama(request).props(model)
