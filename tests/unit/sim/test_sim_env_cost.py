"""Simulated environments: latency distributions, fail-slow/fail-stop, reward latency (exact on the virtual
clock), the agentic simulator's direction tests, its config validation and the two-key sweep CLI."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
from dataclasses import replace

import pytest

from asyncrl.app.simulate import simulate
from asyncrl.cli.main import main
from asyncrl.config.controller import ControllerConfig
from asyncrl.config.env import EnvManagerConfig
from asyncrl.config.rollout import RolloutConfig
from asyncrl.config.sim import SimConfig, SimEngineConfig, SimEnvConfig, SimRewardConfig
from asyncrl.envs import EnvError
from asyncrl.sim.clock import run_shuffled
from asyncrl.sim.env_cost import SimEnv, base_latency_s, is_slow_seed, step_latency_s
from asyncrl.sim.workload import PassRates


def draws(config: SimEnvConfig, n: int = 20_000) -> list[float]:
    rng = random.Random(0)
    return [base_latency_s(config, rng) for _ in range(n)]


def test_constant_latency_is_exact() -> None:
    assert set(draws(SimEnvConfig(latency="constant", mean_s=2.5, sigma_s=9.0), 10)) == {2.5}


def test_gaussian_latency_is_truncated_at_zero_with_the_requested_moments() -> None:
    wide = draws(SimEnvConfig(latency="gaussian", mean_s=10.0, sigma_s=10.0))
    assert min(wide) == 0.0 and 0.1 < wide.count(0.0) / len(wide) < 0.2  # P(N(10, 10) < 0) = 0.16
    narrow = draws(SimEnvConfig(latency="gaussian", mean_s=10.0, sigma_s=1.0))
    assert statistics.fmean(narrow) == pytest.approx(10.0, rel=0.01)
    assert statistics.stdev(narrow) == pytest.approx(1.0, rel=0.03)


def test_lognormal_latency_has_mean_mu_and_sd_sigma() -> None:
    values = draws(SimEnvConfig(latency="lognormal", mean_s=10.0, sigma_s=5.0))
    assert min(values) > 0
    assert statistics.fmean(values) == pytest.approx(10.0, rel=0.02)
    assert statistics.stdev(values) == pytest.approx(5.0, rel=0.05)


def test_fail_slow_stretches_and_fail_stop_fails() -> None:
    rng = random.Random(0)
    always = SimEnvConfig(mean_s=2.0, fail_slow_p=1.0, fail_slow_factor=3.0, fail_stop_p=1.0)
    assert step_latency_s(always, rng) == (6.0, True)
    assert step_latency_s(SimEnvConfig(mean_s=2.0), rng) == (2.0, False)


def test_sim_env_episode_times_and_reward_latency_are_exact_on_the_virtual_clock() -> None:
    config = SimEnvConfig(mean_s=2.0, reset_s=1.0, reward_latency_s=5.0, num_turns=3, observation_tokens=4)
    rates = PassRates(SimRewardConfig(), seed=0)

    async def scenario() -> tuple[list[float], list[tuple[str, bool]], str]:
        loop = asyncio.get_running_loop()
        env = SimEnv(config, prompt_tokens=7, pass_rates=rates, rng=random.Random(0))
        first, _ = await env.reset(11)
        times, steps = [loop.time()], []
        for _ in range(3):
            result = await env.step("a")
            times.append(loop.time())
            steps.append((result.observation, result.terminated))
        return times, steps, first

    times, steps, first = run_shuffled(scenario, seed=0)
    assert first == "x" * 7
    assert times == [1.0, 3.0, 5.0, 12.0]
    assert steps == [("xxxx", False), ("xxxx", False), ("xxxx", True)]


def test_fail_stop_step_raises_after_its_latency() -> None:
    config = SimEnvConfig(mean_s=2.0, fail_stop_p=1.0)

    async def scenario() -> float:
        env = SimEnv(config, 1, PassRates(SimRewardConfig(), 0), random.Random(0))
        await env.reset(0)
        with pytest.raises(EnvError, match="simulated fail-stop at turn 1"):
            await env.step("a")
        return asyncio.get_running_loop().time()

    assert run_shuffled(scenario, seed=0) == 2.0


SMALL = SimConfig(
    producer="agentic",
    num_prompts=256,
    prompt_tokens=32,
    engine=SimEngineConfig(decode_step_s=0.02, max_running_requests=64, weight_update_s=1.0),
    rollout=RolloutConfig(num_engines=2, rollout_batch_size=16, num_return_sequences=4, max_new_tokens=64),
    env=SimEnvConfig(latency="gaussian", mean_s=10.0, sigma_s=1.0, num_turns=5, observation_tokens=8),
    env_manager=EnvManagerConfig(num_env_groups=16, group_size=4, max_context_tokens=1024),
    controller=ControllerConfig(num_steps=2),
    timeline="none",
)


def step_s(config: SimConfig) -> float:
    return simulate(config).totals["mean_step_s"]


def with_env(config: SimConfig, **env: object) -> SimConfig:
    return replace(config, env=replace(config.env, **env))


def with_manager(config: SimConfig, **manager: object) -> SimConfig:
    return replace(config, env_manager=replace(config.env_manager, **manager))


def test_env_level_async_beats_batch_stepping_more_as_sigma_grows() -> None:
    speedups = []
    for sigma in (1.0, 8.0):
        config = with_env(SMALL, sigma_s=sigma)
        speedups.append(step_s(with_manager(config, stepping="batch")) / step_s(config))
    assert 1.0 < speedups[0] < speedups[1]
    assert speedups[1] > 1.3


def test_redundant_env_groups_shorten_steps_under_fail_slow_envs() -> None:
    flaky = with_env(SMALL, sigma_s=5.0, fail_slow_p=0.05, fail_slow_factor=10.0)
    exact, redundant = step_s(flaky), step_s(with_manager(flaky, num_env_groups=20))
    larger_groups = step_s(with_manager(flaky, group_size=5))
    assert redundant < 0.8 * exact
    assert larger_groups < exact


def test_agentic_sim_config_errors_name_the_keys() -> None:
    with pytest.raises(ValueError, match="env.latency must be one of 'constant', 'gaussian', 'lognormal'"):
        SimEnvConfig(latency="pareto")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"env.fail_stop_p must be in \[0, 1\]"):
        SimEnvConfig(fail_stop_p=2.0)
    with pytest.raises(
        ValueError, match="env_manager.num_env_groups=8 must be >= rollout.rollout_batch_size=16"
    ):
        replace(SMALL, env_manager=EnvManagerConfig(num_env_groups=8, group_size=4))
    with pytest.raises(
        ValueError, match="env_manager.max_context_tokens=4096 must be <= engine.max_kv_tokens=2048"
    ):
        replace(
            SMALL,
            engine=SimEngineConfig(max_kv_tokens=2048),
            env_manager=replace(SMALL.env_manager, max_context_tokens=4096),
        )


def test_two_sweeps_write_a_grid_and_a_heatmap(tmp_path, capsys) -> None:
    args = [
        "simulate",
        "producer=agentic",
        "prompt_tokens=8",
        "num_prompts=64",
        "rollout.rollout_batch_size=2",
        "rollout.num_return_sequences=2",
        "rollout.max_new_tokens=16",
        "lengths.mean=4",
        "env.num_turns=2",
        "env_manager.num_env_groups=2",
        "env_manager.group_size=2",
        "controller.num_steps=2",
        f"output_dir={tmp_path}",
        "--sweep",
        "env_manager.stepping=async,batch",
        "--sweep",
        "env_manager.num_env_groups=2,3",
    ]
    assert main(args) == 0
    runs = json.loads((tmp_path / "sweep.json").read_text())["runs"]
    assert [(r["env_manager.stepping"], r["env_manager.num_env_groups"]) for r in runs] == [
        ("async", "2"),
        ("async", "3"),
        ("batch", "2"),
        ("batch", "3"),
    ]
    assert all(r["num_steps"] == 2 and "dropped_episodes_aborted" in r for r in runs)
    assert (tmp_path / "sweep.png").stat().st_size > 0
    assert "mean_step_s" in capsys.readouterr().out


def test_slow_seeds_are_shared_by_a_group_and_stretch_every_step() -> None:
    config = SimEnvConfig(mean_s=2.0, slow_seed_p=0.1, fail_slow_factor=4.0)
    slow = [seed for seed in range(10_000) if is_slow_seed(config, seed)]
    assert 900 < len(slow) < 1100
    assert is_slow_seed(config, slow[0]) and not is_slow_seed(replace(config, slow_seed_p=0.0), slow[0])

    async def episode_time(seed: int) -> float:
        env = SimEnv(config, 1, PassRates(SimRewardConfig(), 0), random.Random(0))
        await env.reset(seed)
        await env.step("a")
        return asyncio.get_running_loop().time()

    fast = next(seed for seed in range(100) if seed not in slow)
    assert run_shuffled(lambda: episode_time(slow[0]), seed=0) == 8.0
    assert run_shuffled(lambda: episode_time(fast), seed=0) == 2.0
