"""The administrative endpoints' wire format: the model list (OpenAI's, with the
server's extensions), loading and unloading (llama-server's router), /tokenize and
/detokenize (llama-server's)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel

from ..core.protocol import OpenAIRequest


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "gguf-serve"
    # --- gguf-serve extensions ---
    loaded: bool = False
    status: Literal["unloaded", "loading", "loaded", "failed"] = "unloaded"
    memory_bytes: Optional[int] = None  # what it holds loaded (files and caches), or took when last loaded
    context_length: Optional[int] = None
    quantization: Optional[str] = None
    size_bytes: Optional[int] = None
    chat_template: Optional[bool] = None  # False: the file has none (a base model); chat uses a fallback
    vision: bool = False  # a vision file goes with it: chat messages may hold images
    kind: Optional[Literal["chat", "embedding", "rerank"]] = None  # what it serves (None: not read yet)
    error: Optional[str] = None  # set when the model cannot be served (its file failed to read or load)


class ModelAction(OpenAIRequest):
    """POST /models/load and /models/unload (llama-server's router)."""

    model: str


class ModelActionResult(BaseModel):
    success: bool = True
    model: str
    status: Literal["unloaded", "loading", "loaded", "failed"]


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]


class TokenizeRequest(OpenAIRequest):
    """llama-server's /tokenize: text to the model's token ids."""

    model: Optional[str] = None  # default: the only model served
    content: str
    add_special: bool = False  # BOS (and EOS) as the file asks
    with_pieces: bool = False  # each id with its text


class DetokenizeRequest(OpenAIRequest):
    model: Optional[str] = None
    tokens: list[int]


class LoadLoraAdapter(OpenAIRequest):
    """POST /v1/load_lora_adapter (vLLM's): an adapter file served as the model `lora_name`."""

    lora_name: str
    lora_path: str
    model: Optional[str] = None  # the base model (default: the one served)


class UnloadLoraAdapter(OpenAIRequest):
    """POST /v1/unload_lora_adapter (vLLM's)."""

    lora_name: str
    lora_int_id: Optional[int] = None  # vLLM's; the name says which
