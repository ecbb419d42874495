"""Exact values of the cost models, the workload draws and the Proposition 1/2 arithmetic."""

from __future__ import annotations

import math

import pytest

from asyncrl.config.rollout import RolloutConfig
from asyncrl.config.sim import LengthConfig, SimConfig, SimEngineConfig, SimRewardConfig, SimTrainerConfig
from asyncrl.sim import cost, plan
from asyncrl.sim.workload import LengthModel, PassRates, prompt_uid, read_empirical_lengths

ENGINE = SimEngineConfig(decode_step_s=0.5, knee_batch=4, kv_s_per_token=0.01)


def test_decode_step_is_flat_up_to_the_knee_then_linear_plus_kv():
    assert cost.decode_step_s(ENGINE, 1, 0) == 0.5
    assert cost.decode_step_s(ENGINE, 4, 0) == 0.5
    assert cost.decode_step_s(ENGINE, 8, 0) == 1.0
    assert cost.decode_step_s(ENGINE, 2, 100) == pytest.approx(1.5)


def test_segment_sums_the_growing_kv_series_and_prefill():
    # 3 steps, batch 2, kv 10 -> 12 -> 14: (0.5+0.1) + (0.5+0.12) + (0.5+0.14) = 1.86, plus prefill 0.25
    assert cost.segment_s(ENGINE, 2, 10, 3, prefill_s=0.25) == pytest.approx(2.11)
    assert cost.segment_s(ENGINE, 2, 10, 0, prefill_s=0.25) == 0.0


def test_per_request_term_adds_to_every_step():
    engine = SimEngineConfig(decode_step_s=0.5, knee_batch=4, decode_s_per_request=0.01)
    assert cost.decode_step_s(engine, 3, 0) == pytest.approx(0.53)
    assert cost.decode_step_s(engine, 8, 0) == pytest.approx(1.08)


def test_one_accelerator_pays_no_all_reduce_and_its_step_is_unchanged():
    single = SimEngineConfig(decode_step_s=0.5, knee_batch=4, kv_s_per_token=0.01, allreduce_hop_s=1.0)
    assert cost.tp_allreduce_s(single) == 0.0
    assert cost.decode_step_s(single, 2, 100) == cost.decode_step_s(ENGINE, 2, 100)
    assert cost.segment_s(single, 2, 10, 3, 0.25) == cost.segment_s(ENGINE, 2, 10, 3, 0.25)
    assert cost.prefill_s(single, 100) == 100 * single.prefill_s_per_token


def test_tensor_parallel_step_splits_compute_and_adds_ring_all_reduces_per_layer():
    # g = 2: 2 all-reduces x 2 hops per layer x 10 layers x 1 ms = 40 ms; compute 1.5 s / 2
    engine = SimEngineConfig(
        decode_step_s=0.5,
        knee_batch=4,
        kv_s_per_token=0.01,
        prefill_s_per_token=0.02,
        gpus_per_engine=2,
        num_layers=10,
        allreduce_hop_s=0.001,
    )
    assert cost.tp_allreduce_s(engine) == pytest.approx(0.04)
    assert cost.decode_step_s(engine, 2, 100) == pytest.approx(1.5 / 2 + 0.04)
    assert cost.prefill_s(engine, 100) == pytest.approx(1.0)
    # 3 steps from kv 10: compute 1.86 / 2 plus 3 steps of all-reduce
    assert cost.segment_s(engine, 2, 10, 3, prefill_s=0.25) == pytest.approx(0.25 + 1.86 / 2 + 3 * 0.04)
    # g = 8: 14 hops per all-reduce
    assert cost.tp_allreduce_s(SimEngineConfig(gpus_per_engine=8, num_layers=10, allreduce_hop_s=0.001)) == (
        pytest.approx(10 * 2 * 14 * 0.001)
    )


def test_two_accelerators_decode_faster_than_one_but_less_than_twice_as_fast_by_default():
    one, two = SimEngineConfig(), SimEngineConfig(gpus_per_engine=2)
    for running in (1, 64, 256):
        step_1, step_2 = cost.decode_step_s(one, running, 5000), cost.decode_step_s(two, running, 5000)
        assert step_1 / 2 < step_2 < step_1


def test_every_accelerator_of_a_tensor_parallel_engine_counts_toward_the_cluster():
    config = SimConfig(
        engine=SimEngineConfig(gpus_per_engine=4),
        trainer=SimTrainerConfig(num_gpus=8),
        rollout=RolloutConfig(num_engines=3),
    )
    assert (config.num_rollout_gpus, config.num_train_gpus, config.num_gpus) == (12, 8, 20)
    colocated = SimConfig(
        engine=SimEngineConfig(gpus_per_engine=4),
        trainer=SimTrainerConfig(num_gpus=8, colocated=True),
        rollout=RolloutConfig(num_engines=3),
    )
    assert (colocated.num_train_gpus, colocated.num_gpus) == (12, 12)


def test_steps_done_inverts_the_segment_time():
    total = [cost.segment_s(ENGINE, 2, 10, k, 0.25) for k in range(6)]
    assert cost.steps_done(ENGINE, 2, 10, total[3], 5, 0.25) == 3
    assert cost.steps_done(ENGINE, 2, 10, total[3] - 1e-6, 5, 0.25) == 2
    assert cost.steps_done(ENGINE, 2, 10, 1e9, 5, 0.25) == 5
    assert cost.steps_done(ENGINE, 2, 10, 0.1, 5, 0.25) == 0


