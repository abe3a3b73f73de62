"""OpenAI's Responses API (stateless): protocol, serving, routes."""
