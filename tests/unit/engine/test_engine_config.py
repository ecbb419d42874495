"""EngineConfig validation names the dotted key."""

from __future__ import annotations

import pytest

from asyncrl.config.engine import EngineConfig


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_running_requests": 0}, "engine.max_running_requests must be >= 1, got 0"),
        ({"max_kv_tokens": -1}, "engine.max_kv_tokens must be >= 1, got -1"),
        ({"max_prefill_tokens_per_step": 0}, "engine.max_prefill_tokens_per_step must be >= 1, got 0"),
        ({"max_model_len": 1}, "engine.max_model_len must be >= 2"),
        ({"kv_on_update": "drop"}, "engine.kv_on_update must be one of 'keep', 'recompute', got 'drop'"),
    ],
)
def test_bad_values_name_the_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**kwargs)
