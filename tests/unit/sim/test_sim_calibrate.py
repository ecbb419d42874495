import gc
import json

import pytest

from asyncrl.config.sim import LengthConfig
from asyncrl.sim.calibrate import fit_decode_step, fit_line, ratio_agreement, write_lengths_jsonl
from asyncrl.sim.gc_pause import gc_paused
from asyncrl.sim.workload import LengthModel, read_empirical_lengths


def test_fit_line_recovers_an_exact_line():
    intercept, slope = fit_line([100, 200, 400], [0.6, 0.7, 0.9])
    assert intercept == pytest.approx(0.5)
    assert slope == pytest.approx(0.001)


def test_fit_line_clips_a_negative_slope_to_the_mean():
    assert fit_line([1, 2, 3], [3.0, 2.0, 1.0]) == (2.0, 0.0)


def test_fit_line_with_a_negative_intercept_goes_through_the_origin():
    intercept, slope = fit_line([1, 2, 3], [1.0, 3.0, 5.0])  # free fit: -1 + 2x
    assert intercept == 0.0
    assert slope == pytest.approx(22 / 14)


def test_fit_line_with_one_distinct_x_is_the_mean():
    assert fit_line([5, 5], [1.0, 2.0]) == (1.5, 0.0)


def test_fit_line_rejects_mismatched_points():
    with pytest.raises(ValueError, match="as many xs as ys"):
        fit_line([1, 2], [1.0])


def test_fit_decode_step_recovers_flat_then_linear():
    batches = [1, 2, 4, 8, 16, 32]
    times = [0.01 * max(1.0, b / 8) for b in batches]  # 0.01 s up to 8 running, then linear
    scale, knee = fit_decode_step(batches, times)
    assert knee == 8
    assert scale == pytest.approx(0.01)


def test_fit_decode_step_flat_data_puts_the_knee_at_the_largest_batch():
    scale, knee = fit_decode_step([1, 4, 16], [0.02, 0.02, 0.02])
    assert (scale, knee) == (pytest.approx(0.02), 16)


def test_fit_decode_step_least_squares_scale_for_noisy_flat_data():
    scale, knee = fit_decode_step([1, 2], [0.01, 0.03])
    # knee 1: factors (1, 2) -> scale 0.07/5 = 0.014, error 0.00002; knee 2: factors (1, 1) -> 0.02, error 0.0002
    assert knee == 1
    assert scale == pytest.approx(0.014)


def test_written_lengths_read_back_as_empirical(tmp_path):
    path = write_lengths_jsonl([3, 10, 7], tmp_path / "lengths.jsonl")
    assert [json.loads(line) for line in path.read_text().splitlines()] == [3, 10, 7]
    assert read_empirical_lengths(str(path)) == [3, 10, 7]


def test_ratio_agreement_is_relative_to_the_real_ratio():
    assert ratio_agreement(2.0, 2.5) == pytest.approx(0.25)
    assert ratio_agreement(2.0, 1.5) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="real_ratio"):
        ratio_agreement(0.0, 1.0)


def test_gc_paused_disables_then_restores_the_collector():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with gc_paused(False):
        assert gc.isenabled()
    assert gc.isenabled()


def test_per_prompt_lengths_are_shared_by_every_response_of_a_prompt(tmp_path):
    path = write_lengths_jsonl(range(1, 1001), tmp_path / "lengths.jsonl")
    shared = LengthModel(
        LengthConfig(distribution="empirical", path=str(path), per_prompt=True), 2000, seed=0
    )
    assert len({shared(f"q1@{epoch}#{i}") for epoch in range(3) for i in range(4)}) == 1
    assert len({shared(f"q{uid}@0#0") for uid in range(20)}) > 1
    each = LengthModel(LengthConfig(distribution="empirical", path=str(path)), 2000, seed=0)
    assert len({each(f"q1@0#{i}") for i in range(8)}) > 1
