"""One tiny tokenizer + model pair per session, saved once, for the model-tooling tests."""

from __future__ import annotations

import pytest

from asyncrl.models.corpus import sample_texts
from asyncrl.models.loading import save_tiny
from asyncrl.models.tiny import build_tiny


@pytest.fixture(scope="session")
def tiny_pair():
    return build_tiny(sample_texts(600), vocab_size=400, hidden_size=64, num_heads=2, num_layers=2)


@pytest.fixture(scope="session")
def tiny_dir(tiny_pair, tmp_path_factory):
    model, tokenizer = tiny_pair
    return save_tiny(model, tokenizer, tmp_path_factory.mktemp("tiny"))
