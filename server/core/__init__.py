"""Shared pieces of every API: errors and the handlers that render them, the base wire
models, the OpenAPI document, streaming replies, middleware, metrics, the chat page."""
