"""The HTTP API: the app's state (the model catalog and its residency, each API's
serving object) and one router per API (server.<api>.routes), behind the guard and
the body limit. Errors become each API's envelope in one place (server.core.errors)."""

from __future__ import annotations

from fastapi import FastAPI

from .admin.routes import router as admin_router
from .admin.serving import AdminServing
from .anthropic.routes import router as anthropic_router
from .anthropic.serving import MessagesServing
from .chat.routes import router as chat_router
from .chat.serving import ChatServing
from .core import webui
from .core.errors import install_handlers
from .core.metrics import Metrics
from .core.middleware import BodyLimit, Guard
from .core.openapi import install
from .embeddings.routes import router as embeddings_router
from .embeddings.serving import EmbeddingsServing
from .lifespan import lifespan_for, new_state
from .models.catalog import Catalog
from .models.residency import Residency
from .responses.routes import router as responses_router
from .responses.serving import ResponsesServing
from .settings import ServerSettings

ROUTERS = (admin_router, chat_router, responses_router, embeddings_router, anthropic_router)


def create_app(settings: ServerSettings) -> FastAPI:
    metrics = Metrics()
    catalog = Catalog(settings)
    residency = Residency(catalog, settings, metrics)
    startup = new_state()
    app = FastAPI(title="gguf-serve", lifespan=lifespan_for(settings, catalog, residency, startup))
    install(app)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(Guard, settings=settings, metrics=metrics)  # outermost: before the body is read
    if settings.webui:
        webui.mount(app)
    install_handlers(app)
    chat = ChatServing(residency, settings, metrics)
    app.state.catalog, app.state.residency = catalog, residency
    app.state.startup = startup  # the CLI reads "fatal" once uvicorn returns
    app.state.admin = AdminServing(catalog, residency, startup, metrics)
    app.state.chat = chat
    app.state.responses = ResponsesServing(chat)
    app.state.messages = MessagesServing(chat)
    app.state.embeddings = EmbeddingsServing(residency)
    for router in ROUTERS:
        app.include_router(router)
    return app
