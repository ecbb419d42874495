"""The trainer's ``concurrent_slowdown``: charged only when an engine generates as a step starts."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.app.simulate import simulate
from asyncrl.config.loader import from_dict
from asyncrl.config.sim import SimConfig, SimTrainerConfig
from asyncrl.metrics.timeline import Timeline
from asyncrl.modes import async_ratio_for
from asyncrl.sim.clock import run_shuffled
from asyncrl.sim.workers import SimTrainer
from asyncrl.types import Group, Trajectory


def one_group(num_tokens: int) -> Group:
    trajectory = Trajectory(
        prompt_uid="q",
        sample_index=0,
        token_ids=[1] * num_tokens,
        loss_mask=[0] + [1] * (num_tokens - 1),
        logprobs=[0.0] * num_tokens,
        versions=[0] * num_tokens,
        start_version=0,
        num_prompt_tokens=1,
    )
    return Group(prompt_uid="q", trajectories=[trajectory])


def train_seconds(busy: bool) -> float:
    config = SimTrainerConfig(gpu_s_per_token=0.01, step_overhead_s=1.0, concurrent_slowdown=1.5)
    trainer = SimTrainer(config, num_gpus=2, timeline=Timeline(enabled=False), engines_busy=lambda: busy)

    async def step() -> float:
        start = asyncio.get_running_loop().time()
        await trainer.train_step([one_group(100)], policy_version=0)
        return asyncio.get_running_loop().time() - start

    return run_shuffled(step, seed=0, virtual_time=True)


def test_slowdown_applies_only_while_engines_generate():
    assert train_seconds(busy=False) == pytest.approx(1.0 + 100 * 0.01 / 2)
    assert train_seconds(busy=True) == pytest.approx(1.5 * (1.0 + 100 * 0.01 / 2))


def test_slowdown_below_one_is_rejected():
    with pytest.raises(ValueError, match="trainer.concurrent_slowdown"):
        SimTrainerConfig(concurrent_slowdown=0.5)


def sim_config(mode: str, slowdown: float) -> SimConfig:
    return from_dict(
        SimConfig,
        {
            "timeline": "none",
            "prompt_tokens": 10,
            "lengths": {"distribution": "constant", "mean": 20.0},
            "engine": {
                "decode_step_s": 0.1,
                "knee_batch": 8,
                "max_running_requests": 8,
                "weight_update_s": 0.0,
            },
            "trainer": {
                "num_gpus": 1,
                "gpu_s_per_token": 0.0,
                "step_overhead_s": 0.8,
                "concurrent_slowdown": slowdown,
            },
            "rollout": {
                "num_engines": 1,
                "rollout_batch_size": 2,
                "num_return_sequences": 2,
                "max_new_tokens": 64,
            },
            "buffer": {"async_ratio": async_ratio_for(mode, 2.0)},
            "controller": {"mode": mode, "num_steps": 4},
        },
    )


def test_sync_training_never_overlaps_generation_so_it_is_not_slowed():
    trains = [s.train_s for s in simulate(sim_config("sync", 2.0)).steps]
    assert trains == pytest.approx([0.8] * 4)


def test_async_training_overlaps_generation_and_is_slowed():
    # two batches fit the engine at once (1 s per batch), so it is always generating when a step starts
    steps = simulate(sim_config("async", 2.0)).steps
    assert [s.train_s for s in steps] == pytest.approx([1.6] * 4)
