"""The server's life: at startup, the named models registered and loaded (on a thread,
so that /health answers "loading" meanwhile), the idle reaper started; at shutdown,
the reaper, every model's worker and the chat-template workers stopped before the
interpreter ends."""

from __future__ import annotations

import logging
import sys
import threading
from contextlib import asynccontextmanager

from fastapi import FastAPI

from .core.errors import APIError, public
from .core.hosts import listen_addresses
from .models.catalog import Catalog
from .models.residency import Residency
from .settings import ServerSettings

log = logging.getLogger("gguf_serve.server")


def new_state() -> dict:
    """Startup's progress, as /health reports it and the CLI reads it ("fatal": exit 1)."""
    return {"ready": False, "error": None, "failed": {}, "fatal": False}


def start(app: FastAPI, settings: ServerSettings, catalog: Catalog, residency: Residency, state: dict) -> None:
    """Register and load the named models; one that fails is reported and the others
    served. If every named model fails, the process exits non-zero with the reasons."""
    try:
        for i, spec in enumerate(settings.models):  # named models are fetched and loaded now
            alias = settings.alias[i] if i < len(settings.alias) else None
            try:
                added = catalog.add(spec, alias, mmproj=settings.mmproj if i == 0 else None)
                if i == 0 and settings.adapters():
                    if isinstance(added, list):
                        raise ValueError("--lora goes with a model file, not a directory")
                    catalog.attach_adapters(added, settings.adapters())
                if not isinstance(added, list):  # a directory's models load on first request
                    residency.ensure_loaded(added)
            except Exception as e:  # this model only
                reason = e.message if isinstance(e, APIError) else public(str(e))
                state["failed"][spec] = reason
                catalog.add_failed(spec, e)
                log.error("%s: %s", spec, reason)
        if settings.models and len(state["failed"]) == len(settings.models):
            state["fatal"] = True
            reasons = "; ".join(state["failed"].values())
            print(f"gguf-serve: no model could be served: {reasons}", file=sys.stderr, flush=True)
            shutdown = getattr(app.state, "shutdown", None)  # set by the CLI: it then exits with status 1
            if shutdown is not None:
                shutdown()
            return
        served = [s for s in settings.models if s not in state["failed"]]
        if len(settings.models) == 1 and served and not isinstance(added, list):
            catalog.fallback = added.id  # requests naming no model (or one not served) go to it
        catalog.add_cached()  # the Hub cache's GGUF models, loaded on first request
        if not settings.models:  # and with none named, the embedded default
            catalog.add("default")
        state["ready"] = True
        bad = f" ({len(state['failed'])} failed: see /health)" if state["failed"] else ""
        first = listen_addresses(settings.host)[0]
        scheme = "https" if settings.ssl_certfile else "http"
        base = f"{scheme}://{f'[{first}]' if ':' in first else first}:{settings.port}"
        page = f"; chat page at {base}/" if settings.webui else ""
        print(f"gguf-serve: ready, {len(catalog.entries) - len(state['failed'])} model(s){bad}; OpenAI API at "
              f"{base}/v1{page}", flush=True)
    except Exception as e:
        state["error"] = e
        log.error("startup failed: %s", e)


def lifespan_for(settings: ServerSettings, catalog: Catalog, residency: Residency, state: dict,
                 on_exit: list):
    """The app's lifespan: `start` on a thread and the idle reaper; on the way out, both
    stopped, every worker's thread joined, then `on_exit`'s coroutine functions awaited (the
    chat-template workers, the pools, the image fetcher's connections)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        threading.Thread(target=start, args=(app, settings, catalog, residency, state), name="startup",
                         daemon=True).start()
        reaping = threading.Event()
        reaper = threading.Thread(target=residency.reap, args=(reaping,), name="idle-unload", daemon=True)
        reaper.start()
        yield
        reaping.set()  # and woken, so that it has ended before the interpreter does
        with residency.cond:
            residency.cond.notify_all()
        reaper.join(5)
        residency.stop_workers()
        for close in on_exit:
            await close()

    return lifespan
