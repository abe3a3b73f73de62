"""POST /v1/embeddings (OpenAI's) and /v1/rerank (llama-server's and Jina's; /rerank too)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ..core.openapi import API_ERRORS, errors
from .protocol import EmbeddingList, EmbeddingRequest, RerankList, RerankRequest
from .serving import EmbeddingsServing

router = APIRouter()


def embeddings(request: Request) -> EmbeddingsServing:
    return request.app.state.embeddings


@router.post("/v1/embeddings", responses=errors(*API_ERRORS))
@router.post("/embeddings", include_in_schema=False)
async def create_embeddings(req: EmbeddingRequest, request: Request) -> EmbeddingList:
    """OpenAI's embeddings, for embedding files (a pooling type in the file)."""
    request.app.state.catalog.answering(req)
    return EmbeddingList(**await embeddings(request).embeddings(req))


@router.post("/v1/rerank", responses=errors(*API_ERRORS))
@router.post("/rerank", include_in_schema=False)
async def rerank(req: RerankRequest, request: Request) -> RerankList:
    """llama-server's and Jina's rerank, for reranking files (Qwen3-Reranker's)."""
    request.app.state.catalog.answering(req)
    return RerankList(**await embeddings(request).rerank(req))
