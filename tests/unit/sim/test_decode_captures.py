"""The capture cost model (``asyncrl.sim.decode_captures``) by hand, and the rollouts it plans: the real
scheduler over requests that carry only their lengths (that it plans the engine's own shapes is checked against
an engine in ``tests/unit/engine/test_engine_capture_policy.py``)."""

from __future__ import annotations

import pytest

from asyncrl.sim.decode_captures import (
    capture_overhead,
    captured_shapes,
    decode_shapes,
    uses_per_shape,
    wake_cost,
)

ONE_ROW_64 = (1, ((0, 1, 64),))


def test_a_wake_costs_its_eager_steps_captures_and_replays_by_hand():
    """Shapes run 1, 2 and 10 steps, a replay half an eager step: captured at the 3rd step, the first two run
    1 and 2 eager steps and the third 2 eager + 3 (capture) + 8 replays of 0.5; captured at first use, each
    pays 3 and replays every step."""
    uses = [1, 2, 10]
    assert wake_cost(uses, 3, 0.5) == 1 + 2 + (2 + 3 + 8 * 0.5)
    assert wake_cost(uses, 1, 0.5) == (3 + 0.5) + (3 + 1) + (3 + 5)
    assert capture_overhead(uses, 3, 0.5) == pytest.approx(12 - 0.5 * 13)
    assert capture_overhead(uses, 1, 0.5) == pytest.approx(3 * 3)  # three captures, nothing else
    assert [captured_shapes(uses, k) for k in (1, 2, 3, 11)] == [3, 2, 1, 0]


def test_one_request_decodes_at_one_shape_after_its_prefill():
    """A 3-token prompt and 5 output tokens: the prefill samples the first, four decode steps the rest, each at
    batch 1 in the shortest length level."""
    shapes = decode_shapes([3], [5], num_slots=2, max_model_len=100, max_kv_tokens=1000)
    assert shapes == [ONE_ROW_64] * 4
    assert uses_per_shape(shapes) == [4]


def test_a_finished_row_is_refilled_while_the_others_decode():
    """Three requests on two slots: the third is admitted when the first ends and prefilled beside the
    second's decode step, in which its row idles at position 0 (a batch of 2); the last row alone is compacted
    into slot 0 (a batch of 1). Eight decode row-steps (1 + 5 + 2) in five steps."""
    shapes = decode_shapes([4, 4, 4], [2, 6, 3], num_slots=2, max_model_len=100, max_kv_tokens=1000)
    assert [batch for batch, _ in shapes] == [2, 2, 2, 2, 1]


def test_the_context_cap_ends_a_request_as_the_engine_does():
    shapes = decode_shapes([60], [50], num_slots=1, max_model_len=64, max_kv_tokens=1000)
    assert len(shapes) == 64 - 60 - 1  # the prefill's token, then decode up to 64 tokens in all


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match="2 prompts but 1 output"):
        decode_shapes([3, 4], [5], num_slots=2, max_model_len=100, max_kv_tokens=1000)
