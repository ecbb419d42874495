"""Steady-state runs: the stop rule on exact step times, and a simulated run that stops once it settles and
reports its measured window apart from its warm-up."""

from __future__ import annotations

import pytest

from asyncrl.app.simulate import simulate
from asyncrl.sim.derive import load_sim_config
from asyncrl.sim.result import is_steady


def test_the_last_window_must_match_the_one_before_within_the_tolerance():
    ends = [10.0 * i for i in range(1, 7)]  # six steps of 10 s
    assert is_steady(ends, warmup=2, window=2, tolerance=0.01)
    assert not is_steady(ends[:5], warmup=2, window=2, tolerance=0.01)  # 2 + 2 x 2 steps are needed
    slowing = [10, 20, 30, 40, 52, 64]  # the last window's steps take 12 s against 10 s before
    assert not is_steady(slowing, warmup=2, window=2, tolerance=0.1)
    assert is_steady(slowing, warmup=2, window=2, tolerance=0.2)


SMALL = [
    "rollout.num_engines=2",
    "rollout.rollout_batch_size=4",
    "rollout.num_return_sequences=2",
    "rollout.max_new_tokens=256",
    "lengths.mean=50",
    "controller.num_steps=40",
    "steady_state.enabled=true",
    "steady_state.warmup_steps=3",
    "steady_state.window_steps=4",
    "steady_state.tolerance=0.2",
]


def test_a_steady_run_stops_once_settled_and_reports_its_window():
    result = simulate(load_sim_config(None, SMALL))
    totals = result.totals
    assert totals["steady_converged"] == 1.0
    assert 3 + 2 * 4 <= totals["num_steps"] < 40
    assert totals["steady_first_step"] == 4 and totals["steady_num_steps"] == totals["num_steps"] - 3
    window = result.steps[3:]
    assert totals["steady_mean_step_s"] == pytest.approx((window[-1].end_s - window[0].start_s) / len(window))


def test_a_cap_below_two_windows_is_refused():
    with pytest.raises(ValueError, match="caps a steady-state run"):
        load_sim_config(None, [*SMALL, "controller.num_steps=10"])
