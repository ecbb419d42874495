"""The simulator against the ROLL Flash report's bounds, and its behaviours' directions, on random workloads.

Proposition 1 assumes K identical workers fed from one queue: here one engine with K slots and a decode
step that is flat up to K running requests (each slot is then an independent worker), on one accelerator
(``gpus_per_engine`` 1: the slots are not a tensor-parallel group), and a trainer on the same K workers.
"""

from __future__ import annotations

import random

import pytest

from asyncrl.app.simulate import simulate
from asyncrl.config.loader import from_dict
from asyncrl.config.sim import SimConfig
from asyncrl.sim import plan

STEP_S = 0.1
GPU_S_PER_TOKEN = 0.001
PROMPT_TOKENS = 8


def queue_config(seed: int, k: int, groups: int, group_size: int, **overrides) -> SimConfig:
    data = {
        "seed": seed,
        "prompt_tokens": PROMPT_TOKENS,
        "lengths": {"distribution": "lognormal", "mean": 50.0, "sigma": 1.0},
        "engine": {
            "max_running_requests": k,
            "knee_batch": k,
            "decode_step_s": STEP_S,
            "weight_update_s": 0.0,
        },
        "trainer": {
            "num_gpus": k,  # the K workers also train (sync); the slots are not a tensor-parallel group
            "gpu_s_per_token": GPU_S_PER_TOKEN,
            "step_overhead_s": 0.0,
            "epochs": 2,
        },
        "rollout": {
            "num_engines": 1,
            "rollout_batch_size": groups,
            "num_return_sequences": group_size,
            "max_new_tokens": 400,
        },
        "controller": {"mode": "sync", "num_steps": 3},
    }
    for key, value in overrides.items():
        section, _, name = key.partition("__")
        data[section][name] = value
    return from_dict(SimConfig, data)


def random_shape(seed: int) -> tuple[int, int, int]:
    rng = random.Random(seed)
    return rng.choice([2, 4, 8]), rng.choice([2, 4, 8, 16]), rng.choice([1, 2, 4, 8])


@pytest.mark.parametrize("seed", range(8))
def test_proposition_1_queue_scheduling_completion_bound(seed):
    k, groups, group_size = random_shape(seed)
    result = simulate(queue_config(seed, k, groups, group_size))
    for step, record in zip(result.steps, result.trainer_records, strict=True):
        times = [length * STEP_S for length in record.response_lengths]
        bound = plan.queue_completion_bound(len(times), k, sum(times) / len(times), max(times))
        assert step.wait_s <= bound + 1e-9, (seed, step.step, step.wait_s, bound)


@pytest.mark.parametrize("seed", range(8))
def test_proposition_2_sync_step_bound(seed):
    k, groups, group_size = random_shape(seed)
    result = simulate(queue_config(seed, k, groups, group_size))
    for step, record in zip(result.steps, result.trainer_records, strict=True):
        times = [length * STEP_S for length in record.response_lengths]
        mu_train = record.num_tokens / record.num_samples * GPU_S_PER_TOKEN
        bound = plan.sync_step_bound(len(times), k, sum(times) / len(times), max(times), mu_train, epochs=2)
        assert step.step_s <= bound + 1e-9, (seed, step.step, step.step_s, bound)


def workload(**overrides) -> SimConfig:
    """Four engines, a long-tailed workload, a separate trainer: the shape of the report's studies."""
    data = {
        "seed": 1,
        "prompt_tokens": 16,
        "lengths": {"distribution": "lognormal", "mean": 200.0, "sigma": 1.0},
        "engine": {
            "max_running_requests": 32,
            "knee_batch": 32,
            "decode_step_s": 0.05,
            "weight_update_s": 1.0,
        },
        "trainer": {"num_gpus": 2, "gpu_s_per_token": 0.002, "step_overhead_s": 2.0},
        "rollout": {
            "num_engines": 4,
            "rollout_batch_size": 16,
            "num_return_sequences": 8,
            "max_new_tokens": 2000,
        },
        "controller": {"mode": "sync", "num_steps": 4, "wait_for_weight_sync": False},
    }
    for key, value in overrides.items():
        section, _, name = key.partition("__")
        data.setdefault(section, {})[name] = value
    return from_dict(SimConfig, data)


def test_queue_scheduling_beats_batch_rollout_under_dynamic_filtering():
    filtering = {
        "rollout__filter": "zero_variance",
        "rollout__max_additional_running_prompts": 16,
        "reward__pass_rate_alpha": 0.3,
        "reward__pass_rate_beta": 0.3,
    }
    batch = simulate(workload(rollout__generation="batch", **filtering)).totals
    queue = simulate(workload(rollout__generation="queue", **filtering)).totals
    assert queue["mean_wait_s"] < batch["mean_wait_s"] / 2
    assert queue["dropped_filtered"] > 0


def test_async_beats_one_step_off_beats_sync():
    sync = simulate(workload(controller__mode="sync")).totals["mean_step_s"]
    one_off = simulate(workload(controller__mode="one_step_off", buffer__async_ratio=1.0)).totals[
        "mean_step_s"
    ]
    run = simulate(workload(controller__mode="async", buffer__async_ratio=2.0))
    assert run.totals["mean_step_s"] < one_off < sync
    assert run.totals["max_staleness"] <= 2


def test_a_larger_async_ratio_never_lowers_throughput():
    step_times = [
        simulate(workload(controller__mode="async", buffer__async_ratio=alpha)).totals["mean_step_s"]
        for alpha in (0.0, 1.0, 2.0, 3.0)
    ]
    for fewer, more in zip(step_times, step_times[1:], strict=False):
        assert more <= fewer * 1.03, step_times


def test_partial_rollout_keeps_staleness_within_alpha_and_fills_every_batch():
    run = simulate(workload(controller__mode="partial_rollout", buffer__async_ratio=1.0))
    assert run.totals["max_staleness"] <= 1
    assert run.totals["trained_samples"] == 4 * 16 * 8


def test_proposition_2_async_split_beats_sync_and_stays_near_its_bound():
    """At β* the simulated async step is faster than sync and within 15 % of Eq. 11; the bound assumes the
    two pools overlap perfectly, which the real loop's serial weight sync and α window do not quite give."""
    workload = {
        "mu_gen": 2.0,
        "l_gen": 20.0,
        "mu_train": 0.4,
        "epochs": 1,
        "samples": 64,
        "alpha": 2.0,
        "steps": 6,
    }
    recommendation = plan.recommend(64, 16, 2.0, 20.0, 0.4, 1, 2.0)
    sync = plan.proposition_config(**workload, rollout_workers=16, train_workers=None, mode="sync")
    split = plan.proposition_config(
        **workload,
        rollout_workers=16 - recommendation.num_train_workers,
        train_workers=recommendation.num_train_workers,
        mode="partial_rollout",
    )
    sync, split = simulate(sync).totals["mean_step_s"], simulate(split).totals["mean_step_s"]
    assert split < sync <= recommendation.sync_bound_s
    assert split <= 1.15 * recommendation.async_bound_s
