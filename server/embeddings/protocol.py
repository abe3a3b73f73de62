"""The embeddings (OpenAI's /v1/embeddings) and rerank (llama-server's and Jina's
/v1/rerank) wire format: requests and replies."""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, Field

from ..core.protocol import OpenAIRequest


class EmbeddingRequest(OpenAIRequest):
    model: Optional[str] = None  # as on chat completions
    input: Union[str, list[str], list[int], list[list[int]]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[int] = Field(default=None, ge=1)
    user: Optional[str] = None


class RerankRequest(OpenAIRequest):
    """llama-server's and Jina's /v1/rerank."""

    model: Optional[str] = None  # as on chat completions
    query: str
    documents: list[Union[str, dict[str, Any]]] = Field(min_length=1)
    top_n: Optional[int] = Field(default=None, ge=1)
    return_documents: bool = False


class EmbeddingList(BaseModel):
    """OpenAI's embeddings reply: `data` of `{object: "embedding", index, embedding}` (floats,
    or base64 of little-endian float32 with `encoding_format: "base64"`)."""

    object: str = "list"
    data: list[dict[str, Any]]
    model: str
    usage: dict[str, int]


class RerankList(BaseModel):
    """llama-server's rerank reply: `results` of `{index, relevance_score[, document]}`, best first."""

    object: str = "list"
    model: str
    results: list[dict[str, Any]]
    usage: dict[str, int]
