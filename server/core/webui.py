"""The chat page: static files shipped in the package (server/webui/), served at `/` and
`/webui/` by the API's own process. The page is a client of the public API only
(`/v1/models`, streamed `/v1/chat/completions`); it keeps conversations, settings and
the API key in the browser's localStorage, so nothing of it is stored here."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

FILES = Path(__file__).parent.parent / "webui"  # server/webui/, shipped as package data
ASSETS = "/webui"

# Everything the page loads comes from this server; what the model writes is rendered as
# escaped text, and no inline script or style could run if some slipped through.
POLICY = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
          "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def is_public(path: str) -> bool:
    """The page's own paths, which the API key does not guard (the page asks for the key)."""
    return path == "/" or path.startswith(ASSETS + "/")


class Assets(StaticFiles):
    """The page's scripts and styles, revalidated on each load (a new version is seen at once)."""

    def file_response(self, *args, **kwargs):
        response = super().file_response(*args, **kwargs)
        response.headers["Cache-Control"] = "no-cache"
        return response


def mount(app: FastAPI) -> None:
    """Serve the page at `/` (GET and HEAD) and its files under /webui/."""
    app.mount(ASSETS, Assets(directory=FILES), name="webui")

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(FILES / "index.html", media_type="text/html",
                            headers={"Cache-Control": "no-cache", "Content-Security-Policy": POLICY,
                                     "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"})
