"""Server configuration from the command line and GGUF_SERVE_* environment variables."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ServerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GGUF_SERVE_", extra="ignore", protected_namespaces=())

    models: list[str] = Field(default_factory=list, description="model ids or local .gguf paths to serve")
    alias: list[str] = Field(default_factory=list, description="the id each named model is listed as, in order")
    host: str = "127.0.0.1"
    port: int = 8000
    reasoning: Literal["on", "off", "auto"] = "auto"
    reasoning_budget: Optional[int] = Field(default=None, ge=0, description="thinking tokens before the block is closed")
    api_key: Optional[str] = None
    api_key_file: Optional[str] = Field(default=None, description="read the API key from this file (a mounted secret)")
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    ctx_size: Optional[int] = None
    parallel: Optional[int] = Field(default=None, ge=1, description="sequences decoded at once per model")
    max_tokens: int = Field(default=4096, ge=1, description="completion tokens for chat requests that set no limit")
    threads: Optional[int] = None
    offline: bool = False
    max_queue: int = 16
    max_loaded: int = 2
    max_body_bytes: int = 16 * 1024 * 1024

    def model_post_init(self, __context) -> None:
        if self.api_key_file and not self.api_key:
            with open(self.api_key_file) as f:
                self.api_key = f.read().strip()