def test_train_step_time():
    config = SimTrainerConfig(gpu_s_per_token=0.01, step_overhead_s=2.0, epochs=2)
    assert cost.train_step_s(config, num_gpus=4, num_tokens=1000) == pytest.approx(2.0 + 2 * 1000 * 0.01 / 4)


def test_lengths_are_deterministic_clipped_and_have_the_configured_mean():
    model = LengthModel(LengthConfig(distribution="lognormal", mean=100.0, sigma=0.5), 10_000, seed=3)
    draws = [model(f"q{i}@0#{j}") for i in range(400) for j in range(8)]
    assert draws == [model(f"q{i}@0#{j}") for i in range(400) for j in range(8)]
    assert sum(draws) / len(draws) == pytest.approx(100.0, rel=0.05)
    assert LengthModel(LengthConfig(distribution="constant", mean=50.0), 20, seed=0)("q1@0#0") == 20
    pareto = LengthModel(LengthConfig(distribution="pareto", mean=100.0, pareto_shape=3.0), 10**9, seed=1)
    assert min(pareto(f"q{i}@0#0") for i in range(500)) >= round(100 * 2 / 3)


def test_empirical_lengths_read_numbers_and_objects(tmp_path):
    path = tmp_path / "lengths.jsonl"
    path.write_text('7\n{"length": 9}\n\n')
    assert read_empirical_lengths(str(path)) == [7, 9]
    model = LengthModel(LengthConfig(distribution="empirical", path=str(path)), 100, seed=0)
    assert {model(f"q{i}@0#0") for i in range(50)} == {7, 9}
    path.write_text("0\n")
    with pytest.raises(ValueError, match="lengths.jsonl:1"):
        read_empirical_lengths(str(path))


def test_prompt_factor_is_shared_by_a_prompts_responses_across_epochs():
    model = LengthModel(LengthConfig(distribution="constant", mean=100.0, prompt_sigma=1.0), 10**6, seed=0)
    assert model("q5@0#0") == model("q5@3#7")
    assert len({model(f"q{i}@0#0") for i in range(20)}) > 10
    assert prompt_uid("q5@3#7") == "q5"


def test_pass_rates_follow_the_prompt():
    rates = PassRates(SimRewardConfig(pass_rate_alpha=0.05, pass_rate_beta=0.05), seed=0)
    rewards = [rates.reward(f"q{i}@0#{j}") for i in range(200) for j in range(8)]
    assert set(rewards) <= {0.0, 1.0}
    uniform_groups = sum(len(set(rewards[i * 8 : i * 8 + 8])) == 1 for i in range(200))
    assert uniform_groups > 120  # Beta(0.05, 0.05) puts most prompts at pass rate ~0 or ~1


def test_config_validation_names_the_key():
    with pytest.raises(ValueError, match="lengths.distribution"):
        LengthConfig(distribution="weibull")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="engine.knee_batch"):
        SimEngineConfig(knee_batch=0)
    with pytest.raises(ValueError, match="engine.max_kv_tokens"):
        SimConfig(engine=SimEngineConfig(max_kv_tokens=100))


def test_proposition_arithmetic_exact():
    assert plan.queue_completion_bound(100, 10, 2.0, 7.0) == 27.0
    assert plan.sync_step_bound(64, 8, 2.0, 10.0, 0.5, 2) == 8 * 3.0 + 10.0
    assert plan.async_step_bound(64, 8, 2.0, 10.0, 0.5, 2, alpha=1.0) == 8 * 3.0 + 5.0
    # beta* = E N mu_t / (N mu_g + K L/(a+1) + E N mu_t) = 64 / (128 + 40 + 64)
    beta = plan.optimal_train_share(64, 8, 2.0, 10.0, 0.5, 2, alpha=1.0)
    assert beta == pytest.approx(64 / 232)


def test_optimal_split_balances_the_pools_and_minimises_the_async_bound():
    args = (64, 8, 2.0, 10.0, 0.5, 2, 1.0)
    beta = plan.optimal_train_share(*args)
    at_best = plan.async_step_bound_at(beta, *args)
    assert at_best == pytest.approx(plan.async_step_bound(*args))
    for other in (beta * 0.9, beta * 1.1, 0.1, 0.5, 0.9):
        assert plan.async_step_bound_at(other, *args) >= at_best - 1e-9


def test_recommend_rounds_to_whole_workers():
    recommendation = plan.recommend(n=64, k=8, mu_gen=2.0, l_gen=10.0, mu_train=0.5, epochs=2, alpha=1.0)
    assert recommendation.num_train_workers == 2 and recommendation.num_rollout_workers == 6
    assert recommendation.speedup_bound == pytest.approx(34.0 / 29.0)
    assert math.isclose(recommendation.beta, 64 / 232)
    with pytest.raises(ValueError):
        plan.recommend(n=64, k=1, mu_gen=2.0, l_gen=10.0, mu_train=0.5, epochs=1, alpha=1.0)
