"""The HTTP API: thin routes mapping a return value (a response model, an SSE stream,
an error) to an HTTP response. Errors become OpenAI's `{"error": {...}}` in one place."""

from __future__ import annotations

import asyncio
import hmac
import logging
import sys
import threading
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from fastapi.responses import Response

from .embeddings import Embeddings
from .errors import APIError, BadRequest, HTTPStatus, InternalError, PayloadTooLarge, Unauthorized, anthropic_path
from .metrics import Metrics
from .openapi import (API_ERRORS, AnthropicMessage, EmbeddingList, RerankList, ResponseObject, TokenCount,
                      anthropic_errors, errors, generating, install, ref, sse_event)
from .protocol import (ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, Completion, CompletionRequest,
                       CountTokensRequest, DetokenizeRequest, EmbeddingRequest, MessagesRequest, Model, ModelAction,
                       ModelActionResult, ModelList, RerankRequest, ResponsesRequest, TokenizeRequest)
from .messages import Messages
from .registry import Registry
from .responses import Responses
from .service import Service
from .wire import detokenize, sse_error, tokenize
from .settings import ServerSettings
from . import webui

log = logging.getLogger("gguf_serve.server")


class BodyLimit:
    """ASGI middleware: a request body over `limit` bytes is refused with 413 while it is
    read, whatever its framing (Content-Length is checked before, in `guard`; a chunked
    body has none). The error is raised from `receive`, inside the app, so it becomes
    the usual error response."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise StarletteHTTPException(413, f"request body over the {self.limit}-byte limit")
            return message

        await self.app(scope, limited, send)


class Guard:
    """ASGI middleware in front of everything: the API key (every path but /health and the
    chat page's own files: `/metrics` and the docs name models and traffic), a Content-Length over the body
    limit refused before the body is read, and the request counter by route and status.
    Plain ASGI, so that `receive` reaches the routes untouched (a route watching for the
    client's `http.disconnect` sees it)."""

    def __init__(self, app, settings: ServerSettings, metrics: Metrics):
        self.app, self.settings, self.metrics = app, settings, metrics

    def _authorized(self, headers: dict) -> bool:
        """`Authorization: Bearer <key>` (the scheme in any case, RFC 9110) or Anthropic's
        `x-api-key: <key>`, compared in constant time."""
        scheme, _, key = headers.get("authorization", "").strip().partition(" ")
        want = self.settings.api_key.encode()
        if "x-api-key" in headers and hmac.compare_digest(headers["x-api-key"].strip().encode(), want):
            return True
        return scheme.lower() == "bearer" and hmac.compare_digest(key.strip().encode(), want)

    def _refusal(self, scope) -> APIError | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        path, limit = scope.get("path", ""), self.settings.max_body_bytes
        public = path == "/health" or (self.settings.webui and webui.is_public(path))
        if self.settings.api_key and not public and not self._authorized(headers):
            return Unauthorized("Incorrect or missing API key")
        length = headers.get("content-length")
        if path.startswith("/v1/") and length is not None and length.isdigit() and int(length) > limit:
            return PayloadTooLarge(f"request body of {length} bytes is over the {limit}-byte limit")
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = [500]

        async def counted(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            refusal = self._refusal(scope)
            if refusal is not None:
                await refusal.response(anthropic_path(scope.get("path", "")))(scope, receive, counted)
            else:
                await self.app(scope, receive, counted)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.requests.labels(route, str(status[0])).inc()


class CancellingStream(StreamingResponse):
    """A streamed reply that cancels its generation however it ends: also when the
    client hangs up before the first line is sent (the body's own `finally` never runs
    for a generator that was never started)."""

    def __init__(self, content, cancel: threading.Event, **kwargs):
        super().__init__(content, **kwargs)
        self.cancel = cancel

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.cancel.set()


async def until_disconnected(request: Request) -> None:
    """Returns once the client has gone (the body is read by then: what `receive` gives
    next is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work):
    """Await `work` (a coroutine); if the client hangs up first, cancel it (its
    generation leaves the batch at the next step) and return None."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(until_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if task in done:
        return task.result()
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, Exception):
        pass
    return None


async def _json_error(request: Request, error: dict) -> str:
    """What is wrong with a body that is not JSON, and where (line and column)."""
    reason = (error.get("ctx") or {}).get("error", "not valid JSON")
    loc = error.get("loc") or ()
    pos = loc[-1] if loc and isinstance(loc[-1], int) else None
    if pos is None:
        return f"the request body is not valid JSON: {reason}"
    body = (await request.body()).decode("utf-8", "replace")
    line = body.count("\n", 0, pos) + 1
    col = pos - (body.rfind("\n", 0, pos) + 1) + 1
    return f"the request body is not valid JSON: {reason} at line {line}, column {col} (character {pos})"


def reply(error: APIError, request: Request):
    """`error` as the response, in the envelope of the API the request went to."""
    return error.response(anthropic_path(request.url.path))


def create_app(settings: ServerSettings) -> FastAPI:
    metrics = Metrics()
    registry = Registry(settings, metrics)
    service = Service(registry, settings, metrics)
    responses = Responses(service)
    messages = Messages(service)
    embeddings = Embeddings(service)
    state = {"ready": False, "error": None, "failed": {}, "fatal": False}

    def startup() -> None:
        """Register and load the named models; one that fails is reported and the others
        served. If every named model fails, the process exits non-zero with the reasons."""
        try:
            for i, spec in enumerate(settings.models):  # named models are fetched and loaded now
                alias = settings.alias[i] if i < len(settings.alias) else None
                try:
                    added = registry.add(spec, alias, mmproj=settings.mmproj if i == 0 else None)
                    if not isinstance(added, list):  # a directory's models load on first request
                        registry.ensure_loaded(added)
                except Exception as e:  # this model only
                    reason = str(e.message if isinstance(e, APIError) else e)
                    state["failed"][spec] = reason
                    registry.add_failed(spec, e)
                    log.error("%s: %s", spec, reason)
            if settings.models and len(state["failed"]) == len(settings.models):
                state["fatal"] = True
                reasons = "; ".join(state["failed"].values())
                print(f"gguf-serve: no model could be served: {reasons}", file=sys.stderr, flush=True)
                shutdown = getattr(app.state, "shutdown", None)  # set by the CLI: it then exits with status 1
                if shutdown is not None:
                    shutdown()
                return
            registry.add_cached()  # the Hub cache's GGUF models, loaded on first request
            if not settings.models:  # and with none named, the embedded default
                registry.add("default")
            state["ready"] = True
            bad = f" ({len(state['failed'])} failed: see /health)" if state["failed"] else ""
            base = f"http://{settings.host}:{settings.port}"
            page = f"; chat page at {base}/" if settings.webui else ""
            print(f"gguf-serve: ready, {len(registry.entries) - len(state['failed'])} model(s){bad}; OpenAI API at "
                  f"{base}/v1{page}", flush=True)
        except Exception as e:
            state["error"] = e
            log.error("startup failed: %s", e)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        threading.Thread(target=startup, name="startup", daemon=True).start()
        reaping = threading.Event()
        reaper = threading.Thread(target=registry.reap, args=(reaping,), name="idle-unload", daemon=True)
        reaper.start()
        yield
        reaping.set()  # and woken, so that it has ended before the interpreter does
        with registry.cond:
            registry.cond.notify_all()
        reaper.join(5)
        workers = [e.worker for e in registry.entries.values() if e.worker is not None]
        for w in workers:
            w.stop()
        deadline = time.monotonic() + 10  # their steps end first: a forward still running in torch's or the
        for w in workers:  # kernels' threads while the process exits aborts it ("terminate called ...")
            w.thread.join(max(0.0, deadline - time.monotonic()))

    app = FastAPI(title="gguf-serve", lifespan=lifespan)
    install(app)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(Guard, settings=settings, metrics=metrics)  # outermost: before the body is read
    app.state.registry = registry
    if settings.webui:
        webui.mount(app)
    app.state.startup = state  # the CLI reads "fatal" once uvicorn returns

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError):
        return reply(exc, request)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":  # loc holds a character offset, not a field
            return reply(BadRequest(await _json_error(request, first)), request)
        ctx = first.get("ctx") or {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        param = ctx.get("field") or ".".join(loc) or None
        msg = first.get("msg", "invalid request")
        return reply(BadRequest(f"{param}: {msg}" if param else msg, param=param), request)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        where = f"{request.method} {request.url.path}"
        if exc.status_code == 404:
            return reply(HTTPStatus(404, f"Invalid URL ({where}): this server does not serve that path",
                                    code="unknown_url"), request)
        if exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow")  # Starlette's router names the methods it serves
            return reply(HTTPStatus(405, f"{where}: method not allowed" + (f" (allowed: {allowed})" if allowed else ""),
                                    headers=dict(exc.headers or {})), request)
        return reply(HTTPStatus(exc.status_code, f"{where}: {exc.detail}", headers=dict(exc.headers or {})), request)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):
        log.exception("unexpected error")
        return reply(InternalError(f"internal error: {type(exc).__name__}: {exc}"), request)

    @app.get("/metrics", response_class=PlainTextResponse, responses={
        200: {"description": "Prometheus text format", "content": {"text/plain": {}}}, **errors(401)})
    async def prometheus_metrics():
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.get("/health", responses={200: {"description": "Serving; `failed` lists models that could not load"},
                                   503: {"description": "Loading, or startup failed"}})
    async def health():
        if state["error"] is not None:
            return JSONResponse({"status": "error", "error": str(state["error"])}, status_code=503)
        if not state["ready"]:
            return JSONResponse({"status": "loading"}, status_code=503)
        return {"status": "ok", **({"failed": state["failed"]} if state["failed"] else {})}

    def describe(e) -> Model:
        return Model(id=e.id, loaded=e.lm is not None, status=registry.state(e), memory_bytes=e.memory or None,
                     error=e.error, vision=e.vision, **(e.info or {}))

    @app.get("/v1/models", responses=errors(401))
    async def list_models() -> ModelList:
        return ModelList(data=[describe(e) for e in registry.entries.values()])

    @app.get("/v1/models/{model_id:path}", responses=errors(401, 404))
    async def get_model(model_id: str) -> Model:
        return describe(registry.get(model_id))

    @app.post("/models/load", responses=errors(*API_ERRORS))
    async def load_route(req: ModelAction) -> ModelActionResult:
        """Load a model now (llama-server's router), making room as a request would."""
        entry = await asyncio.to_thread(registry.ensure_loaded, registry.get(req.model), req.keep_alive)
        return ModelActionResult(model=entry.id, status=registry.state(entry))

    @app.post("/models/unload", responses=errors(*API_ERRORS, 409))
    async def unload_route(req: ModelAction) -> ModelActionResult:
        """Unload a model now and free its memory; 409 while requests hold it."""
        entry = registry.get(req.model)
        await asyncio.to_thread(registry.unload, entry)
        return ModelActionResult(model=entry.id, status=registry.state(entry))

    async def stream(gen_and_cancel) -> StreamingResponse:
        gen, cancel = gen_and_cancel

        async def body():
            try:
                async for line in gen:
                    yield line
            except APIError as e:
                yield sse_error(e.body())
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.exception("stream failed")
                yield sse_error(InternalError(str(e)).body())
        return CancellingStream(body(), cancel, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @app.post("/tokenize", responses=errors(*API_ERRORS))
    async def tokenize_route(req: TokenizeRequest):
        async with service.holding(req.model, req.keep_alive) as entry:
            return await asyncio.to_thread(tokenize, entry.lm, req.content, req.add_special, req.with_pieces)

    @app.post("/detokenize", responses=errors(*API_ERRORS))
    async def detokenize_route(req: DetokenizeRequest):
        async with service.holding(req.model, req.keep_alive) as entry:
            return await asyncio.to_thread(detokenize, entry.lm, req.tokens)

    def gone() -> Response:  # nobody reads it: the client has hung up
        return Response(status_code=499)

    @app.post("/v1/chat/completions", responses=generating(
        ChatCompletion, "`chat.completion.chunk` objects as `data:` lines, then `data: [DONE]`",
        sse_event(ref(ChatCompletionChunk))))
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        if req.stream:
            return await stream(await service.chat_stream(req))
        return await unless_disconnected(request, service.chat(req)) or gone()

    @app.post("/v1/completions", responses=generating(
        Completion, "`text_completion` objects as `data:` lines, then `data: [DONE]`", sse_event(ref(Completion))))
    async def completions(req: CompletionRequest, request: Request):
        if req.stream:
            return await stream(await service.completion_stream(req))
        return await unless_disconnected(request, service.completion(req)) or gone()

    @app.post("/v1/responses", responses=generating(
        ResponseObject, "Responses events (`event:` and `data:` lines, from `response.created` to "
                        "`response.completed`)",
        sse_event({"type": "object", "required": ["type", "sequence_number"],
                   "properties": {"type": {"type": "string"}, "sequence_number": {"type": "integer"}}},
                  event={"type": "string", "pattern": "^(response\\.|error$)",
                         "description": "the event's type, as its data's `type` says"}, done=False)))
    async def create_response(req: ResponsesRequest, request: Request):
        if req.stream:
            return await stream(await responses.stream(req))
        return await unless_disconnected(request, responses.create(req)) or gone()

    @app.post("/v1/embeddings", responses=errors(*API_ERRORS))
    async def create_embeddings(req: EmbeddingRequest) -> EmbeddingList:
        """OpenAI's embeddings, for embedding files (a pooling type in the file)."""
        return EmbeddingList(**await embeddings.embeddings(req))

    @app.post("/v1/rerank", responses=errors(*API_ERRORS))
    @app.post("/rerank", include_in_schema=False)
    async def rerank(req: RerankRequest) -> RerankList:
        """llama-server's and Jina's rerank, for reranking files (Qwen3-Reranker's)."""
        return RerankList(**await embeddings.rerank(req))

    @app.post("/v1/messages", responses={**generating(
        AnthropicMessage, "Anthropic's events (`event:` and `data:` lines, from `message_start` to `message_stop`)",
        sse_event({"type": "object", "required": ["type"], "properties": {"type": {"type": "string"}}},
                  event={"type": "string", "description": "the event's type, as its data's `type` says"},
                  done=False)), **anthropic_errors(*API_ERRORS)})
    async def create_message(req: MessagesRequest, request: Request):
        """Anthropic's Messages API over the chat path; errors in Anthropic's envelope."""
        if req.stream:
            lines, cancel = await messages.stream(req)
            return CancellingStream(lines, cancel, media_type="text/event-stream",
                                    headers={"Cache-Control": "no-cache"})
        return await unless_disconnected(request, messages.create(req)) or gone()

    @app.post("/v1/messages/count_tokens", responses=anthropic_errors(*API_ERRORS))
    async def count_message_tokens(req: CountTokensRequest) -> TokenCount:
        return TokenCount(**await messages.count_tokens(req))

    return app
