"""``engine.dtype``: the serving dtype, resolved apart from the trainer's master dtype."""

import pytest

from asyncrl.config.engine import EngineConfig, serving_dtype


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
