"""llama-server's own endpoints: POST /completion (and /completions' llama-server form is
OpenAI's), /infill, /apply-template, GET /props, GET /slots and POST /slots/ID, GET and POST
/lora-adapters; streams as llama-server's `data:` lines."""

from __future__ import annotations

from typing import Any, Optional

from fastapi import APIRouter, Body, Request

from ..chat.protocol import ChatCompletionRequest
from ..core.openapi import API_ERRORS, WHY, errors
from ..core.protocol import LoraChoice
from ..core.streaming import CancellingStream, folded
from .protocol import LlamaCompletionRequest, LlamaInfillRequest
from .serving import LlamaServing, sse

router = APIRouter(tags=["llama-server"])
STREAMED = {200: {"description": "llama-server's reply; with `stream`, its `data:` lines, the last with `stop`",
                  "content": {"application/json": {"schema": {}}, "text/event-stream": {"schema": {}}}},
            **errors(*API_ERRORS, 408), 499: {"description": WHY[499]}}


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


@router.post("/completion", responses=STREAMED)
async def completion(req: LlamaCompletionRequest, request: Request):
    """llama-server's native completion: its fields, its reply (`content`, `stop_type`, `timings`)."""
    return await _answer(request, req, False)


@router.post("/infill", responses=STREAMED)
async def infill(req: LlamaInfillRequest, request: Request):
    """Fill-in-the-middle for editors: `input_prefix`, `input_suffix`, `input_extra` chunks."""
    return await _answer(request, req, True)


@router.post("/apply-template", responses=errors(*API_ERRORS, 408))
async def apply_template(req: ChatCompletionRequest, request: Request):
    return await llama(request).apply_template(req)


@router.get("/props", responses=errors(401, 403, 404, 400))
async def props(request: Request, model: Optional[str] = None):
    return llama(request).props(model)


@router.get("/slots", responses=errors(400, 401, 403, 404, 501, 503))
async def slots(request: Request, model: Optional[str] = None, fail_on_no_slot: Optional[str] = None):
    """Each sequence slot of the model: what it holds, whether it is generating (llama-server's
    list; `fail_on_no_slot`: a 503 when every slot is busy). --no-slots: a 501."""
    return await llama(request).slots.table(model, bool(fail_on_no_slot))


@router.post("/slots/{id_slot}", responses=errors(*API_ERRORS, 408, 501))
async def slot_action(id_slot: int, action: str, request: Request, model: Optional[str] = None,
                      body: dict[str, Any] = Body(default_factory=dict)):
    """`action=save` (`{"filename": ...}`: the slot's tokens and KV state to --slot-save-path),
    `restore` (a saved state back into the slot, for the next prompt that starts with it) or
    `erase`. A slot that is generating is a 400; without --slot-save-path a 501."""
    return await llama(request).slots.act(id_slot, action, body, model)


@router.get("/lora-adapters", responses=errors(400, 401, 403, 404))
async def lora_adapters(request: Request, model: Optional[str] = None):
    """The model's LoRA adapters (--lora): id, path and the scale a request that names none
    runs with (llama-server's list)."""
    return llama(request).adapters(model)


@router.post("/lora-adapters", responses=errors(400, 401, 403, 404, 408))
async def set_lora_adapters(choices: list[LoraChoice], request: Request, model: Optional[str] = None):
    """The scales requests that name no adapters run with: those listed, the others 0
    (llama-server's); the list back."""
    return llama(request).set_adapters(choices, model)
