"""Embeddings (OpenAI's) and rerank (llama-server's and Jina's): protocol, serving, routes."""
