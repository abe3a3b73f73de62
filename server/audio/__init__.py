"""OpenAI's audio transcriptions (/v1/audio/transcriptions) over the chat path: protocol, serving, routes."""
