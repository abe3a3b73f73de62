"""gguf_serve.server: the user-facing side: CLI, HTTP API (OpenAI protocol), model
registry. Uses the engine to run models and gguf_io to look at files; neither knows
about it."""
