"""Anthropic's Messages API: protocol, serving, routes."""
