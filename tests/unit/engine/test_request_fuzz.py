"""Property-based fuzzing of every request field the engine accepts: each bad value is refused with an
error naming the field (and the request), no value is silently accepted, and nothing that passes the checks
can crash the engine's step loop."""

from __future__ import annotations

import functools
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from asyncrl.config.engine import EngineConfig
from asyncrl.engine.llm_engine import LLMEngine
from asyncrl.testing.fuzz import is_int, is_number, values
from asyncrl.testing.models import tiny_qwen2
from asyncrl.types import InvalidRequest, Request, SamplingParams

FUZZ = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MAX_MODEL_LEN = 32


def valid_sampling_value(name: str, value: Any) -> bool:
    """The specification of each SamplingParams field, written independently of the code under test."""
    if name in ("max_new_tokens",):
        return is_int(value) and value >= 1
    if name == "temperature":
        return is_number(value) and math.isfinite(value) and value >= 0
    if name == "top_p":
        return is_number(value) and 0 < value <= 1
    if name == "top_k":
        return is_int(value) and value >= 0
    if name == "stop_token_ids":
        return isinstance(value, list | tuple) and all(is_int(t) and t >= 0 for t in value)
    if name == "stop_strings":
        return isinstance(value, list | tuple) and all(isinstance(s, str) and s for s in value)
    if name == "seed":
        return value is None or is_int(value)
    if name == "ignore_eos":
        return isinstance(value, bool)
    raise AssertionError(name)


SAMPLING_FIELDS = [
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop_token_ids",
    "stop_strings",
    "seed",
    "ignore_eos",
]


@FUZZ
@given(name=st.sampled_from(SAMPLING_FIELDS), value=values)
def test_sampling_params_accept_exactly_the_valid_values_and_name_the_field(name, value):
    try:
        params = SamplingParams(**{name: value})
    except (TypeError, ValueError) as err:
        assert not valid_sampling_value(name, value), f"{name}={value!r} is valid but was refused: {err}"
        assert name in str(err)
        return
    assert valid_sampling_value(name, value), f"{name}={value!r} was silently accepted"
    stored = getattr(params, name)
    if name in ("stop_token_ids", "stop_strings"):
        assert stored == tuple(value) and isinstance(stored, tuple)


@functools.cache
def shared_engine() -> LLMEngine:
    config = EngineConfig(max_running_requests=4, max_kv_tokens=256, max_model_len=MAX_MODEL_LEN)
    return LLMEngine(tiny_qwen2(), None, config)


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    """A valid request with up to two of its fields replaced by anything at all (often none, so accepted
    requests reach the step loop as often as refused ones reach the checks)."""
    vocab = shared_engine().model.config.vocab_size
    n_prefix = draw(st.integers(0, 2))
    fields: dict[str, Any] = {
        "request_id": draw(st.text(min_size=1, max_size=6)),
        "prompt_token_ids": draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=6)),
        "sampling": draw(
            st.one_of(
                st.builds(
                    SamplingParams,
                    max_new_tokens=st.integers(1, 4),
                    temperature=st.floats(0, 2),
                    top_p=st.floats(0.05, 1),
                    top_k=st.integers(0, 5),
                    stop_token_ids=st.lists(st.integers(0, vocab - 1), max_size=2),
                    seed=st.one_of(st.none(), st.integers(0, 2**63 - 1)),
                    ignore_eos=st.booleans(),
                ),
                st.dictionaries(st.sampled_from(SAMPLING_FIELDS + ["bogus"]), values, max_size=2),
            )
        ),
        "version": draw(st.one_of(st.none(), st.integers(0, 3))),
        "affinity_key": draw(st.one_of(st.none(), st.text(max_size=4))),
        "prefix_token_ids": [1] * n_prefix,
        "prefix_logprobs": [-0.5] * n_prefix,
        "prefix_versions": [0] * n_prefix,
    }
    for name in draw(st.sets(st.sampled_from(sorted(fields)), max_size=2)):
        fields[name] = draw(values)
    return fields


@FUZZ
@given(fields=requests())
def test_the_engine_refuses_bad_requests_by_name_and_survives_every_accepted_one(fields):
    engine = shared_engine()
    request = Request(**fields)
    try:
        engine.add_request(request)
    except (TypeError, ValueError) as err:
        rid = fields["request_id"]
        assert (isinstance(rid, str) and rid in str(err)) or "request_id" in str(err), str(err)
        assert not engine.has_work()
        return
    event("accepted")
    try:
        for _ in range(3):
            engine.step()  # an accepted request must never crash the step loop
    finally:
        engine.abort(request.request_id)
    assert not engine.has_work()


def test_the_engine_serves_a_good_request_after_the_fuzzing():
    engine = shared_engine()
    engine.add_request(
        Request(request_id="good", prompt_token_ids=[1, 2], sampling=SamplingParams(max_new_tokens=2))
    )
    for _ in range(10):
        finished = engine.step()
        if finished:
            assert finished[0].request_id == "good" and len(finished[0].token_ids) == 2
            return
    pytest.fail("the engine did not finish a good request")


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"prompt_token_ids": "abc"}, "prompt_token_ids"),
        ({"prompt_token_ids": [1, True]}, "prompt_token_ids"),
        ({"prompt_token_ids": [1, 2.0]}, "prompt_token_ids"),
        ({"request_id": 7}, "request_id"),
        ({"version": "3"}, "version"),
        ({"affinity_key": 5}, "affinity_key"),
        (
            {"prefix_token_ids": [1], "prefix_logprobs": [float("nan")], "prefix_versions": [0]},
            "prefix_logprobs",
        ),
        ({"prefix_token_ids": [1], "prefix_logprobs": [-1.0], "prefix_versions": ["0"]}, "prefix_versions"),
        ({"sampling": {"top_k": 2.5}}, "top_k"),
        ({"sampling": "greedy"}, "sampling"),
    ],
)
def test_each_bad_field_is_an_invalid_request_naming_it(fields, named):
    request = Request(**{"request_id": "r1", "prompt_token_ids": [1, 2], **fields})
    with pytest.raises(InvalidRequest, match=named):
        shared_engine().add_request(request)
