import gc
import json
import random

import pytest

from asyncrl.config.sim import LengthConfig
from asyncrl.sim.calibrate import (
    PASS_RATE_CONCENTRATION_BOUNDS,
    EngineProfile,
    concurrent_slowdown,
    fit_engine,
    fit_line,
    fit_pass_rates,
    prediction,
    write_lengths_jsonl,
)
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


def profile(batch: int, decode_s: float, first_s: float, prompt_tokens: int = 10) -> EngineProfile:
    return EngineProfile(
        batch=batch, prompt_tokens=prompt_tokens, first_step_s=first_s, decode_step_s=decode_s
    )


def test_fit_engine_recovers_a_per_request_line_and_the_prefill_per_token():
    # decode 5 ms + 0.25 ms per request; prefill 0.1 ms per prompt token (10 tokens each)
    rows = [profile(b, 0.005 + 0.00025 * b, 0.005 + 0.00025 * b + 0.0001 * 10 * b) for b in (1, 4, 16, 32)]
    costs = fit_engine(rows)
    assert costs.decode_step_s == pytest.approx(0.005)
    assert costs.decode_s_per_request == pytest.approx(0.00025)
    assert costs.prefill_s_per_token == pytest.approx(0.0001)


def test_fit_engine_flat_steps_have_no_per_request_term_and_prefill_is_never_negative():
    costs = fit_engine([profile(1, 0.02, 0.019), profile(8, 0.02, 0.02)])
    assert (costs.decode_step_s, costs.decode_s_per_request, costs.prefill_s_per_token) == (0.02, 0.0, 0.0)


def test_concurrent_slowdown_is_a_ratio_of_medians_and_never_below_one():
    assert concurrent_slowdown([1.0, 2.0, 9.0], [3.0, 3.0, 4.0]) == pytest.approx(1.5)
    assert concurrent_slowdown([2.0], [1.0]) == 1.0
    with pytest.raises(ValueError, match="alone and beside"):
        concurrent_slowdown([], [1.0])


def test_prediction_scores_the_error_against_the_median_and_the_spread():
    scored = prediction([1.0, 1.2, 0.9], 1.1)
    assert scored["real_median"] == 1.0 and (scored["real_min"], scored["real_max"]) == (0.9, 1.2)
    assert scored["error_vs_median"] == pytest.approx(0.1)
    assert scored["within_real_spread"] is True
    assert prediction([1.0, 1.2, 0.9], 1.3)["within_real_spread"] is False
    assert prediction([1.0], 0.5)["error_vs_median"] == pytest.approx(-0.5)
    with pytest.raises(ValueError, match="at least one"):
        prediction([], 1.0)


def test_written_lengths_read_back_as_empirical(tmp_path):
    path = write_lengths_jsonl([3, 10, 7], tmp_path / "lengths.jsonl")
    assert [json.loads(line) for line in path.read_text().splitlines()] == [3, 10, 7]
    assert read_empirical_lengths(str(path)) == [3, 10, 7]


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


def beta_binomial_rewards(alpha: float, beta: float, prompts: int, n: int, seed: int) -> list[list[float]]:
    rng = random.Random(seed)
    rewards = []
    for _ in range(prompts):
        rate = rng.betavariate(alpha, beta)
        rewards.append([float(rng.random() < rate) for _ in range(n)])
    return rewards


@pytest.mark.parametrize(("alpha", "beta"), [(0.3, 0.5), (2.0, 1.0), (0.1, 0.1)])
def test_fit_pass_rates_recovers_the_beta_behind_sampled_groups(alpha: float, beta: float):
    fitted_alpha, fitted_beta = fit_pass_rates(beta_binomial_rewards(alpha, beta, 20_000, 4, seed=1))
    assert fitted_alpha / (fitted_alpha + fitted_beta) == pytest.approx(alpha / (alpha + beta), abs=0.01)
    assert fitted_alpha + fitted_beta == pytest.approx(alpha + beta, rel=0.15)


def test_fit_pass_rates_without_overdispersion_gives_one_shared_rate():
    alpha, beta = fit_pass_rates(beta_binomial_rewards(1e6 * 0.3, 1e6 * 0.7, 20_000, 4, seed=2))
    assert alpha + beta == PASS_RATE_CONCENTRATION_BOUNDS[1]
    assert alpha / (alpha + beta) == pytest.approx(0.3, abs=0.01)


@pytest.mark.parametrize(
    ("rewards", "message"),
    [
        ([[1.0, 0.0]], ">= 2 prompts"),
        ([[1.0, 0.0], [1.0]], "same number"),
        ([[1.0, 1.0], [1.0, 1.0]], "every sampled reward is 1"),
        ([[1.0, 2.0], [0.0, 1.0]], "in \\[0, 1\\]"),
    ],
)
def test_fit_pass_rates_refuses_what_it_cannot_fit(rewards: list[list[float]], message: str):
    with pytest.raises(ValueError, match=message):
        fit_pass_rates(rewards)
