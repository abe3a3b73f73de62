"""The administrative routes: /health, /metrics, the model list, /models/load and
/models/unload (llama-server's router), LoRA adapters loaded at run time (vLLM's),
/tokenize and /detokenize."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from ..core.openapi import API_ERRORS, errors
from .protocol import (DetokenizeRequest, LoadLoraAdapter, Model, ModelAction, ModelActionResult, ModelList,
                       TokenizeRequest, UnloadLoraAdapter)
from .serving import AdminServing

router = APIRouter()


def admin(request: Request) -> AdminServing:
    return request.app.state.admin


@router.get("/metrics", response_class=PlainTextResponse, responses={
    200: {"description": "Prometheus text format", "content": {"text/plain": {}}}, **errors(401)})
async def prometheus_metrics(request: Request):
    return admin(request).prometheus()


@router.get("/health", responses={200: {"description": "Serving; `failed` lists models that could not load"},
                                  503: {"description": "Loading, or startup failed"}})
async def health(request: Request):
    return admin(request).health()


@router.get("/v1/models", responses=errors(401))
@router.get("/models", include_in_schema=False)  # llama-server's route without /v1
async def list_models(request: Request) -> ModelList:
    return admin(request).models()


@router.get("/v1/models/{model_id:path}", responses=errors(401, 404))
async def get_model(model_id: str, request: Request) -> Model:
    return admin(request).model(model_id)


@router.post("/models/load", responses=errors(*API_ERRORS))
async def load_route(req: ModelAction, request: Request) -> ModelActionResult:
    """Load a model now (llama-server's router), making room as a request would."""
    return await admin(request).load(req)


@router.post("/models/unload", responses=errors(*API_ERRORS, 409))
async def unload_route(req: ModelAction, request: Request) -> ModelActionResult:
    """Unload a model now and free its memory; 409 while requests hold it."""
    return await admin(request).unload(req)


TEXT = {200: {"description": "Success: ...", "content": {"text/plain": {"schema": {"type": "string"}}}}}


@router.post("/v1/load_lora_adapter", responses={**TEXT, **errors(*API_ERRORS, 501)})
async def load_lora_adapter(req: LoadLoraAdapter, request: Request):
    """Load a LoRA adapter file for a model, served as the model `lora_name` (vLLM's; with
    --lora-runtime)."""
    return PlainTextResponse(await admin(request).adapters.load(req))


@router.post("/v1/unload_lora_adapter", responses={**TEXT, **errors(*API_ERRORS, 409, 501)})
async def unload_lora_adapter(req: UnloadLoraAdapter, request: Request):
    """Unload a LoRA adapter loaded at run time or with --lora; 409 while a request uses it."""
    return PlainTextResponse(await admin(request).adapters.unload(req))


@router.post("/tokenize", responses=errors(*API_ERRORS))
async def tokenize_route(req: TokenizeRequest, request: Request):
    return await admin(request).tokenize(req)


@router.post("/detokenize", responses=errors(*API_ERRORS))
async def detokenize_route(req: DetokenizeRequest, request: Request):
    return await admin(request).detokenize(req)
