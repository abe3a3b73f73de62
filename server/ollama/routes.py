"""Ollama's API (its docs/api.md) on the same port: /api/version, /api/tags, /api/show,
/api/ps, /api/chat and /api/generate (NDJSON lines, `stream` true by default),
/api/embed, /api/embeddings, /api/pull and /api/delete; errors as Ollama's `{"error":
message}` (server.core.errors.envelope)."""

from __future__ import annotations

import json
import threading
from typing import Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ..core.openapi import API_ERRORS, WHY, errors
from ..core.streaming import CancellingStream, folded
from .protocol import (OllamaChatRequest, OllamaEmbeddingsRequest, OllamaEmbedRequest, OllamaError,
                       OllamaGenerateRequest, OllamaModelRequest)
from .serving import VERSION, OllamaServing, empty_chunk

router = APIRouter(tags=["Ollama"])
NDJSON = "application/x-ndjson"
ANY = {"schema": {}}
# Ollama's answers: JSON, or with `stream` (its default) NDJSON lines; errors in its envelope
MODEL = errors(*API_ERRORS, 408, envelope=OllamaError)
STREAMED = {200: {"description": "The reply; with `stream` (the default), NDJSON lines, the last with `done`",
                  "content": {"application/json": ANY, NDJSON: ANY}},
            **MODEL, 499: {"description": WHY[499]}}
LISTING = {200: {"description": "Ollama's listing"}, **errors(401, 403, envelope=OllamaError)}


def ollama(request: Request) -> OllamaServing:
    return request.app.state.ollama


async def _answer(request: Request, prep, out, stream: bool, empty: Callable[[], dict] | None = None):
    """The NDJSON lines of `out` (the reply's chunks), or the chunks folded into one reply;
    `out` a dict: a reply made at once (a load, a pull). A stream silent for
    --sse-ping-interval gets an `empty()` chunk, which Ollama's clients add as nothing."""
    if isinstance(out, dict):
        return CancellingStream(_once(out), threading.Event(), media_type=NDJSON) if stream else out
    if stream:
        ping = (lambda: json.dumps(empty()) + "\n") if empty is not None else None
        return CancellingStream(_ndjson(out), prep.job.cancel, ping=ping, media_type=NDJSON)
    return await folded(request, _fold(out))


async def _once(chunk: dict):
    yield json.dumps(chunk) + "\n"


async def _ndjson(chunks):
    try:
        async for c in chunks:
            yield json.dumps(c, ensure_ascii=False) + "\n"
    except Exception as e:  # after the first line: the error as Ollama puts it, a last line
        yield json.dumps({"error": getattr(e, "message", str(e))}) + "\n"


async def _fold(chunks) -> dict:
    """A non-streamed reply: the chunks' text, thinking and tool calls in the last one."""
    text, thinking, calls, last = [], [], [], {}
    async for c in chunks:
        part = c.get("message") or c
        text.append(part.get("content", part.get("response", "")) or "")
        thinking.append(part.get("thinking") or "")
        calls += part.get("tool_calls") or []
        last = c
    body = "".join(text)
    if "message" in last:
        last["message"] = {"role": "assistant", "content": body, **({"thinking": "".join(thinking)} if any(thinking)
                                                                     else {}), **({"tool_calls": calls} if calls else {})}
    else:
        last["response"] = body
        if any(thinking):
            last["thinking"] = "".join(thinking)
    return last


@router.get("/api/version", responses=errors(401, 403, envelope=OllamaError))
async def version():
    return {"version": VERSION}


@router.get("/api/tags", responses=LISTING)
async def tags(request: Request):
    return ollama(request).tags()


@router.get("/api/ps", responses=LISTING)
async def ps(request: Request):
    return ollama(request).ps()


@router.post("/api/show", responses=MODEL)
async def show(req: OllamaModelRequest, request: Request):
    o = ollama(request)
    return await o.service.pools.loads.run(o.show, req.named())


@router.post("/api/chat", responses=STREAMED)
async def chat(req: OllamaChatRequest, request: Request):
    return await _answer(request, *await ollama(request).chat(req), req.stream, lambda: empty_chunk(req.model, "chat"))


@router.post("/api/generate", responses=STREAMED)
async def generate(req: OllamaGenerateRequest, request: Request):
    return await _answer(request, *await ollama(request).generate(req), req.stream,
                         lambda: empty_chunk(req.model, "generate"))


@router.post("/api/embed", responses={**MODEL, 413: errors(413, envelope=OllamaError)[413]})
async def embed(req: OllamaEmbedRequest, request: Request):
    return await ollama(request).embed(req)


@router.post("/api/embeddings", responses={**MODEL, 429: errors(429, envelope=OllamaError)[429]})
async def embeddings(req: OllamaEmbeddingsRequest, request: Request):
    return await ollama(request).embeddings_one(req)


@router.post("/api/pull", responses=STREAMED)
async def pull(req: OllamaModelRequest, request: Request):
    return await _answer(request, None, await ollama(request).pull(req.named()), req.stream)


@router.delete("/api/delete", responses={**MODEL, 409: errors(409, envelope=OllamaError)[409]})
async def delete(req: OllamaModelRequest, request: Request):
    o = ollama(request)
    await o.service.pools.loads.run(o.delete, req.named())
    return JSONResponse({})
