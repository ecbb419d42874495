"""The engine's rotary table gives exactly what the model's own rotary module computes, for every family."""

from __future__ import annotations

import pytest
import torch

from asyncrl.engine.architectures import SUPPORTED_MODEL_TYPES
from asyncrl.engine.model_runner import RotaryTable
from asyncrl.testing.models import tiny_family_model


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_looked_up_cos_sin_equal_the_modules_bit_for_bit(model_type: str) -> None:
    model = tiny_family_model(model_type, tied=True)
    rotary = model.model.rotary_emb
    table = RotaryTable(rotary, max_len=100, dtype=torch.float32, device=torch.device("cpu"))
    assert table.table is not None
    positions = torch.randint(0, 101, (5, 7), generator=torch.Generator().manual_seed(0))
    hidden = torch.zeros(5, 7, model.config.hidden_size)
    for looked_up, computed in zip(table(hidden, positions), rotary(hidden, positions), strict=True):
        assert torch.equal(looked_up, computed)


def test_a_rope_that_depends_on_the_longest_position_is_computed_per_step() -> None:
    dynamic = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    model = tiny_family_model("qwen2", tied=True, max_position_embeddings=32, rope_parameters=dynamic)
    rotary = model.model.rotary_emb
    table = RotaryTable(rotary, max_len=100, dtype=torch.float32, device=torch.device("cpu"))
    assert table.table is None
    positions = torch.arange(80)[None]
    hidden = torch.zeros(1, 80, model.config.hidden_size)
    for mine, module in zip(table(hidden, positions), rotary(hidden, positions), strict=True):
        assert torch.equal(mine, module)
