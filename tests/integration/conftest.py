"""Fixtures the integration tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.models.corpus import sample_texts
from asyncrl.models.loading import save_tiny
from asyncrl.models.tiny import build_tiny


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory) -> Path:
    """A tiny random model and its tokenizer saved as a model directory (the real loading code reads it)."""
    model, tokenizer = build_tiny(
        sample_texts(200),
        vocab_size=300,
        hidden_size=64,
        num_heads=2,
        num_layers=2,
        max_position_embeddings=256,
    )
    return save_tiny(model, tokenizer, tmp_path_factory.mktemp("tiny"))
