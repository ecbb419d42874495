"""EngineConfig validation names the dotted key; `engine.dtype` resolves the serving dtype apart from the master dtype."""

from __future__ import annotations

import pytest

from asyncrl.config.engine import EngineConfig, serving_dtype


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


@pytest.mark.parametrize(
    ("engine_dtype", "model_dtype", "device", "expected"),
    [
        ("auto", "float32", "cuda", "bfloat16"),
        ("auto", "float32", "cpu", "float32"),
        ("auto", "bfloat16", "cpu", "bfloat16"),
        ("float32", "float32", "cuda", "float32"),
        ("float16", "float32", "cpu", "float16"),
    ],
)
def test_serving_dtype_follows_engine_dtype_then_device(engine_dtype, model_dtype, device, expected):
    assert serving_dtype(engine_dtype, model_dtype, device) == expected


def test_unknown_engine_dtype_is_refused_by_name():
    with pytest.raises(ValueError, match="engine.dtype must be one of"):
        EngineConfig(dtype="int8")
