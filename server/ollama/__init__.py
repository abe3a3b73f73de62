"""Ollama's native API (/api/...) on the same port, over the chat and embeddings paths."""
