"""POST /v1/embeddings (OpenAI's), /embedding (llama-server's: every token's vector with pooling
none) and /v1/rerank (llama-server's and Jina's; /rerank too)."""

from __future__ import annotations

from typing import Optional, Union

from fastapi import APIRouter, Request
from pydantic import Field

from ..core.openapi import API_ERRORS, errors
from ..core.protocol import OpenAIRequest
from .protocol import EmbeddingList, EmbeddingRequest, RerankList, RerankRequest
from .serving import EmbeddingsServing

router = APIRouter()


def embeddings(request: Request) -> EmbeddingsServing:
    return request.app.state.embeddings


@router.post("/v1/embeddings", responses=errors(*API_ERRORS))
@router.post("/embeddings", include_in_schema=False)
async def create_embeddings(req: EmbeddingRequest, request: Request) -> EmbeddingList:
    """OpenAI's embeddings, for embedding files (a pooling type in the file)."""
    request.app.state.catalog.answering(req, "embedding")
    return EmbeddingList(**await embeddings(request).embeddings(req))


class NativeEmbeddingRequest(OpenAIRequest):
    """llama-server's /embedding."""

    model: Optional[str] = None
    content: Union[str, list[str], list[int], list[list[int]]]
    embd_normalize: int = Field(default=2, ge=-1)


@router.post("/embedding", responses=errors(*API_ERRORS))
async def embedding(req: NativeEmbeddingRequest, request: Request):
    """llama-server's: each input's vector as a row, or with --pooling none every token's."""
    request.app.state.catalog.answering(req, "embedding")
    return await embeddings(request).embedding(EmbeddingRequest(model=req.model, input=req.content,
                                                                keep_alive=req.keep_alive), req.embd_normalize)


@router.post("/v1/rerank", responses=errors(*API_ERRORS))
@router.post("/rerank", include_in_schema=False)
async def rerank(req: RerankRequest, request: Request) -> RerankList:
    """llama-server's and Jina's rerank, for reranking files (Qwen3-Reranker's)."""
    request.app.state.catalog.answering(req, "rerank")
    return RerankList(**await embeddings(request).rerank(req))
