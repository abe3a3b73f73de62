"""The administrative endpoints: health, metrics, the model list, load and unload,
tokenize and detokenize: protocol, serving, routes."""
