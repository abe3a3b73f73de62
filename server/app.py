"""The HTTP API: the app's state (the model catalog and its residency, each API's
serving object) and one router per API (server.<api>.routes), behind the guard and
the body limit. Errors become each API's envelope in one place (server.core.errors)."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from .admin.routes import router as admin_router
from .admin.serving import AdminServing
from .anthropic.routes import router as anthropic_router
from .anthropic.serving import MessagesServing
from .audio.routes import router as audio_router
from .audio.serving import TranscriptionServing
from .chat.routes import router as chat_router
from ..engine import TemplateWorkers
from .chat.serving import ChatServing
from .core import webui
from .core.errors import install_handlers
from .core.metrics import Metrics
from .core.middleware import BodyLimit, Guard
from .core.pools import Pools
from .core.openapi import install
from .embeddings.routes import router as embeddings_router
from .embeddings.serving import EmbeddingsServing
from .lifespan import lifespan_for, new_state
from .llama.routes import router as llama_router
from .llama.serving import LlamaServing
from .models.catalog import Catalog
from .models.residency import Residency
from .ollama.routes import router as ollama_router
from .ollama.serving import OllamaServing
from .responses.routes import router as responses_router
from .responses.serving import ResponsesServing
from .settings import ServerSettings

ROUTERS = (admin_router, chat_router, responses_router, audio_router, embeddings_router, anthropic_router,
           ollama_router, llama_router)


def create_app(settings: ServerSettings) -> FastAPI:
    metrics = Metrics()
    catalog = Catalog(settings)
    pools = Pools()
    residency = Residency(catalog, settings, metrics, pool=pools.loads)
    startup = new_state()
    templates = TemplateWorkers(settings.template_workers, settings.template_timeout)
    on_exit = [templates.aclose, pools.aclose]
    app = FastAPI(title="gguf-serve", lifespan=lifespan_for(settings, catalog, residency, startup, on_exit))
    install(app)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(Guard, settings=settings, metrics=metrics)  # before the body is read
    if settings.cors_origins:  # outermost: a browser's preflight carries no key, and changes nothing
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["*"],
                           allow_headers=["*"], expose_headers=["*"])
    if settings.webui:
        webui.mount(app)
    install_handlers(app)
    chat = ChatServing(residency, settings, templates, pools, metrics)
    on_exit.append(chat.media.fetcher.aclose)
    app.state.catalog, app.state.residency, app.state.settings = catalog, residency, settings
    app.state.startup = startup  # the CLI reads "fatal" once uvicorn returns
    app.state.admin = AdminServing(catalog, residency, startup, metrics, pools, templates)
    app.state.chat, app.state.templates = chat, templates
    app.state.responses = ResponsesServing(chat)
    app.state.messages = MessagesServing(chat)
    app.state.transcriptions = TranscriptionServing(chat)
    app.state.embeddings = EmbeddingsServing(residency, pools)
    app.state.ollama = OllamaServing(chat, app.state.embeddings, catalog, residency)
    app.state.llama = LlamaServing(chat, catalog, residency)
    for router in ROUTERS:
        app.include_router(router)
    return app
