"""gguf_serve.engine: GGUF → torch model with packed layers, kernels per device,
tokenizer and chat template, generation. Built on gguf_io; knows nothing of HTTP."""

from .loader import LoadedModel, load_model

__all__ = ["LoadedModel", "load_model"]
