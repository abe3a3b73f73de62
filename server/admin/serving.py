"""The administrative endpoints' logic: health (startup's progress and failures), the
model list, loading and unloading on request (models, and LoRA adapters: .adapters),
/tokenize and /detokenize, the metrics."""

from __future__ import annotations

from fastapi.responses import JSONResponse, Response

from ...engine import TemplateWorkers, encode
from ..chat.wire import token_text
from ..core.errors import BadRequest
from ..core.metrics import Metrics
from ..core.pools import Pools
from ..models.catalog import Catalog, Entry
from ..models.residency import Residency
from .adapters import RuntimeAdapters
from .protocol import DetokenizeRequest, Model, ModelAction, ModelActionResult, ModelList, TokenizeRequest


def tokenize(lm, text: str, add_special: bool, with_pieces: bool) -> dict:
    ids = encode(lm.tokenizer, text, add_special=add_special)
    if not with_pieces:
        return {"tokens": ids}
    return {"tokens": [{"id": t, "piece": token_text(lm.tokenizer, t)} for t in ids]}


def detokenize(lm, ids: list[int]) -> dict:
    n = lm.model.vocab_size
    bad = next((i for i, t in enumerate(ids) if not 0 <= t < n), None)
    if bad is not None:
        raise BadRequest(f"token id {ids[bad]} is outside the vocabulary (0..{n - 1})", param=f"tokens.{bad}")
    return {"content": lm.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)}


class AdminServing:
    """Over the catalog, its residency, startup's state (server.lifespan) and the metrics."""

    def __init__(self, catalog: Catalog, residency: Residency, startup: dict, metrics: Metrics, pools: Pools,
                 templates: TemplateWorkers):
        self.catalog, self.residency, self.startup, self.metrics = catalog, residency, startup, metrics
        self.pools, self.templates = pools, templates
        self.adapters = RuntimeAdapters(catalog, residency)

    def health(self):
        """200 while the server can take work; 503 while it loads, if its start failed, or while
        a pool refuses work or holds work past its deadline, or a render has waited over a
        second for a chat-template worker (`busy` says which: readiness fails, and a balancer
        sends the work elsewhere)."""
        state = self.startup
        if state["error"] is not None:
            return JSONResponse({"status": "error", "error": str(state["error"])}, status_code=503)
        if not state["ready"]:
            return JSONResponse({"status": "loading"}, status_code=503)
        busy = self.pools.trouble()
        if (templates := self.templates.state())["full"]:
            busy["templates"] = templates
        if busy:
            return JSONResponse({"status": "busy", "busy": busy}, status_code=503)
        return {"status": "ok", **({"failed": state["failed"]} if state["failed"] else {})}

    def prometheus(self) -> Response:
        return Response(self.metrics.render(), media_type=self.metrics.content_type)

    def describe(self, e: Entry) -> Model:
        return Model(id=e.id, loaded=e.lm is not None, status=self.residency.state(e), memory_bytes=e.memory or None,
                     error=e.error, vision=e.vision, **(e.info or {}))

    def models(self) -> ModelList:
        """Every model, the generative ones first (a client that picks the first one chats),
        each LoRA adapter after its model as `<model>+<adapter>`."""
        entries = sorted(self.catalog.entries.values(), key=lambda e: (e.info or {}).get("kind", "chat") != "chat")
        data = []
        for e in entries:
            data.append(self.describe(e))
            data += [self.describe(e).model_copy(update={"id": name}) for name in self.catalog.adapter_names_of(e.id)]
        return ModelList(data=data)

    def model(self, model_id: str) -> Model:
        return self.describe(self.catalog.get(model_id))

    async def load(self, req: ModelAction) -> ModelActionResult:
        entry = await self.pools.loads.run(self.residency.ensure_loaded, self.catalog.get(req.model), req.keep_alive)
        return ModelActionResult(model=entry.id, status=self.residency.state(entry))

    async def unload(self, req: ModelAction) -> ModelActionResult:
        entry = self.catalog.get(req.model)
        await self.pools.loads.run(self.residency.unload, entry)
        return ModelActionResult(model=entry.id, status=self.residency.state(entry))

    async def tokenize(self, req: TokenizeRequest) -> dict:
        async with self.residency.holding(req.model, req.keep_alive) as entry:
            return await self.pools.prompts.run(tokenize, entry.lm, req.content, req.add_special, req.with_pieces)

    async def detokenize(self, req: DetokenizeRequest) -> dict:
        async with self.residency.holding(req.model, req.keep_alive) as entry:
            return await self.pools.prompts.run(detokenize, entry.lm, req.tokens)
